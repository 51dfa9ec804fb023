//! The loopback HTTP plumbing every fake cloud and test proxy of the
//! workspace shares, so each of them keeps only its cloud's rules.
//!
//! This crate owns what does not depend on the cloud: a server on a free
//! port of `127.0.0.1` ([`Listener`]) that stops when its handle
//! ([`TestServer`]) is dropped, the tallies of answers and the queues of
//! injected failures the fakes keep ([`Answers`], [`Injections`]),
//! and, behind features, serving an axum `Router` (`axum`: the fakes of
//! Azure, Compute Engine and Hetzner Cloud) or a raw hyper handler that
//! forwards to an upstream (`proxy`: the proxies in front of moto and
//! neutron-server). Endpoints, error bodies, throttling and state are the
//! fakes' and proxies' own.
//!
//! It is a crate of its own rather than a module of `route-cloud` because
//! the providers reach it only through their `testing` features: it
//! depends on no crate of the workspace (no cycle), and the released
//! binaries, which build `route-cloud`, never compile axum or a hyper
//! server for it.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Mutex, MutexGuard};

use tokio::net::TcpListener;
use tokio::task::JoinHandle;

#[cfg(feature = "proxy")]
pub mod proxy;
#[cfg(feature = "axum")]
mod serve_axum;

#[cfg(feature = "axum")]
pub use serve_axum::json_response;

/// A poisoned lock only means another request handler panicked; a test
/// server's state (counters, logs, switches) is still consistent.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A listening socket on a free loopback port, not serving yet: its
/// address is known before the server's state is built (a fake writes its
/// own URLs into its answers).
#[derive(Debug)]
pub struct Listener {
    listener: TcpListener,
    addr: SocketAddr,
}

impl Listener {
    /// Binds `127.0.0.1:0`.
    pub async fn bind() -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        Ok(Self { listener, addr })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Serves with `serve`, which owns the socket from now on, on a task of
    /// its own.
    pub fn spawn<F, Fut>(self, serve: F) -> TestServer
    where
        F: FnOnce(TcpListener) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        TestServer {
            addr: self.addr,
            task: tokio::spawn(serve(self.listener)),
        }
    }
}

/// A running server. Dropping it stops accepting connections.
#[derive(Debug)]
pub struct TestServer {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl TestServer {
    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The answers of a fake, by endpoint name and HTTP status.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Answers(BTreeMap<(String, u16), u64>);

impl Answers {
    /// Counts one answer.
    pub fn record(&mut self, endpoint: &str, status: u16) {
        *self.0.entry((endpoint.to_string(), status)).or_default() += 1;
    }

    /// Every count so far.
    pub fn all(&self) -> &BTreeMap<(String, u16), u64> {
        &self.0
    }

    /// Answers by endpoint, any status.
    pub fn by_endpoint(&self) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        for ((e, _), n) in &self.0 {
            *out.entry(e.clone()).or_default() += n;
        }
        out
    }

    /// Answers of one endpoint, any status.
    pub fn count(&self, endpoint: &str) -> u64 {
        self.0
            .iter()
            .filter(|((e, _), _)| e == endpoint)
            .map(|(_, n)| n)
            .sum()
    }

    /// Answers of one endpoint with one status.
    pub fn count_status(&self, endpoint: &str, status: u16) -> u64 {
        self.0
            .get(&(endpoint.to_string(), status))
            .copied()
            .unwrap_or(0)
    }

    /// All answers.
    pub fn total(&self) -> u64 {
        self.0.values().sum()
    }

    /// Answers with one status, any endpoint.
    pub fn with_status(&self, status: u16) -> u64 {
        self.0
            .iter()
            .filter(|((_, s), _)| *s == status)
            .map(|(_, n)| n)
            .sum()
    }
}

/// Failures a test asked a fake to answer instead of acting: per endpoint,
/// a status and the cloud's error code, for a number of requests. Queued in
/// the order asked; the first one still due for an endpoint answers.
#[derive(Debug, Clone, Default)]
pub struct Injections(Vec<Injected>);

#[derive(Debug, Clone)]
struct Injected {
    endpoint: String,
    remaining: u32,
    status: u16,
    code: String,
}

impl Injections {
    /// Answers the next `n` requests to `endpoint` with `status` and `code`.
    pub fn push(&mut self, endpoint: &str, n: u32, status: u16, code: &str) {
        self.0.push(Injected {
            endpoint: endpoint.to_string(),
            remaining: n,
            status,
            code: code.to_string(),
        });
    }

    /// The failure to answer a request to `endpoint` with, if one is due:
    /// `(status, code)`, counted as used.
    pub fn take(&mut self, endpoint: &str) -> Option<(u16, String)> {
        let i = self
            .0
            .iter_mut()
            .find(|i| i.endpoint == endpoint && i.remaining > 0)?;
        i.remaining -= 1;
        let answer = (i.status, i.code.clone());
        self.0.retain(|i| i.remaining > 0);
        Some(answer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_counted_by_endpoint_and_status() {
        let mut a = Answers::default();
        a.record("get", 200);
        a.record("get", 200);
        a.record("get", 429);
        a.record("put", 429);
        assert_eq!(a.count("get"), 3);
        assert_eq!(a.count_status("get", 200), 2);
        assert_eq!(a.count_status("put", 200), 0);
        assert_eq!(a.with_status(429), 2);
        assert_eq!(a.total(), 4);
        assert_eq!(
            a.by_endpoint(),
            BTreeMap::from([("get".to_string(), 3), ("put".to_string(), 1)])
        );
    }

    #[test]
    fn injections_answer_in_order_and_run_out() {
        let mut i = Injections::default();
        i.push("put", 2, 429, "Throttled");
        i.push("put", 1, 500, "Internal");
        i.push("get", 0, 404, "Never");
        assert_eq!(i.take("get"), None);
        assert_eq!(i.take("put"), Some((429, "Throttled".into())));
        assert_eq!(i.take("put"), Some((429, "Throttled".into())));
        assert_eq!(i.take("put"), Some((500, "Internal".into())));
        assert_eq!(i.take("put"), None);
    }

    #[tokio::test]
    async fn a_dropped_server_stops_accepting() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let l = Listener::bind().await.expect("bind");
        assert_eq!(l.url(), format!("http://{}", l.addr()));
        let server = l.spawn(|listener| async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let _ = conn.write_all(b"hi").await;
            }
        });
        let mut conn = tokio::net::TcpStream::connect(server.addr())
            .await
            .expect("connect");
        let mut got = String::new();
        conn.read_to_string(&mut got).await.expect("read");
        assert_eq!(got, "hi");
        let addr = server.addr();
        drop(server);
        // The aborted task closes the socket when the runtime next drops it.
        let mut refused = false;
        for _ in 0..100 {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            if tokio::net::TcpStream::connect(addr).await.is_err() {
                refused = true;
                break;
            }
        }
        assert!(refused, "still accepting after drop");
    }
}
