//! Several routers for one cluster (`router_ids`) against a real
//! neutron-server: a batch is split per router, each router keeps its own
//! revision for `If-Match`, and a 412 on one router re-reads only that one.

use provider_openstack::testing::{Admin, neutron_server};
use provider_openstack::{OpenStackConfig, OpenStackRoutes, UpdateMode, ops};
use route_cloud::{Batch, CloudRoutes, ErrorKind};
use route_core::{NodeAddress, Route, Text};

fn node_route(node: &str, ip: &str, cidr: &str, router: &str) -> Route {
    Route::from_text(node, cidr)
        .with_addresses(vec![NodeAddress::internal_ip(ip)], false)
        .in_table(router)
}

async fn routes_on(admin: &Admin, router: &str) -> Vec<(String, String)> {
    let mut r = admin.routes(router).await.expect("router").0;
    r.sort();
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revision_conflict_on_one_router_rereads_only_that_router() {
    let server = neutron_server().await.expect("neutron-server");
    let admin = Admin::new(&server.url);
    let a = admin
        .create_router("zone-a", "10.0.0.0/24")
        .await
        .expect("router");
    let b = admin
        .create_router("zone-b", "10.0.0.0/24")
        .await
        .expect("router");
    let mut c = OpenStackConfig::noauth(&server.url, &a.router_id);
    c.router_ids = vec![b.router_id.clone(), a.router_id.clone()];
    c.update_mode = UpdateMode::WholeList;
    c.node_subnets = vec![route_core::Cidr::parse("10.0.0.0/24").expect("cidr")];
    let p = OpenStackRoutes::new(c).expect("provider");
    p.node_index()
        .replace_all([("n1", vec![NodeAddress::internal_ip("10.0.0.5")])]);
    let ids: Vec<Text> = [&a.router_id, &b.router_id]
        .iter()
        .map(|s| s.as_str().into())
        .collect();
    assert_eq!(p.targets(), ids, "router_id first, each once");
    assert!(p.list_routes("c").await.expect("list").is_empty());
    let gets = p.stats().total(ops::GET_ROUTER);

    // One batch, two routers: one whole-list write each.
    let batch = Batch::new(
        &[],
        &[
            (
                "n1".into(),
                node_route("n1", "10.0.0.5", "10.244.1.0/24", &a.router_id),
            ),
            (
                "n1".into(),
                node_route("n1", "10.0.0.5", "10.244.1.0/24", &b.router_id),
            ),
        ],
    );
    let mut res = p.apply_batch("c", &batch).await.expect("batch");
    assert_eq!(res.len(), 2, "{res:?}");
    let created: Vec<Route> = batch
        .create
        .iter()
        .map(|(key, _, _)| {
            res.remove(key)
                .expect("answered")
                .expect("created")
                .expect("route")
        })
        .collect();
    assert_eq!(created[0].table, a.router_id.as_str());
    assert_eq!(created[1].table, b.router_id.as_str());
    assert_eq!(p.stats().total(ops::UPDATE_ROUTER), 2);
    assert_eq!(
        p.stats().total(ops::GET_ROUTER),
        gets,
        "the listed revisions held"
    );
    let want = vec![("10.244.1.0/24".to_string(), "10.0.0.5".to_string())];
    assert_eq!(routes_on(&admin, &a.router_id).await, want);
    assert_eq!(routes_on(&admin, &b.router_id).await, want);

    // Another writer moves router b's revision: only b is read again.
    admin
        .add_routes(&b.router_id, &[("192.168.9.0/24", "10.0.0.200")])
        .await
        .expect("foreign route");
    let batch = Batch::new(&created, &[]);
    let res = p.apply_batch("c", &batch).await.expect("batch");
    assert_eq!(res.len(), 2, "{res:?}");
    assert!(res.values().all(|r| r.is_ok()), "{res:?}");
    assert_eq!(
        p.stats().total(ops::GET_ROUTER),
        gets + 1,
        "one re-read, of the router whose revision moved"
    );
    assert!(routes_on(&admin, &a.router_id).await.is_empty());
    assert_eq!(
        routes_on(&admin, &b.router_id).await,
        vec![("192.168.9.0/24".to_string(), "10.0.0.200".to_string())],
        "the other writer's route survived the retry"
    );

    // A route naming a router that is not configured is refused, alone.
    let batch = Batch::new(
        &[],
        &[
            (
                "n1".into(),
                node_route("n1", "10.0.0.5", "10.244.2.0/24", "not-ours"),
            ),
            (
                "n1".into(),
                node_route("n1", "10.0.0.5", "10.244.2.0/24", &a.router_id),
            ),
        ],
    );
    let res = p.apply_batch("c", &batch).await.expect("batch");
    assert_eq!(res.len(), 2, "{res:?}");
    assert_eq!(
        res[&batch.create[0].0].as_ref().expect_err("refused").kind,
        ErrorKind::InvalidRequest
    );
    assert!(res[&batch.create[1].0].is_ok(), "{res:?}");
}
