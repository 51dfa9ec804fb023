//! A stateful fake of the Compute Engine REST resources a routes-based
//! cluster uses (feature `testing`), built from the published API.
//!
//! It serves, under `/compute/v1/projects/{project}/global`, what the
//! official client sends:
//!
//! | request | what it does | source |
//! |---|---|---|
//! | `GET networks/{n}` | the network: `selfLink`, `enableUlaInternalIpv6`, `internalIpv6Range` | Compute API reference, `networks.get` and the `Network` resource |
//! | `GET routes?filter=&maxResults=&pageToken=` | the project's routes in name order, pages of at most 500 (`nextPageToken`; no `items` key when empty) | `routes.list`; "Filtering and sorting list results" |
//! | `GET routes/{r}` | one route, `404 notFound` when absent | `routes.get` |
//! | `POST routes` | a `PENDING` insert operation; the route exists once it is `DONE` | `routes.insert`; the `Operation` resource; "Handling API responses" |
//! | `DELETE routes/{r}` | a delete operation, `404 notFound` when absent | `routes.delete` |
//! | `GET operations/{o}` | the operation | `globalOperations.get` |
//! | `POST operations/{o}/wait` | blocks until the operation is `DONE` or `max_wait` passed, then answers it either way | `globalOperations.wait` |
//!
//! and, under `/compute/v1/projects/{project}/zones/{zone}`:
//!
//! | request | what it does | source |
//! |---|---|---|
//! | `GET instances/{i}` | the instance: `name`, `zone`, `status` (`RUNNING`, `TERMINATED` when stopped), `canIpForward` (on unless [`FakeGce::set_can_ip_forward`] turned it off), `selfLink`; `404 notFound` when absent | `instances.get` and the `Instance` resource (field `canIpForward`: "Allows this instance to send and receive packets with non-matching destination or source IPs") |
//!
//! What it enforces, and where each rule comes from:
//!
//! - the list filter: parenthesised `field eq "regex"` terms (also `ne`, and
//!   one unparenthesised term), each an RE2 expression that must match the
//!   whole field, over `name`, `network`, `description`, `destRange`,
//!   `nextHopInstance` (Compute API reference, `routes.list` `filter`;
//!   upstream `gce_routes.go` filters on name, network and description).
//!   Only literals, `\` escapes, `.` and `*` are implemented; any other RE2
//!   syntax is refused with `400 invalid`, so a test can never pass on a
//!   filter the fake only pretended to apply;
//! - route names `[a-z]([-a-z0-9]{0,61}[a-z0-9])?` (the `Route.name` field
//!   documentation), `400 invalid` otherwise; a taken name `409
//!   alreadyExists` (upstream treats that answer as success); the network
//!   must exist (`404 notFound`); an IPv6 `destRange` needs the network's
//!   internal IPv6 range (VPC docs, "IPv6 static routes"), `400 invalid`
//!   otherwise; a next-hop instance that does not exist fails the
//!   operation with `RESOURCE_NOT_FOUND`;
//! - a static-routes quota per network (`max_routes`, 300 by default as in
//!   the field reports "Quota 'ROUTES' exceeded. Limit: 300.0", openshift
//!   origin #15969 and gardener-extension-provider-gcp #558): inserts beyond
//!   it answer `403 quotaExceeded`, pending inserts included;
//! - per-minute rate quotas (cloud.google.com/compute/api-quota): reads,
//!   writes and operation reads counted separately in windows aligned on the
//!   wall clock (`window`, 60 s by default), `403 rateLimitExceeded` with
//!   domain `usageLimits` when a group's window is spent, refilled at the
//!   next window boundary; refused requests do not count;
//! - operations that take `operation_duration` (route operations take
//!   seconds on GCE), with `status`, `progress`, `insertTime`, `endTime` and,
//!   on failure, `error.errors[]` plus `httpErrorStatusCode`;
//! - route `warnings` for a next hop that stopped (`NEXT_HOP_NOT_RUNNING`) or
//!   is gone (`NEXT_HOP_INSTANCE_NOT_FOUND`), as the `Route.warnings` field
//!   documents;
//! - a second writer: [`FakeGce::insert_route`] and [`FakeGce::remove_route`]
//!   change routes behind the provider's back, as another client (another
//!   cluster, an operator, Terraform) in the same project does.
//!
//! Credentials are not checked: the provider's tests talk to it with the
//! official client's anonymous credentials. Error bodies have the shape the
//! API documents (`{"error": {"code", "message", "errors": [{"domain",
//! "reason", "message"}]}}`). Test hooks edit the state directly and are not
//! counted as requests.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::Response;
use route_core::{Cidr, IpFamily};
use serde_json::{Value, json};
use test_server::{Answers, Injections, Listener, TestServer};
use tokio::time::Instant;

/// The host part of the resource URLs the API writes into answers,
/// whatever endpoint was called.
pub const SELF_LINK_BASE: &str = "https://www.googleapis.com/compute/v1";

/// Settings of the fake.
#[derive(Debug, Clone)]
pub struct FakeConfig {
    /// The project the fake serves.
    pub project: String,
    /// How long an insert or delete operation runs.
    pub operation_duration: Duration,
    /// Static routes per network.
    pub max_routes: usize,
    /// Read requests (`networks.get`, `routes.list`, `routes.get`,
    /// `instances.get`) per window.
    pub reads_per_window: u32,
    /// Write requests (`routes.insert`, `routes.delete`) per window.
    pub writes_per_window: u32,
    /// Operation reads (`globalOperations.get` and `wait`) per window.
    pub operation_reads_per_window: u32,
    /// The rate-quota window, aligned on the wall clock (GCE: one minute).
    pub window: Duration,
    /// How long `globalOperations.wait` blocks at most (GCE: about 2 minutes).
    pub max_wait: Duration,
    /// How long every answer takes.
    pub latency: Duration,
}

impl Default for FakeConfig {
    fn default() -> Self {
        Self {
            project: "fake-project".into(),
            operation_duration: Duration::from_millis(30),
            max_routes: 300,
            reads_per_window: 1500,
            writes_per_window: 1500,
            operation_reads_per_window: 1500,
            window: Duration::from_secs(60),
            max_wait: Duration::from_secs(120),
            latency: Duration::ZERO,
        }
    }
}

#[derive(Debug, Clone)]
struct NetworkState {
    id: u64,
    ula_ipv6: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum InstanceState {
    Running,
    Stopped,
}

/// An instance as stored, by its URL.
#[derive(Debug, Clone, Copy)]
struct FakeInstance {
    state: InstanceState,
    id: u64,
    /// `canIpForward`: GCE's default is off; the fake's is on, so a test
    /// that does not care sees a cluster whose Nodes can carry pod traffic.
    can_ip_forward: bool,
}

/// A route as stored: the fields the API returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeRoute {
    /// `name`.
    pub name: String,
    /// `network`, a full URL.
    pub network: String,
    /// `destRange`.
    pub dest_range: String,
    /// `nextHopInstance`, a full URL, if the next hop is an instance.
    pub next_hop_instance: Option<String>,
    /// `nextHopGateway`, for routes such as the default internet route.
    pub next_hop_gateway: Option<String>,
    /// `priority`.
    pub priority: u32,
    /// `description`.
    pub description: String,
    id: u64,
    created: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Change {
    Insert(FakeRoute),
    Delete(String),
}

#[derive(Debug, Clone)]
struct OperationState {
    id: u64,
    name: String,
    kind: &'static str,
    target: String,
    inserted: String,
    finishes: Instant,
    change: Change,
    fail_with: Option<(String, String)>,
    /// Set once done: `None` for success, `(code, message)` otherwise.
    outcome: Option<Option<(String, String)>>,
    ended: Option<String>,
}

#[derive(Debug)]
struct FakeState {
    config: FakeConfig,
    networks: BTreeMap<String, NetworkState>,
    instances: BTreeMap<String, FakeInstance>,
    routes: BTreeMap<String, FakeRoute>,
    operations: BTreeMap<String, OperationState>,
    next_id: u64,
    window_index: u64,
    used: BTreeMap<&'static str, u32>,
    requests: BTreeMap<String, u64>,
    /// The `Authorization` header of each Compute request ("" when none),
    /// and how many carried it.
    authorizations: BTreeMap<String, u64>,
    /// The bodies `generateAccessToken` was sent, in order.
    token_bodies: Vec<String>,
    /// How long a token from `generateAccessToken` is valid.
    token_lifetime: Duration,
    answers: Answers,
    injected: Injections,
    failing_operations: Vec<(String, String)>,
}

type Shared = Arc<Mutex<FakeState>>;

fn lock(state: &Shared) -> MutexGuard<'_, FakeState> {
    test_server::lock(state)
}

/// A running fake Compute Engine API. Dropping it stops the server.
#[derive(Debug)]
pub struct FakeGce {
    state: Shared,
    server: TestServer,
}

fn unix_now() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

/// Now as RFC 3339 with milliseconds in UTC, as the API writes timestamps.
fn timestamp() -> String {
    rfc3339(unix_now())
}

/// An instant (since the Unix epoch) as RFC 3339 with milliseconds, in the
/// `-00:00` form Compute Engine writes.
fn rfc3339(now: Duration) -> String {
    let t = jiff::Timestamp::try_from(SystemTime::UNIX_EPOCH + now)
        .unwrap_or(jiff::Timestamp::UNIX_EPOCH);
    format!("{}-00:00", t.strftime("%Y-%m-%dT%H:%M:%S%.3f"))
}

fn error(status: StatusCode, reason: &str, message: impl Into<String>) -> (StatusCode, Value) {
    let message = message.into();
    let domain = if reason == "rateLimitExceeded" || reason == "quotaExceeded" {
        "usageLimits"
    } else {
        "global"
    };
    (
        status,
        json!({"error": {
            "code": status.as_u16(),
            "message": message,
            "errors": [{"message": message, "domain": domain, "reason": reason}],
        }}),
    )
}

fn valid_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_lowercase()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[b.len() - 1] != b'-'
}

impl FakeGce {
    /// Starts the fake on `127.0.0.1` on a free port.
    pub async fn start(config: FakeConfig) -> std::io::Result<Self> {
        let listener = Listener::bind().await?;
        let state: Shared = Arc::new(Mutex::new(FakeState {
            config,
            networks: BTreeMap::new(),
            instances: BTreeMap::new(),
            routes: BTreeMap::new(),
            operations: BTreeMap::new(),
            next_id: 1_000_000,
            window_index: 0,
            used: BTreeMap::new(),
            requests: BTreeMap::new(),
            authorizations: BTreeMap::new(),
            token_bodies: Vec::new(),
            token_lifetime: Duration::from_secs(3600),
            answers: Answers::default(),
            injected: Injections::default(),
            failing_operations: Vec::new(),
        }));
        let app = Router::new()
            .fallback(handle)
            .with_state(Arc::clone(&state));
        let server = listener.serve_axum(app, "fake gce server");
        Ok(Self { state, server })
    }

    fn lock(&self) -> MutexGuard<'_, FakeState> {
        lock(&self.state)
    }

    /// The endpoint for the provider's `endpoint` setting.
    pub fn endpoint(&self) -> String {
        self.server.url()
    }

    /// The project the fake serves.
    pub fn project(&self) -> String {
        self.lock().config.project.clone()
    }

    /// A network's URL as the API writes it.
    pub fn network_url(&self, network: &str) -> String {
        format!(
            "{SELF_LINK_BASE}/projects/{}/global/networks/{network}",
            self.project()
        )
    }

    /// An instance's URL as the API writes it.
    pub fn instance_url(&self, zone: &str, instance: &str) -> String {
        format!(
            "{SELF_LINK_BASE}/projects/{}/zones/{zone}/instances/{instance}",
            self.project()
        )
    }

    /// Adds a VPC network; `ula_ipv6` gives it an internal IPv6 range.
    pub fn add_network(&self, name: &str, ula_ipv6: bool) {
        let mut s = self.lock();
        let id = s.next_id;
        s.next_id += 1;
        s.networks
            .insert(name.to_string(), NetworkState { id, ula_ipv6 });
    }

    /// Adds a running instance with `canIpForward` on.
    pub fn add_instance(&self, zone: &str, name: &str) {
        let url = self.instance_url(zone, name);
        let mut s = self.lock();
        let id = s.next_id;
        s.next_id += 1;
        s.instances.insert(
            url,
            FakeInstance {
                state: InstanceState::Running,
                id,
                can_ip_forward: true,
            },
        );
    }

    /// Stops an instance: routes to it get `NEXT_HOP_NOT_RUNNING`.
    pub fn stop_instance(&self, zone: &str, name: &str) {
        let url = self.instance_url(zone, name);
        if let Some(i) = self.lock().instances.get_mut(&url) {
            i.state = InstanceState::Stopped;
        }
    }

    /// Sets an instance's `canIpForward`, as recreating it (or updating it
    /// while stopped) would; `false` when there is no such instance.
    pub fn set_can_ip_forward(&self, zone: &str, name: &str, on: bool) -> bool {
        let url = self.instance_url(zone, name);
        match self.lock().instances.get_mut(&url) {
            Some(i) => {
                i.can_ip_forward = on;
                true
            }
            None => false,
        }
    }

    /// Deletes an instance: routes to it get `NEXT_HOP_INSTANCE_NOT_FOUND`.
    pub fn delete_instance(&self, zone: &str, name: &str) {
        let url = self.instance_url(zone, name);
        self.lock().instances.remove(&url);
    }

    /// Another client inserts a route, at once (no operation, not counted).
    pub fn insert_route(
        &self,
        name: &str,
        network: &str,
        dest_range: &str,
        next_hop_instance: Option<&str>,
        description: &str,
    ) {
        let network = self.network_url(network);
        let mut s = self.lock();
        let id = s.next_id;
        s.next_id += 1;
        let gateway = next_hop_instance.is_none().then(|| {
            format!(
                "{SELF_LINK_BASE}/projects/{}/global/gateways/default-internet-gateway",
                s.config.project
            )
        });
        s.routes.insert(
            name.to_string(),
            FakeRoute {
                name: name.into(),
                network,
                dest_range: dest_range.into(),
                next_hop_instance: next_hop_instance.map(str::to_string),
                next_hop_gateway: gateway,
                priority: 1000,
                description: description.into(),
                id,
                created: timestamp(),
            },
        );
    }

    /// Another client deletes a route, at once (not counted).
    pub fn remove_route(&self, name: &str) -> bool {
        self.lock().routes.remove(name).is_some()
    }

    /// Every route, in name order (finished operations applied).
    pub fn routes(&self) -> Vec<FakeRoute> {
        let mut s = self.lock();
        s.tick(Instant::now());
        s.routes.values().cloned().collect()
    }

    /// Answers the next request to `endpoint` (`get_network`, `list`,
    /// `get_route`, `insert`, `delete`, `get_operation`, `wait_operation`,
    /// `get_instance`)
    /// with `status` and error `reason`, without acting on it.
    pub fn fail_next(&self, endpoint: &str, status: u16, reason: &str) {
        self.lock().injected.push(endpoint, 1, status, reason);
    }

    /// Makes the next insert or delete operation finish with error `code`
    /// (`QUOTA_EXCEEDED`, `RESOURCE_NOT_READY`, ...), changing nothing.
    pub fn fail_next_operation(&self, code: &str, message: &str) {
        self.lock()
            .failing_operations
            .push((code.into(), message.into()));
    }

    /// Changes how long operations run.
    pub fn set_operation_duration(&self, d: Duration) {
        self.lock().config.operation_duration = d;
    }

    /// Changes the static-routes quota per network.
    pub fn set_max_routes(&self, n: usize) {
        self.lock().config.max_routes = n;
    }

    /// Changes the per-window write quota (the other groups stay).
    pub fn set_writes_per_window(&self, n: u32) {
        self.lock().config.writes_per_window = n;
    }

    /// Requests by endpoint, answered or refused.
    pub fn requests(&self) -> BTreeMap<String, u64> {
        self.lock().requests.clone()
    }

    /// The `Authorization` header of each Compute request so far ("" for
    /// none), with how many carried it.
    pub fn authorizations(&self) -> BTreeMap<String, u64> {
        self.lock().authorizations.clone()
    }

    /// The bodies `generateAccessToken` was sent so far, in order.
    pub fn token_bodies(&self) -> Vec<String> {
        self.lock().token_bodies.clone()
    }

    /// From now on, tokens from `generateAccessToken` expire `lifetime`
    /// after they are issued (default one hour, as IAM's).
    pub fn set_token_lifetime(&self, lifetime: Duration) {
        self.lock().token_lifetime = lifetime;
    }

    /// The URL of `generateAccessToken` for `account`, as cloud-provider-gcp's
    /// `token-url` names IAM Credentials' (`https://iamcredentials.googleapis.com/v1/
    /// projects/-/serviceAccounts/<account>:generateAccessToken`).
    pub fn token_url(&self, account: &str) -> String {
        format!(
            "{}/v1/projects/-/serviceAccounts/{account}:generateAccessToken",
            self.endpoint()
        )
    }

    /// The host and port to give as `GCE_METADATA_HOST`: the fake serves
    /// the metadata server's token for the instance's default account too.
    pub fn metadata_host(&self) -> String {
        self.endpoint()
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_string()
    }

    /// Requests to one endpoint.
    pub fn count(&self, endpoint: &str) -> u64 {
        self.lock().requests.get(endpoint).copied().unwrap_or(0)
    }

    /// Every request the fake has seen.
    pub fn total(&self) -> u64 {
        self.lock().requests.values().sum()
    }

    /// Answers by endpoint and HTTP status.
    pub fn answers(&self) -> BTreeMap<(String, u16), u64> {
        self.lock().answers.all().clone()
    }

    /// Requests refused with `rateLimitExceeded`.
    pub fn throttled(&self) -> u64 {
        self.lock().used.get("refused").copied().unwrap_or(0).into()
    }
}

impl FakeState {
    /// Finishes the operations whose time is up, applying their change.
    fn tick(&mut self, now: Instant) {
        let mut done = Vec::new();
        for op in self.operations.values_mut() {
            if op.outcome.is_some() || op.finishes > now {
                continue;
            }
            op.ended = Some(timestamp());
            if let Some(f) = op.fail_with.take() {
                op.outcome = Some(Some(f));
                continue;
            }
            op.outcome = Some(None);
            done.push(op.change.clone());
        }
        for change in done {
            match change {
                Change::Insert(r) => {
                    self.routes.insert(r.name.clone(), r);
                }
                Change::Delete(name) => {
                    self.routes.remove(&name);
                }
            }
        }
    }

    /// Counts a request against its quota group; `false` when the group's
    /// window is spent.
    fn spend(&mut self, group: &'static str) -> bool {
        let window = self.config.window.as_nanos().max(1);
        let index = u64::try_from(unix_now().as_nanos() / window).unwrap_or(u64::MAX);
        if index != self.window_index {
            self.window_index = index;
            let refused = self.used.get("refused").copied();
            self.used.clear();
            if let Some(r) = refused {
                self.used.insert("refused", r);
            }
        }
        let limit = match group {
            "writes" => self.config.writes_per_window,
            "operation_reads" => self.config.operation_reads_per_window,
            _ => self.config.reads_per_window,
        };
        let used = self.used.entry(group).or_default();
        if *used >= limit {
            *self.used.entry("refused").or_default() += 1;
            return false;
        }
        *used += 1;
        true
    }

    fn route_json(&self, r: &FakeRoute) -> Value {
        let mut v = json!({
            "kind": "compute#route",
            "id": r.id.to_string(),
            "creationTimestamp": r.created,
            "name": r.name,
            "description": r.description,
            "network": r.network,
            "destRange": r.dest_range,
            "priority": r.priority,
            "routeType": "STATIC",
            "selfLink": format!("{SELF_LINK_BASE}/projects/{}/global/routes/{}", self.config.project, r.name),
        });
        if let Some(hop) = &r.next_hop_instance {
            v["nextHopInstance"] = json!(hop);
            let warning = match self.instances.get(hop).map(|i| i.state) {
                Some(InstanceState::Running) => None,
                Some(InstanceState::Stopped) => Some((
                    "NEXT_HOP_NOT_RUNNING",
                    format!("Next hop instance '{hop}' is not running."),
                )),
                None => Some((
                    "NEXT_HOP_INSTANCE_NOT_FOUND",
                    format!("Next hop instance '{hop}' does not exist."),
                )),
            };
            if let Some((code, message)) = warning {
                v["warnings"] = json!([{
                    "code": code,
                    "message": message,
                    "data": [{"key": "instance", "value": hop}],
                }]);
            }
        }
        if let Some(gw) = &r.next_hop_gateway {
            v["nextHopGateway"] = json!(gw);
        }
        v
    }

    fn operation_json(&self, op: &OperationState) -> Value {
        let base = format!("{SELF_LINK_BASE}/projects/{}", self.config.project);
        let mut v = json!({
            "kind": "compute#operation",
            "id": op.id.to_string(),
            "name": op.name,
            "operationType": op.kind,
            "targetLink": op.target,
            "targetId": op.id.saturating_add(1).to_string(),
            "user": "fake@fake-project.iam.gserviceaccount.com",
            "insertTime": op.inserted,
            "startTime": op.inserted,
            "selfLink": format!("{base}/global/operations/{}", op.name),
            "status": if op.outcome.is_some() { "DONE" } else { "RUNNING" },
            "progress": if op.outcome.is_some() { 100 } else { 0 },
        });
        if let Some(end) = &op.ended {
            v["endTime"] = json!(end);
        }
        if let Some(Some((code, message))) = &op.outcome {
            let status = match code.as_str() {
                "QUOTA_EXCEEDED" | "RATE_LIMIT_EXCEEDED" => 403,
                "RESOURCE_NOT_FOUND" => 404,
                "RESOURCE_ALREADY_EXISTS" => 409,
                _ => 400,
            };
            v["httpErrorStatusCode"] = json!(status);
            v["httpErrorMessage"] = json!(match status {
                403 => "FORBIDDEN",
                404 => "NOT FOUND",
                409 => "CONFLICT",
                _ => "BAD REQUEST",
            });
            v["error"] = json!({"errors": [{"code": code, "message": message}]});
        }
        v
    }

    fn new_operation(&mut self, kind: &'static str, target: String, change: Change) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        let name = format!(
            "operation-{}-{:016x}",
            unix_now().as_millis(),
            id.wrapping_mul(0x9e37_79b9_7f4a_7c15)
        );
        let fail_with =
            (!self.failing_operations.is_empty()).then(|| self.failing_operations.remove(0));
        let op = OperationState {
            id,
            name: name.clone(),
            kind,
            target,
            inserted: timestamp(),
            finishes: Instant::now() + self.config.operation_duration,
            change,
            fail_with,
            outcome: None,
            ended: None,
        };
        let v = self.operation_json(&op);
        self.operations.insert(name, op);
        v
    }

    /// Routes in `network` plus the inserts still running into it.
    fn routes_in(&self, network: &str) -> usize {
        let pending = self
            .operations
            .values()
            .filter(|o| {
                o.outcome.is_none()
                    && matches!(&o.change, Change::Insert(r) if r.network == network)
            })
            .count();
        self.routes
            .values()
            .filter(|r| r.network == network)
            .count()
            + pending
    }
}

/// One parsed filter term: `field eq|ne regex`.
struct Term {
    field: String,
    negate: bool,
    pattern: Vec<(Atom, bool)>,
}

#[derive(Clone, Copy)]
enum Atom {
    Char(char),
    Any,
}

/// Parses the RE2 subset the fake implements; `Err` names what is not.
fn parse_regex(re: &str) -> Result<Vec<(Atom, bool)>, String> {
    let mut out: Vec<(Atom, bool)> = Vec::new();
    let mut chars = re.chars();
    while let Some(c) = chars.next() {
        let atom = match c {
            '\\' => Atom::Char(chars.next().ok_or("a trailing backslash")?),
            '.' => Atom::Any,
            '*' => match out.last_mut() {
                Some((_, star)) if !*star => {
                    *star = true;
                    continue;
                }
                _ => return Err("a `*` that repeats nothing".into()),
            },
            '+' | '?' | '(' | ')' | '|' | '[' | ']' | '{' | '}' | '^' | '$' => {
                return Err(format!(
                    "RE2 syntax {c:?}, which this fake does not implement"
                ));
            }
            c => Atom::Char(c),
        };
        out.push((atom, false));
    }
    Ok(out)
}

/// Whether `pattern` matches the whole of `text`.
fn full_match(pattern: &[(Atom, bool)], text: &[char]) -> bool {
    let one = |a: Atom, c: char| match a {
        Atom::Any => true,
        Atom::Char(x) => x == c,
    };
    match pattern.split_first() {
        None => text.is_empty(),
        Some((&(atom, false), rest)) => {
            !text.is_empty() && one(atom, text[0]) && full_match(rest, &text[1..])
        }
        Some((&(atom, true), rest)) => {
            let mut i = 0;
            loop {
                if full_match(rest, &text[i..]) {
                    return true;
                }
                if i < text.len() && one(atom, text[i]) {
                    i += 1;
                } else {
                    return false;
                }
            }
        }
    }
}

/// Parses a list filter: `(a eq "x") (b ne 'y')` or a single `a eq x`.
fn parse_filter(filter: &str) -> Result<Vec<Term>, String> {
    let filter = filter.trim();
    if filter.is_empty() {
        return Ok(Vec::new());
    }
    let mut pieces = Vec::new();
    if filter.starts_with('(') {
        let mut rest = filter;
        while let Some(open) = rest.find('(') {
            let mut depth = 0;
            let mut in_quote: Option<char> = None;
            let mut end = None;
            let mut escaped = false;
            for (i, c) in rest[open..].char_indices() {
                if escaped {
                    escaped = false;
                    continue;
                }
                match (c, in_quote) {
                    ('\\', _) => escaped = true,
                    ('"' | '\'', None) => in_quote = Some(c),
                    (q, Some(open_q)) if q == open_q => in_quote = None,
                    ('(', None) => depth += 1,
                    (')', None) => {
                        depth -= 1;
                        if depth == 0 {
                            end = Some(open + i);
                            break;
                        }
                    }
                    _ => {}
                }
            }
            let end = end.ok_or("unbalanced parentheses")?;
            pieces.push(&rest[open + 1..end]);
            rest = &rest[end + 1..];
        }
    } else {
        pieces.push(filter);
    }
    pieces
        .into_iter()
        .map(|p| {
            let p = p.trim();
            let (field, rest) = p
                .split_once(char::is_whitespace)
                .ok_or("a term without an operator")?;
            let rest = rest.trim_start();
            let (op, value) = rest
                .split_once(char::is_whitespace)
                .ok_or("a term without a value")?;
            let negate = match op {
                "eq" => false,
                "ne" => true,
                other => {
                    return Err(format!(
                        "operator {other:?} (only eq and ne take regular expressions)"
                    ));
                }
            };
            let value = value.trim();
            let value = ['"', '\'']
                .iter()
                .find_map(|q| value.strip_prefix(*q).and_then(|v| v.strip_suffix(*q)))
                .unwrap_or(value);
            Ok(Term {
                field: field.to_string(),
                negate,
                pattern: parse_regex(value)?,
            })
        })
        .collect()
}

fn matches(terms: &[Term], route: &Value) -> Result<bool, String> {
    for t in terms {
        let field = match t.field.as_str() {
            f @ ("name" | "network" | "description" | "destRange" | "nextHopInstance") => f,
            other => return Err(format!("field {other:?} is not filterable here")),
        };
        let text: Vec<char> = route[field].as_str().unwrap_or("").chars().collect();
        if full_match(&t.pattern, &text) == t.negate {
            return Ok(false);
        }
    }
    Ok(true)
}

fn query_param(uri: &Uri, key: &str) -> Option<String> {
    uri.query()?
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| percent_decode(v))
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(v) => {
                        out.push(v);
                        i += 3;
                        continue;
                    }
                    None => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The endpoint a request goes to, the project and the resource name.
fn endpoint_of(method: &Method, path: &str) -> (&'static str, String, String) {
    let parts: Vec<&str> = path.trim_end_matches('/').split('/').collect();
    match (method, parts.as_slice()) {
        (&Method::GET, ["", "compute", "v1", "projects", p, "global", "networks", n]) => {
            ("get_network", p.to_string(), n.to_string())
        }
        (
            &Method::GET,
            [
                "",
                "compute",
                "v1",
                "projects",
                p,
                "zones",
                z,
                "instances",
                i,
            ],
        ) => ("get_instance", p.to_string(), format!("{z}/{i}")),
        (&Method::GET, ["", "compute", "v1", "projects", p, "global", "routes"]) => {
            ("list", p.to_string(), String::new())
        }
        (&Method::POST, ["", "compute", "v1", "projects", p, "global", "routes"]) => {
            ("insert", p.to_string(), String::new())
        }
        (&Method::GET, ["", "compute", "v1", "projects", p, "global", "routes", r]) => {
            ("get_route", p.to_string(), r.to_string())
        }
        (&Method::DELETE, ["", "compute", "v1", "projects", p, "global", "routes", r]) => {
            ("delete", p.to_string(), r.to_string())
        }
        (
            &Method::GET,
            [
                "",
                "compute",
                "v1",
                "projects",
                p,
                "global",
                "operations",
                o,
            ],
        ) => ("get_operation", p.to_string(), o.to_string()),
        (
            &Method::POST,
            [
                "",
                "compute",
                "v1",
                "projects",
                p,
                "global",
                "operations",
                o,
                "wait",
            ],
        ) => ("wait_operation", p.to_string(), o.to_string()),
        _ => ("unknown", String::new(), String::new()),
    }
}

fn group_of(endpoint: &str) -> &'static str {
    match endpoint {
        "insert" | "delete" => "writes",
        "get_operation" | "wait_operation" => "operation_reads",
        _ => "reads",
    }
}

/// The metadata server's token of the instance's default account, and its
/// universe domain, for requests with `Metadata-Flavor: Google`.
const METADATA_TOKEN: &str = "/computeMetadata/v1/instance/service-accounts/default/token";
const METADATA_UNIVERSE: &str = "/computeMetadata/v1/universe/universe-domain";
/// The token the metadata server hands out.
pub const METADATA_ACCESS_TOKEN: &str = "ya29.fake-metadata";

/// The metadata server's and IAM Credentials' answers: `None` for a
/// Compute request.
fn token_answer(
    state: &Shared,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: &Bytes,
) -> Option<Response> {
    let path = uri.path();
    if path == METADATA_TOKEN || path == METADATA_UNIVERSE {
        let mut s = lock(state);
        *s.requests.entry("metadata".to_string()).or_default() += 1;
        if headers.get("metadata-flavor").is_none_or(|v| v != "Google") {
            return Some(test_server::json_response(
                StatusCode::FORBIDDEN,
                json!("Missing Metadata-Flavor"),
                [],
            ));
        }
        if path == METADATA_UNIVERSE {
            return Some(axum::response::IntoResponse::into_response((
                StatusCode::OK,
                "googleapis.com",
            )));
        }
        return Some(test_server::json_response(
            StatusCode::OK,
            json!({"access_token": METADATA_ACCESS_TOKEN, "expires_in": 3599, "token_type": "Bearer"}),
            [],
        ));
    }
    let account = path
        .strip_prefix("/v1/projects/-/serviceAccounts/")
        .and_then(|p| p.strip_suffix(":generateAccessToken"))?;
    let mut s = lock(state);
    *s.requests
        .entry("generate_access_token".to_string())
        .or_default() += 1;
    if method != Method::POST {
        let (status, value) = error(StatusCode::METHOD_NOT_ALLOWED, "badRequest", "POST only");
        return Some(test_server::json_response(status, value, []));
    }
    let expected = format!("Bearer {METADATA_ACCESS_TOKEN}");
    if headers
        .get("authorization")
        .is_none_or(|v| v != expected.as_str())
    {
        let (status, value) = error(
            StatusCode::UNAUTHORIZED,
            "authError",
            "Request had invalid authentication credentials.",
        );
        return Some(test_server::json_response(status, value, []));
    }
    s.token_bodies
        .push(String::from_utf8_lossy(body).to_string());
    let n = s.token_bodies.len();
    let expiry = rfc3339(unix_now() + s.token_lifetime);
    Some(test_server::json_response(
        StatusCode::OK,
        json!({"accessToken": format!("ya29.generated-{n}-for-{account}"), "expireTime": expiry}),
        [],
    ))
}

async fn handle(
    State(state): State<Shared>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Some(answer) = token_answer(&state, &method, &uri, &headers, &body) {
        return answer;
    }
    let latency = lock(&state).config.latency;
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    let (endpoint, project, resource) = endpoint_of(&method, uri.path());
    let (status, value) = {
        let mut s = lock(&state);
        *s.requests.entry(endpoint.to_string()).or_default() += 1;
        let auth = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        *s.authorizations.entry(auth).or_default() += 1;
        s.tick(Instant::now());
        first_answer(&mut s, endpoint, &project, &resource, &uri, &body)
    };
    let (status, value) = match (status, value) {
        (None, _) => wait(&state, &resource).await,
        (Some(status), value) => (status, value),
    };
    lock(&state).answers.record(endpoint, status.as_u16());
    test_server::json_response(status, value, [])
}

/// Holds a `wait` until its operation is done or `max_wait` passed.
async fn wait(state: &Shared, name: &str) -> (StatusCode, Value) {
    let deadline = Instant::now() + lock(state).config.max_wait;
    loop {
        let next = {
            let mut s = lock(state);
            let now = Instant::now();
            s.tick(now);
            let Some(op) = s.operations.get(name) else {
                return error(
                    StatusCode::NOT_FOUND,
                    "notFound",
                    format!("The resource 'operations/{name}' was not found"),
                );
            };
            if op.outcome.is_some() || now >= deadline {
                return (StatusCode::OK, s.operation_json(op));
            }
            op.finishes.min(deadline)
        };
        tokio::time::sleep_until(next).await;
    }
}

/// The answer, or `None` for a wait that must block first.
fn first_answer(
    s: &mut FakeState,
    endpoint: &'static str,
    project: &str,
    resource: &str,
    uri: &Uri,
    body: &[u8],
) -> (Option<StatusCode>, Value) {
    let (status, v) = answer(s, endpoint, project, resource, uri, body);
    match status {
        Some(st) => (Some(st), v),
        None => (None, Value::Null),
    }
}

fn answer(
    s: &mut FakeState,
    endpoint: &'static str,
    project: &str,
    resource: &str,
    uri: &Uri,
    body: &[u8],
) -> (Option<StatusCode>, Value) {
    let done = |(st, v): (StatusCode, Value)| (Some(st), v);
    if endpoint == "unknown" {
        return done(error(StatusCode::NOT_FOUND, "notFound", "no such method"));
    }
    if !s.spend(group_of(endpoint)) {
        let group = group_of(endpoint);
        return done(error(
            StatusCode::FORBIDDEN,
            "rateLimitExceeded",
            format!(
                "Quota exceeded for quota metric '{group}' and limit '{group} per minute' of service \
                 'compute.googleapis.com' for consumer 'project_number:1'."
            ),
        ));
    }
    if let Some((status, reason)) = s.injected.take(endpoint) {
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        return done(error(status, &reason, "injected failure"));
    }
    if project != s.config.project {
        return done(error(
            StatusCode::NOT_FOUND,
            "notFound",
            format!("The resource 'projects/{project}' was not found"),
        ));
    }
    let base = format!("{SELF_LINK_BASE}/projects/{project}");
    match endpoint {
        "get_network" => match s.networks.get(resource) {
            Some(n) => {
                let mut v = json!({
                    "kind": "compute#network",
                    "id": n.id.to_string(),
                    "name": resource,
                    "selfLink": format!("{base}/global/networks/{resource}"),
                    "autoCreateSubnetworks": false,
                    "mtu": 1460,
                    "routingConfig": {"routingMode": "REGIONAL"},
                    "enableUlaInternalIpv6": n.ula_ipv6,
                });
                if n.ula_ipv6 {
                    v["internalIpv6Range"] = json!("fd20:0:0::/48");
                }
                done((StatusCode::OK, v))
            }
            None => done(error(
                StatusCode::NOT_FOUND,
                "notFound",
                format!(
                    "The resource 'projects/{project}/global/networks/{resource}' was not found"
                ),
            )),
        },
        "list" => {
            let terms = match query_param(uri, "filter")
                .map(|f| parse_filter(&f))
                .transpose()
            {
                Ok(t) => t.unwrap_or_default(),
                Err(e) => {
                    return done(error(
                        StatusCode::BAD_REQUEST,
                        "invalid",
                        format!("Invalid list filter expression: {e}"),
                    ));
                }
            };
            let max = query_param(uri, "maxResults")
                .and_then(|m| m.parse::<usize>().ok())
                .unwrap_or(500)
                .clamp(1, 500);
            let start = query_param(uri, "pageToken")
                .and_then(|t| t.parse::<usize>().ok())
                .unwrap_or(0);
            let mut all = Vec::new();
            for r in s.routes.values() {
                let v = s.route_json(r);
                match matches(&terms, &v) {
                    Ok(true) => all.push(v),
                    Ok(false) => {}
                    Err(e) => {
                        return done(error(
                            StatusCode::BAD_REQUEST,
                            "invalid",
                            format!("Invalid list filter expression: {e}"),
                        ));
                    }
                }
            }
            let page: Vec<Value> = all.iter().skip(start).take(max).cloned().collect();
            let mut v = json!({
                "kind": "compute#routeList",
                "id": format!("projects/{project}/global/routes"),
                "selfLink": format!("{base}/global/routes"),
            });
            if !page.is_empty() {
                v["items"] = json!(page);
            }
            if start + max < all.len() {
                v["nextPageToken"] = json!((start + max).to_string());
            }
            done((StatusCode::OK, v))
        }
        "get_instance" => {
            // `resource` is `<zone>/<instance>`.
            let (zone, name) = resource.split_once('/').unwrap_or_default();
            let url = format!("{base}/zones/{zone}/instances/{name}");
            match s.instances.get(&url) {
                Some(i) => {
                    // The fake does not say which network an instance is on:
                    // the first one, which is the cluster's in every test.
                    let network = s.networks.keys().next().cloned().unwrap_or_default();
                    done((
                        StatusCode::OK,
                        instance_json(&url, zone, name, &network, i, &base),
                    ))
                }
                None => done(error(
                    StatusCode::NOT_FOUND,
                    "notFound",
                    format!(
                        "The resource 'projects/{project}/zones/{zone}/instances/{name}' was not found"
                    ),
                )),
            }
        }
        "get_route" => match s.routes.get(resource) {
            Some(r) => done((StatusCode::OK, s.route_json(r))),
            None => done(error(
                StatusCode::NOT_FOUND,
                "notFound",
                format!("The resource 'projects/{project}/global/routes/{resource}' was not found"),
            )),
        },
        "insert" => done(insert(s, project, body)),
        "delete" => {
            let pending_delete = s
                .operations
                .values()
                .any(|o| o.outcome.is_none() && o.change == Change::Delete(resource.to_string()));
            if !s.routes.contains_key(resource) {
                return done(error(
                    StatusCode::NOT_FOUND,
                    "notFound",
                    format!(
                        "The resource 'projects/{project}/global/routes/{resource}' was not found"
                    ),
                ));
            }
            if pending_delete {
                return done(error(
                    StatusCode::BAD_REQUEST,
                    "resourceNotReady",
                    format!(
                        "The resource 'projects/{project}/global/routes/{resource}' is not ready"
                    ),
                ));
            }
            let target = format!("{base}/global/routes/{resource}");
            let v = s.new_operation("delete", target, Change::Delete(resource.to_string()));
            done((StatusCode::OK, v))
        }
        "get_operation" => match s.operations.get(resource) {
            Some(op) => done((StatusCode::OK, s.operation_json(op))),
            None => done(error(
                StatusCode::NOT_FOUND,
                "notFound",
                format!(
                    "The resource 'projects/{project}/global/operations/{resource}' was not found"
                ),
            )),
        },
        // Blocks outside the lock.
        "wait_operation" => (None, Value::Null),
        _ => done(error(StatusCode::NOT_FOUND, "notFound", "no such method")),
    }
}

/// The `Instance` resource as `instances.get` answers it, with the fields
/// a Node's instance has in a routes-based cluster.
fn instance_json(
    url: &str,
    zone: &str,
    name: &str,
    network: &str,
    i: &FakeInstance,
    base: &str,
) -> Value {
    json!({
        "kind": "compute#instance",
        "id": i.id.to_string(),
        "creationTimestamp": timestamp(),
        "name": name,
        "zone": format!("{base}/zones/{zone}"),
        "machineType": format!("{base}/zones/{zone}/machineTypes/e2-standard-2"),
        "status": match i.state {
            InstanceState::Running => "RUNNING",
            InstanceState::Stopped => "TERMINATED",
        },
        "canIpForward": i.can_ip_forward,
        "networkInterfaces": [{
            "kind": "compute#networkInterface",
            "name": "nic0",
            "network": format!("{base}/global/networks/{network}"),
            "stackType": "IPV4_ONLY",
        }],
        "selfLink": url,
    })
}

fn insert(s: &mut FakeState, project: &str, body: &[u8]) -> (StatusCode, Value) {
    let bad = |m: String| error(StatusCode::BAD_REQUEST, "invalid", m);
    let Ok(v) = serde_json::from_slice::<Value>(body) else {
        return bad("Invalid JSON payload received.".into());
    };
    let text = |k: &str| v[k].as_str().map(str::to_string);
    let Some(name) = text("name") else {
        return bad("Invalid value for field 'resource.name': ''. Must be set.".into());
    };
    if !valid_name(&name) {
        return bad(format!(
            "Invalid value for field 'resource.name': '{name}'. Must be a match of regex '(?:[a-z](?:[-a-z0-9]{{0,61}}[a-z0-9])?)'"
        ));
    }
    let Some(network) = text("network") else {
        return bad("Invalid value for field 'resource.network': ''. Must be set.".into());
    };
    let network_name = network.rsplit('/').next().unwrap_or_default().to_string();
    let network_url = format!("{SELF_LINK_BASE}/projects/{project}/global/networks/{network_name}");
    let owner_ok = network
        .find("projects/")
        .map(|at| &network[at..])
        .is_some_and(|p| p == format!("projects/{project}/global/networks/{network_name}"))
        || network == network_name;
    let Some(net) = s.networks.get(&network_name).filter(|_| owner_ok).cloned() else {
        return error(
            StatusCode::NOT_FOUND,
            "notFound",
            format!("The resource '{network}' was not found"),
        );
    };
    let Some(dest) = text("destRange") else {
        return bad("Invalid value for field 'resource.destRange': ''. Must be set.".into());
    };
    let cidr = match Cidr::parse(&dest) {
        Ok(c) => c,
        Err(_) => {
            return bad(format!(
                "Invalid value for field 'resource.destRange': '{dest}'."
            ));
        }
    };
    if cidr.family() == IpFamily::V6 && !net.ula_ipv6 {
        return bad(format!(
            "Invalid value for field 'resource.destRange': '{dest}'. IPv6 static routes need a network with an internal IPv6 range."
        ));
    }
    let hops = [
        "nextHopInstance",
        "nextHopIp",
        "nextHopGateway",
        "nextHopIlb",
        "nextHopVpnTunnel",
    ]
    .iter()
    .filter(|k| v[**k].as_str().is_some_and(|s| !s.is_empty()))
    .count();
    if hops != 1 {
        return bad("Exactly one next hop must be set.".into());
    }
    let instance = text("nextHopInstance").map(|hop| {
        // A partial URL is completed against the API's base, as GCE does.
        let path = hop.find("projects/").map_or(hop.as_str(), |at| &hop[at..]);
        if path.starts_with("projects/") {
            format!("{SELF_LINK_BASE}/{path}")
        } else {
            format!(
                "{SELF_LINK_BASE}/projects/{project}/{}",
                hop.trim_start_matches('/')
            )
        }
    });
    if s.routes.contains_key(&name)
        || s.operations.values().any(|o| {
            o.outcome.is_none() && matches!(&o.change, Change::Insert(r) if r.name == name)
        })
    {
        return error(
            StatusCode::CONFLICT,
            "alreadyExists",
            format!("The resource 'projects/{project}/global/routes/{name}' already exists"),
        );
    }
    if s.routes_in(&network_url) >= s.config.max_routes {
        return error(
            StatusCode::FORBIDDEN,
            "quotaExceeded",
            format!(
                "Quota 'ROUTES' exceeded. Limit: {}.0 globally.",
                s.config.max_routes
            ),
        );
    }
    let id = s.next_id;
    s.next_id += 1;
    let route = FakeRoute {
        name: name.clone(),
        network: network_url,
        dest_range: cidr.to_string(),
        next_hop_instance: instance.clone(),
        next_hop_gateway: text("nextHopGateway"),
        priority: v["priority"]
            .as_u64()
            .and_then(|p| u32::try_from(p).ok())
            .unwrap_or(1000),
        description: text("description").unwrap_or_default(),
        id,
        created: timestamp(),
    };
    let target = format!("{SELF_LINK_BASE}/projects/{project}/global/routes/{name}");
    // A next hop that does not exist fails the operation, not the request.
    if let Some(hop) = &instance
        && !s.instances.contains_key(hop)
    {
        s.failing_operations.insert(
            0,
            (
                "RESOURCE_NOT_FOUND".into(),
                format!("The resource '{hop}' was not found"),
            ),
        );
    }
    let v = s.new_operation("insert", target, Change::Insert(route));
    (StatusCode::OK, v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(re: &str, text: &str) -> bool {
        let p = parse_regex(re).unwrap();
        full_match(&p, &text.chars().collect::<Vec<_>>())
    }

    #[test]
    fn the_filter_subset_matches_whole_fields() {
        assert!(m("k8s-.*", "k8s-10-244-1-0-24"));
        assert!(!m("k8s-.*", "other-k8s-1"));
        assert!(m("a\\.b", "a.b"));
        assert!(!m("a\\.b", "axb"));
        assert!(m("a.b", "axb"));
        assert!(!m("k8s", "k8s-1"), "the whole field must match");
        assert!(parse_regex("a+").is_err());
        assert!(parse_regex("(a|b)").is_err());
        let terms = parse_filter("(name eq \"k8s-.*\") (description eq 'k8s-node-route')").unwrap();
        assert_eq!(terms.len(), 2);
        let route = json!({"name": "k8s-1", "description": "k8s-node-route"});
        assert!(matches(&terms, &route).unwrap());
        let other = json!({"name": "k8s-1", "description": "terraform"});
        assert!(!matches(&terms, &other).unwrap());
        let single = parse_filter("name ne k8s-.*").unwrap();
        assert!(matches(&single, &other).is_ok_and(|m| !m));
        assert!(parse_filter("(name = \"x\")").is_err());
    }

    #[test]
    fn query_values_are_percent_decoded() {
        assert_eq!(
            percent_decode("%28name+eq+%22a%5C.b%22%29"),
            "(name eq \"a\\.b\")"
        );
        assert_eq!(percent_decode("100%"), "100%");
    }
}
