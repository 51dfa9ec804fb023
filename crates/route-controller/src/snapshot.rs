//! The snapshot step: the Nodes and the route table one pass plans from.
//!
//! [`RouteCache`] is the single owner of the route table as last seen: the
//! snapshot step takes it out for planning in the modes that plan against
//! it ([`Mode::caches_route_table`]), the loop puts the table back after
//! executing, and the absorb step folds the outcome into it or forgets it
//! when an answer made it uncertain. Every mode keeps it, because a listing
//! is compared with it to find what changed behind the controller's back
//! ([`crate::drift`]). [`take`] is the only code that lists the cloud.

use std::sync::Arc;

use route_cloud::CloudError;
use route_core::{NodeView, Route};
use tracing::info;

use crate::drift::{self, RouteDrift};
use crate::execute::Executor;
use crate::nodes::NodeStore;
use crate::schedule::Mode;

/// The route table kept between passes: planned against in the modes that
/// cache it, compared with the next listing in all of them.
#[derive(Debug)]
pub struct RouteCache {
    plans: bool,
    table: Option<Vec<Route>>,
}

impl RouteCache {
    /// An empty cache for `mode`.
    pub fn new(mode: Mode) -> Self {
        Self {
            plans: mode.caches_route_table(),
            table: None,
        }
    }

    /// The table a pass planned from and executed against.
    pub fn keep(&mut self, routes: Vec<Route>) {
        self.table = Some(routes);
    }

    /// Forgets the table (leadership gained, an uncertain answer): the next
    /// pass lists.
    pub fn forget(&mut self) {
        self.table = None;
    }

    /// A table is cached for planning.
    pub fn is_warm(&self) -> bool {
        self.plans && self.table.is_some()
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
    /// What the listing shows changed since the table was last seen
    /// (empty on a cached pass, and when no table was kept).
    pub drift: Vec<RouteDrift>,
}

/// Takes the Nodes and the route table for one pass: the cached table when
/// `use_cache` and one is cached (moved out, so a cached pass copies
/// nothing), else a fresh list from the cloud (**cloud I/O**), compared with
/// the table as last seen to find drift.
pub async fn take(
    nodes: &NodeStore,
    cache: &mut RouteCache,
    executor: &Executor,
    use_cache: bool,
) -> Result<Snapshot, CloudError> {
    let nodes = nodes.snapshot_for_pass();
    let cloud = executor.cloud();
    cloud.observe_nodes(&nodes);
    if use_cache
        && cache.plans
        && let Some(mut routes) = cache.table.take()
    {
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
            drift: Vec::new(),
        });
    }
    let routes = executor.list().await?;
    let drift = cache
        .table
        .as_deref()
        .map(|last| drift::compare(last, &routes))
        .unwrap_or_default();
    for d in &drift {
        info!(
            drift = d.kind.as_str(),
            node = %d.was.node,
            "{}; the listing is planned from, so it is repaired in this pass",
            d.describe()
        );
    }
    Ok(Snapshot {
        nodes,
        routes,
        listed: true,
        drift,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use route_core::Cidr;

    fn route(node: &str, cidr: &str) -> Route {
        Route::new(node, Cidr::parse(cidr).unwrap())
    }

    #[test]
    fn every_mode_keeps_the_table_for_drift_but_only_caching_modes_plan_from_it() {
        for mode in Mode::ALL {
            let mut c = RouteCache::new(mode);
            c.keep(vec![route("a", "10.0.0.0/24")]);
            assert!(c.table.is_some(), "{mode}");
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
