//! `cloud-sim`: the simulated `memory` cloud as a standalone server.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use cloud_sim::SimServer;
use cloud_sim::parent::{self, Watch};
use provider_memory::MemoryConfig;

/// The simulated cloud route API, shared by controller processes.
#[derive(Debug, Parser)]
#[command(name = "cloud-sim", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the simulated cloud's HTTP API until interrupted.
    Serve(ServeArgs),
}

#[derive(Debug, clap::Args)]
struct ServeArgs {
    /// Address to listen on; port 0 picks a free one. The bound URL is
    /// printed on stdout as `LISTENING http://ADDR`.
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// The memory cloud's configuration (YAML, or TOML when it ends in .toml);
    /// without it, a fast, unlimited, faultless cloud.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Allow a non-loopback listen address (the API has no authentication).
    #[arg(long)]
    allow_remote: bool,
    /// Exit when the process that started this one exits.
    #[arg(long)]
    exit_with_parent: bool,
    /// Exit when the process with this id exits.
    #[arg(long, value_name = "PID")]
    parent_pid: Option<u32>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cloud-sim: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let Command::Serve(args) = cli.command;
    match runtime.block_on(serve(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cloud-sim: {e:#}");
            ExitCode::from(2)
        }
    }
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    // Watch before anything slow, so a parent dying during startup is seen.
    let watches: Vec<Watch> = args
        .parent_pid
        .map(Watch::Pid)
        .into_iter()
        .chain(args.exit_with_parent.then(Watch::current_parent))
        .collect();
    let config = match &args.config {
        Some(p) => cloud_sim::config::load(p)?,
        None => MemoryConfig::default(),
    };
    let server = SimServer::bind(args.listen, args.allow_remote, config).await?;
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "LISTENING {}", server.url())?;
        out.flush()?;
    }
    server
        .run_until(async move {
            let parent_gone = async {
                parent::any_gone(&watches).await;
                tracing::info!("parent process exited; stopping");
            };
            tokio::select! {
                () = parent_gone => {}
                () = terminated() => tracing::info!("signalled; stopping"),
            }
        })
        .await?;
    Ok(())
}

async fn terminated() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    {
        if let Ok(mut term) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        {
            tokio::select! {
                () = ctrl_c => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    ctrl_c.await;
}
