//! The provider against the fake Compute Engine API over HTTP, through the
//! official client: what each operation costs in requests, which routes are
//! this cluster's, a second writer, throttling, operations that run long,
//! blackholes, paging and credentials.

use std::sync::Arc;
use std::time::Duration;

use provider_gce::testing::{FakeConfig, FakeGce};
use provider_gce::{ConfigError, GceConfig, GceRoutes};
use route_cloud::{CloudRoutes, ErrorKind};
use route_core::{Cidr, NodeView, Route};

const NETWORK: &str = "k8s";
const ZONE: &str = "us-central1-a";

async fn fake(config: FakeConfig, ipv6: bool) -> FakeGce {
    let fake = FakeGce::start(config).await.expect("the fake starts");
    fake.add_network(NETWORK, ipv6);
    for i in 0..4 {
        fake.add_instance(ZONE, &format!("node-{i}"));
    }
    fake
}

fn config(fake: &FakeGce) -> GceConfig {
    GceConfig {
        endpoint: fake.endpoint(),
        anonymous: true,
        request_timeout_secs: 5,
        operation_timeout_secs: 10,
        operation_poll_min_ms: 20,
        operation_polls_per_second: 1000.0,
        operation_poll_burst: 100,
        quota_window_secs: 1,
        ..GceConfig::for_network(fake.project(), NETWORK)
    }
}

fn node(fake: &FakeGce, i: usize) -> NodeView {
    NodeView::new(format!("node-{i}"), format!("uid-{i}"), &[])
        .with_provider_id(format!("gce://{}/{ZONE}/node-{i}", fake.project()))
}

fn want(n: &NodeView, cidr: &str) -> Route {
    let mut r = Route::new(n.name.as_str(), Cidr::parse(cidr).expect("a CIDR literal"));
    r.node_provider_id = n.provider_id.as_deref().map(Into::into);
    r
}

async fn cloud(fake: &FakeGce, nodes: &[NodeView]) -> GceRoutes {
    let c = GceRoutes::connect(config(fake)).await.expect("connects");
    let nodes: Vec<Arc<NodeView>> = nodes.iter().cloned().map(Arc::new).collect();
    c.observe_nodes(&nodes);
    c
}

#[tokio::test]
async fn requests_per_list_create_and_delete() {
    let fake = fake(
        FakeConfig {
            operation_duration: Duration::from_millis(200),
            ..FakeConfig::default()
        },
        false,
    )
    .await;
    let n = node(&fake, 0);
    let c = cloud(&fake, std::slice::from_ref(&n)).await;
    assert_eq!(fake.count("get_network"), 1, "one network read at start");
    let before = fake.requests();
    c.list_routes("k8s").await.unwrap();
    c.create_route("k8s", &n.uid, &want(&n, "10.244.1.0/24"))
        .await
        .unwrap();
    let listed = c.list_routes("k8s").await.unwrap();
    assert_eq!(listed.len(), 1);
    let after_create = fake.requests();
    c.delete_route("k8s", &listed[0]).await.unwrap();
    let after = fake.requests();
    let delta = |a: &std::collections::BTreeMap<String, u64>,
                 b: &std::collections::BTreeMap<String, u64>,
                 k: &str| a.get(k).unwrap_or(&0) - b.get(k).unwrap_or(&0);
    // list: 1 routes.list; create: 1 insert + 1 wait (the operation runs
    // 200 ms, the wait blocks until it is done); delete: the same.
    assert_eq!(delta(&after_create, &before, "list"), 2);
    assert_eq!(delta(&after_create, &before, "insert"), 1);
    assert_eq!(delta(&after_create, &before, "wait_operation"), 1);
    assert_eq!(delta(&after, &after_create, "delete"), 1);
    assert_eq!(delta(&after, &after_create, "wait_operation"), 1);
    assert_eq!(fake.count("get_operation"), 0);
    assert_eq!(fake.count("get_route"), 0, "no read-back on the happy path");
    assert!(fake.routes().is_empty());
    let stats = c.stats().snapshot();
    assert_eq!(stats.get(&("insert", "ok")), Some(&1), "{stats:?}");
    assert_eq!(stats.get(&("wait_operation", "ok")), Some(&2), "{stats:?}");
}

#[tokio::test]
async fn created_routes_have_upstreams_shape() {
    let fake = fake(FakeConfig::default(), false).await;
    let n = node(&fake, 1);
    let c = cloud(&fake, std::slice::from_ref(&n)).await;
    let created = c
        .create_route("kubernetes", &n.uid, &want(&n, "10.244.7.0/24"))
        .await
        .unwrap();
    let r = &fake.routes()[0];
    assert_eq!(r.name, "kubernetes-10-244-7-0-24");
    assert_eq!(r.priority, 1000);
    assert_eq!(r.description, "k8s-node-route");
    assert_eq!(r.network, fake.network_url(NETWORK));
    assert_eq!(
        r.next_hop_instance.as_deref(),
        Some(fake.instance_url(ZONE, "node-1").as_str())
    );
    assert_eq!(created.name, r.name);
    assert_eq!(
        created.next_hop,
        format!("projects/{}/zones/{ZONE}/instances/node-1", fake.project())
    );
}

#[tokio::test]
async fn routes_of_other_clusters_are_listed_as_theirs_and_other_networks_and_tools_are_not_listed_and_none_is_deleted()
 {
    let fake = fake(FakeConfig::default(), false).await;
    fake.add_network("other-net", false);
    let hop = fake.instance_url(ZONE, "node-0");
    // Upstream's filter `k8s-.*` matches the first two; only the last
    // two of these are cluster k8s's.
    fake.insert_route(
        "k8s-prod-10-244-1-0-24",
        NETWORK,
        "10.244.1.0/24",
        Some(&hop),
        "k8s-node-route",
    );
    fake.insert_route(
        "k8s-prod-3f2504e0-4f89-11d3-9a0c-0305e82c3301",
        NETWORK,
        "10.244.2.0/24",
        Some(&hop),
        "k8s-node-route",
    );
    fake.insert_route(
        "k8s-pinned",
        NETWORK,
        "10.244.3.0/24",
        Some(&hop),
        "k8s-node-route",
    );
    fake.insert_route(
        "k8s-10-244-4-0-24",
        NETWORK,
        "10.244.4.0/24",
        Some(&hop),
        "terraform",
    );
    fake.insert_route(
        "k8s-10-244-5-0-24",
        "other-net",
        "10.244.5.0/24",
        Some(&hop),
        "k8s-node-route",
    );
    fake.insert_route(
        "k8s-10-244-6-0-24",
        NETWORK,
        "10.244.6.0/24",
        Some(&hop),
        "k8s-node-route",
    );
    fake.insert_route(
        "k8s-3f2504e0-4f89-11d3-9a0c-0305e82c3302",
        NETWORK,
        "10.244.7.0/24",
        Some(&hop),
        "k8s-node-route",
    );
    let c = cloud(&fake, &[node(&fake, 0)]).await;
    let all = c.list_routes("k8s").await.unwrap();
    let names = |foreign: bool| {
        let mut v: Vec<String> = all
            .iter()
            .filter(|r| r.foreign.is_some() == foreign)
            .map(|r| r.name.to_string())
            .collect();
        v.sort();
        v
    };
    assert_eq!(
        names(false),
        [
            "k8s-10-244-6-0-24",
            "k8s-3f2504e0-4f89-11d3-9a0c-0305e82c3302"
        ]
    );
    // Other clusters' node routes in the network are listed as theirs, so
    // a pod CIDR over one is reported, never routed a second time; other
    // networks' and other tools' routes are not listed at all.
    assert_eq!(
        names(true),
        [
            "k8s-pinned",
            "k8s-prod-10-244-1-0-24",
            "k8s-prod-3f2504e0-4f89-11d3-9a0c-0305e82c3301"
        ]
    );
    // A route of another cluster handed to delete_route is refused
    // without a request.
    let before = fake.count("delete");
    let foreign = Route::from_text("node-0", "10.244.1.0/24").named("k8s-prod-10-244-1-0-24");
    let e = c.delete_route("k8s", &foreign).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidRequest, "{e}");
    assert_eq!(fake.count("delete"), before);
    assert_eq!(fake.routes().len(), 7);
}

#[tokio::test]
async fn dual_stack_node_second_route_is_not_lost_to_a_shared_name() {
    // Upstream names both routes `<cluster>-<node UID>`: the IPv6 insert
    // answers 409, counts as success, and the IPv6 route never exists.
    let fake = fake(FakeConfig::default(), true).await;
    let n = node(&fake, 0);
    let c = cloud(&fake, std::slice::from_ref(&n)).await;
    assert!(c.capabilities().supports_ipv6);
    c.create_route("k8s", &n.uid, &want(&n, "10.244.1.0/24"))
        .await
        .unwrap();
    c.create_route("k8s", &n.uid, &want(&n, "fd00:10:244:1::/64"))
        .await
        .unwrap();
    let mut dests: Vec<String> = c
        .list_routes("k8s")
        .await
        .unwrap()
        .iter()
        .map(|r| r.destination.to_string())
        .collect();
    dests.sort();
    assert_eq!(dests, ["10.244.1.0/24", "fd00:10:244:1::/64"]);
}

#[tokio::test]
async fn ipv6_is_refused_without_a_request_where_the_network_has_no_ipv6_range() {
    let fake = fake(FakeConfig::default(), false).await;
    let n = node(&fake, 0);
    let c = cloud(&fake, std::slice::from_ref(&n)).await;
    assert!(!c.capabilities().supports_ipv6);
    let e = c
        .create_route("k8s", &n.uid, &want(&n, "fd00:10:244:1::/64"))
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidRequest, "{e}");
    assert_eq!(fake.count("insert"), 0);
    // Told otherwise, the provider sends it and the API refuses it.
    let c = GceRoutes::connect(GceConfig {
        ipv6: Some(true),
        ..config(&fake)
    })
    .await
    .unwrap();
    let e = c
        .create_route("k8s", &n.uid, &want(&n, "fd00:10:244:1::/64"))
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidRequest, "{e}");
    assert_eq!(fake.count("insert"), 1);
}

#[tokio::test]
async fn an_insert_retried_after_its_answer_was_lost_is_done() {
    let fake = fake(FakeConfig::default(), false).await;
    let n = node(&fake, 0);
    let c = cloud(&fake, std::slice::from_ref(&n)).await;
    let route = want(&n, "10.244.1.0/24");
    c.create_route("k8s", &n.uid, &route).await.unwrap();
    // The same insert again (the controller never saw the first answer):
    // 409, read back, the same route: done.
    let again = c.create_route("k8s", &n.uid, &route).await.unwrap();
    assert_eq!(again.destination.to_string(), "10.244.1.0/24");
    assert_eq!((fake.count("insert"), fake.count("get_route")), (2, 1));
    assert_eq!(fake.routes().len(), 1);
    // The same destination to another Node while the old route stands is
    // a conflict to retry once the old one is deleted, never a success.
    let other = node(&fake, 1);
    let e = c
        .create_route("k8s", &other.uid, &want(&other, "10.244.1.0/24"))
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Conflict, "{e}");
}

#[tokio::test]
async fn a_second_writer_is_seen_by_the_next_list() {
    let fake = fake(FakeConfig::default(), false).await;
    let nodes = [node(&fake, 0), node(&fake, 1)];
    let c = cloud(&fake, &nodes).await;
    c.create_route("k8s", "u", &want(&nodes[0], "10.244.1.0/24"))
        .await
        .unwrap();
    // Another client deletes ours and inserts one of the cluster's shape.
    assert!(fake.remove_route("k8s-10-244-1-0-24"));
    fake.insert_route(
        "k8s-10-244-2-0-24",
        NETWORK,
        "10.244.2.0/24",
        Some(&fake.instance_url(ZONE, "node-1")),
        "k8s-node-route",
    );
    let listed = c.list_routes("k8s").await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].node, "node-1");
    assert_eq!(listed[0].destination.to_string(), "10.244.2.0/24");
    // Deleting the route the other writer already removed: not found.
    let gone = Route::from_text("node-0", "10.244.1.0/24").named("k8s-10-244-1-0-24");
    let e = c.delete_route("k8s", &gone).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::NotFound, "{e}");
}

#[tokio::test]
async fn a_spent_read_quota_is_throttled_until_the_window_turns() {
    let fake = fake(
        FakeConfig {
            reads_per_window: 3,
            window: Duration::from_secs(1),
            ..FakeConfig::default()
        },
        false,
    )
    .await;
    let c = cloud(&fake, &[]).await;
    // Lists until one is refused (the window may have turned meanwhile).
    let mut refused = None;
    for _ in 0..8 {
        if let Err(e) = c.list_routes("k8s").await {
            refused = Some(e);
            break;
        }
    }
    let e = refused.expect("a spent read quota refuses a list");
    assert_eq!(e.kind, ErrorKind::Throttled, "{e}");
    let wait = e.retry_after.expect("a throttled answer says how long");
    assert!(wait <= Duration::from_millis(1100), "{wait:?}");
    // The next list waits for the window to turn instead of being refused.
    let refusals = fake.throttled();
    c.list_routes("k8s").await.expect("the window turned");
    assert_eq!(fake.throttled(), refusals, "no second refusal");
    assert!(c.stats().rate_limit_wait() > Duration::ZERO);
}

#[tokio::test]
async fn an_operation_that_runs_past_its_bound_is_a_timeout_with_bounded_reads() {
    let fake = fake(
        FakeConfig {
            operation_duration: Duration::from_secs(30),
            max_wait: Duration::from_millis(200),
            ..FakeConfig::default()
        },
        false,
    )
    .await;
    let n = node(&fake, 0);
    let c = GceRoutes::connect(GceConfig {
        operation_timeout_secs: 2,
        operation_poll_min_ms: 500,
        ..config(&fake)
    })
    .await
    .unwrap();
    let e = c
        .create_route("k8s", &n.uid, &want(&n, "10.244.1.0/24"))
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Timeout, "{e}");
    // Reads at least 500 ms apart within 2 s: at most 5.
    let reads = fake.count("wait_operation");
    eprintln!("operation reads within the 2 s bound: {reads}");
    assert!((2..=5).contains(&reads), "{reads} operation reads");
}

#[tokio::test]
async fn operation_errors_are_classified() {
    let fake = fake(FakeConfig::default(), false).await;
    let n = node(&fake, 0);
    let c = cloud(&fake, std::slice::from_ref(&n)).await;
    fake.fail_next_operation(
        "QUOTA_EXCEEDED",
        "Quota 'ROUTES' exceeded. Limit: 300.0 globally.",
    );
    let e = c
        .create_route("k8s", &n.uid, &want(&n, "10.244.1.0/24"))
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::QuotaExceeded, "{e}");
    // The per-network quota a 5,000-Node test hit, in the same code.
    fake.fail_next_operation(
        "QUOTA_EXCEEDED",
        "Quota 'STATIC_ROUTES_PER_NETWORK' exceeded.  Limit: 200.0 globally.",
    );
    let e = c
        .create_route("k8s", &n.uid, &want(&n, "10.244.1.0/24"))
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::QuotaExceeded, "{e}");
    assert!(e.message.contains("STATIC_ROUTES_PER_NETWORK"), "{e}");
    assert!(fake.routes().is_empty());
    // A next hop that does not exist fails the operation; may work later.
    let ghost = NodeView::new("ghost", "g", &[])
        .with_provider_id(format!("gce://{}/{ZONE}/ghost", fake.project()));
    let e = c
        .create_route("k8s", "g", &want(&ghost, "10.244.2.0/24"))
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Transient, "{e}");
    assert!(fake.routes().is_empty());
}

#[tokio::test]
async fn stopped_or_deleted_next_hops_are_blackholes() {
    let fake = fake(FakeConfig::default(), false).await;
    let nodes = [node(&fake, 0), node(&fake, 1), node(&fake, 2)];
    let c = cloud(&fake, &nodes).await;
    for (i, n) in nodes.iter().enumerate() {
        c.create_route("k8s", &n.uid, &want(n, &format!("10.244.{i}.0/24")))
            .await
            .unwrap();
    }
    fake.stop_instance(ZONE, "node-1");
    fake.delete_instance(ZONE, "node-2");
    let listed = c.list_routes("k8s").await.unwrap();
    let hole = |node: &str| listed.iter().find(|r| r.node == node).map(|r| r.blackhole);
    assert_eq!(
        (hole("node-0"), hole("node-1"), hole("node-2")),
        (Some(false), Some(true), Some(true))
    );
}

#[tokio::test]
async fn every_page_of_the_list_is_read() {
    let fake = fake(FakeConfig::default(), false).await;
    let hop = fake.instance_url(ZONE, "node-0");
    for i in 0..7 {
        let dest = format!("10.244.{i}.0/24");
        fake.insert_route(
            &format!("k8s-10-244-{i}-0-24"),
            NETWORK,
            &dest,
            Some(&hop),
            "k8s-node-route",
        );
    }
    let c = GceRoutes::connect(GceConfig {
        page_size: 3,
        ..config(&fake)
    })
    .await
    .unwrap();
    assert_eq!(c.list_routes("k8s").await.unwrap().len(), 7);
    assert_eq!(fake.count("list"), 3);
}

#[tokio::test]
async fn a_key_files_contents_never_reach_an_error() {
    let dir = std::env::temp_dir().join(format!("gce-key-{}", std::process::id()));
    std::fs::write(
        &dir,
        "{\"type\": \"service_account\", \"private_key\": \"s3cr3t-key-material\"",
    )
    .unwrap();
    let e = GceRoutes::connect(GceConfig {
        credentials_file: Some(dir.clone()),
        ..GceConfig::for_network("p", "k8s")
    })
    .await
    .unwrap_err();
    assert!(matches!(e, ConfigError::CredentialsFile { .. }), "{e}");
    assert!(!format!("{e} {e:?}").contains("s3cr3t"), "{e:?}");
    std::fs::write(
        &dir,
        "{\"type\": \"service_account\", \"private_key\": \"s3cr3t-key-material\"}",
    )
    .unwrap();
    let e = GceRoutes::connect(GceConfig {
        credentials_file: Some(dir.clone()),
        ..GceConfig::for_network("p", "k8s")
    })
    .await
    .unwrap_err();
    assert!(!format!("{e} {e:?}").contains("s3cr3t"), "{e:?}");
    std::fs::remove_file(&dir).unwrap();
}

/// cloud-provider-gcp's `token-url`: the token comes from the endpoint
/// (here the fake's `generateAccessToken`), asked with the metadata
/// server's token and the configured body, and is reused until a minute
/// before its `expireTime`; a token about to expire is asked for again.
#[tokio::test]
async fn a_token_url_token_is_asked_with_the_base_credentials_and_reused_until_it_expires() {
    use google_cloud_auth::credentials::{CacheableResource, Credentials, mds};
    use provider_gce::alt_token::AltToken;

    let fake = fake(FakeConfig::default(), false).await;
    let base = || {
        mds::Builder::default()
            .with_endpoint(format!("http://{}", fake.metadata_host()))
            .build()
            .expect("metadata credentials")
    };
    let body = r#"{"scope": ["https://www.googleapis.com/auth/compute"]}"#;
    let account = "routes@p.iam.gserviceaccount.com";
    let creds: Credentials = AltToken::new(
        base(),
        &fake.token_url(account),
        body,
        Duration::from_secs(5),
    )
    .into();
    let bearer = |h: CacheableResource<http::HeaderMap>| match h {
        CacheableResource::New { data, .. } => {
            data["authorization"].to_str().expect("ASCII").to_string()
        }
        CacheableResource::NotModified => "not modified".to_string(),
    };
    for _ in 0..3 {
        let h = creds
            .headers(http::Extensions::new())
            .await
            .expect("a token");
        assert_eq!(bearer(h), format!("Bearer ya29.generated-1-for-{account}"));
    }
    assert_eq!(fake.token_bodies(), vec![body.to_string()]);

    // Tokens that live less than the refresh margin are asked for each time.
    fake.set_token_lifetime(Duration::from_secs(30));
    let fresh: Credentials = AltToken::new(
        base(),
        &fake.token_url(account),
        body,
        Duration::from_secs(5),
    )
    .into();
    for n in 2..4 {
        let h = fresh
            .headers(http::Extensions::new())
            .await
            .expect("a token");
        assert_eq!(
            bearer(h),
            format!("Bearer ya29.generated-{n}-for-{account}")
        );
    }

    // Without the base credentials the endpoint refuses; the error names
    // the endpoint and its answer, never a token.
    let refused: Credentials = AltToken::new(
        google_cloud_auth::credentials::anonymous::Builder::new().build(),
        &fake.token_url(account),
        body,
        Duration::from_secs(5),
    )
    .into();
    let e = refused
        .headers(http::Extensions::new())
        .await
        .expect_err("refused")
        .to_string();
    assert!(
        e.contains("token-url") && e.contains("401") && e.contains("generateAccessToken"),
        "{e}"
    );
    assert_eq!(fake.token_bodies().len(), 3);
}
