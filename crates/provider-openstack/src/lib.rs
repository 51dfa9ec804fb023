//! The OpenStack provider: the `routes` of one or more Neutron routers
//! (`router_ids`). Each router is one route target ([`CloudRoutes::targets`]):
//! every Node's route goes on each, a batch is split into one write per
//! router, and each router keeps its own revision for `If-Match`.
//!
//! A route is `destination` (a Node's pod CIDR) + `nexthop` (that Node's
//! InternalIP of the same family). This crate owns the translation between
//! [`route_core::Route`]s and the router's route list, Keystone
//! authentication, and the choice between Neutron's two write paths:
//!
//! * `extraroute-atomic` (`PUT /v2.0/routers/{id}/add_extraroutes` and
//!   `remove_extraroutes`): only the delta is sent, nothing can be lost to a
//!   concurrent writer, and many routes go in one call;
//! * the classic whole-list `PUT /v2.0/routers/{id}` with
//!   `If-Match: revision_number=N`, retried after a fresh read on 412 (the
//!   loop is [`route_cloud::conditional`]'s, shared with the port step).
//!
//! **Ownership.** A router may be shared with other clusters and operators, so
//! the provider lists only routes it can attribute to this cluster's Nodes.
//! A next hop is attributed through, in order: the [`NodeAddressIndex`] (the
//! Nodes' current InternalIPs, fed by the controller), the targets this
//! provider created routes to (kept until their routes are gone), and
//! `node_subnets` (a next hop there that matches no Node is a stale route of
//! this cluster and is listed as a blackhole, but only once the index holds a
//! complete snapshot, so an unfed index never makes routes look stale). Any
//! other route is not listed and therefore never deleted. Routes that do not
//! parse are always listed, as unparsable, and never deleted.
//!
//! **Addresses.** Listed routes carry `enable_node_addresses = true` and, as
//! `node_addresses`, the Node's current addresses while the next hop is
//! still one of its InternalIPs, or only the next hop when it is not. So any
//! address comparison sees a change exactly when the next hop is stale and
//! the controller re-creates the route with the new address.
//!
//! **Forwarding prerequisite.** Neutron port security drops a Node's pod
//! traffic unless the pod CIDR is an allowed address pair on the Node's port.
//! Every creation therefore also adds the pair on the port that carries the
//! next hop, every deletion removes it, and `list_routes` leaves out a
//! current Node's route whose port lacks it, so the next pass re-creates it
//! (see [`ports`] for what is skipped and how foreign pairs stay intact). A
//! creation whose port step failed is a failed creation.

pub mod config;
mod entry;
pub mod index;
pub mod native;
#[cfg(feature = "testing")]
pub mod testing;

pub use entry::PROVIDER;

mod client;
pub mod permissions;
mod ports;

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use reqwest::Method;
use route_cloud::{
    Batch, BatchResult, Capabilities, CloudError, CloudRoutes, ErrorKind, RequestStats,
};
use route_core::{Destination, IpFamily, NodeAddress, OpKey, Route, TargetNeeds, Text};
use serde_json::{Value, json};
use tokio::sync::OnceCell;

pub use config::{AuthType, Interface, OpenStackConfig, UpdateMode};
pub use index::NodeAddressIndex;

use client::Http;
use index::{Learned, internal_ips};

/// One entry of a router's `routes`, verbatim.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct RawRoute {
    destination: String,
    nexthop: String,
}

impl RawRoute {
    fn to_json(&self) -> Value {
        json!({ "destination": self.destination, "nexthop": self.nexthop })
    }
}

/// The router as last seen.
#[derive(Debug, Clone, Default)]
struct RouterState {
    revision: Option<u64>,
    routes: Vec<RawRoute>,
    /// Entries that are not `{destination, nexthop}` strings.
    malformed: Vec<Value>,
}

impl RouterState {
    fn from_answer(body: &Value) -> Result<Self, CloudError> {
        let r = &body["router"];
        if !r.is_object() {
            return Err(CloudError::new(
                ErrorKind::Transient,
                "the answer has no router object",
            ));
        }
        let mut state = RouterState {
            revision: r["revision_number"].as_u64(),
            ..RouterState::default()
        };
        for entry in r["routes"].as_array().map(Vec::as_slice).unwrap_or(&[]) {
            match (entry["destination"].as_str(), entry["nexthop"].as_str()) {
                (Some(d), Some(n)) => state.routes.push(RawRoute {
                    destination: d.to_string(),
                    nexthop: n.to_string(),
                }),
                _ => state.malformed.push(entry.clone()),
            }
        }
        Ok(state)
    }
}

/// Which write path a batch takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    Atomic,
    WholeList,
}

/// The OpenStack Neutron provider.
pub struct OpenStackRoutes {
    config: Arc<OpenStackConfig>,
    http: Http,
    index: Arc<NodeAddressIndex>,
    learned: Mutex<HashMap<IpAddr, Learned>>,
    router_ids: OnceCell<Vec<String>>,
    path: OnceCell<Path>,
    /// Each router as last seen: its own revision for `If-Match`.
    last_seen: Mutex<HashMap<String, RouterState>>,
    /// Whole-list writes of this process to one router go one at a time; a
    /// 412 then only comes from another writer.
    write_locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Neutron's extension aliases, read once.
    extensions: OnceCell<HashSet<String>>,
    /// Each router's interface networks (where its next hops' ports are),
    /// refreshed by every list that checks ports.
    router_networks: Mutex<HashMap<String, Vec<String>>>,
}

impl std::fmt::Debug for OpenStackRoutes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenStackRoutes")
            .field("config", &self.config)
            .field("router_ids", &self.router_ids.get())
            .field("path", &self.path.get())
            .finish_non_exhaustive()
    }
}

/// Stats operation names, one per kind of request.
pub mod ops {
    /// `POST /v3/auth/tokens`.
    pub const AUTH: &str = "auth";
    /// `GET /v2.0/routers?name=` (once, when the router is configured by name).
    pub const FIND_ROUTER: &str = "find_router";
    /// `GET /v2.0/extensions` (once: `extraroute-atomic`, `allowed-address-pairs`).
    pub const EXTENSIONS: &str = "extensions";
    /// `GET /v2.0/routers/{id}` for a list.
    pub const LIST: &str = "list";
    /// `GET /v2.0/routers/{id}` to refresh the revision before a whole-list update.
    pub const GET_ROUTER: &str = "get_router";
    /// `PUT /v2.0/routers/{id}/add_extraroutes`.
    pub const ADD_EXTRAROUTES: &str = "add_extraroutes";
    /// `PUT /v2.0/routers/{id}/remove_extraroutes`.
    pub const REMOVE_EXTRAROUTES: &str = "remove_extraroutes";
    /// `PUT /v2.0/routers/{id}` with the whole route list.
    pub const UPDATE_ROUTER: &str = "update_router";
    /// Every operation that changes the router.
    pub const WRITES: [&str; 3] = [ADD_EXTRAROUTES, REMOVE_EXTRAROUTES, UPDATE_ROUTER];
    /// `GET /v2.0/ports?device_id=<router>...`: the routers' interface networks.
    pub const ROUTER_PORTS: &str = "router_ports";
    /// `GET /v2.0/ports?network_id=...&fixed_ips=ip_address=...`: the next hops' ports.
    pub const LIST_PORTS: &str = "list_ports";
    /// `GET /v2.0/ports/{id}` after a revision conflict on the port.
    pub const GET_PORT: &str = "get_port";
    /// `PUT /v2.0/ports/{id}` with the whole `allowed_address_pairs` list.
    pub const UPDATE_PORT: &str = "update_port";
}

impl OpenStackRoutes {
    /// A provider for `config` with its own, empty node index. No request is
    /// made until the first call.
    pub fn new(config: OpenStackConfig) -> Result<Self, CloudError> {
        Self::with_node_index(config, Arc::new(NodeAddressIndex::new()))
    }

    /// A provider that resolves next hops through `index`, which the caller
    /// keeps feeding from its Node watch.
    pub fn with_node_index(
        config: OpenStackConfig,
        index: Arc<NodeAddressIndex>,
    ) -> Result<Self, CloudError> {
        config
            .validate()
            .map_err(|e| CloudError::new(ErrorKind::Permanent, e.to_string()))?;
        let config = Arc::new(config);
        Ok(Self {
            http: Http::new(config.clone())?,
            config,
            index,
            learned: Mutex::new(HashMap::new()),
            router_ids: OnceCell::new(),
            path: OnceCell::new(),
            last_seen: Mutex::new(HashMap::new()),
            write_locks: Mutex::new(HashMap::new()),
            extensions: OnceCell::new(),
            router_networks: Mutex::new(HashMap::new()),
        })
    }

    /// Checks `fence` after every wait of this provider's own (its token
    /// bucket, throttling pauses) before sending a change, so a change that
    /// waited past this replica's renew deadline is never sent.
    pub fn with_fence(mut self, fence: route_cloud::Fence) -> Self {
        self.http.kit.set_fence(fence);
        self
    }

    /// The node index this provider reads; feed it with
    /// [`NodeAddressIndex::replace_from_views`] and friends.
    pub fn node_index(&self) -> Arc<NodeAddressIndex> {
        self.index.clone()
    }

    /// The first router's id (the only one unless `router_ids` names
    /// several), looked up by name on first use when configured so.
    pub async fn router_id(&self) -> Result<String, CloudError> {
        let ids = self.router_ids().await?;
        ids.first()
            .cloned()
            .ok_or_else(|| CloudError::new(ErrorKind::Permanent, "no Neutron router is configured"))
    }

    /// Every router this controller manages: `router_id` and `router_ids`
    /// as configured, or the one router named `router_name`.
    pub async fn router_ids(&self) -> Result<Vec<String>, CloudError> {
        self.router_ids
            .get_or_try_init(|| async {
                let configured = self.config.configured_routers();
                if !configured.is_empty() {
                    return Ok(configured);
                }
                let name = self.config.router_name.clone().unwrap_or_default();
                let mut path = format!("/routers?name={}&fields=id", query_escape(&name));
                if let Some(p) = &self.config.project_id {
                    path.push_str(&format!("&project_id={}", query_escape(p)));
                }
                let a = self
                    .http
                    .call(ops::FIND_ROUTER, Method::GET, &path, None, None)
                    .await?;
                let ids: Vec<&str> = a.body["routers"]
                    .as_array()
                    .map(Vec::as_slice)
                    .unwrap_or(&[])
                    .iter()
                    .filter_map(|r| r["id"].as_str())
                    .collect();
                match ids.as_slice() {
                    [id] => Ok(vec![(*id).to_string()]),
                    [] => Err(CloudError::new(
                        ErrorKind::Permanent,
                        format!("no Neutron router is named {name:?}"),
                    )),
                    many => Err(CloudError::new(
                        ErrorKind::Permanent,
                        format!(
                            "{} Neutron routers are named {name:?}; set router_id",
                            many.len()
                        ),
                    )),
                }
            })
            .await
            .cloned()
    }

    /// Whether writes use `extraroute-atomic` (asks the server once in `auto`).
    pub async fn uses_atomic_updates(&self) -> Result<bool, CloudError> {
        Ok(self.write_path().await? == Path::Atomic)
    }

    async fn write_path(&self) -> Result<Path, CloudError> {
        self.path
            .get_or_try_init(|| async {
                match self.config.update_mode {
                    UpdateMode::Atomic => Ok(Path::Atomic),
                    UpdateMode::WholeList => Ok(Path::WholeList),
                    UpdateMode::Auto => {
                        if self.extensions().await?.contains("extraroute-atomic") {
                            Ok(Path::Atomic)
                        } else {
                            tracing::info!(
                                "Neutron has no extraroute-atomic extension; using whole-list router updates"
                            );
                            Ok(Path::WholeList)
                        }
                    }
                }
            })
            .await
            .copied()
    }

    fn remember(&self, id: &str, state: &RouterState) {
        self.last_seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id.to_string(), state.clone());
    }

    fn remembered(&self, id: &str) -> Option<RouterState> {
        self.last_seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .cloned()
    }

    fn forget(&self, id: &str) {
        self.last_seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(id);
    }

    fn write_lock(&self, id: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.write_locks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(id.to_string())
            .or_default()
            .clone()
    }

    /// The router a route goes to or comes from: its `target`, or the only
    /// router when it names none.
    async fn router_of(&self, route: &Route) -> Result<String, CloudError> {
        let ids = self.router_ids().await?;
        if !route.table.is_empty() {
            return if ids.iter().any(|i| *i == route.table) {
                Ok(route.table.to_string())
            } else {
                Err(CloudError::new(
                    ErrorKind::InvalidRequest,
                    format!(
                        "route {} names router {}, which this controller does not manage ({})",
                        route.destination,
                        route.table,
                        ids.join(", ")
                    ),
                ))
            };
        }
        match ids.as_slice() {
            [one] => Ok(one.clone()),
            many => Err(CloudError::new(
                ErrorKind::InvalidRequest,
                format!(
                    "route {} names no router and {} are configured ({})",
                    route.destination,
                    many.len(),
                    many.join(", ")
                ),
            )),
        }
    }

    async fn get_router(&self, op: &'static str, id: &str) -> Result<RouterState, CloudError> {
        let a = self
            .http
            .call(op, Method::GET, &format!("/routers/{id}"), None, None)
            .await?;
        let state = RouterState::from_answer(&a.body)?;
        self.remember(id, &state);
        Ok(state)
    }

    /// The route as `list_routes` shows it, or `None` when it is not this
    /// cluster's.
    fn to_route(&self, raw: &RawRoute) -> Option<Route> {
        let name = format!("{} via {}", raw.destination, raw.nexthop);
        let hop = raw.nexthop.trim().parse::<IpAddr>().ok();
        let destination = Destination::parse(&raw.destination);
        let (cidr, hop) = match (destination.cidr(), hop) {
            (Some(c), Some(h)) => (c, h),
            (_, hop) => {
                // Kept visible so an operator sees it; an unparsable
                // destination is never deleted.
                let destination = match destination {
                    Destination::Cidr(_) => Destination::Unparsable(name.clone()),
                    d => d,
                };
                let node = hop
                    .and_then(|h| self.attribute(h))
                    .map(|(n, _)| n)
                    .unwrap_or_default();
                return Some(Route {
                    name: name.into(),
                    node: node.into(),
                    destination,
                    blackhole: false,
                    node_addresses: Vec::new(),
                    enable_node_addresses: false,
                    next_hop: raw.nexthop.clone().into(),
                    node_provider_id: None,
                    table: Default::default(),
                    foreign: None,
                });
            }
        };
        let mut route = Route::new("", cidr).named(name);
        route.next_hop = hop.to_string().into();
        match self.attribute(hop) {
            Some((node, addresses)) => {
                route.node = node.into();
                route.node_addresses = addresses;
                route.enable_node_addresses = true;
            }
            None => {
                if !self.index.is_populated() {
                    // Until the Nodes are known, any next hop may be one's.
                    return None;
                }
                if !client::in_subnets(hop, &self.config.node_subnets) {
                    // Not this cluster's: listed, so that a pod CIDR over
                    // it gets a Warning instead of a second next hop for
                    // the same destination; never deleted.
                    route.foreign = Some(
                        if self.config.node_subnets.is_empty() {
                            format!("the next hop {hop}, which no Node of this cluster has")
                        } else {
                            format!("the next hop {hop}, outside this cluster's node_subnets")
                        }
                        .into(),
                    );
                    return Some(route);
                }
                route.blackhole = true;
                route.node_addresses = vec![NodeAddress::internal_ip(hop.to_string())];
                route.enable_node_addresses = true;
            }
        }
        Some(route)
    }

    /// The node a next hop belongs to, and the addresses to report for it.
    fn attribute(&self, hop: IpAddr) -> Option<(String, Vec<NodeAddress>)> {
        if let Some(found) = self.index.node_for(hop) {
            return Some(found);
        }
        let learned = self
            .learned
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&hop)
            .cloned()?;
        let addresses = match self.index.addresses_of(&learned.node) {
            // The node now has other InternalIPs: report only the stale hop.
            Some(_) => vec![NodeAddress::internal_ip(hop.to_string())],
            None if internal_ips(&learned.addresses).any(|ip| ip == hop) => learned.addresses,
            None => vec![NodeAddress::internal_ip(hop.to_string())],
        };
        Some((learned.node, addresses))
    }

    /// The route to write for a creation: the node's InternalIP of the
    /// destination's family as next hop.
    fn raw_for_create(&self, route: &Route) -> Result<RawRoute, CloudError> {
        let Some(cidr) = route.destination.cidr() else {
            return Err(CloudError::new(
                ErrorKind::InvalidRequest,
                format!("cannot create a route to unparsable {}", route.destination),
            ));
        };
        let family = cidr.family();
        let hop = internal_ips(&route.node_addresses)
            .find(|ip| match family {
                IpFamily::V4 => ip.is_ipv4(),
                IpFamily::V6 => ip.is_ipv6(),
            })
            .ok_or_else(|| {
                CloudError::new(
                    ErrorKind::InvalidRequest,
                    format!(
                        "node {:?} has no {family} InternalIP to route {cidr} to",
                        route.node
                    ),
                )
            })?;
        Ok(RawRoute {
            destination: cidr.to_string(),
            nexthop: hop.to_string(),
        })
    }

    /// The route to remove for a deletion: as listed.
    fn raw_for_delete(route: &Route) -> Result<RawRoute, CloudError> {
        let destination = match &route.destination {
            Destination::Cidr(c) => c.to_string(),
            Destination::Unparsable(s) => {
                return Err(CloudError::new(
                    ErrorKind::InvalidRequest,
                    format!("refusing to delete unparsable route {s:?}"),
                ));
            }
        };
        let hop = route.next_hop.trim();
        if hop.parse::<IpAddr>().is_err() {
            return Err(CloudError::new(
                ErrorKind::InvalidRequest,
                format!("route {destination} has no next hop to delete (next_hop {hop:?})"),
            ));
        }
        Ok(RawRoute {
            destination,
            nexthop: hop.to_string(),
        })
    }

    /// Writes the changes and returns the router as the server answered.
    async fn write(
        &self,
        id: &str,
        remove: &[RawRoute],
        add: &[RawRoute],
    ) -> Result<(RouterState, Option<CloudError>), CloudError> {
        match self.write_path().await? {
            Path::Atomic => self.write_atomic(id, remove, add).await,
            Path::WholeList => self
                .write_whole_list(id, remove, add)
                .await
                .map(|s| (s, None)),
        }
    }

    /// Removes, then adds. A failed removal fails everything (nothing was
    /// added); a failed addition after a successful removal is returned
    /// beside the state.
    async fn write_atomic(
        &self,
        id: &str,
        remove: &[RawRoute],
        add: &[RawRoute],
    ) -> Result<(RouterState, Option<CloudError>), CloudError> {
        let body = |routes: &[RawRoute]| json!({ "router": { "routes": routes.iter().map(RawRoute::to_json).collect::<Vec<_>>() } });
        let mut state = None;
        if !remove.is_empty() {
            let a = self
                .http
                .call(
                    ops::REMOVE_EXTRAROUTES,
                    Method::PUT,
                    &format!("/routers/{id}/remove_extraroutes"),
                    Some(&body(remove)),
                    None,
                )
                .await?;
            state = Some(RouterState::from_answer(&a.body)?);
        }
        if !add.is_empty() {
            let r = self
                .http
                .call(
                    ops::ADD_EXTRAROUTES,
                    Method::PUT,
                    &format!("/routers/{id}/add_extraroutes"),
                    Some(&body(add)),
                    None,
                )
                .await;
            match r {
                Ok(a) => state = Some(RouterState::from_answer(&a.body)?),
                Err(e) => {
                    let e = self.explain_quota(id, e, add.len());
                    match state {
                        Some(s) => {
                            self.remember(id, &s);
                            return Ok((s, Some(e)));
                        }
                        None => return Err(e),
                    }
                }
            }
        }
        let state = state.unwrap_or_default();
        self.remember(id, &state);
        Ok((state, None))
    }

    /// Whole-list update under `If-Match`; on 412 reads the router again and
    /// retries up to `max_conflict_retries` times.
    async fn write_whole_list(
        &self,
        id: &str,
        remove: &[RawRoute],
        add: &[RawRoute],
    ) -> Result<RouterState, CloudError> {
        let lock = self.write_lock(id);
        let _serial = lock.lock().await;
        // The revision from the last answer usually still holds, which saves
        // a read; a 412 says it did not. Each router has its own.
        let known = self
            .remembered(id)
            .filter(|s| s.revision.is_some())
            .map(|s| {
                let revision = s.revision;
                (s, revision)
            });
        let outcome = route_cloud::write_conditionally(
            self.config.max_conflict_retries,
            known,
            || async move {
                let s = self.get_router(ops::GET_ROUTER, id).await?;
                let revision = s.revision;
                Ok((s, revision))
            },
            |current: &RouterState| {
                if !current.malformed.is_empty() {
                    return Err(CloudError::new(
                        ErrorKind::InvalidRequest,
                        format!(
                            "router {id} holds {} malformed routes; a whole-list update would have to resend them",
                            current.malformed.len()
                        ),
                    ));
                }
                let gone: HashSet<&RawRoute> = remove.iter().collect();
                let mut routes: Vec<RawRoute> =
                    Vec::with_capacity(current.routes.len() + add.len());
                for r in current.routes.iter().chain(add) {
                    if !gone.contains(r) && !routes.contains(r) {
                        routes.push(r.clone());
                    }
                }
                let added = routes.len().saturating_sub(current.routes.len());
                // Always sent, even unchanged: the answer is the router as
                // it is now, with its new revision.
                Ok(Some((routes, added)))
            },
            |(routes, added): (Vec<RawRoute>, usize), revision| async move {
                let body = json!({ "router": { "routes": routes.iter().map(RawRoute::to_json).collect::<Vec<_>>() } });
                let r = self
                    .http
                    .call(
                        ops::UPDATE_ROUTER,
                        Method::PUT,
                        &format!("/routers/{id}"),
                        Some(&body),
                        revision,
                    )
                    .await;
                match r {
                    Ok(a) => {
                        let state = RouterState::from_answer(&a.body)?;
                        self.remember(id, &state);
                        Ok(state)
                    }
                    // 412: the revision moved; 409: a concurrent change
                    // collided inside Neutron. Either way whatever we
                    // remembered is stale, and a fresh read decides.
                    Err(e) if e.kind == ErrorKind::Conflict => {
                        self.forget(id);
                        Err(e)
                    }
                    Err(e) => Err(self.explain_quota(id, e, added)),
                }
            },
            |attempt| {
                tracing::debug!(
                    router = id,
                    attempt,
                    "revision conflict; reading the router again"
                );
            },
        )
        .await?;
        match outcome {
            route_cloud::ConditionalWrite::Unchanged(s)
            | route_cloud::ConditionalWrite::Written(s) => Ok(s),
        }
    }

    fn explain_quota(&self, id: &str, e: CloudError, adding: usize) -> CloudError {
        if e.kind != ErrorKind::QuotaExceeded {
            return e;
        }
        let have = self.remembered(id).map(|s| s.routes.len());
        CloudError {
            message: format!(
                "the route quota of Neutron router {id} is reached: it holds {} routes and {adding} more were asked for; \
                 raise the project's router_route quota (quota_router_route, default 30 per router) or remove routes ({})",
                have.map_or_else(|| "an unknown number of".to_string(), |n| n.to_string()),
                e.message
            ),
            ..e
        }
    }

    /// Applies deletions then creations, split per router: each router gets
    /// its own write (its own revision and `If-Match`). The shared core of
    /// every write. With one router a failed write fails the batch; with
    /// several, it fails that router's routes only.
    async fn apply(&self, batch: &Batch) -> Result<BatchResult, CloudError> {
        let mut results: BatchResult = batch.keys().map(|k| (k.clone(), Ok(None))).collect();
        if batch.is_empty() {
            return Ok(results);
        }
        // Read before any write, so a failure here changes nothing: the
        // write path and the port step both depend on it.
        self.extensions().await?;
        // Each planned change's router and raw route, for the port step.
        let mut placed: HashMap<&OpKey, (String, RawRoute)> = HashMap::new();
        // Per router, in order of first appearance: removals and additions,
        // each with its key in `results`.
        let mut groups: Vec<RouterWrite<'_>> = Vec::new();
        fn group<'a, 'b>(
            groups: &'a mut Vec<RouterWrite<'b>>,
            id: &str,
        ) -> &'a mut RouterWrite<'b> {
            let at = match groups.iter().position(|g| g.router == id) {
                Some(at) => at,
                None => {
                    groups.push(RouterWrite {
                        router: id.to_string(),
                        remove: Vec::new(),
                        add: Vec::new(),
                    });
                    groups.len() - 1
                }
            };
            &mut groups[at]
        }
        for (key, r) in &batch.delete {
            let raw = match self.router_of(r).await {
                Ok(id) => Self::raw_for_delete(r).map(|raw| (id, raw)),
                Err(e) => Err(e),
            };
            match raw {
                Ok((id, raw)) => {
                    placed.insert(key, (id.clone(), raw.clone()));
                    group(&mut groups, &id).remove.push((key, raw));
                }
                Err(e) => {
                    results.insert(key.clone(), Err(e));
                }
            }
        }
        for (key, _hint, r) in &batch.create {
            let raw = match self.router_of(r).await {
                Ok(id) => self.raw_for_create(r).map(|raw| (id, raw)),
                Err(e) => Err(e),
            };
            match raw {
                Ok((id, raw)) => {
                    if let Ok(hop) = raw.nexthop.parse::<IpAddr>() {
                        self.learned
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .insert(
                                hop,
                                Learned {
                                    node: r.node.to_string(),
                                    addresses: r.node_addresses.clone(),
                                },
                            );
                    }
                    placed.insert(key, (id.clone(), raw.clone()));
                    group(&mut groups, &id).add.push((key, raw));
                }
                Err(e) => {
                    results.insert(key.clone(), Err(e));
                }
            }
        }
        let several = groups.len() > 1;
        for g in groups {
            let remove: Vec<RawRoute> = g.remove.iter().map(|(_, r)| r.clone()).collect();
            let add: Vec<RawRoute> = g.add.iter().map(|(_, r)| r.clone()).collect();
            let (state, add_error) = match self.write(&g.router, &remove, &add).await {
                Ok(v) => v,
                Err(e) if several => {
                    for (key, _) in g.remove.iter().chain(&g.add) {
                        results.insert((*key).clone(), Err(e.clone()));
                    }
                    continue;
                }
                Err(e) => return Err(e),
            };
            let present: HashSet<&RawRoute> = state.routes.iter().collect();
            for (key, raw) in &g.add {
                let result = match &add_error {
                    Some(e) => Err(e.clone()),
                    None if present.contains(raw) => self
                        .to_route(raw)
                        .map(|r| Some(r.in_table(g.router.as_str())))
                        .ok_or_else(|| {
                            CloudError::new(
                                ErrorKind::Transient,
                                format!(
                                    "created route {} via {} cannot be attributed",
                                    raw.destination, raw.nexthop
                                ),
                            )
                        }),
                    None => Err(CloudError::new(
                        ErrorKind::Transient,
                        format!(
                            "route {} via {} is missing from router {}'s answer",
                            raw.destination, raw.nexthop, g.router
                        ),
                    )),
                };
                results.insert((*key).clone(), result);
            }
        }
        let changes = self.pair_changes(batch, &results, &placed).await;
        for (key, e) in self.apply_pairs(&changes).await {
            results.insert(key, Err(e));
        }
        Ok(results)
    }

    /// The port step of the changes that reached their routers: add the pair
    /// of each created route; remove the pair of each deleted route that is
    /// no blackhole (its Node and port are gone) and that no managed router
    /// still holds as last seen (the pair serves every router's copy).
    async fn pair_changes(
        &self,
        batch: &Batch,
        results: &BatchResult,
        placed: &HashMap<&OpKey, (String, RawRoute)>,
    ) -> Vec<ports::PairChange> {
        let mut changes = Vec::new();
        let routers = self.router_ids().await.unwrap_or_default();
        let still_held = |raw: &RawRoute| {
            routers.iter().any(|id| {
                self.remembered(id)
                    .is_none_or(|s| s.routes.iter().any(|r| r == raw))
            })
        };
        let parts = |raw: &RawRoute| {
            Some((
                route_core::Cidr::parse(&raw.destination).ok()?,
                raw.nexthop.trim().parse::<IpAddr>().ok()?,
            ))
        };
        for (key, route) in &batch.delete {
            if route.blackhole || results.get(key).is_none_or(Result::is_err) {
                continue;
            }
            if let Some((router, raw)) = placed.get(key)
                && let Some((cidr, hop)) = parts(raw)
                && !still_held(raw)
            {
                changes.push(ports::PairChange {
                    key: key.clone(),
                    router: router.clone(),
                    cidr,
                    hop,
                    server: None,
                    add: false,
                });
            }
        }
        for (key, _hint, route) in &batch.create {
            if !matches!(results.get(key), Some(Ok(Some(_)))) {
                continue;
            }
            if let Some((router, raw)) = placed.get(key)
                && let Some((cidr, hop)) = parts(raw)
            {
                changes.push(ports::PairChange {
                    key: key.clone(),
                    router: router.clone(),
                    cidr,
                    hop,
                    server: route
                        .node_provider_id
                        .as_deref()
                        .and_then(ports::server_id)
                        .map(str::to_string),
                    add: true,
                });
            }
        }
        changes
    }
}

/// The changes of one batch to one router, each under its key.
struct RouterWrite<'b> {
    router: String,
    remove: Vec<(&'b OpKey, RawRoute)>,
    add: Vec<(&'b OpKey, RawRoute)>,
}

fn query_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[async_trait]
impl CloudRoutes for OpenStackRoutes {
    fn name(&self) -> &'static str {
        "openstack"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            // One router, one route list: changes go in batches, one at a time.
            max_concurrent_operations: 1,
            supports_batch: true,
            reports_node_addresses: true,
            supports_ipv6: true,
            max_routes: self.config.max_routes,
            // The next hop is the node's InternalIP of the route's family.
            needs: TargetNeeds::InternalIp,
            replaces_blackholes: false,
            checks_forwarding: false,
            max_routes_per_family: false,
        }
    }

    fn stats(&self) -> &RequestStats {
        self.http.kit.stats()
    }

    /// Next hops are Node InternalIPs: the controller's snapshot is exactly
    /// the index ownership needs, refreshed before every list.
    fn observe_nodes(&self, nodes: &[std::sync::Arc<route_core::NodeView>]) {
        self.index.replace_from_views(nodes.iter().map(|n| &**n));
    }

    fn refresh_route(&self, route: &Route) -> Option<Route> {
        if !route.enable_node_addresses || route.blackhole {
            return None;
        }
        let cidr = route.destination.cidr()?;
        let fresh = self.to_route(&RawRoute {
            destination: cidr.to_string(),
            nexthop: route.next_hop.to_string(),
        })?;
        // Same route, same next hop: only what the provider reports about
        // its node may differ.
        (fresh.node_addresses != route.node_addresses || fresh.node != route.node).then(|| Route {
            name: route.name.clone(),
            table: route.table.clone(),
            ..fresh
        })
    }

    fn targets(&self) -> Vec<Text> {
        match self.router_ids.get() {
            Some(ids) => ids.iter().map(|i| i.as_str().into()).collect(),
            None => self
                .config
                .configured_routers()
                .into_iter()
                .map(Into::into)
                .collect(),
        }
    }

    async fn list_routes(&self, cluster: &str) -> Result<Vec<Route>, CloudError> {
        let ids = self.router_ids().await?;
        let mut states = Vec::with_capacity(ids.len());
        for id in &ids {
            states.push((id, self.get_router(ops::LIST, id).await?));
        }
        // A route whose Node's port would drop the pods' traffic is not
        // there yet: listed as missing, the next pass re-creates it.
        let lacking = self.routes_lacking_pairs(&states).await?;
        if !lacking.is_empty() {
            tracing::info!(
                cluster,
                routes = lacking.len(),
                "routes whose next hop's port lacks the pod CIDR as an allowed address pair are listed as missing"
            );
        }
        // Forget created targets whose routes are all gone, on every router.
        {
            let hops: HashSet<IpAddr> = states
                .iter()
                .flat_map(|(_, s)| &s.routes)
                .filter_map(|r| r.nexthop.trim().parse().ok())
                .collect();
            self.learned
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .retain(|ip, _| hops.contains(ip));
        }
        let mut out: Vec<Route> = Vec::new();
        for (id, state) in &states {
            out.extend(
                state
                    .routes
                    .iter()
                    .filter(|r| !lacking.contains(&((*id).clone(), (*r).clone())))
                    .filter_map(|r| self.to_route(r))
                    .map(|r| r.in_table(id.as_str())),
            );
            for m in &state.malformed {
                let text = m.to_string();
                out.push(
                    Route {
                        name: text.clone().into(),
                        ..Route::new("", Destination::Unparsable(text))
                    }
                    .in_table(id.as_str()),
                );
            }
            tracing::debug!(
                cluster,
                router = id.as_str(),
                on_router = state.routes.len() + state.malformed.len(),
                "listed Neutron router routes"
            );
        }
        tracing::debug!(cluster, listed = out.len(), "listed Neutron routes");
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn provider(node_subnets: &[&str]) -> OpenStackRoutes {
        let mut c = OpenStackConfig::noauth("http://127.0.0.1:1", "r1");
        c.node_subnets = node_subnets
            .iter()
            .map(|s| route_core::Cidr::parse(s).unwrap())
            .collect();
        OpenStackRoutes::new(c).unwrap()
    }

    fn raw(d: &str, n: &str) -> RawRoute {
        RawRoute {
            destination: d.into(),
            nexthop: n.into(),
        }
    }

    #[test]
    fn attributes_next_hops_to_nodes_or_leaves_them_alone() {
        let p = provider(&["10.0.0.0/16"]);
        let idx = p.node_index();
        // Not fed yet: an unknown hop in the node subnet is not called stale.
        assert!(p.to_route(&raw("10.244.9.0/24", "10.0.0.9")).is_none());
        idx.replace_all([("n1", vec![NodeAddress::internal_ip("10.0.0.5")])]);

        let r = p.to_route(&raw("10.244.1.0/24", "10.0.0.5")).unwrap();
        assert_eq!(r.node, "n1");
        assert!(r.enable_node_addresses && !r.blackhole);
        assert_eq!(r.node_addresses, vec![NodeAddress::internal_ip("10.0.0.5")]);
        assert_eq!(r.next_hop, "10.0.0.5");

        let stale = p.to_route(&raw("10.244.9.0/24", "10.0.0.9")).unwrap();
        assert!(stale.blackhole && stale.node.is_empty());

        let theirs = p.to_route(&raw("10.244.9.0/24", "192.168.1.1")).unwrap();
        assert!(
            theirs
                .foreign
                .as_deref()
                .is_some_and(|o| o.contains("outside this cluster's node_subnets")),
            "a hop outside the node subnets that no node has is someone else's: {theirs:?}"
        );
        assert!(!theirs.blackhole && theirs.node.is_empty());
    }

    #[test]
    fn created_targets_stay_attributed_after_the_node_changes() {
        let p = provider(&[]);
        let idx = p.node_index();
        let addrs = vec![NodeAddress::internal_ip("10.0.0.5")];
        p.learned.lock().unwrap().insert(
            "10.0.0.5".parse().unwrap(),
            Learned {
                node: "n1".into(),
                addresses: addrs.clone(),
            },
        );
        // Index unfed: the addresses given at creation are reported.
        let r = p.to_route(&raw("10.244.1.0/24", "10.0.0.5")).unwrap();
        assert_eq!((r.node.as_str(), &r.node_addresses), ("n1", &addrs));

        // The node moved to a new address: only the stale hop is reported,
        // so an address comparison asks for a re-creation.
        idx.replace_all([("n1", vec![NodeAddress::internal_ip("10.0.0.6")])]);
        let r = p.to_route(&raw("10.244.1.0/24", "10.0.0.5")).unwrap();
        assert_eq!(r.node, "n1");
        assert_eq!(r.node_addresses, vec![NodeAddress::internal_ip("10.0.0.5")]);
    }

    #[test]
    fn unparsable_routes_are_listed_as_such() {
        let p = provider(&[]);
        let r = p.to_route(&raw("not-a-cidr", "10.0.0.9")).unwrap();
        assert_eq!(r.destination, Destination::Unparsable("not-a-cidr".into()));
        let r = p.to_route(&raw("10.99.0.0/24", "garbage")).unwrap();
        assert!(matches!(r.destination, Destination::Unparsable(_)));
        assert_eq!(r.next_hop, "garbage");
    }

    #[test]
    fn creations_pick_the_internal_ip_of_the_destination_family() {
        let p = provider(&[]);
        let addrs = vec![
            NodeAddress {
                kind: "ExternalIP".into(),
                address: "203.0.113.1".into(),
            },
            NodeAddress::internal_ip("fd00::5"),
            NodeAddress::internal_ip("10.0.0.5"),
        ];
        let v4 = Route::from_text("n1", "10.244.1.0/24").with_addresses(addrs.clone(), false);
        assert_eq!(
            p.raw_for_create(&v4).unwrap(),
            raw("10.244.1.0/24", "10.0.0.5")
        );
        let v6 = Route::from_text("n1", "fd10:1::/64").with_addresses(addrs, false);
        assert_eq!(
            p.raw_for_create(&v6).unwrap(),
            raw("fd10:1::/64", "fd00::5")
        );
        let none = Route::from_text("n1", "fd10:1::/64")
            .with_addresses(vec![NodeAddress::internal_ip("10.0.0.5")], false);
        let e = p.raw_for_create(&none).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidRequest);
        assert!(e.message.contains("IPv6"), "{}", e.message);
        assert!(OpenStackRoutes::raw_for_delete(&Route::from_text("n", "junk")).is_err());
    }

    #[test]
    fn router_answers_parse_defensively() {
        let s = RouterState::from_answer(&json!({"router": {"revision_number": 7, "routes": [
            {"destination": "10.244.0.0/24", "nexthop": "10.0.0.5"},
            {"destination": 5},
            "junk"
        ]}}))
        .unwrap();
        assert_eq!(s.revision, Some(7));
        assert_eq!(s.routes, vec![raw("10.244.0.0/24", "10.0.0.5")]);
        assert_eq!(s.malformed.len(), 2);
        assert!(RouterState::from_answer(&json!({"nope": 1})).is_err());
        assert_eq!(query_escape("k8s router/1"), "k8s%20router%2F1");
    }
}
