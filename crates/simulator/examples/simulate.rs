//! The `simulate` subcommand without the rest of the binary:
//! `cargo run --release -p simulator --example simulate -- idle-1000`.

use clap::Parser;

// The allocator of the `cloud-route-controller` binary, so this example
// measures what `cloud-route-controller simulate` does.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: simulator::SimulateArgs,
}

fn main() -> anyhow::Result<()> {
    simulator::simulate(Cli::parse().args)
}
