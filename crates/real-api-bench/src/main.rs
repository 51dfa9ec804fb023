//! `real-api-bench`: the real-API-server benchmark behind `make bench`.
//!
//! For each controller configuration (upstream with the watch gate off and
//! on, this project's periodic, watch and incremental modes) it starts a
//! fresh etcd + kube-apiserver, starts the controller, drives the same Node
//! scenario through the API ([`scenario`]), and measures cloud calls, Node to
//! route latency, and the controller's peak RSS and CPU time. Results go to
//! `<out-dir>/results.json` and `<out-dir>/results.md`, rewritten after each
//! run so a long invocation keeps what it has measured.
//!
//! The driver owns the scenario and the measurements; the controllers, the
//! control plane (crates/test-cluster) and the upstream baseline
//! (tools/upstream-route-controller) are used as they are.

mod aws;
mod controller;
mod hetzner_day;
mod probe;
mod report;
mod scenario;
mod stats;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Parser;
use test_cluster::Binaries;
use tracing::{error, info};

use controller::{Kind, Setup};
use report::{Report, Versions};
use scenario::Scenario;

#[derive(Debug, Parser)]
#[command(
    name = "real-api-bench",
    about = "Runs upstream's route controller and this project's modes in turn against a fresh local API server each, under the same Node scenario"
)]
struct Args {
    /// The upstream baseline binary (`tools/upstream-route-controller/build.sh`
    /// prints it); needed when an upstream configuration runs.
    #[arg(long)]
    upstream_bin: Option<PathBuf>,
    /// This project's controller binary (release build).
    #[arg(long)]
    controller_bin: PathBuf,
    /// Where results and per-run logs go.
    #[arg(long)]
    out_dir: PathBuf,
    /// Controllers to run, in order (comma list of upstream-periodic,
    /// upstream-watch, periodic, watch, incremental).
    #[arg(
        long,
        default_value = "upstream-periodic,upstream-watch,periodic,watch,incremental"
    )]
    controllers: String,
    /// Nodes created in the burst.
    #[arg(long, default_value_t = 1000)]
    nodes: usize,
    /// Create requests in flight during the burst.
    #[arg(long, default_value_t = 32)]
    create_concurrency: usize,
    /// Nodes created one at a time after the idle period.
    #[arg(long, default_value_t = 50)]
    trickle: usize,
    /// Milliseconds between two trickle creations.
    #[arg(long, default_value_t = 500)]
    trickle_interval_ms: u64,
    /// Seconds between two heartbeats of one Node (kubelet's
    /// node-status-update-frequency is 10 s).
    #[arg(long, default_value_t = 10)]
    heartbeat_period_s: u64,
    /// Heartbeat patches in flight at most.
    #[arg(long, default_value_t = 64)]
    heartbeat_concurrency: usize,
    /// Seconds of idle cluster after the burst converged.
    #[arg(long, default_value_t = 60)]
    idle_s: u64,
    /// Burst Nodes deleted in the scale-down (default: a tenth).
    #[arg(long)]
    scale_down: Option<usize>,
    /// Nodes whose InternalIP changes.
    #[arg(long, default_value_t = 10)]
    address_changes: usize,
    /// Seconds after the last change before measuring and stopping; more
    /// than one 10 s period so paced controllers catch up.
    #[arg(long, default_value_t = 30)]
    settle_s: u64,
    /// Longest wait, in seconds, for the burst's routes.
    #[arg(long, default_value_t = 900)]
    converge_timeout_s: u64,
    /// Latency added to every cloud call, both controllers.
    #[arg(long, default_value_t = 0)]
    cloud_latency_ms: u64,
    /// Route tables of the simulated cloud (one per zone on AWS); every
    /// Node's route must be in each. Above 1 only this project's modes run:
    /// upstream's route controller has one route table.
    #[arg(long, default_value_t = 1)]
    route_tables: usize,
    /// Client QPS / burst of both controllers.
    #[arg(long, default_value_t = 20)]
    kube_api_qps: u32,
    #[arg(long, default_value_t = 30)]
    kube_api_burst: u32,
    /// The cloud: `memory` (the in-process clouds, the scenario above),
    /// `aws` (a fresh moto per run behind provider-aws's testing proxy, an
    /// instance per Node; upstream runs the real k8s.io/cloud-provider-aws)
    /// or `hcloud` (the Hetzner day against the fake Hetzner Cloud API, with
    /// upstream on hcloud-go; the `--hcloud-*` options below).
    #[arg(long, default_value = "memory", value_parser = ["memory", "aws", "hcloud"])]
    cloud: String,
    /// Hetzner day: Nodes (and servers) of the first wave.
    #[arg(long, default_value_t = 60)]
    hcloud_wave1: usize,
    /// Hetzner day: Nodes of the second wave (both waves: at most 100 routes).
    #[arg(long, default_value_t = 40)]
    hcloud_wave2: usize,
    /// Hetzner day: servers and Nodes removed in the scale-down.
    #[arg(long, default_value_t = 30)]
    hcloud_scale_down: usize,
    /// Hetzner day: requests/hour other clients spend from the 3,600.
    #[arg(long, default_value_t = 1200)]
    hcloud_other_clients_per_hour: u32,
    /// Hetzner day: what is left of the 3,600 when the day starts.
    #[arg(long, default_value_t = 3600)]
    hcloud_budget_at_start: u32,
    /// Hetzner day: requests the autoscaler spends per server added or removed.
    #[arg(long, default_value_t = 5)]
    hcloud_autoscaler_requests_per_server: u32,
    /// Hetzner day: milliseconds one network action runs.
    #[arg(long, default_value_t = 500)]
    hcloud_action_ms: u64,
    /// Hetzner day: seconds of the idle window.
    #[arg(long, default_value_t = 120)]
    hcloud_idle_s: u64,
    /// Hetzner day: longest wait for one wave, in seconds.
    #[arg(long, default_value_t = 240)]
    hcloud_wave_timeout_s: u64,
    /// Every controller's `--min-resync-period`, in seconds (default: theirs,
    /// 12 h), to show a resync's cost within a short idle window.
    #[arg(long)]
    min_resync_period_s: Option<u64>,
    /// `--cloud aws`: the proxy enforces EC2's documented per-action token
    /// buckets (mutating 50 / 5 per s, non-mutating 100 / 20 per s,
    /// unfiltered DescribeInstances 50 / 10 per s).
    #[arg(long)]
    ec2_buckets: bool,
    /// `--cloud aws`: milliseconds the proxy adds to every answer.
    #[arg(long, default_value_t = 0)]
    ec2_latency_ms: u64,
    /// `--cloud aws`: seconds of throttle storm (every request answered
    /// RequestLimitExceeded), starting once half the burst is created; 0: none.
    #[arg(long, default_value_t = 0)]
    storm_s: u64,
}

fn version_line(program: &std::path::Path, arg: &str) -> String {
    std::process::Command::new(program)
        .arg(arg)
        .output()
        .ok()
        .and_then(|o| {
            let text = String::from_utf8_lossy(&o.stdout).into_owned();
            text.lines().next().map(|l| l.trim().to_string())
        })
        .filter(|l| !l.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

async fn apiserver_version(bins: &Binaries) -> String {
    let out = tokio::process::Command::new(bins.kube_apiserver())
        .arg("--version")
        .output()
        .await;
    match out {
        Ok(o) => String::from_utf8_lossy(&o.stdout).trim().to_string(),
        Err(_) => "unknown".into(),
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,kube=warn,kube_client=off".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();

    let kinds: Vec<Kind> = args
        .controllers
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| Kind::parse(s).with_context(|| format!("unknown controller {s:?}")))
        .collect::<anyhow::Result<_>>()?;
    if kinds.is_empty() {
        bail!("--controllers names none");
    }
    if args.route_tables == 0 {
        bail!("--route-tables must be at least 1");
    }
    if args.route_tables > 1 && kinds.iter().any(|k| k.is_upstream()) {
        bail!(
            "--route-tables {}: upstream's route controller manages one route table; pass --controllers periodic,watch,incremental",
            args.route_tables
        );
    }
    let aws_settings = (args.cloud == "aws").then_some(aws::AwsSettings {
        buckets: args.ec2_buckets,
        latency_ms: args.ec2_latency_ms,
        storm_s: args.storm_s,
    });
    if aws_settings.is_some() && args.route_tables > 1 {
        bail!("--cloud aws runs with one route table");
    }
    if aws_settings.is_none() && (args.ec2_buckets || args.ec2_latency_ms > 0 || args.storm_s > 0) {
        bail!("--ec2-buckets, --ec2-latency-ms and --storm-s need --cloud aws");
    }
    let upstream_bin = match (&args.upstream_bin, kinds.iter().any(|k| k.is_upstream())) {
        (Some(bin), _) => bin.clone(),
        (None, false) => PathBuf::new(),
        (None, true) => bail!("--upstream-bin is needed to run upstream's controller"),
    };
    for bin in [&upstream_bin, &args.controller_bin] {
        if !bin.as_os_str().is_empty() && !bin.is_file() {
            bail!("{}: no such file", bin.display());
        }
    }
    std::fs::create_dir_all(&args.out_dir)
        .with_context(|| format!("create {}", args.out_dir.display()))?;

    let bins = tokio::task::spawn_blocking(Binaries::locate).await??;
    match args.cloud.as_str() {
        "memory" | "aws" => {}
        "hcloud" => return hetzner(&args, &bins, kinds, upstream_bin).await,
        other => bail!("--cloud {other:?}: want memory, aws or hcloud"),
    }
    let scenario = Scenario {
        nodes: args.nodes,
        create_concurrency: args.create_concurrency,
        trickle: args.trickle,
        trickle_interval: Duration::from_millis(args.trickle_interval_ms),
        heartbeat_period: Duration::from_secs(args.heartbeat_period_s.max(1)),
        heartbeat_concurrency: args.heartbeat_concurrency,
        idle: Duration::from_secs(args.idle_s),
        scale_down: args.scale_down.unwrap_or(args.nodes / 10).min(args.nodes),
        address_changes: args.address_changes,
        settle: Duration::from_secs(args.settle_s),
        converge_timeout: Duration::from_secs(args.converge_timeout_s),
        tables: args.route_tables,
    };
    let setup = Setup {
        upstream_bin: upstream_bin.clone(),
        controller_bin: args.controller_bin.clone(),
        cluster_cidr: scenario::CLUSTER_CIDR.into(),
        cloud_latency: Duration::from_millis(args.cloud_latency_ms),
        tables: args.route_tables,
        qps: args.kube_api_qps,
        burst: args.kube_api_burst,
        hcloud: None,
        min_resync_period: args.min_resync_period_s.map(Duration::from_secs),
    };
    let mut report = Report {
        machine: probe::machine(),
        versions: Versions {
            kube_apiserver: apiserver_version(&bins).await,
            etcd: version_line(&bins.etcd(), "--version"),
            upstream_bin: upstream_bin.display().to_string(),
            controller_bin: version_line(&args.controller_bin, "--version"),
        },
        scenario: scenario.clone(),
        cloud_latency_ms: args.cloud_latency_ms,
        kube_api_qps: args.kube_api_qps,
        kube_api_burst: args.kube_api_burst,
        aws: aws_settings,
        runs: Vec::new(),
    };

    for kind in kinds {
        info!(
            controller = kind.name(),
            "run starting on a fresh control plane"
        );
        let run_dir = args.out_dir.join(kind.name());
        let result = scenario::run(&bins, &setup, &scenario, kind, &run_dir, aws_settings).await;
        if let Some(e) = &result.error {
            error!(controller = kind.name(), error = %e, "run failed");
        }
        report.runs.push(result);
        write(&args.out_dir, &report)?;
    }
    print!("{}", report.markdown());
    Ok(())
}

/// `--cloud hcloud`: the Hetzner day for each controller.
async fn hetzner(
    args: &Args,
    bins: &Binaries,
    kinds: Vec<Kind>,
    upstream_bin: PathBuf,
) -> anyhow::Result<()> {
    let day = hetzner_day::Day {
        wave1: args.hcloud_wave1,
        wave2: args.hcloud_wave2,
        scale_down: args.hcloud_scale_down,
        create_concurrency: 10,
        other_clients_per_hour: args.hcloud_other_clients_per_hour,
        autoscaler_requests_per_server: args.hcloud_autoscaler_requests_per_server,
        budget_at_start: args.hcloud_budget_at_start,
        action_duration: Duration::from_millis(args.hcloud_action_ms),
        quiet: Duration::from_secs(15),
        idle: Duration::from_secs(args.hcloud_idle_s),
        settle: Duration::from_secs(args.settle_s),
        wave_timeout: Duration::from_secs(args.hcloud_wave_timeout_s),
        heartbeat_period: Duration::from_secs(args.heartbeat_period_s.max(1)),
    };
    let setup = Setup {
        upstream_bin,
        controller_bin: args.controller_bin.clone(),
        cluster_cidr: hetzner_day::CLUSTER_CIDR.into(),
        cloud_latency: Duration::ZERO,
        tables: 1,
        qps: args.kube_api_qps,
        burst: args.kube_api_burst,
        hcloud: None,
        min_resync_period: args.min_resync_period_s.map(Duration::from_secs),
    };
    let mut report = hetzner_day::DayReport {
        machine: probe::machine(),
        min_requests: day.min_requests(),
        day: day.clone(),
        runs: Vec::new(),
    };
    for kind in kinds {
        info!(
            controller = kind.name(),
            "Hetzner day starting on a fresh control plane"
        );
        let run_dir = args.out_dir.join(format!("hcloud-{}", kind.name()));
        let result = hetzner_day::run(bins, &setup, &day, kind, &run_dir).await;
        if let Some(e) = &result.error {
            error!(controller = kind.name(), error = %e, "run failed");
        }
        report.runs.push(result);
        let json = serde_json::to_string_pretty(&report)?;
        std::fs::write(args.out_dir.join("hetzner-day.json"), json + "\n")?;
        std::fs::write(args.out_dir.join("hetzner-day.md"), report.markdown())?;
    }
    print!("{}", report.markdown());
    Ok(())
}

fn write(dir: &std::path::Path, report: &Report) -> anyhow::Result<()> {
    let json = serde_json::to_string_pretty(report)?;
    std::fs::write(dir.join("results.json"), json + "\n")
        .with_context(|| format!("write {}/results.json", dir.display()))?;
    std::fs::write(dir.join("results.md"), report.markdown())
        .with_context(|| format!("write {}/results.md", dir.display()))?;
    Ok(())
}
