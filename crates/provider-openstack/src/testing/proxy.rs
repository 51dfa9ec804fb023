//! A recording HTTP proxy in front of neutron-server (feature `testing`).
//!
//! neutron-server answers every request as it should and cannot say how many
//! it served, so tests that need Neutron's error answers or the server-side
//! request count put this proxy between the provider and the server. It
//! owns nothing but its request count and one switch: [`Proxy::fail_next`]
//! answers the next requests with a chosen status and Neutron error body
//! instead of forwarding them. Everything else is forwarded unchanged, one
//! upstream connection per request.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// The error [`Proxy::fail_next`] answers, and how many more times.
struct Failing {
    remaining: u64,
    status: u16,
    neutron_type: String,
}

#[derive(Default)]
struct ProxyState {
    requests: AtomicU64,
    injected: AtomicU64,
    failing: Mutex<Option<Failing>>,
    /// The request to hold back: (method, part of the path).
    hold: Mutex<Option<(String, String)>>,
    held: AtomicU64,
    release: tokio::sync::Notify,
}

/// A poisoned lock only means another request handler panicked; the
/// pending failure is still consistent.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Forwards to neutron-server, counting requests; answers chosen ones with
/// an error. Stops accepting connections when dropped.
pub struct Proxy {
    addr: SocketAddr,
    state: Arc<ProxyState>,
    accept: JoinHandle<()>,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy").field("addr", &self.addr).finish()
    }
}

impl Proxy {
    /// Listens on a free loopback port and forwards to `upstream`
    /// (`http://ip:port`, as [`super::NeutronServer::url`] holds it).
    pub async fn start(upstream: &str) -> Result<Self, String> {
        let upstream: SocketAddr = upstream
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .parse()
            .map_err(|e| format!("upstream {upstream:?} is not http://ip:port: {e}"))?;
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| format!("binding the proxy: {e}"))?;
        let addr = listener
            .local_addr()
            .map_err(|e| format!("proxy address: {e}"))?;
        let state = Arc::new(ProxyState::default());
        let st = Arc::clone(&state);
        let accept = tokio::spawn(async move {
            loop {
                let Ok((conn, _)) = listener.accept().await else {
                    return;
                };
                let st = Arc::clone(&st);
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req| {
                        handle(Arc::clone(&st), upstream, req)
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(conn), svc)
                        .await;
                });
            }
        });
        Ok(Self {
            addr,
            state,
            accept,
        })
    }

    /// The endpoint the provider should use instead of the server's.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Requests received so far, forwarded or answered with an error.
    pub fn requests(&self) -> u64 {
        self.state.requests.load(Ordering::SeqCst)
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
        *lock(&self.state.failing) = (n > 0).then(|| Failing {
            remaining: n,
            status,
            neutron_type: neutron_type.to_string(),
        });
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

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

async fn handle(
    st: Arc<ProxyState>,
    upstream: SocketAddr,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    st.requests.fetch_add(1, Ordering::SeqCst);
    let injected = {
        let mut failing = lock(&st.failing);
        let answer = failing.as_mut().map(|f| {
            f.remaining = f.remaining.saturating_sub(1);
            (f.status, f.neutron_type.clone())
        });
        if failing.as_ref().is_some_and(|f| f.remaining == 0) {
            *failing = None;
        }
        answer
    };
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
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    if let Some((status, neutron_type)) = injected {
        st.injected.fetch_add(1, Ordering::SeqCst);
        let text = serde_json::json!({"NeutronError": {
            "type": neutron_type,
            "message": "injected by the test proxy",
            "detail": "",
        }})
        .to_string();
        let mut resp = Response::new(Full::new(Bytes::from(text)));
        *resp.status_mut() =
            StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let headers = resp.headers_mut();
        headers.insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static("application/json"),
        );
        if status == 429 {
            headers.insert(
                hyper::header::RETRY_AFTER,
                hyper::header::HeaderValue::from_static("0"),
            );
        }
        return Ok(resp);
    }
    let Ok(stream) = TcpStream::connect(upstream).await else {
        return Ok(bad_gateway());
    };
    let Ok((mut sender, conn)) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await
    else {
        return Ok(bad_gateway());
    };
    tokio::spawn(conn);
    let mut fwd = Request::from_parts(parts, Full::new(body));
    fwd.headers_mut().remove("content-length");
    let Ok(resp) = sender.send_request(fwd).await else {
        return Ok(bad_gateway());
    };
    let (mut parts, body) = resp.into_parts();
    let bytes = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    parts.headers.remove("content-length");
    parts.headers.remove("transfer-encoding");
    Ok(Response::from_parts(parts, Full::new(bytes)))
}

fn bad_gateway() -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::new()));
    *resp.status_mut() = StatusCode::BAD_GATEWAY;
    resp
}
