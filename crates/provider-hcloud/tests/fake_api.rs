//! The provider against the stateful fake Hetzner Cloud API, over real HTTP
//! on 127.0.0.1.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use provider_hcloud::testing::{FakeConfig, FakeHcloud, LockAnswer};
use provider_hcloud::{HcloudConfig, HcloudRoutes, Token};
use route_cloud::{CloudError, CloudRoutes, ErrorKind};
use route_core::{Cidr, Destination, NodeAddress, Route};

const NET: u64 = 7;

fn dest(s: &str) -> Destination {
    Destination::Cidr(Cidr::parse(s).expect("the test CIDRs are valid"))
}

/// Node `i`: server id 100+i, private IP 10.0.0.(i+2), pod CIDR 10.244.i.0/24.
fn node_route(i: u32) -> Route {
    let mut r = Route::new(format!("node-{i}"), dest(&format!("10.244.{i}.0/24"))).with_addresses(
        vec![
            NodeAddress::internal_ip(format!("10.0.0.{}", i + 2)),
            NodeAddress {
                kind: "ExternalIP".into(),
                address: format!("203.0.113.{}", i + 2).into(),
            },
        ],
        false,
    );
    r.node_provider_id = Some(format!("hcloud://{}", 100 + i).into());
    r
}

async fn fake_with(config: FakeConfig, servers: u32) -> FakeHcloud {
    let fake = FakeHcloud::start(config)
        .await
        .expect("start the fake Hetzner API");
    fake.add_network(NET, "k8s", "10.0.0.0/8", &["10.0.0.0/24"]);
    for i in 0..servers {
        fake.add_server(
            u64::from(100 + i),
            &format!("node-{i}"),
            NET,
            &format!("10.0.0.{}", i + 2),
        );
    }
    fake
}

fn client_config(fake: &FakeHcloud) -> HcloudConfig {
    HcloudConfig {
        endpoint: fake.base_url(),
        action_poll_initial_ms: 40,
        action_poll_max_ms: 80,
        request_timeout_secs: 5,
        action_timeout_secs: 10,
        ..HcloudConfig::for_network(NET.to_string())
    }
}

fn provider(fake: &FakeHcloud, config: HcloudConfig) -> HcloudRoutes {
    HcloudRoutes::new(
        config,
        Token::new(fake.token()).expect("the fake token is a valid token"),
    )
    .expect("the provider accepts the test config")
}

#[tokio::test]
async fn list_create_delete_cost_exactly_the_documented_requests() {
    // Actions finish before the first poll, so each change is one POST and one poll.
    let fake = fake_with(
        FakeConfig {
            action_duration: Duration::from_millis(5),
            ..FakeConfig::default()
        },
        3,
    )
    .await;
    let p = provider(&fake, client_config(&fake));

    assert!(p.list_routes("c").await.unwrap().is_empty());
    assert_eq!(fake.total(), 1, "an empty network: one GET, no server list");

    let before = fake.total();
    let created = p.create_route("c", "uid-0", &node_route(0)).await.unwrap();
    assert_eq!(fake.total() - before, 2, "create = add_route + one poll");
    assert_eq!(
        created.next_hop, "10.0.0.2",
        "gateway = InternalIP inside the range"
    );
    assert_eq!(created.node_provider_id.as_deref(), Some("hcloud://100"));
    assert_eq!(created.name, "10.0.0.2-10.244.0.0/24");
    assert!(!created.enable_node_addresses);
    p.create_route("c", "uid-1", &node_route(1)).await.unwrap();
    assert_eq!(
        fake.routes(NET),
        vec![
            ("10.244.0.0/24".to_string(), "10.0.0.2".to_string()),
            ("10.244.1.0/24".to_string(), "10.0.0.3".to_string())
        ]
    );

    let before = fake.total();
    let listed = p.list_routes("c").await.unwrap();
    assert_eq!(
        fake.total() - before,
        1,
        "routes it created need no server lookup"
    );
    assert_eq!(listed.len(), 2);
    assert_eq!(listed[0], created, "list shows what create returned");
    assert_eq!(listed[1].node, "node-1");

    let before = fake.total();
    p.delete_route("c", &listed[0]).await.unwrap();
    assert_eq!(fake.total() - before, 2, "delete = delete_route + one poll");
    assert_eq!(fake.routes(NET).len(), 1);

    // The client's own counters agree with the server's, endpoint by endpoint.
    let stats = p.stats();
    for (endpoint, n) in fake.requests() {
        assert_eq!(stats.total(&endpoint), n, "{endpoint}");
    }
    assert_eq!(fake.count("add_route"), 2);
    assert_eq!(fake.count("delete_route"), 1);
    assert_eq!(fake.count("get_action"), 3);
    assert_eq!(fake.count("get_network"), 2);
    assert_eq!(fake.count("list_servers"), 0);
}

#[tokio::test]
async fn gateways_map_to_servers_and_unknown_ones_are_blackholes() {
    // 120 servers: the list takes three pages of 50.
    let fake = fake_with(FakeConfig::default(), 120).await;
    fake.insert_route(NET, "10.244.5.0/24", "10.0.0.7"); // node-5
    fake.insert_route(NET, "10.244.99.0/24", "10.0.0.250"); // no server
    let p = provider(&fake, client_config(&fake));

    let listed = p.list_routes("c").await.unwrap();
    assert_eq!(fake.count("get_network"), 1);
    assert_eq!(
        fake.count("list_servers"),
        3,
        "an unknown gateway loads every page once"
    );
    let known = listed
        .iter()
        .find(|r| r.destination == dest("10.244.5.0/24"))
        .unwrap();
    assert_eq!(known.node, "node-5");
    assert_eq!(known.node_provider_id.as_deref(), Some("hcloud://105"));
    assert!(!known.blackhole);
    assert_eq!(known.next_hop, "10.0.0.7");
    let dead = listed
        .iter()
        .find(|r| r.destination == dest("10.244.99.0/24"))
        .unwrap();
    assert!(dead.blackhole);
    assert_eq!(dead.node, "");

    // The stale route keeps missing, but the list is not fetched again within
    // the refresh interval.
    p.list_routes("c").await.unwrap();
    assert_eq!(fake.count("list_servers"), 3);

    // A node without an InternalIP in the network's range is found by its
    // provider id in the cached server list: no further request.
    let mut no_ip = node_route(9);
    no_ip.node_addresses = vec![NodeAddress::internal_ip("192.168.1.1")];
    let before = fake.total();
    let r = p.create_route("c", "u9", &no_ip).await.unwrap();
    assert_eq!(r.next_hop, "10.0.0.11");
    assert_eq!(fake.count("list_servers"), 3);
    assert_eq!(fake.count("add_route"), 1);
    assert!(fake.total() - before >= 2);

    // Unknown node, list recently fetched: a clear error, no flood.
    let mut ghost = Route::new("ghost", dest("10.244.200.0/24"));
    ghost.node_provider_id = Some("hcloud://999".into());
    let e = p.create_route("c", "ug", &ghost).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Transient);
    assert!(e.message.contains("ghost"), "{}", e.message);
    assert_eq!(fake.count("list_servers"), 3);
}

#[tokio::test]
async fn network_names_are_resolved_once() {
    let fake = fake_with(FakeConfig::default(), 1).await;
    let p = provider(
        &fake,
        HcloudConfig {
            network: "k8s".into(),
            ..client_config(&fake)
        },
    );
    p.list_routes("c").await.unwrap();
    p.list_routes("c").await.unwrap();
    assert_eq!(fake.count("list_networks"), 1);
    assert_eq!(fake.count("get_network"), 2);

    let missing = provider(
        &fake,
        HcloudConfig {
            network: "nope".into(),
            ..client_config(&fake)
        },
    );
    let e = missing.list_routes("c").await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Permanent);
    assert!(e.message.contains("nope"), "{}", e.message);
}

#[tokio::test]
async fn busy_networks_answer_conflict_and_recover() {
    for answer in [LockAnswer::Conflict, LockAnswer::Locked] {
        let fake = fake_with(
            FakeConfig {
                lock_answer: answer,
                ..FakeConfig::default()
            },
            2,
        )
        .await;
        let p = provider(&fake, client_config(&fake));
        // Held until released, however slowly this machine sends.
        fake.hold_network(NET, Duration::from_secs(600));
        let e = p.create_route("c", "u", &node_route(0)).await.unwrap_err();
        assert_eq!(e.kind, ErrorKind::Conflict, "{answer:?}: {e}");
        assert!(e.is_retryable());
        fake.release_network(NET);
        p.create_route("c", "u", &node_route(0)).await.unwrap();
        let expected = if answer == LockAnswer::Conflict {
            409
        } else {
            423
        };
        assert_eq!(fake.with_status(expected), 1);
    }
}

#[tokio::test]
async fn concurrent_callers_are_serialised_by_the_provider() {
    // The fake refuses a second action while one runs; the provider's own
    // lock keeps that from happening even when called concurrently.
    let fake = fake_with(
        FakeConfig {
            action_duration: Duration::from_millis(60),
            ..FakeConfig::default()
        },
        6,
    )
    .await;
    let p = Arc::new(provider(&fake, client_config(&fake)));
    let tasks: Vec<_> = (0..6)
        .map(|i| {
            let p = Arc::clone(&p);
            tokio::spawn(async move { p.create_route("c", "u", &node_route(i)).await })
        })
        .collect();
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    assert_eq!(fake.routes(NET).len(), 6);
    assert_eq!(fake.with_status(409), 0);
    assert_eq!(p.capabilities().max_concurrent_operations, 1);
}

#[tokio::test]
async fn error_answers_are_classified() {
    let fake = fake_with(FakeConfig::default(), 3).await;
    let p = provider(&fake, client_config(&fake));
    let r0 = p.create_route("c", "u", &node_route(0)).await.unwrap();

    let dup = p.create_route("c", "u", &node_route(0)).await.unwrap_err();
    assert_eq!(dup.kind, ErrorKind::AlreadyExists, "{dup}");
    p.delete_route("c", &r0).await.unwrap();
    let gone = p.delete_route("c", &r0).await.unwrap_err();
    assert_eq!(gone.kind, ErrorKind::NotFound, "{gone}");

    fake.fail_next("get_network", 1, 503, "unavailable");
    assert_eq!(
        p.list_routes("c").await.unwrap_err().kind,
        ErrorKind::Transient
    );
    fake.fail_next("get_network", 1, 500, "server_error");
    assert_eq!(
        p.list_routes("c").await.unwrap_err().kind,
        ErrorKind::Transient
    );
    // Not sticky.
    p.list_routes("c").await.unwrap();

    fake.fail_next("add_route", 1, 400, "invalid_input");
    let e = p.create_route("c", "u", &node_route(1)).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidRequest);

    fake.fail_next_action("action_failed");
    let e = p.create_route("c", "u", &node_route(1)).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Transient, "{e}");
    assert!(
        fake.routes(NET).is_empty(),
        "a failed action changes nothing"
    );

    // The server's own validation: a destination overlapping a subnet.
    let bad_dest = Route::new("node-2", dest("10.0.0.128/25"))
        .with_addresses(vec![NodeAddress::internal_ip("10.0.0.4")], false);
    let e = p.create_route("c", "u", &bad_dest).await.unwrap_err();
    assert_eq!(
        e.kind,
        ErrorKind::InvalidRequest,
        "overlaps the subnet: {e}"
    );

    let wrong = HcloudRoutes::new(client_config(&fake), Token::new("wrong").unwrap()).unwrap();
    let e = wrong.list_routes("c").await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Permanent, "{e}");
}

#[tokio::test]
async fn slow_answers_and_slow_actions_are_timeouts() {
    let fake = fake_with(FakeConfig::default(), 1).await;
    let p = provider(
        &fake,
        HcloudConfig {
            request_timeout_secs: 1,
            action_timeout_secs: 1,
            ..client_config(&fake)
        },
    );
    fake.set_action_duration(Duration::from_secs(30));
    let e = p.create_route("c", "u", &node_route(0)).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Timeout, "{e}");

    fake.set_latency(Duration::from_millis(1500));
    let e = p.list_routes("c").await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Timeout, "{e}");
}

#[tokio::test]
async fn ipv6_is_refused_before_any_request() {
    let fake = fake_with(FakeConfig::default(), 1).await;
    let p = provider(&fake, client_config(&fake));
    let mut v6 = node_route(0);
    v6.destination = dest("fd00:10:244::/64");
    let e = p.create_route("c", "u", &v6).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidRequest);
    assert!(e.message.contains("IPv4-only"), "{}", e.message);
    assert_eq!(fake.total(), 0);
    let caps = p.capabilities();
    assert!(!caps.supports_ipv6 && !caps.supports_batch && !caps.reports_node_addresses);
    assert_eq!(caps.max_routes, Some(100));
}

#[tokio::test]
async fn the_101st_route_is_quota_exceeded() {
    let fake = fake_with(
        FakeConfig {
            action_duration: Duration::from_millis(1),
            ..FakeConfig::default()
        },
        0,
    )
    .await;
    let p = provider(
        &fake,
        HcloudConfig {
            action_poll_initial_ms: 3,
            action_poll_max_ms: 10,
            ..client_config(&fake)
        },
    );
    let route = |i: u32| {
        Route::new(format!("n{i}"), dest(&format!("10.244.{i}.0/24"))).with_addresses(
            vec![NodeAddress::internal_ip(format!("10.0.1.{}", i + 1))],
            false,
        )
    };
    for i in 0..100 {
        p.create_route("c", "u", &route(i)).await.unwrap();
    }
    let e = p.create_route("c", "u", &route(100)).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::QuotaExceeded, "{e}");
    assert!(!e.message.is_empty());
    assert_eq!(fake.routes(NET).len(), 100);
}

/// How the project's budget stands when a burst starts.
struct Budget {
    /// Requests the fake refills per second (of 200).
    refill_per_second: f64,
    /// Already spent by another tool when the burst starts.
    spent: u32,
    /// Spent by the other tool every 100 ms while the burst runs.
    other_per_tick: u32,
}

/// Creates `n` routes one after another while other users of the project
/// spend part of the budget; retries throttled answers as the controller would.
async fn burst_of_creates(n: u32, use_headers: bool, budget: Budget) -> (FakeHcloud, HcloudRoutes) {
    // A scaled-down budget: 200 requests, refilled in about a second ("an hour").
    let fake = fake_with(
        FakeConfig {
            enforce_budget: true,
            rate_limit: 200,
            refill_per_second: budget.refill_per_second,
            action_duration: Duration::from_millis(1),
            max_routes: 1000,
            ..FakeConfig::default()
        },
        0,
    )
    .await;
    let p = provider(
        &fake,
        HcloudConfig {
            requests_per_hour: 200 * 3600,
            burst: 200,
            keep_in_reserve: 20,
            use_rate_limit_headers: use_headers,
            action_poll_initial_ms: 2,
            action_poll_max_ms: 10,
            ..client_config(&fake)
        },
    );
    // Another tool has spent (part of) the budget, and keeps spending while
    // the burst runs.
    fake.consume_budget(budget.spent);
    let fake = Arc::new(fake);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let other = {
        let (fake, stop) = (Arc::clone(&fake), Arc::clone(&stop));
        tokio::spawn(async move {
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                fake.consume_budget(budget.other_per_tick);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    for i in 0..n {
        let r = Route::new(
            format!("n{i}"),
            dest(&format!("10.{}.{}.0/24", 244 + i / 256, i % 256)),
        )
        .with_addresses(
            vec![NodeAddress::internal_ip(format!(
                "10.1.{}.{}",
                i / 200,
                i % 200 + 2
            ))],
            false,
        );
        let mut tries = 0;
        loop {
            match p.create_route("c", "u", &r).await {
                Ok(_) => break,
                Err(CloudError {
                    kind: ErrorKind::Throttled,
                    retry_after,
                    ..
                }) if tries < 50 => {
                    tries += 1;
                    tokio::time::sleep(retry_after.unwrap_or(Duration::from_millis(100))).await;
                }
                Err(e) => panic!("create {i}: {e}"),
            }
        }
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    other.await.expect("the concurrent request task finished");
    let fake = Arc::try_unwrap(fake).unwrap_or_else(|_| panic!("fake still shared"));
    (fake, p)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limit_headers_keep_a_500_create_burst_free_of_429() {
    let started = std::time::Instant::now();
    // Another tool left exactly the reserve and spends a quarter of the
    // refill meanwhile: the first answer's headers already say to wait.
    let (fake, p) = burst_of_creates(
        500,
        true,
        Budget {
            refill_per_second: 200.0,
            spent: 180,
            other_per_tick: 5,
        },
    )
    .await;
    assert_eq!(fake.routes(NET).len(), 500);
    assert_eq!(fake.throttled(), 0, "no 429 at all");
    // The budget starts at the reserve, so the client waited at once,
    // however fast this machine sends; how long depends on that speed and
    // is not asserted.
    assert!(
        p.stats().rate_limit_wait() > Duration::ZERO,
        "the client never slowed itself down"
    );
    let requests = fake.total();
    assert_eq!(fake.count("add_route"), 500);
    assert!(requests >= 1000, "{requests}");
    println!(
        "500 creates: {requests} requests ({:?}), {:?} waiting for budget, {:?} in all",
        fake.requests(),
        p.stats().rate_limit_wait(),
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_headers_the_same_burst_is_throttled() {
    // The control for the test above: the client's own budget alone does not
    // know what other users spent. The budget is spent and refills at 30
    // requests a second for this client, so any client sending faster than
    // that (every machine: 120 requests in 4 s) meets a 429.
    let (fake, _p) = burst_of_creates(
        60,
        false,
        Budget {
            refill_per_second: 40.0,
            spent: 200,
            other_per_tick: 1,
        },
    )
    .await;
    assert_eq!(fake.routes(NET).len(), 60);
    assert!(
        fake.throttled() > 0,
        "expected 429s without header handling"
    );
}

/// Collects everything written by a `tracing` subscriber.
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<u8>>>);

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .expect("no test thread panicked holding the lock")
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn the_token_never_appears_in_debug_errors_or_logs() {
    const SECRET: &str = "tok-S3CRET-do-not-print";
    let capture = Capture::default();
    let writer = capture.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let fake = fake_with(
        FakeConfig {
            token: SECRET.into(),
            ..FakeConfig::default()
        },
        2,
    )
    .await;
    let p = provider(&fake, client_config(&fake));
    let mut seen = format!("{p:?} {:?}", p.config());
    p.create_route("c", "u", &node_route(0)).await.unwrap();
    fake.fail_next("get_network", 1, 500, "server_error");
    seen.push_str(&p.list_routes("c").await.unwrap_err().to_string());
    let wrong =
        HcloudRoutes::new(client_config(&fake), Token::new("other-token").unwrap()).unwrap();
    seen.push_str(&wrong.list_routes("c").await.unwrap_err().to_string());
    seen.push_str(&format!("{wrong:?}"));

    let logs = String::from_utf8(capture.0.lock().unwrap().clone()).unwrap();
    assert!(
        logs.contains("request failed"),
        "the provider logged: {logs}"
    );
    assert!(seen.contains("<redacted>"));
    for text in [&seen, &logs] {
        assert!(!text.contains(SECRET), "token leaked: {text}");
        assert!(!text.contains("other-token"), "token leaked: {text}");
    }
}

#[tokio::test]
async fn route_to_a_deleted_server_is_a_blackhole_once_the_server_list_says_so() {
    // Regression: the gateways this provider created were never forgotten
    // and won over the server list, so a route to a deleted server's IP was
    // never reported as a blackhole.
    let fake = fake_with(FakeConfig::default(), 2).await;
    let p = provider(
        &fake,
        HcloudConfig {
            server_refresh_min_interval_secs: 0,
            ..client_config(&fake)
        },
    );
    p.create_route("c", "uid-0", &node_route(0)).await.unwrap();
    let listed = p.list_routes("c").await.unwrap();
    assert!(!listed[0].blackhole);
    assert_eq!(
        fake.count("list_servers"),
        0,
        "created routes need no lookup"
    );

    // The server is deleted; a stranger's route makes the provider fetch the
    // server list, which no longer has the gateway.
    fake.remove_server(100);
    fake.insert_route(NET, "10.244.99.0/24", "10.0.0.250");
    let listed = p.list_routes("c").await.unwrap();
    assert!(fake.count("list_servers") >= 1);
    let ours = listed
        .iter()
        .find(|r| r.destination == dest("10.244.0.0/24"))
        .unwrap();
    assert!(ours.blackhole, "{ours:?}");

    // Once the route is gone, so is what was learned about its gateway: a
    // new server on that IP is named by the server list alone.
    p.delete_route("c", ours).await.unwrap();
    p.list_routes("c").await.unwrap();
    fake.add_server(300, "node-new", NET, "10.0.0.2");
    fake.insert_route(NET, "10.244.0.0/24", "10.0.0.2");
    let listed = p.list_routes("c").await.unwrap();
    let r = listed
        .iter()
        .find(|r| r.destination == dest("10.244.0.0/24"))
        .unwrap();
    assert_eq!(r.node, "node-new");
    assert!(!r.blackhole);
}

#[tokio::test]
async fn change_that_waited_for_budget_past_the_renew_deadline_is_not_sent() {
    let fake = fake_with(FakeConfig::default(), 1).await;
    // One request a second, no burst: the add_route after the network GET
    // waits about a second for its token.
    let p = provider(
        &fake,
        HcloudConfig {
            requests_per_hour: 3600,
            burst: 1,
            use_rate_limit_headers: false,
            ..client_config(&fake)
        },
    );
    let fence = route_cloud::Fence::leased(Arc::new(route_cloud::TokioClock::new()));
    fence.set_leader(true);
    fence.renewed(fence.mark(), Duration::from_millis(300));
    let p = p.with_fence(fence);
    let e = p
        .create_route("c", "uid-0", &node_route(0))
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Fenced, "{e}");
    assert_eq!(fake.count("add_route"), 0, "the change was not sent");
    assert!(fake.routes(NET).is_empty());
}
