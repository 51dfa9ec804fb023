//! A stateful fake of the parts of the Hetzner Cloud API that network routes
//! use, written from the public API documentation (feature `testing`).
//!
//! It serves, under `/v1`: `GET /networks/{id}`, `GET /networks?name=`,
//! `POST /networks/{id}/actions/add_route` and `.../delete_route`,
//! `GET /actions/{id}`, `GET /actions?id=…` (what hcloud-go's action waiter
//! polls), `GET /servers` (paged, `name=` filter) and `GET /servers/{id}`.
//! It keeps what the real API enforces and a route controller can trip over:
//!
//! - a Bearer token check (`401 unauthorized`);
//! - a project budget, when `enforce_budget` is set (off by default, so
//!   functional tests see the API without its limit): a bucket of
//!   `rate_limit` requests refilled at `refill_per_second`, and
//!   `429 rate_limit_exceeded` when empty (every request counts,
//!   authenticated or not). `RateLimit-Limit`, `RateLimit-Remaining` and
//!   `RateLimit-Reset` come on every answer either way (unenforced, the
//!   bucket stays full); `RateLimit-Reset` is the UNIX time at which the
//!   bucket is full again, on the fake's own clock (wall time at start plus
//!   the tokio clock since, so a paused clock moves it too);
//! - other users of the same project (`other_clients_per_hour`, off by
//!   default): a simulated client spending that many requests an hour of the
//!   same budget, evenly, which Hetzner's per-project limit makes every
//!   controller share with the CSI driver, the autoscaler and Terraform;
//! - actions that run for `action_duration` and are serialised per network (a
//!   second one meanwhile is answered `409 conflict`, or `423 locked`); a
//!   route appears or disappears when its action finishes;
//! - the route rules: IPv4 only, the gateway inside the network's range and
//!   not its first address, no destination overlapping a subnet, one route per
//!   destination (`409 uniqueness_error`), at most `max_routes`
//!   (`403 resource_limit_exceeded`).
//!
//! Tests start it on `127.0.0.1:0` with [`FakeHcloud::start`], point the
//! provider's `endpoint` at [`FakeHcloud::base_url`] and read its counters.
//! Test hooks edit the state directly (no request is counted for them).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::Response;
use route_core::cidr::parse_ip_sloppy;
use route_core::{Cidr, IpFamily};
use serde_json::{Value, json};
use test_server::{Answers, Injections, Listener, TestServer};
use tokio::time::Instant;

/// How the fake answers a second action on a busy network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockAnswer {
    /// `409 conflict`, as documented for network actions.
    Conflict,
    /// `423 locked`.
    Locked,
}

/// Settings of the fake.
#[derive(Debug, Clone)]
pub struct FakeConfig {
    /// The only token accepted.
    pub token: String,
    /// Whether the budget is spent and enforced (`429` when empty); off,
    /// every request is served and the headers show a full bucket.
    pub enforce_budget: bool,
    /// The budget (`RateLimit-Limit`) and the bucket's size.
    pub rate_limit: u32,
    /// How fast the budget refills (Hetzner: 1 per second).
    pub refill_per_second: f64,
    /// How long an action runs before it succeeds.
    pub action_duration: Duration,
    /// Routes per network.
    pub max_routes: usize,
    /// The answer to an action while another runs on the same network.
    pub lock_answer: LockAnswer,
    /// How long every answer takes.
    pub latency: Duration,
    /// Requests per hour another client of the project spends from the same
    /// budget, evenly over time (0, the default: none). While the bucket is
    /// empty the other client is refused too; its requests are counted in
    /// [`FakeHcloud::other_clients`], not in the answers.
    pub other_clients_per_hour: u32,
}

impl Default for FakeConfig {
    fn default() -> Self {
        Self {
            token: "fake-hcloud-token".into(),
            enforce_budget: false,
            rate_limit: 3600,
            refill_per_second: 1.0,
            action_duration: Duration::from_millis(20),
            max_routes: 100,
            lock_answer: LockAnswer::Conflict,
            latency: Duration::ZERO,
            other_clients_per_hour: 0,
        }
    }
}

#[derive(Debug, Clone)]
struct NetworkState {
    id: u64,
    name: String,
    ip_range: Cidr,
    subnets: Vec<Cidr>,
    routes: Vec<(Cidr, IpAddr)>,
}

#[derive(Debug, Clone)]
struct ServerState {
    id: u64,
    name: String,
    nets: Vec<(u64, IpAddr)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Change {
    Add(Cidr, IpAddr),
    Delete(Cidr, IpAddr),
    /// An action of another kind that only holds the network.
    Nothing,
}

#[derive(Debug, Clone)]
struct ActionState {
    id: u64,
    command: &'static str,
    network: u64,
    started: SystemTime,
    finishes: Instant,
    change: Change,
    /// Set when the action ends: `None` for success, the error code otherwise.
    outcome: Option<Option<String>>,
    fail_with: Option<String>,
}

#[derive(Debug)]
struct FakeState {
    config: FakeConfig,
    networks: BTreeMap<u64, NetworkState>,
    servers: BTreeMap<u64, ServerState>,
    actions: BTreeMap<u64, ActionState>,
    next_action: u64,
    tokens: f64,
    refilled: Instant,
    /// The fake's clock: UNIX seconds at `epoch_instant`.
    epoch_unix: f64,
    epoch_instant: Instant,
    /// Requests the simulated other clients made, and how many the budget refused.
    other_spent: f64,
    other_refused: f64,
    answers: Answers,
    injected: Injections,
    failing_actions: Vec<String>,
}

impl FakeState {
    /// Ends the actions whose time is up, applying their change.
    fn tick(&mut self, now: Instant) {
        for a in self.actions.values_mut() {
            if a.outcome.is_some() || a.finishes > now {
                continue;
            }
            if let Some(code) = a.fail_with.take() {
                a.outcome = Some(Some(code));
                continue;
            }
            if let Some(n) = self.networks.get_mut(&a.network) {
                match a.change {
                    Change::Add(d, g) => n.routes.push((d, g)),
                    Change::Delete(d, g) => n.routes.retain(|r| *r != (d, g)),
                    Change::Nothing => {}
                }
            }
            a.outcome = Some(None);
        }
    }

    fn busy(&self, network: u64) -> bool {
        self.actions
            .values()
            .any(|a| a.network == network && a.outcome.is_none())
    }

    fn new(config: FakeConfig, now: Instant, unix: f64) -> Self {
        Self {
            tokens: f64::from(config.rate_limit),
            config,
            networks: BTreeMap::new(),
            servers: BTreeMap::new(),
            actions: BTreeMap::new(),
            next_action: 1,
            refilled: now,
            epoch_unix: unix,
            epoch_instant: now,
            other_spent: 0.0,
            other_refused: 0.0,
            answers: Answers::default(),
            injected: Injections::default(),
            failing_actions: Vec::new(),
        }
    }

    /// Refills the bucket for the time since the last call and lets the
    /// simulated other clients spend their share of that time: both are
    /// even rates, so over `elapsed` the bucket gains `refill - other` per
    /// second until full, and the other clients are refused whatever an
    /// empty bucket cannot give them.
    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.refilled).as_secs_f64();
        self.refilled = now;
        let limit = f64::from(self.config.rate_limit);
        if !self.config.enforce_budget {
            self.other_spent += elapsed * f64::from(self.config.other_clients_per_hour) / 3600.0;
            self.tokens = limit;
            return;
        }
        let gain = elapsed * self.config.refill_per_second;
        let other = elapsed * f64::from(self.config.other_clients_per_hour) / 3600.0;
        let available = self.tokens + gain;
        let served = other.min(available);
        self.other_spent += served;
        self.other_refused += other - served;
        self.tokens = (available - served).min(limit);
    }

    /// UNIX seconds on the fake's clock.
    fn unix(&self, now: Instant) -> f64 {
        self.epoch_unix
            + now
                .saturating_duration_since(self.epoch_instant)
                .as_secs_f64()
    }

    fn rate_headers(&self, now: Instant) -> [(&'static str, String); 3] {
        let limit = f64::from(self.config.rate_limit);
        let missing = (limit - self.tokens).max(0.0);
        let unix = self.unix(now).floor() as u64;
        let reset =
            unix + (missing / self.config.refill_per_second.max(f64::MIN_POSITIVE)).ceil() as u64;
        [
            ("ratelimit-limit", self.config.rate_limit.to_string()),
            (
                "ratelimit-remaining",
                (self.tokens.floor() as u64).to_string(),
            ),
            ("ratelimit-reset", reset.to_string()),
        ]
    }
}

type Shared = Arc<Mutex<FakeState>>;

/// A running fake Hetzner Cloud API. Dropping it stops the server.
#[derive(Debug)]
pub struct FakeHcloud {
    state: Shared,
    server: TestServer,
}

fn err(status: StatusCode, code: &str, message: impl Into<String>) -> (StatusCode, Value) {
    (
        status,
        json!({"error": {"code": code, "message": message.into(), "details": {}}}),
    )
}

/// `t` as RFC 3339 in UTC, the way the API writes timestamps.
fn rfc3339(t: SystemTime) -> String {
    let t = jiff::Timestamp::try_from(t).unwrap_or(jiff::Timestamp::UNIX_EPOCH);
    t.strftime("%Y-%m-%dT%H:%M:%S+00:00").to_string()
}

impl FakeHcloud {
    /// Starts the fake on `127.0.0.1` on a free port.
    pub async fn start(config: FakeConfig) -> std::io::Result<Self> {
        let listener = Listener::bind().await?;
        let unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let state: Shared = Arc::new(Mutex::new(FakeState::new(config, Instant::now(), unix)));
        let app = Router::new()
            .fallback(handle)
            .with_state(Arc::clone(&state));
        let server = listener.serve_axum(app, "fake hcloud server");
        Ok(Self { state, server })
    }

    fn lock(&self) -> MutexGuard<'_, FakeState> {
        test_server::lock(&self.state)
    }

    /// The API base URL (`http://127.0.0.1:PORT/v1`) for the provider's `endpoint`.
    pub fn base_url(&self) -> String {
        format!("{}/v1", self.server.url())
    }

    /// The token the fake accepts.
    pub fn token(&self) -> String {
        self.lock().config.token.clone()
    }

    /// Adds a network. Panics only on a malformed CIDR literal in a test.
    pub fn add_network(&self, id: u64, name: &str, ip_range: &str, subnets: &[&str]) {
        let parse = |s: &str| Cidr::parse(s).unwrap_or_else(|e| panic!("fake network: {e}"));
        self.lock().networks.insert(
            id,
            NetworkState {
                id,
                name: name.into(),
                ip_range: parse(ip_range),
                subnets: subnets.iter().map(|s| parse(s)).collect(),
                routes: Vec::new(),
            },
        );
    }

    /// Adds a server attached to `network` with private IP `ip`.
    pub fn add_server(&self, id: u64, name: &str, network: u64, ip: &str) {
        let ip = parse_ip_sloppy(ip).unwrap_or_else(|| panic!("fake server: bad IP {ip:?}"));
        self.lock().servers.insert(
            id,
            ServerState {
                id,
                name: name.into(),
                nets: vec![(network, ip)],
            },
        );
    }

    /// Removes a server.
    pub fn remove_server(&self, id: u64) {
        self.lock().servers.remove(&id);
    }

    /// The routes of `network` as `(destination, gateway)`, after finishing
    /// the actions whose time is up.
    pub fn routes(&self, network: u64) -> Vec<(String, String)> {
        let mut s = self.lock();
        s.tick(Instant::now());
        s.networks.get(&network).map_or_else(Vec::new, |n| {
            n.routes
                .iter()
                .map(|(d, g)| (d.to_string(), g.to_string()))
                .collect()
        })
    }

    /// Adds a route directly, as another tool would (no request counted).
    pub fn insert_route(&self, network: u64, destination: &str, gateway: &str) {
        let (Ok(d), Some(g)) = (Cidr::parse(destination), parse_ip_sloppy(gateway)) else {
            panic!("fake route: bad {destination:?} via {gateway:?}");
        };
        if let Some(n) = self.lock().networks.get_mut(&network) {
            n.routes.push((d, g));
        }
    }

    /// Removes a route directly.
    pub fn remove_route(&self, network: u64, destination: &str) {
        if let (Ok(d), Some(n)) = (
            Cidr::parse(destination),
            self.lock().networks.get_mut(&network),
        ) {
            n.routes.retain(|r| r.0 != d);
        }
    }

    /// Answers the next `n` requests to `endpoint` (`get_network`,
    /// `add_route`, `delete_route`, `get_action`, `list_servers`,
    /// `list_networks`) with `status` and error `code`.
    pub fn fail_next(&self, endpoint: &str, n: u32, status: u16, code: &str) {
        self.lock().injected.push(endpoint, n, status, code);
    }

    /// Sets how long every answer takes.
    pub fn set_latency(&self, latency: Duration) {
        self.lock().config.latency = latency;
    }

    /// Sets how long actions run.
    pub fn set_action_duration(&self, duration: Duration) {
        self.lock().config.action_duration = duration;
    }

    /// The next action started ends in `error` with `code`.
    pub fn fail_next_action(&self, code: &str) {
        self.lock().failing_actions.push(code.into());
    }

    /// Spends `n` requests of the budget, as other users of the project would.
    pub fn consume_budget(&self, n: u32) {
        let mut s = self.lock();
        s.refill(Instant::now());
        s.tokens = (s.tokens - f64::from(n)).max(0.0);
    }

    /// Starts an action on `network` that holds it for `duration`, as another
    /// tool's change would.
    pub fn hold_network(&self, network: u64, duration: Duration) {
        let mut s = self.lock();
        let id = s.next_action;
        s.next_action += 1;
        s.actions.insert(
            id,
            ActionState {
                id,
                command: "change_protection",
                network,
                started: SystemTime::now(),
                finishes: Instant::now() + duration,
                change: Change::Nothing,
                outcome: None,
                fail_with: None,
            },
        );
    }

    /// Ends every action holding `network` now (those of
    /// [`FakeHcloud::hold_network`] and any other running on it).
    pub fn release_network(&self, network: u64) {
        let now = Instant::now();
        for a in self.lock().actions.values_mut() {
            if a.network == network && a.finishes > now {
                a.finishes = now;
            }
        }
    }

    /// Answers by endpoint and HTTP status.
    pub fn answers(&self) -> BTreeMap<(String, u16), u64> {
        self.lock().answers.all().clone()
    }

    /// Requests by endpoint, any status.
    pub fn requests(&self) -> BTreeMap<String, u64> {
        self.lock().answers.by_endpoint()
    }

    /// Requests to one endpoint, any status.
    pub fn count(&self, endpoint: &str) -> u64 {
        self.lock().answers.count(endpoint)
    }

    /// All requests.
    pub fn total(&self) -> u64 {
        self.lock().answers.total()
    }

    /// Answers with one HTTP status, any endpoint.
    pub fn with_status(&self, status: u16) -> u64 {
        self.lock().answers.with_status(status)
    }

    /// `429 rate_limit_exceeded` answers so far.
    pub fn throttled(&self) -> u64 {
        self.with_status(429)
    }

    /// Requests of the simulated other clients (`other_clients_per_hour`)
    /// so far: `(served, refused by the budget)`, whole requests.
    pub fn other_clients(&self) -> (u64, u64) {
        let mut s = self.lock();
        s.refill(Instant::now());
        (s.other_spent.floor() as u64, s.other_refused.floor() as u64)
    }

    /// What is left of the budget now (`RateLimit-Remaining`).
    pub fn budget_remaining(&self) -> u64 {
        let mut s = self.lock();
        s.refill(Instant::now());
        s.tokens.floor() as u64
    }

    /// Servers in the project.
    pub fn server_count(&self) -> usize {
        self.lock().servers.len()
    }
}

/// Splits `/v1/...` into the endpoint name and its numeric id, if any.
fn route_of(method: &Method, path: &str) -> (&'static str, Option<u64>) {
    let parts: Vec<&str> = path.trim_end_matches('/').split('/').collect();
    let id = |s: &str| s.parse::<u64>().ok();
    match (method, parts.as_slice()) {
        (&Method::GET, ["", "v1", "networks"]) => ("list_networks", None),
        (&Method::GET, ["", "v1", "networks", n]) => ("get_network", id(n)),
        (&Method::POST, ["", "v1", "networks", n, "actions", "add_route"]) => ("add_route", id(n)),
        (&Method::POST, ["", "v1", "networks", n, "actions", "delete_route"]) => {
            ("delete_route", id(n))
        }
        (&Method::GET, ["", "v1", "actions"]) => ("list_actions", None),
        (&Method::GET, ["", "v1", "actions", a]) => ("get_action", id(a)),
        (&Method::GET, ["", "v1", "servers"]) => ("list_servers", None),
        (&Method::GET, ["", "v1", "servers", n]) => ("get_server", id(n)),
        _ => ("unknown", None),
    }
}

fn query_param<'a>(uri: &'a Uri, key: &'a str) -> Option<&'a str> {
    query_params(uri, key).next()
}

/// Every value of a repeated query parameter (`id=1&id=2`).
fn query_params<'a>(uri: &'a Uri, key: &'a str) -> impl Iterator<Item = &'a str> + 'a {
    uri.query()
        .unwrap_or_default()
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .filter(move |(k, _)| *k == key)
        .map(|(_, v)| v)
}

/// `page` and `per_page` as the API reads them: page from 1, 25 a page by
/// default, 50 at most.
fn paging(uri: &Uri) -> (usize, usize) {
    let page = query_param(uri, "page")
        .and_then(|p| p.parse::<usize>().ok())
        .unwrap_or(1)
        .max(1);
    let per_page = query_param(uri, "per_page")
        .and_then(|p| p.parse::<usize>().ok())
        .unwrap_or(25)
        .clamp(1, 50);
    (page, per_page)
}

/// One page of `items` with its `meta.pagination`.
fn page_of(key: &str, items: Vec<Value>, uri: &Uri) -> Value {
    let (page, per_page) = paging(uri);
    let total = items.len();
    let list: Vec<Value> = items
        .into_iter()
        .skip((page - 1) * per_page)
        .take(per_page)
        .collect();
    json!({key: list, "meta": {"pagination": pagination(page, per_page, total)}})
}

async fn handle(
    State(state): State<Shared>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let latency = test_server::lock(&state).config.latency;
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    let mut s = test_server::lock(&state);
    let now = Instant::now();
    s.refill(now);
    s.tick(now);
    let (endpoint, id) = route_of(&method, uri.path());
    if endpoint == "unknown" {
        tracing::warn!(%method, %uri, "fake hcloud: request to an endpoint it does not serve");
    }
    let (status, value) = answer(&mut s, endpoint, id, &uri, &headers, &body, now);
    s.answers.record(endpoint, status.as_u16());
    test_server::json_response(status, value, s.rate_headers(now))
}

fn answer(
    s: &mut FakeState,
    endpoint: &'static str,
    id: Option<u64>,
    uri: &Uri,
    headers: &HeaderMap,
    body: &[u8],
    now: Instant,
) -> (StatusCode, Value) {
    if s.config.enforce_budget {
        if s.tokens < 1.0 {
            return err(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_exceeded",
                "limit of requests per hour reached",
            );
        }
        s.tokens -= 1.0;
    }
    let expected = format!("Bearer {}", s.config.token);
    if headers.get("authorization").and_then(|v| v.to_str().ok()) != Some(expected.as_str()) {
        return err(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "unable to authenticate",
        );
    }
    if let Some((status, code)) = s.injected.take(endpoint) {
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        return err(status, &code, "injected failure");
    }
    match endpoint {
        "list_networks" => {
            let name = query_param(uri, "name");
            let list: Vec<Value> = s
                .networks
                .values()
                .filter(|n| name.is_none_or(|want| n.name == want))
                .map(|n| network_json(s, n))
                .collect();
            (
                StatusCode::OK,
                json!({"networks": list, "meta": {"pagination": pagination(1, 25, list.len())}}),
            )
        }
        "get_network" => match id.and_then(|id| s.networks.get(&id)) {
            Some(n) => (StatusCode::OK, json!({"network": network_json(s, n)})),
            None => err(StatusCode::NOT_FOUND, "not_found", "network not found"),
        },
        "add_route" | "delete_route" => route_action(s, endpoint, id, body, now),
        "get_action" => match id.and_then(|id| s.actions.get(&id)) {
            Some(a) => (StatusCode::OK, json!({"action": action_json(a)})),
            None => err(StatusCode::NOT_FOUND, "not_found", "action not found"),
        },
        "list_actions" => {
            // hcloud-go's waiter asks for up to 25 ids at once; without an
            // id filter the API lists every action of the project.
            let ids: Vec<u64> = query_params(uri, "id")
                .filter_map(|v| v.parse().ok())
                .collect();
            let list: Vec<Value> = s
                .actions
                .values()
                .filter(|a| ids.is_empty() || ids.contains(&a.id))
                .map(action_json)
                .collect();
            (StatusCode::OK, page_of("actions", list, uri))
        }
        "get_server" => match id.and_then(|id| s.servers.get(&id)) {
            Some(sv) => (StatusCode::OK, json!({"server": server_json(sv)})),
            None => err(StatusCode::NOT_FOUND, "not_found", "server not found"),
        },
        "list_servers" => {
            // hcloud-go's GetByName lists with `name=` and takes the first
            // answer, so an unfiltered list would name the wrong server.
            let name = query_param(uri, "name");
            let list: Vec<Value> = s
                .servers
                .values()
                .filter(|sv| name.is_none_or(|want| sv.name == want))
                .map(server_json)
                .collect();
            (StatusCode::OK, page_of("servers", list, uri))
        }
        _ => err(
            StatusCode::NOT_FOUND,
            "not_found",
            "no such endpoint in the fake",
        ),
    }
}

fn route_action(
    s: &mut FakeState,
    command: &'static str,
    network: Option<u64>,
    body: &[u8],
    now: Instant,
) -> (StatusCode, Value) {
    let Some(n) = network.and_then(|id| s.networks.get(&id)) else {
        return err(StatusCode::NOT_FOUND, "not_found", "network not found");
    };
    let Ok(v) = serde_json::from_slice::<Value>(body) else {
        return err(
            StatusCode::BAD_REQUEST,
            "json_error",
            "request body is not JSON",
        );
    };
    let field = |k: &str| {
        v.get(k)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let (dest_text, gw_text) = (field("destination"), field("gateway"));
    let Ok(dest) = Cidr::parse(&dest_text) else {
        return err(
            StatusCode::BAD_REQUEST,
            "invalid_input",
            format!("invalid destination {dest_text:?}"),
        );
    };
    let Some(gw) = parse_ip_sloppy(&gw_text) else {
        return err(
            StatusCode::BAD_REQUEST,
            "invalid_input",
            format!("invalid gateway {gw_text:?}"),
        );
    };
    if dest.family() != IpFamily::V4 || gw.is_ipv6() {
        return err(
            StatusCode::BAD_REQUEST,
            "invalid_input",
            "routes must be IPv4",
        );
    }
    let change = if command == "add_route" {
        if !n.ip_range.contains(gw) || gw == n.ip_range.network() {
            return err(
                StatusCode::BAD_REQUEST,
                "invalid_input",
                format!(
                    "gateway {gw} is not a usable address of network {}",
                    n.ip_range
                ),
            );
        }
        if n.subnets.iter().any(|sub| sub.overlaps(&dest)) {
            return err(
                StatusCode::BAD_REQUEST,
                "invalid_input",
                format!("destination {dest} overlaps a subnet"),
            );
        }
        if n.routes.iter().any(|(d, _)| *d == dest) {
            return err(
                StatusCode::CONFLICT,
                "uniqueness_error",
                format!("route to {dest} already exists"),
            );
        }
        if n.routes.len() >= s.config.max_routes {
            return err(
                StatusCode::FORBIDDEN,
                "resource_limit_exceeded",
                format!(
                    "network has reached its limit of {} routes",
                    s.config.max_routes
                ),
            );
        }
        Change::Add(dest, gw)
    } else {
        if !n.routes.contains(&(dest, gw)) {
            return err(
                StatusCode::NOT_FOUND,
                "not_found",
                format!("no route to {dest} via {gw}"),
            );
        }
        Change::Delete(dest, gw)
    };
    let network = n.id;
    if s.busy(network) {
        return match s.config.lock_answer {
            LockAnswer::Conflict => err(
                StatusCode::CONFLICT,
                "conflict",
                "a change is currently being performed on this network",
            ),
            LockAnswer::Locked => err(
                StatusCode::LOCKED,
                "locked",
                "the network is locked by another action",
            ),
        };
    }
    let id = s.next_action;
    s.next_action += 1;
    let fail_with = (!s.failing_actions.is_empty()).then(|| s.failing_actions.remove(0));
    let action = ActionState {
        id,
        command,
        network,
        started: SystemTime::now(),
        finishes: now + s.config.action_duration,
        change,
        outcome: None,
        fail_with,
    };
    let body = json!({"action": action_json(&action)});
    s.actions.insert(id, action);
    (StatusCode::CREATED, body)
}

fn pagination(page: usize, per_page: usize, total: usize) -> Value {
    let last = total.div_ceil(per_page).max(1);
    json!({
        "page": page,
        "per_page": per_page,
        "previous_page": (page > 1).then(|| page - 1),
        "next_page": (page < last).then(|| page + 1),
        "last_page": last,
        "total_entries": total,
    })
}

fn network_json(s: &FakeState, n: &NetworkState) -> Value {
    let servers: Vec<u64> = s
        .servers
        .values()
        .filter(|sv| sv.nets.iter().any(|(net, _)| *net == n.id))
        .map(|sv| sv.id)
        .collect();
    json!({
        "id": n.id,
        "name": n.name,
        "created": "2016-01-30T23:50:00+00:00",
        "ip_range": n.ip_range.to_string(),
        "subnets": n.subnets.iter().map(|sub| json!({
            "type": "cloud",
            "ip_range": sub.to_string(),
            "network_zone": "eu-central",
            "gateway": n.ip_range.network().to_string(),
            "vswitch_id": null,
        })).collect::<Vec<_>>(),
        "routes": n.routes.iter().map(|(d, g)| json!({
            "destination": d.to_string(),
            "gateway": g.to_string(),
        })).collect::<Vec<_>>(),
        "servers": servers,
        "load_balancers": [],
        "protection": {"delete": false},
        "labels": {},
        "expose_routes_to_vswitch": false,
    })
}

fn server_json(sv: &ServerState) -> Value {
    json!({
        "id": sv.id,
        "name": sv.name,
        "status": "running",
        "private_net": sv.nets.iter().map(|(net, ip)| json!({
            "network": net,
            "ip": ip.to_string(),
            "alias_ips": [],
            "mac_address": "86:00:00:00:00:01",
        })).collect::<Vec<_>>(),
    })
}

fn action_json(a: &ActionState) -> Value {
    let (status, error) = match &a.outcome {
        None => ("running", Value::Null),
        Some(None) => ("success", Value::Null),
        Some(Some(code)) => ("error", json!({"code": code, "message": "action failed"})),
    };
    json!({
        "id": a.id,
        "command": a.command,
        "status": status,
        "progress": if a.outcome.is_some() { 100 } else { 0 },
        "started": rfc3339(a.started),
        "finished": if a.outcome.is_some() { json!(rfc3339(SystemTime::now())) } else { Value::Null },
        "resources": [{"id": a.network, "type": "network"}],
        "error": error,
    })
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    const T0_UNIX: f64 = 1_800_000_000.0;

    /// A state on an injected clock starting at `T0_UNIX`.
    fn state(config: FakeConfig) -> (FakeState, Instant) {
        let t0 = Instant::now();
        let mut s = FakeState::new(config, t0, T0_UNIX);
        s.networks.insert(
            1,
            NetworkState {
                id: 1,
                name: "net".into(),
                ip_range: Cidr::parse("10.0.0.0/16").expect("cidr"),
                subnets: Vec::new(),
                routes: Vec::new(),
            },
        );
        (s, t0)
    }

    /// One authenticated `GET /networks/1` at `now`, as `handle` serves it.
    fn get(s: &mut FakeState, now: Instant) -> (u16, BTreeMap<&'static str, u64>) {
        let token = s.config.token.clone();
        let mut headers = HeaderMap::new();
        headers.insert(
            "authorization",
            HeaderValue::from_str(&format!("Bearer {token}")).expect("header"),
        );
        let uri: Uri = "/v1/networks/1".parse().expect("uri");
        s.refill(now);
        s.tick(now);
        let (status, _) = answer(s, "get_network", Some(1), &uri, &headers, &[], now);
        let h = s
            .rate_headers(now)
            .into_iter()
            .map(|(k, v)| (k, v.parse::<u64>().expect("numeric header")))
            .collect();
        (status.as_u16(), h)
    }

    #[test]
    fn budget_of_3600_is_spent_then_refused_then_refilled_one_per_second() {
        let (mut s, t0) = state(FakeConfig {
            enforce_budget: true,
            ..FakeConfig::default()
        });
        for k in 0..3600u64 {
            let (status, h) = get(&mut s, t0);
            assert_eq!(status, 200, "request {k}");
            assert_eq!(h["ratelimit-limit"], 3600);
            assert_eq!(h["ratelimit-remaining"], 3599 - k);
        }
        let (status, h) = get(&mut s, t0);
        assert_eq!(status, 429);
        assert_eq!(h["ratelimit-remaining"], 0);
        // Full again in 3,600 s at one per second, as a UNIX time.
        assert_eq!(h["ratelimit-reset"], T0_UNIX as u64 + 3600);
        // Half a second later still nothing; one second later exactly one.
        assert_eq!(get(&mut s, t0 + Duration::from_millis(500)).0, 429);
        let t1 = t0 + Duration::from_secs(1);
        let (status, h) = get(&mut s, t1);
        assert_eq!((status, h["ratelimit-remaining"]), (200, 0));
        assert_eq!(get(&mut s, t1).0, 429);
        // An idle hour fills the bucket and no more.
        let (status, h) = get(&mut s, t1 + Duration::from_secs(7200));
        assert_eq!((status, h["ratelimit-remaining"]), (200, 3599));
        assert_eq!(h["ratelimit-reset"], T0_UNIX as u64 + 7201 + 1);
    }

    #[test]
    fn refused_requests_still_cost_nothing_and_are_not_counted_twice() {
        let (mut s, t0) = state(FakeConfig {
            enforce_budget: true,
            rate_limit: 2,
            ..FakeConfig::default()
        });
        assert_eq!(get(&mut s, t0).0, 200);
        assert_eq!(get(&mut s, t0).0, 200);
        for _ in 0..10 {
            assert_eq!(get(&mut s, t0).0, 429);
        }
        // The refused ones did not dig a hole: one second gives one request.
        assert_eq!(get(&mut s, t0 + Duration::from_secs(1)).0, 200);
    }

    #[test]
    fn other_clients_spend_their_share_of_the_budget() {
        let (mut s, t0) = state(FakeConfig {
            enforce_budget: true,
            other_clients_per_hour: 1800,
            ..FakeConfig::default()
        });
        // Drain the bucket, then let 100 s pass: the refill gives 100, the
        // other client takes 50 of them, evenly.
        for _ in 0..3600 {
            assert_eq!(get(&mut s, t0).0, 200);
        }
        let (status, h) = get(&mut s, t0 + Duration::from_secs(100));
        assert_eq!((status, h["ratelimit-remaining"]), (200, 49));
        assert!((s.other_spent - 50.0).abs() < 1e-6, "{}", s.other_spent);
        assert!(s.other_refused.abs() < 1e-9);
    }

    #[test]
    fn other_clients_above_the_refill_rate_empty_the_bucket_and_are_refused() {
        let (mut s, t0) = state(FakeConfig {
            enforce_budget: true,
            rate_limit: 100,
            other_clients_per_hour: 7200,
            ..FakeConfig::default()
        });
        // Two per second against a refill of one: the 100 are gone after
        // 100 s, and from then on half the other client's requests fail.
        s.refill(t0 + Duration::from_secs(100));
        assert!(s.tokens.abs() < 1e-6, "{}", s.tokens);
        assert_eq!(get(&mut s, t0 + Duration::from_secs(100)).0, 429);
        s.refill(t0 + Duration::from_secs(200));
        assert!((s.other_spent - 300.0).abs() < 1e-6, "{}", s.other_spent);
        assert!(
            (s.other_refused - 100.0).abs() < 1e-6,
            "{}",
            s.other_refused
        );
    }

    #[test]
    fn rate_limit_reset_follows_the_fakes_clock_not_the_wall_clock() {
        let (mut s, t0) = state(FakeConfig {
            enforce_budget: true,
            ..FakeConfig::default()
        });
        let (_, h) = get(&mut s, t0 + Duration::from_secs(86_400));
        // One request spent a day after start: full again one second later.
        assert_eq!(h["ratelimit-reset"], T0_UNIX as u64 + 86_400 + 1);
    }

    #[test]
    fn timestamps_are_rfc3339_utc() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00+00:00");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400 + 3_723);
        assert_eq!(rfc3339(leap), "2000-02-29T01:02:03+00:00");
        let y2038 = UNIX_EPOCH + Duration::from_secs(2_147_483_647);
        assert_eq!(rfc3339(y2038), "2038-01-19T03:14:07+00:00");
    }

    #[test]
    fn paths_map_to_endpoints() {
        assert_eq!(
            route_of(&Method::GET, "/v1/networks/7"),
            ("get_network", Some(7))
        );
        assert_eq!(
            route_of(&Method::POST, "/v1/networks/7/actions/add_route"),
            ("add_route", Some(7))
        );
        assert_eq!(
            route_of(&Method::GET, "/v1/actions/3/"),
            ("get_action", Some(3))
        );
        assert_eq!(
            route_of(&Method::DELETE, "/v1/networks/7"),
            ("unknown", None)
        );
        assert_eq!(
            route_of(&Method::GET, "/v1/networks/x"),
            ("get_network", None)
        );
        assert_eq!(
            route_of(&Method::GET, "/v1/actions"),
            ("list_actions", None)
        );
        assert_eq!(
            route_of(&Method::GET, "/v1/servers/12"),
            ("get_server", Some(12))
        );
    }
}
