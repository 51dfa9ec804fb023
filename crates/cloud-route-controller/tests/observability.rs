//! What an operator sees of a running controller: `/metrics` after a
//! scripted scenario (every metric, with the right labels and values that
//! agree with the simulated cloud's own counters), `/readyz` before and after
//! the Node cache syncs, `/healthz`, and logs (one JSON object per line with
//! `--log-format json`, each cloud mutation logged once with node,
//! destination and result).

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use cloud_sim::wire::{FailNext, Faults};
use cloud_sim::{AdminClient, SimServer};
use common::{
    Controller, TempDir, free_port, http_get_async, https_get, metric_present, metric_sum,
    sim_cloud_config, wait_http,
};
use provider_memory::{MemoryConfig, Operation};
use route_cloud::ErrorKind;
use serde_json::Value;
use test_cluster::{ClusterGuard, TestCluster, TestNode, wait_until};
use tokio::net::{TcpListener, TcpStream};

const CLUSTER: &str = "kubernetes";
const ID: &str = "observed";

fn pod_cidr(i: u32) -> String {
    format!("10.244.{i}.0/24")
}

async fn add_node(c: &ClusterGuard, i: u32) {
    c.create_node(&TestNode::new(format!("obs-{i}")).pod_cidrs([pod_cidr(i)]))
        .await
        .expect("create the test Node");
}

async fn destinations(admin: &AdminClient) -> Vec<String> {
    let mut d: Vec<String> = admin
        .routes(CLUSTER)
        .await
        .unwrap_or_default()
        .iter()
        .map(|r| r.destination.to_string())
        .collect();
    d.sort();
    d
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_and_logs_after_a_scripted_scenario() {
    let c = TestCluster::acquire().await.unwrap();
    let sim = SimServer::start_local(MemoryConfig::default())
        .await
        .unwrap();
    let admin = AdminClient::new(&sim.url()).unwrap();
    let dir = TempDir::new("observe");
    let config = sim_cloud_config(dir.path(), "cloud", &sim.url(), None);
    let addr = format!("127.0.0.1:{}", free_port());
    let base = format!("http://{addr}");
    let ctl = Controller::start(
        c.kubeconfig_path(),
        dir.path(),
        "controller",
        &[
            "--cluster-cidr",
            "10.244.0.0/16",
            "--cloud-provider",
            "memory",
            "--cloud-config",
            config.to_str().unwrap(),
            "--leader-elect=false",
            "--leader-elect-identity",
            ID,
            // Resyncs every 2-4 s, so periodic passes happen within the test.
            "--min-resync-period",
            "2s",
            "--log-format",
            "json",
            "--metrics-bind-address",
            &addr,
        ],
    );
    let ctx = || ctl.log_text();
    wait_http(&base, "/readyz", 200, Duration::from_secs(60))
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", ctx()));

    // Three nodes are routed.
    for i in 1..=3 {
        add_node(&c, i).await;
    }
    let want: Vec<String> = (1..=3).map(pod_cidr).collect();
    wait_until(Duration::from_secs(60), "three routes", || async {
        (destinations(&admin).await == want).then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctx()));

    // A creation fails once, then succeeds on retry, with a Warning Event.
    admin
        .faults(&Faults {
            fail_next: vec![FailNext {
                op: Operation::Create,
                count: 1,
                kind: ErrorKind::Transient,
            }],
            ..Default::default()
        })
        .await
        .unwrap();
    add_node(&c, 4).await;
    wait_until(
        Duration::from_secs(60),
        "obs-4 routed after a retry",
        || async {
            destinations(&admin)
                .await
                .contains(&pod_cidr(4))
                .then_some(())
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctx()));
    let events = c.node_events("obs-4").await.unwrap();
    assert!(
        events
            .iter()
            .any(|e| e.reason.as_deref() == Some("FailedToCreateRoute")),
        "{events:?}"
    );

    // One node goes away; a heartbeat is absorbed.
    c.delete_node("obs-1").await.unwrap();
    c.heartbeat("obs-2").await.unwrap();
    let want: Vec<String> = (2..=4).map(pod_cidr).collect();
    wait_until(Duration::from_secs(60), "obs-1's route deleted", || async {
        (destinations(&admin).await == want).then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctx()));

    // Drift behind the controller's back: a resync puts the route back.
    admin.remove_route(CLUSTER, &pod_cidr(3)).await.unwrap();
    wait_until(
        Duration::from_secs(60),
        "drift corrected by a resync",
        || async { (destinations(&admin).await == want).then_some(()) },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctx()));

    // And a later resync finds nothing to do.
    let sync = "route_controller_route_sync_total";
    let text = wait_until(Duration::from_secs(30), "a periodic no-op pass", || async {
        let t = http_get_async(&base, "/metrics").await?.1;
        (metric_sum(&t, sync, &["trigger=\"periodic\"", "outcome=\"noop\""]) >= 1.0
            && metric_sum(&t, "route_controller_pending_operations", &[]) == 0.0)
            .then_some(t)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctx()));
    eprintln!("{text}");

    let has = |name: &str, labels: &[&str]| metric_present(&text, name, labels);
    let sum = |name: &str, labels: &[&str]| metric_sum(&text, name, labels);
    // Pass counters with upstream's labels.
    for (trigger, outcome) in [
        ("node_change", "changed"),
        ("node_change", "error"),
        ("periodic", "changed"),
        ("periodic", "noop"),
    ] {
        let t = format!("trigger=\"{trigger}\"");
        let o = format!("outcome=\"{outcome}\"");
        assert!(sum(sync, &[&t, &o]) >= 1.0, "{trigger}/{outcome}:\n{text}");
    }
    for line in text.lines().filter(|l| l.starts_with(sync)) {
        assert!(
            ["node_change", "periodic"]
                .iter()
                .any(|t| line.contains(&format!("trigger=\"{t}\"")))
                && ["changed", "noop", "error"]
                    .iter()
                    .any(|o| line.contains(&format!("outcome=\"{o}\""))),
            "unexpected label value: {line}"
        );
    }

    // Cloud requests agree with what the simulated cloud counted.
    let stats = admin.stats().await.unwrap();
    let req = "route_controller_cloud_requests_total";
    for op in ["create", "delete"] {
        let mut counted = 0;
        for cnt in stats.counts.iter().filter(|c| c.operation == op) {
            let labels = [
                "provider=\"memory\"".to_string(),
                format!("operation=\"{op}\""),
                format!("result=\"{}\"", cnt.result),
            ];
            let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
            assert_eq!(
                sum(req, &labels) as u64,
                cnt.count,
                "{op}/{}: {stats:?}\n{text}",
                cnt.result
            );
            counted += cnt.count;
        }
        assert_eq!(
            sum(req, &[&format!("operation=\"{op}\"")]) as u64,
            counted,
            "{op}: {stats:?}\n{text}"
        );
    }
    // a, b, c, d, and c again after the drift.
    assert_eq!(stats.count("create", "ok"), 5, "{stats:?}");
    assert_eq!(stats.count("create", "transient"), 1, "{stats:?}");
    assert_eq!(stats.count("delete", "ok"), 1, "{stats:?}");
    assert!(
        sum(req, &["operation=\"list\"", "result=\"ok\""]) >= 2.0,
        "{text}"
    );

    // Histograms, gauges and counters.
    for kind in ["full", "cached"] {
        let k = format!("kind=\"{kind}\"");
        assert!(
            sum("route_controller_reconcile_duration_seconds_count", &[&k]) >= 1.0,
            "{kind}:\n{text}"
        );
        assert!(has(
            "route_controller_reconcile_duration_seconds_bucket",
            &[&k, "le=\"+Inf\""]
        ));
        assert!(has(
            "route_controller_reconcile_duration_seconds_sum",
            &[&k]
        ));
    }
    // Once per (node, pod CIDR), from first sight to the first confirmed
    // route: obs-1..obs-4. Neither the re-creation after drift nor later
    // updates of a routed Node (heartbeats, its own condition) count again.
    assert_eq!(
        sum("route_controller_node_route_latency_seconds_count", &[]),
        4.0,
        "one latency observation per node that got its first route:\n{text}"
    );
    assert!(has(
        "route_controller_node_route_latency_seconds_bucket",
        &["le=\"+Inf\""]
    ));
    assert!(has("route_controller_node_route_latency_seconds_sum", &[]));
    assert_eq!(
        sum("route_controller_pending_operations", &[]),
        0.0,
        "{text}"
    );
    assert_eq!(
        sum("route_controller_retrying_operations", &[]),
        0.0,
        "{text}"
    );
    assert!(
        has("route_controller_cloud_rate_limit_wait_seconds_total", &[]),
        "{text}"
    );
    // The cloud never answered throttled: at most the gate's own overhead.
    assert!(
        sum("route_controller_throttle_wait_seconds_total", &[]) < 0.01,
        "{text}"
    );
    assert!(
        sum("route_controller_route_corrections_total", &[]) >= 1.0,
        "the drift correction is counted:\n{text}"
    );
    assert_eq!(sum("route_controller_leader", &[]), 1.0, "{text}");
    assert!(
        has(
            "route_controller_build_info",
            &[&format!("version=\"{}\"", env!("CARGO_PKG_VERSION"))]
        ),
        "{text}"
    );
    assert!(
        sum(
            "route_controller_node_events_total",
            &["result=\"trigger\""]
        ) >= 5.0,
        "{text}"
    );
    assert!(
        sum(
            "route_controller_node_events_total",
            &["result=\"absorbed\""]
        ) >= 1.0,
        "the heartbeat is absorbed:\n{text}"
    );
    assert!(
        sum(
            "route_controller_warning_events_total",
            &["reason=\"FailedToCreateRoute\""]
        ) >= 1.0,
        "{text}"
    );
    let (code, _) = http_get_async(&base, "/healthz").await.unwrap();
    assert_eq!(code, 200);

    let logs = ctl.log_text();
    let exit = ctl.stop();
    let logs_after = std::fs::read_to_string(dir.path().join("controller.log")).unwrap_or(logs);
    assert_eq!(exit, Some(0), "{logs_after}");

    // `--log-format json`: every line is one JSON object in component-base's
    // shape (ts, caller, msg; v on all but error lines), fields flat.
    let mut lines = Vec::new();
    for line in logs_after.lines().filter(|l| !l.trim().is_empty()) {
        let v: Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}"));
        assert!(v.is_object(), "{line}");
        assert!(v["ts"].is_f64(), "ts missing: {line}");
        for key in ["caller", "msg"] {
            assert!(v[key].is_string(), "{key} missing: {line}");
        }
        assert!(
            v["v"].is_u64() || v["level"] == "error",
            "v missing on a line that is not an error: {line}"
        );
        for nested in ["fields", "spans", "span"] {
            assert!(v.get(nested).is_none(), "{nested} is not flat: {line}");
        }
        lines.push(v);
    }
    assert!(lines.len() > 5, "{logs_after}");

    // Every cloud mutation logged once, with node, destination and result,
    // exactly as the simulated cloud saw it.
    type Key = (String, String, String, String);
    let mut logged: BTreeMap<Key, usize> = BTreeMap::new();
    for v in &lines {
        let (Some(op), Some(dest), Some(result)) = (
            v.get("operation").and_then(Value::as_str),
            v.get("destination").and_then(Value::as_str),
            v.get("result").and_then(Value::as_str),
        ) else {
            continue;
        };
        let node = v
            .get("node")
            .and_then(Value::as_str)
            .unwrap_or_else(|| panic!("mutation log without node: {v}"));
        *logged
            .entry((op.into(), node.into(), dest.into(), result.into()))
            .or_default() += 1;
    }
    let mut called: BTreeMap<Key, usize> = BTreeMap::new();
    for e in admin.log(0).await.unwrap() {
        if matches!(e.op, Operation::Create | Operation::Delete) {
            assert_eq!(e.caller, ID);
            *called
                .entry((
                    e.op.as_str().into(),
                    e.node.unwrap_or_default(),
                    e.destination.unwrap_or_default(),
                    e.result,
                ))
                .or_default() += 1;
        }
    }
    assert_eq!(logged, called, "logged mutations vs. the cloud's call log");
    assert!(called.values().sum::<usize>() >= 7, "{called:?}");

    // Every line a pass logs carries the pass's span, flat: its id as
    // `pass`, the same trigger, kind and mode on each of its lines.
    let pass_of = |v: &Value| -> Option<Value> {
        let id = v.get("pass")?.clone();
        Some(serde_json::json!({
            "id": id, "trigger": v["trigger"], "kind": v["kind"], "mode": v["mode"]
        }))
    };
    let mut passes: BTreeMap<u64, Value> = BTreeMap::new();
    for v in &lines {
        let Some(span) = pass_of(v) else { continue };
        let id = span["id"]
            .as_u64()
            .unwrap_or_else(|| panic!("a pass without a numeric id: {v}"));
        for field in ["trigger", "kind", "mode"] {
            assert!(span[field].is_string(), "a pass line lacks {field}: {v}");
        }
        let first = passes.entry(id).or_insert_with(|| span.clone());
        assert_eq!(*first, span, "two lines of pass {id} disagree on its span");
    }
    for v in lines.iter().filter(|v| v.get("operation").is_some()) {
        assert!(
            pass_of(v).is_some(),
            "a route change logged outside a pass: {v}"
        );
    }
    assert!(
        passes.len() >= 2,
        "several passes, each its own id: {passes:?}"
    );
    assert_eq!(
        passes
            .values()
            .filter(|s| s["mode"] != "incremental")
            .count(),
        0,
        "{passes:?}"
    );
}

/// A copy of `kubeconfig` in `dir` whose server is a free loopback port, for
/// a TCP forwarder to the real API server (its certificate is for
/// 127.0.0.1, so TLS still verifies): the new kubeconfig, that port, and
/// the real server's address.
fn via_proxy(
    kubeconfig: &std::path::Path,
    dir: &std::path::Path,
) -> (std::path::PathBuf, u16, String) {
    let original = std::fs::read_to_string(kubeconfig).expect("read the test kubeconfig");
    let server_line = original
        .lines()
        .find(|l| l.trim_start().starts_with("server: https://127.0.0.1:"))
        .expect("a loopback server in the test kubeconfig");
    let upstream = server_line
        .trim()
        .trim_start_matches("server: https://")
        .to_string();
    let proxy_port = free_port();
    let path = dir.join("kubeconfig");
    std::fs::write(
        &path,
        original.replace(
            server_line,
            &server_line.replace(&upstream, &format!("127.0.0.1:{proxy_port}")),
        ),
    )
    .expect("write the proxied kubeconfig");
    (path, proxy_port, upstream)
}

/// Forwards every connection on `listener` to `upstream`.
async fn forward(listener: TcpListener, upstream: String) {
    while let Ok((mut inbound, _)) = listener.accept().await {
        let upstream = upstream.clone();
        tokio::spawn(async move {
            if let Ok(mut out) = TcpStream::connect(&upstream).await {
                let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
            }
        });
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_waits_for_the_node_cache_and_healthz_does_not() {
    let c = TestCluster::acquire().await.unwrap();
    add_node(&c, 1).await;
    let sim = SimServer::start_local(MemoryConfig::default())
        .await
        .unwrap();
    let dir = TempDir::new("readyz");
    let config = sim_cloud_config(dir.path(), "cloud", &sim.url(), None);

    // The controller's kubeconfig names a loopback port where nothing listens
    // yet; later a plain TCP forwarder to the real API server opens there
    // (the server certificate is for 127.0.0.1, so TLS still verifies).
    let (kubeconfig, proxy_port, upstream) = via_proxy(c.kubeconfig_path(), dir.path());

    let addr = format!("127.0.0.1:{}", free_port());
    let base = format!("http://{addr}");
    let ctl = Controller::start(
        &kubeconfig,
        dir.path(),
        "controller",
        &[
            "--cluster-cidr",
            "10.244.0.0/16",
            "--cloud-provider",
            "memory",
            "--cloud-config",
            config.to_str().unwrap(),
            "--leader-elect=false",
            "--metrics-bind-address",
            &addr,
        ],
    );
    wait_http(&base, "/healthz", 200, Duration::from_secs(60))
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));
    for _ in 0..5 {
        let (code, body) = http_get_async(&base, "/readyz").await.unwrap();
        assert_eq!(code, 503, "ready without a Node cache: {body}");
        assert!(body.contains("node cache not synced"), "{body}");
        let (code, _) = http_get_async(&base, "/healthz").await.unwrap();
        assert_eq!(code, 200, "alive while the API server is unreachable");
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    let listener = TcpListener::bind(("127.0.0.1", proxy_port)).await.unwrap();
    let proxy = tokio::spawn(forward(listener, upstream));
    // The watcher's backoff reaches 30 s at most.
    wait_http(&base, "/readyz", 200, Duration::from_secs(90))
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));
    let (code, _) = http_get_async(&base, "/healthz").await.unwrap();
    assert_eq!(code, 200);
    // Ready means the first full sync is done: the node's route exists.
    let admin = AdminClient::new(&sim.url()).unwrap();
    assert_eq!(destinations(&admin).await, vec![pod_cidr(1)]);
    let log = ctl.log_text();
    assert_eq!(ctl.stop(), Some(0), "{log}");
    proxy.abort();
}

/// A TCP proxy to the API server that can be switched off: off, it refuses
/// new connections and cuts the open ones, as an API server that went away.
struct Switch {
    on: std::sync::Arc<std::sync::atomic::AtomicBool>,
    conns: std::sync::Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>>,
    accept: tokio::task::JoinHandle<()>,
}

impl Switch {
    async fn start(port: u16, upstream: String) -> Switch {
        use std::sync::atomic::Ordering;
        let listener = TcpListener::bind(("127.0.0.1", port))
            .await
            .expect("bind the proxy port");
        let on = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let conns: std::sync::Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>> =
            Default::default();
        let (on2, conns2) = (on.clone(), conns.clone());
        let accept = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                if !on2.load(Ordering::SeqCst) {
                    continue; // dropped: connection closed
                }
                let upstream = upstream.clone();
                let task = tokio::spawn(async move {
                    if let Ok(mut out) = TcpStream::connect(&upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                    }
                });
                conns2.lock().expect("not poisoned").push(task);
            }
        });
        Switch { on, conns, accept }
    }

    fn set(&self, on: bool) {
        self.on.store(on, std::sync::atomic::Ordering::SeqCst);
        if !on {
            for t in self.conns.lock().expect("not poisoned").drain(..) {
                t.abort();
            }
        }
    }
}

impl Drop for Switch {
    fn drop(&mut self) {
        self.set(false);
        self.accept.abort();
    }
}

/// A certificate for 127.0.0.1 and its key, written as PEM files.
fn write_cert(
    cert: &std::path::Path,
    key: &std::path::Path,
) -> rustls::pki_types::CertificateDer<'static> {
    let made =
        rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string(), "localhost".to_string()])
            .expect("a certificate");
    // The key first: the controller reloads once both files changed and
    // match, and keeps serving the old pair meanwhile.
    std::fs::write(key, made.signing_key.serialize_pem()).expect("write the key");
    std::fs::write(cert, made.cert.pem()).expect("write the certificate");
    made.cert.der().clone()
}

/// The secure port as an operator's Prometheus meets it: no token 401, a
/// garbage token 401, a service account without the RBAC 403, with a
/// ClusterRole granting `get /metrics` 200 and the metrics; the health paths
/// open; the API server away: `/metrics` 503 once the cached answer is older
/// than 10 s, never 200; a certificate replaced on disk served on the next
/// connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secure_port_401_without_a_token_403_without_rbac_200_with_it_503_without_the_api_server_and_a_replaced_certificate_served()
 {
    let c = TestCluster::acquire().await.unwrap();
    let dir = TempDir::new("obs-secure");
    let kubectl_bin = c.kubectl_path().expect("kubectl");
    let kubectl = |args: &[&str]| -> String {
        let out = std::process::Command::new(&kubectl_bin)
            .arg("--kubeconfig")
            .arg(c.kubeconfig_path())
            .args(args)
            .output()
            .expect("run kubectl");
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    // Left by an earlier run on a reused cluster.
    kubectl(&[
        "delete",
        "serviceaccount",
        "scraper",
        "stranger",
        "-n",
        "default",
        "--ignore-not-found",
    ]);
    kubectl(&[
        "delete",
        "clusterrolebinding,clusterrole",
        "crc-metrics-reader-test",
        "--ignore-not-found",
    ]);
    kubectl(&["create", "serviceaccount", "scraper", "-n", "default"]);
    kubectl(&["create", "serviceaccount", "stranger", "-n", "default"]);
    let scraper = kubectl(&["create", "token", "scraper", "-n", "default"]);
    let stranger = kubectl(&["create", "token", "stranger", "-n", "default"]);

    // The controller reaches the API server through a proxy it can lose.
    let (kubeconfig, proxy_port, upstream) = via_proxy(c.kubeconfig_path(), dir.path());
    let proxy = Switch::start(proxy_port, upstream).await;

    let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    let first = write_cert(&cert, &key);
    let port = free_port();
    let port_arg = port.to_string();
    let ctl = Controller::start(
        &kubeconfig,
        dir.path(),
        "controller",
        &[
            "--cluster-cidr",
            "10.244.0.0/16",
            "--cloud-provider",
            "memory",
            "--leader-elect=false",
            "--secure-port",
            &port_arg,
            "--bind-address",
            "127.0.0.1",
            "--tls-cert-file",
            cert.to_str().unwrap(),
            "--tls-private-key-file",
            key.to_str().unwrap(),
        ],
    );
    wait_until(
        Duration::from_secs(60),
        "the secure port answers /healthz",
        || async {
            matches!(
                https_get(port, &first, "/healthz", None).await,
                Ok((200, _))
            )
            .then_some(())
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));

    let get = |path: &'static str, token: Option<String>| {
        let first = first.clone();
        async move {
            https_get(port, &first, path, token.as_deref())
                .await
                .unwrap_or_else(|e| panic!("GET {path}: {e}"))
        }
    };
    for path in ["/healthz", "/livez", "/readyz"] {
        let (code, body) = get(path, None).await;
        assert!(
            code == 200 || (path == "/readyz" && code == 503),
            "{path}: {code} {body}"
        );
        assert_ne!(code, 401, "{path} needs no token");
    }
    assert_eq!(get("/metrics", None).await.0, 401, "no token");
    assert_eq!(
        get("/metrics", Some("garbage".into())).await.0,
        401,
        "a garbage token"
    );
    let expired = "eyJhbGciOiJSUzI1NiJ9.eyJleHAiOjF9.c2lnbmF0dXJl";
    assert_eq!(
        get("/metrics", Some(expired.into())).await.0,
        401,
        "an expired token"
    );
    let (code, body) = get("/metrics", Some(stranger.clone())).await;
    assert_eq!(code, 403, "a service account without the RBAC: {body}");

    kubectl(&[
        "create",
        "clusterrole",
        "crc-metrics-reader-test",
        "--verb=get",
        "--non-resource-url=/metrics",
    ]);
    kubectl(&[
        "create",
        "clusterrolebinding",
        "crc-metrics-reader-test",
        "--clusterrole=crc-metrics-reader-test",
        "--serviceaccount=default:scraper",
    ]);
    let (code, body) = get("/metrics", Some(scraper.clone())).await;
    assert_eq!(code, 200, "{body}\n{}", ctl.log_text());
    assert!(body.contains("route_controller_"), "the metrics: {body}");
    assert_eq!(get("/metrics", Some(stranger.clone())).await.0, 403);

    // The API server away: the cached answer may serve for its 10 s, then 503.
    proxy.set(false);
    tokio::time::sleep(Duration::from_secs(11)).await;
    let (code, body) = get("/metrics", Some(scraper.clone())).await;
    assert_eq!(
        code, 503,
        "not 200 while the API server cannot be asked: {body}"
    );
    let (code, _) = get("/metrics", Some("another".into())).await;
    assert_eq!(code, 503, "a token never seen: 503, not 401 or 200");
    assert_eq!(get("/healthz", None).await.0, 200, "alive meanwhile");
    proxy.set(true);

    // A certificate replaced on disk is served on the next connection.
    let second = write_cert(&cert, &key);
    let served = https_get(port, &second, "/healthz", None).await;
    assert!(
        matches!(served, Ok((200, _))),
        "the new certificate: {served:?}\n{}",
        ctl.log_text()
    );
    assert!(
        https_get(port, &first, "/healthz", None).await.is_err(),
        "the old certificate is no longer served"
    );

    kubectl(&["delete", "clusterrolebinding", "crc-metrics-reader-test"]);
    kubectl(&["delete", "clusterrole", "crc-metrics-reader-test"]);
    let log = ctl.log_text();
    assert_eq!(ctl.stop(), Some(0), "{log}");
}
