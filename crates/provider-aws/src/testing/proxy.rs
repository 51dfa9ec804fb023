//! A recording HTTP proxy in front of moto (feature `testing`).
//!
//! moto answers every request and reports every route as `active`, so tests
//! that need EC2's throttling answer or blackhole routes put this proxy
//! between the client and moto. It owns nothing but its log and its
//! switches: [`Proxy::throttle_every`] answers every n-th request with
//! `RequestLimitExceeded` (HTTP 503, EC2's XML error body) instead of
//! forwarding it, [`Proxy::fail_next`] answers the next requests with any
//! EC2 error code, and [`Proxy::blackhole`] rewrites `DescribeRouteTables`
//! answers so routes to the named instances show `<state>blackhole</state>`,
//! [`Proxy::as_table_route`] gives routes to named destinations `Origin`
//! `CreateRouteTable`, and [`Proxy::page_route_tables`] pages
//! `DescribeRouteTables` answers with `NextToken` (moto does neither).
//! Everything else is forwarded unchanged, one upstream connection per
//! request.

use std::collections::HashSet;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// One request as the proxy saw it.
#[derive(Debug, Clone)]
pub struct Logged {
    /// The query API action (`Action=` of the form body), empty if none.
    pub action: String,
    /// The whole form-encoded request body.
    pub body: String,
    /// When the request arrived.
    pub at: Instant,
    /// Whether the proxy answered it with `RequestLimitExceeded`.
    pub throttled: bool,
    /// The EC2 error code the proxy answered instead of forwarding, if any.
    pub injected: Option<String>,
}

impl Logged {
    /// The value of one form field of the request (still URL-encoded), or
    /// `""` when absent.
    pub fn param(&self, key: &str) -> &str {
        form_value(&self.body, key)
    }
}

#[derive(Default)]
struct ProxyState {
    log: Mutex<Vec<Logged>>,
    blackholed: Mutex<HashSet<String>>,
    /// Destinations listed with `Origin` `CreateRouteTable`.
    stacked: Mutex<HashSet<String>>,
    /// Tables per `DescribeRouteTables` page (0: moto's single page).
    page_size: AtomicU64,
    throttle_every: AtomicU64,
    seen: AtomicU64,
    /// Errors still to answer, from [`Proxy::fail_next`].
    failing: Mutex<Option<Failing>>,
}

/// The error [`Proxy::fail_next`] answers, and how many more times.
struct Failing {
    remaining: u64,
    status: u16,
    code: String,
}

/// A poisoned lock only means another request handler panicked; the data
/// (a log, a set) is still consistent.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Forwards to moto; answers every n-th request with EC2's throttling error;
/// shows routes to chosen instances as blackholes. Stops accepting
/// connections when dropped.
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

/// EC2's answer when an action's request budget is exhausted.
pub const THROTTLE_XML: &str = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error><Code>RequestLimitExceeded</Code><Message>Request limit exceeded.</Message></Error></Errors><RequestID>00000000-0000-0000-0000-000000000000</RequestID></Response>";

impl Proxy {
    /// Listens on a free loopback port and forwards to `upstream`
    /// (`http://ip:port`, as [`super::moto_endpoint`] returns it).
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
        let st = state.clone();
        let accept = tokio::spawn(async move {
            loop {
                let Ok((conn, _)) = listener.accept().await else {
                    return;
                };
                let st = st.clone();
                tokio::spawn(async move {
                    let svc =
                        hyper::service::service_fn(move |req| handle(st.clone(), upstream, req));
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

    /// The endpoint clients should use instead of moto's.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every request so far, in arrival order.
    pub fn log(&self) -> Vec<Logged> {
        lock(&self.state.log).clone()
    }

    /// From now on, routes to `destination` are listed with `Origin`
    /// `CreateRouteTable`, as EC2 lists routes a CloudFormation or Terraform
    /// table definition made (moto gives that origin only to the local
    /// route).
    pub fn as_table_route(&self, destination: &str) {
        lock(&self.state.stacked).insert(destination.to_string());
    }

    /// From now on, routes to `instance` are listed as blackholes.
    pub fn blackhole(&self, instance: &str) {
        lock(&self.state.blackholed).insert(instance.to_string());
    }

    /// Routes to `instance` are listed as moto reports them again.
    pub fn unblackhole(&self, instance: &str) {
        lock(&self.state.blackholed).remove(instance);
    }

    /// Answers the next `n` requests with EC2 error `code` and HTTP `status`
    /// instead of forwarding them (before any throttling); replaces earlier
    /// pending failures, and `n = 0` clears them.
    pub fn fail_next(&self, n: u64, status: u16, code: &str) {
        *lock(&self.state.failing) = (n > 0).then(|| Failing {
            remaining: n,
            status,
            code: code.to_string(),
        });
    }

    /// From now on, answers a `DescribeRouteTables` that sends `MaxResults`
    /// with at most `n` tables and a `NextToken` for the rest, as EC2 pages
    /// (moto answers every table at once); 0 stops paging.
    pub fn page_route_tables(&self, n: u64) {
        self.state.page_size.store(n, Ordering::SeqCst);
    }

    /// Throttles every `n`-th request from now on, counting from this call;
    /// 0 stops throttling.
    pub fn throttle_every(&self, n: u64) {
        self.state.seen.store(0, Ordering::SeqCst);
        self.state.throttle_every.store(n, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

fn form_value<'a>(body: &'a str, key: &str) -> &'a str {
    body.split('&')
        .find_map(|kv| kv.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
        .unwrap_or("")
}

async fn handle(
    st: Arc<ProxyState>,
    upstream: SocketAddr,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let text = String::from_utf8_lossy(&body).to_string();
    let action = form_value(&text, "Action").to_string();
    let page_size = st.page_size.load(Ordering::SeqCst);
    // The page asked for: `NextToken=page-<i>`, else the first.
    let page = (action == "DescribeRouteTables"
        && page_size > 0
        && !form_value(&text, "MaxResults").is_empty())
    .then(|| {
        form_value(&text, "NextToken")
            .strip_prefix("page-")
            .and_then(|i| i.parse::<usize>().ok())
            .unwrap_or(0)
    });
    let injected = {
        let mut failing = lock(&st.failing);
        let answer = failing.as_mut().map(|f| {
            f.remaining -= 1;
            (f.status, f.code.clone())
        });
        if failing.as_ref().is_some_and(|f| f.remaining == 0) {
            *failing = None;
        }
        answer
    };
    let every = st.throttle_every.load(Ordering::SeqCst);
    let n = st.seen.fetch_add(1, Ordering::SeqCst) + 1;
    let throttle = injected.is_none() && every > 0 && n.is_multiple_of(every);
    lock(&st.log).push(Logged {
        action: action.clone(),
        body: text,
        at: Instant::now(),
        throttled: throttle
            || injected
                .as_ref()
                .is_some_and(|(_, c)| c == "RequestLimitExceeded"),
        injected: injected.as_ref().map(|(_, c)| c.clone()),
    });
    if let Some((status, code)) = injected {
        let mut resp = Response::new(Full::new(Bytes::from(error_xml(&code))));
        *resp.status_mut() =
            StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        resp.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static("text/xml"),
        );
        return Ok(resp);
    }
    if throttle {
        let mut resp = Response::new(Full::new(Bytes::from_static(THROTTLE_XML.as_bytes())));
        *resp.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
        resp.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static("text/xml"),
        );
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
    let blackholed = lock(&st.blackholed).clone();
    let stacked = lock(&st.stacked).clone();
    let bytes = if action == "DescribeRouteTables" && !blackholed.is_empty() {
        Bytes::from(mark_blackholes(
            &String::from_utf8_lossy(&bytes),
            &blackholed,
        ))
    } else {
        bytes
    };
    let bytes = if action == "DescribeRouteTables" && !stacked.is_empty() {
        Bytes::from(mark_table_routes(
            &String::from_utf8_lossy(&bytes),
            &stacked,
        ))
    } else {
        bytes
    };
    let bytes = match page {
        Some(i) => Bytes::from(page_of(
            &String::from_utf8_lossy(&bytes),
            i,
            usize::try_from(page_size).unwrap_or(usize::MAX),
        )),
        None => bytes,
    };
    Ok(Response::from_parts(parts, Full::new(bytes)))
}

/// EC2's XML error body for `code`, shaped like [`THROTTLE_XML`].
fn error_xml(code: &str) -> String {
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error><Code>{code}</Code><Message>injected by the test proxy</Message></Error></Errors><RequestID>00000000-0000-0000-0000-000000000000</RequestID></Response>"
    )
}

fn bad_gateway() -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::new()));
    *resp.status_mut() = StatusCode::BAD_GATEWAY;
    resp
}

/// Sets `<state>blackhole</state>` on every route item naming a dead instance.
fn mark_blackholes(xml: &str, dead: &HashSet<String>) -> String {
    let mut out = xml.to_string();
    for id in dead {
        let needle = format!("<instanceId>{id}</instanceId>");
        let mut from = 0;
        while let Some(pos) = out[from..].find(&needle).map(|p| p + from) {
            let start = out[..pos].rfind("<item>").unwrap_or(0);
            let end = out[pos..]
                .find("</item>")
                .map(|e| e + pos)
                .unwrap_or(out.len());
            let item = out[start..end].replace("<state>active</state>", "<state>blackhole</state>");
            out.replace_range(start..end, &item);
            // Past the needle at least, so an item without an end tag cannot
            // be matched again.
            from = (start + item.len()).max(pos + needle.len());
        }
    }
    out
}

/// Keeps page `page` (of `size` tables) of a `DescribeRouteTables` answer
/// and adds `<nextToken>page-<page+1></nextToken>` when more follow.
fn page_of(xml: &str, page: usize, size: usize) -> String {
    let (Some(open), Some(close)) = (xml.find("<routeTableSet>"), xml.rfind("</routeTableSet>"))
    else {
        return xml.to_string();
    };
    let inner_start = open + "<routeTableSet>".len();
    let inner = &xml[inner_start..close];
    // The top-level items: depth-counted, since tables hold items too.
    let mut tables: Vec<&str> = Vec::new();
    let (mut depth, mut start, mut at) = (0usize, 0usize, 0usize);
    while at < inner.len() {
        if inner[at..].starts_with("<item>") {
            if depth == 0 {
                start = at;
            }
            depth += 1;
            at += "<item>".len();
        } else if inner[at..].starts_with("</item>") {
            depth = depth.saturating_sub(1);
            at += "</item>".len();
            if depth == 0 {
                tables.push(&inner[start..at]);
            }
        } else {
            at += inner[at..].chars().next().map_or(1, char::len_utf8);
        }
    }
    let from = page.saturating_mul(size).min(tables.len());
    let to = from.saturating_add(size).min(tables.len());
    let mut out = String::with_capacity(xml.len());
    out.push_str(&xml[..inner_start]);
    for t in &tables[from..to] {
        out.push_str(t);
    }
    out.push_str("</routeTableSet>");
    if to < tables.len() {
        out.push_str(&format!("<nextToken>page-{}</nextToken>", page + 1));
    }
    out.push_str(&xml[close + "</routeTableSet>".len()..]);
    out
}

/// Sets `<origin>CreateRouteTable</origin>` on every route item to one of
/// `destinations` (adding the element where the item has none).
fn mark_table_routes(xml: &str, destinations: &HashSet<String>) -> String {
    let mut out = xml.to_string();
    for d in destinations {
        let needle = format!("<destinationCidrBlock>{d}</destinationCidrBlock>");
        let mut from = 0;
        while let Some(pos) = out[from..].find(&needle).map(|p| p + from) {
            let start = out[..pos].rfind("<item>").unwrap_or(0);
            let Some(end) = out[pos..].find("</item>").map(|e| e + pos) else {
                break;
            };
            let old = &out[start..end];
            let item = if old.contains("<origin>") {
                old.replace(
                    "<origin>CreateRoute</origin>",
                    "<origin>CreateRouteTable</origin>",
                )
            } else {
                format!("{old}<origin>CreateRouteTable</origin>")
            };
            out.replace_range(start..end, &item);
            from = (start + item.len()).max(pos + needle.len());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_split_top_level_tables_only() {
        let xml = "<R><routeTableSet><item><id>a</id><routeSet><item>r1</item></routeSet></item>\
                   <item><id>b</id></item><item><id>c</id></item></routeTableSet></R>";
        let p0 = page_of(xml, 0, 2);
        assert_eq!(
            p0,
            "<R><routeTableSet><item><id>a</id><routeSet><item>r1</item></routeSet></item><item><id>b</id></item></routeTableSet><nextToken>page-1</nextToken></R>"
        );
        let p1 = page_of(xml, 1, 2);
        assert_eq!(
            p1,
            "<R><routeTableSet><item><id>c</id></item></routeTableSet></R>"
        );
    }

    #[test]
    fn marks_only_the_named_destinations_as_table_routes() {
        let xml = "<item><destinationCidrBlock>10.0.1.0/24</destinationCidrBlock><origin>CreateRoute</origin></item>\
                   <item><destinationCidrBlock>10.0.2.0/24</destinationCidrBlock></item>\
                   <item><destinationCidrBlock>10.0.3.0/24</destinationCidrBlock><origin>CreateRoute</origin></item>";
        let marked: HashSet<String> = ["10.0.1.0/24".to_string(), "10.0.2.0/24".to_string()].into();
        let out = mark_table_routes(xml, &marked);
        assert_eq!(
            out.matches("<origin>CreateRouteTable</origin>").count(),
            2,
            "{out}"
        );
        assert!(out.contains("10.0.3.0/24</destinationCidrBlock><origin>CreateRoute</origin>"));
    }

    #[test]
    fn marks_only_routes_to_dead_instances() {
        let xml = "<routeSet><item><destinationCidrBlock>10.0.0.0/24</destinationCidrBlock><instanceId>i-1</instanceId><state>active</state></item><item><destinationCidrBlock>10.0.1.0/24</destinationCidrBlock><instanceId>i-2</instanceId><state>active</state></item></routeSet>";
        let dead: HashSet<String> = ["i-2".to_string()].into();
        let out = mark_blackholes(xml, &dead);
        assert!(out.contains("<instanceId>i-1</instanceId><state>active</state>"));
        assert!(out.contains("<instanceId>i-2</instanceId><state>blackhole</state>"));
        // Malformed answers are left alone rather than looping or panicking.
        let broken = "<instanceId>i-2</instanceId><state>active</state>";
        assert_eq!(
            mark_blackholes(broken, &dead),
            "<instanceId>i-2</instanceId><state>blackhole</state>"
        );
    }

    #[test]
    fn reads_form_fields() {
        assert_eq!(
            form_value("Action=CreateRoute&InstanceId=i-1", "InstanceId"),
            "i-1"
        );
        assert_eq!(form_value("Action=CreateRoute", "InstanceId"), "");
    }
}
