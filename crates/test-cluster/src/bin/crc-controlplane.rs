//! `crc-controlplane up|down|status|restart-apiserver`: a long-lived local
//! etcd + kube-apiserver for the demo, benchmarks and manual work (`make
//! controlplane`). `restart-apiserver` restarts kube-apiserver alone (same
//! port and data), to rehearse what an apiserver rollout does to the controller.
//!
//! `up` starts it detached and prints shell `export` lines on stdout (so
//! `eval "$(scripts/controlplane.sh up)"` works); progress goes to stderr.
//! State lives in `$CRC_STATE_DIR`, else `$XDG_RUNTIME_DIR/cloud-route-controller`,
//! else `~/.cache/cloud-route-controller/run`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use test_cluster::{ControlPlane, StartOptions, client_from_kubeconfig};

const SUPERVISOR_MARKER: &str = "crc-controlplane-supervisor";

#[derive(Debug, Serialize, Deserialize)]
struct State {
    supervisor_pid: u32,
    dir: PathBuf,
    kubeconfig: PathBuf,
    server: String,
    etcd_url: String,
    bin_dir: PathBuf,
}

fn state_root() -> PathBuf {
    if let Some(dir) = std::env::var_os("CRC_STATE_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    if let Some(dir) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir).join("cloud-route-controller");
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/tmp"), PathBuf::from);
    home.join(".cache/cloud-route-controller/run")
}

fn data_dir() -> PathBuf {
    state_root().join("controlplane")
}

fn state_file(dir: &Path) -> PathBuf {
    dir.join("state.json")
}

fn read_state() -> Option<State> {
    let text = std::fs::read_to_string(state_file(&data_dir())).ok()?;
    serde_json::from_str(&text).ok()
}

/// True if `pid` is a live (not zombie) supervisor of ours; guards against
/// signalling an unrelated process that reused the pid.
fn supervisor_alive(pid: u32) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    if !String::from_utf8_lossy(&cmdline).contains(SUPERVISOR_MARKER) {
        return false;
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The state letter follows the parenthesised command name.
    let state = stat
        .rsplit_once(") ")
        .and_then(|(_, rest)| rest.chars().next());
    !matches!(state, None | Some('Z') | Some('X'))
}

fn print_env(state: &State) {
    let kubeconfig = state.kubeconfig.display();
    println!("export KUBECONFIG={kubeconfig}");
    println!("export CRC_TEST_KUBECONFIG={kubeconfig}");
    println!("export CRC_TEST_ETCD_URL={}", state.etcd_url);
    println!(
        "export CRC_CONTROLPLANE_BIN_DIR={}",
        state.bin_dir.display()
    );
    println!(
        "# kubectl matching the server: {}/kubectl get nodes",
        state.bin_dir.display()
    );
    println!("# or: export PATH=\"{}:$PATH\"", state.bin_dir.display());
}

async fn healthy(state: &State) -> bool {
    if !supervisor_alive(state.supervisor_pid) {
        return false;
    }
    let Ok(client) = client_from_kubeconfig(&state.kubeconfig).await else {
        return false;
    };
    let Ok(request) = http::Request::get("/readyz").body(Vec::new()) else {
        return false;
    };
    client.request_text(request).await.is_ok()
}

async fn up() -> Result<(), String> {
    if let Some(state) = read_state() {
        if healthy(&state).await {
            eprintln!("control plane already running ({})", state.server);
            print_env(&state);
            return Ok(());
        }
        eprintln!("removing a stale control plane at {}", state.dir.display());
        down()?;
    }
    let began = Instant::now();
    let options = StartOptions {
        dir: Some(data_dir()),
        detach: true,
        ..Default::default()
    };
    let plane = ControlPlane::start(options)
        .await
        .map_err(|e| e.to_string())?;
    let state = State {
        supervisor_pid: plane
            .supervisor_pid()
            .ok_or("control plane has no supervisor")?,
        dir: plane.dir().to_owned(),
        kubeconfig: plane.kubeconfig().to_owned(),
        server: plane.server().to_owned(),
        etcd_url: plane.etcd_url().to_owned(),
        bin_dir: plane.binaries().dir.clone(),
    };
    let text = serde_json::to_string_pretty(&state).map_err(|e| e.to_string())?;
    std::fs::write(state_file(&state.dir), text).map_err(|e| format!("write state: {e}"))?;
    let startup = plane.startup_time();
    plane.detach();
    eprintln!(
        "control plane up at {} (kube-apiserver + etcd ready in {:.1}s, {:.1}s in total); stop it with `make controlplane-down`",
        state.server,
        startup.as_secs_f64(),
        began.elapsed().as_secs_f64()
    );
    print_env(&state);
    Ok(())
}

fn down() -> Result<(), String> {
    let dir = data_dir();
    match read_state() {
        Some(state) if supervisor_alive(state.supervisor_pid) => {
            let pid = state.supervisor_pid;
            let status = std::process::Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status()
                .map_err(|e| format!("run kill: {e}"))?;
            if !status.success() && supervisor_alive(pid) {
                return Err(format!("could not signal supervisor {pid}"));
            }
            let deadline = Instant::now() + Duration::from_secs(30);
            while supervisor_alive(pid) {
                if Instant::now() > deadline {
                    return Err(format!("supervisor {pid} did not stop within 30s"));
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            eprintln!("control plane stopped");
        }
        _ => eprintln!("no control plane running"),
    }
    // The supervisor removes its data; this covers one that died on its own.
    if dir.exists() {
        std::fs::remove_dir_all(&dir).map_err(|e| format!("remove {}: {e}", dir.display()))?;
    }
    Ok(())
}

async fn restart_apiserver() -> Result<(), String> {
    let state = read_state().ok_or("no control plane running")?;
    if !supervisor_alive(state.supervisor_pid) {
        return Err("control plane state found but it is not running; run `down`".into());
    }
    let began = Instant::now();
    test_cluster::restart_apiserver_of(state.supervisor_pid, &state.dir)
        .await
        .map_err(|e| e.to_string())?;
    let deadline = Instant::now() + Duration::from_secs(120);
    while !healthy(&state).await {
        if Instant::now() > deadline {
            return Err("kube-apiserver not ready within 120s after the restart".into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!(
        "kube-apiserver restarted and ready in {:.1}s",
        began.elapsed().as_secs_f64()
    );
    Ok(())
}

async fn status() -> Result<(), String> {
    match read_state() {
        Some(state) if healthy(&state).await => {
            eprintln!("control plane running at {}", state.server);
            print_env(&state);
            Ok(())
        }
        Some(_) => Err("control plane state found but it is not healthy; run `down`".into()),
        None => Err("no control plane running".into()),
    }
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,kube_client=off")),
        )
        .with_ansi(false)
        .init();
    let command = std::env::args().nth(1).unwrap_or_default();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("crc-controlplane: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = match command.as_str() {
        "up" => runtime.block_on(up()),
        "down" => down(),
        "status" => runtime.block_on(status()),
        "restart-apiserver" => runtime.block_on(restart_apiserver()),
        _ => {
            eprintln!("usage: crc-controlplane up|down|status|restart-apiserver");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("crc-controlplane {command}: {e}");
            ExitCode::FAILURE
        }
    }
}
