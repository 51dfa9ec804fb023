//! Command-line flags. Names and defaults follow the cloud-controller-manager
//! wherever it has the same setting; everything is validated once, here,
//! before anything starts, so a bad value is a one-line error and exit code 2.

use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgAction, Args, Parser, Subcommand, ValueEnum};
use route_controller::Mode;
use route_controller::bounds::Budget;
use route_core::{Cidr, parse_cluster_cidrs};

use crate::duration;

/// The feature gate of KEP-5237, accepted for compatibility.
pub const WATCH_GATE: &str = "CloudControllerManagerWatchBasedRoutesReconciliation";

/// `--version`: the crate's version and the git commit it was built from.
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("CRC_GIT_COMMIT"),
    ")"
);

#[derive(Debug, Parser)]
#[command(
    name = "cloud-route-controller",
    version = VERSION,
    about = "Keeps a cloud's route table in step with the cluster's Nodes: every Node's pod CIDRs are routed to that Node.",
    long_about = "Keeps a cloud's route table in step with the cluster's Nodes: every Node's pod CIDRs are routed to that Node.\n\nRuns beside a cloud-controller-manager whose built-in route controller is turned off (--controllers=*,-route). Without a subcommand it runs the controller (`run`).",
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,

    #[command(flatten)]
    pub run: RunArgs,
}

#[allow(
    clippy::large_enum_variant,
    reason = "parsed once at start-up; boxing the big variant would buy nothing"
)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the route controller (the default).
    Run(RunArgs),
    /// Read the cluster and the cloud, print what the controller would change, change nothing.
    Plan(PlanArgs),
    /// Remove every route this cluster owns from every route table (teardown, or switching route controllers); prints them, and deletes only with --yes. Stop the controller first.
    Cleanup(CleanupArgs),
    /// Simulate a scenario in every mode on a virtual clock (a day in seconds): cloud calls, node-to-route latency, a chart. Needs no cluster and no cloud.
    #[cfg(feature = "lab")]
    Simulate(simulator::SimulateArgs),
    /// Model-check the reconcile loop: seeded random Node changes and cloud faults on a virtual clock, invariants checked after every call; a failing seed prints its replay command and a shrunk sequence.
    #[cfg(feature = "lab")]
    Check(simulator::check::CheckArgs),
}

/// Where the cluster and the cloud are.
#[derive(Debug, Args, Clone)]
pub struct ClusterArgs {
    /// Path to a kubeconfig. Without it: in-cluster configuration, else $KUBECONFIG, else ~/.kube/config.
    #[arg(long, env = "KUBECONFIG_PATH", value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,

    /// The cluster's name; providers use it to find and tag this cluster's routes.
    #[arg(long, default_value = "kubernetes")]
    pub cluster_name: String,

    /// CIDR range of pods in the cluster: one CIDR, or one IPv4 and one IPv6 CIDR separated by a comma. Required.
    #[arg(long, value_name = "CIDR[,CIDR]")]
    pub cluster_cidr: Option<String>,

    /// Route only the Nodes this label selector selects (kubectl syntax: `key=value`, `key!=value`, `key in (a,b)`, `key notin (a,b)`, `key`, `!key`, comma-separated). A Node outside it gets no route, and routes to it are never deleted unless a route controller routed it before (its NetworkUnavailable reason is one of ours); it then loses them in the pass its label change arrives (a label change is deliberate: --route-deletion-grace does not apply) and says NodeExcluded. Empty: every Node.
    #[arg(long, value_name = "SELECTOR", default_value = "")]
    pub node_selector: String,

    /// The address families to route: IPv4, IPv6 or both, comma-separated. Pod CIDRs and routes of a family left out are not touched at all (a cloud network that cannot route IPv6, say).
    #[arg(long, value_name = "IPv4[,IPv6]", default_value = "IPv4,IPv6")]
    pub route_ip_families: String,

    /// The cloud provider: aws, openstack, hcloud, azure or gce; memory is a simulated cloud for demos and tests. Required, as on the cloud-controller-manager: a start that leaves it out would otherwise route nothing while Nodes read RouteCreated.
    #[arg(long, value_name = "NAME")]
    pub cloud_provider: Option<String>,

    /// Path to the provider's configuration file: the cloud-controller-manager's own (the INI of aws, openstack's cloud.conf, gce's gce.conf, azure's azure.json), this controller's YAML (TOML when it ends in .toml), or one of each with the flag given twice.
    #[arg(long, value_name = "FILE")]
    pub cloud_config: Vec<PathBuf>,

    /// Queries per second to the Kubernetes API server.
    #[arg(long, default_value_t = 20.0)]
    pub kube_api_qps: f32,

    /// Burst of queries to the Kubernetes API server.
    #[arg(long, default_value_t = 30)]
    pub kube_api_burst: u32,

    /// Verbosity: -v for debug, -vv for trace, the same as --v=4 and --v=6 (RUST_LOG overrides).
    #[arg(short = 'v', action = ArgAction::Count, global = true)]
    pub verbose: u8,

    /// Verbosity as the cloud-controller-manager's klog reads it, 0 to 10: 0–3 info (what changed, what failed), 4–5 debug (each decision), 6 and up trace (each request). The higher of this and -v wins; RUST_LOG overrides both.
    #[arg(long = "v", value_name = "N", global = true, value_parser = clap::value_parser!(u8).range(0..=10))]
    pub klog_verbosity: Option<u8>,

    /// Log format: text, or json for log pipelines, one object per line in the cloud-controller-manager's (component-base) shape: ts, caller, msg, v, err and the fields flat.
    #[arg(long = "logging-format", visible_alias = "log-format", value_enum, default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line, for log pipelines.
    Json,
}

/// Flags of `run`.
#[derive(Debug, Args, Clone)]
pub struct RunArgs {
    #[command(flatten)]
    pub cluster: ClusterArgs,

    /// When to reconcile. periodic: list and reconcile every --route-reconciliation-period (upstream, gate off).
    /// watch: reconcile on node changes, at most every 10 s, plus a resync (upstream KEP-5237, gate on).
    /// incremental: plan node changes against the cached route table, list only to resync (default).
    #[arg(long, value_name = "MODE", value_enum)]
    pub reconcile_mode: Option<Mode>,

    /// Feature gates, key=value pairs separated by commas. Only CloudControllerManagerWatchBasedRoutesReconciliation is known: true selects watch, false periodic.
    #[arg(long, value_name = "GATES")]
    pub feature_gates: Option<String>,

    /// Whether to manage cloud routes at all; false makes the controller say so once and stay up idle (/healthz and /readyz ready, no route, no Node read) until SIGTERM, as a cloud-controller-manager with its route controller off.
    #[arg(long, default_value_t = true, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub configure_cloud_routes: bool,

    /// The period of the periodic mode (Go duration).
    #[arg(long, default_value = "10s", value_parser = duration::parse)]
    pub route_reconciliation_period: Duration,

    /// The resync of the watch and incremental modes runs every random interval in [this, 2 × this), chosen once at start (Go duration).
    #[arg(long, default_value = "12h", value_parser = duration::parse)]
    pub min_resync_period: Duration,

    /// How often the route targets (AWS route tables, OpenStack routers) are looked up again without listing routes, so a table tagged for the cluster while it runs gets every Node's route; a full pass that lists the cloud looks them up too and restarts this clock (Go duration).
    #[arg(long, default_value = "5m", value_parser = duration::parse)]
    pub route_target_discovery_period: Duration,

    /// The drift check, in every mode: when no pass has listed the cloud for this long, a full pass lists it, repairs what someone else changed (a route deleted or pointed elsewhere, another cluster's route gone) and reads every routed Node's forwarding prerequisite afresh; a Node's RouteCreated is never older than this plus one pass. 0 turns it off (then only the resync looks) (Go duration).
    #[arg(long, default_value = "5m", value_parser = duration::parse)]
    pub route_drift_check_period: Duration,

    /// Concurrent NetworkUnavailable patches.
    #[arg(long, default_value_t = 10)]
    pub concurrent_status_updates: usize,

    /// Let --cloud-provider=memory (a simulated cloud) start although the cluster's Nodes carry a real cloud's spec.providerID (aws://, openstack://, hcloud://, gce://, azure://). Without it such a start is refused: it would mark those Nodes RouteCreated while no route exists in their cloud.
    #[arg(long, default_value_t = false)]
    pub unsafe_memory_provider_on_cloud_nodes: bool,

    /// How long the route of a Node that disappeared is kept before it is deleted, so a Node re-created under the same name with the same pod CIDR keeps its route (Go duration; 0 deletes at once). Only a Node that disappeared, or a pod CIDR gone from its Node, waits for it: routes of a Node that left --node-selector go at once, and deletions that free a CIDR another Node needs never wait.
    #[arg(long, default_value = "2s", value_parser = duration::parse)]
    pub route_deletion_grace: Duration,

    /// The most working Nodes (NetworkUnavailable False or Unknown) one pass may turn NetworkUnavailable=True, which taints them NoSchedule: a count, or a percentage of the cluster's Nodes that never allows fewer than 2. A pass that would turn more writes none of those conditions, says so (log, ChangesHeld Warning, route_controller_held_changes) and goes on with everything else; 100% lifts the bound. The default is Karpenter's disruption budget.
    #[arg(long, default_value = "10%", value_parser = parse_budget)]
    pub max_unavailable_nodes: Budget,

    /// The most live routes no Node needs (their Node is gone or left out, or they name none) one pass may delete from one route table: a count, or a percentage of the live routes listed in it. A pass that would delete more deletes none of them from that table and says so; blackholes and routes replaced in the same pass do not count, and creations are never held. 100% lifts the bound. The default is cluster-autoscaler's scale-down parallelism.
    #[arg(long, default_value = "10", value_parser = parse_budget)]
    pub max_route_deletions: Budget,

    /// How long in-flight cloud calls may take to finish after SIGTERM.
    #[arg(long, default_value = "30s", value_parser = duration::parse)]
    pub shutdown_grace_period: Duration,

    /// Write nothing: plan, list the cloud and read the Nodes as usual, but change no route, repair no forwarding prerequisite, patch no Node condition and emit no Event. What it would change is logged once per difference ("dry run: would create route ...") and exported as route_controller_dry_run_* gauges, so it runs beside the route controller it is to replace and shows where they differ. Its Lease defaults to cloud-route-controller-dry-run.
    #[arg(long, default_value_t = false, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub dry_run: bool,

    #[command(flatten)]
    pub leader: LeaderArgs,

    /// Plain HTTP for /metrics, /healthz, /livez and /readyz without authentication, only on request: HOST:PORT, or a bare PORT for 127.0.0.1:PORT; empty or "0" (the default) turns it off. The secure port (--secure-port) serves the same endpoints.
    #[arg(long, default_value = "0")]
    pub metrics_bind_address: String,

    #[command(flatten)]
    pub serving: ServingArgs,
}

/// The secure port, as the cloud-controller-manager's secure serving flags.
#[derive(Debug, Args, Clone)]
pub struct ServingArgs {
    /// The HTTPS port for /metrics, /healthz, /livez and /readyz; /metrics needs a bearer token the API server authenticates (TokenReview) and authorizes for get on /metrics (SubjectAccessReview). 10288 lies in 10280-10299, where a survey of what binds on control-plane hosts found no default user: kubelet 10250/10248, kube-proxy 10249/10256, kube-controller-manager 10257, cloud-controller-manager 10258 and its webhook 10260, kube-scheduler 10259, etcd 2379-2381, Azure's CCM chart 10267/10268, hcloud CCM metrics 8233, Cilium 4240/4244/9962-9965, Calico 9091/9099, ingress-nginx 10254, OpenYurt 10261-10273, Antrea 10350. The default was 10260 until the CCM's webhook port, bound on 0.0.0.0 by many CCMs, made whichever started second on a host fail; 0 turns it off.
    #[arg(long, default_value_t = 10288)]
    pub secure_port: u16,

    /// The address the secure port listens on.
    #[arg(long, default_value = "0.0.0.0", value_name = "IP")]
    pub bind_address: std::net::IpAddr,

    /// PEM certificate (chain) for the secure port, read again when the file changes; without it a self-signed one is made in memory at start.
    #[arg(long, value_name = "FILE", requires = "tls_private_key_file")]
    pub tls_cert_file: Option<PathBuf>,

    /// PEM private key of --tls-cert-file.
    #[arg(long, value_name = "FILE", requires = "tls_cert_file")]
    pub tls_private_key_file: Option<PathBuf>,

    /// Paths the secure port serves without authentication or authorization, comma-separated; a trailing * matches a prefix.
    #[arg(long, value_name = "PATHS", default_value = "/healthz,/readyz,/livez")]
    pub authorization_always_allow_paths: String,
}

impl ServingArgs {
    /// The secure port's settings, or `None` when `--secure-port=0`.
    pub fn secure(&self) -> Option<crate::secure::SecureConfig> {
        (self.secure_port != 0).then(|| crate::secure::SecureConfig {
            addr: std::net::SocketAddr::new(self.bind_address, self.secure_port),
            cert_files: self
                .tls_cert_file
                .clone()
                .zip(self.tls_private_key_file.clone()),
            always_allow: self
                .authorization_always_allow_paths
                .split(',')
                .map(str::trim)
                .filter(|p| !p.is_empty())
                .map(String::from)
                .collect(),
        })
    }
}

/// Leader election, as the cloud-controller-manager's flags.
#[derive(Debug, Args, Clone)]
pub struct LeaderArgs {
    /// Elect a leader through a Lease before mutating routes (run several replicas with it on).
    #[arg(long, default_value_t = true, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub leader_elect: bool,

    /// How long a non-leader waits after the last renewal before taking over.
    #[arg(long, default_value = "15s", value_parser = duration::parse)]
    pub leader_elect_lease_duration: Duration,

    /// How long the leader keeps trying to renew before it gives up leadership; it changes the
    /// cloud only until its last successful renewal's send time plus this.
    #[arg(long, default_value = "10s", value_parser = duration::parse)]
    pub leader_elect_renew_deadline: Duration,

    /// How often candidates and the leader try to acquire or renew.
    #[arg(long, default_value = "2s", value_parser = duration::parse)]
    pub leader_elect_retry_period: Duration,

    /// Namespace of the Lease (default: the pod's namespace, else kube-system).
    #[arg(long)]
    pub leader_elect_resource_namespace: Option<String>,

    /// Name of the Lease (default: cloud-route-controller; with --dry-run cloud-route-controller-dry-run, so a dry run never holds the Lease of a replica that writes).
    #[arg(long, value_name = "NAME")]
    pub leader_elect_resource_name: Option<String>,

    /// Identity in the Lease (default: POD_NAME, else the hostname).
    #[arg(long, env = "POD_NAME")]
    pub leader_elect_identity: Option<String>,
}

/// Flags of `plan`.
#[derive(Debug, Args, Clone)]
pub struct PlanArgs {
    #[command(flatten)]
    pub cluster: ClusterArgs,

    /// As `run`'s: the plan says which deletions `run` would hold for it in its first pass (Go duration).
    #[arg(long, default_value = "2s", value_parser = duration::parse)]
    pub route_deletion_grace: Duration,

    /// As `run`'s: the plan says which deletions `run` would hold for it.
    #[arg(long, default_value = "10", value_parser = parse_budget)]
    pub max_route_deletions: Budget,

    /// Output format.
    #[arg(long, short = 'o', value_enum, default_value_t = Output::Table)]
    pub output: Output,

    /// Exit with status 3 when the plan is not "no change needed" (routes to
    /// create or delete, conditions to write, conflicts, Nodes left out, a
    /// prerequisite off), as `git diff --exit-code` does; 0 when it is, 1 on
    /// an error, 2 on a bad flag. The chart's `helm test` uses it.
    #[arg(long, default_value_t = false)]
    pub exit_code: bool,

    /// Accepted as `run` takes it, and changes nothing: `plan` never writes.
    #[arg(long, default_value_t = false, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub dry_run: bool,
}

/// `cleanup`'s flags.
#[derive(Debug, Args, Clone)]
pub struct CleanupArgs {
    #[command(flatten)]
    pub cluster: ClusterArgs,

    /// Delete the routes listed; without it, only print them.
    #[arg(long)]
    pub yes: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// A table for people.
    Table,
    /// JSON for tools.
    Json,
}

/// A flag value that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum FlagError {
    #[error("{0}")]
    ClusterCidr(#[from] route_core::model::ClusterCidrError),
    #[error("--feature-gates: {0}")]
    FeatureGates(String),
    #[error(
        "--reconcile-mode={mode} contradicts --feature-gates={WATCH_GATE}={gate}, which selects {implied}; give one of them"
    )]
    Contradiction {
        mode: String,
        gate: bool,
        implied: &'static str,
    },
    #[error("{0}")]
    Invalid(String),
}

impl ClusterArgs {
    /// The parsed cluster CIDRs.
    pub fn cluster_cidrs(&self) -> Result<Vec<Cidr>, FlagError> {
        Ok(parse_cluster_cidrs(
            self.cluster_cidr.as_deref().unwrap_or(""),
        )?)
    }

    /// The parsed `--node-selector`.
    pub fn node_selector(&self) -> Result<route_controller::select::NodeSelector, FlagError> {
        self.node_selector
            .parse()
            .map_err(|e: route_controller::select::SelectorError| FlagError::Invalid(e.to_string()))
    }

    /// The families `--route-ip-families` leaves out.
    pub fn skip_families(&self) -> Result<Vec<route_core::IpFamily>, FlagError> {
        use route_core::IpFamily;
        let mut routed = Vec::new();
        for f in self.route_ip_families.split(',').map(str::trim) {
            let fam = match f.to_ascii_lowercase().as_str() {
                "ipv4" => IpFamily::V4,
                "ipv6" => IpFamily::V6,
                _ => {
                    return Err(FlagError::Invalid(format!(
                        "--route-ip-families {:?}: {f:?} is not IPv4 or IPv6",
                        self.route_ip_families
                    )));
                }
            };
            if !routed.contains(&fam) {
                routed.push(fam);
            }
        }
        Ok([IpFamily::V4, IpFamily::V6]
            .into_iter()
            .filter(|f| !routed.contains(f))
            .collect())
    }

    /// The klog verbosity the logs follow: the higher of `--v` and `-v`
    /// (`-v` = 4, `-vv` = 6).
    pub fn verbosity(&self) -> u8 {
        let short = match self.verbose {
            0 => 0,
            1 => 4,
            _ => 6,
        };
        self.klog_verbosity.unwrap_or(0).max(short)
    }

    /// The `--cloud-provider` given; [`validate`](Self::validate) refuses a
    /// start without one, so after it this is never empty.
    pub fn cloud_provider(&self) -> &str {
        self.cloud_provider.as_deref().unwrap_or_default()
    }

    pub fn validate(&self) -> Result<(), FlagError> {
        self.cluster_cidrs()?;
        self.node_selector()?;
        self.skip_families()?;
        let Some(provider) = self.cloud_provider.as_deref() else {
            return Err(FlagError::Invalid(format!(
                "--cloud-provider is required: one of {}",
                crate::providers::choices()
            )));
        };
        if provider == "memory" && !crate::providers::is_known(provider) {
            return Err(FlagError::Invalid(format!(
                "--cloud-provider memory: the simulated cloud is not part of this build (a release build carries only the real clouds); build with `--features lab` (as make demo does) to use it, or choose one of {}",
                crate::providers::choices()
            )));
        }
        if !crate::providers::is_known(provider) {
            return Err(FlagError::Invalid(format!(
                "--cloud-provider {provider:?} is not known; this build supports: {}",
                crate::providers::choices()
            )));
        }
        if self.cluster_name.trim().is_empty() {
            return Err(FlagError::Invalid(
                "--cluster-name must not be empty".into(),
            ));
        }
        if !(self.kube_api_qps.is_finite() && self.kube_api_qps > 0.0) {
            return Err(FlagError::Invalid(format!(
                "--kube-api-qps must be a positive number, got {}",
                self.kube_api_qps
            )));
        }
        if self.kube_api_burst == 0 {
            return Err(FlagError::Invalid(
                "--kube-api-burst must be at least 1".into(),
            ));
        }
        for p in &self.cloud_config {
            if !p.is_file() {
                return Err(FlagError::Invalid(format!(
                    "--cloud-config {}: no such file",
                    p.display()
                )));
            }
        }
        if self.cloud_config.len() > 2 {
            return Err(FlagError::Invalid(
                "--cloud-config is given at most twice: the cloud-controller-manager's file and this controller's YAML".into(),
            ));
        }
        Ok(())
    }
}

/// Parses `--feature-gates`, returning the watch gate's value if given.
/// `--max-unavailable-nodes`, `--max-route-deletions`: a count or a percentage.
fn parse_budget(s: &str) -> Result<Budget, String> {
    s.parse()
        .map_err(|e: route_controller::bounds::BudgetError| e.to_string())
}

pub fn parse_feature_gates(s: &str) -> Result<Option<bool>, FlagError> {
    let mut watch = None;
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (k, v) = part
            .split_once('=')
            .ok_or_else(|| FlagError::FeatureGates(format!("{part:?} is not key=value")))?;
        let v = match v.trim().to_ascii_lowercase().as_str() {
            "true" => true,
            "false" => false,
            other => {
                return Err(FlagError::FeatureGates(format!(
                    "{k}={other:?}: the value must be true or false"
                )));
            }
        };
        if k.trim() == WATCH_GATE {
            watch = Some(v);
        } else {
            return Err(FlagError::FeatureGates(format!(
                "unrecognized feature gate {k:?}; this controller knows only {WATCH_GATE}"
            )));
        }
    }
    Ok(watch)
}

impl RunArgs {
    /// The Lease's name: `--leader-elect-resource-name`, else the default,
    /// which a dry run does not share with the replicas that write.
    pub fn lease_name(&self) -> String {
        match &self.leader.leader_elect_resource_name {
            Some(name) => name.clone(),
            None if self.dry_run => "cloud-route-controller-dry-run".into(),
            None => "cloud-route-controller".into(),
        }
    }

    /// `--metrics-bind-address`: `None` when off, a bare port on 127.0.0.1.
    pub fn plain_metrics_address(&self) -> Result<Option<std::net::SocketAddr>, FlagError> {
        let a = self.metrics_bind_address.trim();
        if matches!(a, "" | "0") {
            return Ok(None);
        }
        if let Ok(port) = a.parse::<u16>() {
            return Ok(Some(std::net::SocketAddr::from(([127, 0, 0, 1], port))));
        }
        a.parse().map(Some).map_err(|_| {
            FlagError::Invalid(format!(
                "--metrics-bind-address {a:?}: expected HOST:PORT or PORT (127.0.0.1:PORT), e.g. 127.0.0.1:10261"
            ))
        })
    }

    /// The reconcile mode from --reconcile-mode and --feature-gates.
    pub fn mode(&self) -> Result<Mode, FlagError> {
        let gate = match &self.feature_gates {
            Some(g) => parse_feature_gates(g)?,
            None => None,
        };
        Mode::resolve(self.reconcile_mode, gate).map_err(|(mode, implied)| {
            FlagError::Contradiction {
                mode: mode.as_str().into(),
                gate: gate == Some(true),
                implied: implied.as_str(),
            }
        })
    }

    /// Checks every flag.
    pub fn validate(&self) -> Result<(), FlagError> {
        if !self.configure_cloud_routes {
            // As the cloud-controller-manager: nothing else is read.
            return Ok(());
        }
        self.cluster.validate()?;
        self.mode()?;
        if self.route_reconciliation_period.is_zero() {
            return Err(FlagError::Invalid(
                "--route-reconciliation-period must be above zero".into(),
            ));
        }
        if self.min_resync_period.is_zero() {
            return Err(FlagError::Invalid(
                "--min-resync-period must be above zero".into(),
            ));
        }
        if self.route_target_discovery_period.is_zero() {
            return Err(FlagError::Invalid(
                "--route-target-discovery-period must be above zero".into(),
            ));
        }
        if self.concurrent_status_updates == 0 {
            return Err(FlagError::Invalid(
                "--concurrent-status-updates must be at least 1".into(),
            ));
        }
        let l = &self.leader;
        if l.leader_elect {
            if l.leader_elect_retry_period.is_zero() {
                return Err(FlagError::Invalid(
                    "--leader-elect-retry-period must be above zero".into(),
                ));
            }
            if l.leader_elect_renew_deadline <= l.leader_elect_retry_period {
                return Err(FlagError::Invalid(format!(
                    "--leader-elect-renew-deadline ({:?}) must be greater than --leader-elect-retry-period ({:?})",
                    l.leader_elect_renew_deadline, l.leader_elect_retry_period
                )));
            }
            if l.leader_elect_lease_duration <= l.leader_elect_renew_deadline {
                return Err(FlagError::Invalid(format!(
                    "--leader-elect-lease-duration ({:?}) must be greater than --leader-elect-renew-deadline ({:?})",
                    l.leader_elect_lease_duration, l.leader_elect_renew_deadline
                )));
            }
            if self.lease_name().trim().is_empty() {
                return Err(FlagError::Invalid(
                    "--leader-elect-resource-name must not be empty".into(),
                ));
            }
        }
        self.plain_metrics_address()?;
        for (flag, path) in [
            ("--tls-cert-file", &self.serving.tls_cert_file),
            ("--tls-private-key-file", &self.serving.tls_private_key_file),
        ] {
            if let Some(p) = path
                && !p.is_file()
            {
                return Err(FlagError::Invalid(format!(
                    "{flag} {}: no such file",
                    p.display()
                )));
            }
        }
        if self.serving.secure_port != 0
            && self
                .plain_metrics_address()?
                .is_some_and(|a| a.port() == self.serving.secure_port)
        {
            return Err(FlagError::Invalid(format!(
                "--metrics-bind-address {:?} and --secure-port {} name the same port",
                self.metrics_bind_address, self.serving.secure_port
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A provider this build knows, for tests about other flags.
    const ANY_PROVIDER: &str = crate::providers::REGISTRY[0].name;

    /// A release build has no simulated cloud, and says how to get one.
    #[cfg(not(feature = "lab"))]
    #[test]
    fn the_memory_provider_outside_the_lab_build_is_refused_with_how_to_get_it() {
        let e = run(&["--cluster-cidr", "10.0.0.0/8", "--cloud-provider", "memory"])
            .validate()
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("not part of this build") && e.contains("--features lab"),
            "{e}"
        );
    }

    fn run(args: &[&str]) -> RunArgs {
        let mut v = vec!["cloud-route-controller"];
        v.extend_from_slice(args);
        Cli::try_parse_from(v).unwrap().run
    }

    #[test]
    fn defaults_match_the_cloud_controller_manager() {
        let r = run(&["--cluster-cidr", "10.244.0.0/16", "--cloud-provider", "aws"]);
        assert_eq!(r.cluster.cluster_name, "kubernetes");
        assert_eq!(r.serving.secure_port, 10288);
        assert_eq!(
            r.serving.authorization_always_allow_paths,
            "/healthz,/readyz,/livez"
        );
        assert_eq!(
            r.plain_metrics_address().unwrap(),
            None,
            "no plain HTTP unless asked"
        );
        assert_eq!(r.route_reconciliation_period, Duration::from_secs(10));
        assert_eq!(r.min_resync_period, Duration::from_secs(12 * 3600));
        assert_eq!(r.route_target_discovery_period, Duration::from_secs(300));
        assert_eq!(r.route_drift_check_period, Duration::from_secs(300));
        assert!(r.configure_cloud_routes);
        assert_eq!(r.cluster.kube_api_qps, 20.0);
        assert_eq!(r.cluster.kube_api_burst, 30);
        assert!(r.leader.leader_elect);
        assert_eq!(
            r.leader.leader_elect_lease_duration,
            Duration::from_secs(15)
        );
        assert_eq!(
            r.leader.leader_elect_renew_deadline,
            Duration::from_secs(10)
        );
        assert_eq!(r.leader.leader_elect_retry_period, Duration::from_secs(2));
        assert_eq!(r.mode().unwrap(), Mode::Incremental);
        r.validate().unwrap();
    }

    #[test]
    fn a_dry_run_has_a_lease_of_its_own_unless_named() {
        let writer = run(&[]);
        assert!(!writer.dry_run);
        assert_eq!(writer.lease_name(), "cloud-route-controller");
        let shadow = run(&[
            "--dry-run",
            "--cluster-cidr",
            "10.244.0.0/16",
            "--cloud-provider",
            "aws",
        ]);
        assert!(shadow.dry_run);
        assert_eq!(shadow.lease_name(), "cloud-route-controller-dry-run");
        shadow.validate().unwrap();
        let named = run(&["--dry-run=true", "--leader-elect-resource-name=shadow"]);
        assert_eq!(named.lease_name(), "shadow");
        assert!(!run(&["--dry-run=false"]).dry_run);
        // `plan` takes it too, and writes nothing either way.
        let cli = Cli::try_parse_from(["cloud-route-controller", "plan", "--dry-run"]).unwrap();
        assert!(matches!(cli.command, Some(Command::Plan(p)) if p.dry_run));
    }

    #[test]
    fn go_style_bool_flags() {
        assert!(!run(&["--configure-cloud-routes=false"]).configure_cloud_routes);
        assert!(run(&["--configure-cloud-routes"]).configure_cloud_routes);
        assert!(!run(&["--leader-elect=false"]).leader.leader_elect);
    }

    #[test]
    fn feature_gate_selects_mode_and_contradictions_are_errors() {
        let g = |v: &str| format!("--feature-gates={WATCH_GATE}={v}");
        assert_eq!(run(&[&g("true")]).mode().unwrap(), Mode::Watch);
        assert_eq!(run(&[&g("false")]).mode().unwrap(), Mode::Periodic);
        assert_eq!(
            run(&[&g("true"), "--reconcile-mode", "watch"])
                .mode()
                .unwrap(),
            Mode::Watch
        );
        let e = run(&[&g("true"), "--reconcile-mode", "incremental"])
            .mode()
            .unwrap_err();
        assert!(e.to_string().contains("contradicts"), "{e}");
        assert!(run(&["--feature-gates=Foo=true"]).mode().is_err());
        assert!(run(&[&g("maybe")]).mode().is_err());
    }

    #[test]
    fn cluster_cidr_rules() {
        for ok in ["10.244.0.0/16", "10.244.0.0/16,fd00::/48"] {
            run(&["--cluster-cidr", ok, "--cloud-provider", ANY_PROVIDER])
                .validate()
                .unwrap();
        }
        for bad in [
            "",
            "10.244.0.0/16,10.245.0.0/16",
            "10.0.0.0/8,fd00::/48,fd01::/48",
            "nope",
        ] {
            assert!(run(&["--cluster-cidr", bad]).validate().is_err(), "{bad:?}");
        }
        assert!(run(&[]).validate().is_err(), "--cluster-cidr is required");
    }

    #[test]
    fn no_cloud_provider_is_refused_and_a_bare_metrics_port_binds_loopback() {
        let e = run(&["--cluster-cidr", "10.0.0.0/8"])
            .validate()
            .unwrap_err();
        assert!(
            e.to_string().contains("--cloud-provider is required"),
            "{e}"
        );
        let r = run(&["--metrics-bind-address", "10261"]);
        assert_eq!(
            r.plain_metrics_address().unwrap(),
            Some("127.0.0.1:10261".parse().unwrap())
        );
        let r = run(&[
            "--cluster-cidr",
            "10.0.0.0/8",
            "--cloud-provider",
            ANY_PROVIDER,
            "--metrics-bind-address",
            "0.0.0.0:10288",
        ]);
        let e = r.validate().unwrap_err();
        assert!(e.to_string().contains("name the same port"), "{e}");
    }

    #[test]
    fn leader_timings_must_be_ordered() {
        let r = run(&[
            "--cluster-cidr",
            "10.0.0.0/8",
            "--leader-elect-renew-deadline",
            "20s",
        ]);
        assert!(r.validate().is_err());
    }

    #[test]
    fn bad_durations_are_refused_by_the_parser() {
        let e = Cli::try_parse_from([
            "cloud-route-controller",
            "--route-reconciliation-period",
            "ten",
        ]);
        assert!(e.is_err());
    }
}
