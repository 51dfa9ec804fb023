//! The simulated server's tables and its budget.
//!
//! Owns [`State`], everything the one lock of a `MemoryCloud` guards:
//! the route table of each cluster, the server-side token bucket, the call
//! log and the fault injector. Its `create`/`delete`/`list` are the server's
//! answers to a call that got past the budget and the injected faults;
//! `provider` decides when they run, counts and logs them. The changes
//! behind the controller's back (`insert`, `remove`, `blackhole`) are here
//! too, since they edit the same tables; `provider` exposes them as controls.

use std::collections::BTreeMap;
use std::time::Duration;

use route_cloud::{CloudError, ErrorKind};
use route_core::{Destination, IpFamily, Route, TargetNeeds};
use tokio::time::Instant;

use crate::config::{MemoryConfig, Operation};
use crate::faults::Faults;
use crate::log::CallLog;

/// One route as the server keeps it.
#[derive(Debug, Clone)]
pub(crate) struct Stored {
    pub(crate) route: Route,
    /// Lists still to come that must not show this route (eventual consistency).
    pub(crate) hidden_lists: u32,
}

/// Everything behind the simulated server's lock.
#[derive(Debug)]
pub(crate) struct State {
    pub(crate) config: MemoryConfig,
    pub(crate) tables: BTreeMap<String, BTreeMap<Destination, Stored>>,
    pub(crate) log: CallLog,
    pub(crate) faults: Faults,
    pub(crate) tokens: f64,
    pub(crate) refilled: Instant,
    /// The targets the last list found (what `targets()` answers), as a
    /// discovering cloud's client knows them; `None` before the first list.
    pub(crate) listed_targets: Option<Vec<String>>,
}

impl State {
    /// An empty cloud with a full bucket and the faults seeded from `config`.
    pub(crate) fn new(config: MemoryConfig) -> Self {
        let tokens = config.rate_limit.map_or(0.0, |rl| f64::from(rl.burst));
        let faults = Faults::new(config.seed);
        Self {
            config,
            tables: BTreeMap::new(),
            log: CallLog::default(),
            faults,
            tokens,
            refilled: Instant::now(),
            listed_targets: None,
        }
    }

    /// Takes one token from the server-side bucket, or says how long until one exists.
    pub(crate) fn take_token(&mut self, now: Instant) -> Result<(), Duration> {
        let Some(rl) = self.config.rate_limit else {
            return Ok(());
        };
        let rate = rl.per_second();
        let elapsed = now.saturating_duration_since(self.refilled).as_secs_f64();
        self.tokens = (self.tokens + elapsed * rate).min(f64::from(rl.burst));
        self.refilled = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - self.tokens) / rate))
        }
    }

    /// The injected failure for this call of `op`, if any.
    pub(crate) fn injected(&mut self, op: Operation) -> Option<ErrorKind> {
        self.faults.injected(op, &self.config.error_rates)
    }

    /// The keys of `tables` that hold `cluster`'s routes: one per
    /// configured target, or the cluster's one table.
    pub(crate) fn table_keys(&self, cluster: &str) -> Vec<String> {
        if self.config.targets.is_empty() {
            vec![cluster.to_string()]
        } else {
            self.config
                .targets
                .iter()
                .map(|t| table_key(cluster, t))
                .collect()
        }
    }

    /// The listed tables of `cluster`; each hidden route counts down one list.
    pub(crate) fn list(&mut self, cluster: &str) -> Vec<Route> {
        self.listed_targets = Some(self.config.targets.clone());
        let mut out = Vec::new();
        for key in self.table_keys(cluster) {
            let Some(table) = self.tables.get_mut(&key) else {
                continue;
            };
            for s in table.values_mut() {
                if s.hidden_lists > 0 {
                    s.hidden_lists -= 1;
                } else {
                    out.push(s.route.clone());
                }
            }
        }
        out
    }

    /// Creates `route` if the destination, the Node and the quota allow it.
    pub(crate) fn create(
        &mut self,
        cluster: &str,
        name_hint: &str,
        route: &Route,
    ) -> Result<Route, CloudError> {
        let Some(cidr) = route.destination.cidr() else {
            return Err(CloudError::new(
                ErrorKind::InvalidRequest,
                format!("destination {} is not a CIDR", route.destination),
            ));
        };
        if cidr.family() == IpFamily::V6 && !self.config.supports_ipv6 {
            return Err(CloudError::new(
                ErrorKind::InvalidRequest,
                format!("destination {cidr}: this cloud accepts IPv4 destinations only"),
            ));
        }
        let refused = match self.config.needs {
            TargetNeeds::Nothing => None,
            TargetNeeds::ProviderId => route
                .node_provider_id
                .as_deref()
                .is_none_or(|p| p.trim().is_empty())
                .then(|| format!("node {:?} has no spec.providerID", route.node)),
            TargetNeeds::InternalIp => (!route.node_addresses.iter().any(|a| {
                a.kind == "InternalIP"
                    && route_core::cidr::parse_ip_sloppy(&a.address)
                        .is_some_and(|ip| ip.is_ipv4() == (cidr.family() == IpFamily::V4))
            }))
            .then(|| {
                format!(
                    "node {:?} has no {} InternalIP to route {cidr} to",
                    route.node,
                    cidr.family()
                )
            }),
        };
        if let Some(msg) = refused {
            return Err(CloudError::new(ErrorKind::InvalidRequest, msg));
        }
        let target = route.table.as_str();
        if !self.config.targets.is_empty() && !self.config.targets.iter().any(|t| t == target) {
            // As EC2's InvalidRouteTableID.NotFound: a table that went away.
            return Err(CloudError::new(
                ErrorKind::NotFound,
                format!("no route table {target:?} in this cloud"),
            ));
        }
        let max_routes = self.config.max_routes;
        let reports = self.config.reports_node_addresses;
        let list_lag = self.config.list_lag;
        let table = self.tables.entry(table_key(cluster, target)).or_default();
        if let Some(existing) = table.get(&route.destination) {
            let msg = if existing.route.node == route.node {
                format!("a route for {cidr} to node {:?} already exists", route.node)
            } else {
                format!(
                    "the route table already has a route for {cidr} (to node {:?})",
                    existing.route.node
                )
            };
            return Err(CloudError::new(ErrorKind::AlreadyExists, msg));
        }
        if let Some(max) = max_routes
            && table.len() >= max
        {
            return Err(CloudError::new(
                ErrorKind::QuotaExceeded,
                format!("the route table of cluster {cluster:?} is full ({max} routes)"),
            ));
        }
        let cidr_text: String = cidr
            .to_string()
            .chars()
            .map(|c| if c == '/' || c == ':' { '-' } else { c })
            .collect();
        let next_hop = route
            .node_addresses
            .iter()
            .find(|a| a.kind == "InternalIP")
            .map(|a| a.address.clone())
            .or_else(|| route.node_provider_id.clone())
            .unwrap_or_else(|| route.node.clone());
        let stored = Route {
            name: format!("{cluster}-{name_hint}-{cidr_text}").into(),
            node: route.node.clone(),
            destination: route.destination.clone(),
            blackhole: false,
            node_addresses: route.node_addresses.clone(),
            enable_node_addresses: reports,
            next_hop,
            node_provider_id: route.node_provider_id.clone(),
            table: route.table.clone(),
            foreign: None,
        };
        table.insert(
            route.destination.clone(),
            Stored {
                route: stored.clone(),
                hidden_lists: list_lag,
            },
        );
        Ok(stored)
    }

    /// Deletes the route the caller listed, not a later one for the same destination.
    pub(crate) fn delete(&mut self, cluster: &str, route: &Route) -> Result<(), CloudError> {
        let missing = || {
            CloudError::new(
                ErrorKind::NotFound,
                format!(
                    "no route {:?} for {} in the table of cluster {cluster:?}",
                    route.name, route.destination
                ),
            )
        };
        let table = self
            .tables
            .get_mut(&table_key(cluster, &route.table))
            .ok_or_else(missing)?;
        let found = table.get(&route.destination).ok_or_else(missing)?;
        // A route re-created under another name since it was listed is not the
        // one the caller means.
        if !route.name.is_empty() && found.route.name != route.name {
            return Err(missing());
        }
        table.remove(&route.destination);
        Ok(())
    }

    /// Puts `route` in the table its `table` names, replacing any route
    /// for the same destination; returns the replaced one. An empty name
    /// becomes `<cluster>-external-<n>`.
    pub(crate) fn insert(&mut self, cluster: &str, mut route: Route) -> Option<Route> {
        let table = self
            .tables
            .entry(table_key(cluster, &route.table))
            .or_default();
        if route.name.is_empty() {
            route.name = format!("{cluster}-external-{}", table.len()).into();
        }
        table
            .insert(
                route.destination.clone(),
                Stored {
                    route,
                    hidden_lists: 0,
                },
            )
            .map(|s| s.route)
    }

    /// Removes the route for `destination` from every route table of the
    /// cluster; returns one removed.
    pub(crate) fn remove(&mut self, cluster: &str, destination: &Destination) -> Option<Route> {
        let mut removed = None;
        for key in self.table_keys(cluster) {
            if let Some(gone) = self
                .tables
                .get_mut(&key)
                .and_then(|t| t.remove(destination))
            {
                removed.get_or_insert(gone.route);
            }
        }
        removed
    }

    /// Marks the route for `destination` as a blackhole in every route table
    /// of the cluster; returns whether such a route exists.
    pub(crate) fn blackhole(&mut self, cluster: &str, destination: &Destination) -> bool {
        let mut found = false;
        for key in self.table_keys(cluster) {
            if let Some(stored) = self
                .tables
                .get_mut(&key)
                .and_then(|t| t.get_mut(destination))
            {
                stored.route.blackhole = true;
                found = true;
            }
        }
        found
    }
}

/// The key of `tables` for `cluster`'s route table `target` (empty: its one
/// table). A unit separator keeps cluster names and targets apart.
pub(crate) fn table_key(cluster: &str, target: &str) -> String {
    if target.is_empty() {
        cluster.to_string()
    } else {
        format!("{cluster}\u{1f}{target}")
    }
}
