//! Forwarding prerequisites: which Nodes the provider is asked about, and
//! what its answers change.
//!
//! A route in a table is not yet a pod network: the cloud also drops the
//! pod traffic a Node forwards unless its instance or interface allows it
//! (AWS: the source/destination check off; GCE: `canIpForward`; Azure: the
//! NIC's `enableIPForwarding`). [`Prerequisites`] owns what the controller
//! learned about each Node (by UID) and when to ask again:
//!
//! - a Node never asked about is asked once, answered from the provider's
//!   memory where it has one (no request after the first per instance);
//! - every Node is read afresh at the first pass after gaining leadership
//!   and then once per resync interval, where the provider also repairs
//!   what it owns (AWS turns the check off again, with a Warning);
//! - a Node found disabled is read afresh every [`RECHECK`], so its
//!   condition clears within minutes of the operator's fix.
//!
//! A disabled prerequisite keeps the Node's routes (they carry traffic the
//! moment it is fixed) and makes its condition `ForwardingDisabled`; the
//! Warning that names the fix is emitted once per streak. The NodeStore
//! carries the finding on the Node's view, where the planner reads it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use route_cloud::Forwarding;
use route_core::NodeView;
use tokio::time::Instant;
use tracing::debug;

use crate::nodes::NodeRef;
use crate::warnings::Warning;

/// How often a prerequisite found off is read again.
pub const RECHECK: Duration = Duration::from_secs(300);

/// A Node asked about: when its prerequisite, found disabled, is read
/// again (whether it is disabled lives on the Node's view), and what the
/// Node said about its instance when it was asked ([`data_stamp`]).
#[derive(Debug, Clone, Copy)]
struct Known {
    recheck: Option<Instant>,
    data: u64,
}

/// What a provider finds a Node's instance by: its `spec.providerID` and
/// addresses. A Node asked before they arrived (the external cloud
/// provider sets them seconds after registration) got no answer; once they
/// change it is asked again, or its first route would read `RouteCreated`
/// on a prerequisite nobody read.
fn data_stamp(n: &NodeView) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    n.provider_id.hash(&mut h);
    for a in &n.addresses {
        a.kind.hash(&mut h);
        a.address.hash(&mut h);
    }
    h.finish()
}

/// The Nodes one pass asks about.
#[derive(Debug, Default)]
pub struct Due {
    /// Read afresh (and repaired where the provider owns it).
    pub fresh: Vec<Arc<NodeView>>,
    /// Never asked: the provider may answer from memory.
    pub new: Vec<Arc<NodeView>>,
}

impl Due {
    /// Nothing to ask.
    pub fn is_empty(&self) -> bool {
        self.fresh.is_empty() && self.new.is_empty()
    }
}

/// What the answers change.
#[derive(Debug, Default)]
pub struct Findings {
    /// Warning Events to emit.
    pub warnings: Vec<Warning>,
    /// `(name, uid, disabled)` for the Node views, where it changed.
    pub changed: Vec<(String, String, bool)>,
}

/// The controller's memory of forwarding prerequisites. Owned by the
/// reconcile task; no I/O.
#[derive(Debug)]
pub struct Prerequisites {
    resync: Duration,
    /// When every Node is read afresh; `None`: at the next pass.
    next_full: Option<Instant>,
    known: HashMap<String, Known>,
}

impl Prerequisites {
    /// Reads every Node afresh every `resync` (the controller's resync
    /// interval), and at the first pass.
    pub fn new(resync: Duration) -> Self {
        Self {
            resync,
            next_full: None,
            known: HashMap::new(),
        }
    }

    /// A new leader reads everything afresh: another replica may have
    /// repaired or missed what this one remembers.
    pub fn became_leader(&mut self) {
        self.next_full = None;
    }

    /// The Nodes to ask about now, out of `nodes` (all of them). Nodes
    /// without pod CIDRs or being deleted get no route, so they are not
    /// asked. Only a Node with a route in the table (`routed`) is read
    /// afresh: one without has nothing to verify yet, and a provider
    /// prepares its instance when it creates the first route.
    pub fn due(
        &mut self,
        nodes: &[Arc<NodeView>],
        routed: impl Fn(&str) -> bool,
        now: Instant,
    ) -> Due {
        let full = self.next_full.is_none_or(|t| now >= t);
        if full {
            self.next_full = Some(now + self.resync);
            let live: std::collections::HashSet<&str> =
                nodes.iter().map(|n| n.uid.as_str()).collect();
            self.known.retain(|uid, _| live.contains(uid.as_str()));
        }
        let mut due = Due::default();
        for n in nodes
            .iter()
            .filter(|n| !n.pod_cidrs.is_empty() && !n.deleting)
        {
            if self
                .known
                .get(&n.uid)
                .is_some_and(|k| k.data != data_stamp(n))
            {
                self.known.remove(&n.uid);
            }
            let known = self.known.get_mut(&n.uid);
            let recheck = known
                .as_ref()
                .is_some_and(|k| k.recheck.is_some_and(|t| now >= t));
            if (full || recheck) && routed(&n.name) {
                due.fresh.push(n.clone());
            } else if let Some(k) = known {
                if recheck {
                    // Not routed (yet, or any more): nothing to read now,
                    // but its recheck must move on, or the loop would wake
                    // for it again at once.
                    k.recheck = Some(now + RECHECK);
                }
            } else {
                due.new.push(n.clone());
            }
        }
        due
    }

    /// Takes the provider's answers about `asked`. A Node it did not answer
    /// about keeps what was known (a new one counts as asked, so it is not
    /// asked on every pass).
    ///
    /// A repair is warned about only for a Node with a route in the table
    /// (`routed`): before its first route, turning the prerequisite on is
    /// the instance's ordinary preparation.
    pub fn absorb(
        &mut self,
        asked: &Due,
        answers: Vec<(String, Forwarding)>,
        routed: impl Fn(&str) -> bool,
        now: Instant,
    ) -> Findings {
        let by_name: HashMap<&str, &Arc<NodeView>> = asked
            .fresh
            .iter()
            .chain(&asked.new)
            .map(|n| (n.name.as_str(), n))
            .collect();
        for n in by_name.values() {
            self.known.entry(n.uid.clone()).or_insert(Known {
                recheck: n.forwarding_disabled.then_some(now + RECHECK),
                data: data_stamp(n),
            });
        }
        let mut out = Findings::default();
        for (name, answer) in answers {
            let Some(n) = by_name.get(name.as_str()) else {
                continue;
            };
            let node = NodeRef {
                name: n.name.clone(),
                uid: n.uid.clone(),
            };
            let known = self.known.get_mut(&n.uid).expect("inserted above");
            let was = n.forwarding_disabled;
            let disabled = match &answer {
                Forwarding::Ready => false,
                Forwarding::Repaired { what } => {
                    if routed(&n.name) {
                        out.warnings.push(Warning::forwarding_repaired(node, what));
                    } else {
                        debug!(node = %n.name, "{what}; prepared before its first route");
                    }
                    false
                }
                // Never asked for here (the loop always repairs); taken
                // as off, so no Node reads RouteCreated while it is.
                Forwarding::WouldRepair { what } => {
                    if !was {
                        let fix = "The controller turns it back on at its next check.";
                        out.warnings
                            .push(Warning::forwarding_disabled(node, what, fix));
                    }
                    true
                }
                Forwarding::Disabled { what, fix } => {
                    if !was {
                        out.warnings
                            .push(Warning::forwarding_disabled(node, what, fix));
                    }
                    true
                }
            };
            known.recheck = disabled.then_some(now + RECHECK);
            if disabled != was {
                out.changed.push((n.name.clone(), n.uid.clone(), disabled));
            }
        }
        out
    }

    /// A Node whose check failed (the cloud did not answer) is asked again
    /// at the next pass that reads afresh; until then it keeps what was known.
    pub fn failed(&mut self, asked: &Due) {
        if !asked.fresh.is_empty() {
            self.next_full = None;
        }
        for n in &asked.new {
            self.known.remove(&n.uid);
        }
    }

    /// When a pass must run for a recheck or the full read, if no other
    /// reason runs one first.
    pub fn next_wake(&self) -> Option<Instant> {
        self.known
            .values()
            .filter_map(|k| k.recheck)
            .chain(self.next_full)
            .min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str) -> Arc<NodeView> {
        Arc::new(NodeView::new(name, format!("uid-{name}"), &["10.0.1.0/24"]))
    }

    fn disabled() -> Forwarding {
        Forwarding::Disabled {
            what: "canIpForward is false".into(),
            fix: "recreate it".into(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn every_node_is_read_afresh_at_start_then_only_new_ones_until_the_resync() {
        let mut p = Prerequisites::new(Duration::from_secs(3600));
        let nodes = vec![node("a"), node("b")];
        let now = Instant::now();
        let due = p.due(&nodes, |_| true, now);
        assert_eq!((due.fresh.len(), due.new.len()), (2, 0));
        p.absorb(&due, vec![("a".into(), Forwarding::Ready)], |_| true, now);
        let more = vec![node("a"), node("b"), node("c")];
        let due = p.due(&more, |_| true, now + Duration::from_secs(10));
        assert_eq!(due.fresh.len(), 0);
        assert_eq!(
            due.new.iter().map(|n| n.name.as_str()).collect::<Vec<_>>(),
            ["c"]
        );
        p.absorb(&due, vec![], |_| true, now);
        assert!(
            p.due(&more, |_| true, now + Duration::from_secs(20))
                .is_empty()
        );
        assert_eq!(
            p.due(&more, |_| true, now + Duration::from_secs(3600))
                .fresh
                .len(),
            3
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_node_without_a_route_is_never_read_afresh_only_asked_once() {
        let mut p = Prerequisites::new(Duration::from_secs(3600));
        let now = Instant::now();
        let nodes = [node("a")];
        let due = p.due(&nodes, |_| false, now);
        assert_eq!((due.fresh.len(), due.new.len()), (0, 1));
        p.absorb(&due, vec![], |_| false, now);
        assert!(
            p.due(&nodes, |_| false, now + Duration::from_secs(3600))
                .is_empty()
        );
        let due = p.due(&nodes, |_| true, now + Duration::from_secs(7200));
        assert_eq!(due.fresh.len(), 1, "routed now: read at the resync");
    }

    /// Found by the checker (seed 3334 of 10,000, every class): a Node
    /// registered without its providerID was asked once (the provider could
    /// not answer), counted as asked, and never asked again; once its
    /// providerID arrived and a freed pod CIDR got it a route, it read
    /// `RouteCreated` on an instance whose prerequisite was off, until the
    /// next full read.
    #[tokio::test(start_paused = true)]
    async fn a_node_asked_before_its_provider_id_arrived_is_asked_again_once_it_has_one() {
        let mut p = Prerequisites::new(Duration::from_secs(3600));
        let now = Instant::now();
        let bare = node("a");
        let due = p.due(std::slice::from_ref(&bare), |_| false, now);
        assert_eq!(due.new.len(), 1);
        p.absorb(&due, vec![], |_| false, now);
        assert!(
            p.due(
                std::slice::from_ref(&bare),
                |_| false,
                now + Duration::from_secs(10)
            )
            .is_empty(),
            "unchanged: not asked again"
        );
        let with_id = Arc::new((*bare).clone().with_provider_id("gce://p/z/a"));
        let due = p.due(
            std::slice::from_ref(&with_id),
            |_| false,
            now + Duration::from_secs(20),
        );
        assert_eq!(due.new.len(), 1, "its instance is known now: asked again");
        let found = p.absorb(&due, vec![("a".into(), disabled())], |_| true, now);
        assert_eq!(found.changed, [("a".into(), "uid-a".into(), true)]);
    }

    /// Found by the checker (seed 842): a Node found disabled whose route
    /// is not in the table (an invalid pod CIDR) kept a recheck in the past,
    /// and the loop woke for it at once, pass after pass.
    #[tokio::test(start_paused = true)]
    async fn a_disabled_node_without_a_route_moves_its_recheck_on_instead_of_waking_the_loop_at_once()
     {
        let mut p = Prerequisites::new(Duration::from_secs(12 * 3600));
        let now = Instant::now();
        let due = p.due(&[node("a")], |_| false, now);
        p.absorb(&due, vec![("a".into(), disabled())], |_| false, now);
        let later = now + RECHECK;
        assert!(p.due(&[node("a")], |_| false, later).is_empty());
        assert_eq!(p.next_wake(), Some(later + RECHECK));
    }

    #[tokio::test(start_paused = true)]
    async fn a_disabled_prerequisite_is_warned_once_and_read_again_every_recheck() {
        let mut p = Prerequisites::new(Duration::from_secs(12 * 3600));
        let now = Instant::now();
        let due = p.due(&[node("a")], |_| true, now);
        let f = p.absorb(&due, vec![("a".into(), disabled())], |_| true, now);
        assert_eq!(f.warnings.len(), 1);
        assert_eq!(f.changed, [("a".into(), "uid-a".into(), true)]);
        assert_eq!(p.next_wake(), Some(now + RECHECK));
        // The store now carries the finding on the view.
        let mut seen = NodeView::new("a", "uid-a", &["10.0.1.0/24"]);
        seen.forwarding_disabled = true;
        let seen = vec![Arc::new(seen)];
        assert!(
            p.due(&seen, |_| true, now + Duration::from_secs(60))
                .is_empty()
        );
        let due = p.due(&seen, |_| true, now + RECHECK);
        assert_eq!(due.fresh.len(), 1);
        let f = p.absorb(
            &due,
            vec![("a".into(), disabled())],
            |_| true,
            now + RECHECK,
        );
        assert!(f.warnings.is_empty(), "once per streak");
        assert!(f.changed.is_empty());
        let f = p.absorb(
            &due,
            vec![("a".into(), Forwarding::Ready)],
            |_| true,
            now + RECHECK,
        );
        assert_eq!(f.changed, [("a".into(), "uid-a".into(), false)]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_repair_is_warned_every_time() {
        let mut p = Prerequisites::new(Duration::from_secs(3600));
        let now = Instant::now();
        let nodes = [node("a")];
        for i in 0..2 {
            let at = now + Duration::from_secs(3600 * i);
            let due = p.due(&nodes, |_| true, at);
            let what = "source/destination check on i-1".to_string();
            let answer = vec![("a".into(), Forwarding::Repaired { what })];
            let f = p.absorb(&due, answer.clone(), |_| true, at);
            assert_eq!(f.warnings.len(), 1);
            let f = p.absorb(&due, answer, |_| false, at);
            assert!(f.warnings.is_empty(), "no route yet: its preparation");
            assert!(f.changed.is_empty());
        }
    }
}
