//! `cloud-route-controller`: flags, wiring and process lifecycle. All routing
//! decisions live in `route-core`; the reconcile engine in `route-controller`.

mod cleanup_command;
mod cli;
mod duration;
mod health;
mod http;
mod kube_client;
mod logging;
mod plan_command;
mod providers;
mod run;
mod secure;

use std::process::ExitCode;

use clap::Parser;

// Every pass builds a plan and (in full passes) a route table with one entry
// per Node; mimalloc keeps that churn cheap and the heap from fragmenting.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    // One rustls crypto provider for the whole process (kube, reqwest and the
    // AWS SDK all use rustls); installing it first avoids rustls' panic when
    // more than one provider is linked.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let cli = cli::Cli::parse();
    let (command, cluster) = match cli.command {
        // The simulator builds its own paused-clock runtimes and needs no
        // cluster flags, so it runs before (and outside) everything below.
        #[cfg(feature = "lab")]
        Some(cli::Command::Simulate(s)) => {
            return match simulator::simulate(s) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: {e:#}");
                    ExitCode::FAILURE
                }
            };
        }
        #[cfg(feature = "lab")]
        Some(cli::Command::Check(c)) => {
            return if simulator::check::check(c) {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            };
        }
        Some(cli::Command::Run(r)) => (Cmd::Run(r.clone()), r.cluster),
        Some(cli::Command::Plan(p)) => (Cmd::Plan(p.clone()), p.cluster),
        Some(cli::Command::Cleanup(c)) => (Cmd::Cleanup(c.clone()), c.cluster),
        None => (Cmd::Run(cli.run.clone()), cli.run.cluster),
    };
    logging::init(cluster.verbosity(), cluster.log_format);
    let validation = match &command {
        Cmd::Run(r) => r.validate(),
        Cmd::Plan(p) => p.cluster.validate(),
        Cmd::Cleanup(c) => c.cluster.validate(),
    };
    if let Err(e) = validation {
        eprintln!("error: {e}");
        return ExitCode::from(2);
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = rt.block_on(async {
        match command {
            Cmd::Run(r) => run::run(r).await,
            Cmd::Plan(p) => plan_command::plan(p).await,
            Cmd::Cleanup(c) => cleanup_command::cleanup(c).await,
        }
    });
    match result {
        Ok(code) => code,
        Err(e) => {
            // User-facing errors: the chain of causes on one line, no backtrace.
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

#[allow(
    clippy::large_enum_variant,
    reason = "built once at start-up; boxing the big variant would buy nothing"
)]
enum Cmd {
    Run(cli::RunArgs),
    Plan(cli::PlanArgs),
    Cleanup(cli::CleanupArgs),
}
