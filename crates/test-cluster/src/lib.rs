//! A real kube-apiserver + etcd on loopback, shared by the integration tests
//! of the workspace, the benchmarks and the demo.
//!
//! This crate owns the local control plane: locating or building the
//! binaries (`scripts/build-controlplane.sh`), generating its PKI, starting
//! and supervising the processes, and the per-test isolation rules. Tests own
//! what they create inside a [`ClusterGuard`].
//!
//! ```no_run
//! # async fn demo() -> Result<(), test_cluster::Error> {
//! use test_cluster::{TestCluster, TestNode};
//! let cluster = TestCluster::acquire().await?; // serialised, Nodes wiped
//! cluster.create_node(&TestNode::new("n1").pod_cidrs(["10.244.1.0/24"])).await?;
//! # Ok(()) }
//! ```
//!
//! One control plane is started per test binary on first use and stops when
//! the binary exits, however it exits. With `CRC_TEST_KUBECONFIG` set, an
//! already running loopback cluster (e.g. from `make controlplane`) is used
//! instead; `CRC_TEST_ETCD_URL` then names its etcd for [`ClusterGuard::compact_etcd`].
//! Nodes are cluster-scoped, so [`TestCluster::acquire`] hands the cluster to
//! one test at a time (per process, and per machine for a shared cluster).

mod controlplane;
mod etcd;
mod nodes;
mod pki;

use std::fs::File;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Node, NodeCondition};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::json;
use tokio::sync::{Mutex, MutexGuard, OnceCell};
use tracing::info;

pub use controlplane::{BIN_DIR_ENV, Binaries, ControlPlane, StartOptions, restart_apiserver_of};
pub use nodes::{NETWORK_UNAVAILABLE, TestNode, UNINITIALIZED_TAINT, condition};

/// Points the fixture at a running cluster instead of starting one.
pub const KUBECONFIG_ENV: &str = "CRC_TEST_KUBECONFIG";
/// etcd endpoint of the cluster named by [`KUBECONFIG_ENV`] (optional).
pub const ETCD_URL_ENV: &str = "CRC_TEST_ETCD_URL";

/// Everything that can go wrong bringing up or using the fixture.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The kube-apiserver, etcd or kubectl binary is missing or could not be built.
    #[error("control-plane binaries: {0}")]
    Binaries(String),
    /// A file or process operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// Generating the fixture's certificates failed.
    #[error("generating {what}: {source}")]
    Pki {
        /// Which certificate or key.
        what: &'static str,
        /// The generator's error.
        #[source]
        source: rcgen::Error,
    },
    /// etcd or the kube-apiserver did not come up.
    #[error("control plane did not start: {reason}\n{logs}")]
    Startup {
        /// Why it is considered failed.
        reason: String,
        /// The tail of its logs.
        logs: String,
    },
    /// A kubeconfig could not be read or written.
    #[error("kubeconfig {path}: {message}")]
    Kubeconfig {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// A Kubernetes API request failed.
    #[error(transparent)]
    Kube(#[from] kube::Error),
    /// Something the fixture waits for did not happen in time.
    #[error("timed out after {timeout:?} waiting for {what}")]
    Timeout {
        /// How long it waited.
        timeout: Duration,
        /// What it waited for.
        what: String,
    },
    /// An etcd request (used to reset state between tests) failed.
    #[error("etcd: {0}")]
    Etcd(String),
    /// The process-wide control plane failed earlier; every later test gets this.
    #[error("the shared control plane failed to start earlier in this process: {0}")]
    SharedFailed(String),
    /// The fixture refuses to do what was asked (e.g. reset a foreign cluster).
    #[error("{0}")]
    Refused(String),
}

impl Error {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }
}

/// kube is built with aws-lc-rs only, but another crate in the same test
/// binary may enable a second rustls provider; then rustls cannot choose one
/// by itself.
fn install_crypto_provider() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    });
}

/// A fresh client for a kubeconfig file. Build one per tokio runtime: a
/// client's background tasks live on the runtime that created it.
pub async fn client_from_kubeconfig(path: &Path) -> Result<kube::Client, Error> {
    install_crypto_provider();
    let kubeconfig = Kubeconfig::read_from(path).map_err(|e| Error::Kubeconfig {
        path: path.to_owned(),
        message: e.to_string(),
    })?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| Error::Kubeconfig {
            path: path.to_owned(),
            message: e.to_string(),
        })?;
    Ok(kube::Client::try_from(config)?)
}

/// Polls `check` every 100 ms until it returns `Some`, or fails after `timeout`.
/// `what` names the awaited state in the error.
pub async fn wait_until<T, F, Fut>(timeout: Duration, what: &str, mut check: F) -> Result<T, Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return Ok(value);
        }
        if Instant::now() >= deadline {
            return Err(Error::Timeout {
                timeout,
                what: what.to_owned(),
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The cluster of this test binary: either started here or named by
/// [`KUBECONFIG_ENV`].
#[derive(Debug)]
pub struct TestCluster {
    kubeconfig: PathBuf,
    etcd_url: Option<String>,
    bin_dir: Option<PathBuf>,
    /// Set for a shared cluster outside this process: tests of other
    /// processes are kept out with a file lock next to the kubeconfig.
    lock_file: Option<PathBuf>,
    control_plane: Option<ControlPlane>,
}

static SHARED: OnceCell<Result<TestCluster, String>> = OnceCell::const_new();
static TURN: Mutex<()> = Mutex::const_new(());

fn is_loopback_server(server: &str) -> bool {
    let rest = server
        .strip_prefix("https://")
        .or_else(|| server.strip_prefix("http://"))
        .unwrap_or("");
    let host = rest.split('/').next().unwrap_or("");
    let host = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => host.rsplit_once(':').map_or(host, |(h, _)| h),
    };
    matches!(host, "127.0.0.1" | "localhost" | "::1")
}

impl TestCluster {
    async fn init() -> Result<TestCluster, Error> {
        if let Some(path) = std::env::var_os(KUBECONFIG_ENV).filter(|p| !p.is_empty()) {
            let kubeconfig = PathBuf::from(path);
            let parsed = Kubeconfig::read_from(&kubeconfig).map_err(|e| Error::Kubeconfig {
                path: kubeconfig.clone(),
                message: e.to_string(),
            })?;
            // Every acquire() deletes all Nodes: never do that to a real cluster.
            let servers: Vec<String> = parsed
                .clusters
                .iter()
                .filter_map(|c| c.cluster.as_ref()?.server.clone())
                .collect();
            if servers.is_empty() || !servers.iter().all(|s| is_loopback_server(s)) {
                return Err(Error::Refused(format!(
                    "{KUBECONFIG_ENV}={} names a non-loopback cluster ({servers:?}); the fixture deletes all Nodes, so it only uses local clusters",
                    kubeconfig.display()
                )));
            }
            info!(kubeconfig = %kubeconfig.display(), "using an existing cluster");
            return Ok(TestCluster {
                lock_file: Some(kubeconfig.with_extension("test-lock")),
                kubeconfig,
                etcd_url: std::env::var(ETCD_URL_ENV).ok().filter(|u| !u.is_empty()),
                bin_dir: std::env::var_os(BIN_DIR_ENV)
                    .filter(|d| !d.is_empty())
                    .map(PathBuf::from),
                control_plane: None,
            });
        }
        let plane = ControlPlane::start(StartOptions::default()).await?;
        info!(
            startup_ms = plane.startup_time().as_millis() as u64,
            "test control plane started"
        );
        Ok(TestCluster {
            kubeconfig: plane.kubeconfig().to_owned(),
            etcd_url: Some(plane.etcd_url().to_owned()),
            bin_dir: Some(plane.binaries().dir.clone()),
            lock_file: None,
            control_plane: Some(plane),
        })
    }

    /// The cluster of this test binary, started on first use. Prefer
    /// [`acquire`](Self::acquire) in tests; this one neither serialises nor
    /// cleans up.
    pub async fn shared() -> Result<&'static TestCluster, Error> {
        // A failed start is remembered: retrying a broken build per test would
        // only multiply the wait.
        let result = SHARED
            .get_or_init(|| async { Self::init().await.map_err(|e| e.to_string()) })
            .await;
        result.as_ref().map_err(|e| Error::SharedFailed(e.clone()))
    }

    /// Waits for this test's turn on the cluster, deletes all Nodes, Events
    /// and non-apiserver Leases, and returns a guard with a fresh client.
    pub async fn acquire() -> Result<ClusterGuard, Error> {
        let cluster = Self::shared().await?;
        let turn = TURN.lock().await;
        let file_lock = match &cluster.lock_file {
            Some(path) => Some(lock_exclusive(path.clone()).await?),
            None => None,
        };
        let client = cluster.client().await?;
        let guard = ClusterGuard {
            cluster,
            client,
            _turn: turn,
            _file_lock: file_lock,
        };
        guard.reset().await?;
        Ok(guard)
    }

    /// A new client (admin, `system:masters`) for the calling runtime.
    pub async fn client(&self) -> Result<kube::Client, Error> {
        client_from_kubeconfig(&self.kubeconfig).await
    }

    /// Kubeconfig file, e.g. for `--kubeconfig` of a spawned controller.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// etcd endpoint, when known.
    pub fn etcd_url(&self) -> Option<&str> {
        self.etcd_url.as_deref()
    }

    /// The control plane started by this process, if it started one.
    pub fn control_plane(&self) -> Option<&ControlPlane> {
        self.control_plane.as_ref()
    }

    /// kubectl matching the server version. Blocking if the binaries must be
    /// located first (only for a cluster named by [`KUBECONFIG_ENV`]).
    pub fn kubectl_path(&self) -> Result<PathBuf, Error> {
        match &self.bin_dir {
            Some(dir) => Ok(dir.join("kubectl")),
            None => Ok(Binaries::locate()?.kubectl()),
        }
    }
}

async fn lock_exclusive(path: PathBuf) -> Result<File, Error> {
    tokio::task::spawn_blocking(move || {
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|source| Error::io(format!("open {}", path.display()), source))?;
        file.lock()
            .map_err(|source| Error::io(format!("lock {}", path.display()), source))?;
        Ok(file)
    })
    .await
    .map_err(|e| {
        Error::io(
            "lock the shared cluster",
            std::io::Error::other(e.to_string()),
        )
    })?
}

/// Exclusive use of the cluster for one test. Dropping it lets the next test
/// in. Holds a client built on the test's own runtime.
pub struct ClusterGuard {
    cluster: &'static TestCluster,
    client: kube::Client,
    _turn: MutexGuard<'static, ()>,
    _file_lock: Option<File>,
}

impl std::fmt::Debug for ClusterGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterGuard")
            .field("cluster", self.cluster)
            .finish_non_exhaustive()
    }
}

impl std::ops::Deref for ClusterGuard {
    type Target = TestCluster;
    fn deref(&self) -> &TestCluster {
        self.cluster
    }
}

const RESET_TIMEOUT: Duration = Duration::from_secs(60);

impl ClusterGuard {
    /// The client of this test (cheap to clone).
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// The cluster's Nodes.
    pub fn nodes(&self) -> Api<Node> {
        Api::all(self.client.clone())
    }

    async fn reset(&self) -> Result<(), Error> {
        let nodes = self.nodes();
        nodes
            .delete_collection(&DeleteParams::default(), &ListParams::default())
            .await?;
        wait_until(RESET_TIMEOUT, "all Nodes deleted", || async {
            let list = nodes
                .list_metadata(&ListParams::default().limit(1))
                .await
                .ok()?;
            list.items.is_empty().then_some(())
        })
        .await?;

        // Events and Leases are namespaced: clear every namespace that has some.
        let events: Api<Event> = Api::all(self.client.clone());
        let mut namespaces: Vec<String> = events
            .list_metadata(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter_map(|e| e.metadata.namespace)
            .collect();
        namespaces.sort();
        namespaces.dedup();
        for ns in &namespaces {
            let api: Api<Event> = Api::namespaced(self.client.clone(), ns);
            api.delete_collection(&DeleteParams::default(), &ListParams::default())
                .await?;
        }

        // The apiserver's own identity leases must stay.
        let keep = ListParams::default().labels("!apiserver.kubernetes.io/identity");
        let leases: Api<Lease> = Api::all(self.client.clone());
        let mut namespaces: Vec<String> = leases
            .list_metadata(&keep)
            .await?
            .items
            .into_iter()
            .filter_map(|l| l.metadata.namespace)
            .collect();
        namespaces.sort();
        namespaces.dedup();
        for ns in &namespaces {
            let api: Api<Lease> = Api::namespaced(self.client.clone(), ns);
            api.delete_collection(&DeleteParams::default(), &keep)
                .await?;
        }
        Ok(())
    }

    /// Creates a Node including its status.
    pub async fn create_node(&self, node: &TestNode) -> Result<Node, Error> {
        Ok(self
            .nodes()
            .create(&Default::default(), &node.to_node())
            .await?)
    }

    /// Deletes a Node (an error if it does not exist).
    pub async fn delete_node(&self, name: &str) -> Result<(), Error> {
        self.nodes().delete(name, &DeleteParams::default()).await?;
        Ok(())
    }

    /// What a kubelet does every few seconds: bump the Ready condition's
    /// `lastHeartbeatTime` with a strategic-merge patch of `nodes/status`.
    /// Each call is a real write (new resourceVersion). Returns the patched Node.
    pub async fn heartbeat(&self, name: &str) -> Result<Node, Error> {
        let nodes = self.nodes();
        let current = nodes.get_status(name).await?;
        let ready = condition(&current, "Ready");
        let beat = nodes::next_heartbeat(ready.and_then(|c| c.last_heartbeat_time.as_ref()));
        let mut entry = json!({
            "type": "Ready",
            "status": ready.map_or("True", |c| c.status.as_str()),
            "lastHeartbeatTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(beat),
        });
        if ready.is_none() {
            entry["lastTransitionTime"] = entry["lastHeartbeatTime"].clone();
            entry["reason"] = json!("KubeletReady");
        }
        let patch = json!({ "status": { "conditions": [entry] } });
        Ok(nodes
            .patch_status(name, &PatchParams::default(), &Patch::Strategic(&patch))
            .await?)
    }

    /// The Node's `NetworkUnavailable` condition, if set.
    pub async fn network_unavailable(&self, name: &str) -> Result<Option<NodeCondition>, Error> {
        let node = self.nodes().get_status(name).await?;
        Ok(condition(&node, NETWORK_UNAVAILABLE).cloned())
    }

    /// core/v1 Events (any namespace) whose involvedObject is the named Node.
    pub async fn node_events(&self, name: &str) -> Result<Vec<Event>, Error> {
        let events: Api<Event> = Api::all(self.client.clone());
        let selector = format!("involvedObject.kind=Node,involvedObject.name={name}");
        Ok(events
            .list(&ListParams::default().fields(&selector))
            .await?
            .items)
    }

    /// Compacts etcd history up to the current revision `R` and returns `R`.
    /// A watch from resourceVersion `X` needs the history from `X + 1` on, so
    /// afterwards a watch from any `X < R - 1` that reaches etcd gets 410 Gone.
    ///
    /// Watches served from the apiserver's watch cache (Nodes are cached;
    /// Events are not) keep their own window and expire by it instead.
    pub async fn compact_etcd(&self) -> Result<i64, Error> {
        let url = self.etcd_url().ok_or_else(|| {
            Error::Refused(format!(
                "etcd endpoint unknown: set {ETCD_URL_ENV} with {KUBECONFIG_ENV}"
            ))
        })?;
        etcd::compact(url).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_detection() {
        assert!(is_loopback_server("https://127.0.0.1:6443"));
        assert!(is_loopback_server("https://localhost:1/"));
        assert!(is_loopback_server("https://[::1]:6443"));
        assert!(!is_loopback_server("https://10.0.0.1:6443"));
        assert!(!is_loopback_server("https://127.0.0.1.example.com:6443"));
        assert!(!is_loopback_server("garbage"));
    }

    #[tokio::test]
    async fn wait_until_returns_value_or_times_out() {
        let mut n = 0;
        let got = wait_until(Duration::from_secs(5), "third poll", || {
            n += 1;
            let v = n;
            async move { (v >= 3).then_some(v) }
        })
        .await
        .expect("value");
        assert_eq!(got, 3);
        let err = wait_until(Duration::from_millis(250), "never", || async { None::<()> })
            .await
            .expect_err("timeout");
        assert!(matches!(err, Error::Timeout { ref what, .. } if what == "never"));
    }
}
