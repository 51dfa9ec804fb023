//! The forwarding prerequisite on Azure: the Node's primary NIC's
//! `enableIPForwarding`.
//!
//! Azure delivers traffic a `VirtualAppliance` route sends to a Node only
//! when the NIC holding the next hop address allows IP forwarding; without
//! it the route is in the table and the pods behind the Node are cut off.
//! The check maps a Node to its VM through `spec.providerID`, the VM to its
//! primary NIC (`properties.networkProfile.networkInterfaces[]`, the entry
//! with `properties.primary: true`, or the only one), and reads the NIC:
//!
//! - one `GET` of the VM the first time, remembered for the life of the
//!   process (Azure does not let a running VM lose its primary NIC), read
//!   again only when its NIC turns out to be gone;
//! - one `GET` of the NIC the first time; when the controller asks afresh
//!   (at every drift check, and every few minutes for disabled Nodes) every
//!   NIC read before is read again by listing its resource group's NICs,
//!   one request per group and page rather than one per Node, so IP
//!   forwarding turned off behind the controller's back is found within a
//!   drift period and the condition clears soon after the operator's fix;
//! - nothing is ever changed: a NIC's settings belong to whoever built the
//!   Node (the cluster's IaC or the node pool), and this controller's
//!   identity needs no write access to NICs.
//!
//! ARM has no batch for reads, so the `GET`s go out a few at a time through
//! the provider's read budget. VMs of scale sets (`.../virtualMachineScaleSets/
//! <ss>/virtualMachines/<id>`) are not checked: their NICs are settings of
//! the scale set's model, read and fixed elsewhere.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use reqwest::Method;
use route_cloud::{CloudError, ErrorKind, Forwarding, ForwardingCheck};
use route_core::NodeView;
use serde_json::Value;
use tracing::debug;

use crate::AzureRoutes;

/// The Compute API version of the VM reads ("Virtual Machines - Get").
pub const COMPUTE_API_VERSION: &str = "2024-07-01";

/// The prefix of an Azure Node's `spec.providerID`.
pub const PROVIDER_ID_PREFIX: &str = "azure://";

/// How many reads are in flight at once.
const CONCURRENT_READS: usize = 8;

/// At most this many pages of one resource group's NICs per fresh check.
const MAX_NIC_PAGES: usize = 100;

/// A VM as its providerID names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmRef {
    /// The subscription.
    pub subscription: String,
    /// The resource group.
    pub resource_group: String,
    /// The VM's name.
    pub name: String,
}

impl VmRef {
    /// Parses `azure:///subscriptions/<s>/resourceGroups/<rg>/providers/
    /// Microsoft.Compute/virtualMachines/<name>` (segment names in any
    /// case, as ARM ids are). `None` for anything else, scale-set VMs
    /// included.
    pub fn from_provider_id(id: &str) -> Option<Self> {
        let rest = id.trim().strip_prefix(PROVIDER_ID_PREFIX)?;
        let parts: Vec<&str> = rest.trim_start_matches('/').split('/').collect();
        let eq = |a: &str, b: &str| a.eq_ignore_ascii_case(b);
        match parts.as_slice() {
            [subs, s, rgs, rg, providers, ns, vms, name]
                if eq(subs, "subscriptions")
                    && eq(rgs, "resourceGroups")
                    && eq(providers, "providers")
                    && eq(ns, "Microsoft.Compute")
                    && eq(vms, "virtualMachines")
                    && ![s, rg, name].iter().any(|p| p.is_empty()) =>
            {
                Some(Self {
                    subscription: (*s).to_string(),
                    resource_group: (*rg).to_string(),
                    name: (*name).to_string(),
                })
            }
            _ => None,
        }
    }

    /// The ARM path of the VM.
    pub fn path(&self) -> String {
        format!(
            "/subscriptions/{}/resourceGroups/{}/providers/Microsoft.Compute/virtualMachines/{}",
            self.subscription, self.resource_group, self.name
        )
    }

    /// The key the provider remembers it by (ARM ids are case-insensitive).
    fn key(&self) -> String {
        self.path().to_ascii_lowercase()
    }
}

/// A NIC by its ARM id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NicRef {
    /// `/subscriptions/<s>/resourceGroups/<rg>/providers/Microsoft.Network/networkInterfaces/<name>`.
    pub id: String,
    /// The resource group.
    pub resource_group: String,
    /// The NIC's name.
    pub name: String,
}

impl NicRef {
    /// Parses a NIC's ARM id, as a VM's `networkProfile` lists it.
    pub fn from_id(id: &str) -> Option<Self> {
        let parts: Vec<&str> = id.trim().trim_start_matches('/').split('/').collect();
        let eq = |a: &str, b: &str| a.eq_ignore_ascii_case(b);
        match parts.as_slice() {
            [subs, s, rgs, rg, providers, ns, nics, name]
                if eq(subs, "subscriptions")
                    && eq(rgs, "resourceGroups")
                    && eq(providers, "providers")
                    && eq(ns, "Microsoft.Network")
                    && eq(nics, "networkInterfaces")
                    && ![s, rg, name].iter().any(|p| p.is_empty()) =>
            {
                Some(Self {
                    id: format!("/{}", parts.join("/")),
                    resource_group: (*rg).to_string(),
                    name: (*name).to_string(),
                })
            }
            _ => None,
        }
    }

    fn key(&self) -> String {
        self.id.to_ascii_lowercase()
    }

    /// `/subscriptions/<s>/resourceGroups/<rg>`: where its group's NICs are listed.
    fn group_path(&self) -> Option<String> {
        let at = self.id.to_ascii_lowercase().find("/providers/")?;
        Some(self.id[..at].to_string())
    }
}

/// The primary NIC of a VM as "Virtual Machines - Get" answers it: the
/// `networkProfile.networkInterfaces` entry with `properties.primary: true`,
/// or the only entry (Azure leaves `primary` out when there is one NIC).
pub fn primary_nic(vm: &Value) -> Option<NicRef> {
    let nics = vm["properties"]["networkProfile"]["networkInterfaces"].as_array()?;
    let chosen = nics
        .iter()
        .find(|n| n["properties"]["primary"].as_bool() == Some(true))
        .or(match nics.as_slice() {
            [only] => Some(only),
            _ => None,
        })?;
    NicRef::from_id(chosen["id"].as_str()?)
}

/// What is off, for the Warning.
pub fn disabled_what(vm: &str, nic: &NicRef) -> String {
    format!(
        "NIC {} of VM {vm} has enableIPForwarding false: Azure drops the pod traffic routed to it",
        nic.name
    )
}

/// How the operator turns it on.
pub fn disabled_fix(nic: &NicRef) -> String {
    format!(
        "az network nic update --resource-group {} --name {} --ip-forwarding true",
        nic.resource_group, nic.name
    )
}

/// What the provider remembers between checks.
#[derive(Debug, Default)]
pub(crate) struct Memory {
    /// VM key to its primary NIC.
    nic_of_vm: HashMap<String, NicRef>,
    /// NIC key to `enableIPForwarding` as last read.
    forwarding: HashMap<String, bool>,
}

fn lock(m: &Mutex<Memory>) -> std::sync::MutexGuard<'_, Memory> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl AzureRoutes {
    /// One `GET` of an ARM resource; `None` when it does not exist.
    async fn read(&self, op: &'static str, path: &str) -> Result<Option<Value>, CloudError> {
        match self.http.call(op, Method::GET, path, None, None).await {
            Ok(a) => Ok(Some(a.body)),
            Err(e) if e.kind == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Reads `items` a few at a time with `read`, hands every answer to
    /// `take`, and answers the first failure after the reads that were
    /// sent (what was read is kept, so a retry does not pay for it again).
    async fn read_all<'a, T: 'a, F, Fut>(
        &self,
        items: &'a [T],
        read: F,
        mut take: impl FnMut(&'a T, Option<Value>),
    ) -> Result<(), CloudError>
    where
        F: Fn(&'a T) -> Fut,
        Fut: Future<Output = Result<Option<Value>, CloudError>>,
    {
        for chunk in items.chunks(CONCURRENT_READS) {
            let answers = futures::future::join_all(chunk.iter().map(&read)).await;
            let mut failure = None;
            for (item, answer) in chunk.iter().zip(answers) {
                match answer {
                    Ok(v) => take(item, v),
                    Err(e) => {
                        failure.get_or_insert(e);
                    }
                }
            }
            if let Some(e) = failure {
                return Err(e);
            }
        }
        Ok(())
    }

    /// Reads again every NIC of `of_node` read before, by listing the NICs
    /// of their resource groups: one request per group and page. A NIC the
    /// list no longer has is gone: its VM is read again next time.
    async fn reread_nics(&self, of_node: &[(&str, VmRef)]) -> Result<(), CloudError> {
        let known: Vec<NicRef> = {
            let m = lock(&self.forwarding);
            let mut seen = HashSet::new();
            of_node
                .iter()
                .filter_map(|(_, vm)| m.nic_of_vm.get(&vm.key()))
                .filter(|nic| m.forwarding.contains_key(&nic.key()) && seen.insert(nic.key()))
                .cloned()
                .collect()
        };
        let mut groups: Vec<String> = known.iter().filter_map(NicRef::group_path).collect();
        groups.sort();
        groups.dedup();
        for group in groups {
            let mut listed: HashMap<String, bool> = HashMap::new();
            let mut next = Some(format!(
                "{group}/providers/Microsoft.Network/networkInterfaces"
            ));
            let mut pages = 0;
            while let Some(path) = next.take() {
                pages += 1;
                let answer = self
                    .http
                    .call(crate::ops::LIST_NICS, Method::GET, &path, None, None)
                    .await?;
                for nic in answer.body["value"].as_array().into_iter().flatten() {
                    if let Some(r) = nic["id"].as_str().and_then(NicRef::from_id) {
                        // An absent field is ARM's way of writing false.
                        let on = nic["properties"]["enableIPForwarding"]
                            .as_bool()
                            .unwrap_or(false);
                        listed.insert(r.key(), on);
                    }
                }
                // ARM pages with an absolute `nextLink`; its path and query
                // go to the same endpoint.
                next = answer.body["nextLink"]
                    .as_str()
                    .and_then(|l| reqwest::Url::parse(l).ok())
                    .map(|u| match u.query() {
                        Some(q) => format!("{}?{q}", u.path()),
                        None => u.path().to_string(),
                    })
                    .filter(|_| pages < MAX_NIC_PAGES);
            }
            let mut m = lock(&self.forwarding);
            for nic in known
                .iter()
                .filter(|n| n.group_path().as_deref() == Some(group.as_str()))
            {
                match listed.get(&nic.key()) {
                    Some(on) => {
                        m.forwarding.insert(nic.key(), *on);
                    }
                    None => {
                        debug!(nic = %nic.id, "azure: the VM's primary NIC is gone; reading the VM again next time");
                        m.forwarding.remove(&nic.key());
                        m.nic_of_vm.retain(|_, n| n.key() != nic.key());
                    }
                }
            }
        }
        Ok(())
    }

    /// [`route_cloud::CloudRoutes::check_forwarding`] for Azure.
    pub(crate) async fn check_ip_forwarding(
        &self,
        nodes: &[Arc<NodeView>],
        check: ForwardingCheck,
    ) -> Result<Vec<(String, Forwarding)>, CloudError> {
        let of_node: Vec<(&str, VmRef)> = nodes
            .iter()
            .filter_map(|n| {
                let vm = n.provider_id.as_deref().and_then(VmRef::from_provider_id);
                if vm.is_none() {
                    debug!(node = %n.name, provider_id = ?n.provider_id, "azure: no standalone VM for the Node (no providerID yet, or a scale-set VM); its IP forwarding is not checked");
                }
                Some((n.name.as_str(), vm?))
            })
            .collect();

        // The VMs whose primary NIC is not known yet.
        let vms: Vec<VmRef> = {
            let m = lock(&self.forwarding);
            let mut seen = HashSet::new();
            of_node
                .iter()
                .map(|(_, vm)| vm)
                .filter(|vm| !m.nic_of_vm.contains_key(&vm.key()) && seen.insert(vm.key()))
                .cloned()
                .collect()
        };
        self.read_all(
            &vms,
            |vm| async move {
                let path = format!("{}?api-version={COMPUTE_API_VERSION}", vm.path());
                self.read(crate::ops::GET_VM, &path).await
            },
            |vm, answer| match answer.as_ref().map(primary_nic) {
                Some(Some(nic)) => {
                    lock(&self.forwarding).nic_of_vm.insert(vm.key(), nic);
                }
                Some(None) => {
                    debug!(vm = %vm.path(), "azure: the VM has no primary NIC; its IP forwarding is not checked");
                }
                None => {
                    debug!(vm = %vm.path(), "azure: the Node's VM does not exist; its IP forwarding is not checked");
                }
            },
        )
        .await?;

        if check.fresh {
            self.reread_nics(&of_node).await?;
        }
        // The NICs never read.
        let nics: Vec<NicRef> = {
            let m = lock(&self.forwarding);
            let mut seen = HashSet::new();
            of_node
                .iter()
                .filter_map(|(_, vm)| m.nic_of_vm.get(&vm.key()))
                .filter(|nic| !m.forwarding.contains_key(&nic.key()))
                .filter(|nic| seen.insert(nic.key()))
                .cloned()
                .collect()
        };
        self.read_all(
            &nics,
            |nic| self.read(crate::ops::GET_NIC, &nic.id),
            |nic, answer| {
                let mut m = lock(&self.forwarding);
                match answer {
                    Some(v) => {
                        // An absent field is ARM's way of writing false.
                        let on = v["properties"]["enableIPForwarding"]
                            .as_bool()
                            .unwrap_or(false);
                        m.forwarding.insert(nic.key(), on);
                    }
                    None => {
                        // Replaced: the VM is read again next time.
                        debug!(nic = %nic.id, "azure: the VM's primary NIC is gone; reading the VM again next time");
                        m.forwarding.remove(&nic.key());
                        m.nic_of_vm.retain(|_, n| n.key() != nic.key());
                    }
                }
            },
        )
        .await?;

        let m = lock(&self.forwarding);
        Ok(of_node
            .iter()
            .filter_map(|(node, vm)| {
                let nic = m.nic_of_vm.get(&vm.key())?;
                let answer = if *m.forwarding.get(&nic.key())? {
                    Forwarding::Ready
                } else {
                    Forwarding::Disabled {
                        what: disabled_what(&vm.name, nic),
                        fix: disabled_fix(nic),
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
    use serde_json::json;

    #[test]
    fn provider_ids_name_standalone_vms_only() {
        let vm = VmRef::from_provider_id(
            "azure:///subscriptions/s-1/resourceGroups/MC_rg/providers/Microsoft.Compute/virtualMachines/node-1",
        )
        .expect("a VM providerID");
        assert_eq!(
            (
                vm.subscription.as_str(),
                vm.resource_group.as_str(),
                vm.name.as_str()
            ),
            ("s-1", "MC_rg", "node-1")
        );
        assert_eq!(
            VmRef::from_provider_id(
                "azure:///subscriptions/s/resourcegroups/rg/providers/microsoft.compute/virtualmachines/n"
            )
            .map(|v| v.name),
            Some("n".to_string())
        );
        for other in [
            "azure:///subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachineScaleSets/ss/virtualMachines/0",
            "gce://p/z/n",
            "azure:///subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/",
        ] {
            assert_eq!(VmRef::from_provider_id(other), None, "{other}");
        }
    }

    #[test]
    fn the_primary_nic_is_the_one_marked_primary_or_the_only_one() {
        let nic = |name: &str| {
            format!(
                "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Network/networkInterfaces/{name}"
            )
        };
        let vm = |entries: Value| json!({"properties": {"networkProfile": {"networkInterfaces": entries}}});
        let two = vm(json!([
            {"id": nic("a"), "properties": {"primary": false}},
            {"id": nic("b"), "properties": {"primary": true}},
        ]));
        assert_eq!(primary_nic(&two).map(|n| n.name), Some("b".to_string()));
        let only = vm(json!([{"id": nic("a")}]));
        assert_eq!(
            primary_nic(&only).map(|n| n.resource_group),
            Some("rg".to_string())
        );
        let unmarked = vm(json!([{"id": nic("a")}, {"id": nic("b")}]));
        assert_eq!(primary_nic(&unmarked), None, "two NICs and neither primary");
        assert_eq!(primary_nic(&json!({"properties": {}})), None);
    }

    #[test]
    fn the_fix_is_the_az_command_with_the_nics_names() {
        let nic = NicRef::from_id(
            "/subscriptions/s/resourceGroups/node-rg/providers/Microsoft.Network/networkInterfaces/node-1-nic",
        )
        .expect("a NIC id");
        assert_eq!(
            disabled_fix(&nic),
            "az network nic update --resource-group node-rg --name node-1-nic --ip-forwarding true"
        );
        assert!(disabled_what("node-1", &nic).contains("NIC node-1-nic of VM node-1"));
    }
}
