//! The `simulate` subcommand without the rest of the binary:
//! `cargo run --release -p simulator --example simulate -- idle-1000`.

use clap::Parser;

// The simulation is allocation-heavy (route tables and plans of thousands of
// entries per pass); glibc malloc spends about as long as the work itself.
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
