//! The OpenStack provider against a real neutron-server (SQLite, noauth),
//! started by `scripts/neutron.sh` unless `CRC_NEUTRON_URL` names one.
//! Every test builds its own network, subnet and router in its own project.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use provider_kit::Secret;
use provider_openstack::testing::{Admin, TestRouter, insert_raw_route, neutron_server};
use provider_openstack::{AuthType, OpenStackConfig, OpenStackRoutes, UpdateMode, ops};
use route_cloud::{Batch, CloudRoutes, ErrorKind};
use route_core::{Destination, NodeAddress, Route};
use serde_json::{Value, json};
use test_server::{Listener, TestServer};

/// The tests of this file run one at a time: one writes the server's SQLite
/// file directly (routes the API refuses), and a direct write that commits
/// while Neutron's own transaction upgrades its read lock makes SQLite
/// refuse Neutron at once ("database is locked", a 500), whatever the busy
/// timeout. Seen once in CI on a loaded machine.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

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
    Route::from_text(node, cidr).with_addresses(vec![NodeAddress::internal_ip(ip)], false)
}

fn writes(p: &OpenStackRoutes) -> BTreeMap<(&'static str, &'static str), u64> {
    p.stats()
        .snapshot()
        .into_iter()
        .filter(|((op, _), _)| ops::WRITES.contains(op))
        .collect()
}

fn pair(d: &str, n: &str) -> (String, String) {
    (d.to_string(), n.to_string())
}

#[tokio::test]
async fn lists_creates_and_deletes_routes_and_leaves_foreign_ones_alone() {
    let _one = ONE_AT_A_TIME.lock().await;
    let (admin, router, url) = setup("crud").await;
    let mut c = config(&url, &router, UpdateMode::Auto);
    c.node_subnets = vec![route_core::Cidr::parse("10.0.0.0/24").unwrap()];
    let p = OpenStackRoutes::new(c).unwrap();
    let idx = p.node_index();
    idx.replace_all([
        ("n1", vec![NodeAddress::internal_ip("10.0.0.5")]),
        ("n2", vec![NodeAddress::internal_ip("10.0.0.6")]),
    ]);

    assert!(p.list_routes(CLUSTER).await.unwrap().is_empty());
    assert!(
        p.uses_atomic_updates().await.unwrap(),
        "Neutron 29 has extraroute-atomic"
    );

    // An operator's route via an address on the router's subnet but outside
    // the node subnets.
    let (status, _) = admin
        .request(
            reqwest::Method::PUT,
            &format!("/routers/{}/add_extraroutes", router.router_id),
            Some(json!({"router": {"routes": [{"destination": "192.168.50.0/24", "nexthop": "10.0.200.9"}]}})),
            None,
        )
        .await
        .unwrap();
    assert_eq!(status, 200);

    let before = p.stats().snapshot();
    let created = p
        .create_route(
            CLUSTER,
            "uid-1",
            &node_route("n1", "10.0.0.5", "10.244.1.0/24"),
        )
        .await
        .unwrap();
    assert_eq!(created.node, "n1");
    assert_eq!(created.next_hop, "10.0.0.5");
    assert_eq!(created.destination.to_string(), "10.244.1.0/24");
    assert!(created.enable_node_addresses);
    assert_eq!(
        p.stats().total(ops::ADD_EXTRAROUTES),
        before
            .get(&(ops::ADD_EXTRAROUTES, "ok"))
            .copied()
            .unwrap_or(0)
            + 1
    );
    p.create_route(
        CLUSTER,
        "uid-2",
        &node_route("n2", "10.0.0.6", "10.244.2.0/24"),
    )
    .await
    .unwrap();

    let (on_router, _) = admin.routes(&router.router_id).await.unwrap();
    assert!(on_router.contains(&pair("10.244.1.0/24", "10.0.0.5")));
    assert!(on_router.contains(&pair("192.168.50.0/24", "10.0.200.9")));

    let lists_before = p.stats().total(ops::LIST);
    let listed = p.list_routes(CLUSTER).await.unwrap();
    assert_eq!(
        p.stats().total(ops::LIST),
        lists_before + 1,
        "a list is one GET"
    );
    // The operator's route is listed as someone else's, so the controller
    // never deletes it and creates nothing over it.
    let (ours, theirs): (Vec<&Route>, Vec<&Route>) =
        listed.iter().partition(|r| r.foreign.is_none());
    assert_eq!(ours.len(), 2, "{listed:?}");
    assert_eq!(theirs.len(), 1, "{listed:?}");
    assert_eq!(theirs[0].destination.to_string(), "192.168.50.0/24");
    assert!(
        listed.contains(&created),
        "list shows the route as create returned it"
    );

    // n2 leaves the cluster: its route stays attributed (the provider created
    // it), so the controller can delete it.
    idx.remove("n2");
    let listed = p.list_routes(CLUSTER).await.unwrap();
    let orphan = listed
        .iter()
        .find(|r| r.next_hop == "10.0.0.6")
        .expect("route of the removed node still listed");
    assert_eq!(orphan.node, "n2");

    // A stale route in the node subnet that no one created here is a blackhole.
    admin
        .request(
            reqwest::Method::PUT,
            &format!("/routers/{}/add_extraroutes", router.router_id),
            Some(json!({"router": {"routes": [{"destination": "10.244.9.0/24", "nexthop": "10.0.0.77"}]}})),
            None,
        )
        .await
        .unwrap();
    let listed = p.list_routes(CLUSTER).await.unwrap();
    let stale = listed.iter().find(|r| r.next_hop == "10.0.0.77").unwrap();
    assert!(stale.blackhole && stale.node.is_empty());

    let removes_before = p.stats().total(ops::REMOVE_EXTRAROUTES);
    p.delete_route(CLUSTER, orphan).await.unwrap();
    p.delete_route(CLUSTER, stale).await.unwrap();
    assert_eq!(p.stats().total(ops::REMOVE_EXTRAROUTES), removes_before + 2);
    let (mut on_router, _) = admin.routes(&router.router_id).await.unwrap();
    on_router.sort();
    assert_eq!(
        on_router,
        vec![
            pair("10.244.1.0/24", "10.0.0.5"),
            pair("192.168.50.0/24", "10.0.200.9")
        ]
    );
    assert_eq!(
        p.stats().total(ops::EXTENSIONS),
        1,
        "the extension is checked once"
    );
}

#[tokio::test]
async fn a_batch_of_fifty_creations_is_one_update_call_on_both_paths() {
    let _one = ONE_AT_A_TIME.lock().await;
    for mode in [UpdateMode::Auto, UpdateMode::WholeList] {
        let (admin, router, url) = setup(&format!("batch-{mode:?}")).await;
        admin
            .set_route_quota(&router.project_id, 200)
            .await
            .unwrap();
        let p = OpenStackRoutes::new(config(&url, &router, mode)).unwrap();
        p.list_routes(CLUSTER).await.unwrap();
        let (_, rev_before) = admin.routes(&router.router_id).await.unwrap();

        let create: Vec<(String, Route)> = (0..50)
            .map(|i| {
                let ip = format!("10.0.1.{}", i + 10);
                (
                    format!("uid-{i}"),
                    node_route(&format!("node-{i}"), &ip, &format!("10.244.{i}.0/24")),
                )
            })
            .collect();
        let batch = Batch::new(&[], &create);
        let results = p.apply_batch(CLUSTER, &batch).await.unwrap();
        assert_eq!(results.len(), 50);
        for (key, _, wanted) in &batch.create {
            let route = results[key]
                .as_ref()
                .unwrap()
                .as_ref()
                .expect("a created route");
            assert_eq!(route.node, wanted.node);
        }
        let w = writes(&p);
        assert_eq!(
            w.values().sum::<u64>(),
            1,
            "{mode:?}: one write for 50 routes: {w:?}"
        );
        assert_eq!(
            p.stats().total(ops::GET_ROUTER),
            0,
            "{mode:?}: the listed revision was used"
        );

        // The server agrees: one revision step, fifty routes.
        let (routes, rev_after) = admin.routes(&router.router_id).await.unwrap();
        assert_eq!(routes.len(), 50);
        let step = rev_after - rev_before;
        assert_eq!(step, 1, "{mode:?}: one router update on the server");

        // Mixed: delete 10, create 5, deletions first.
        let listed = p.list_routes(CLUSTER).await.unwrap();
        let delete: Vec<Route> = listed.iter().take(10).cloned().collect();
        let create: Vec<(String, Route)> = (50..55)
            .map(|i| {
                (
                    format!("uid-{i}"),
                    node_route(
                        &format!("node-{i}"),
                        &format!("10.0.1.{}", i + 10),
                        &format!("10.244.{i}.0/24"),
                    ),
                )
            })
            .collect();
        let before = writes(&p).values().sum::<u64>();
        let batch = Batch::new(&delete, &create);
        let results = p.apply_batch(CLUSTER, &batch).await.unwrap();
        assert_eq!(results.len(), 15);
        assert!(
            batch
                .delete
                .iter()
                .all(|(k, _)| matches!(results[k], Ok(None)))
        );
        assert!(
            batch
                .create
                .iter()
                .all(|(k, _, _)| matches!(results[k], Ok(Some(_))))
        );
        let calls = writes(&p).values().sum::<u64>() - before;
        let expected = if mode == UpdateMode::WholeList { 1 } else { 2 };
        assert_eq!(calls, expected, "{mode:?}: remove+add or one whole list");
        let (routes, _) = admin.routes(&router.router_id).await.unwrap();
        assert_eq!(routes.len(), 45);
        for d in &delete {
            assert!(!routes.contains(&pair(&d.destination.to_string(), &d.next_hop)));
        }
    }
}

#[tokio::test]
async fn a_revision_conflict_on_the_whole_list_path_is_retried_without_losing_the_other_write() {
    let _one = ONE_AT_A_TIME.lock().await;
    let (admin, router, url) = setup("conflict").await;
    let p = OpenStackRoutes::new(config(&url, &router, UpdateMode::WholeList)).unwrap();
    p.list_routes(CLUSTER).await.unwrap();
    assert!(!p.uses_atomic_updates().await.unwrap());

    // Someone else changes the router after our list: our revision is stale.
    let (_, rev) = admin.routes(&router.router_id).await.unwrap();
    let (status, _) = admin
        .request(
            reqwest::Method::PUT,
            &format!("/routers/{}", router.router_id),
            Some(json!({"router": {"routes": [{"destination": "172.16.0.0/24", "nexthop": "10.0.0.200"}]}})),
            Some(rev),
        )
        .await
        .unwrap();
    assert_eq!(status, 200);

    p.create_route(
        CLUSTER,
        "uid",
        &node_route("n1", "10.0.0.5", "10.244.1.0/24"),
    )
    .await
    .unwrap();
    let s = p.stats().snapshot();
    assert_eq!(s.get(&(ops::UPDATE_ROUTER, "conflict")), Some(&1), "{s:?}");
    assert_eq!(s.get(&(ops::UPDATE_ROUTER, "ok")), Some(&1), "{s:?}");
    assert_eq!(
        s.get(&(ops::GET_ROUTER, "ok")),
        Some(&1),
        "one fresh read: {s:?}"
    );
    let (routes, _) = admin.routes(&router.router_id).await.unwrap();
    assert!(
        routes.contains(&pair("172.16.0.0/24", "10.0.0.200")),
        "the other write survived"
    );
    assert!(routes.contains(&pair("10.244.1.0/24", "10.0.0.5")));

    // Real concurrency: eight controllers (separate providers) write the same
    // router at once; every route must end up there.
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let c = config(&url, &router, UpdateMode::WholeList);
            tokio::spawn(async move {
                let mut c = c;
                c.max_conflict_retries = 20;
                let p = OpenStackRoutes::new(c).unwrap();
                p.list_routes(CLUSTER).await.unwrap();
                p.create_route(
                    CLUSTER,
                    "uid",
                    &node_route(
                        &format!("c{i}"),
                        &format!("10.0.2.{i}"),
                        &format!("10.245.{i}.0/24"),
                    ),
                )
                .await
                .map(|_| p.stats().total(ops::UPDATE_ROUTER))
            })
        })
        .collect();
    let mut updates = 0;
    for t in tasks {
        updates += t.await.unwrap().expect("every concurrent write lands");
    }
    let (routes, _) = admin.routes(&router.router_id).await.unwrap();
    for i in 0..8 {
        assert!(
            routes.contains(&pair(&format!("10.245.{i}.0/24"), &format!("10.0.2.{i}"))),
            "{routes:?}"
        );
    }
    assert!(routes.contains(&pair("172.16.0.0/24", "10.0.0.200")));
    assert!(updates >= 8, "{updates}");
}

#[tokio::test]
async fn the_route_quota_gives_quota_exceeded_with_a_clear_message() {
    let _one = ONE_AT_A_TIME.lock().await;
    for mode in [UpdateMode::Auto, UpdateMode::WholeList] {
        let (admin, router, url) = setup(&format!("quota-{mode:?}")).await;
        admin.set_route_quota(&router.project_id, 3).await.unwrap();
        let p = OpenStackRoutes::new(config(&url, &router, mode)).unwrap();
        p.list_routes(CLUSTER).await.unwrap();
        let create: Vec<(String, Route)> = (0..5)
            .map(|i| {
                (
                    format!("u{i}"),
                    node_route("n", "10.0.0.5", &format!("10.244.{i}.0/24")),
                )
            })
            .collect();
        let results = p.apply_batch(CLUSTER, &Batch::new(&[], &create)).await;
        let errors: Vec<_> = match results {
            Ok(r) => r.into_values().map(|r| r.unwrap_err()).collect(),
            Err(e) => vec![e],
        };
        for e in &errors {
            assert_eq!(e.kind, ErrorKind::QuotaExceeded, "{mode:?}: {e}");
            assert!(e.message.contains("route quota"), "{}", e.message);
            assert!(e.message.contains(&router.router_id), "{}", e.message);
            assert!(e.message.contains("router_route"), "{}", e.message);
        }
        let (routes, _) = admin.routes(&router.router_id).await.unwrap();
        assert!(routes.is_empty(), "nothing half-applied: {routes:?}");
        // Within the quota it works.
        let results = p
            .apply_batch(CLUSTER, &Batch::new(&[], &create[..3]))
            .await
            .unwrap();
        assert_eq!(results.len(), 3);
        assert!(results.values().all(|r| r.is_ok()), "{results:?}");
    }
}

#[tokio::test]
async fn garbage_routes_on_the_router_are_listed_as_unparsable_not_errors() {
    let _one = ONE_AT_A_TIME.lock().await;
    let server = neutron_server().await.unwrap();
    let (admin, router, url) = setup("garbage").await;
    let p = OpenStackRoutes::new(config(&url, &router, UpdateMode::Auto)).unwrap();
    p.node_index()
        .replace_all([("n1", vec![NodeAddress::internal_ip("10.0.0.5")])]);
    p.create_route(CLUSTER, "u", &node_route("n1", "10.0.0.5", "10.244.1.0/24"))
        .await
        .unwrap();
    insert_raw_route(&server, &router.router_id, "not-a-cidr", "10.0.0.5")
        .await
        .unwrap();
    insert_raw_route(&server, &router.router_id, "10.244.7.0/24", "garbage-hop")
        .await
        .unwrap();
    let (routes, _) = admin.routes(&router.router_id).await.unwrap();
    assert_eq!(
        routes.len(),
        3,
        "the server returns the garbage: {routes:?}"
    );

    let listed = p.list_routes(CLUSTER).await.expect("garbage is no error");
    assert_eq!(listed.len(), 3, "{listed:?}");
    let unparsable: Vec<&Route> = listed
        .iter()
        .filter(|r| matches!(r.destination, Destination::Unparsable(_)))
        .collect();
    assert_eq!(unparsable.len(), 2, "{listed:?}");
    assert!(
        unparsable.iter().any(
            |r| r.destination == Destination::Unparsable("not-a-cidr".into()) && r.node == "n1"
        )
    );
    assert!(unparsable.iter().any(|r| r.next_hop == "garbage-hop"));
    let e = p.delete_route(CLUSTER, unparsable[0]).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidRequest, "never deleted: {e}");
}

#[tokio::test]
async fn finds_the_router_by_name_and_reports_a_missing_router() {
    let _one = ONE_AT_A_TIME.lock().await;
    // The server outlives test runs: a name unique to this run.
    let name = format!(
        "by-name-{}",
        provider_openstack::testing::unique_project_id()
    );
    let (_admin, router, url) = setup(&name).await;
    let mut c = OpenStackConfig::noauth(&url, "unused");
    c.router_id = None;
    c.router_name = Some(router.name.clone());
    let p = OpenStackRoutes::new(c).unwrap();
    assert_eq!(p.router_id().await.unwrap(), router.router_id);
    p.list_routes(CLUSTER).await.unwrap();
    p.list_routes(CLUSTER).await.unwrap();
    assert_eq!(p.stats().total(ops::FIND_ROUTER), 1, "looked up once");

    let mut c = OpenStackConfig::noauth(&url, "unused");
    c.router_id = None;
    c.router_name = Some("no-such-router-anywhere".into());
    let e = OpenStackRoutes::new(c)
        .unwrap()
        .list_routes(CLUSTER)
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Permanent);

    // A router that does not exist (deleted behind the controller's back).
    let missing = OpenStackConfig::noauth(&url, "3f1c1d52-0000-4000-8000-000000000000");
    let p = OpenStackRoutes::new(missing).unwrap();
    let e = p.list_routes(CLUSTER).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::NotFound, "{e}");
    assert!(e.message.contains("RouterNotFound"), "{e}");
}

/// A Keystone stand-in: answers `POST /v3/auth/tokens` with a token and a
/// catalog whose network endpoint is the real neutron-server. Serves until
/// the returned server is dropped.
async fn fake_keystone(neutron: String, seen: Arc<Mutex<Vec<Value>>>) -> (String, TestServer) {
    let listener = Listener::bind().await.expect("bind a local port");
    let url = format!("{}/v3", listener.url());
    let server = listener.serve_hyper(move |req: hyper::Request<hyper::body::Incoming>| {
        let neutron = neutron.clone();
        let seen = seen.clone();
        async move {
            let path = req.uri().path().to_string();
            let body = req
                .into_body()
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            seen.lock()
                .expect("no test thread panicked holding the lock")
                .push(v);
            let answer = json!({"token": {
                "issued_at": "2026-01-01T00:00:00.000000Z",
                "expires_at": "2026-01-01T01:00:00.000000Z",
                "catalog": [{"type": "network", "name": "neutron", "endpoints": [
                    {"interface": "internal", "region_id": "RegionOne", "url": "http://127.0.0.1:1"},
                    {"interface": "public", "region_id": "RegionOne", "url": neutron}
                ]}]
            }});
            let resp = hyper::Response::builder()
                .status(if path == "/v3/auth/tokens" { 201 } else { 404 })
                .header("X-Subject-Token", "tok-123")
                .header("Content-Type", "application/json")
                .body(Full::new(Bytes::from(answer.to_string())))
                .expect("a well-formed test response");
            Ok::<_, Infallible>(resp)
        }
    });
    (url, server)
}

#[tokio::test]
async fn password_auth_gets_a_token_and_the_network_endpoint_from_the_catalog() {
    let _one = ONE_AT_A_TIME.lock().await;
    let (_admin, router, url) = setup("keystone").await;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (auth_url, _keystone) = fake_keystone(url, seen.clone()).await;
    let yaml = format!(
        "auth_type: password\n\
         auth:\n  auth_url: {auth_url}\n  username: k8s\n  password: pw-secret\n  project_name: demo\n\
         region_name: RegionOne\n\
         router_id: {}\n",
        router.router_id
    );
    let c = OpenStackConfig::from_yaml(&yaml).unwrap();
    assert_eq!(c.auth_type, AuthType::Password);
    assert_eq!(c.auth.password, Secret::new("pw-secret"));
    let p = OpenStackRoutes::new(c).unwrap();
    assert!(!format!("{p:?}").contains("pw-secret"));
    p.list_routes(CLUSTER).await.unwrap();
    p.list_routes(CLUSTER).await.unwrap();
    assert_eq!(p.stats().total(ops::AUTH), 1, "the token is reused");
    assert_eq!(p.stats().total(ops::LIST), 2);
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 1);
    assert_eq!(
        seen[0]["auth"]["identity"]["password"]["user"]["name"],
        "k8s"
    );
    assert_eq!(seen[0]["auth"]["scope"]["project"]["name"], "demo");
}

#[tokio::test]
async fn cached_route_follows_a_new_external_ip_instead_of_being_replaced() {
    let _one = ONE_AT_A_TIME.lock().await;
    // Regression: in incremental mode cached routes kept the node addresses
    // of the moment they were listed, so an ExternalIP added later planned a
    // delete + create of an identical route.
    let (_admin, router, url) = setup("refresh").await;
    let mut c = config(&url, &router, UpdateMode::Auto);
    c.node_subnets = vec![route_core::Cidr::parse("10.0.0.0/24").unwrap()];
    let p = OpenStackRoutes::new(c).unwrap();
    let idx = p.node_index();
    idx.replace_all([("n1", vec![NodeAddress::internal_ip("10.0.0.5")])]);
    p.create_route(
        CLUSTER,
        "uid-1",
        &node_route("n1", "10.0.0.5", "10.244.1.0/24"),
    )
    .await
    .unwrap();
    let cached = p.list_routes(CLUSTER).await.unwrap();
    assert_eq!(cached.len(), 1);

    let now = vec![
        NodeAddress::internal_ip("10.0.0.5"),
        NodeAddress::new("ExternalIP", "203.0.113.5"),
    ];
    idx.replace_all([("n1", now.clone())]);
    let node = route_core::NodeView::new("n1", "uid-1", &["10.244.1.0/24"]).with_addresses(now);
    let cfg = route_core::PlanConfig {
        cluster_cidrs: vec![route_core::Cidr::parse("10.244.0.0/16").unwrap()],
        needs: p.capabilities().needs,
        ..route_core::PlanConfig::default()
    };
    let stale = route_core::plan(std::slice::from_ref(&node), &cached, &cfg);
    assert_eq!(
        stale.deletions.len(),
        1,
        "the stale cache alone would churn"
    );

    let refreshed: Vec<Route> = cached
        .iter()
        .map(|r| p.refresh_route(r).unwrap_or_else(|| r.clone()))
        .collect();
    let writes_before = writes(&p);
    assert!(
        route_core::plan(std::slice::from_ref(&node), &refreshed, &cfg).is_noop(),
        "same next hop: nothing to replace"
    );
    assert_eq!(writes(&p), writes_before, "refreshing sends no request");
    assert_eq!(refreshed[0].name, cached[0].name);

    // A real change of the next hop is still a replacement.
    idx.replace_all([("n1", vec![NodeAddress::internal_ip("10.0.0.9")])]);
    let moved = route_core::NodeView::new("n1", "uid-1", &["10.244.1.0/24"])
        .with_addresses(vec![NodeAddress::internal_ip("10.0.0.9")]);
    let refreshed: Vec<Route> = cached
        .iter()
        .map(|r| p.refresh_route(r).unwrap_or_else(|| r.clone()))
        .collect();
    let plan = route_core::plan(&[moved], &refreshed, &cfg);
    assert_eq!(plan.deletions.len(), 1);
    assert_eq!(plan.creations.len(), 1);
}
