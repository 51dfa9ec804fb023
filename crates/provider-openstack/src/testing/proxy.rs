//! A recording HTTP proxy in front of neutron-server (feature `testing`).
//!
//! neutron-server answers every request as it should and cannot say how many
//! it served, so tests that need Neutron's error answers or the server-side
//! request count put this proxy between the provider and the server. It
//! owns nothing but its request counts (in all, and by method and path, so
//! a test can tell a write from a read) and one switch: [`Proxy::fail_next`]
//! answers the next requests with a chosen status and Neutron error body
//! instead of forwarding them. Everything else is forwarded unchanged, one
//! upstream connection per request (the serving and forwarding plumbing is
//! the `test-server` crate's).

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use hyper::Request;
use hyper::body::Incoming;
use test_server::proxy::{self as plumbing, Answer, FailNext};
use test_server::{Listener, TestServer, lock};

#[derive(Default)]
struct ProxyState {
    requests: AtomicU64,
    /// `METHOD /path` (no query) → requests.
    by_request: Mutex<BTreeMap<String, u64>>,
    injected: AtomicU64,
    failing: Mutex<FailNext>,
    /// The request to hold back: (method, part of the path).
    hold: Mutex<Option<(String, String)>>,
    held: AtomicU64,
    release: tokio::sync::Notify,
}

/// Forwards to neutron-server, counting requests; answers chosen ones with
/// an error. Stops accepting connections when dropped.
pub struct Proxy {
    state: Arc<ProxyState>,
    server: TestServer,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy")
            .field("addr", &self.server.addr())
            .finish()
    }
}

impl Proxy {
    /// Listens on a free loopback port and forwards to `upstream`
    /// (`http://ip:port`, as [`super::NeutronServer::url`] holds it).
    pub async fn start(upstream: &str) -> Result<Self, String> {
        let upstream = plumbing::upstream_addr(upstream)?;
        let listener = Listener::bind()
            .await
            .map_err(|e| format!("binding the proxy: {e}"))?;
        let state = Arc::new(ProxyState::default());
        let st = Arc::clone(&state);
        let server = listener.serve_hyper(move |req| handle(Arc::clone(&st), upstream, req));
        Ok(Self { state, server })
    }

    /// The endpoint the provider should use instead of the server's.
    pub fn url(&self) -> String {
        self.server.url()
    }

    /// Requests received so far, forwarded or answered with an error.
    pub fn requests(&self) -> u64 {
        self.state.requests.load(Ordering::SeqCst)
    }

    /// Requests received so far by `METHOD /path` (the query left out),
    /// e.g. `PUT /v2.0/ports/<id>`.
    pub fn counts(&self) -> BTreeMap<String, u64> {
        lock(&self.state.by_request).clone()
    }

    /// The part of [`Proxy::counts`] whose method changes something on the
    /// server (anything but `GET` and `HEAD`).
    pub fn writes(&self) -> BTreeMap<String, u64> {
        self.counts()
            .into_iter()
            .filter(|(k, _)| !(k.starts_with("GET ") || k.starts_with("HEAD ")))
            .collect()
    }

    /// Requests answered with an injected error so far.
    pub fn injected(&self) -> u64 {
        self.state.injected.load(Ordering::SeqCst)
    }

    /// Answers the next `n` requests with HTTP `status` and a Neutron error
    /// body of type `neutron_type` (e.g. `OverQuota`) instead of forwarding
    /// them. A 429 says `Retry-After: 0`. Replaces earlier pending failures;
    /// `n = 0` clears them.
    pub fn fail_next(&self, n: u64, status: u16, neutron_type: &str) {
        lock(&self.state.failing).set(n, status, neutron_type);
    }
}

impl Proxy {
    /// Holds the next request with HTTP `method` whose path contains
    /// `path_part` until [`Proxy::release`], then forwards it: the window
    /// in which a test changes the server between a client's read and its
    /// write.
    pub fn hold_next(&self, method: &str, path_part: &str) {
        *lock(&self.state.hold) = Some((method.to_string(), path_part.to_string()));
    }

    /// Requests held back so far.
    pub fn held(&self) -> u64 {
        self.state.held.load(Ordering::SeqCst)
    }

    /// Forwards the held request (or the next one to be held).
    pub fn release(&self) {
        self.state.release.notify_one();
    }
}

async fn handle(
    st: Arc<ProxyState>,
    upstream: SocketAddr,
    req: Request<Incoming>,
) -> Result<Answer, Infallible> {
    st.requests.fetch_add(1, Ordering::SeqCst);
    *lock(&st.by_request)
        .entry(format!("{} {}", req.method(), req.uri().path()))
        .or_default() += 1;
    let injected = lock(&st.failing).take();
    let hold = {
        let mut hold = lock(&st.hold);
        let hit = hold.as_ref().is_some_and(|(m, p)| {
            req.method().as_str() == m && req.uri().path().contains(p.as_str())
        });
        if hit {
            *hold = None;
        }
        hit
    };
    if hold {
        st.held.fetch_add(1, Ordering::SeqCst);
        st.release.notified().await;
    }
    let (parts, body) = req.into_parts();
    let body = plumbing::collect(body).await.unwrap_or_default();
    if let Some((status, neutron_type)) = injected {
        st.injected.fetch_add(1, Ordering::SeqCst);
        let text = serde_json::json!({"NeutronError": {
            "type": neutron_type,
            "message": "injected by the test proxy",
            "detail": "",
        }})
        .to_string();
        let mut resp = plumbing::reply(status, "application/json", text);
        if status == 429 {
            resp.headers_mut().insert(
                hyper::header::RETRY_AFTER,
                hyper::header::HeaderValue::from_static("0"),
            );
        }
        return Ok(resp);
    }
    let Some(resp) = plumbing::send(upstream, plumbing::resend(parts, body)).await else {
        return Ok(plumbing::bad_gateway());
    };
    let (parts, body) = resp.into_parts();
    let bytes = plumbing::collect(body).await.unwrap_or_default();
    Ok(plumbing::pass_back(parts, bytes))
}
