//! Exiting with the parent process, so a test or script that dies without
//! cleaning up never leaves a simulated cloud behind. Polls `/proc` (and the
//! parent pid) instead of asking the kernel for a death signal, which would
//! need `unsafe`.

use std::path::PathBuf;
use std::time::Duration;

/// How often the parent is checked.
pub const POLL_INTERVAL: Duration = Duration::from_millis(200);

/// Whose death ends the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Watch {
    /// The process that started this one: gone once this process is
    /// re-parented (to init or a subreaper).
    Parent(u32),
    /// A given process id: gone once `/proc/PID` is gone or a zombie.
    Pid(u32),
}

impl Watch {
    /// Watches the current parent.
    pub fn current_parent() -> Self {
        Watch::Parent(std::os::unix::process::parent_id())
    }

    /// Is the watched process still there?
    pub fn alive(self) -> bool {
        match self {
            Watch::Parent(ppid) => std::os::unix::process::parent_id() == ppid,
            Watch::Pid(pid) => pid_alive(pid),
        }
    }

    /// Resolves once the watched process is gone.
    pub async fn gone(self) {
        while self.alive() {
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }
}

/// Resolves once any of `watches` is gone; never if `watches` is empty.
pub async fn any_gone(watches: &[Watch]) {
    if watches.is_empty() {
        std::future::pending::<()>().await;
    }
    while watches.iter().all(|w| w.alive()) {
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// `/proc/PID` exists and its state is not `Z` (exited, not yet reaped).
pub fn pid_alive(pid: u32) -> bool {
    let stat = PathBuf::from(format!("/proc/{pid}/stat"));
    let Ok(text) = std::fs::read_to_string(stat) else {
        return false;
    };
    // The command name in parentheses may contain anything, so the state is
    // read after the last ')'.
    match text.rsplit_once(')') {
        Some((_, rest)) => !matches!(rest.trim_start().chars().next(), Some('Z' | 'X')),
        None => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_lives_and_a_reaped_child_does_not() {
        assert!(pid_alive(std::process::id()));
        assert!(Watch::current_parent().alive());
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        assert!(!pid_alive(pid), "a reaped child is gone");
        assert!(!Watch::Parent(u32::MAX).alive());
    }

    #[test]
    fn an_unreaped_child_counts_as_gone() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while pid_alive(pid) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(!pid_alive(pid), "a zombie is not alive");
        child.wait().unwrap();
    }

    #[tokio::test]
    async fn any_gone_waits_for_the_first_death_only() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let alive = [Watch::current_parent(), Watch::Pid(std::process::id())];
        let early = tokio::time::timeout(Duration::from_millis(500), any_gone(&alive)).await;
        assert!(early.is_err(), "nobody died yet");
        let mixed = [Watch::current_parent(), Watch::Pid(dead)];
        tokio::time::timeout(Duration::from_secs(2), any_gone(&mixed))
            .await
            .expect("one watched process is gone");
        let none = tokio::time::timeout(Duration::from_millis(300), any_gone(&[])).await;
        assert!(none.is_err(), "no watch, no exit");
    }
}
