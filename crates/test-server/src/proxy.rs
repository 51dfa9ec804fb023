//! Serving a raw hyper handler and forwarding to an upstream (feature
//! `proxy`), as the proxies in front of moto and neutron-server do: one
//! HTTP/1 connection per client connection in, one upstream connection per
//! request out, bodies whole in memory.

use std::convert::Infallible;
use std::net::SocketAddr;

use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::{Listener, TestServer};

/// What a proxy answers with: a whole body.
pub type Answer = Response<Full<Bytes>>;

impl Listener {
    /// Serves every connection with `handle`, one request at a time per
    /// connection, each connection on a task of its own.
    pub fn serve_hyper<H, Fut>(self, handle: H) -> TestServer
    where
        H: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
        Fut: Future<Output = Result<Answer, Infallible>> + Send + 'static,
    {
        self.spawn(move |listener| async move {
            loop {
                let Ok((conn, _)) = listener.accept().await else {
                    return;
                };
                let handle = handle.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(handle);
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(conn), svc)
                        .await;
                });
            }
        })
    }
}

/// The upstream `http://ip:port` as an address.
pub fn upstream_addr(upstream: &str) -> Result<SocketAddr, String> {
    upstream
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .parse()
        .map_err(|e| format!("upstream {upstream:?} is not http://ip:port: {e}"))
}

/// A whole body, or `None` when reading it failed.
pub async fn collect<B: Body>(body: B) -> Option<Bytes> {
    body.collect().await.ok().map(|b| b.to_bytes())
}

/// Sends one request to `upstream` on a connection of its own; `None` when
/// the upstream cannot be reached or gives no answer.
pub async fn send(upstream: SocketAddr, req: Request<Full<Bytes>>) -> Option<Response<Incoming>> {
    let stream = TcpStream::connect(upstream).await.ok()?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .ok()?;
    tokio::spawn(conn);
    sender.send_request(req).await.ok()
}

/// A request built from a client's, to send on: the body is whole now, so
/// the client's `content-length` is left for hyper to write.
pub fn resend(parts: hyper::http::request::Parts, body: Bytes) -> Request<Full<Bytes>> {
    let mut fwd = Request::from_parts(parts, Full::new(body));
    fwd.headers_mut().remove("content-length");
    fwd
}

/// An answer built from the upstream's, to pass back with a (possibly
/// rewritten) whole body: the framing headers are hyper's to write.
pub fn pass_back(mut parts: hyper::http::response::Parts, body: Bytes) -> Answer {
    parts.headers.remove("content-length");
    parts.headers.remove("transfer-encoding");
    Response::from_parts(parts, Full::new(body))
}

/// An answer of the proxy's own: `status` (500 when not a status),
/// `content_type` and `body`.
pub fn reply(status: u16, content_type: &'static str, body: impl Into<Bytes>) -> Answer {
    let mut resp = Response::new(Full::new(body.into()));
    *resp.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(content_type),
    );
    resp
}

/// The answer when the upstream cannot be reached: `502`, no body.
pub fn bad_gateway() -> Answer {
    let mut resp = Response::new(Full::new(Bytes::new()));
    *resp.status_mut() = StatusCode::BAD_GATEWAY;
    resp
}

/// The error a proxy answers for the next requests instead of forwarding
/// them, and how many more times. A new one replaces one still pending.
#[derive(Debug, Default)]
pub struct FailNext(Option<(u64, u16, String)>);

impl FailNext {
    /// Answers the next `n` requests with `status` and `code`; `n = 0`
    /// clears.
    pub fn set(&mut self, n: u64, status: u16, code: &str) {
        self.0 = (n > 0).then(|| (n, status, code.to_string()));
    }

    /// The `(status, code)` to answer this request with, if any, counted.
    pub fn take(&mut self) -> Option<(u16, String)> {
        let (remaining, status, code) = self.0.as_mut()?;
        *remaining = remaining.saturating_sub(1);
        let answer = (*status, code.clone());
        if *remaining == 0 {
            self.0 = None;
        }
        Some(answer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fail_next_answers_n_times_and_is_replaced() {
        let mut f = FailNext::default();
        assert_eq!(f.take(), None);
        f.set(2, 503, "Busy");
        assert_eq!(f.take(), Some((503, "Busy".into())));
        f.set(1, 412, "Stale");
        assert_eq!(f.take(), Some((412, "Stale".into())));
        assert_eq!(f.take(), None);
        f.set(3, 500, "x");
        f.set(0, 500, "x");
        assert_eq!(f.take(), None);
    }

    #[test]
    fn parses_the_upstream() {
        assert_eq!(
            upstream_addr("http://127.0.0.1:5000/"),
            Ok("127.0.0.1:5000".parse().expect("addr"))
        );
        assert!(upstream_addr("http://localhost:5000").is_err());
    }

    #[tokio::test]
    async fn forwards_to_the_upstream_and_answers_502_without_one() {
        let upstream = Listener::bind().await.expect("bind");
        let up = upstream.serve_hyper(|req: Request<Incoming>| async move {
            let path = req.uri().path().to_string();
            let body = collect(req.into_body()).await.unwrap_or_default();
            Ok(reply(
                201,
                "text/plain",
                format!("{path}:{}", String::from_utf8_lossy(&body)),
            ))
        });
        let to = up.addr();
        let proxy = Listener::bind().await.expect("bind");
        let proxy = proxy.serve_hyper(move |req: Request<Incoming>| async move {
            let (parts, body) = req.into_parts();
            let body = collect(body).await.unwrap_or_default();
            let Some(resp) = send(to, resend(parts, body)).await else {
                return Ok(bad_gateway());
            };
            let (parts, body) = resp.into_parts();
            Ok(match collect(body).await {
                Some(b) => pass_back(parts, b),
                None => bad_gateway(),
            })
        });
        let req = |addr: SocketAddr| async move {
            let req = Request::post(format!("http://{addr}/a"))
                .body(Full::new(Bytes::from_static(b"b")))
                .expect("request");
            send(addr, req).await
        };
        let resp = req(proxy.addr()).await.expect("an answer");
        assert_eq!(resp.status(), 201);
        let body = collect(resp.into_body()).await.expect("body");
        assert_eq!(&body[..], b"/a:b");
        drop(up);
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let resp = req(proxy.addr()).await.expect("an answer");
        assert_eq!(resp.status(), 502);
    }
}
