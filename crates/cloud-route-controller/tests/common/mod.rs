//! Running the real `cloud-route-controller` binary as a child process.
#![allow(dead_code, reason = "each test binary uses a different subset")]

pub mod conditions;
pub mod switch;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The repository's root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A Go tool (`helm`, `promtool`) from the per-machine tools cache, built by
/// `scripts/build-gotool.sh` on first use.
pub fn gotool(name: &str) -> PathBuf {
    let out = Command::new(repo().join("scripts/build-gotool.sh"))
        .arg(name)
        .output()
        .unwrap_or_else(|e| panic!("run scripts/build-gotool.sh {name}: {e}"));
    assert!(
        out.status.success(),
        "scripts/build-gotool.sh {name} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .expect("the script prints the binary's path")
        .to_string();
    PathBuf::from(path)
}

/// The binary under test, built by cargo for this test target.
pub fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_cloud-route-controller"))
}

/// A controller process; killed (SIGKILL) when dropped unless stopped first.
pub struct Controller {
    pub child: Child,
    pub log: PathBuf,
    pub metrics: Option<String>,
}

impl Controller {
    /// Starts the binary with `args` after the standard test flags.
    pub fn start(kubeconfig: &Path, log_dir: &Path, name: &str, args: &[&str]) -> Controller {
        Self::start_with_env(kubeconfig, log_dir, name, args, &[])
    }

    /// Starts the binary with extra environment variables.
    pub fn start_with_env(
        kubeconfig: &Path,
        log_dir: &Path,
        name: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Controller {
        Self::spawn(kubeconfig, log_dir, name, args, env, false)
    }

    /// Starts the binary with `env` as its whole environment (and RUST_LOG
    /// for the log), as a pod has none of its node's variables: nothing of
    /// this process's (credentials, KUBECONFIG, HOME) reaches it.
    pub fn start_with_only_env(
        kubeconfig: &Path,
        log_dir: &Path,
        name: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Controller {
        Self::spawn(kubeconfig, log_dir, name, args, env, true)
    }

    fn spawn(
        kubeconfig: &Path,
        log_dir: &Path,
        name: &str,
        args: &[&str],
        env: &[(&str, &str)],
        clear_env: bool,
    ) -> Controller {
        let log = log_dir.join(format!("{name}.log"));
        let out = std::fs::File::create(&log).expect("log file");
        // Off unless the test serves it: parallel tests would all want the default port (10288).
        let secure_off: &[&str] = if args.iter().any(|a| a.starts_with("--secure-port")) {
            &[]
        } else {
            &["--secure-port", "0"]
        };
        let mut cmd = Command::new(binary());
        if clear_env {
            cmd.env_clear();
        }
        let child = cmd
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(args)
            .args(secure_off)
            .envs(env.iter().copied())
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(out)
            .spawn()
            .expect("start cloud-route-controller");
        let metrics = args
            .windows(2)
            .find(|w| w[0] == "--metrics-bind-address")
            .map(|w| format!("http://{}", w[1]));
        Controller {
            child,
            log,
            metrics,
        }
    }

    /// SIGTERM and wait; returns the exit status code.
    pub fn stop(mut self) -> Option<i32> {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        for _ in 0..200 {
            if let Ok(Some(s)) = self.child.try_wait() {
                return s.code();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        self.child.wait().ok().and_then(|s| s.code())
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The last `n` lines of the log, for a failure message whose reader
    /// may see only its beginning (CI shows an excerpt): the lines that
    /// explain a timeout are the last ones.
    pub fn log_tail(&self, n: usize) -> String {
        let text = self.log_text();
        let lines: Vec<&str> = text.lines().collect();
        let skipped = lines.len().saturating_sub(n);
        format!(
            "[{skipped} earlier log lines left out]\n{}",
            lines[skipped..].join("\n")
        )
    }

    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs a command; its stdout, or a panic with both streams.
pub fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{cmd:?} failed\nstdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The documents of a multi-document YAML text (`helm template`'s output),
/// empty ones left out.
pub fn yaml_docs(text: &str) -> Vec<serde_json::Value> {
    let mut docs = Vec::new();
    for doc in serde_yaml_ng::Deserializer::from_str(text) {
        let v: serde_json::Value = serde::Deserialize::deserialize(doc).expect("rendered YAML");
        if !v.is_null() {
            docs.push(v);
        }
    }
    docs
}

/// A rendered object's `kind`.
pub fn kind(v: &serde_json::Value) -> &str {
    v["kind"].as_str().unwrap_or("")
}

/// The first rendered object of kind `k`.
pub fn find<'a>(docs: &'a [serde_json::Value], k: &str) -> &'a serde_json::Value {
    docs.iter()
        .find(|d| kind(d) == k)
        .unwrap_or_else(|| panic!("no {k} rendered"))
}

/// The rendered Deployment's pod spec.
pub fn pod_spec(docs: &[serde_json::Value]) -> &serde_json::Value {
    &find(docs, "Deployment")["spec"]["template"]["spec"]
}

/// The rendered Deployment's (one) container.
pub fn container(docs: &[serde_json::Value]) -> &serde_json::Value {
    &pod_spec(docs)["containers"][0]
}

/// The rendered container's args.
pub fn args_of(docs: &[serde_json::Value]) -> Vec<String> {
    container(docs)["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| a.as_str().expect("string arg").to_string())
        .collect()
}

/// A free loopback port (bind-and-release; the small race is acceptable in tests).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// A temporary directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!(
            "crc-{tag}-{}-{}",
            std::process::id(),
            rand_suffix()
        ));
        std::fs::create_dir_all(&p).expect("temp dir");
        TempDir(p)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn rand_suffix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// GETs a path on the controller's HTTP endpoint with curl-free plain HTTP/1.0.
pub fn http_get(base: &str, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let addr = base.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).ok()?;
    let code = buf.split_whitespace().nth(1)?.parse().ok()?;
    let body = buf
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Some((code, body))
}

/// The value of one Prometheus sample whose name and labels all match
/// (`labels` as `key="value"` fragments), summed over the rest.
pub fn metric_sum(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.starts_with(name)
                && l[name.len()..].starts_with(['{', ' '])
                && labels.iter().all(|f| l.contains(f))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Writes a `--cloud-config` for `--cloud-provider memory` that points at a
/// cloud-sim server; `caller` overrides the caller tag (default: the
/// controller's leader-election identity).
pub fn sim_cloud_config(dir: &Path, name: &str, endpoint: &str, caller: Option<&str>) -> PathBuf {
    let path = dir.join(format!("{name}.yaml"));
    let mut text = format!("endpoint: {endpoint}\n");
    if let Some(c) = caller {
        text.push_str(&format!("caller: {c}\n"));
    }
    std::fs::write(&path, text).expect("write cloud config");
    path
}

/// Whether a sample `name{...}` with all `labels` (`key="value"` fragments) exists.
pub fn metric_present(text: &str, name: &str, labels: &[&str]) -> bool {
    text.lines().filter(|l| !l.starts_with('#')).any(|l| {
        l.starts_with(name)
            && l[name.len()..].starts_with(['{', ' '])
            && labels.iter().all(|f| l.contains(f))
    })
}

/// Polls `GET base+path` (every 200 ms) until it answers `code`; `Err` with
/// the last answer after `timeout`.
pub async fn wait_http(base: &str, path: &str, code: u16, timeout: Duration) -> Result<(), String> {
    let deadline = std::time::Instant::now() + timeout;
    let mut last = None;
    loop {
        let b = base.to_string();
        let p = path.to_string();
        let got = tokio::task::spawn_blocking(move || http_get(&b, &p))
            .await
            .ok()
            .flatten();
        if got.as_ref().is_some_and(|(c, _)| *c == code) {
            return Ok(());
        }
        last = got.or(last);
        if std::time::Instant::now() >= deadline {
            return Err(format!(
                "{base}{path} did not answer {code} within {timeout:?}; last answer {last:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `GET base+path` off the async runtime.
pub async fn http_get_async(base: &str, path: &str) -> Option<(u16, String)> {
    let b = base.to_string();
    let p = path.to_string();
    tokio::task::spawn_blocking(move || http_get(&b, &p))
        .await
        .ok()
        .flatten()
}

/// Runs `cloud-route-controller cleanup <args> --yes` with `env` added, as
/// an operator tearing a cluster down would, and checks that it succeeded
/// within 120 s and deleted exactly `owned` routes. Returns its stdout.
pub async fn cleanup_deletes(args: &[&str], env: &[(&str, &str)], owned: usize) -> String {
    let out = tokio::process::Command::new(binary())
        .arg("cleanup")
        .args(args)
        .arg("--yes")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output();
    let out = tokio::time::timeout(Duration::from_secs(120), out)
        .await
        .expect("cleanup finished within 120 s")
        .expect("run cleanup");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains(&format!("Deleted {owned} of {owned} routes.")),
        "{stdout}"
    );
    stdout
}

/// Sends `sig` (`-STOP`, `-CONT`, ...) to the controller's process.
pub fn signal(ctl: &Controller, sig: &str) {
    let pid = ctl.child.id().to_string();
    let ok = Command::new("kill")
        .args([sig, &pid])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "kill {sig} {pid}");
}

/// The `10.244.*` routes of one EC2 route table as (destination, target),
/// sorted; `None` while the table cannot be read.
pub async fn pod_routes(
    ec2: &provider_aws::testing::Client,
    table: &str,
) -> Option<Vec<(String, String)>> {
    let mut v: Vec<(String, String)> = provider_aws::testing::table_routes(ec2, table)
        .await
        .ok()?
        .into_iter()
        .filter(|(d, _, _)| d.starts_with("10.244."))
        .map(|(d, t, _)| (d, t))
        .collect();
    v.sort();
    Some(v)
}

/// Starts the binary with `--cloud-provider aws` for `cluster` against
/// `endpoint`, with `extra_yaml` appended to its cloud config and `extra`
/// flags; metrics on a free port, whose base URL is returned. The cluster
/// CIDR is `10.244.0.0/16` unless `extra` names `--cluster-cidr`.
pub fn start_aws(
    kubeconfig: &Path,
    dir: &TempDir,
    cluster: &str,
    endpoint: &str,
    extra_yaml: &str,
    extra: &[&str],
) -> (Controller, String) {
    let cfg = dir.path().join("aws.yaml");
    std::fs::write(
        &cfg,
        format!("region: us-east-1\nendpoint: {endpoint}\n{extra_yaml}"),
    )
    .expect("write the test fixture file");
    let metrics = format!("127.0.0.1:{}", free_port());
    let mut args = if extra.iter().any(|a| a.starts_with("--cluster-cidr")) {
        vec![]
    } else {
        vec!["--cluster-cidr", "10.244.0.0/16"]
    };
    args.extend_from_slice(&[
        "--cluster-name",
        cluster,
        "--cloud-provider",
        "aws",
        "--cloud-config",
        cfg.to_str().expect("temporary paths are UTF-8"),
        "--leader-elect=false",
        "--metrics-bind-address",
        &metrics,
    ]);
    args.extend_from_slice(extra);
    let ctl = Controller::start_with_env(
        kubeconfig,
        dir.path(),
        "controller",
        &args,
        &[
            ("AWS_ACCESS_KEY_ID", "testing"),
            ("AWS_SECRET_ACCESS_KEY", "testing"),
            ("AWS_REGION", "us-east-1"),
        ],
    );
    (ctl, format!("http://{metrics}"))
}

/// Creates one Node per instance, named `<prefix>-<i>` with pod CIDR
/// `10.244.<first_octet + i>.0/24` and InternalIP `<ip_prefix>.<10 + i>`.
pub async fn create_aws_nodes(
    c: &test_cluster::ClusterGuard,
    prefix: &str,
    first_octet: usize,
    ip_prefix: &str,
    instances: &[provider_aws::testing::Instance],
) {
    for (i, inst) in instances.iter().enumerate() {
        c.create_node(
            &test_cluster::TestNode::new(format!("{prefix}-{i}"))
                .pod_cidrs([format!("10.244.{}.0/24", first_octet + i)])
                .internal_ip(format!("{ip_prefix}.{}", 10 + i))
                .provider_id(&inst.provider_id),
        )
        .await
        .expect("create the test Node");
    }
}

/// One HTTPS GET of `path` on 127.0.0.1:`port`, trusting only `ca`: the
/// status code and body, or why the request failed.
pub async fn https_get(
    port: u16,
    ca: &rustls::pki_types::CertificateDer<'static>,
    path: &str,
    token: Option<&str>,
) -> Result<(u16, String), String> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.clone()).map_err(|e| e.to_string())?;
    let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| e.to_string())?;
    let name =
        rustls::pki_types::ServerName::try_from("127.0.0.1").expect("an IP is a server name");
    let mut tls = connector
        .connect(name, tcp)
        .await
        .map_err(|e| e.to_string())?;
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    let req = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}Connection: close\r\n\r\n");
    tls.write_all(req.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut buf = Vec::new();
    let _ = tls.read_to_end(&mut buf).await;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("no status line: {text:?}"))?;
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    Ok((code, body))
}

/// How many of the cluster's Nodes read `NetworkUnavailable` with reason
/// `RouteCreated` (0 when the list fails).
pub async fn route_created_count(nodes: &kube::Api<k8s_openapi::api::core::v1::Node>) -> usize {
    let Ok(list) = nodes.list(&kube::api::ListParams::default()).await else {
        return 0;
    };
    list.items
        .iter()
        .filter(|n| {
            test_cluster::condition(n, test_cluster::NETWORK_UNAVAILABLE)
                .is_some_and(|c| c.reason.as_deref() == Some("RouteCreated"))
        })
        .count()
}

/// The chart's required values without a default (the cluster's own pod CIDR
/// and name), as `helm template` flags: deploy/'s manifests' values.
pub const CHART_CLUSTER: &[&str] = &[
    "--set",
    "clusterCIDRs={10.244.0.0/16}",
    "--set",
    "clusterName=kubernetes",
];

/// Every monitoring toggle of the chart on, as `helm template` flags, for a
/// cluster that serves the Prometheus Operator's API: the monitors and the
/// rule in Prometheus's namespace `monitoring`, the PodMonitor with a token
/// Secret the chart makes for `monitoring/prometheus`, the ServiceMonitor,
/// the PrometheusRule and the metrics reader bound to `monitoring/prometheus`.
pub const CHART_MONITORING_ON: &[&str] = &[
    "--api-versions",
    "monitoring.coreos.com/v1",
    "--set",
    "monitoring.namespace=monitoring",
    "--set",
    "monitoring.podMonitor.enabled=true",
    "--set",
    "monitoring.podMonitor.tokenServiceAccount=prometheus",
    "--set",
    "monitoring.serviceMonitor.enabled=true",
    "--set",
    "monitoring.prometheusRule.enabled=true",
    "--set",
    "monitoring.metricsReader.enabled=true",
    "--set",
    "monitoring.metricsReader.subjects[0].name=prometheus",
    "--set",
    "monitoring.metricsReader.subjects[0].namespace=monitoring",
];

/// The renewTime of the Lease `name` in `leases`, as text.
pub async fn lease_renew_time(
    leases: &kube::Api<k8s_openapi::api::coordination::v1::Lease>,
    name: &str,
) -> Option<String> {
    let spec = leases.get_opt(name).await.ok()??.spec?;
    Some(format!("{:?}", spec.renew_time?))
}

/// Samples the renewTime of the Lease `name` every 100 ms until `done`, and
/// returns the gaps between consecutive renewals that none of `pauses`
/// (from, to) explains.
pub async fn lease_renewal_gaps(
    leases: &kube::Api<k8s_openapi::api::coordination::v1::Lease>,
    name: &str,
    pauses: &std::sync::Mutex<Vec<(std::time::Instant, std::time::Instant)>>,
    done: &std::sync::atomic::AtomicBool,
) -> Vec<Duration> {
    let mut gaps = Vec::new();
    let mut last: Option<(String, std::time::Instant)> = None;
    while !done.load(std::sync::atomic::Ordering::SeqCst) {
        if let Some(now) = lease_renew_time(leases, name).await {
            let seen = std::time::Instant::now();
            match &last {
                Some((t, at)) if *t != now => {
                    let paused = pauses
                        .lock()
                        .expect("not poisoned")
                        .iter()
                        .any(|(from, to)| *from < seen && *to + Duration::from_secs(1) > *at);
                    if !paused {
                        gaps.push(seen - *at);
                    }
                    last = Some((now, seen));
                }
                None => last = Some((now, seen)),
                _ => {}
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    gaps
}

/// (how many, p99, max) of `gaps`.
pub fn gap_stats(mut gaps: Vec<Duration>) -> (usize, Duration, Duration) {
    gaps.sort();
    let n = gaps.len();
    let p99 = gaps
        .get((n * 99 / 100).min(n.saturating_sub(1)))
        .copied()
        .unwrap_or_default();
    (n, p99, gaps.last().copied().unwrap_or_default())
}

/// Runs `cmd`, whose args include `--configure-cloud-routes=false`: waits for
/// the line saying no route is configured (the process is idle from then on,
/// its signal handlers in place), checks that it is still up, sends SIGTERM
/// and returns its output. Panics if it ended by itself with success (an
/// idle process must not exit: under a Deployment it would restart forever).
pub fn run_until_idle(cmd: &mut Command) -> std::process::Output {
    use std::io::BufRead;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start cloud-route-controller");
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            let _ = tx.send(line);
        }
    });
    let mut text = String::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut idle = false;
    while let Ok(line) =
        rx.recv_timeout(deadline.saturating_duration_since(std::time::Instant::now()))
    {
        text.push_str(&line);
        text.push('\n');
        if line.contains("will not configure cloud provider routes") {
            idle = true;
            break;
        }
    }
    if idle {
        std::thread::sleep(Duration::from_millis(200));
        let early = child.try_wait().expect("try_wait");
        assert!(early.is_none(), "exited by itself ({early:?}): {text}");
        let pid = child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
    } else {
        let _ = child.kill();
    }
    let status = child.wait().expect("wait");
    let _ = reader.join();
    text.extend(rx.try_iter().map(|l| l + "\n"));
    std::process::Output {
        status,
        stdout: Vec::new(),
        stderr: text.into_bytes(),
    }
}
