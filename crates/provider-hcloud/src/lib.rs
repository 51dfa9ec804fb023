//! The Hetzner Cloud provider (`--cloud-provider hcloud`): the routes of one
//! private network.
//!
//! A network route is `{destination, gateway}` where the gateway is a
//! server's private IP on that network. Routes change only through
//! asynchronous actions (`add_route`, `delete_route`), one at a time per
//! network, and every request counts against a project-wide budget of 3,600
//! per hour. This provider therefore:
//!
//! - lists with a single `GET /networks/{id}` and maps gateways to Nodes from
//!   what it created itself, falling back to the server list (`GET /servers`,
//!   paged, cached, re-fetched on a miss at most every 30 s);
//! - creates and deletes with one action call plus the polls of that action,
//!   taking the gateway from the Node's `InternalIP` inside the network's range
//!   (no server lookup) and the route's listed gateway respectively;
//! - runs one action at a time and advertises so in its [`Capabilities`];
//! - puts every request through a client-side token bucket that the server's
//!   `RateLimit-*` headers can only tighten (see [`client`]).
//!
//! One network, one route target: a route's gateway must be a server on the
//! network, so the cluster's routes live in that one network, `targets()`
//! stays empty and the configuration refuses a second network
//! ([`config::ONE_NETWORK`]).
//!
//! Ownership: this crate translates; the controller decides what should
//! exist. The [`testing`] module (feature `testing`) is a stateful stand-in for the
//! API used by tests here and in the controller's end-to-end suite.

mod client;
pub mod config;
mod entry;
pub mod native;
pub mod permissions;
mod schema;
#[cfg(feature = "testing")]
pub mod testing;

pub use entry::PROVIDER;

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Duration;

use async_trait::async_trait;
use reqwest::Method;
use route_cloud::{Capabilities, CloudError, CloudRoutes, ErrorKind, RequestStats};
use route_core::cidr::parse_ip_sloppy;
use route_core::{Cidr, Destination, IpFamily, NodeAddress, Route, TargetNeeds};
use tokio::sync::{Mutex, OnceCell};
use tokio::time::Instant;

use crate::client::{Http, classify};
pub use crate::config::{ConfigError, HcloudConfig, Token};
use crate::schema::{
    Action, ActionEnvelope, Network, NetworkEnvelope, NetworkRoute, NetworksEnvelope,
    ServersEnvelope,
};

/// Hetzner's limit of routes per network.
pub const MAX_ROUTES_PER_NETWORK: usize = 100;

/// The prefix of Hetzner Cloud servers' `spec.providerID`.
pub const PROVIDER_ID_PREFIX: &str = "hcloud://";

/// A server as far as routing cares.
#[derive(Debug, Clone)]
struct ServerInfo {
    id: u64,
    name: String,
    /// The private IP on the managed network.
    ip: Option<IpAddr>,
}

#[derive(Debug, Default)]
struct ServerCache {
    fetched: Option<Instant>,
    by_ip: HashMap<IpAddr, ServerInfo>,
    by_id: HashMap<u64, ServerInfo>,
    by_name: HashMap<String, ServerInfo>,
}

/// Who a gateway belongs to, learned from this provider's own creations.
/// It stands in for the server list until a list fetched later says
/// otherwise, and is forgotten once no route uses the gateway.
#[derive(Debug, Clone)]
struct Learned {
    node: String,
    server_id: Option<u64>,
    at: Instant,
}

#[derive(Debug, Default)]
struct Cache {
    ip_range: Option<Cidr>,
    learned: HashMap<IpAddr, Learned>,
}

/// The Hetzner Cloud route provider.
#[derive(Debug)]
pub struct HcloudRoutes {
    http: Http,
    config: HcloudConfig,
    network_id: OnceCell<u64>,
    cache: std::sync::Mutex<Cache>,
    servers: Mutex<ServerCache>,
    /// Actions on one network are serialised by the API; serialising them
    /// here too means a second one never comes back `conflict`.
    action_lock: Mutex<()>,
}

impl HcloudRoutes {
    /// A provider with `config`, reading the token from `token_file` or
    /// `HCLOUD_TOKEN`.
    pub fn from_config(config: HcloudConfig) -> Result<Self, ConfigError> {
        let token = config.load_token()?;
        Self::new(config, token)
    }

    /// A provider with `config` and `token`.
    pub fn new(config: HcloudConfig, token: Token) -> Result<Self, ConfigError> {
        config.validate()?;
        let http = Http::new(&config, token)?;
        let network_id = OnceCell::new_with(config.network_id());
        Ok(Self {
            http,
            config,
            network_id,
            cache: std::sync::Mutex::new(Cache::default()),
            servers: Mutex::new(ServerCache::default()),
            action_lock: Mutex::new(()),
        })
    }

    /// Checks `fence` after every wait of this provider's own (its token
    /// bucket, throttling pauses) before sending a change, so a change that
    /// waited past this replica's renew deadline is never sent.
    pub fn with_fence(mut self, fence: route_cloud::Fence) -> Self {
        self.http.kit.set_fence(fence);
        self
    }

    /// The configuration in use.
    pub fn config(&self) -> &HcloudConfig {
        &self.config
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, Cache> {
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The network's id, resolving a name once.
    async fn network_id(&self) -> Result<u64, CloudError> {
        self.network_id
            .get_or_try_init(|| async {
                let name = self.config.network.trim();
                let found: NetworksEnvelope = self
                    .http
                    .call(
                        "list_networks",
                        Method::GET,
                        "/networks",
                        &[("name", name)],
                        None::<&()>,
                    )
                    .await?;
                found.networks.first().map(|n| n.id).ok_or_else(|| {
                    CloudError::new(
                        ErrorKind::Permanent,
                        format!("hcloud: no network named {name:?} in this project"),
                    )
                })
            })
            .await
            .copied()
    }

    async fn get_network(&self) -> Result<Network, CloudError> {
        let id = self.network_id().await?;
        let env: NetworkEnvelope = self
            .http
            .call(
                "get_network",
                Method::GET,
                &format!("/networks/{id}"),
                &[],
                None::<&()>,
            )
            .await?;
        if let Ok(range) = Cidr::parse(&env.network.ip_range) {
            self.cache().ip_range = Some(range);
        }
        Ok(env.network)
    }

    /// Fetches every page of `GET /servers` into the cache.
    async fn refresh_servers(&self, cache: &mut ServerCache) -> Result<(), CloudError> {
        let network = self.network_id().await?;
        let mut fresh = ServerCache {
            fetched: Some(Instant::now()),
            ..ServerCache::default()
        };
        let mut page: u64 = 1;
        // Bounded so a server that keeps announcing a next page cannot loop us.
        for _ in 0..1000 {
            let page_text = page.to_string();
            let env: ServersEnvelope = self
                .http
                .call(
                    "list_servers",
                    Method::GET,
                    "/servers",
                    &[("page", page_text.as_str()), ("per_page", "50")],
                    None::<&()>,
                )
                .await?;
            for s in env.servers {
                let ip = s
                    .private_net
                    .iter()
                    .find(|p| p.network == network)
                    .and_then(|p| parse_ip_sloppy(&p.ip));
                let info = ServerInfo {
                    id: s.id,
                    name: s.name,
                    ip,
                };
                if let Some(ip) = ip {
                    fresh.by_ip.insert(ip, info.clone());
                }
                fresh.by_name.insert(info.name.clone(), info.clone());
                fresh.by_id.insert(info.id, info);
            }
            match env
                .meta
                .and_then(|m| m.pagination)
                .and_then(|p| p.next_page)
            {
                Some(next) if next > page => page = next,
                _ => break,
            }
        }
        *cache = fresh;
        Ok(())
    }

    /// Whether the server list may be fetched again for a miss.
    fn may_refresh(&self, cache: &ServerCache) -> bool {
        cache.fetched.is_none_or(|t| {
            t.elapsed() >= Duration::from_secs(self.config.server_refresh_min_interval_secs)
        })
    }

    /// Looks a server up with `find`, fetching the list again on a miss.
    async fn find_server(
        &self,
        find: impl Fn(&ServerCache) -> Option<ServerInfo>,
    ) -> Result<Option<ServerInfo>, CloudError> {
        let mut servers = self.servers.lock().await;
        if let Some(s) = find(&servers) {
            return Ok(Some(s));
        }
        if self.may_refresh(&servers) {
            self.refresh_servers(&mut servers).await?;
        }
        Ok(find(&servers))
    }

    /// The gateway for a route to `route.node`: its `InternalIP` inside
    /// the network's range, else its server's private IP on the network.
    async fn gateway_for(&self, route: &Route) -> Result<(IpAddr, Option<u64>), CloudError> {
        let cached = self.cache().ip_range;
        let range = match cached {
            Some(r) => Some(r),
            None => Cidr::parse(&self.get_network().await?.ip_range).ok(),
        };
        let server_id = route
            .node_provider_id
            .as_deref()
            .and_then(|p| p.strip_prefix(PROVIDER_ID_PREFIX))
            .and_then(|id| id.parse::<u64>().ok());
        let by_address = route
            .node_addresses
            .iter()
            .filter(|a| a.kind == "InternalIP")
            .filter_map(|a| parse_ip_sloppy(&a.address))
            .find(|ip| range.is_some_and(|r| r.contains(*ip)));
        if let Some(ip) = by_address {
            return Ok((ip, server_id));
        }
        let name = route.node.clone();
        let server = self
            .find_server(|c| match server_id {
                Some(id) => c.by_id.get(&id).cloned(),
                None => c.by_name.get(name.as_str()).cloned(),
            })
            .await?;
        match server.and_then(|s| s.ip.map(|ip| (ip, Some(s.id)))) {
            Some(found) => Ok(found),
            None => Err(CloudError::new(
                ErrorKind::Transient,
                format!(
                    "hcloud: node {:?} has no InternalIP inside the network's range {} and no server \
                     attached to the network; it may not be attached yet",
                    route.node,
                    range.map_or_else(|| "(unknown)".to_string(), |r| r.to_string())
                ),
            )),
        }
    }

    /// Sends a route action and waits for it to finish.
    async fn route_action(
        &self,
        command: &'static str,
        body: &NetworkRoute,
    ) -> Result<(), CloudError> {
        let id = self.network_id().await?;
        let _serialised = self.action_lock.lock().await;
        let env: ActionEnvelope = self
            .http
            .call(
                command,
                Method::POST,
                &format!("/networks/{id}/actions/{command}"),
                &[],
                Some(body),
            )
            .await?;
        self.wait_action(env.action).await
    }

    /// Polls an action until it succeeds or fails, with doubling pauses and a
    /// deadline. A poll that fails leaves the outcome unknown: `Timeout`.
    async fn wait_action(&self, mut action: Action) -> Result<(), CloudError> {
        let deadline = Instant::now() + Duration::from_secs(self.config.action_timeout_secs);
        let max = Duration::from_millis(self.config.action_poll_max_ms.max(1));
        let mut pause = Duration::from_millis(self.config.action_poll_initial_ms).min(max);
        loop {
            match action.status.as_str() {
                "success" => return Ok(()),
                "error" => {
                    let e = action.error.unwrap_or_default();
                    let kind = match classify(0, &e.code, &e.message) {
                        // An unknown failure code: the action did not happen
                        // and may work next time.
                        ErrorKind::Permanent
                            if !matches!(
                                e.code.as_str(),
                                "forbidden" | "unauthorized" | "protected"
                            ) =>
                        {
                            ErrorKind::Transient
                        }
                        k => k,
                    };
                    return Err(CloudError::new(
                        kind,
                        format!(
                            "hcloud: action {} failed: {} {}",
                            action.id, e.code, e.message
                        ),
                    ));
                }
                _ => {}
            }
            if Instant::now() + pause > deadline {
                return Err(CloudError::new(
                    ErrorKind::Timeout,
                    format!(
                        "hcloud: action {} still {} after {} s",
                        action.id, action.status, self.config.action_timeout_secs
                    ),
                ));
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(max);
            let polled: Result<ActionEnvelope, CloudError> = self
                .http
                .call(
                    "get_action",
                    Method::GET,
                    &format!("/actions/{}", action.id),
                    &[],
                    None::<&()>,
                )
                .await;
            match polled {
                Ok(env) => action = env.action,
                Err(e) if e.is_retryable() && Instant::now() + pause <= deadline => {}
                Err(e) => {
                    return Err(CloudError::new(
                        ErrorKind::Timeout,
                        format!(
                            "hcloud: the outcome of action {} is unknown: {e}",
                            action.id
                        ),
                    ));
                }
            }
        }
    }

    /// Converts one network route, resolving its gateway.
    fn to_route(&self, r: &NetworkRoute, servers: &ServerCache, cache: &Cache) -> Route {
        let mut route =
            Route::from_text("", &r.destination).named(format!("{}-{}", r.gateway, r.destination));
        route.next_hop = r.gateway.clone().into();
        let Some(gw) = parse_ip_sloppy(&r.gateway) else {
            route.blackhole = true;
            return route;
        };
        route.node_addresses = vec![NodeAddress::internal_ip(gw.to_string())];
        let server = servers.by_ip.get(&gw);
        let listed_since = |l: &Learned| servers.fetched.is_some_and(|t| t > l.at);
        match (cache.learned.get(&gw), server) {
            // What we created stands unless a server list fetched since shows
            // the IP on another server, or on none (the server is gone: a
            // blackhole, as on clouds that report one).
            (Some(l), None) if listed_since(l) => route.blackhole = true,
            (Some(l), s) if s.is_none_or(|s| l.server_id.is_none_or(|id| id == s.id)) => {
                route.node = l.node.clone().into();
                route.node_provider_id = s
                    .map(|s| s.id)
                    .or(l.server_id)
                    .map(|id| format!("{PROVIDER_ID_PREFIX}{id}").into());
            }
            (_, Some(s)) => {
                route.node = s.name.clone().into();
                route.node_provider_id = Some(format!("{PROVIDER_ID_PREFIX}{}", s.id).into());
            }
            (_, None) => route.blackhole = true,
        }
        route
    }
}

#[async_trait]
impl CloudRoutes for HcloudRoutes {
    fn name(&self) -> &'static str {
        "hcloud"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            max_concurrent_operations: 1,
            supports_batch: false,
            reports_node_addresses: false,
            supports_ipv6: false,
            max_routes: Some(MAX_ROUTES_PER_NETWORK),
            // The server is found by providerID, InternalIP or name; with
            // hcloud's cloud-controller-manager the Node name is the server's.
            needs: TargetNeeds::Nothing,
            replaces_blackholes: false,
            checks_forwarding: false,
            max_routes_per_family: false,
        }
    }

    fn stats(&self) -> &RequestStats {
        self.http.kit.stats()
    }

    /// One `GET /networks/{id}`; plus the server list, only when a gateway is
    /// neither one this provider created nor in the cached server list (at
    /// most once per `server_refresh_min_interval_secs`).
    async fn list_routes(&self, _cluster: &str) -> Result<Vec<Route>, CloudError> {
        let network = self.get_network().await?;
        let gateways: Vec<IpAddr> = network
            .routes
            .iter()
            .filter_map(|r| parse_ip_sloppy(&r.gateway))
            .collect();
        let mut servers = self.servers.lock().await;
        let unknown = {
            let cache = self.cache();
            gateways
                .iter()
                .any(|gw| !cache.learned.contains_key(gw) && !servers.by_ip.contains_key(gw))
        };
        if unknown && self.may_refresh(&servers) {
            self.refresh_servers(&mut servers).await?;
        }
        let mut cache = self.cache();
        cache.learned.retain(|gw, _| gateways.contains(gw));
        Ok(network
            .routes
            .iter()
            .map(|r| self.to_route(r, &servers, &cache))
            .collect())
    }

    /// One `POST .../add_route` plus its polls; a `GET /networks/{id}` only if
    /// the network's range is not known yet, and the server list only if the
    /// Node has no `InternalIP` in that range.
    async fn create_route(
        &self,
        _cluster: &str,
        _name_hint: &str,
        route: &Route,
    ) -> Result<Route, CloudError> {
        let cidr = match route.destination.cidr() {
            Some(c) if c.family() == IpFamily::V4 => c,
            Some(c) => {
                return Err(CloudError::new(
                    ErrorKind::InvalidRequest,
                    format!(
                        "hcloud: cannot route {c} to node {:?}: Hetzner Cloud network routes are IPv4-only",
                        route.node
                    ),
                ));
            }
            None => {
                return Err(CloudError::new(
                    ErrorKind::InvalidRequest,
                    format!("hcloud: destination {} is not a CIDR", route.destination),
                ));
            }
        };
        let (gateway, server_id) = self.gateway_for(route).await?;
        let body = NetworkRoute {
            destination: cidr.to_string(),
            gateway: gateway.to_string(),
        };
        self.route_action("add_route", &body).await?;
        self.cache().learned.insert(
            gateway,
            Learned {
                node: route.node.to_string(),
                server_id,
                at: Instant::now(),
            },
        );
        let mut created = Route::new(route.node.clone(), Destination::Cidr(cidr))
            .named(format!("{}-{}", body.gateway, body.destination))
            .with_addresses(vec![NodeAddress::internal_ip(body.gateway.clone())], false);
        created.next_hop = body.gateway.into();
        created.node_provider_id = server_id
            .map(|id| format!("{PROVIDER_ID_PREFIX}{id}").into())
            .or_else(|| route.node_provider_id.clone());
        Ok(created)
    }

    /// One `POST .../delete_route` plus its polls; a `GET /networks/{id}` only
    /// for a route that does not carry its gateway.
    async fn delete_route(&self, _cluster: &str, route: &Route) -> Result<(), CloudError> {
        let destination = route.destination.to_string();
        let gateway = match parse_ip_sloppy(route.next_hop.trim()) {
            Some(ip) => ip.to_string(),
            None => {
                let network = self.get_network().await?;
                network
                    .routes
                    .into_iter()
                    .find(|r| Destination::parse(&r.destination) == route.destination)
                    .map(|r| r.gateway)
                    .ok_or_else(|| {
                        CloudError::new(
                            ErrorKind::NotFound,
                            format!("hcloud: the network has no route for {destination}"),
                        )
                    })?
            }
        };
        self.route_action(
            "delete_route",
            &NetworkRoute {
                destination,
                gateway,
            },
        )
        .await
    }
}
