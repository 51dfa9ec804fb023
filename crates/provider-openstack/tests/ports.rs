//! The forwarding prerequisite against a real neutron-server: the pod CIDR
//! as an allowed address pair on the port of each route's next hop. Every
//! test builds its own network, router and Node ports in its own project.

use std::collections::BTreeMap;
use std::time::Duration;

use provider_openstack::testing::{Admin, Proxy, TestRouter, neutron_server};
use provider_openstack::{OpenStackConfig, OpenStackRoutes, UpdateMode, ops};
use route_cloud::{Batch, CloudRoutes, ErrorKind};
use route_core::{NodeAddress, Route};
use serde_json::{Value, json};

const CLUSTER: &str = "test";

async fn setup(name: &str) -> (Admin, TestRouter, String) {
    let server = neutron_server().await.expect("neutron-server");
    let admin = Admin::new(&server.url);
    let router = admin
        .create_router(name, "10.0.0.0/16")
        .await
        .expect("router");
    (admin, router, server.url)
}

fn config(url: &str, router: &TestRouter, mode: UpdateMode) -> OpenStackConfig {
    let mut c = OpenStackConfig::noauth(url, &router.router_id);
    c.update_mode = mode;
    c
}

fn node_route(node: &str, ip: &str, cidr: &str) -> Route {
    let mut r =
        Route::from_text(node, cidr).with_addresses(vec![NodeAddress::internal_ip(ip)], false);
    r.node_provider_id = Some(format!("openstack:///srv-{node}").into());
    r
}

/// Requests by operation since `before`.
fn spent(
    p: &OpenStackRoutes,
    before: &BTreeMap<(&'static str, &'static str), u64>,
) -> BTreeMap<&'static str, u64> {
    let mut out = BTreeMap::new();
    for ((op, result), n) in p.stats().snapshot() {
        let d = n - before.get(&(op, result)).copied().unwrap_or(0);
        if d > 0 {
            *out.entry(op).or_default() += d;
        }
    }
    out
}

fn foreign_pair(i: usize) -> Value {
    json!({"ip_address": format!("192.168.{i}.0/24"), "mac_address": "fa:16:3e:00:99:99"})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_nodes_on_two_routers_get_their_pairs_and_ten_deleted_nodes_lose_only_theirs() {
    let (admin, router, url) = setup("pairs-fifty").await;
    admin
        .set_route_quota(&router.project_id, 200)
        .await
        .unwrap();
    let second = admin
        .create_sibling_router(&router, "pairs-fifty-b", "10.0.255.2")
        .await
        .unwrap();
    // Every fifth Node's port already carries another tool's pair.
    let specs: Vec<(String, String, Value)> = (0..50)
        .map(|i| {
            let pairs = if i % 5 == 0 {
                json!([foreign_pair(i)])
            } else {
                json!([])
            };
            (format!("srv-node-{i}"), format!("10.0.1.{}", i + 10), pairs)
        })
        .collect();
    let ports = admin.create_ports(&router, &specs).await.unwrap();
    assert_eq!(ports.len(), 50);
    let pair_ips = async |admin: &Admin| {
        let all = admin.pairs_on_network(&router).await.unwrap();
        ports
            .iter()
            .map(|id| {
                all.get(id)
                    .map(Vec::as_slice)
                    .unwrap_or(&[])
                    .iter()
                    .filter_map(|p| p["ip_address"].as_str().map(str::to_string))
                    .collect::<std::collections::BTreeSet<_>>()
                    .into_iter()
                    .collect::<Vec<_>>()
            })
            .collect::<Vec<_>>()
    };
    let mut c = config(&url, &router, UpdateMode::Auto);
    c.router_ids = vec![second.clone()];
    let p = OpenStackRoutes::new(c).unwrap();
    p.node_index().replace_all((0..50).map(|i| {
        (
            format!("node-{i}"),
            vec![NodeAddress::internal_ip(format!("10.0.1.{}", i + 10))],
        )
    }));
    p.list_routes(CLUSTER).await.unwrap();

    let create: Vec<(String, Route)> = [router.router_id.as_str(), second.as_str()]
        .iter()
        .flat_map(|target| {
            (0..50).map(move |i| {
                let r = node_route(
                    &format!("node-{i}"),
                    &format!("10.0.1.{}", i + 10),
                    &format!("10.244.{i}.0/24"),
                );
                (format!("uid-{i}"), r.in_table(*target))
            })
        })
        .collect();
    let before = p.stats().snapshot();
    let results = p
        .apply_batch(CLUSTER, &Batch::new(&[], &create))
        .await
        .unwrap();
    assert_eq!(results.len(), create.len());
    assert!(
        results.values().all(|r| matches!(r, Ok(Some(_)))),
        "{results:?}"
    );
    let cost = spent(&p, &before);
    assert_eq!(
        cost.get(ops::UPDATE_PORT),
        Some(&50),
        "one port write per Node, shared by both routers: {cost:?}"
    );
    assert_eq!(
        cost.get(ops::LIST_PORTS),
        Some(&1),
        "one port lookup for the batch: {cost:?}"
    );
    assert_eq!(cost.get(ops::ADD_EXTRAROUTES), Some(&2), "{cost:?}");
    for (i, pairs) in pair_ips(&admin).await.into_iter().enumerate() {
        // Sorted, as Neutron promises no order of pairs.
        let mut want = vec![format!("10.244.{i}.0/24")];
        if i % 5 == 0 {
            want.push(format!("192.168.{i}.0/24"));
        }
        assert_eq!(pairs, want, "port of node-{i}");
    }
    let foreign = admin.port(&ports[0]).await.unwrap();
    let kept = foreign["allowed_address_pairs"]
        .as_array()
        .and_then(|pairs| pairs.iter().find(|p| p["ip_address"] == "192.168.0.0/24"));
    assert_eq!(
        kept,
        Some(&foreign_pair(0)),
        "the foreign pair keeps its MAC: {foreign}"
    );

    // A list pass: one GET per router, one for their networks, one for the
    // Nodes' ports; every route is there.
    let before = p.stats().snapshot();
    let listed = p.list_routes(CLUSTER).await.unwrap();
    assert_eq!(listed.len(), 100, "{listed:?}");
    let cost = spent(&p, &before);
    assert_eq!(
        cost,
        BTreeMap::from([(ops::LIST, 2), (ops::ROUTER_PORTS, 1), (ops::LIST_PORTS, 1)]),
        "the cost of a list pass"
    );

    // Ten Nodes leave: their routes go from both routers, their pairs from
    // their ports; the foreign pairs and the other Nodes' pairs stay.
    let delete: Vec<Route> = listed
        .iter()
        .filter(|r| {
            r.node
                .strip_prefix("node-")
                .and_then(|n| n.parse::<usize>().ok())
                .is_some_and(|n| n < 10)
        })
        .cloned()
        .collect();
    assert_eq!(delete.len(), 20);
    let before = p.stats().snapshot();
    let results = p
        .apply_batch(CLUSTER, &Batch::new(&delete, &[]))
        .await
        .unwrap();
    assert_eq!(results.len(), delete.len());
    assert!(results.values().all(|r| r.is_ok()), "{results:?}");
    assert_eq!(spent(&p, &before).get(ops::UPDATE_PORT), Some(&10));
    for (i, pairs) in pair_ips(&admin).await.into_iter().enumerate() {
        let pod = format!("10.244.{i}.0/24");
        assert_eq!(pairs.contains(&pod), i >= 10, "node-{i}: {pairs:?}");
        assert_eq!(
            pairs.contains(&format!("192.168.{i}.0/24")),
            i % 5 == 0,
            "node-{i}: {pairs:?}"
        );
    }
    assert_eq!(p.list_routes(CLUSTER).await.unwrap().len(), 80);
}

#[tokio::test]
async fn a_pair_removed_behind_the_providers_back_lists_the_route_missing_until_a_recreation_adds_it()
 {
    // The whole-list path: the router write is a no-op for the route that
    // is still there, the port write brings the pair back.
    let (admin, router, url) = setup("pairs-repair").await;
    let port = admin
        .create_port(
            &router,
            "srv-n1",
            &["10.0.0.5"],
            true,
            json!([foreign_pair(1)]),
        )
        .await
        .unwrap();
    let p = OpenStackRoutes::new(config(&url, &router, UpdateMode::WholeList)).unwrap();
    p.node_index()
        .replace_all([("n1", vec![NodeAddress::internal_ip("10.0.0.5")])]);
    let route = node_route("n1", "10.0.0.5", "10.244.1.0/24");
    p.create_route(CLUSTER, "uid-1", &route).await.unwrap();
    assert_eq!(
        admin.pair_ips(&port).await.unwrap(),
        vec!["10.244.1.0/24", "192.168.1.0/24"]
    );
    assert_eq!(p.list_routes(CLUSTER).await.unwrap().len(), 1);

    // Someone drops our pair and keeps theirs.
    admin
        .set_pairs(&port, json!([foreign_pair(1)]))
        .await
        .unwrap();
    assert!(
        p.list_routes(CLUSTER).await.unwrap().is_empty(),
        "the route cannot carry pod traffic: listed as missing"
    );
    let (on_router, _) = admin.routes(&router.router_id).await.unwrap();
    assert_eq!(on_router.len(), 1, "the router still holds it");

    let created = p.create_route(CLUSTER, "uid-1", &route).await.unwrap();
    assert_eq!(created.node, "n1");
    assert_eq!(
        admin.pair_ips(&port).await.unwrap(),
        vec!["10.244.1.0/24", "192.168.1.0/24"]
    );
    let listed = p.list_routes(CLUSTER).await.unwrap();
    assert_eq!(listed, vec![created], "repaired in one pass");
    let (on_router, _) = admin.routes(&router.router_id).await.unwrap();
    assert_eq!(on_router.len(), 1, "no duplicate on the router");

    // The Node's port goes away before its route: the deletion still works.
    let (status, _) = admin
        .request(
            reqwest::Method::DELETE,
            &format!("/ports/{port}"),
            None,
            None,
        )
        .await
        .unwrap();
    assert_eq!(status, 204);
    p.delete_route(CLUSTER, &listed[0]).await.unwrap();
    assert!(admin.routes(&router.router_id).await.unwrap().0.is_empty());
}

#[tokio::test]
async fn a_port_with_port_security_off_gets_no_port_write_and_its_route_is_listed() {
    let (admin, router, url) = setup("pairs-off").await;
    let off = admin
        .create_port(&router, "srv-n1", &["10.0.0.5"], false, json!([]))
        .await
        .unwrap();
    let on = admin
        .create_port(&router, "srv-n2", &["10.0.0.6"], true, json!([]))
        .await
        .unwrap();
    let p = OpenStackRoutes::new(config(&url, &router, UpdateMode::Auto)).unwrap();
    p.node_index().replace_all([
        ("n1", vec![NodeAddress::internal_ip("10.0.0.5")]),
        ("n2", vec![NodeAddress::internal_ip("10.0.0.6")]),
        ("n3", vec![NodeAddress::internal_ip("10.0.0.7")]),
    ]);
    let off_rev = admin.port(&off).await.unwrap()["revision_number"].clone();

    p.create_route(
        CLUSTER,
        "u1",
        &node_route("n1", "10.0.0.5", "10.244.1.0/24"),
    )
    .await
    .unwrap();
    assert_eq!(
        p.stats().total(ops::UPDATE_PORT),
        0,
        "port security off: nothing to permit"
    );
    assert_eq!(
        admin.port(&off).await.unwrap()["revision_number"],
        off_rev,
        "the port is untouched"
    );
    // n3's address is on no port at all: nothing to permit either.
    p.create_route(
        CLUSTER,
        "u3",
        &node_route("n3", "10.0.0.7", "10.244.3.0/24"),
    )
    .await
    .unwrap();
    assert_eq!(p.stats().total(ops::UPDATE_PORT), 0);
    p.create_route(
        CLUSTER,
        "u2",
        &node_route("n2", "10.0.0.6", "10.244.2.0/24"),
    )
    .await
    .unwrap();
    assert_eq!(p.stats().total(ops::UPDATE_PORT), 1);
    assert_eq!(admin.pair_ips(&on).await.unwrap(), vec!["10.244.2.0/24"]);

    let listed = p.list_routes(CLUSTER).await.unwrap();
    assert_eq!(listed.len(), 3, "{listed:?}");
    for r in &listed {
        p.delete_route(CLUSTER, r).await.unwrap();
    }
    assert_eq!(
        p.stats().total(ops::UPDATE_PORT),
        2,
        "only the filtered port is written, once per change"
    );
    assert!(admin.pair_ips(&on).await.unwrap().is_empty());
}

#[tokio::test]
async fn a_port_update_between_read_and_write_gets_412_and_both_pairs_survive() {
    let server = neutron_server().await.expect("neutron-server");
    let (admin, router, _) = setup("pairs-412").await;
    let port = admin
        .create_port(&router, "srv-n1", &["10.0.0.5"], true, json!([]))
        .await
        .unwrap();
    let proxy = Proxy::start(&server.url).await.unwrap();
    let p = OpenStackRoutes::new(config(&proxy.url(), &router, UpdateMode::Auto)).unwrap();
    p.node_index()
        .replace_all([("n1", vec![NodeAddress::internal_ip("10.0.0.5")])]);
    p.list_routes(CLUSTER).await.unwrap();

    proxy.hold_next("PUT", "/v2.0/ports/");
    let route = node_route("n1", "10.0.0.5", "10.244.1.0/24");
    let create = p.create_route(CLUSTER, "u1", &route);
    let other_writer = async {
        // The provider has read the port and sent its write: change the
        // port under it, then let the stale write through.
        while proxy.held() == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        admin
            .set_pairs(&port, json!([foreign_pair(7)]))
            .await
            .unwrap();
        proxy.release();
    };
    let (created, ()) = tokio::join!(create, other_writer);
    created.unwrap();
    let s = p.stats().snapshot();
    assert_eq!(s.get(&(ops::UPDATE_PORT, "conflict")), Some(&1), "{s:?}");
    assert_eq!(s.get(&(ops::GET_PORT, "ok")), Some(&1), "{s:?}");
    assert_eq!(s.get(&(ops::UPDATE_PORT, "ok")), Some(&1), "{s:?}");
    assert_eq!(
        admin.pair_ips(&port).await.unwrap(),
        vec!["10.244.1.0/24", "192.168.7.0/24"],
        "the other writer's pair survived"
    );
}

#[tokio::test]
async fn a_port_full_of_pairs_fails_the_creation_as_target_unavailable_and_hides_the_route() {
    // Neutron allows 10 pairs per port (max_allowed_address_pair).
    let (admin, router, url) = setup("pairs-full").await;
    let full: Vec<Value> = (0..10).map(foreign_pair).collect();
    let port = admin
        .create_port(&router, "srv-n1", &["10.0.0.5"], true, json!(full))
        .await
        .unwrap();
    let p = OpenStackRoutes::new(config(&url, &router, UpdateMode::Auto)).unwrap();
    p.node_index()
        .replace_all([("n1", vec![NodeAddress::internal_ip("10.0.0.5")])]);
    let e = p
        .create_route(
            CLUSTER,
            "u1",
            &node_route("n1", "10.0.0.5", "10.244.1.0/24"),
        )
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::TargetUnavailable, "{e}");
    assert!(e.message.contains("AllowedAddressPairExhausted"), "{e}");
    assert!(e.message.contains("10.244.1.0/24 via 10.0.0.5"), "{e}");
    assert_eq!(admin.pair_ips(&port).await.unwrap().len(), 10, "untouched");
    assert!(
        p.list_routes(CLUSTER).await.unwrap().is_empty(),
        "a failed creation is not listed"
    );

    // An operator frees a slot: the next creation completes.
    admin.set_pairs(&port, json!(full[..9])).await.unwrap();
    p.create_route(
        CLUSTER,
        "u1",
        &node_route("n1", "10.0.0.5", "10.244.1.0/24"),
    )
    .await
    .unwrap();
    assert_eq!(p.list_routes(CLUSTER).await.unwrap().len(), 1);
}
