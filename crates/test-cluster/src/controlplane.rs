//! Starting and stopping one etcd + kube-apiserver pair on loopback.
//!
//! Both processes run under a small `sh` supervisor. It owns their lifetime:
//! it stops them when asked (SIGTERM), when the process that started them
//! disappears (a test binary that panicked or was killed never runs
//! destructors of statics), or when one of them dies; and it removes the data
//! directory at the end. The Rust side only talks to the supervisor.

use std::io::Read;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use base64::Engine as _;
use tracing::{debug, info, warn};

use crate::{Error, pki};

/// Environment variable naming a directory that already holds `etcd`,
/// `kube-apiserver` and `kubectl`; when unset they are built (or reused from
/// the per-machine cache) by `scripts/build-controlplane.sh`.
pub const BIN_DIR_ENV: &str = "CRC_CONTROLPLANE_BIN_DIR";

const READY_TIMEOUT: Duration = Duration::from_secs(120);
const STOP_TIMEOUT: Duration = Duration::from_secs(20);

/// The supervisor. Arguments: parent pid to watch (0 = none), data dir,
/// keep-data flag, and the two commands as pre-quoted shell words.
///
/// `exec` inside each background job makes `$!` the real process, so signals
/// reach etcd / kube-apiserver and not an intermediate shell. Liveness is read
/// from /proc because an exited child stays a zombie (and `kill -0` still
/// succeeds) until the shell reaps it.
const SUPERVISOR: &str = r#"
parent=$1 dir=$2 keep=$3 etcd_cmd=$4 api_cmd=$5
alive() {
  st=
  { read -r _ _ st _ < "/proc/$1/stat"; } 2>/dev/null
  [ -n "$st" ] && [ "$st" != Z ]
}
eval "exec $etcd_cmd" > "$dir/etcd.log" 2>&1 < /dev/null &
etcd=$!
eval "exec $api_cmd" > "$dir/kube-apiserver.log" 2>&1 < /dev/null &
api=$!
echo "$etcd $api" > "$dir/pids"
stop_one() {
  kill -TERM "$1" 2>/dev/null
  i=0
  while alive "$1" && [ "$i" -lt "$2" ]; do sleep 0.1; i=$((i + 1)); done
  kill -KILL "$1" 2>/dev/null
}
# The apiserver first: its graceful shutdown stalls while etcd is gone.
stop_children() {
  stop_one "$api" 100
  stop_one "$etcd" 50
  wait
}
finish() {
  trap '' TERM INT HUP
  stop_children
  [ "$keep" = 1 ] || rm -rf "$dir"
  exit 0
}
# SIGUSR1 restarts the apiserver alone, on the same port and etcd, as an
# apiserver rollout or crash does; watches break, data stays.
restart_api() {
  old=$api
  stop_one "$old" 100
  wait "$old" 2>/dev/null
  eval "exec $api_cmd" >> "$dir/kube-apiserver.log" 2>&1 < /dev/null &
  api=$!
  echo "$etcd $api" > "$dir/pids"
}
trap finish TERM INT HUP
trap restart_api USR1
while :; do
  if [ "$parent" != 0 ] && ! kill -0 "$parent" 2>/dev/null; then finish; fi
  if [ ! -e "$dir/exited" ] && { ! alive "$etcd" || ! alive "$api"; }; then
    stop_children
    echo exited > "$dir/exited"
    # Detached: nobody waits for us, and the logs stay for `down` / a look.
    [ "$parent" = 0 ] && exit 1
  fi
  sleep 0.5
done
"#;

/// Where the three binaries are.
#[derive(Debug, Clone)]
pub struct Binaries {
    /// The directory holding `etcd`, `kube-apiserver` and `kubectl`.
    pub dir: PathBuf,
}

impl Binaries {
    /// `$CRC_CONTROLPLANE_BIN_DIR`, or else the directory printed by
    /// `scripts/build-controlplane.sh` (which builds on first use and reuses its
    /// cache afterwards). Blocking: the first build takes minutes.
    pub fn locate() -> Result<Self, Error> {
        let dir = match std::env::var_os(BIN_DIR_ENV) {
            Some(dir) if !dir.is_empty() => PathBuf::from(dir),
            _ => build_with_script()?,
        };
        let bins = Binaries { dir };
        for path in [bins.etcd(), bins.kube_apiserver(), bins.kubectl()] {
            if !path.is_file() {
                return Err(Error::Binaries(format!("{} is missing", path.display())));
            }
        }
        Ok(bins)
    }

    /// The etcd binary.
    pub fn etcd(&self) -> PathBuf {
        self.dir.join("etcd")
    }

    /// The kube-apiserver binary.
    pub fn kube_apiserver(&self) -> PathBuf {
        self.dir.join("kube-apiserver")
    }

    /// The kubectl binary.
    pub fn kubectl(&self) -> PathBuf {
        self.dir.join("kubectl")
    }
}

/// The repository root, known at compile time; the fixture and the
/// `crc-controlplane` binary are always built from a checkout.
pub(crate) fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn build_with_script() -> Result<PathBuf, Error> {
    let script = repo_root().join("scripts/build-controlplane.sh");
    info!(script = %script.display(), "locating control-plane binaries");
    // stderr is inherited so the progress of a long first build is visible.
    let output = Command::new("bash")
        .arg(&script)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|source| Error::io(format!("run {}", script.display()), source))?;
    if !output.status.success() {
        return Err(Error::Binaries(format!(
            "{} failed with {}",
            script.display(),
            output.status
        )));
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let last = stdout
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    if last.is_empty() {
        return Err(Error::Binaries(format!(
            "{} printed no directory",
            script.display()
        )));
    }
    Ok(PathBuf::from(last.trim()))
}

/// How to start a control plane.
#[derive(Debug, Clone, Default)]
pub struct StartOptions {
    /// Data directory (PKI, etcd data, logs, kubeconfig). Default: a fresh
    /// directory under the system temp dir. It is removed when the control
    /// plane stops.
    pub dir: Option<PathBuf>,
    /// Keep running after this process exits (for `crc-controlplane up`).
    /// Otherwise the supervisor stops everything once this process is gone.
    pub detach: bool,
    /// Leave the data directory in place on stop (for debugging).
    pub keep_data: bool,
    /// Extra kube-apiserver flags, appended last (later flags win).
    pub extra_apiserver_args: Vec<String>,
}

/// A running etcd + kube-apiserver pair. Dropping it stops both (unless it
/// was [`detach`](ControlPlane::detach)ed).
#[derive(Debug)]
pub struct ControlPlane {
    dir: PathBuf,
    kubeconfig: PathBuf,
    server: String,
    etcd_url: String,
    bins: Binaries,
    supervisor: Option<Child>,
    startup: Duration,
}

fn free_port() -> Result<u16, Error> {
    // Bind-and-release leaves a small race; start() retries on a bind error.
    let listener = TcpListener::bind("127.0.0.1:0")
        .map_err(|source| Error::io("reserve a loopback port", source))?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|source| Error::io("reserve a loopback port", source))
}

fn shell_quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}

fn shell_command(program: &Path, args: &[String]) -> String {
    std::iter::once(program.display().to_string())
        .chain(args.iter().cloned())
        .map(|w| shell_quote(&w))
        .collect::<Vec<_>>()
        .join(" ")
}

fn default_dir() -> PathBuf {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    std::env::temp_dir().join(format!(
        "crc-controlplane-{}-{}-{nanos:08x}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ))
}

fn tail(path: &Path, lines: usize) -> String {
    let mut text = String::new();
    if let Ok(mut f) = std::fs::File::open(path) {
        let _ = f.read_to_string(&mut text);
    }
    let all: Vec<&str> = text.lines().collect();
    let start = all.len().saturating_sub(lines);
    format!(
        "--- {} (last {} lines) ---\n{}",
        path.display(),
        all.len() - start,
        all[start..].join("\n")
    )
}

fn kubeconfig_yaml(server: &str, pki: &pki::Pki) -> String {
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s.as_bytes());
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: crc-local\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\nusers:\n- name: crc-admin\n  user:\n    client-certificate-data: {cert}\n    client-key-data: {key}\ncontexts:\n- name: crc-local\n  context:\n    cluster: crc-local\n    user: crc-admin\ncurrent-context: crc-local\n",
        ca = b64(&pki.ca_pem),
        cert = b64(&pki.admin_cert_pem),
        key = b64(&pki.admin_key_pem),
    )
}

impl ControlPlane {
    /// Starts etcd and kube-apiserver and waits until `/readyz` answers 200.
    ///
    /// Blocking parts (locating or building the binaries, writing files) run
    /// on the blocking pool, so this is safe to call from any runtime.
    pub async fn start(options: StartOptions) -> Result<Self, Error> {
        let bins = tokio::task::spawn_blocking(Binaries::locate)
            .await
            .map_err(|e| Error::Binaries(format!("locating binaries panicked: {e}")))??;
        Self::start_with(bins, options).await
    }

    /// Like [`start`](Self::start) with binaries already located.
    pub async fn start_with(bins: Binaries, options: StartOptions) -> Result<Self, Error> {
        const ATTEMPTS: usize = 3;
        let mut attempt = 0;
        loop {
            attempt += 1;
            match Self::try_start(&bins, &options).await {
                Err(Error::Startup { reason, logs })
                    if attempt < ATTEMPTS && logs.contains("address already in use") =>
                {
                    warn!(%reason, attempt, "control plane lost a port race; retrying with new ports");
                }
                other => return other,
            }
        }
    }

    async fn try_start(bins: &Binaries, options: &StartOptions) -> Result<Self, Error> {
        let began = Instant::now();
        let dir = options.dir.clone().unwrap_or_else(default_dir);
        if dir.exists() {
            std::fs::remove_dir_all(&dir)
                .map_err(|source| Error::io(format!("clear {}", dir.display()), source))?;
        }
        std::fs::create_dir_all(&dir)
            .map_err(|source| Error::io(format!("create {}", dir.display()), source))?;
        let dir = dir
            .canonicalize()
            .map_err(|source| Error::io(format!("resolve {}", dir.display()), source))?;
        let pki = pki::generate(&dir.join("pki"))?;

        let (etcd_port, peer_port, api_port) = (free_port()?, free_port()?, free_port()?);
        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let server = format!("https://127.0.0.1:{api_port}");

        let etcd_args: Vec<String> = vec![
            "--name=default".into(),
            format!("--data-dir={}", dir.join("etcd").display()),
            format!("--listen-client-urls={etcd_url}"),
            format!("--advertise-client-urls={etcd_url}"),
            format!("--listen-peer-urls={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster=default={peer_url}"),
            // Test data is disposable; fsync would dominate write latency.
            "--unsafe-no-fsync".into(),
            "--log-level=warn".into(),
        ];
        let mut api_args: Vec<String> = vec![
            format!("--etcd-servers={etcd_url}"),
            "--bind-address=127.0.0.1".into(),
            // Without it the apiserver looks for a default route and dies on
            // machines that have none.
            "--advertise-address=127.0.0.1".into(),
            // The `kubernetes` Service endpoints may not point at loopback;
            // nothing here needs them.
            "--endpoint-reconciler-type=none".into(),
            format!("--secure-port={api_port}"),
            format!("--cert-dir={}", dir.join("pki").display()),
            format!("--tls-cert-file={}", pki.serving_cert.display()),
            format!("--tls-private-key-file={}", pki.serving_key.display()),
            format!("--client-ca-file={}", pki.ca_cert.display()),
            "--authorization-mode=Node,RBAC".into(),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
            format!("--service-account-key-file={}", pki.sa_pub.display()),
            format!(
                "--service-account-signing-key-file={}",
                pki.sa_key.display()
            ),
            "--service-cluster-ip-range=10.96.0.0/24".into(),
            // No controller-manager creates default service accounts.
            "--disable-admission-plugins=ServiceAccount".into(),
            // Keeps etcd small during long benchmark runs; tests that need a
            // compaction right now call `compact_etcd`.
            "--etcd-compaction-interval=1m".into(),
            "--profiling=false".into(),
            "--v=1".into(),
        ];
        api_args.extend(options.extra_apiserver_args.iter().cloned());

        let kubeconfig = dir.join("kubeconfig");
        std::fs::write(&kubeconfig, kubeconfig_yaml(&server, &pki))
            .map_err(|source| Error::io(format!("write {}", kubeconfig.display()), source))?;

        let parent = if options.detach {
            0
        } else {
            std::process::id()
        };
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(SUPERVISOR)
            .arg("crc-controlplane-supervisor")
            .arg(parent.to_string())
            .arg(&dir)
            .arg(if options.keep_data { "1" } else { "0" })
            .arg(shell_command(&bins.etcd(), &etcd_args))
            .arg(shell_command(&bins.kube_apiserver(), &api_args))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if options.detach {
            // Out of the terminal's process group, so a later Ctrl-C in the
            // shell that ran `up` does not stop the cluster.
            std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        }
        let child = cmd
            .spawn()
            .map_err(|source| Error::io("spawn the control-plane supervisor", source))?;
        info!(dir = %dir.display(), %server, %etcd_url, "control plane starting");

        let mut plane = ControlPlane {
            dir,
            kubeconfig,
            server,
            etcd_url,
            bins: bins.clone(),
            supervisor: Some(child),
            startup: Duration::ZERO,
        };
        // On failure `plane` is dropped, which stops the supervisor.
        plane.wait_ready().await?;
        plane.startup = began.elapsed();
        info!(
            startup_ms = plane.startup.as_millis() as u64,
            "control plane ready"
        );
        Ok(plane)
    }

    fn failure(&self, reason: impl Into<String>) -> Error {
        Error::Startup {
            reason: reason.into(),
            logs: format!(
                "{}\n{}",
                tail(&self.dir.join("etcd.log"), 20),
                tail(&self.dir.join("kube-apiserver.log"), 40)
            ),
        }
    }

    async fn wait_ready(&mut self) -> Result<(), Error> {
        let client = crate::client_from_kubeconfig(&self.kubeconfig).await?;
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if self.dir.join("exited").exists() {
                return Err(self.failure("etcd or kube-apiserver exited during start-up"));
            }
            if let Some(child) = self.supervisor.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                return Err(self.failure(format!("supervisor exited with {status}")));
            }
            let request = http::Request::get("/readyz")
                .body(Vec::new())
                .map_err(|e| Error::Startup {
                    reason: e.to_string(),
                    logs: String::new(),
                })?;
            let last = match client.request_text(request).await {
                Ok(body) => {
                    debug!(%body, "readyz");
                    return Ok(());
                }
                Err(e) => e.to_string(),
            };
            if Instant::now() >= deadline {
                return Err(
                    self.failure(format!("/readyz not ready after {READY_TIMEOUT:?}: {last}"))
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Restarts kube-apiserver alone (same port, same etcd, data kept) and
    /// waits until it is ready again: what an apiserver rollout or crash
    /// does to clients. Watches break; nothing else changes.
    pub async fn restart_apiserver(&mut self) -> Result<(), Error> {
        let pid = self
            .supervisor_pid()
            .ok_or_else(|| self.failure("the control plane has no supervisor"))?;
        restart_apiserver_of(pid, &self.dir).await?;
        self.wait_ready().await
    }

    /// Kubeconfig with the admin (system:masters) client certificate embedded.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// `https://127.0.0.1:<port>`.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// `http://127.0.0.1:<port>` of etcd (loopback only, no auth).
    pub fn etcd_url(&self) -> &str {
        &self.etcd_url
    }

    /// The data directory (removed on stop).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where etcd, kube-apiserver and kubectl come from.
    pub fn binaries(&self) -> &Binaries {
        &self.bins
    }

    /// Time from the start request to a 200 from `/readyz`.
    pub fn startup_time(&self) -> Duration {
        self.startup
    }

    /// Process id of the supervisor (stop it with SIGTERM).
    pub fn supervisor_pid(&self) -> Option<u32> {
        self.supervisor.as_ref().map(Child::id)
    }

    /// Leaves the control plane running past this value (and, with
    /// [`StartOptions::detach`], past this process). Returns the supervisor pid.
    pub fn detach(mut self) -> Option<u32> {
        self.supervisor.take().map(|c| c.id())
    }

    /// Stops both processes and removes the data directory.
    pub fn stop(mut self) -> Result<(), Error> {
        self.stop_inner()
    }

    fn stop_inner(&mut self) -> Result<(), Error> {
        let Some(mut child) = self.supervisor.take() else {
            return Ok(());
        };
        stop_supervisor(child.id(), || matches!(child.try_wait(), Ok(Some(_))))
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        if let Err(e) = self.stop_inner() {
            warn!(error = %e, "stopping the control plane");
        }
    }
}

/// Asks the supervisor `pid` (data directory `dir`) to restart
/// kube-apiserver and waits until it has started a new one; readiness is the
/// caller's to wait for.
pub async fn restart_apiserver_of(pid: u32, dir: &Path) -> Result<(), Error> {
    let pids = dir.join("pids");
    let before = std::fs::read_to_string(&pids).unwrap_or_default();
    let status = Command::new("kill")
        .args(["-USR1", &pid.to_string()])
        .status()
        .map_err(|source| Error::io("run kill", source))?;
    if !status.success() {
        return Err(Error::Startup {
            reason: format!("could not signal the control-plane supervisor {pid}"),
            logs: String::new(),
        });
    }
    let deadline = Instant::now() + STOP_TIMEOUT;
    while std::fs::read_to_string(&pids).unwrap_or_default() == before {
        if Instant::now() >= deadline {
            return Err(Error::Startup {
                reason: format!("kube-apiserver was not restarted within {STOP_TIMEOUT:?}"),
                logs: tail(&dir.join("kube-apiserver.log"), 40),
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// Sends SIGTERM to a supervisor and waits until `exited()` says it is gone.
pub(crate) fn stop_supervisor(pid: u32, mut exited: impl FnMut() -> bool) -> Result<(), Error> {
    let status = Command::new("kill")
        .arg("-TERM")
        .arg(pid.to_string())
        .stderr(Stdio::null())
        .status()
        .map_err(|source| Error::io("run kill", source))?;
    if !status.success() && exited() {
        return Ok(());
    }
    let deadline = Instant::now() + STOP_TIMEOUT;
    while Instant::now() < deadline {
        if exited() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(Error::Io {
        context: format!("supervisor {pid} still running after {STOP_TIMEOUT:?}"),
        source: std::io::Error::from(std::io::ErrorKind::TimedOut),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_quoting_survives_quotes_and_spaces() {
        // Same path as the supervisor: the command arrives as one positional
        // parameter and is re-parsed by eval.
        let out = Command::new("sh")
            .arg("-c")
            .arg(r#"eval "set -- $1"; printf '%s|' "$@""#)
            .arg("sh")
            .arg(shell_command(
                Path::new("/bin/x y"),
                &["a'b".into(), "--f=$HOME".into()],
            ))
            .output()
            .expect("sh");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "/bin/x y|a'b|--f=$HOME|"
        );
    }

    #[test]
    fn kubeconfig_embeds_base64_data() {
        let dir = default_dir();
        let pki = pki::generate(&dir).expect("pki");
        let yaml = kubeconfig_yaml("https://127.0.0.1:1", &pki);
        let parsed = kube::config::Kubeconfig::from_yaml(&yaml).expect("parse");
        let cluster = parsed.clusters[0].cluster.as_ref().expect("cluster");
        assert_eq!(cluster.server.as_deref(), Some("https://127.0.0.1:1"));
        let ca = base64::engine::general_purpose::STANDARD
            .decode(cluster.certificate_authority_data.as_deref().expect("ca"))
            .expect("b64");
        assert_eq!(String::from_utf8(ca).expect("utf8"), pki.ca_pem);
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }
}
