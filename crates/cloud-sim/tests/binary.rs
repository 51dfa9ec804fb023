//! The `cloud-sim` binary as a process: startup line, config file, refusal of
//! remote binds, and exiting with its parent.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use cloud_sim::parent::pid_alive;
use cloud_sim::process::SimProcess;
use cloud_sim::{AdminClient, RemoteConfig, RemoteMemoryCloud};
use route_cloud::{CloudRoutes, ErrorKind};
use route_core::{Cidr, Route};
use tokio::io::{AsyncBufReadExt, BufReader};

const BIN: &str = env!("CARGO_BIN_EXE_cloud-sim");

fn wait_gone(pid: u32, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if !pid_alive(pid) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

#[tokio::test]
async fn serves_a_config_file_and_outlives_its_clients() {
    let dir = std::env::temp_dir().join(format!("cloud-sim-bin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("sim.toml");
    std::fs::write(&cfg, "max_routes = 1\nsupports_ipv6 = false\n").unwrap();
    let sim = SimProcess::spawn(Path::new(BIN), &["--config", cfg.to_str().unwrap()])
        .await
        .unwrap();
    assert!(sim.url().starts_with("http://127.0.0.1:"), "{}", sim.url());

    // One "controller process" creates, goes away; the next one sees its route.
    {
        let first = RemoteMemoryCloud::connect(&RemoteConfig::new(sim.url(), "ctl-0"))
            .await
            .unwrap();
        assert_eq!(first.capabilities().max_routes, Some(1));
        first
            .create_route(
                "c1",
                "u",
                &Route::new("n1", Cidr::parse("10.244.1.0/24").unwrap()),
            )
            .await
            .unwrap();
    }
    let second = RemoteMemoryCloud::connect(&RemoteConfig::new(sim.url(), "ctl-1"))
        .await
        .unwrap();
    let listed = second.list_routes("c1").await.unwrap();
    assert_eq!(listed.len(), 1);
    let e = second
        .create_route(
            "c1",
            "u",
            &Route::new("n2", Cidr::parse("10.244.2.0/24").unwrap()),
        )
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::QuotaExceeded, "the file's quota applies");

    let admin = AdminClient::new(sim.url()).unwrap();
    let callers: Vec<String> = admin
        .log(0)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.caller)
        .collect();
    assert_eq!(callers, ["ctl-0", "ctl-1", "ctl-1"]);

    let pid = sim.id().unwrap();
    sim.kill().await.unwrap();
    assert!(!pid_alive(pid));
    let e = second.list_routes("c1").await.unwrap_err();
    assert_eq!(
        e.kind,
        ErrorKind::Transient,
        "a dead cloud is unreachable: {e}"
    );
}

#[tokio::test]
async fn bad_configs_and_remote_binds_exit_with_an_error() {
    let out = tokio::process::Command::new(BIN)
        .args(["serve", "--listen", "0.0.0.0:0"])
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--allow-remote"), "{err}");
    assert!(out.stdout.is_empty(), "no LISTENING line");

    let out = tokio::process::Command::new(BIN)
        .args(["serve", "--config", "/nonexistent/sim.yaml"])
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/sim.yaml"));
}

#[tokio::test]
async fn exits_when_the_watched_pid_exits() {
    let mut sleeper = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    let watched = sleeper.id().to_string();
    let mut child = tokio::process::Command::new(BIN)
        .args(["serve", "--parent-pid", &watched])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next_line().await.unwrap().unwrap();
    assert!(first.starts_with("LISTENING http://127.0.0.1:"), "{first}");
    // Still serving while the watched process lives.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(child.try_wait().unwrap().is_none());
    sleeper.kill().unwrap();
    sleeper.wait().unwrap();
    let status = tokio::time::timeout(Duration::from_secs(5), child.wait())
        .await
        .expect("cloud-sim outlived its watched process")
        .unwrap();
    assert!(status.success(), "{status}");
}

#[tokio::test]
async fn exits_when_its_parent_dies() {
    // A shell starts cloud-sim in the background and is then killed; the
    // orphan must notice it was re-parented and exit.
    let mut shell = tokio::process::Command::new("sh")
        .args([
            "-c",
            r#""$0" serve --exit-with-parent & echo "PID $!"; wait"#,
            BIN,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(shell.stdout.take().unwrap()).lines();
    let (mut pid, mut url) = (None, None);
    while pid.is_none() || url.is_none() {
        let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .unwrap()
            .unwrap()
            .expect("output ended early");
        if let Some(p) = line.strip_prefix("PID ") {
            pid = Some(p.trim().parse::<u32>().unwrap());
        } else if let Some(u) = line.strip_prefix("LISTENING ") {
            url = Some(u.to_string());
        }
    }
    let (pid, url) = (pid.unwrap(), url.unwrap());
    let admin = AdminClient::new(&url).unwrap();
    admin.state().await.unwrap();
    assert!(pid_alive(pid));
    shell.kill().await.unwrap();
    assert!(
        tokio::task::spawn_blocking(move || wait_gone(pid, Duration::from_secs(5)))
            .await
            .unwrap(),
        "cloud-sim {pid} outlived its parent"
    );
}
