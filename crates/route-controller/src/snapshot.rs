//! The snapshot step: the Nodes and the route table one pass plans from.
//!
//! [`RouteCache`] is the single owner of the cached route table of the
//! modes that keep one ([`Mode::caches_route_table`]): the snapshot step
//! takes it out for planning, the loop puts the table back after executing,
//! and the absorb step folds the outcome into it or forgets it when an
//! answer made it uncertain. [`take`] is the only code that lists the cloud.

use std::collections::HashMap;
use std::sync::Arc;

use route_cloud::CloudError;
use route_core::{NodeView, Route};
use tracing::info;

use crate::execute::Executor;
use crate::nodes::NodeStore;
use crate::schedule::Mode;

/// The route table kept between passes, in the modes that keep one.
#[derive(Debug)]
pub struct RouteCache {
    keeps: bool,
    table: Option<Vec<Route>>,
}

impl RouteCache {
    /// An empty cache for `mode`; in modes that list every pass it never
    /// holds anything.
    pub fn new(mode: Mode) -> Self {
        Self {
            keeps: mode.caches_route_table(),
            table: None,
        }
    }

    /// The table a pass planned from and executed against; kept if the mode
    /// keeps one.
    pub fn keep(&mut self, routes: Vec<Route>) {
        if self.keeps {
            self.table = Some(routes);
        }
    }

    /// Forgets the table (leadership gained, an uncertain answer): the next
    /// pass lists.
    pub fn forget(&mut self) {
        self.table = None;
    }

    /// A table is cached.
    pub fn is_warm(&self) -> bool {
        self.table.is_some()
    }

    /// A route the cloud now has.
    pub fn add(&mut self, route: Route) {
        if let Some(t) = &mut self.table {
            t.push(route);
        }
    }

    /// A route the cloud no longer has.
    pub fn remove(&mut self, route: &Route) {
        if let Some(t) = &mut self.table
            && let Some(i) = t.iter().position(|r| r == route)
        {
            t.swap_remove(i);
        }
    }
}

/// What one pass plans from.
#[derive(Debug)]
pub struct Snapshot {
    /// Every Node, as the cache has it now.
    pub nodes: Vec<Arc<NodeView>>,
    /// The route table: listed just now, or the cached one.
    pub routes: Vec<Route>,
    /// `routes` was listed in this pass.
    pub listed: bool,
}

/// Takes the Nodes and the route table for one pass: the cached table when
/// `use_cache` and one is cached (moved out, so a cached pass copies
/// nothing), else a fresh list from the cloud (**cloud I/O**), compared with
/// the cached one to log drift.
pub async fn take(
    nodes: &NodeStore,
    cache: &mut RouteCache,
    executor: &Executor,
    use_cache: bool,
) -> Result<Snapshot, CloudError> {
    let nodes = nodes.snapshot_for_pass();
    let cloud = executor.cloud();
    cloud.observe_nodes(&nodes);
    if use_cache && let Some(mut routes) = cache.table.take() {
        // A provider that learns Node addresses from Nodes may know more
        // about a cached route than when it was listed.
        if cloud.capabilities().reports_node_addresses {
            for r in routes.iter_mut() {
                if let Some(fresh) = cloud.refresh_route(r) {
                    *r = fresh;
                }
            }
        }
        return Ok(Snapshot {
            nodes,
            routes,
            listed: false,
        });
    }
    let routes = executor.list().await?;
    if let Some(old) = &cache.table {
        let drift = drift(old, &routes);
        if drift > 0 {
            info!(
                drift,
                "full sync found routes that differ from the cached table"
            );
        }
    }
    Ok(Snapshot {
        nodes,
        routes,
        listed: true,
    })
}

/// Routes present in one table and not the other (by node, destination, blackhole).
fn drift(cached: &[Route], listed: &[Route]) -> usize {
    fn key(r: &Route) -> (&str, &route_core::Destination, bool) {
        (r.node.as_str(), &r.destination, r.blackhole)
    }
    let mut counts: HashMap<_, i64> = HashMap::with_capacity(cached.len());
    for r in cached {
        *counts.entry(key(r)).or_default() += 1;
    }
    for r in listed {
        *counts.entry(key(r)).or_default() -= 1;
    }
    counts.values().map(|v| v.unsigned_abs() as usize).sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use route_core::Cidr;

    fn route(node: &str, cidr: &str) -> Route {
        Route::new(node, Cidr::parse(cidr).unwrap())
    }

    #[test]
    fn drift_counts_routes_in_one_table_only() {
        let a = route("a", "10.0.0.0/24");
        let b = route("b", "10.0.1.0/24");
        let c = route("c", "10.0.2.0/24");
        assert_eq!(drift(&[a.clone(), b.clone()], &[b.clone(), a.clone()]), 0);
        assert_eq!(drift(&[a.clone(), b.clone()], &[b.clone(), c]), 2);
        let mut hole = b.clone();
        hole.blackhole = true;
        assert_eq!(drift(&[b], &[hole]), 2, "a route that became a blackhole");
    }

    #[test]
    fn only_caching_modes_keep_the_table() {
        for mode in Mode::ALL {
            let mut c = RouteCache::new(mode);
            c.keep(vec![route("a", "10.0.0.0/24")]);
            assert_eq!(c.is_warm(), mode.caches_route_table(), "{mode}");
        }
    }

    #[test]
    fn the_cache_follows_landed_changes_and_is_forgotten_when_uncertain() {
        let mut c = RouteCache::new(Mode::Incremental);
        c.add(route("x", "10.0.9.0/24"));
        assert!(
            !c.is_warm(),
            "nothing is added to a cache that is not there"
        );
        c.keep(vec![route("a", "10.0.0.0/24")]);
        c.add(route("b", "10.0.1.0/24"));
        c.remove(&route("a", "10.0.0.0/24"));
        assert_eq!(c.table.as_deref(), Some(&[route("b", "10.0.1.0/24")][..]));
        c.forget();
        assert!(!c.is_warm());
    }
}
