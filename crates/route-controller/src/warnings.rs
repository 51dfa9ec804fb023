//! Warning Events: every one the controller can emit is built here.
//!
//! [`Reason`] lists them all, with the sentence the generated
//! docs/reference/conditions-and-events.md shows for each. A
//! [`Warning`] is built by one constructor per reason, so the wording of a
//! reason lives in one place; the status step emits them
//! ([`crate::status::emit`]), nothing else does.
//!
//! [`PlanWarnings`] owns the memory of which plan warnings were already
//! emitted: the planner reports conflicts and invalid pod CIDRs on every
//! pass, and a Node should get one Event per cause, not one per pass.

use std::collections::HashSet;
use std::time::Duration;

use route_cloud::ErrorKind;
use route_core::{Cidr, Creation, Deletion, Plan};
use tracing::warn;

use crate::nodes::NodeRef;

/// Why a Warning Event was emitted; its `reason` field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// A route creation failed (upstream's reason).
    FailedToCreateRoute,
    /// A route deletion failed.
    FailedToDeleteRoute,
    /// Two Nodes claim the same pod CIDR.
    PodCidrConflict,
    /// A pod CIDR lies outside every `--cluster-cidr`.
    PodCidrOutsideClusterCidr,
    /// A pod CIDR is not a CIDR.
    InvalidPodCidr,
    /// A route was repaired and is a blackhole again (its instance is
    /// stopped or gone); repairs now back off.
    RouteBlackholed,
    /// The cloud drops the pod traffic the Node forwards (a prerequisite on
    /// its instance or interface is off and not ours to change).
    ForwardingDisabled,
    /// The provider found the Node's forwarding prerequisite off and turned
    /// it back on.
    ForwardingRepaired,
    /// A route for the Node was refused because its table is at the
    /// cloud's route limit.
    RouteQuotaExceeded,
    /// The route just created for the Node took its table past 80 % of the
    /// cloud's route limit.
    RouteTableNearlyFull,
    /// The Node's pod CIDR overlaps a route that is provably another
    /// cluster's (or a left-out Node's).
    PodCidrOverlap,
    /// The Node's route was found deleted, retargeted or changed by
    /// someone else, and the controller created it again.
    RouteRepaired,
    /// A setting of the controller disagrees with the whole cluster
    /// (`--cluster-cidr`, `--route-ip-families`, `--node-selector`): the
    /// controller changes nothing until it agrees again.
    ConfigurationMismatch,
    /// A pass held changes that would take away more at once than a bound
    /// allows (`--max-unavailable-nodes`, `--max-route-deletions`).
    ChangesHeld,
}

impl Reason {
    /// Every reason, in the order of docs/reference/conditions-and-events.md.
    pub const ALL: [Reason; 14] = [
        Reason::FailedToCreateRoute,
        Reason::FailedToDeleteRoute,
        Reason::PodCidrConflict,
        Reason::PodCidrOutsideClusterCidr,
        Reason::InvalidPodCidr,
        Reason::RouteBlackholed,
        Reason::ForwardingDisabled,
        Reason::ForwardingRepaired,
        Reason::RouteQuotaExceeded,
        Reason::RouteTableNearlyFull,
        Reason::PodCidrOverlap,
        Reason::RouteRepaired,
        Reason::ConfigurationMismatch,
        Reason::ChangesHeld,
    ];

    /// The Event's `reason`.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::FailedToCreateRoute => "FailedToCreateRoute",
            Reason::FailedToDeleteRoute => "FailedToDeleteRoute",
            Reason::PodCidrConflict => "PodCIDRConflict",
            Reason::PodCidrOutsideClusterCidr => "PodCIDROutsideClusterCIDR",
            Reason::InvalidPodCidr => "InvalidPodCIDR",
            Reason::RouteBlackholed => "RouteBlackholed",
            Reason::ForwardingDisabled => "ForwardingDisabled",
            Reason::ForwardingRepaired => "ForwardingRepaired",
            Reason::RouteQuotaExceeded => "RouteQuotaExceeded",
            Reason::RouteTableNearlyFull => "RouteTableNearlyFull",
            Reason::PodCidrOverlap => "PodCIDROverlap",
            Reason::RouteRepaired => "RouteRepaired",
            Reason::ConfigurationMismatch => "ConfigurationMismatch",
            Reason::ChangesHeld => "ChangesHeld",
        }
    }

    /// When it is emitted (docs/reference/conditions-and-events.md is generated from this).
    pub fn when(self) -> &'static str {
        match self {
            Reason::FailedToCreateRoute => {
                "a route creation failed; the message says why and when the next attempt is (every failure)"
            }
            Reason::FailedToDeleteRoute => {
                "a route deletion failed; the message says why and when the next attempt is (every failure)"
            }
            Reason::PodCidrConflict => {
                "the Node's pod CIDR is claimed by another Node too; neither gets a route for it (once per Node and cause)"
            }
            Reason::PodCidrOutsideClusterCidr => {
                "the Node's pod CIDR is outside every `--cluster-cidr`; it gets no route (once per Node and cause)"
            }
            Reason::InvalidPodCidr => {
                "the Node's pod CIDR is not a CIDR; it gets no route (once per Node and cause)"
            }
            Reason::RouteBlackholed => {
                "a route replaced after a blackhole is a blackhole again; further repairs back off (once per recurrence)"
            }
            Reason::ForwardingDisabled => {
                "the cloud drops the pod traffic the Node forwards (GCE `canIpForward`, Azure `enableIPForwarding` off); the message names the fix (once, until it is fixed)"
            }
            Reason::ForwardingRepaired => {
                "the Node's forwarding prerequisite was off and the controller turned it back on (AWS source/destination check; every repair)"
            }
            Reason::RouteQuotaExceeded => {
                "the Node's route was refused because its table is at the cloud's route limit; it is created as soon as room appears (once per Node until it is routed)"
            }
            Reason::RouteTableNearlyFull => {
                "the route just created for the Node took its table past 80 % of the cloud's route limit (once per crossing)"
            }
            Reason::PodCidrOverlap => {
                "the Node's pod CIDR overlaps a route that is provably another cluster's or a left-out Node's; it gets no route, the other route is never deleted (once per Node and cause)"
            }
            Reason::RouteRepaired => {
                "the drift check found the Node's route deleted, pointed elsewhere or changed by someone else, and the controller created it again; the message says what was found (every repair)"
            }
            Reason::ConfigurationMismatch => {
                "a setting of the controller disagrees with the whole cluster: no more than half of the Nodes' pod CIDRs of a family lie inside `--cluster-cidr`, `--route-ip-families` leaves out every pod CIDR, or `--node-selector` leaves out every Node. The controller changes no route and writes no condition until the Nodes or the flag agree; the message names the flag, its value and the Nodes' CIDRs. On one Node of the cluster (the first by name), once per distinct mismatch"
            }
            Reason::ChangesHeld => {
                "a pass would turn more working Nodes `NetworkUnavailable=True` than `--max-unavailable-nodes` allows, or delete more live routes no Node needs than `--max-route-deletions` allows; none of those changes is made, everything else is. The message says how many and how to let them through. On one Node concerned (else the first by name), once per hold"
            }
        }
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

/// One Warning Event about one Node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning {
    /// The Node it is about.
    pub node: NodeRef,
    /// Its reason.
    pub reason: Reason,
    /// Its message.
    pub message: String,
}

impl Warning {
    /// A creation failed; upstream's wording, plus when the next attempt is.
    /// `e` is the refusal's text, `kind` its class.
    pub fn failed_to_create(
        node: NodeRef,
        c: &Creation,
        e: &str,
        kind: ErrorKind,
        failures: u32,
        wait: Duration,
    ) -> Self {
        let message = format!(
            "Could not create route {} {} for node {}: {e} ({})",
            c.node_uid,
            c.route.destination,
            c.route.node,
            next_attempt(kind, failures, wait)
        );
        Self {
            node,
            reason: Reason::FailedToCreateRoute,
            message,
        }
    }

    /// A deletion failed.
    /// `e` is the failure's text, `kind` its class.
    pub fn failed_to_delete(
        node: NodeRef,
        d: &Deletion,
        e: &str,
        kind: ErrorKind,
        failures: u32,
        wait: Duration,
    ) -> Self {
        let message = format!(
            "Could not delete route {} {} for node {} ({}): {e}",
            d.route.name,
            d.route.destination,
            d.route.node,
            next_attempt(kind, failures, wait)
        );
        Self {
            node,
            reason: Reason::FailedToDeleteRoute,
            message,
        }
    }

    /// A setting disagrees with the whole cluster; `node` is the Node the
    /// Event is filed under (one per mismatch, not one per Node).
    pub fn configuration_mismatch(node: NodeRef, m: &route_core::Misconfiguration) -> Self {
        Self {
            node,
            reason: Reason::ConfigurationMismatch,
            message: format!(
                "{m}; until then this controller changes no route and writes no NetworkUnavailable condition"
            ),
        }
    }

    /// A pass held changes a bound does not allow; filed under `node`.
    pub fn changes_held(node: NodeRef, held: &crate::bounds::Held) -> Self {
        Self {
            node,
            reason: Reason::ChangesHeld,
            message: held.to_string(),
        }
    }

    /// `node`'s pod CIDR `cidr` is also claimed by `others`.
    pub fn pod_cidr_conflict(node: NodeRef, cidr: Cidr, others: &[&str]) -> Self {
        let message = format!(
            "pod CIDR {cidr} is also claimed by node(s) {}; no route is created for it until the conflict is resolved",
            others.join(", ")
        );
        Self {
            node,
            reason: Reason::PodCidrConflict,
            message,
        }
    }

    /// A creation for `node` was refused for room, by the cloud or by the
    /// provider's known limit (`e` says which).
    pub fn route_quota_exceeded(node: NodeRef, c: &Creation, e: &str) -> Self {
        Self {
            node,
            reason: Reason::RouteQuotaExceeded,
            message: format!(
                "Could not create route {} for node {}: {e}; it is created as soon as a route is deleted or the limit is raised",
                c.route.destination, c.route.node
            ),
        }
    }

    /// The route created for `node` took `table` to `used` of `max` routes.
    pub fn route_table_nearly_full(node: NodeRef, table: &str, used: usize, max: usize) -> Self {
        let table = if table.is_empty() {
            "the route table".to_owned()
        } else {
            format!("route table {table}")
        };
        Self {
            node,
            reason: Reason::RouteTableNearlyFull,
            message: format!(
                "{table} now holds {used} of the {max} routes the cloud allows ({}%); raise the limit before new Nodes stay unrouted",
                used * 100 / max.max(1)
            ),
        }
    }

    /// `node`'s pod CIDR overlaps `o.route`, which is `o.owner`'s.
    pub fn pod_cidr_overlap(node: NodeRef, o: &route_core::Overlap) -> Self {
        let table = if o.table.is_empty() {
            String::new()
        } else {
            format!(" in {}", o.table)
        };
        Self {
            node,
            reason: Reason::PodCidrOverlap,
            message: format!(
                "pod CIDR {} overlaps route {}{table}, which belongs to {}; no route is created for it and the other route is not touched",
                o.cidr, o.route, o.owner
            ),
        }
    }

    /// `cidr` is outside every cluster CIDR.
    pub fn outside_cluster(node: NodeRef, cidr: Cidr, cluster_cidrs: &[Cidr]) -> Self {
        let cluster: Vec<String> = cluster_cidrs.iter().map(Cidr::to_string).collect();
        let message = format!(
            "pod CIDR {cidr} is outside every cluster CIDR ({}); no route is created for it",
            cluster.join(", ")
        );
        Self {
            node,
            reason: Reason::PodCidrOutsideClusterCidr,
            message,
        }
    }

    /// `text` in `spec.podCIDRs` is not a CIDR.
    pub fn invalid_pod_cidr(node: NodeRef, text: &str) -> Self {
        Self {
            node,
            reason: Reason::InvalidPodCidr,
            message: format!("pod CIDR {text:?} is not a valid CIDR; no route is created for it"),
        }
    }

    /// The route for `cidr` was repaired and is a blackhole again.
    pub fn route_blackholed(node: NodeRef, cidr: Cidr, next_repair: Duration) -> Self {
        let message = format!(
            "route {cidr} for node {} was replaced and is a blackhole again (its instance may be stopped or gone); next repair in {next_repair:?}",
            node.name
        );
        Self {
            node,
            reason: Reason::RouteBlackholed,
            message,
        }
    }
}

impl Warning {
    /// `node`'s forwarding prerequisite is off: `what` is off, `fix` turns it on.
    pub fn forwarding_disabled(node: NodeRef, what: &str, fix: &str) -> Self {
        let message = format!(
            "the route(s) to node {} are in place, but the cloud drops the pod traffic it forwards: {what}. {fix}",
            node.name
        );
        Self {
            node,
            reason: Reason::ForwardingDisabled,
            message,
        }
    }

    /// `node`'s forwarding prerequisite was off; the provider repaired `what`.
    pub fn forwarding_repaired(node: NodeRef, what: &str) -> Self {
        let message = format!(
            "{what}, so the cloud dropped the pod traffic node {} forwards; something changed it behind the controller's back, and the controller set it again",
            node.name
        );
        Self {
            node,
            reason: Reason::ForwardingRepaired,
            message,
        }
    }
}

impl Warning {
    /// The Node's route was found changed behind the controller's back
    /// (`what`, from [`crate::drift::RouteDrift::describe`]) and created again.
    pub fn route_repaired(node: NodeRef, what: &str) -> Self {
        let message = format!(
            "{what}; pod traffic to node {} was not delivered meanwhile, and the controller created the route again",
            node.name
        );
        Self {
            node,
            reason: Reason::RouteRepaired,
            message,
        }
    }
}

/// When a failed operation is tried again, for its Event.
fn next_attempt(kind: ErrorKind, failures: u32, wait: Duration) -> String {
    if crate::policy::of(kind).retry == crate::policy::Retry::Paced {
        "throttled; retrying as soon as the cloud accepts calls again".into()
    } else {
        format!("attempt {failures}, retrying in {wait:?}")
    }
}

/// The plan warnings already emitted, so each cause warns once.
#[derive(Debug, Default)]
pub struct PlanWarnings {
    /// (Node UID, reason, message) of every warning whose cause is still there.
    warned: HashSet<(String, Reason, String)>,
    /// (name, destination) of cloud routes already logged as unparsable.
    /// They are only logged: a route no Node owns has no object to put an
    /// Event on.
    logged: HashSet<(String, String)>,
}

impl PlanWarnings {
    /// No warnings emitted yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The warnings `plan` calls for that were not emitted while their cause
    /// lasted. Causes that are gone are forgotten, so a recurrence warns
    /// again. `uid_of` names the Node's UID now (a Node gone since the
    /// snapshot gets no Event).
    pub fn new_warnings(
        &mut self,
        plan: &Plan,
        cluster_cidrs: &[Cidr],
        uid_of: impl Fn(&str) -> Option<String>,
    ) -> Vec<Warning> {
        let node = |name: &str| {
            uid_of(name).map(|uid| NodeRef {
                name: name.to_string(),
                uid,
            })
        };
        let mut all = Vec::new();
        for c in &plan.conflicts {
            for n in &c.nodes {
                let others: Vec<&str> = c
                    .nodes
                    .iter()
                    .filter(|o| *o != n)
                    .map(String::as_str)
                    .collect();
                all.extend(node(n).map(|r| Warning::pod_cidr_conflict(r, c.cidr, &others)));
            }
        }
        for o in &plan.outside_cluster {
            all.extend(node(&o.node).map(|r| Warning::outside_cluster(r, o.cidr, cluster_cidrs)));
        }
        for i in &plan.invalid_pod_cidrs {
            all.extend(node(&i.node).map(|r| Warning::invalid_pod_cidr(r, &i.text)));
        }
        for o in &plan.overlaps {
            all.extend(node(&o.node).map(|r| Warning::pod_cidr_overlap(r, o)));
        }
        let mut logged = HashSet::new();
        for r in &plan.unparsable_routes {
            let key = (r.name.to_string(), r.destination.to_string());
            if !self.logged.contains(&key) {
                warn!(route = %r.name, destination = %r.destination, "ignoring cloud route with an unparsable destination; it is never deleted");
            }
            logged.insert(key);
        }
        self.logged = logged;
        let mut current = HashSet::with_capacity(all.len());
        let mut fresh = Vec::new();
        for w in all {
            let key = (w.node.uid.clone(), w.reason, w.message.clone());
            if !self.warned.contains(&key) {
                fresh.push(w);
            }
            current.insert(key);
        }
        self.warned = current;
        fresh
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use route_cloud::CloudError;
    use route_core::{NodeView, PlanConfig};
    use std::sync::Arc;

    fn cidr(s: &str) -> Cidr {
        Cidr::parse(s).unwrap()
    }

    fn plan_of(nodes: &[NodeView]) -> Plan {
        let nodes: Vec<Arc<NodeView>> = nodes.iter().cloned().map(Arc::new).collect();
        route_core::plan(
            &nodes,
            &[],
            &PlanConfig {
                cluster_cidrs: vec![cidr("10.0.0.0/16")],
                ..PlanConfig::default()
            },
        )
    }

    fn uid(name: &str) -> Option<String> {
        Some(format!("uid-{name}"))
    }

    #[test]
    fn each_plan_warning_is_emitted_once_while_its_cause_lasts_and_again_when_it_recurs() {
        let conflict = [
            NodeView::new("a", "uid-a", &["10.0.1.0/24"]),
            NodeView::new("b", "uid-b", &["10.0.1.0/24"]),
            NodeView::new("c", "uid-c", &["192.168.0.0/24"]),
            NodeView::new("d", "uid-d", &["not-a-cidr"]),
        ];
        let mut w = PlanWarnings::new();
        let first = w.new_warnings(&plan_of(&conflict), &[cidr("10.0.0.0/16")], uid);
        let reasons: Vec<(&str, Reason)> = first
            .iter()
            .map(|w| (w.node.name.as_str(), w.reason))
            .collect();
        assert_eq!(
            reasons,
            [
                ("a", Reason::PodCidrConflict),
                ("b", Reason::PodCidrConflict),
                ("c", Reason::PodCidrOutsideClusterCidr),
                ("d", Reason::InvalidPodCidr),
            ]
        );
        assert!(first[0].message.contains("also claimed by node(s) b"));
        assert!(first[2].message.contains("(10.0.0.0/16)"));
        assert!(
            w.new_warnings(&plan_of(&conflict), &[cidr("10.0.0.0/16")], uid)
                .is_empty(),
            "the same causes warn once"
        );
        let resolved = [NodeView::new("a", "uid-a", &["10.0.1.0/24"])];
        assert!(
            w.new_warnings(&plan_of(&resolved), &[cidr("10.0.0.0/16")], uid)
                .is_empty()
        );
        let again = w.new_warnings(&plan_of(&conflict), &[cidr("10.0.0.0/16")], uid);
        assert_eq!(again.len(), 4, "a cause that came back warns again");
    }

    #[test]
    fn a_node_gone_since_the_snapshot_gets_no_warning() {
        let nodes = [NodeView::new("d", "uid-d", &["not-a-cidr"])];
        let mut w = PlanWarnings::new();
        assert!(
            w.new_warnings(&plan_of(&nodes), &[cidr("10.0.0.0/16")], |_| None)
                .is_empty()
        );
    }

    #[test]
    fn failure_messages_say_when_the_next_attempt_is() {
        let plan = plan_of(&[NodeView::new("a", "uid-a", &["10.0.1.0/24"])]);
        let node = NodeRef {
            name: "a".into(),
            uid: "uid-a".into(),
        };
        let e = CloudError::new(ErrorKind::Transient, "boom");
        let w = Warning::failed_to_create(
            node.clone(),
            &plan.creations[0],
            &e.to_string(),
            e.kind,
            2,
            Duration::from_secs(2),
        );
        assert_eq!(w.reason, Reason::FailedToCreateRoute);
        assert!(
            w.message.ends_with("(attempt 2, retrying in 2s)"),
            "{}",
            w.message
        );
        let throttled = CloudError::new(ErrorKind::Throttled, "slow down");
        let w = Warning::failed_to_create(
            node,
            &plan.creations[0],
            &throttled.to_string(),
            throttled.kind,
            3,
            Duration::ZERO,
        );
        assert!(
            w.message
                .contains("retrying as soon as the cloud accepts calls again")
        );
    }
}
