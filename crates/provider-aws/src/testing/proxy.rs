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
//! Like EC2 and unlike moto, it refuses instance-level `CreateRoute`,
//! `ReplaceRoute` and source/destination-check changes on an instance with
//! several network interfaces (`InvalidInstanceID`, HTTP 400), and
//! [`Proxy::stop_instance`] makes it refuse `CreateRoute` and `ReplaceRoute`
//! to an instance EC2 would refuse them to because it is stopped or
//! terminated (`IncorrectInstanceState`, HTTP 400). moto has no route
//! limit; [`Proxy::limit_routes`] refuses a `CreateRoute` to a table that
//! already holds that many created routes with `RouteLimitExceeded`
//! (HTTP 400), as EC2 does past the routes-per-table quota.
//! Everything else is forwarded unchanged, one upstream connection per
//! request (the serving and forwarding plumbing is the `test-server`
//! crate's).
//!
//! For benchmarks it can also stand in for EC2's request limits, each off
//! until switched on, so functional tests see moto's behaviour:
//! [`Proxy::enforce_buckets`] keeps EC2's documented per-action token
//! buckets ([`Buckets::EC2`]) and answers `RequestLimitExceeded` when the
//! action's bucket is empty, [`Proxy::set_latency`] delays every answer, and
//! [`Proxy::counts`] reads per-action request, throttle and error counters
//! and the time of each action's last successful answer.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::Full;
use hyper::Request;
use hyper::body::{Bytes, Incoming};
use test_server::proxy::{self as plumbing, Answer, FailNext, bad_gateway};
use test_server::{Listener, TestServer, lock};

/// One request as the proxy saw it.
#[derive(Debug, Clone)]
pub struct Logged {
    /// The query API action (`Action=` of the form body), empty if none.
    pub action: String,
    /// The whole form-encoded request body.
    pub body: String,
    /// The request's headers, as the client sent them.
    pub headers: hyper::HeaderMap,
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
    /// Instances routes to which are refused (`IncorrectInstanceState`).
    stopped: Mutex<HashSet<String>>,
    /// Destinations listed with `Origin` `CreateRouteTable`.
    stacked: Mutex<HashSet<String>>,
    /// Tables per `DescribeRouteTables` page (0: moto's single page).
    page_size: AtomicU64,
    throttle_every: AtomicU64,
    seen: AtomicU64,
    /// Errors still to answer, from [`Proxy::fail_next`].
    failing: Mutex<FailNext>,
    /// EC2's request buckets, when enforced.
    buckets: Mutex<Option<ActionBuckets>>,
    /// Added to every answer, in microseconds.
    latency_us: AtomicU64,
    /// Per-action counters (the key is [`bucket_key`]'s).
    counts: Mutex<BTreeMap<String, ActionCount>>,
    /// Routes per table before `CreateRoute` is refused (0: no limit).
    route_limit: AtomicU64,
    /// Held from counting a table's routes to moto's answer to the
    /// `CreateRoute`, so concurrent creations cannot pass the limit together.
    creating: tokio::sync::Mutex<()>,
}

/// One token bucket: `burst` tokens at most, refilled at `per_second`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bucket {
    /// Requests that may go out at once after a quiet period.
    pub burst: f64,
    /// Tokens added per second.
    pub per_second: f64,
}

/// The buckets of each class of action. EC2 keeps one bucket per account,
/// region and action; every action of a class gets a bucket of that size.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Buckets {
    /// Actions that change something (everything not `Describe*`, `Get*`,
    /// `List*` or `Search*`): `CreateRoute`, `DeleteRoute`,
    /// `ModifyInstanceAttribute`, ...
    pub mutating: Bucket,
    /// `Describe*`, `Get*`, `List*`, `Search*`.
    pub non_mutating: Bucket,
    /// `DescribeInstances` with neither a filter nor instance ids: a bucket
    /// of its own, apart from the filtered `DescribeInstances`.
    pub unfiltered_describe_instances: Bucket,
}

impl Buckets {
    /// EC2's documented defaults ("Request throttling for the Amazon EC2
    /// API"): mutating 50 / 5 per s, non-mutating 100 / 20 per s,
    /// unfiltered and unpaginated `DescribeInstances` 50 / 10 per s.
    pub const EC2: Buckets = Buckets {
        mutating: Bucket {
            burst: 50.0,
            per_second: 5.0,
        },
        non_mutating: Bucket {
            burst: 100.0,
            per_second: 20.0,
        },
        unfiltered_describe_instances: Bucket {
            burst: 50.0,
            per_second: 10.0,
        },
    };

    /// The size of the bucket `key` ([`bucket_key`]) draws from.
    pub fn for_key(&self, key: &str) -> Bucket {
        if key == UNFILTERED_DESCRIBE_INSTANCES {
            self.unfiltered_describe_instances
        } else if is_mutating(key) {
            self.mutating
        } else {
            self.non_mutating
        }
    }
}

/// The counter and bucket key of an unfiltered `DescribeInstances`.
pub const UNFILTERED_DESCRIBE_INSTANCES: &str = "DescribeInstances(unfiltered)";

/// Whether EC2 counts `action` as mutating.
pub fn is_mutating(action: &str) -> bool {
    !["Describe", "Get", "List", "Search"]
        .iter()
        .any(|p| action.starts_with(p))
}

/// The bucket (and counter) a request draws from: its action, except that
/// a `DescribeInstances` with no `Filter.*` and no `InstanceId.*` field has
/// a bucket of its own.
pub fn bucket_key(action: &str, body: &str) -> String {
    if action == "DescribeInstances"
        && !body
            .split('&')
            .any(|kv| kv.starts_with("Filter.") || kv.starts_with("InstanceId."))
    {
        return UNFILTERED_DESCRIBE_INSTANCES.to_string();
    }
    action.to_string()
}

/// A token bucket on an injected clock: the caller says what time it is.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    size: Bucket,
    tokens: f64,
    at: Instant,
}

impl TokenBucket {
    /// A full bucket at `now`.
    pub fn new(size: Bucket, now: Instant) -> Self {
        Self {
            size,
            tokens: size.burst,
            at: now,
        }
    }

    /// Takes one token if there is one at `now`; a time before the last
    /// one seen counts as no time passed.
    pub fn try_take(&mut self, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.at = self.at.max(now);
        self.tokens = (self.tokens + elapsed * self.size.per_second).min(self.size.burst);
        // A hair under 1 still counts: refills are fractional and a token
        // due at exactly `now` must not be lost to rounding.
        if self.tokens >= 1.0 - 1e-9 {
            self.tokens = (self.tokens - 1.0).max(0.0);
            true
        } else {
            false
        }
    }
}

/// One bucket per key, created full on first use.
#[derive(Debug)]
struct ActionBuckets {
    sizes: Buckets,
    buckets: HashMap<String, TokenBucket>,
}

impl ActionBuckets {
    fn try_take(&mut self, key: &str, now: Instant) -> bool {
        let size = self.sizes.for_key(key);
        self.buckets
            .entry(key.to_string())
            .or_insert_with(|| TokenBucket::new(size, now))
            .try_take(now)
    }
}

/// What the proxy counted for one action (see [`bucket_key`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ActionCount {
    /// Requests received, answered in any way.
    pub requests: u64,
    /// Answered `RequestLimitExceeded` by the proxy (bucket empty,
    /// [`Proxy::throttle_every`] or an injected `RequestLimitExceeded`).
    pub throttled: u64,
    /// Forwarded and answered with an error status by moto, or not at all.
    pub errors: u64,
    /// When the last answer with a 2xx status left the proxy.
    pub last_ok: Option<Instant>,
}

/// Forwards to moto; answers every n-th request with EC2's throttling error;
/// shows routes to chosen instances as blackholes. Stops accepting
/// connections when dropped.
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

/// EC2's answer when an action's request budget is exhausted.
pub const THROTTLE_XML: &str = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error><Code>RequestLimitExceeded</Code><Message>Request limit exceeded.</Message></Error></Errors><RequestID>00000000-0000-0000-0000-000000000000</RequestID></Response>";

impl Proxy {
    /// Listens on a free loopback port and forwards to `upstream`
    /// (`http://ip:port`, as [`super::moto_endpoint`] returns it).
    pub async fn start(upstream: &str) -> Result<Self, String> {
        let upstream = plumbing::upstream_addr(upstream)?;
        let listener = Listener::bind()
            .await
            .map_err(|e| format!("binding the proxy: {e}"))?;
        let state = Arc::new(ProxyState::default());
        let st = state.clone();
        let server = listener.serve_hyper(move |req| handle(st.clone(), upstream, req));
        Ok(Self { state, server })
    }

    /// The endpoint clients should use instead of moto's.
    pub fn url(&self) -> String {
        self.server.url()
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

    /// From now on, `CreateRoute` and `ReplaceRoute` naming `instance` are
    /// refused with `IncorrectInstanceState`, as EC2 refuses routes to a
    /// stopped or terminated instance, and routes to it list as blackholes.
    pub fn stop_instance(&self, instance: &str) {
        lock(&self.state.stopped).insert(instance.to_string());
        self.blackhole(instance);
    }

    /// Routes to `instance` are listed as moto reports them again.
    pub fn unblackhole(&self, instance: &str) {
        lock(&self.state.blackholed).remove(instance);
    }

    /// Answers the next `n` requests with EC2 error `code` and HTTP `status`
    /// instead of forwarding them (before any throttling); replaces earlier
    /// pending failures, and `n = 0` clears them.
    pub fn fail_next(&self, n: u64, status: u16, code: &str) {
        lock(&self.state.failing).set(n, status, code);
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

    /// Enforces `buckets` from now on, every bucket full; `None` stops.
    /// A request finding its bucket empty is answered `RequestLimitExceeded`
    /// (HTTP 503) and takes no token.
    pub fn enforce_buckets(&self, buckets: Option<Buckets>) {
        *lock(&self.state.buckets) = buckets.map(|sizes| ActionBuckets {
            sizes,
            buckets: HashMap::new(),
        });
    }

    /// Delays every answer (forwarded or not) by `latency` from now on.
    pub fn set_latency(&self, latency: Duration) {
        self.state.latency_us.store(
            u64::try_from(latency.as_micros()).unwrap_or(u64::MAX),
            Ordering::SeqCst,
        );
    }

    /// The counters per action ([`bucket_key`]) so far.
    pub fn counts(&self) -> BTreeMap<String, ActionCount> {
        lock(&self.state.counts).clone()
    }

    /// Sets every counter back to zero.
    pub fn reset_counts(&self) {
        lock(&self.state.counts).clear();
    }

    /// From now on, refuses a `CreateRoute` to a table that already holds
    /// `n` non-propagated routes (origin `CreateRoute` or the local route's
    /// `CreateRouteTable`, as moto lists them) with
    /// `RouteLimitExceeded` (HTTP 400), as EC2 refuses one past the
    /// routes-per-table quota; 0 lifts the limit. Creations are then
    /// forwarded one at a time, so concurrent ones cannot pass it together.
    pub fn limit_routes(&self, n: u64) {
        self.state.route_limit.store(n, Ordering::SeqCst);
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
) -> Result<Answer, Infallible> {
    let (parts, body) = req.into_parts();
    let body = plumbing::collect(body).await.unwrap_or_default();
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
    let injected = lock(&st.failing).take();
    let every = st.throttle_every.load(Ordering::SeqCst);
    let n = st.seen.fetch_add(1, Ordering::SeqCst) + 1;
    let key = bucket_key(&action, &text);
    let throttle = injected.is_none()
        && ((every > 0 && n.is_multiple_of(every))
            || lock(&st.buckets)
                .as_mut()
                .is_some_and(|b| !b.try_take(&key, Instant::now())));
    let throttled = throttle
        || injected
            .as_ref()
            .is_some_and(|(_, c)| c == "RequestLimitExceeded");
    lock(&st.log).push(Logged {
        action: action.clone(),
        body: text,
        headers: parts.headers.clone(),
        at: Instant::now(),
        throttled,
        injected: injected.as_ref().map(|(_, c)| c.clone()),
    });
    let latency = Duration::from_micros(st.latency_us.load(Ordering::SeqCst));
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    let resp = answer(
        &st, upstream, parts, body, &action, page, page_size, injected, throttle,
    )
    .await;
    let mut counts = lock(&st.counts);
    let c = counts.entry(key).or_default();
    c.requests += 1;
    if throttled {
        c.throttled += 1;
    } else if resp.status().is_success() {
        c.last_ok = Some(Instant::now());
    } else {
        c.errors += 1;
    }
    drop(counts);
    Ok(resp)
}

/// The answer to one request: injected, throttled or moto's (rewritten).
#[expect(
    clippy::too_many_arguments,
    reason = "one request's parsed parts, passed once"
)]
async fn answer(
    st: &ProxyState,
    upstream: SocketAddr,
    parts: hyper::http::request::Parts,
    body: Bytes,
    action: &str,
    page: Option<usize>,
    page_size: u64,
    injected: Option<(u16, String)>,
    throttle: bool,
) -> Answer {
    if let Some((status, code)) = injected {
        return plumbing::reply(status, "text/xml", error_xml(&code));
    }
    if throttle {
        return plumbing::reply(503, "text/xml", THROTTLE_XML);
    }
    let instance = form_value(&String::from_utf8_lossy(&body), "InstanceId").to_string();
    if matches!(action, "CreateRoute" | "ReplaceRoute") && lock(&st.stopped).contains(&instance) {
        return plumbing::reply(
            400,
            "text/xml",
            format!(
                "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error><Code>IncorrectInstanceState</Code><Message>The instance '{instance}' is not in a state from which it can be used as a route target.</Message></Error></Errors><RequestID>00000000-0000-0000-0000-000000000000</RequestID></Response>"
            ),
        );
    }
    if let Some(instance) = needs_a_single_interface(action, &String::from_utf8_lossy(&body))
        && interfaces_of(upstream, &parts, &instance).await > 1
    {
        return plumbing::reply(400, "text/xml", multiple_interfaces_xml(&instance));
    }
    let limit = st.route_limit.load(Ordering::SeqCst);
    let _creating = if action == "CreateRoute" && limit > 0 {
        let guard = st.creating.lock().await;
        let table = form_value(&String::from_utf8_lossy(&body), "RouteTableId").to_string();
        if routes_in(upstream, &parts, &table).await >= limit {
            return plumbing::reply(400, "text/xml", route_limit_xml(&table, limit));
        }
        Some(guard)
    } else {
        None
    };
    let Some((mut parts, bytes)) = send(upstream, plumbing::resend(parts, body)).await else {
        return bad_gateway();
    };
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
    plumbing::pass_back(parts, bytes)
}

/// Sends one request to moto on a connection of its own; `None` when moto
/// gives no whole answer.
async fn send(
    upstream: SocketAddr,
    req: Request<Full<Bytes>>,
) -> Option<(hyper::http::response::Parts, Bytes)> {
    let (parts, body) = plumbing::send(upstream, req).await?.into_parts();
    let bytes = plumbing::collect(body).await?;
    Some((parts, bytes))
}

/// The instance a request names where EC2 insists on exactly one attached
/// network interface: `CreateRoute` / `ReplaceRoute` with `InstanceId`, and
/// `ModifyInstanceAttribute` of `SourceDestCheck` (EC2 API reference,
/// CreateRoute: "The operation fails if you specify an instance ID unless
/// exactly one network interface is attached"; for the attribute EC2 answers
/// the same `InvalidInstanceID`). moto accepts both on any instance.
fn needs_a_single_interface(action: &str, body: &str) -> Option<String> {
    let instance = form_value(body, "InstanceId");
    let applies = match action {
        "CreateRoute" | "ReplaceRoute" => true,
        "ModifyInstanceAttribute" => !form_value(body, "SourceDestCheck.Value").is_empty(),
        _ => false,
    };
    (applies && !instance.is_empty()).then(|| instance.to_string())
}

/// How many network interfaces moto shows attached to `instance`, asked
/// with the client's own headers (moto takes account and region from
/// them); the question is not logged or counted. 0 when moto cannot say,
/// so the request goes on to moto, which answers for itself.
async fn interfaces_of(
    upstream: SocketAddr,
    like: &hyper::http::request::Parts,
    instance: &str,
) -> usize {
    let mut req = Request::new(Full::new(Bytes::from(format!(
        "Action=DescribeInstances&Version=2016-11-15&InstanceId.1={instance}"
    ))));
    *req.method_mut() = like.method.clone();
    *req.uri_mut() = like.uri.clone();
    *req.headers_mut() = like.headers.clone();
    req.headers_mut().remove("content-length");
    match send(upstream, req).await {
        Some((parts, bytes)) if parts.status.is_success() => String::from_utf8_lossy(&bytes)
            .matches("<networkInterfaceId>")
            .count(),
        _ => 0,
    }
}

/// How many routes with origin `CreateRoute` moto lists in `table`, asked
/// like [`interfaces_of`]; 0 when moto cannot say.
async fn routes_in(upstream: SocketAddr, like: &hyper::http::request::Parts, table: &str) -> u64 {
    let mut req = Request::new(Full::new(Bytes::from(format!(
        "Action=DescribeRouteTables&Version=2016-11-15&RouteTableId.1={table}"
    ))));
    *req.method_mut() = like.method.clone();
    *req.uri_mut() = like.uri.clone();
    *req.headers_mut() = like.headers.clone();
    req.headers_mut().remove("content-length");
    match send(upstream, req).await {
        // As EC2's quota counts: every route but the propagated ones, the
        // table's local route (origin CreateRouteTable) included.
        Some((parts, bytes)) if parts.status.is_success() => {
            let text = String::from_utf8_lossy(&bytes);
            (text.matches("<origin>CreateRoute</origin>").count()
                + text.matches("<origin>CreateRouteTable</origin>").count()) as u64
        }
        _ => 0,
    }
}

/// EC2's answer to a `CreateRoute` past the routes-per-table quota.
fn route_limit_xml(table: &str, limit: u64) -> String {
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error><Code>RouteLimitExceeded</Code><Message>The maximum number of routes ({limit}) has been reached for route table {table}.</Message></Error></Errors><RequestID>00000000-0000-0000-0000-000000000000</RequestID></Response>"
    )
}

/// EC2's answer to an instance-level request on a multi-NIC instance.
fn multiple_interfaces_xml(instance: &str) -> String {
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error><Code>InvalidInstanceID</Code><Message>There are multiple interfaces attached to instance '{instance}'. Please specify an interface ID for the operation instead.</Message></Error></Errors><RequestID>00000000-0000-0000-0000-000000000000</RequestID></Response>"
    )
}

/// EC2's XML error body for `code`, shaped like [`THROTTLE_XML`].
fn error_xml(code: &str) -> String {
    // EC2's own words where a test reads them back (a condition quoting
    // the refusal); any other code says where it came from.
    let message = match code {
        "UnauthorizedOperation" => "You are not authorized to perform this operation.",
        "ServiceUnavailable" => "The service is unavailable. Please try again shortly.",
        _ => "injected by the test proxy",
    };
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error><Code>{code}</Code><Message>{message}</Message></Error></Errors><RequestID>00000000-0000-0000-0000-000000000000</RequestID></Response>"
    )
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
    use tokio::net::{TcpListener, TcpStream};

    use super::*;

    /// Tokens granted at each whole second of a one-request-per-millisecond
    /// stream, on an injected clock.
    fn granted_per_second(size: Bucket, seconds: u64) -> Vec<u32> {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(size, t0);
        (0..seconds)
            .map(|s| {
                (0..1000)
                    .filter(|ms| b.try_take(t0 + Duration::from_millis(s * 1000 + ms)))
                    .count() as u32
            })
            .collect()
    }

    #[test]
    fn mutating_bucket_gives_its_burst_then_five_per_second() {
        let got = granted_per_second(Buckets::EC2.mutating, 4);
        // The first second: the burst of 50 plus the 5 refilled meanwhile
        // (less the fraction not yet due when the burst ran out).
        assert!((54..=55).contains(&got[0]), "{got:?}");
        assert_eq!(got[1..], [5, 5, 5]);
    }

    #[test]
    fn unfiltered_describe_instances_refills_at_ten_and_non_mutating_at_twenty() {
        let un = granted_per_second(Buckets::EC2.unfiltered_describe_instances, 3);
        assert_eq!(un[1..], [10, 10]);
        let nm = granted_per_second(Buckets::EC2.non_mutating, 3);
        assert!((119..=120).contains(&nm[0]), "{nm:?}");
        assert_eq!(nm[1..], [20, 20]);
    }

    #[test]
    fn an_idle_bucket_refills_to_its_burst_and_no_more() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(Buckets::EC2.mutating, t0);
        assert_eq!((0..60).filter(|_| b.try_take(t0)).count(), 50);
        // An hour later: full again, never more than the burst.
        let later = t0 + Duration::from_secs(3600);
        assert_eq!((0..60).filter(|_| b.try_take(later)).count(), 50);
        // A clock that goes back adds nothing.
        assert!(!b.try_take(t0));
    }

    #[test]
    fn buckets_are_per_action_and_unfiltered_describe_instances_apart() {
        let t0 = Instant::now();
        let mut a = ActionBuckets {
            sizes: Buckets::EC2,
            buckets: HashMap::new(),
        };
        assert_eq!(
            (0..60).filter(|_| a.try_take("CreateRoute", t0)).count(),
            50
        );
        // Another mutating action has a full bucket of its own.
        assert_eq!(
            (0..60)
                .filter(|_| a.try_take("ModifyInstanceAttribute", t0))
                .count(),
            50
        );
        assert_eq!(
            (0..150)
                .filter(|_| a.try_take("DescribeRouteTables", t0))
                .count(),
            100
        );
        assert_eq!(
            (0..60)
                .filter(|_| a.try_take(UNFILTERED_DESCRIBE_INSTANCES, t0))
                .count(),
            50
        );
        assert_eq!(
            (0..150)
                .filter(|_| a.try_take("DescribeInstances", t0))
                .count(),
            100
        );
    }

    /// Sends one form request to the proxy; returns the status and body.
    async fn post(url: &str, form: &str) -> (u16, String) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let addr = url.trim_start_matches("http://");
        let mut s = TcpStream::connect(addr)
            .await
            .expect("connect to the proxy");
        let req = format!(
            "POST / HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{form}",
            form.len()
        );
        s.write_all(req.as_bytes()).await.expect("send");
        let mut out = String::new();
        s.read_to_string(&mut out).await.expect("read");
        let status = out
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        (status, out)
    }

    #[tokio::test]
    async fn an_empty_bucket_answers_request_limit_exceeded_and_counts_it() {
        // An upstream that refuses connections: forwarded requests fail
        // (502), throttled ones never reach it.
        let closed = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let upstream = format!("http://{}", closed.local_addr().expect("addr"));
        drop(closed);
        let proxy = Proxy::start(&upstream).await.expect("proxy");
        let tiny = Bucket {
            burst: 2.0,
            per_second: 0.001,
        };
        proxy.enforce_buckets(Some(Buckets {
            mutating: tiny,
            non_mutating: tiny,
            unfiltered_describe_instances: tiny,
        }));
        let mut statuses = Vec::new();
        for _ in 0..3 {
            statuses.push(post(&proxy.url(), "Action=CreateRoute").await);
        }
        assert_eq!(statuses[0].0, 502);
        assert_eq!(statuses[1].0, 502);
        assert_eq!(statuses[2].0, 503);
        assert!(statuses[2].1.contains("<Code>RequestLimitExceeded</Code>"));
        // Another action has a bucket of its own.
        assert_eq!(post(&proxy.url(), "Action=DeleteRoute").await.0, 502);
        let c = proxy.counts();
        let create = &c["CreateRoute"];
        assert_eq!(
            (create.requests, create.throttled, create.errors),
            (3, 1, 2)
        );
        assert_eq!(create.last_ok, None);
        assert_eq!(c["DeleteRoute"].requests, 1);
        // Off again: nothing is throttled.
        proxy.enforce_buckets(None);
        assert_eq!(post(&proxy.url(), "Action=CreateRoute").await.0, 502);
        proxy.reset_counts();
        assert!(proxy.counts().is_empty());
    }

    #[test]
    fn classifies_actions_and_unfiltered_describe_instances() {
        assert!(is_mutating("CreateRoute") && is_mutating("ModifyInstanceAttribute"));
        assert!(!is_mutating("DescribeRouteTables") && !is_mutating("GetConsoleOutput"));
        assert_eq!(
            bucket_key(
                "DescribeInstances",
                "Action=DescribeInstances&Version=2016-11-15"
            ),
            UNFILTERED_DESCRIBE_INSTANCES
        );
        assert_eq!(
            bucket_key(
                "DescribeInstances",
                "Action=DescribeInstances&Filter.1.Name=instance-id&Filter.1.Value.1=i-1"
            ),
            "DescribeInstances"
        );
        assert_eq!(
            bucket_key(
                "DescribeInstances",
                "Action=DescribeInstances&InstanceId.1=i-1"
            ),
            "DescribeInstances"
        );
        assert_eq!(
            bucket_key("CreateRoute", "Action=CreateRoute"),
            "CreateRoute"
        );
    }

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
    fn only_instance_level_routes_and_source_dest_checks_need_a_single_interface() {
        let cases = [
            (
                "CreateRoute",
                "Action=CreateRoute&InstanceId=i-1",
                Some("i-1"),
            ),
            (
                "ReplaceRoute",
                "Action=ReplaceRoute&InstanceId=i-2",
                Some("i-2"),
            ),
            (
                "CreateRoute",
                "Action=CreateRoute&NetworkInterfaceId=eni-1",
                None,
            ),
            (
                "ModifyInstanceAttribute",
                "Action=ModifyInstanceAttribute&InstanceId=i-3&SourceDestCheck.Value=false",
                Some("i-3"),
            ),
            (
                "ModifyInstanceAttribute",
                "Action=ModifyInstanceAttribute&InstanceId=i-4&DisableApiTermination.Value=true",
                None,
            ),
            ("DeleteRoute", "Action=DeleteRoute&InstanceId=i-5", None),
        ];
        for (action, body, want) in cases {
            assert_eq!(
                needs_a_single_interface(action, body).as_deref(),
                want,
                "{body}"
            );
        }
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
