//! Every operation through RemoteMemoryCloud → HTTP → MemoryCloud and back,
//! on real loopback sockets and real time.

use std::time::Duration;

use cloud_sim::wire::{FailNext, Faults};
use cloud_sim::{AdminClient, AdminError, RemoteConfig, RemoteMemoryCloud, SimServer};
use provider_memory::{ErrorRate, MemoryConfig, Operation, RateLimitConfig};
use route_cloud::{Batch, CloudRoutes, ErrorKind};
use route_core::{Cidr, Destination, NodeAddress, Route};

const C: &str = "c1";

fn cidr(s: &str) -> Destination {
    Destination::Cidr(Cidr::parse(s).expect("the test CIDRs are valid"))
}

fn want(node: &str, dest: &str) -> Route {
    let mut r = Route::new(node, cidr(dest)).with_addresses(
        vec![
            NodeAddress {
                kind: "Hostname".into(),
                address: node.into(),
            },
            NodeAddress::internal_ip("10.0.0.7"),
        ],
        false,
    );
    r.node_provider_id = Some(format!("memory://{node}").into());
    r
}

async fn start(config: MemoryConfig) -> (SimServer, AdminClient) {
    let server = SimServer::start_local(config)
        .await
        .expect("start the simulated cloud");
    let admin = AdminClient::new(&server.url()).expect("the simulated cloud admin client");
    (server, admin)
}

async fn client(server: &SimServer, caller: &str) -> RemoteMemoryCloud {
    RemoteMemoryCloud::connect(&RemoteConfig::new(server.url(), caller))
        .await
        .expect("connect to the simulated cloud")
}

#[tokio::test]
async fn create_list_delete_round_trip_with_every_field() {
    let (server, admin) = start(MemoryConfig::default()).await;
    let c = client(&server, "ctl-a").await;
    assert_eq!(c.name(), "memory");

    let v4 = c
        .create_route(C, "uid-a", &want("a", "10.244.1.0/24"))
        .await
        .unwrap();
    let v6 = c
        .create_route(C, "uid-a", &want("a", "fd00:1::/64"))
        .await
        .unwrap();
    assert_eq!(v4.name, "c1-uid-a-10.244.1.0-24");
    assert_eq!(v6.name, "c1-uid-a-fd00-1---64");
    assert_eq!(v4.next_hop, "10.0.0.7");
    assert!(v4.enable_node_addresses);
    assert_eq!(v4.node_addresses, want("a", "10.244.1.0/24").node_addresses);
    assert_eq!(v4.node_provider_id.as_deref(), Some("memory://a"));

    let listed = c.list_routes(C).await.unwrap();
    assert_eq!(listed.len(), 2);
    assert!(listed.contains(&v4) && listed.contains(&v6));
    // What the client sees is exactly what the server stores.
    assert_eq!(server.cloud().routes(C), listed);
    assert_eq!(admin.routes(C).await.unwrap(), listed);

    c.delete_route(C, &v4).await.unwrap();
    assert_eq!(c.list_routes(C).await.unwrap(), vec![v6.clone()]);
    assert!(c.list_routes("other").await.unwrap().is_empty());

    let snap = c.stats().snapshot();
    assert_eq!(snap[&("create", "ok")], 2);
    assert_eq!(snap[&("delete", "ok")], 1);
    assert_eq!(snap[&("list", "ok")], 3);
    let s = admin.stats().await.unwrap();
    assert_eq!(s.count("create", "ok"), 2);
    assert_eq!(s.total("list"), 3);
    assert_eq!(s.caller_total("ctl-a", "create"), 2);
    assert_eq!(s.caller_total("ctl-a", "capabilities"), 1);
}

#[tokio::test]
async fn odd_cluster_names_and_unparsable_destinations_survive_the_trip() {
    let (server, admin) = start(MemoryConfig::default()).await;
    let c = client(&server, "ctl").await;
    let cluster = "team/a b?#%";
    let r = c
        .create_route(cluster, "u", &want("a", "10.244.1.0/24"))
        .await
        .unwrap();
    assert_eq!(c.list_routes(cluster).await.unwrap(), vec![r]);
    assert!(admin.state().await.unwrap().clusters.contains_key(cluster));

    // A route the cloud holds with a non-CIDR destination is listed verbatim
    // (the planner never deletes it).
    let odd = Route::from_text("x", "not a cidr").named("weird");
    admin.insert_route(C, &odd).await.unwrap();
    let listed = c.list_routes(C).await.unwrap();
    assert_eq!(listed, vec![odd.clone()]);
    assert_eq!(listed[0].destination, Destination::parse("not a cidr"));
    let e = c.create_route(C, "u", &odd).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidRequest);
}

#[tokio::test]
async fn errors_keep_their_class_across_the_wire() {
    let (server, _admin) = start(MemoryConfig {
        max_routes: Some(1),
        supports_ipv6: false,
        ..MemoryConfig::default()
    })
    .await;
    let c = client(&server, "ctl").await;
    let caps = c.capabilities();
    assert_eq!(caps.max_routes, Some(1));
    assert!(!caps.supports_ipv6 && !caps.supports_batch);

    let r = c
        .create_route(C, "u", &want("a", "10.244.1.0/24"))
        .await
        .unwrap();
    let e = c
        .create_route(C, "u", &want("a", "10.244.1.0/24"))
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::AlreadyExists);
    assert!(e.message.contains("already exists"), "{}", e.message);
    let e = c
        .create_route(C, "u", &want("b", "10.244.2.0/24"))
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::QuotaExceeded);
    let e = c
        .create_route("c2", "u", &want("b", "fd00::/64"))
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidRequest);
    assert!(e.message.contains("IPv4"), "{}", e.message);
    // A stale name is a different route: not found, and nothing deleted.
    let e = c
        .delete_route(C, &r.clone().named("old-name"))
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::NotFound);
    let e = c.apply_batch(C, &Batch::default()).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidRequest, "batches are off");

    let snap = c.stats().snapshot();
    assert_eq!(snap[&("create", "already_exists")], 1);
    assert_eq!(snap[&("create", "quota_exceeded")], 1);
    assert_eq!(snap[&("create", "invalid_request")], 1);
    assert_eq!(snap[&("delete", "not_found")], 1);
    assert_eq!(snap[&("batch", "invalid_request")], 1);
    assert_eq!(server.cloud().routes(C), vec![r]);
}

#[tokio::test]
async fn throttling_carries_the_servers_wait_in_body_and_header() {
    let (server, admin) = start(MemoryConfig {
        rate_limit: Some(RateLimitConfig {
            requests: 1,
            period_secs: 3600,
            burst: 1,
        }),
        ..MemoryConfig::default()
    })
    .await;
    let c = client(&server, "ctl").await;
    c.list_routes(C).await.unwrap();
    let e = c.list_routes(C).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Throttled);
    let wait = e.retry_after.expect("a throttled answer says how long");
    assert!(
        wait > Duration::from_secs(3590) && wait <= Duration::from_secs(3600),
        "{wait:?}"
    );
    assert_eq!(c.stats().snapshot()[&("list", "throttled")], 1);

    // The raw answer: 429, a Retry-After in whole seconds, the kind in the body.
    let resp = reqwest::Client::new()
        .get(format!("{}/v1/clusters/{C}/routes", server.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 429);
    let secs: u64 = resp.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((3591..=3600).contains(&secs), "{secs}");
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["kind"], "throttled");
    assert!(body["retry_after_ms"].as_u64().unwrap() > 3_590_000);

    // Lifting the limit through the admin API lets calls through again.
    admin
        .faults(&Faults {
            rate_limit: Some(None),
            ..Faults::default()
        })
        .await
        .unwrap();
    c.list_routes(C).await.unwrap();
}

#[tokio::test]
async fn two_callers_are_told_apart_in_log_and_stats() {
    let (server, admin) = start(MemoryConfig::default()).await;
    let a = client(&server, "controller-0").await;
    let b = client(&server, "controller-1").await;
    let anon = RemoteMemoryCloud::connect(&RemoteConfig {
        endpoint: server.url(),
        caller: None,
        request_timeout_ms: None,
    })
    .await
    .unwrap();
    a.create_route(C, "u", &want("n1", "10.244.1.0/24"))
        .await
        .unwrap();
    b.create_route(C, "u", &want("n2", "10.244.2.0/24"))
        .await
        .unwrap();
    b.list_routes(C).await.unwrap();
    anon.list_routes(C).await.unwrap();

    let log = admin.log(0).await.unwrap();
    let who: Vec<(&str, Operation, Option<&str>)> = log
        .iter()
        .map(|e| (e.caller.as_str(), e.op, e.node.as_deref()))
        .collect();
    assert_eq!(
        who,
        [
            ("controller-0", Operation::Create, Some("n1")),
            ("controller-1", Operation::Create, Some("n2")),
            ("controller-1", Operation::List, None),
            ("anonymous", Operation::List, None),
        ]
    );
    assert_eq!(log[0].destination.as_deref(), Some("10.244.1.0/24"));
    assert!(log.iter().all(|e| e.result == "ok" && e.cluster == C));
    assert!(log.windows(2).all(|w| w[0].at_ms <= w[1].at_ms));
    assert_eq!(log.iter().filter(|e| e.is_mutation()).count(), 2);
    // Reading from a position gives the tail.
    let tail = admin.log(2).await.unwrap();
    assert_eq!(tail.len(), 2);
    assert_eq!(tail[0].seq, 2);

    let s = admin.stats().await.unwrap();
    assert_eq!(s.caller_total("controller-0", "create"), 1);
    assert_eq!(s.caller_total("controller-1", "create"), 1);
    assert_eq!(s.caller_total("controller-0", "list"), 0);
    assert_eq!(s.caller_total("controller-1", "list"), 1);
    // Each client counts only its own requests.
    assert_eq!(a.stats().total("create"), 1);
    assert_eq!(a.stats().total("list"), 0);

    admin.clear_log().await.unwrap();
    assert!(admin.log(0).await.unwrap().is_empty());
    assert_eq!(
        admin.stats().await.unwrap().total("create"),
        2,
        "counters stay"
    );
}

#[tokio::test]
async fn injected_faults_fail_exactly_what_they_say() {
    let (server, admin) = start(MemoryConfig::default()).await;
    let c = client(&server, "ctl").await;
    admin
        .faults(&Faults {
            fail_next: vec![
                FailNext {
                    op: Operation::Create,
                    count: 2,
                    kind: ErrorKind::Conflict,
                },
                FailNext {
                    op: Operation::List,
                    count: 1,
                    kind: ErrorKind::Transient,
                },
            ],
            ..Faults::default()
        })
        .await
        .unwrap();
    for _ in 0..2 {
        let e = c
            .create_route(C, "u", &want("a", "10.244.1.0/24"))
            .await
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Conflict);
    }
    c.create_route(C, "u", &want("a", "10.244.1.0/24"))
        .await
        .unwrap();
    assert_eq!(
        c.list_routes(C).await.unwrap_err().kind,
        ErrorKind::Transient
    );
    assert_eq!(c.list_routes(C).await.unwrap().len(), 1);

    // An injected timeout on a change: the answer is lost, the change is not.
    admin
        .faults(&Faults {
            fail_next: vec![FailNext {
                op: Operation::Create,
                count: 1,
                kind: ErrorKind::Timeout,
            }],
            ..Faults::default()
        })
        .await
        .unwrap();
    let e = c
        .create_route(C, "u", &want("b", "10.244.2.0/24"))
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Timeout);
    assert_eq!(c.list_routes(C).await.unwrap().len(), 2);

    // Random failures at rate 1 fail every call, and clearing them stops it.
    let cfg = admin
        .faults(&Faults {
            error_rates: [(
                Operation::Delete,
                Some(ErrorRate {
                    probability: 1.0,
                    kind: ErrorKind::Permanent,
                }),
            )]
            .into(),
            max_routes: Some(Some(2)),
            list_lag: Some(1),
            ..Faults::default()
        })
        .await
        .unwrap();
    assert_eq!(cfg.max_routes, Some(2));
    assert_eq!(cfg.list_lag, 1);
    let listed = c.list_routes(C).await.unwrap();
    let e = c.delete_route(C, &listed[0]).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Permanent);
    assert!(!e.is_retryable());
    let e = c
        .create_route(C, "u", &want("c", "10.244.3.0/24"))
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::QuotaExceeded);
    admin
        .faults(&Faults {
            error_rates: [(Operation::Delete, None)].into(),
            max_routes: Some(None),
            ..Faults::default()
        })
        .await
        .unwrap();
    c.delete_route(C, &listed[0]).await.unwrap();
    c.create_route(C, "u", &want("c", "10.244.3.0/24"))
        .await
        .unwrap();
    // The list lag of 1 hides the new route from exactly one list.
    assert_eq!(c.list_routes(C).await.unwrap().len(), 1);
    assert_eq!(c.list_routes(C).await.unwrap().len(), 2);

    // A bad fault request changes nothing at all.
    let e = admin
        .faults(&Faults {
            error_rates: [(
                Operation::List,
                Some(ErrorRate {
                    probability: 1.5,
                    kind: ErrorKind::Transient,
                }),
            )]
            .into(),
            max_routes: Some(Some(0)),
            ..Faults::default()
        })
        .await
        .unwrap_err();
    assert!(
        matches!(&e, AdminError::Refused { status: 400, message } if message.contains("probability")),
        "{e}"
    );
    assert_eq!(admin.state().await.unwrap().config.max_routes, None);
    c.list_routes(C).await.unwrap();
}

#[tokio::test]
async fn a_slow_change_times_out_on_the_client_and_still_happens() {
    let (server, admin) = start(MemoryConfig::default()).await;
    let c = RemoteMemoryCloud::connect(
        &RemoteConfig::new(server.url(), "impatient").with_timeout(Duration::from_millis(300)),
    )
    .await
    .unwrap();
    admin
        .faults(&Faults {
            latency_ms: [(Operation::Create, 1000)].into(),
            ..Faults::default()
        })
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let e = c
        .create_route(C, "u", &want("a", "10.244.1.0/24"))
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Timeout);
    assert!(started.elapsed() < Duration::from_millis(900));
    assert_eq!(c.stats().snapshot()[&("create", "timeout")], 1);
    // The server finishes the change although nobody waits for the answer.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while admin.routes(C).await.unwrap().is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the creation never happened"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let log = admin.log(0).await.unwrap();
    assert_eq!(log.len(), 1);
    assert_eq!(
        (log[0].caller.as_str(), log[0].result.as_str()),
        ("impatient", "ok")
    );
    assert!(
        log[0].at_ms >= 1000,
        "logged after its latency: {}",
        log[0].at_ms
    );
}

#[tokio::test]
async fn an_unreachable_server_is_transient() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let cfg = RemoteConfig::new(format!("http://127.0.0.1:{port}"), "ctl");
    let e = RemoteMemoryCloud::connect(&cfg).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Transient);
    let c = RemoteMemoryCloud::new(&cfg).unwrap();
    assert_eq!(c.capabilities(), route_cloud::Capabilities::default());
    let e = c
        .create_route(C, "u", &want("a", "10.244.1.0/24"))
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Transient, "{e}");
    assert_eq!(c.stats().snapshot()[&("create", "transient")], 1);
    let e = c.list_routes(C).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Transient);
}

#[tokio::test]
async fn a_wrong_endpoint_needs_an_operator() {
    let (server, _admin) = start(MemoryConfig::default()).await;
    let c = RemoteMemoryCloud::new(&RemoteConfig::new(
        format!("{}/not-the-api", server.url()),
        "ctl",
    ))
    .unwrap();
    let e = c.list_routes(C).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Permanent, "{e}");
}

#[tokio::test]
async fn batches_report_each_change() {
    let (server, admin) = start(MemoryConfig {
        supports_batch: true,
        ..MemoryConfig::default()
    })
    .await;
    let c = client(&server, "batcher").await;
    assert!(c.capabilities().supports_batch);
    let old = c
        .create_route(C, "ua", &want("a", "10.244.1.0/24"))
        .await
        .unwrap();
    admin.clear_log().await.unwrap();
    let batch = Batch::new(
        &[old.clone(), Route::new("gone", cidr("10.244.7.0/24"))],
        &[
            ("ub".into(), want("b", "10.244.1.0/24")),
            ("uc".into(), want("c", "fd00:1::/64")),
            ("ud".into(), Route::from_text("d", "junk")),
        ],
    );
    let out = c.apply_batch(C, &batch).await.unwrap();
    assert_eq!(out.len(), 5);
    let deleted = |i: usize| &out[&batch.delete[i].0];
    let created = |i: usize| &out[&batch.create[i].0];
    assert_eq!(*deleted(0), Ok(None));
    assert_eq!(deleted(1).as_ref().unwrap_err().kind, ErrorKind::NotFound);
    let b = created(0).as_ref().unwrap().as_ref().unwrap();
    assert_eq!(
        (b.node.as_str(), b.name.as_str()),
        ("b", "c1-ub-10.244.1.0-24")
    );
    assert!(created(1).as_ref().unwrap().is_some());
    assert_eq!(
        created(2).as_ref().unwrap_err().kind,
        ErrorKind::InvalidRequest
    );
    let mut nodes: Vec<String> = admin
        .routes(C)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.node.to_string())
        .collect();
    nodes.sort();
    assert_eq!(nodes, ["b", "c"]);
    assert_eq!(c.stats().total("batch"), 1);
    assert_eq!(admin.stats().await.unwrap().count("batch", "ok"), 1);
    let log = admin.log(0).await.unwrap();
    assert_eq!(log.len(), 6);
    assert_eq!(log[0].op, Operation::Batch);
    assert!(
        log[1..]
            .iter()
            .all(|e| e.batch == Some(log[0].seq) && e.caller == "batcher")
    );

    // A failure of the whole batch is one error, not five.
    admin
        .faults(&Faults {
            fail_next: vec![FailNext {
                op: Operation::Batch,
                count: 1,
                kind: ErrorKind::Throttled,
            }],
            ..Faults::default()
        })
        .await
        .unwrap();
    let e = c.apply_batch(C, &batch).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Throttled);
}

#[tokio::test]
async fn behind_the_back_edits_and_reset() {
    let (server, admin) = start(MemoryConfig::default()).await;
    let c = client(&server, "ctl").await;
    let r = c
        .create_route(C, "u", &want("a", "10.244.1.0/24"))
        .await
        .unwrap();

    assert!(admin.blackhole_route(C, "10.244.1.0/24").await.unwrap());
    assert!(!admin.blackhole_route(C, "10.244.9.0/24").await.unwrap());
    assert!(c.list_routes(C).await.unwrap()[0].blackhole);

    let removed = admin
        .remove_route(C, "10.244.1.0/24")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(removed.name, r.name);
    assert!(removed.blackhole);
    assert_eq!(admin.remove_route(C, "10.244.1.0/24").await.unwrap(), None);
    assert_eq!(
        c.delete_route(C, &r).await.unwrap_err().kind,
        ErrorKind::NotFound
    );

    let stranger = Route::new("stranger", cidr("10.244.5.0/24"));
    assert_eq!(admin.insert_route(C, &stranger).await.unwrap(), None);
    let listed = c.list_routes(C).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].name, "c1-external-0");
    let replaced = admin
        .insert_route(C, &Route::new("other", cidr("10.244.5.0/24")).named("mine"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(replaced.node, "stranger");
    assert_eq!(admin.route_counts().await.unwrap()[C], 1);

    // Admin calls are neither logged nor counted by the cloud.
    let before = admin.stats().await.unwrap();
    assert_eq!(before.total("create"), 1);
    assert_eq!(admin.log(0).await.unwrap().len(), 4);

    // Reset: empty tables, log and counters; a new config is served and kept.
    let cfg = admin
        .reset(Some(MemoryConfig {
            supports_batch: true,
            max_routes: Some(7),
            ..MemoryConfig::default()
        }))
        .await
        .unwrap();
    assert_eq!(cfg.max_routes, Some(7));
    let state = admin.state().await.unwrap();
    assert!(state.clusters.is_empty());
    assert_eq!(state.config.max_routes, Some(7));
    assert!(admin.log(0).await.unwrap().is_empty());
    assert_eq!(admin.stats().await.unwrap(), Default::default());
    assert!(c.list_routes(C).await.unwrap().is_empty());
    assert!(!c.capabilities().supports_batch, "cached until refreshed");
    let caps = c.refresh_capabilities().await.unwrap();
    assert!(caps.supports_batch && c.capabilities().supports_batch);
    assert_eq!(caps.max_routes, Some(7));
    // A reset without a config keeps the last one given.
    assert_eq!(admin.reset(None).await.unwrap().max_routes, Some(7));

    let e = admin
        .reset(Some(MemoryConfig {
            max_concurrent_operations: 0,
            ..MemoryConfig::default()
        }))
        .await
        .unwrap_err();
    assert!(matches!(e, AdminError::Refused { status: 400, .. }), "{e}");
    assert_eq!(admin.state().await.unwrap().config.max_routes, Some(7));
}

#[tokio::test]
async fn bad_requests_are_answered_as_invalid_requests() {
    let (server, admin) = start(MemoryConfig::default()).await;
    let http = reqwest::Client::new();
    let url = format!("{}/v1/clusters/{C}/routes", server.url());
    for body in [
        "",
        "{",
        r#"{"route": {}}"#,
        r#"{"route": {"destination": "10.0.0.0/8"}, "x": 1}"#,
    ] {
        let resp = http
            .post(&url)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 400, "{body}");
        let e: serde_json::Value = resp.json().await.unwrap();
        assert_eq!(e["kind"], "invalid_request", "{body}");
    }
    let resp = http
        .get(&url)
        .header("x-caller", "x".repeat(300))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 400);
    assert!(server.cloud().routes(C).is_empty());
    let s = admin.stats().await.unwrap();
    assert_eq!(s.caller_total("anonymous", "create"), 4);
    assert_eq!(s.total("create"), 0, "never reached the cloud");
    let resp = http
        .post(format!("{}/admin/faults", server.url()))
        .body(r#"{"fail_next": 3}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 400);
}

#[tokio::test]
async fn non_loopback_listen_addresses_are_refused_without_allow_remote() {
    let e = SimServer::bind("0.0.0.0:0".parse().unwrap(), false, MemoryConfig::default())
        .await
        .unwrap_err();
    assert!(matches!(e, cloud_sim::ServeError::NotLoopback(_)), "{e}");
    let e = SimServer::start_local(MemoryConfig {
        max_concurrent_operations: 0,
        ..MemoryConfig::default()
    })
    .await
    .unwrap_err();
    assert!(matches!(e, cloud_sim::ServeError::Config(_)), "{e}");
}

#[tokio::test]
async fn the_server_enforces_one_change_at_a_time_across_clients() {
    let (server, admin) = start(MemoryConfig {
        max_concurrent_operations: 1,
        enforce_max_concurrency: true,
        latency: provider_memory::LatencyConfig {
            create_ms: 400,
            ..Default::default()
        },
        ..MemoryConfig::default()
    })
    .await;
    let a = client(&server, "a").await;
    let b = client(&server, "b").await;
    assert_eq!(a.capabilities().max_concurrent_operations, 1);
    let (ra, rb) = (want("n1", "10.244.1.0/24"), want("n2", "10.244.2.0/24"));
    let (x, y) = tokio::join!(a.create_route(C, "u", &ra), b.create_route(C, "u", &rb));
    let kinds = [
        x.as_ref().err().map(|e| e.kind),
        y.as_ref().err().map(|e| e.kind),
    ];
    assert!(
        kinds.contains(&None) && kinds.contains(&Some(ErrorKind::Conflict)),
        "{kinds:?}"
    );
    assert_eq!(admin.stats().await.unwrap().peak_concurrency, 2);
    assert_eq!(admin.routes(C).await.unwrap().len(), 1);
    server.shutdown().await.unwrap();
}
