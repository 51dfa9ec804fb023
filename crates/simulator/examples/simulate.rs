//! The `simulate` subcommand without the rest of the binary:
//! `cargo run --release -p simulator --example simulate -- idle-1000`.

use clap::Parser;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: simulator::SimulateArgs,
}

fn main() -> anyhow::Result<()> {
    simulator::simulate(Cli::parse().args)
}
