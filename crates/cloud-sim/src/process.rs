//! [`SimProcess`]: the `cloud-sim` binary started as a child process, for
//! tests and tools that need the simulated cloud to outlive a controller
//! process. The child is told to exit when this process dies and is killed
//! when the handle is dropped, so it cannot leak.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// A running `cloud-sim serve` child.
#[derive(Debug)]
pub struct SimProcess {
    child: Child,
    url: String,
}

impl SimProcess {
    /// Starts `binary serve --listen 127.0.0.1:0 --parent-pid <this pid>`
    /// plus `extra_args`, and waits (up to 30 s) for its `LISTENING` line.
    pub async fn spawn(binary: &Path, extra_args: &[&str]) -> std::io::Result<Self> {
        let mut child = Command::new(binary)
            .arg("serve")
            .args(["--listen", "127.0.0.1:0"])
            .args(["--parent-pid", &std::process::id().to_string()])
            .args(extra_args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| std::io::Error::other("cloud-sim stdout is not piped"))?;
        let mut lines = BufReader::new(stdout).lines();
        let first = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .map_err(|_| std::io::Error::other("cloud-sim printed nothing in 30 s"))??;
        let url = first
            .as_deref()
            .and_then(|l| l.strip_prefix("LISTENING "))
            .map(str::to_string)
            .ok_or_else(|| {
                std::io::Error::other(format!("cloud-sim did not start: first line {first:?}"))
            })?;
        // Keep draining stdout so the child never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok(Self { child, url })
    }

    /// The server's base URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The child's process id (None once it was reaped).
    pub fn id(&self) -> Option<u32> {
        self.child.id()
    }

    /// Kills the child and waits for it.
    pub async fn kill(mut self) -> std::io::Result<()> {
        self.child.kill().await
    }
}
