//! The controller processes under test: how each is started, when it counts
//! as ready, and how its cloud-call counts are read at the end.
//!
//! Both controllers get the same kubeconfig (admin, exempt from API Priority
//! and Fairness), the same client limits (QPS 20, burst 30: the
//! cloud-controller-manager's defaults), the same cluster CIDR, the same
//! 10 s period and 12 h resync defaults, and an in-process cloud with the same
//! added latency whose listed routes report node addresses as reliable (so an
//! address change replaces the route on both sides).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use route_controller::Mode;
use serde::{Deserialize, Serialize};
use tokio::process::{Child, Command};
use tracing::{info, warn};

use crate::probe::{self, OpCount};

/// One controller configuration of the benchmark: upstream with its feature
/// gate off or on, or this project's controller in one of its modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Upstream; `watch_gate` is `CloudControllerManagerWatchBasedRoutesReconciliation`.
    Upstream {
        /// The feature gate: on reconciles on Node events, off every 10 s.
        watch_gate: bool,
    },
    /// This project's controller in `--reconcile-mode`.
    Ours(Mode),
}

impl Kind {
    /// Every configuration, upstream first, ours in [`Mode::ALL`]'s order.
    pub fn all() -> Vec<Kind> {
        [false, true]
            .map(|watch_gate| Kind::Upstream { watch_gate })
            .into_iter()
            .chain(Mode::ALL.map(Kind::Ours))
            .collect()
    }

    /// The name on the command line and in result files.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Upstream { watch_gate: false } => "upstream-periodic",
            Kind::Upstream { watch_gate: true } => "upstream-watch",
            Kind::Ours(mode) => mode.as_str(),
        }
    }

    /// The configuration named `s`.
    pub fn parse(s: &str) -> Option<Kind> {
        Kind::all().into_iter().find(|k| k.name() == s.trim())
    }

    /// The upstream Go controller.
    pub fn is_upstream(self) -> bool {
        matches!(self, Kind::Upstream { .. })
    }

    /// Human label for tables.
    pub fn label(self) -> String {
        match self {
            Kind::Upstream { watch_gate: false } => "upstream, gate off".into(),
            Kind::Upstream { watch_gate: true } => "upstream, gate on".into(),
            Kind::Ours(mode) => format!("ours, {mode}"),
        }
    }
}

impl Serialize for Kind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

/// Where the two controller binaries are and what they share.
#[derive(Debug, Clone)]
pub struct Setup {
    pub upstream_bin: PathBuf,
    pub controller_bin: PathBuf,
    pub cluster_cidr: String,
    pub cloud_latency: Duration,
    /// Route tables of this project's simulated cloud.
    pub tables: usize,
    pub qps: u32,
    pub burst: u32,
    /// A Hetzner Cloud API (the fake) instead of the in-process clouds:
    /// upstream runs with `--cloud=hcloud` (hcloud-go), ours with
    /// `--cloud-provider=hcloud`.
    pub hcloud: Option<HcloudTarget>,
    /// `--min-resync-period` for every controller (both take a Go
    /// duration); `None`: their default, 12 h.
    pub min_resync_period: Option<Duration>,
}

/// Where the Hetzner Cloud API of a run is.
#[derive(Debug, Clone)]
pub struct HcloudTarget {
    /// Base URL ending in `/v1`.
    pub endpoint: String,
    pub network: u64,
    pub token: String,
}

/// A started controller.
#[derive(Debug)]
pub struct Running {
    pub kind: Kind,
    child: Child,
    pub pid: u32,
    metrics_addr: String,
    stats_out: PathBuf,
    pub started: Instant,
}

fn free_port() -> anyhow::Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("reserve a loopback port")?;
    Ok(l.local_addr()?.port())
}

/// `aws`: with `--cloud aws`, the upstream provider's and this project's
/// cloud configs ([`crate::aws::World::write_configs`]); `None` for the
/// in-process clouds.
pub async fn start(
    setup: &Setup,
    kind: Kind,
    kubeconfig: &Path,
    run_dir: &Path,
    aws: Option<&(PathBuf, PathBuf)>,
) -> anyhow::Result<Running> {
    std::fs::create_dir_all(run_dir).with_context(|| format!("create {}", run_dir.display()))?;
    let metrics_addr = format!("127.0.0.1:{}", free_port()?);
    let stats_out = run_dir.join("upstream-stats.json");
    let log_path = run_dir.join("controller.log");
    let log = std::fs::File::create(&log_path)
        .with_context(|| format!("create {}", log_path.display()))?;
    let latency_ms = setup.cloud_latency.as_millis();

    let mut cmd = if let Some(h) = &setup.hcloud {
        hcloud_command(
            setup,
            h,
            kind,
            kubeconfig,
            run_dir,
            &metrics_addr,
            &stats_out,
        )?
    } else if let Some((upstream_conf, ours_conf)) = aws {
        let mut c = if kind.is_upstream() {
            let mut c = Command::new(&setup.upstream_bin);
            c.arg(format!("--kubeconfig={}", kubeconfig.display()))
                .arg(format!("--cluster-cidr={}", setup.cluster_cidr))
                .arg("--cloud=aws")
                .arg(format!("--cloud-config={}", upstream_conf.display()))
                .arg(format!("--kube-api-qps={}", setup.qps))
                .arg(format!("--kube-api-burst={}", setup.burst))
                .arg(format!("--metrics-addr={metrics_addr}"))
                .arg(format!("--stats-out={}", stats_out.display()));
            if let Kind::Upstream { watch_gate: true } = kind {
                c.arg("--watch-based");
            }
            c
        } else {
            ours_command(setup, kind, kubeconfig, "aws", ours_conf, &metrics_addr)
        };
        for (k, v) in crate::aws::ENV {
            c.env(k, v);
        }
        c
    } else if kind.is_upstream() {
        let mut c = Command::new(&setup.upstream_bin);
        c.arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg(format!("--cluster-cidr={}", setup.cluster_cidr))
            .arg(format!("--cloud-latency={latency_ms}ms"))
            .arg("--enable-node-addresses")
            .arg(format!("--kube-api-qps={}", setup.qps))
            .arg(format!("--kube-api-burst={}", setup.burst))
            .arg(format!("--metrics-addr={metrics_addr}"))
            .arg(format!("--stats-out={}", stats_out.display()));
        if let Kind::Upstream { watch_gate: true } = kind {
            c.arg("--watch-based");
        }
        c
    } else {
        let cloud_config = run_dir.join("memory-cloud.yaml");
        std::fs::write(
            &cloud_config,
            format!(
                "latency: {{list_ms: {latency_ms}, create_ms: {latency_ms}, delete_ms: {latency_ms}, batch_ms: {latency_ms}}}\nreports_node_addresses: true\n{}",
                if setup.tables > 1 {
                    let names: Vec<String> =
                        (1..=setup.tables).map(|i| format!("table-{i}")).collect();
                    format!("targets: [{}]\n", names.join(", "))
                } else {
                    String::new()
                }
            ),
        )
        .with_context(|| format!("write {}", cloud_config.display()))?;
        ours_command(
            setup,
            kind,
            kubeconfig,
            "memory",
            &cloud_config,
            &metrics_addr,
        )
    };
    if let Some(p) = setup.min_resync_period {
        cmd.arg(format!("--min-resync-period={}ms", p.as_millis()));
    }
    cmd.stdin(Stdio::null())
        .stdout(log.try_clone().context("dup log file")?)
        .stderr(log)
        // A crashed driver must not leave a controller behind.
        .kill_on_drop(true);
    let started = Instant::now();
    let child = cmd
        .spawn()
        .with_context(|| format!("spawn {}", kind.name()))?;
    let pid = child.id().context("spawned controller has no pid")?;
    info!(controller = kind.name(), pid, %metrics_addr, log = %log_path.display(), "controller started");
    let mut running = Running {
        kind,
        child,
        pid,
        metrics_addr,
        stats_out,
        started,
    };
    running.wait_ready(Duration::from_secs(60)).await?;
    Ok(running)
}

/// The command line of `kind` against the Hetzner Cloud API `h`; the token
/// goes through the environment (upstream) or a file (ours), never argv.
fn hcloud_command(
    setup: &Setup,
    h: &HcloudTarget,
    kind: Kind,
    kubeconfig: &Path,
    run_dir: &Path,
    metrics_addr: &str,
    stats_out: &Path,
) -> anyhow::Result<Command> {
    let common = |c: &mut Command| {
        c.arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg(format!("--cluster-cidr={}", setup.cluster_cidr))
            .arg(format!("--kube-api-qps={}", setup.qps))
            .arg(format!("--kube-api-burst={}", setup.burst));
    };
    if kind.is_upstream() {
        let mut c = Command::new(&setup.upstream_bin);
        common(&mut c);
        c.arg("--cloud=hcloud")
            .arg(format!("--hcloud-endpoint={}", h.endpoint))
            .arg(format!("--hcloud-network={}", h.network))
            .arg(format!("--metrics-addr={metrics_addr}"))
            .arg(format!("--stats-out={}", stats_out.display()))
            .env("HCLOUD_TOKEN", &h.token);
        if let Kind::Upstream { watch_gate: true } = kind {
            c.arg("--watch-based");
        }
        return Ok(c);
    }
    let token_file = run_dir.join("hcloud-token");
    std::fs::write(&token_file, &h.token)
        .with_context(|| format!("write {}", token_file.display()))?;
    let cloud_config = run_dir.join("hcloud.yaml");
    std::fs::write(
        &cloud_config,
        format!(
            "network: \"{}\"\nendpoint: {}\ntoken_file: {}\n",
            h.network,
            h.endpoint,
            token_file.display()
        ),
    )
    .with_context(|| format!("write {}", cloud_config.display()))?;
    let mut c = ours_command(
        setup,
        kind,
        kubeconfig,
        "hcloud",
        &cloud_config,
        metrics_addr,
    );
    c.env_remove("HCLOUD_TOKEN");
    Ok(c)
}

/// This project's controller in `kind`'s mode with `provider` and its
/// cloud config, against the run's API server, without leader election.
fn ours_command(
    setup: &Setup,
    kind: Kind,
    kubeconfig: &Path,
    provider: &str,
    cloud_config: &Path,
    metrics_addr: &str,
) -> Command {
    let mut c = Command::new(&setup.controller_bin);
    c.arg(format!("--kubeconfig={}", kubeconfig.display()))
        .arg(format!("--cluster-cidr={}", setup.cluster_cidr))
        // Measured side by side with upstream, which bounds nothing: a
        // scenario's scale-down of many Nodes at once is meant.
        .arg("--max-route-deletions=100%")
        .arg("--max-unavailable-nodes=100%")
        .arg(format!("--cloud-provider={provider}"))
        .arg(format!("--cloud-config={}", cloud_config.display()))
        .arg(format!("--reconcile-mode={}", kind.name()))
        .arg("--leader-elect=false")
        .arg(format!("--kube-api-qps={}", setup.qps))
        .arg(format!("--kube-api-burst={}", setup.burst))
        .arg(format!("--metrics-bind-address={metrics_addr}"))
        .arg("--secure-port=0");
    c
}

/// Upstream's exit stats (`tools/upstream-route-controller/README.md`).
#[derive(Debug, Clone, Deserialize)]
struct UpstreamStats {
    list: u64,
    list_errors: u64,
    create: u64,
    create_errors: u64,
    delete: u64,
    delete_errors: u64,
    routes: u64,
}

/// What the driver reads from a controller at the end of a run.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    pub calls: BTreeMap<String, OpCount>,
    /// Routes in the cloud table at the end: upstream reports its table;
    /// for ours it is successful creations minus successful deletions.
    pub routes_at_end: i64,
    pub exit_ok: bool,
}

impl Running {
    async fn wait_ready(&mut self, timeout: Duration) -> anyhow::Result<()> {
        // Ours answers /readyz once its caches are synced. Upstream's harness
        // has no readiness endpoint; it serves /metrics just before it starts
        // its informers, whose first list of a still empty cluster takes
        // milliseconds, so the first Node created after this point is seen at
        // once by both.
        let path = if self.kind.is_upstream() {
            "/metrics"
        } else {
            "/readyz"
        };
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!("{} exited during start-up with {status}", self.kind.name());
            }
            if let Ok((200, _)) =
                probe::http_get(&self.metrics_addr, path, Duration::from_secs(2)).await
            {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!("{} not ready after {timeout:?}", self.kind.name());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Still running?
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Reads the metrics (ours), stops the process with SIGTERM and reads the
    /// exit stats (upstream).
    pub async fn stop(mut self) -> anyhow::Result<Outcome> {
        let ours = if self.kind.is_upstream() {
            None
        } else {
            let (status, body) =
                probe::http_get(&self.metrics_addr, "/metrics", Duration::from_secs(10)).await?;
            if status != 200 {
                bail!("GET /metrics answered {status}");
            }
            Some(probe::cloud_requests(&body))
        };

        // Only this pid, which this driver spawned.
        let killed = Command::new("kill")
            .arg("-TERM")
            .arg(self.pid.to_string())
            .status()
            .await
            .context("run kill -TERM")?;
        if !killed.success() {
            warn!(pid = self.pid, "kill -TERM failed");
        }
        let exit_ok = match tokio::time::timeout(Duration::from_secs(60), self.child.wait()).await {
            Ok(status) => status?.success(),
            Err(_) => {
                warn!(
                    controller = self.kind.name(),
                    "no exit 60 s after SIGTERM; killing"
                );
                self.child.kill().await?;
                false
            }
        };

        if let Some(calls) = ours {
            let ok = |op: &str| calls.get(op).map_or(0, |c| c.calls - c.errors) as i64;
            return Ok(Outcome {
                routes_at_end: ok("create") - ok("delete"),
                calls,
                exit_ok,
            });
        }
        let text = std::fs::read_to_string(&self.stats_out)
            .with_context(|| format!("read {}", self.stats_out.display()))?;
        let s: UpstreamStats = serde_json::from_str(&text)
            .with_context(|| format!("parse {}", self.stats_out.display()))?;
        let calls = BTreeMap::from([
            (
                "list".to_string(),
                OpCount {
                    calls: s.list,
                    errors: s.list_errors,
                },
            ),
            (
                "create".to_string(),
                OpCount {
                    calls: s.create,
                    errors: s.create_errors,
                },
            ),
            (
                "delete".to_string(),
                OpCount {
                    calls: s.delete,
                    errors: s.delete_errors,
                },
            ),
        ]);
        Ok(Outcome {
            calls,
            routes_at_end: s.routes as i64,
            exit_ok,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_round_trip_by_name() {
        for k in Kind::all() {
            assert_eq!(Kind::parse(k.name()), Some(k));
        }
        assert_eq!(Kind::parse(" watch "), Some(Kind::Ours(Mode::Watch)));
        assert_eq!(Kind::parse("upstream"), None);
        let gate_on = Kind::Upstream { watch_gate: true };
        assert!(gate_on.is_upstream() && !Kind::Ours(Mode::Watch).is_upstream());
    }
}
