//! Step 2b: the settings against the cluster, after planning and before
//! anything of the plan is carried out.
//!
//! [`route_core::check_configuration`] decides; this module owns what the
//! controller remembers of it ([`SettingsCheck`]: the mismatch last
//! reported, so the log line and the Warning come once per mismatch, not
//! once per pass) and the [`ConfigAlarm`] the HTTP server's `/readyz`
//! reads. A held pass lists and plans as usual, so the check runs again
//! at every pass and the controller resumes, without a restart, in the
//! first pass after the Nodes or the flags agree.

use std::borrow::Borrow;
use std::sync::{Arc, RwLock};

use route_core::{Misconfiguration, NodeView, PlanConfig, PodCidr};
use tracing::{error, info};

use crate::nodes::NodeRef;
use crate::warnings::Warning;

/// Why the controller is holding every change, for `/readyz`; shared by
/// the reconcile loop (writer) and the HTTP server (reader).
#[derive(Clone, Default, Debug)]
pub struct ConfigAlarm(Arc<RwLock<Option<String>>>);

impl ConfigAlarm {
    /// The reason the settings disagree with the cluster, if they do.
    pub fn reason(&self) -> Option<String> {
        self.0.read().map(|r| r.clone()).unwrap_or_default()
    }

    fn set(&self, reason: Option<String>) {
        if let Ok(mut r) = self.0.write() {
            *r = reason;
        }
    }
}

/// What the loop remembers of the check.
#[derive(Default)]
pub struct SettingsCheck {
    reported: Option<Misconfiguration>,
    alarm: ConfigAlarm,
}

impl SettingsCheck {
    /// Raises and clears `alarm`.
    pub fn with_alarm(alarm: ConfigAlarm) -> Self {
        Self {
            reported: None,
            alarm,
        }
    }

    /// Checks the settings against `nodes`. Returns the mismatch, if any,
    /// and the Warning to emit when it is new; logs it when it is new or
    /// gone.
    pub fn check<N: Borrow<NodeView>>(
        &mut self,
        nodes: &[N],
        config: &PlanConfig,
    ) -> (Option<Misconfiguration>, Option<Warning>) {
        let found = route_core::check_configuration(nodes, config);
        if found == self.reported {
            return (found, None);
        }
        let warning = match &found {
            Some(m) => {
                error!(
                    flag = m.flag(),
                    check = m.check(),
                    configured = %configured(m, config),
                    "the controller's settings disagree with the cluster: {m}; no route is changed and no condition written until they agree"
                );
                self.alarm.set(Some(format!("{}: {m}", m.flag())));
                filed_under(nodes, m).map(|node| Warning::configuration_mismatch(node, m))
            }
            None => {
                info!("the controller's settings agree with the cluster again; reconciling");
                self.alarm.set(None);
                None
            }
        };
        self.reported = found.clone();
        (found, warning)
    }

    /// Forgets what was reported (leadership lost): the next leader term
    /// reports a mismatch afresh.
    pub fn forget(&mut self) {
        self.reported = None;
        self.alarm.set(None);
    }
}

/// The flag's value as configured, for the log line's field.
fn configured(m: &Misconfiguration, config: &PlanConfig) -> String {
    match m {
        Misconfiguration::ClusterCidr { .. } => config
            .cluster_cidrs
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(","),
        Misconfiguration::RouteIpFamilies { routed, .. } => routed
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(","),
        Misconfiguration::NodeSelector { .. } => "(see --node-selector)".into(),
    }
}

/// The Node the one Warning is filed under: the first by name that shows
/// the mismatch (a Node whose pod CIDR lies outside, or any Node for the
/// selector), so `kubectl get events` finds it beside the Node's own.
fn filed_under<N: Borrow<NodeView>>(nodes: &[N], m: &Misconfiguration) -> Option<NodeRef> {
    let shows = |n: &&NodeView| match m {
        Misconfiguration::ClusterCidr { outside, .. } => n.pod_cidrs.iter().any(|p| match p {
            PodCidr::Valid(c) => outside.contains(c),
            PodCidr::Invalid(_) => false,
        }),
        Misconfiguration::RouteIpFamilies { .. } => !n.excluded && !n.pod_cidrs.is_empty(),
        Misconfiguration::NodeSelector { .. } => true,
    };
    nodes
        .iter()
        .map(Borrow::borrow)
        .filter(|n| !n.name.is_empty())
        .filter(shows)
        .min_by(|a, b| a.name.cmp(&b.name))
        .map(|n| NodeRef {
            name: n.name.clone(),
            uid: n.uid.clone(),
        })
}
