//! The Azure provider: the routes of one ARM route table
//! (`Microsoft.Network/routeTables`, kubenet's shape), written as a whole.
//!
//! A route is `addressPrefix` (a Node's pod CIDR) + `nextHopType:
//! VirtualAppliance` + `nextHopIpAddress` (that Node's InternalIP of the same
//! family), named like upstream's (see [`names`]). This crate owns the
//! translation between [`route_core::Route`]s and the table, ARM tokens, and
//! the one write path ARM has that does not lose concurrent changes:
//!
//! * every change of a reconcile (a [`Batch`]) is merged into the table as
//!   last read and sent as **one** `PUT` of the whole table with
//!   `If-Match: <etag>`;
//! * a `412 Precondition Failed` means someone else wrote the table since:
//!   the table is read again and the same changes are merged into what is
//!   there now, up to `maxConflictRetries` times, so the other writer's
//!   routes are kept (no lost update; the loop is
//!   [`route_cloud::conditional`]'s);
//! * the `PUT` is a long-running operation: its `Azure-AsyncOperation`
//!   status is polled (honouring `Retry-After`) until it ends, then the table
//!   is read once more for the new ETag and to confirm the result.
//!
//! **Ownership.** A route table is often shared with other routes (a default
//! route to a firewall, peering routes). A route is this cluster's only when
//! its name is one of the two formats this controller writes (the node name,
//! or `<node>____<prefix without : . />` for exactly its own prefix, the
//! node part a valid Node name), its next hop type is `VirtualAppliance` and
//! its next hop is an IP address of the prefix's family. A route whose name
//! is a Node that does not exist (a Node that is gone, or a hand-made route
//! named like one: upstream's single-stack format is the bare node name, so
//! the name alone cannot tell) is this cluster's only once the controller
//! has shown a snapshot of the Nodes and, with `nodeSubnets` set, only when
//! its next hop is inside one of them. Any other route is not listed, so it
//! is never deleted, and every whole-table write sends it back unchanged.
//! The controller itself deletes only routes inside the cluster CIDRs.
//!
//! **Forwarding.** A `VirtualAppliance` route carries traffic only to a NIC
//! with IP forwarding on; [`forwarding`] reads each Node's primary NIC once
//! and reports the Nodes whose NIC has it off, without changing the NIC.

pub mod client_cert;
pub mod config;
mod entry;
pub mod forwarding;
pub mod names;
pub mod permissions;
#[cfg(feature = "testing")]
pub mod testing;

pub use entry::PROVIDER;

mod client;

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use reqwest::{Method, StatusCode};
use route_cloud::{
    Batch, BatchResult, Capabilities, CloudError, CloudRoutes, ErrorKind, Forwarding,
    ForwardingCheck, RequestStats,
};
use route_core::{Destination, IpFamily, NodeAddress, NodeView, OpKey, Route, TargetNeeds};
use serde_json::{Map, Value, json};
use tokio::time::Instant;

pub use config::{AzureConfig, ConfigError, Credential};

use client::{Answer, Http, classify_code};

/// Stats operation names, one per kind of request.
pub mod ops {
    /// `POST {authority}/{tenant}/oauth2/v2.0/token`, or the IMDS token.
    pub const TOKEN: &str = "token";
    /// `GET` of the route table for a list.
    pub const LIST: &str = "list";
    /// `GET` of the route table before or after a write (a fresh ETag).
    pub const GET_TABLE: &str = "get_table";
    /// `PUT` of the whole route table with `If-Match`.
    pub const PUT_TABLE: &str = "put_table";
    /// `GET` of an `Azure-AsyncOperation` status.
    pub const POLL: &str = "poll_operation";
    /// `GET` of a Node's VM, for its primary NIC (forwarding check).
    pub const GET_VM: &str = "get_vm";
    /// `GET` of a Node's primary NIC, for `enableIPForwarding`.
    pub const GET_NIC: &str = "get_nic";
    /// `GET` of every NIC of a resource group (a page of them), for a fresh
    /// forwarding check of the NICs read before.
    pub const LIST_NICS: &str = "list_nics";
}

/// The next hop type of every route this controller writes.
const VIRTUAL_APPLIANCE: &str = "VirtualAppliance";

/// One route of the table: what ownership needs, plus its properties as
/// read, so a route of someone else goes back unchanged.
#[derive(Debug, Clone, PartialEq)]
struct RawRoute {
    name: String,
    prefix: String,
    hop_type: String,
    hop: String,
    /// `properties` without the read-only fields.
    properties: Map<String, Value>,
}

impl RawRoute {
    fn from_json(v: &Value) -> Option<Self> {
        let name = v["name"].as_str()?.to_string();
        let mut properties = v["properties"].as_object().cloned().unwrap_or_default();
        // Read-only: ARM fills them in; sending them back is pointless.
        properties.remove("provisioningState");
        properties.remove("hasBgpOverride");
        Some(Self {
            prefix: properties
                .get("addressPrefix")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string(),
            hop_type: properties
                .get("nextHopType")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string(),
            hop: properties
                .get("nextHopIpAddress")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string(),
            name,
            properties,
        })
    }

    fn ours(name: String, prefix: String, hop: String) -> Self {
        let mut properties = Map::new();
        properties.insert("addressPrefix".into(), Value::String(prefix.clone()));
        properties.insert(
            "nextHopType".into(),
            Value::String(VIRTUAL_APPLIANCE.into()),
        );
        properties.insert("nextHopIpAddress".into(), Value::String(hop.clone()));
        Self {
            name,
            prefix,
            hop_type: VIRTUAL_APPLIANCE.into(),
            hop,
            properties,
        }
    }

    fn to_json(&self) -> Value {
        json!({ "name": self.name, "properties": self.properties })
    }

    fn same_name(&self, other: &str) -> bool {
        // ARM resource names are case-insensitive.
        self.name.eq_ignore_ascii_case(other)
    }

    fn same_prefix(&self, prefix: &str) -> bool {
        canonical(&self.prefix) == canonical(prefix)
    }

    fn same_target(&self, other: &RawRoute) -> bool {
        self.same_prefix(&other.prefix)
            && self.hop_type.eq_ignore_ascii_case(&other.hop_type)
            && self.hop.trim().parse::<IpAddr>().ok() == other.hop.trim().parse::<IpAddr>().ok()
    }
}

fn canonical(prefix: &str) -> String {
    match Destination::parse(prefix) {
        Destination::Cidr(c) => c.to_string(),
        Destination::Unparsable(s) => s.trim().to_ascii_lowercase(),
    }
}

/// The table as last read.
#[derive(Debug, Clone, Default)]
struct TableState {
    etag: Option<String>,
    routes: Vec<RawRoute>,
    /// Entries without a name, which a whole-table write could not resend.
    malformed: usize,
    location: Value,
    tags: Value,
    disable_bgp_route_propagation: Value,
}

impl TableState {
    fn from_answer(body: &Value) -> Result<Self, CloudError> {
        if !body.is_object() {
            return Err(CloudError::new(
                ErrorKind::Transient,
                "the route table answer is not an object",
            ));
        }
        let mut state = TableState {
            etag: body["etag"].as_str().map(str::to_string),
            location: body["location"].clone(),
            tags: body["tags"].clone(),
            disable_bgp_route_propagation: body["properties"]["disableBgpRoutePropagation"].clone(),
            ..TableState::default()
        };
        for r in body["properties"]["routes"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or(&[])
        {
            match RawRoute::from_json(r) {
                Some(raw) => state.routes.push(raw),
                None => state.malformed += 1,
            }
        }
        Ok(state)
    }

    /// The body of a whole-table `PUT` with `routes`: everything writable
    /// the table had, so nothing but the routes changes.
    fn put_body(&self, routes: &[RawRoute]) -> Value {
        let mut properties = Map::new();
        properties.insert(
            "routes".into(),
            Value::Array(routes.iter().map(RawRoute::to_json).collect()),
        );
        if !self.disable_bgp_route_propagation.is_null() {
            properties.insert(
                "disableBgpRoutePropagation".into(),
                self.disable_bgp_route_propagation.clone(),
            );
        }
        let mut body = Map::new();
        if !self.location.is_null() {
            body.insert("location".into(), self.location.clone());
        }
        if !self.tags.is_null() {
            body.insert("tags".into(), self.tags.clone());
        }
        body.insert("properties".into(), Value::Object(properties));
        Value::Object(body)
    }
}

/// The Azure route-table provider.
pub struct AzureRoutes {
    config: Arc<AzureConfig>,
    http: Http,
    table_path: String,
    /// The Nodes' addresses, by name, from the controller's snapshot (and
    /// from creations, for Nodes not in a snapshot yet).
    nodes: Mutex<HashMap<String, Vec<NodeAddress>>>,
    /// Set by the first snapshot of Nodes: before it, a route to a Node not
    /// known is not called this cluster's.
    populated: AtomicBool,
    last_seen: Mutex<Option<TableState>>,
    /// Writes of this process go one at a time; a 412 then only comes from
    /// another writer.
    write_lock: tokio::sync::Mutex<()>,
    conflict_retries: AtomicU64,
    /// The Nodes' primary NICs and their `enableIPForwarding`, as read.
    forwarding: Mutex<forwarding::Memory>,
}

impl std::fmt::Debug for AzureRoutes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AzureRoutes")
            .field("table", &self.table_path)
            .field("http", &self.http)
            .finish_non_exhaustive()
    }
}

impl AzureRoutes {
    /// A provider for `config`. No request is made until the first call.
    pub fn new(config: AzureConfig) -> Result<Self, CloudError> {
        config
            .validate()
            .map_err(|e| CloudError::new(ErrorKind::Permanent, e.to_string()))?;
        if !config.ignored.is_empty() {
            // Names only: a value may be a secret.
            let keys: Vec<&str> = config.ignored.keys().map(String::as_str).collect();
            tracing::debug!(keys = ?keys, "azure cloud config keys not used by the route controller");
        }
        Ok(Self {
            http: Http::new(&config)?,
            table_path: config.table_path(),
            config: Arc::new(config),
            nodes: Mutex::new(HashMap::new()),
            populated: AtomicBool::new(false),
            last_seen: Mutex::new(None),
            write_lock: tokio::sync::Mutex::new(()),
            conflict_retries: AtomicU64::new(0),
            forwarding: Mutex::new(forwarding::Memory::default()),
        })
    }

    /// Checks `fence` after every wait of this provider's own (its write
    /// budget, throttling pauses) before sending a change.
    pub fn with_fence(mut self, fence: route_cloud::Fence) -> Self {
        self.http.kit.set_fence(fence);
        self
    }

    /// How many whole-table writes were sent again after a `412`.
    pub fn conflict_retries(&self) -> u64 {
        self.conflict_retries.load(Ordering::Relaxed)
    }

    fn remember(&self, state: &TableState) {
        *self.last_seen.lock().unwrap_or_else(|e| e.into_inner()) = Some(state.clone());
    }

    fn remembered(&self) -> Option<TableState> {
        self.last_seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn forget(&self) {
        *self.last_seen.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    async fn get_table(&self, op: &'static str) -> Result<TableState, CloudError> {
        let a = self
            .http
            .call(op, Method::GET, &self.table_path, None, None)
            .await
            .map_err(|e| self.explain_missing(e))?;
        let state = TableState::from_answer(&a.body)?;
        self.remember(&state);
        Ok(state)
    }

    fn explain_missing(&self, e: CloudError) -> CloudError {
        if e.kind != ErrorKind::NotFound {
            return e;
        }
        CloudError {
            message: format!(
                "route table {} does not exist (create it and associate it with the Nodes' subnet): {}",
                self.table_path, e.message
            ),
            ..e
        }
    }

    /// The route as `list_routes` shows it, or `None` when it is not this
    /// cluster's.
    fn to_route(&self, raw: &RawRoute) -> Option<Route> {
        if !raw.hop_type.eq_ignore_ascii_case(VIRTUAL_APPLIANCE) {
            return None;
        }
        let node = names::node_of(&raw.name, &raw.prefix)?;
        let hop: IpAddr = raw.hop.trim().parse().ok()?;
        let cidr = match Destination::parse(&raw.prefix) {
            Destination::Cidr(c) => c,
            Destination::Unparsable(text) => {
                // Visible to an operator, never deleted.
                let mut r = Route::new(node, Destination::Unparsable(text)).named(raw.name.clone());
                r.next_hop = hop.to_string().into();
                return Some(r);
            }
        };
        if (cidr.family() == IpFamily::V4) != hop.is_ipv4() {
            return None;
        }
        let addresses = {
            let nodes = self.nodes.lock().unwrap_or_else(|e| e.into_inner());
            match nodes.get(&node) {
                Some(addrs) if internal_ips(addrs).any(|ip| ip == hop) => addrs.clone(),
                // The Node has another address now: only the stale hop, so
                // an address comparison asks for a new route.
                Some(_) => vec![NodeAddress::internal_ip(hop.to_string())],
                // No such Node: a route of a Node that is gone, or a
                // hand-made route whose name looks like a Node's. Only a
                // complete snapshot and a next hop in the Nodes' subnets
                // make it this cluster's.
                None => {
                    if !self.populated.load(Ordering::Relaxed) {
                        return None;
                    }
                    if !(self.config.node_subnets.is_empty()
                        || self.config.node_subnets.iter().any(|s| s.contains(hop)))
                    {
                        // Provably not this cluster's: listed so that a pod
                        // CIDR over it gets a Warning, never deleted.
                        let mut r = Route::new("", cidr).named(raw.name.clone());
                        r.next_hop = hop.to_string().into();
                        r.foreign = Some(
                            format!("the next hop {hop}, outside this cluster's nodeSubnets")
                                .into(),
                        );
                        return Some(r);
                    }
                    vec![NodeAddress::internal_ip(hop.to_string())]
                }
            }
        };
        let mut route = Route::new(node, cidr)
            .named(raw.name.clone())
            .with_addresses(addresses, true);
        route.next_hop = hop.to_string().into();
        Some(route)
    }

    /// The route to write for a creation.
    fn raw_for_create(&self, route: &Route) -> Result<RawRoute, CloudError> {
        let Some(cidr) = route.destination.cidr() else {
            return Err(CloudError::new(
                ErrorKind::InvalidRequest,
                format!("cannot create a route to unparsable {}", route.destination),
            ));
        };
        if route.node.is_empty() {
            return Err(CloudError::new(
                ErrorKind::InvalidRequest,
                format!("the route for {cidr} names no node"),
            ));
        }
        let family = cidr.family();
        let hop = internal_ips(&route.node_addresses)
            .find(|ip| ip.is_ipv4() == (family == IpFamily::V4))
            .ok_or_else(|| {
                CloudError::new(
                    ErrorKind::InvalidRequest,
                    format!(
                        "node {:?} has no {family} InternalIP to route {cidr} to",
                        route.node
                    ),
                )
            })?;
        let prefix = cidr.to_string();
        Ok(RawRoute::ours(
            names::route_name(self.config.ipv6_dual_stack_enabled, &route.node, &prefix),
            prefix,
            hop.to_string(),
        ))
    }

    /// Merges the changes into `current`: the routes to write, and the
    /// answer of every change decided without the cloud.
    fn merge(
        &self,
        current: &TableState,
        deletions: &[(&OpKey, String, String)],
        creations: &[(&OpKey, RawRoute)],
        results: &mut BatchResult,
    ) -> Vec<RawRoute> {
        let mut routes = current.routes.clone();
        for (_, name, prefix) in deletions {
            // Gone already is done as well.
            routes.retain(|r| !(r.same_name(name) && r.same_prefix(prefix)));
        }
        for (key, want) in creations {
            let mut refuse = |e| {
                results.insert((*key).clone(), Err(e));
            };
            if let Some(i) = routes.iter().position(|r| r.same_name(&want.name)) {
                let have = &routes[i];
                if have.same_target(want) {
                    continue;
                }
                if have.same_prefix(&want.prefix) {
                    // Same Node, same prefix, new next hop: a PUT by name
                    // replaces it.
                    routes[i] = want.clone();
                    continue;
                }
                refuse(CloudError::new(
                    ErrorKind::InvalidRequest,
                    format!(
                        "route {} already routes {} and route names are one per Node; set ipv6DualStackEnabled to name routes per pod CIDR ({} was asked for)",
                        have.name, have.prefix, want.prefix
                    ),
                ));
                continue;
            }
            if let Some(other) = routes.iter().find(|r| r.same_prefix(&want.prefix)) {
                refuse(CloudError::new(
                    ErrorKind::InvalidRequest,
                    format!(
                        "{} is already routed by route {:?} of the table, which is not this cluster's; Azure refuses two routes with one address prefix",
                        want.prefix, other.name
                    ),
                ));
                continue;
            }
            if routes.len() >= self.config.max_routes {
                refuse(CloudError::new(
                    ErrorKind::QuotaExceeded,
                    format!(
                        "route table {} holds {} routes, at most {} are allowed (maxRoutes); {} was not added",
                        self.config.route_table_name,
                        routes.len(),
                        self.config.max_routes,
                        want.prefix
                    ),
                ));
                continue;
            }
            routes.push(want.clone());
        }
        routes
    }

    /// Waits for the long-running operation a `PUT` started.
    async fn wait_operation(&self, put: &Answer) -> Result<(), CloudError> {
        let url = put
            .header("azure-asyncoperation")
            .or_else(|| put.header("location"))
            .map(str::to_string);
        let Some(url) = url else {
            // Finished synchronously.
            return Ok(());
        };
        let deadline = Instant::now() + Duration::from_secs(self.config.operation_timeout_seconds);
        let mut wait = self.poll_wait(put);
        loop {
            tokio::time::sleep(wait).await;
            if Instant::now() > deadline {
                return Err(CloudError::new(
                    ErrorKind::Timeout,
                    format!(
                        "the route table update did not finish within {} s",
                        self.config.operation_timeout_seconds
                    ),
                ));
            }
            let a = match self
                .http
                .call(ops::POLL, Method::GET, &url, None, None)
                .await
            {
                Ok(a) => a,
                // A busy or briefly failing status endpoint says nothing
                // about the operation: poll again.
                Err(e) if matches!(e.kind, ErrorKind::Throttled | ErrorKind::Transient) => {
                    wait = e
                        .retry_after
                        .unwrap_or(Duration::from_millis(
                            self.config.operation_poll_interval_ms,
                        ))
                        .min(Duration::from_millis(
                            self.config.operation_poll_max_ms.max(1),
                        ));
                    continue;
                }
                Err(e) => return Err(e),
            };
            if a.status == StatusCode::ACCEPTED {
                wait = self.poll_wait(&a);
                continue;
            }
            match a.body["status"].as_str() {
                Some(s) if s.eq_ignore_ascii_case("Succeeded") => return Ok(()),
                Some(s)
                    if s.eq_ignore_ascii_case("Failed") || s.eq_ignore_ascii_case("Canceled") =>
                {
                    let e = &a.body["error"];
                    return Err(classify_code(
                        e["code"].as_str().unwrap_or("OperationFailed"),
                        e["message"].as_str().unwrap_or(s),
                    ));
                }
                Some(_) => wait = self.poll_wait(&a),
                None => return Ok(()),
            }
        }
    }

    /// `Retry-After` when the answer has one above zero, else the poll
    /// interval (a `0` would make a busy loop), at most the poll maximum.
    fn poll_wait(&self, a: &Answer) -> Duration {
        client::retry_after(&a.headers)
            .filter(|d| !d.is_zero())
            .unwrap_or(Duration::from_millis(
                self.config.operation_poll_interval_ms,
            ))
            .min(Duration::from_millis(
                self.config.operation_poll_max_ms.max(1),
            ))
    }

    /// Applies deletions then creations in one whole-table write.
    async fn apply(&self, batch: &Batch) -> Result<BatchResult, CloudError> {
        let mut results: BatchResult = batch.keys().map(|k| (k.clone(), Ok(None))).collect();
        let mut deletions = Vec::new();
        for (key, r) in &batch.delete {
            match &r.destination {
                Destination::Cidr(c) if !r.name.is_empty() => {
                    deletions.push((key, r.name.to_string(), c.to_string()));
                }
                other => {
                    results.insert(
                        key.clone(),
                        Err(CloudError::new(
                            ErrorKind::InvalidRequest,
                            format!("refusing to delete route {:?} to {other}", r.name),
                        )),
                    );
                }
            }
        }
        let mut creations = Vec::new();
        for (key, _hint, r) in &batch.create {
            match self.raw_for_create(r) {
                Ok(raw) => {
                    self.nodes
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .entry(r.node.to_string())
                        .or_insert_with(|| r.node_addresses.clone());
                    creations.push((key, raw));
                }
                Err(e) => {
                    results.insert(key.clone(), Err(e));
                }
            }
        }
        if deletions.is_empty() && creations.is_empty() {
            return Ok(results);
        }
        let _serial = self.write_lock.lock().await;
        // The ETag of the last answer usually still holds, which saves a
        // read; a 412 says when it does not.
        let known = self.remembered().filter(|s| s.etag.is_some()).map(|s| {
            let etag = s.etag.clone();
            (s, etag)
        });
        // The results as decided by the merge of the last table read.
        let mut decided_last = results.clone();
        let outcome = route_cloud::write_conditionally(
            self.config.max_conflict_retries,
            known,
            || async move {
                let s = self.get_table(ops::GET_TABLE).await?;
                let etag = s.etag.clone();
                Ok((s, etag))
            },
            |current: &TableState| {
                if current.malformed > 0 {
                    return Err(CloudError::new(
                        ErrorKind::InvalidRequest,
                        format!(
                            "route table {} holds {} routes without a name; a whole-table write would have to resend them",
                            self.config.route_table_name, current.malformed
                        ),
                    ));
                }
                let mut decided = results.clone();
                let routes = self.merge(current, &deletions, &creations, &mut decided);
                decided_last = decided;
                Ok((routes != current.routes).then(|| current.put_body(&routes)))
            },
            |body, etag: Option<String>| async move {
                let put = self
                    .http
                    .call(
                        ops::PUT_TABLE,
                        Method::PUT,
                        &self.table_path,
                        Some(&body),
                        etag.as_deref(),
                    )
                    .await;
                match put {
                    Ok(a) => {
                        // Whatever happens next, the remembered ETag is old.
                        self.forget();
                        self.wait_operation(&a).await?;
                        self.get_table(ops::GET_TABLE).await
                    }
                    Err(e) => {
                        // A 412 makes the remembered ETag stale (a retry
                        // reads the table again, which remembers it anew).
                        if matches!(e.kind, ErrorKind::Conflict | ErrorKind::NotFound) {
                            self.forget();
                        }
                        Err(self.explain_missing(e))
                    }
                }
            },
            |attempt| {
                self.conflict_retries.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(
                    table = self.config.route_table_name.as_str(),
                    attempt,
                    "the route table changed since it was read; reading it again"
                );
            },
        )
        .await?;
        results = decided_last;
        let state = match outcome {
            route_cloud::ConditionalWrite::Unchanged(s)
            | route_cloud::ConditionalWrite::Written(s) => s,
        };
        for (key, name, prefix) in &deletions {
            // A creation of the same name and prefix in this batch (a new
            // next hop) leaves a route of that name, rightly.
            let recreated = creations
                .iter()
                .any(|(_, c)| c.same_name(name) && c.same_prefix(prefix));
            if results.get(*key).is_some_and(Result::is_ok)
                && !recreated
                && let Some(still) = state
                    .routes
                    .iter()
                    .find(|r| r.same_name(name) && r.same_prefix(prefix))
            {
                results.insert(
                    (*key).clone(),
                    Err(CloudError::new(
                        ErrorKind::Transient,
                        format!("route {} is still in the table after the write", still.name),
                    )),
                );
            }
        }
        for (key, want) in &creations {
            if results.get(*key).is_none_or(Result::is_err) {
                continue;
            }
            let result = match state
                .routes
                .iter()
                .find(|r| r.same_name(&want.name) && r.same_target(want))
            {
                Some(raw) => self.to_route(raw).map(Some).ok_or_else(|| {
                    CloudError::new(
                        ErrorKind::Transient,
                        format!("created route {} cannot be attributed", raw.name),
                    )
                }),
                None => Err(CloudError::new(
                    ErrorKind::Transient,
                    format!(
                        "route {} to {} is missing from the table after the write",
                        want.name, want.prefix
                    ),
                )),
            };
            results.insert((*key).clone(), result);
        }
        Ok(results)
    }
}

/// A Node's InternalIPs.
fn internal_ips(addresses: &[NodeAddress]) -> impl Iterator<Item = IpAddr> + '_ {
    addresses
        .iter()
        .filter(|a| a.kind == "InternalIP")
        .filter_map(|a| a.address.trim().parse::<IpAddr>().ok())
}

#[async_trait]
impl CloudRoutes for AzureRoutes {
    fn name(&self) -> &'static str {
        "azure"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            // One table, written as a whole: one change at a time, in batches.
            max_concurrent_operations: 1,
            supports_batch: true,
            reports_node_addresses: true,
            supports_ipv6: true,
            max_routes: Some(self.config.max_routes),
            // The next hop is the Node's InternalIP of the route's family.
            needs: TargetNeeds::InternalIp,
            replaces_blackholes: false,
            // VirtualAppliance traffic reaches a Node only through a NIC
            // with IP forwarding.
            checks_forwarding: true,
            max_routes_per_family: false,
        }
    }

    fn stats(&self) -> &RequestStats {
        self.http.kit.stats()
    }

    fn observe_nodes(&self, nodes: &[Arc<NodeView>]) {
        let map = nodes
            .iter()
            .map(|n| (n.name.clone(), n.addresses.clone()))
            .collect();
        *self.nodes.lock().unwrap_or_else(|e| e.into_inner()) = map;
        self.populated.store(true, Ordering::Relaxed);
    }

    fn refresh_route(&self, route: &Route) -> Option<Route> {
        if !route.enable_node_addresses {
            return None;
        }
        let cidr = route.destination.cidr()?;
        let fresh = self.to_route(&RawRoute::ours(
            route.name.to_string(),
            cidr.to_string(),
            route.next_hop.to_string(),
        ))?;
        (fresh.node_addresses != route.node_addresses || fresh.node != route.node).then(|| Route {
            table: route.table.clone(),
            ..fresh
        })
    }

    async fn list_routes(&self, cluster: &str) -> Result<Vec<Route>, CloudError> {
        let state = self.get_table(ops::LIST).await?;
        let out: Vec<Route> = state
            .routes
            .iter()
            .filter_map(|r| self.to_route(r))
            .collect();
        tracing::debug!(
            cluster,
            in_table = state.routes.len(),
            listed = out.len(),
            "listed Azure route table"
        );
        Ok(out)
    }

    async fn create_route(
        &self,
        _cluster: &str,
        name_hint: &str,
        route: &Route,
    ) -> Result<Route, CloudError> {
        let batch = Batch::one_creation(name_hint, route);
        route_cloud::created_by(&batch, self.apply(&batch).await?)
    }

    async fn delete_route(&self, _cluster: &str, route: &Route) -> Result<(), CloudError> {
        let batch = Batch::one_deletion(route);
        route_cloud::deleted_by(&batch, self.apply(&batch).await?)
    }

    async fn apply_batch(&self, _cluster: &str, batch: &Batch) -> Result<BatchResult, CloudError> {
        self.apply(batch).await
    }

    /// One `GET` of the VM and one of its primary NIC the first time a Node
    /// is asked about; nothing for a NIC found with IP forwarding on; one
    /// `GET` of the NIC per fresh check for a NIC found with it off. Never
    /// changes a NIC (`check.repair` is ignored: see [`forwarding`]).
    async fn check_forwarding(
        &self,
        _cluster: &str,
        nodes: &[Arc<NodeView>],
        check: ForwardingCheck,
    ) -> Result<Vec<(String, Forwarding)>, CloudError> {
        self.check_ip_forwarding(nodes, check).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn provider(dual: bool) -> AzureRoutes {
        let mut c = AzureConfig::from_yaml(
            "subscriptionId: s\nresourceGroup: rg\nrouteTableName: rt\ntenantId: t\naadClientId: c\naadClientSecret: x\nresourceManagerEndpoint: http://127.0.0.1:1\n",
        )
        .unwrap();
        c.ipv6_dual_stack_enabled = dual;
        c.max_routes = 3;
        AzureRoutes::new(c).unwrap()
    }

    /// The key of the creation of `node`'s route to `cidr`.
    fn key(node: &str, cidr: &str) -> OpKey {
        OpKey::Create {
            node_uid: format!("uid-{node}"),
            destination: Destination::parse(cidr),
            table: route_core::Text::default(),
        }
    }

    /// A batch's results before anything is decided: every change fine.
    fn undecided(keys: &[OpKey]) -> BatchResult {
        keys.iter().map(|k| (k.clone(), Ok(None))).collect()
    }

    fn raw(name: &str, prefix: &str, hop_type: &str, hop: &str) -> RawRoute {
        RawRoute::from_json(&json!({"name": name, "properties": {
            "addressPrefix": prefix, "nextHopType": hop_type, "nextHopIpAddress": hop,
            "provisioningState": "Succeeded"}}))
        .unwrap()
    }

    #[test]
    fn only_routes_of_this_clusters_shape_are_listed() {
        let p = provider(false);
        // Before any snapshot a route to an unknown Node is not called ours.
        assert!(
            p.to_route(&raw("n1", "10.244.1.0/24", "VirtualAppliance", "10.0.0.5"))
                .is_none()
        );
        p.observe_nodes(&[]);
        let r = p
            .to_route(&raw("n1", "10.244.1.0/24", "VirtualAppliance", "10.0.0.5"))
            .unwrap();
        assert_eq!(r.node, "n1");
        assert_eq!(r.next_hop, "10.0.0.5");
        assert!(r.enable_node_addresses && !r.blackhole);
        // Dual-stack names are recognised in single-stack mode too.
        let r = p
            .to_route(&raw(
                "n2____fd0010244264",
                "fd00:10:244:2::/64",
                "VirtualAppliance",
                "fd00::2",
            ))
            .unwrap();
        assert_eq!(r.node, "n2");
        for foreign in [
            raw("Default-Route", "0.0.0.0/0", "VirtualAppliance", "10.0.0.4"),
            raw("n1", "10.244.1.0/24", "Internet", ""),
            raw("n1", "10.244.1.0/24", "VirtualAppliance", "not-an-ip"),
            raw("n1", "10.244.1.0/24", "VirtualAppliance", "fd00::5"),
            raw(
                "n3____102449024",
                "10.244.1.0/24",
                "VirtualAppliance",
                "10.0.0.5",
            ),
        ] {
            assert!(p.to_route(&foreign).is_none(), "{foreign:?}");
        }
    }

    #[test]
    fn merging_keeps_foreign_routes_and_refuses_what_azure_would() {
        let p = provider(false);
        let current = TableState {
            etag: Some("W/\"1\"".into()),
            routes: vec![
                raw("to-firewall", "0.0.0.0/0", "VirtualAppliance", "10.0.0.4"),
                raw("n1", "10.244.1.0/24", "VirtualAppliance", "10.0.0.5"),
            ],
            ..TableState::default()
        };
        let wanted = [
            ("n1", "10.244.9.0/24", "10.0.0.5"),
            ("n2", "0.0.0.0/0", "10.0.0.6"),
            ("n3", "10.244.3.0/24", "10.0.0.7"),
            ("n4", "10.244.4.0/24", "10.0.0.8"),
        ];
        let keys: Vec<OpKey> = wanted.iter().map(|(n, c, _)| key(n, c)).collect();
        let creations: Vec<(&OpKey, RawRoute)> = keys
            .iter()
            .zip(wanted)
            .map(|(k, (n, c, hop))| (k, RawRoute::ours(n.into(), c.into(), hop.into())))
            .collect();
        let mut results = undecided(&keys);
        let routes = p.merge(&current, &[], &creations, &mut results);
        let kind = |k: &OpKey| results[k].as_ref().unwrap_err().kind;
        assert_eq!(kind(&keys[0]), ErrorKind::InvalidRequest);
        assert_eq!(kind(&keys[1]), ErrorKind::InvalidRequest);
        assert!(results[&keys[2]].is_ok());
        assert_eq!(kind(&keys[3]), ErrorKind::QuotaExceeded);
        let names: Vec<&str> = routes.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["to-firewall", "n1", "n3"]);

        // A deletion in the same batch makes room and frees the name.
        let gone = OpKey::Delete {
            route: Route::new("n1", route_core::Cidr::parse("10.244.1.0/24").unwrap()),
            copy: 0,
        };
        let moved = key("n1", "10.244.9.0/24");
        let mut results = undecided(&[gone.clone(), moved.clone()]);
        let routes = p.merge(
            &current,
            &[(&gone, "n1".into(), "10.244.1.0/24".into())],
            &[(
                &moved,
                RawRoute::ours("n1".into(), "10.244.9.0/24".into(), "10.0.0.5".into()),
            )],
            &mut results,
        );
        assert!(results.values().all(Result::is_ok), "{results:?}");
        assert_eq!(routes.len(), 2);
        assert_eq!(routes[1].prefix, "10.244.9.0/24");
    }

    #[test]
    fn the_put_body_sends_the_table_back_with_new_routes_only() {
        let state = TableState::from_answer(&json!({
            "name": "rt", "id": "/subscriptions/s/...", "etag": "W/\"abc\"", "location": "westeurope",
            "tags": {"owner": "net-team"},
            "properties": {"provisioningState": "Succeeded", "disableBgpRoutePropagation": true,
              "routes": [{"name": "a", "id": "x", "etag": "W/\"abc\"", "properties": {"addressPrefix": "10.1.0.0/16", "nextHopType": "VnetLocal", "provisioningState": "Succeeded"}}, {"bad": 1}],
              "subnets": [{"id": "/subscriptions/s/.../subnets/nodes"}]}
        }))
        .unwrap();
        assert_eq!(state.etag.as_deref(), Some("W/\"abc\""));
        assert_eq!(state.malformed, 1);
        let body = state.put_body(&state.routes);
        assert_eq!(
            body,
            json!({"location": "westeurope", "tags": {"owner": "net-team"},
                   "properties": {"disableBgpRoutePropagation": true,
                     "routes": [{"name": "a", "properties": {"addressPrefix": "10.1.0.0/16", "nextHopType": "VnetLocal"}}]}})
        );
    }
}
