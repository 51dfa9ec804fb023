//! The forwarding prerequisite on the Nodes' Neutron ports.
//!
//! Neutron port security drops every packet whose source address is neither
//! a fixed IP of its port nor in the port's `allowed_address_pairs`. A pod's
//! packet leaves its Node with the pod's address, so a router route to a pod
//! CIDR only carries traffic once the CIDR is an allowed address pair on the
//! port that holds the route's next hop. This module owns that step:
//!
//! * finding a next hop's port: the port on one of the router's networks
//!   (its interface ports' networks) whose fixed IP is the next hop, with the
//!   Node's server id (`openstack:///<id>`) as tie-break;
//! * the whole-list `PUT /v2.0/ports/{id}` of `allowed_address_pairs` under
//!   `If-Match: revision_number=N`, re-read and retried on 412, that adds or
//!   removes exactly this cluster's pairs and resends every other pair as read;
//! * for `list_routes`, which routes of current Nodes lack their pair.
//!
//! A pair is this cluster's when its `ip_address` is the route's destination
//! and its `mac_address` is the port's own (or absent): the pair Neutron
//! makes of `{"ip_address": cidr}`. A pair with another MAC permits another
//! device and is left alone.
//!
//! Skipped, as upstream does: everything when Neutron lacks the
//! `allowed-address-pairs` extension; a port whose `port_security_enabled`
//! is false. Unlike upstream, a next hop that no port carries is not an
//! error: no port means no port-security filter this controller could open,
//! and the route is created and listed as usual.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::IpAddr;

use reqwest::Method;
use route_cloud::{CloudError, ErrorKind};
use route_core::{Cidr, OpKey};
use serde_json::{Value, json};

use crate::{OpenStackRoutes, RawRoute, RouterState, ops, query_escape};

/// The extension whose absence skips the port step.
pub(crate) const ALLOWED_ADDRESS_PAIRS: &str = "allowed-address-pairs";

/// Next hops per port list request: keeps the query string far below the
/// URL lengths proxies in front of Neutron accept (about 40 bytes each).
const HOPS_PER_LIST: usize = 100;

/// The port fields the step reads.
const PORT_FIELDS: &str = "fields=id&fields=network_id&fields=device_id&fields=mac_address\
     &fields=fixed_ips&fields=allowed_address_pairs&fields=port_security_enabled&fields=revision_number";

/// A Neutron port as the port step needs it.
#[derive(Debug, Clone)]
pub(crate) struct NodePort {
    pub(crate) id: String,
    network_id: String,
    device_id: String,
    mac: String,
    revision: Option<u64>,
    fixed_ips: Vec<IpAddr>,
    /// `port_security_enabled`; absent (no `port-security` extension) means
    /// the port is filtered as usual.
    security: bool,
    /// `allowed_address_pairs` exactly as read, resent as read.
    pairs: Vec<Value>,
}

impl NodePort {
    /// A port object of an answer; `None` without an id.
    pub(crate) fn from_json(p: &Value) -> Option<Self> {
        let id = p["id"].as_str()?.to_string();
        let fixed_ips = p["fixed_ips"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or(&[])
            .iter()
            .filter_map(|f| f["ip_address"].as_str()?.trim().parse().ok())
            .collect();
        Some(Self {
            id,
            network_id: p["network_id"].as_str().unwrap_or_default().to_string(),
            device_id: p["device_id"].as_str().unwrap_or_default().to_string(),
            mac: p["mac_address"].as_str().unwrap_or_default().to_string(),
            revision: p["revision_number"].as_u64(),
            fixed_ips,
            security: p["port_security_enabled"].as_bool().unwrap_or(true),
            pairs: p["allowed_address_pairs"]
                .as_array()
                .cloned()
                .unwrap_or_default(),
        })
    }

    /// Whether `pair` is the pair this cluster writes for `cidr`.
    fn is_our_pair(&self, pair: &Value, cidr: &Cidr) -> bool {
        let Some(ip) = pair["ip_address"].as_str() else {
            return false;
        };
        let same_prefix = Cidr::parse(ip).is_ok_and(|c| c == *cidr);
        let same_mac = match pair["mac_address"].as_str() {
            None | Some("") => true,
            Some(m) => self.mac.is_empty() || m.eq_ignore_ascii_case(&self.mac),
        };
        same_prefix && same_mac
    }

    /// Whether the port permits `cidr` as a source through this cluster's pair.
    pub(crate) fn has_pair(&self, cidr: &Cidr) -> bool {
        self.pairs.iter().any(|p| self.is_our_pair(p, cidr))
    }

    /// Whether port security filters this port at all.
    pub(crate) fn filtered(&self) -> bool {
        self.security
    }

    /// The pair list with every `add` present and every `remove` gone, or
    /// `None` when the port already is so. Other pairs keep their order and
    /// their exact JSON.
    fn pairs_after(&self, add: &[Cidr], remove: &[Cidr]) -> Option<Vec<Value>> {
        // A pair both added and removed in one batch (a route moved between
        // routers) is still needed.
        let mut out: Vec<Value> = self
            .pairs
            .iter()
            .filter(|p| {
                !remove
                    .iter()
                    .any(|c| !add.contains(c) && self.is_our_pair(p, c))
            })
            .cloned()
            .collect();
        let mut changed = out.len() != self.pairs.len();
        for c in add {
            if !out.iter().any(|p| self.is_our_pair(p, c)) {
                out.push(json!({ "ip_address": c.to_string() }));
                changed = true;
            }
        }
        changed.then_some(out)
    }
}

/// The port of `hop` on one of `networks`; among several, the one of the
/// Node's server.
pub(crate) fn port_for<'a>(
    ports: &'a [NodePort],
    networks: &[String],
    hop: IpAddr,
    server: Option<&str>,
) -> Option<&'a NodePort> {
    let mut found = ports
        .iter()
        .filter(|p| networks.contains(&p.network_id) && p.fixed_ips.contains(&hop));
    let first = found.next()?;
    let Some(server) = server else {
        return Some(first);
    };
    if first.device_id == server {
        return Some(first);
    }
    Some(found.find(|p| p.device_id == server).unwrap_or(first))
}

/// The server id of a Node's `providerID` (`openstack:///<id>` or
/// `openstack://<region>/<id>`).
pub(crate) fn server_id(provider_id: &str) -> Option<&str> {
    let rest = provider_id.strip_prefix("openstack://")?;
    let id = rest.rsplit('/').next()?;
    (!id.is_empty()).then_some(id)
}

/// One route's share of the port step.
#[derive(Debug, Clone)]
pub(crate) struct PairChange {
    /// The key of the creation or deletion in the batch.
    pub(crate) key: OpKey,
    pub(crate) router: String,
    pub(crate) cidr: Cidr,
    pub(crate) hop: IpAddr,
    pub(crate) server: Option<String>,
    /// Add the pair (a creation) or remove it (a deletion).
    pub(crate) add: bool,
}

impl OpenStackRoutes {
    /// The extension aliases Neutron lists, read once per process.
    pub(crate) async fn extensions(&self) -> Result<&HashSet<String>, CloudError> {
        self.extensions
            .get_or_try_init(|| async {
                let a = self
                    .http
                    .call(ops::EXTENSIONS, Method::GET, "/extensions", None, None)
                    .await?;
                let aliases: HashSet<String> = a.body["extensions"]
                    .as_array()
                    .map(Vec::as_slice)
                    .unwrap_or(&[])
                    .iter()
                    .filter_map(|e| e["alias"].as_str().map(str::to_string))
                    .collect();
                if !aliases.contains(ALLOWED_ADDRESS_PAIRS) {
                    tracing::info!(
                        "Neutron has no allowed-address-pairs extension; pod CIDRs are not added to Node ports"
                    );
                }
                Ok(aliases)
            })
            .await
    }

    /// Whether the port step applies at all.
    pub(crate) async fn pairs_enabled(&self) -> Result<bool, CloudError> {
        Ok(self.extensions().await?.contains(ALLOWED_ADDRESS_PAIRS))
    }

    /// The networks of each router's interfaces, in one request for all
    /// routers. Remembered for the writes until the next list refreshes it.
    pub(crate) async fn fetch_router_networks(
        &self,
        ids: &[String],
    ) -> Result<HashMap<String, Vec<String>>, CloudError> {
        let mut path =
            String::from("/ports?fields=device_id&fields=network_id&fields=device_owner");
        for id in ids {
            path.push_str(&format!("&device_id={}", query_escape(id)));
        }
        let a = self
            .http
            .call(ops::ROUTER_PORTS, Method::GET, &path, None, None)
            .await?;
        let mut nets: HashMap<String, Vec<String>> =
            ids.iter().map(|id| (id.clone(), Vec::new())).collect();
        for p in a.body["ports"].as_array().map(Vec::as_slice).unwrap_or(&[]) {
            // The gateway port is on the external network, where no Node is.
            if p["device_owner"].as_str() == Some("network:router_gateway") {
                continue;
            }
            if let (Some(r), Some(n)) = (p["device_id"].as_str(), p["network_id"].as_str())
                && let Some(list) = nets.get_mut(r)
                && !list.iter().any(|x| x == n)
            {
                list.push(n.to_string());
            }
        }
        let mut known = self
            .router_networks
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        for (r, n) in &nets {
            known.insert(r.clone(), n.clone());
        }
        Ok(nets)
    }

    /// The routers' networks as last read, reading the unknown ones.
    async fn router_networks(
        &self,
        ids: &[String],
    ) -> Result<HashMap<String, Vec<String>>, CloudError> {
        let (mut have, missing) = {
            let known = self
                .router_networks
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let mut have = HashMap::new();
            let mut missing = Vec::new();
            for id in ids {
                match known.get(id) {
                    Some(n) => {
                        have.insert(id.clone(), n.clone());
                    }
                    None => missing.push(id.clone()),
                }
            }
            (have, missing)
        };
        if !missing.is_empty() {
            have.extend(self.fetch_router_networks(&missing).await?);
        }
        Ok(have)
    }

    /// The ports on `networks` that carry one of `hops`: one request per
    /// [`HOPS_PER_LIST`] next hops.
    pub(crate) async fn find_ports(
        &self,
        networks: &[String],
        hops: &[IpAddr],
    ) -> Result<Vec<NodePort>, CloudError> {
        let mut ports = Vec::new();
        if networks.is_empty() {
            return Ok(ports);
        }
        let mut seen = HashSet::new();
        for chunk in hops.chunks(HOPS_PER_LIST) {
            let mut path = format!("/ports?{PORT_FIELDS}");
            for n in networks {
                path.push_str(&format!("&network_id={}", query_escape(n)));
            }
            for h in chunk {
                path.push_str(&format!(
                    "&fixed_ips={}",
                    query_escape(&format!("ip_address={h}"))
                ));
            }
            let a = self
                .http
                .call(ops::LIST_PORTS, Method::GET, &path, None, None)
                .await?;
            for p in a.body["ports"].as_array().map(Vec::as_slice).unwrap_or(&[]) {
                if let Some(port) = NodePort::from_json(p)
                    && seen.insert(port.id.clone())
                {
                    ports.push(port);
                }
            }
        }
        Ok(ports)
    }

    /// The routes to leave out of a list: a current Node's route whose port
    /// filters traffic and lacks the route's pair. The next pass re-creates
    /// them, which adds the pair. Costs nothing when no listed route is a
    /// current Node's; else one request for the routers' networks and one
    /// per [`HOPS_PER_LIST`] next hops.
    pub(crate) async fn routes_lacking_pairs(
        &self,
        states: &[(&String, RouterState)],
    ) -> Result<HashSet<(String, RawRoute)>, CloudError> {
        let mut lacking = HashSet::new();
        let candidates: Vec<(&String, &RawRoute, Cidr, IpAddr)> = states
            .iter()
            .flat_map(|(id, s)| s.routes.iter().map(move |r| (*id, r)))
            .filter_map(|(id, r)| {
                let cidr = Cidr::parse(&r.destination).ok()?;
                let hop: IpAddr = r.nexthop.trim().parse().ok()?;
                // Only a current Node's route: a deleted Node's route is
                // on its way out, and nothing checks a blackhole's port.
                self.index.node_for(hop)?;
                Some((id, r, cidr, hop))
            })
            .collect();
        if candidates.is_empty() || !self.pairs_enabled().await? {
            return Ok(lacking);
        }
        let ids: Vec<String> = states.iter().map(|(id, _)| (*id).clone()).collect();
        let nets = self.fetch_router_networks(&ids).await?;
        let mut all_nets: Vec<String> = nets.values().flatten().cloned().collect();
        all_nets.sort();
        all_nets.dedup();
        let mut hops: Vec<IpAddr> = candidates.iter().map(|c| c.3).collect();
        hops.sort();
        hops.dedup();
        let ports = self.find_ports(&all_nets, &hops).await?;
        for (id, raw, cidr, hop) in candidates {
            let networks = nets.get(id).map(Vec::as_slice).unwrap_or(&[]);
            if let Some(port) = port_for(&ports, networks, hop, None)
                && port.filtered()
                && !port.has_pair(&cidr)
            {
                tracing::debug!(
                    router = id.as_str(),
                    destination = raw.destination.as_str(),
                    nexthop = raw.nexthop.as_str(),
                    port = port.id.as_str(),
                    "the next hop's port lacks the allowed address pair; listing the route as missing"
                );
                lacking.insert((id.clone(), raw.clone()));
            }
        }
        Ok(lacking)
    }

    /// Adds and removes the pairs of a batch's routes that reached their
    /// routers. Returns the failures by the change's key; a deletion whose
    /// port is gone is no failure.
    pub(crate) async fn apply_pairs(&self, changes: &[PairChange]) -> Vec<(OpKey, CloudError)> {
        let fail_all = |e: &CloudError| {
            changes
                .iter()
                .map(|c| (c.key.clone(), port_step_error(c, e)))
                .collect::<Vec<_>>()
        };
        if changes.is_empty() {
            return Vec::new();
        }
        match self.pairs_enabled().await {
            Ok(true) => {}
            Ok(false) => return Vec::new(),
            Err(e) => return fail_all(&e),
        }
        let mut routers: Vec<String> = changes.iter().map(|c| c.router.clone()).collect();
        routers.sort();
        routers.dedup();
        let nets = match self.router_networks(&routers).await {
            Ok(n) => n,
            Err(e) => return fail_all(&e),
        };
        let mut all_nets: Vec<String> = nets.values().flatten().cloned().collect();
        all_nets.sort();
        all_nets.dedup();
        let mut hops: Vec<IpAddr> = changes.iter().map(|c| c.hop).collect();
        hops.sort();
        hops.dedup();
        let ports = match self.find_ports(&all_nets, &hops).await {
            Ok(p) => p,
            Err(e) => return fail_all(&e),
        };
        // Per port, in a stable order: the changes that concern it.
        let mut by_port: BTreeMap<String, (NodePort, Vec<&PairChange>)> = BTreeMap::new();
        for c in changes {
            let networks = nets.get(&c.router).map(Vec::as_slice).unwrap_or(&[]);
            match port_for(&ports, networks, c.hop, c.server.as_deref()) {
                Some(port) if port.filtered() => {
                    by_port
                        .entry(port.id.clone())
                        .or_insert_with(|| (port.clone(), Vec::new()))
                        .1
                        .push(c);
                }
                Some(port) => tracing::debug!(
                    port = port.id.as_str(),
                    nexthop = %c.hop,
                    "port security is off on the next hop's port; no allowed address pair needed"
                ),
                None => tracing::debug!(
                    nexthop = %c.hop,
                    router = c.router.as_str(),
                    "no port on the router's networks carries the next hop; no allowed address pair to set"
                ),
            }
        }
        let mut failed = Vec::new();
        for (_, (port, mine)) in by_port {
            if let Err(e) = self.update_pairs(port, &mine).await {
                failed.extend(mine.iter().map(|c| (c.key.clone(), port_step_error(c, &e))));
            }
        }
        failed
    }

    /// One port's whole-list pair update under `If-Match`, re-read and
    /// retried on a revision conflict.
    async fn update_pairs(&self, port: NodePort, mine: &[&PairChange]) -> Result<(), CloudError> {
        let add: Vec<Cidr> = mine.iter().filter(|c| c.add).map(|c| c.cidr).collect();
        let remove: Vec<Cidr> = mine.iter().filter(|c| !c.add).map(|c| c.cidr).collect();
        let id = port.id.clone();
        let path = format!("/ports/{id}");
        let path = path.as_str();
        let (add, remove) = (add.as_slice(), remove.as_slice());
        let revision = port.revision;
        // `None`: the port is gone (only when nothing is to be added, else
        // its absence is an error).
        let known = Some((Some(port), revision));
        route_cloud::write_conditionally(
            self.config.max_conflict_retries,
            known,
            || async move {
                let fresh = self
                    .http
                    .call(
                        ops::GET_PORT,
                        Method::GET,
                        &format!("{path}?{PORT_FIELDS}"),
                        None,
                        None,
                    )
                    .await;
                match fresh {
                    Ok(a) => {
                        let port = NodePort::from_json(&a.body["port"]).ok_or_else(|| {
                            CloudError::new(ErrorKind::Transient, "the answer has no port object")
                        })?;
                        let revision = port.revision;
                        Ok((Some(port), revision))
                    }
                    // A port that is gone holds no pair to remove.
                    Err(e) if e.kind == ErrorKind::NotFound && add.is_empty() => Ok((None, None)),
                    Err(e) => Err(e),
                }
            },
            |port: &Option<NodePort>| {
                // Port security turned off since: no pair needed.
                Ok(port
                    .as_ref()
                    .filter(|p| p.filtered())
                    .and_then(|p| p.pairs_after(add, remove)))
            },
            |pairs, revision| async move {
                let body = json!({ "port": { "allowed_address_pairs": pairs } });
                let r = self
                    .http
                    .call(ops::UPDATE_PORT, Method::PUT, path, Some(&body), revision)
                    .await;
                match r {
                    Ok(_) => Ok(()),
                    // A port that is gone holds no pair to remove.
                    Err(e) if e.kind == ErrorKind::NotFound && add.is_empty() => Ok(()),
                    // A 412 (another writer changed the port since it was
                    // read) goes back to the loop: that writer's pairs must
                    // survive, so the port is read again.
                    Err(e) => Err(e),
                }
            },
            |attempt| {
                tracing::debug!(
                    port = id.as_str(),
                    attempt,
                    "port revision conflict; reading the port again"
                );
            },
        )
        .await
        .map(|_| ())
    }
}

/// The error of one route's failed port step, keeping the class.
fn port_step_error(c: &PairChange, e: &CloudError) -> CloudError {
    let what = if c.add {
        "is on router {router}, but adding it as an allowed address pair"
    } else {
        "is off router {router}, but removing its allowed address pair"
    };
    CloudError {
        message: format!(
            "route {} via {} {} to the next hop's port failed: {}",
            c.cidr,
            c.hop,
            what.replace("{router}", &c.router),
            e.message
        ),
        ..e.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port(pairs: Value, security: Option<bool>) -> NodePort {
        let mut p = json!({
            "id": "p1", "network_id": "n1", "device_id": "srv-1",
            "mac_address": "fa:16:3e:00:00:01", "revision_number": 4,
            "fixed_ips": [{"subnet_id": "s", "ip_address": "10.0.0.5"}],
            "allowed_address_pairs": pairs,
        });
        if let Some(s) = security {
            p["port_security_enabled"] = json!(s);
        }
        NodePort::from_json(&p).unwrap()
    }

    fn cidr(s: &str) -> Cidr {
        Cidr::parse(s).unwrap()
    }

    #[test]
    fn a_pair_is_ours_only_with_the_ports_own_mac() {
        let p = port(
            json!([
                {"ip_address": "10.244.1.0/24", "mac_address": "FA:16:3E:00:00:01"},
                {"ip_address": "10.244.2.0/24", "mac_address": "fa:16:3e:99:99:99"},
                {"ip_address": "192.168.0.10"}
            ]),
            None,
        );
        assert!(p.filtered(), "no port-security field means filtered");
        assert_eq!(p.revision, Some(4));
        assert!(p.has_pair(&cidr("10.244.1.0/24")));
        assert!(
            !p.has_pair(&cidr("10.244.2.0/24")),
            "another device's pair permits nothing for this port"
        );
        assert!(!p.has_pair(&cidr("10.244.3.0/24")));
        assert!(!port(json!([]), Some(false)).filtered());
    }

    #[test]
    fn pair_updates_keep_foreign_pairs_verbatim_and_change_only_ours() {
        let foreign = json!({"ip_address": "192.168.0.10", "mac_address": "fa:16:3e:99:99:99"});
        let p = port(
            json!([foreign, {"ip_address": "10.244.1.0/24", "mac_address": "fa:16:3e:00:00:01"}]),
            Some(true),
        );
        assert!(
            p.pairs_after(&[cidr("10.244.1.0/24")], &[]).is_none(),
            "present already: no write"
        );
        assert!(p.pairs_after(&[], &[cidr("10.244.9.0/24")]).is_none());
        let added = p.pairs_after(&[cidr("10.244.2.0/24")], &[]).unwrap();
        assert_eq!(
            added,
            vec![
                foreign.clone(),
                json!({"ip_address": "10.244.1.0/24", "mac_address": "fa:16:3e:00:00:01"}),
                json!({"ip_address": "10.244.2.0/24"})
            ]
        );
        let removed = p.pairs_after(&[], &[cidr("10.244.1.0/24")]).unwrap();
        assert_eq!(removed, vec![foreign]);
    }

    #[test]
    fn ports_are_found_on_the_routers_networks_and_by_server() {
        let mk = |id: &str, net: &str, dev: &str| {
            NodePort::from_json(&json!({
                "id": id, "network_id": net, "device_id": dev,
                "fixed_ips": [{"ip_address": "10.0.0.5"}],
            }))
            .unwrap()
        };
        let ports = vec![
            mk("a", "other", "x"),
            mk("b", "n1", "x"),
            mk("c", "n1", "srv"),
        ];
        let hop: IpAddr = "10.0.0.5".parse().unwrap();
        let nets = vec!["n1".to_string()];
        assert_eq!(port_for(&ports, &nets, hop, None).unwrap().id, "b");
        assert_eq!(port_for(&ports, &nets, hop, Some("srv")).unwrap().id, "c");
        assert_eq!(port_for(&ports, &nets, hop, Some("nope")).unwrap().id, "b");
        assert!(port_for(&ports, &[], hop, None).is_none());
        assert!(port_for(&ports, &nets, "10.0.0.6".parse().unwrap(), None).is_none());
        assert_eq!(server_id("openstack:///abc-1"), Some("abc-1"));
        assert_eq!(server_id("openstack://RegionOne/abc-1"), Some("abc-1"));
        assert_eq!(server_id("aws:///us-east-1a/i-1"), None);
        assert_eq!(server_id("openstack:///"), None);
    }
}
