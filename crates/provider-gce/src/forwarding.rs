//! The forwarding prerequisite on GCE: an instance's `canIpForward`.
//!
//! Compute Engine delivers a packet to an instance only when the packet's
//! destination is one of the instance's own addresses, unless the instance
//! has `canIpForward: true`; a route whose next hop is such an instance then
//! carries nothing to the pods behind it. The field is fixed while the
//! instance exists and runs (it is set at creation, or on a stopped instance
//! through an update of the whole resource), so:
//!
//! - an instance found with it on is never read again;
//! - one found with it off is read again only when the controller asks
//!   afresh (it rechecks disabled Nodes every few minutes and everything at
//!   every resync), so the condition clears soon after the operator's fix;
//! - nothing is ever changed: the provider could not turn it on without
//!   stopping the Node, which is not a route controller's decision.
//!
//! One `instances.get` per instance, the first time. The Compute API's
//! batch endpoint would still count every inner call against the read quota
//! and the official client does not offer it, so the reads go out a few at
//! a time through the provider's request budget instead.

use std::collections::HashSet;
use std::sync::Arc;

use google_cloud_gax::options::RequestOptionsBuilder as _;
use route_cloud::{CloudError, ErrorKind, Forwarding, ForwardingCheck};
use route_core::NodeView;
use tracing::debug;

use crate::{GceRoutes, InstanceRef};

/// How many `instances.get` are in flight at once.
const CONCURRENT_READS: usize = 8;

/// What `instance` lacks, for the Warning.
pub fn disabled_what(instance: &InstanceRef) -> String {
    format!(
        "instance {} (zone {}, project {}) has canIpForward false: Compute Engine drops the pod \
         traffic routed to it",
        instance.name, instance.zone, instance.project
    )
}

/// How the operator turns `canIpForward` on for `instance`.
pub fn disabled_fix(instance: &InstanceRef) -> String {
    let (name, zone, project) = (&instance.name, &instance.zone, &instance.project);
    format!(
        "canIpForward cannot be changed on a running instance. Either recreate the instance with \
         IP forwarding on (`gcloud compute instances create {name} --zone {zone} --project \
         {project} --can-ip-forward ...`; for a managed instance group, `--can-ip-forward` on a \
         new instance template, then replace the group's instances), or stop it, export it \
         (`gcloud compute instances export {name} --zone {zone} --project {project} \
         --destination {name}.yaml`), set `canIpForward: true` in the file, apply it \
         (`gcloud compute instances update-from-file {name} --zone {zone} --project {project} \
         --source {name}.yaml --most-disruptive-allowed-action RESTART`) and start it again"
    )
}

impl GceRoutes {
    /// One `instances.get`: `Some(canIpForward)`, or `None` when the
    /// instance does not exist (a Node whose instance is gone has no news).
    async fn can_ip_forward(&self, instance: &InstanceRef) -> Result<Option<bool>, CloudError> {
        let get = self
            .instances
            .get()
            .set_project(&instance.project)
            .set_zone(&instance.zone)
            .set_instance(&instance.name)
            .with_attempt_timeout(self.config.request_timeout());
        match self
            .send("get_instance", &self.requests, false, get.send())
            .await
        {
            // An absent field is the API's way of writing false.
            Ok(found) => Ok(Some(found.can_ip_forward.unwrap_or(false))),
            Err(e) if e.kind == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// [`route_cloud::CloudRoutes::check_forwarding`] for GCE.
    pub(crate) async fn check_can_ip_forward(
        &self,
        nodes: &[Arc<NodeView>],
        check: ForwardingCheck,
    ) -> Result<Vec<(String, Forwarding)>, CloudError> {
        let of_node: Vec<(&str, InstanceRef)> = nodes
            .iter()
            .filter_map(|n| {
                let found = n
                    .provider_id
                    .as_deref()
                    .and_then(InstanceRef::from_provider_id);
                if found.is_none() {
                    debug!(node = %n.name, provider_id = ?n.provider_id, "gce: no instance for the Node yet; its forwarding is not checked");
                }
                Some((n.name.as_str(), found?))
            })
            .collect();
        let to_read: Vec<InstanceRef> = {
            let known = self.forwarding.lock().unwrap_or_else(|e| e.into_inner());
            let mut seen = HashSet::new();
            of_node
                .iter()
                .map(|(_, i)| i)
                .filter(|i| match known.get(*i) {
                    None => true,
                    Some(on) => !on && check.fresh,
                })
                .filter(|i| seen.insert(*i))
                .cloned()
                .collect()
        };
        let mut failure = None;
        for chunk in to_read.chunks(CONCURRENT_READS) {
            let reads =
                futures::future::join_all(chunk.iter().map(|i| self.can_ip_forward(i))).await;
            let mut known = self.forwarding.lock().unwrap_or_else(|e| e.into_inner());
            for (instance, read) in chunk.iter().zip(reads) {
                match read {
                    Ok(Some(on)) => {
                        known.insert(instance.clone(), on);
                    }
                    Ok(None) => {
                        debug!(instance = %instance.path(), "gce: the Node's instance does not exist; its forwarding is not checked");
                        known.remove(instance);
                    }
                    Err(e) => {
                        failure.get_or_insert(e);
                    }
                }
            }
            if failure.is_some() {
                break;
            }
        }
        if let Some(e) = failure {
            // What was read is remembered: the next check does not pay for it again.
            return Err(e);
        }
        let known = self.forwarding.lock().unwrap_or_else(|e| e.into_inner());
        Ok(of_node
            .iter()
            .filter_map(|(node, i)| {
                let answer = if *known.get(i)? {
                    Forwarding::Ready
                } else {
                    Forwarding::Disabled {
                        what: disabled_what(i),
                        fix: disabled_fix(i),
                    }
                };
                Some(((*node).to_string(), answer))
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fix_names_the_instance_and_both_ways_to_turn_it_on() {
        let i = InstanceRef::from_provider_id("gce://proj/europe-west1-b/node-1")
            .expect("a providerID literal");
        let fix = disabled_fix(&i);
        assert!(fix.contains("--can-ip-forward"), "{fix}");
        assert!(
            fix.contains("gcloud compute instances update-from-file node-1 --zone europe-west1-b"),
            "{fix}"
        );
        assert!(fix.contains("instance template"), "{fix}");
        assert!(disabled_what(&i).contains("node-1"));
    }
}
