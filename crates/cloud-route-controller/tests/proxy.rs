//! Behind an HTTP proxy (docs/deploying.md, "Behind an HTTP proxy"): the
//! cloud clients send their requests through `HTTPS_PROXY` and go direct to
//! the hosts `NO_PROXY` names; the Kubernetes client, given a kubeconfig,
//! takes the same variables as kubectl does (it used to refuse to start on
//! any proxy variable).

mod common;

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{TempDir, binary};
use provider_hcloud::testing::{FakeConfig, FakeHcloud};
use test_cluster::TestCluster;
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};

/// A forward proxy that records each request's first line and refuses it
/// (502), so nothing goes further than the record.
struct RecordingProxy {
    url: String,
    lines: Arc<Mutex<Vec<String>>>,
}

impl RecordingProxy {
    async fn start() -> RecordingProxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let url = format!("http://{}", listener.local_addr().expect("its address"));
        let lines = Arc::new(Mutex::new(Vec::new()));
        let seen = lines.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let seen = seen.clone();
                tokio::spawn(async move {
                    let mut stream = BufReader::new(stream);
                    let mut line = String::new();
                    if stream.read_line(&mut line).await.is_ok() {
                        seen.lock().expect("lock").push(line.trim().to_string());
                    }
                    let _ = stream
                        .get_mut()
                        .write_all(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
                        .await;
                });
            }
        });
        RecordingProxy { url, lines }
    }

    fn lines(&self) -> Vec<String> {
        self.lines.lock().expect("lock").clone()
    }
}

/// Runs the binary with `args` and exactly `env` (plus an empty HOME);
/// whether it succeeded, and its output.
async fn run(args: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    let home = TempDir::new("proxy-home");
    let out = tokio::process::Command::new(binary())
        .args(args)
        .env_clear()
        .env("HOME", home.path())
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output();
    let out = tokio::time::timeout(Duration::from_secs(60), out)
        .await
        .expect("finished within 60 s")
        .expect("run the binary");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cloud_request_goes_through_https_proxy_unless_no_proxy_names_its_host() {
    let proxy = RecordingProxy::start().await;
    let cleanup = [
        "cleanup",
        "--cluster-cidr",
        "10.244.0.0/16",
        "--cloud-provider",
        "hcloud",
    ];
    let hcloud = [("HCLOUD_TOKEN", "not-a-token"), ("HCLOUD_NETWORK", "1")];
    for proxy_var in ["HTTPS_PROXY", "https_proxy"] {
        let before = proxy.lines().len();
        let env = [&hcloud[..], &[(proxy_var, proxy.url.as_str())]].concat();
        let (ok, out) = run(&cleanup, &env).await;
        assert!(!ok, "the proxy refuses every request: {out}");
        let lines = proxy.lines();
        assert!(
            lines[before..]
                .iter()
                .any(|l| l.starts_with("CONNECT api.hetzner.cloud:443 ")),
            "{proxy_var}: no request through the proxy: {lines:?}\n{out}"
        );
    }
    // NO_PROXY names the host: the request goes direct (and fails or is
    // refused there, since the token is no token), not through the proxy.
    for no_proxy in [
        ("NO_PROXY", "hetzner.cloud"),
        ("no_proxy", ".hetzner.cloud"),
    ] {
        let before = proxy.lines().len();
        let env = [
            &hcloud[..],
            &[("HTTPS_PROXY", proxy.url.as_str()), no_proxy],
        ]
        .concat();
        let (ok, out) = run(&cleanup, &env).await;
        assert!(!ok, "{out}");
        assert_eq!(
            proxy.lines()[before..],
            [] as [String; 0],
            "{no_proxy:?}: the request went through the proxy\n{out}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubernetes_client_takes_https_proxy_and_no_proxy_as_kubectl_does() {
    let proxy = RecordingProxy::start().await;
    let fake = FakeHcloud::start(FakeConfig::default())
        .await
        .expect("the fake starts");
    fake.add_network(4711, "k8s-proxy", "10.0.0.0/8", &["10.0.0.0/16"]);
    let c = TestCluster::acquire()
        .await
        .expect("the local control plane");
    let kubeconfig = c.kubeconfig_path().to_str().expect("utf-8 path");
    let plan = [
        "plan",
        "--kubeconfig",
        kubeconfig,
        "--cluster-cidr",
        "10.244.0.0/16",
        "--cloud-provider",
        "hcloud",
    ];
    let token = fake.token();
    let endpoint = fake.base_url();
    // The fake is plain HTTP, which HTTPS_PROXY does not cover.
    let hcloud = [
        ("HCLOUD_TOKEN", token.as_str()),
        ("HCLOUD_NETWORK", "k8s-proxy"),
        ("HCLOUD_ENDPOINT", endpoint.as_str()),
    ];
    let server = kubeconfig_server(c.kubeconfig_path());
    // Without NO_PROXY the API server is asked through the proxy.
    let env = [&hcloud[..], &[("HTTPS_PROXY", proxy.url.as_str())]].concat();
    let (ok, out) = run(&plan, &env).await;
    assert!(!ok, "the proxy refuses every request: {out}");
    assert!(
        !out.contains("requires the disabled feature"),
        "the client refused the proxy: {out}"
    );
    let lines = proxy.lines();
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with(&format!("CONNECT {server} "))),
        "no CONNECT {server}: {lines:?}\n{out}"
    );
    // NO_PROXY names it: direct, and the plan is made.
    let before = proxy.lines().len();
    let env = [
        &hcloud[..],
        &[
            ("HTTPS_PROXY", proxy.url.as_str()),
            ("NO_PROXY", "127.0.0.1,localhost"),
        ],
    ]
    .concat();
    let (ok, out) = run(&plan, &env).await;
    assert!(ok, "{out}");
    assert!(out.contains("cloud routes"), "{out}");
    assert_eq!(proxy.lines()[before..], [] as [String; 0], "{out}");
}

/// `host:port` of the kubeconfig's server.
fn kubeconfig_server(path: &std::path::Path) -> String {
    let text = std::fs::read_to_string(path).expect("read the kubeconfig");
    let server = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("server:"))
        .expect("a server in the kubeconfig")
        .trim()
        .trim_matches('"');
    server
        .strip_prefix("https://")
        .unwrap_or(server)
        .trim_end_matches('/')
        .to_string()
}
