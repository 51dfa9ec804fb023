//! Unit tests of the simulated cloud, through its public API only: what a
//! controller, a test or the simulator can observe.

use std::collections::BTreeMap;
use std::time::Duration;

use route_cloud::{Batch, CloudRoutes, ErrorKind};
use route_core::{Cidr, Destination, NodeAddress, Route, Text};
use tokio::time::Instant;

use crate::*;

const C: &str = "c1";

fn cidr(s: &str) -> Destination {
    Destination::Cidr(Cidr::parse(s).unwrap())
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

fn cloud(config: MemoryConfig) -> MemoryCloud {
    MemoryCloud::new(config).unwrap()
}

#[tokio::test(start_paused = true)]
async fn create_list_delete_round_trip() {
    let c = MemoryCloud::default();
    let v4 = c
        .create_route(C, "uid-a", &want("a", "10.244.1.0/24"))
        .await
        .unwrap();
    let v6 = c
        .create_route(C, "uid-a", &want("a", "fd00:1::/64"))
        .await
        .unwrap();
    assert_eq!(v4.name, "c1-uid-a-10.244.1.0-24");
    assert_eq!(
        v6.name, "c1-uid-a-fd00-1---64",
        "dual-stack routes differ by CIDR"
    );
    assert_eq!(v4.next_hop, "10.0.0.7", "the first InternalIP");
    assert!(v4.enable_node_addresses);
    assert_eq!(v4.node_addresses, want("a", "10.244.1.0/24").node_addresses);
    assert_eq!(v4.node_provider_id.as_deref(), Some("memory://a"));

    let listed = c.list_routes(C).await.unwrap();
    assert_eq!(listed.len(), 2);
    assert!(
        listed.contains(&v4) && listed.contains(&v6),
        "list shows what create returned"
    );
    assert!(
        c.list_routes("other").await.unwrap().is_empty(),
        "tables are per cluster"
    );

    c.delete_route(C, &v4).await.unwrap();
    assert_eq!(c.list_routes(C).await.unwrap(), vec![v6]);
}

#[tokio::test(start_paused = true)]
async fn one_route_per_destination_and_missing_deletes() {
    let c = MemoryCloud::default();
    let a = c
        .create_route(C, "ua", &want("a", "10.244.1.0/24"))
        .await
        .unwrap();
    let same = c
        .create_route(C, "ua", &want("a", "10.244.1.0/24"))
        .await
        .unwrap_err();
    assert_eq!(same.kind, ErrorKind::AlreadyExists);
    let other = c
        .create_route(C, "ub", &want("b", "10.244.1.0/24"))
        .await
        .unwrap_err();
    assert_eq!(other.kind, ErrorKind::AlreadyExists);
    assert!(other.message.contains("\"a\""), "{}", other.message);

    c.delete_route(C, &a).await.unwrap();
    assert_eq!(
        c.delete_route(C, &a).await.unwrap_err().kind,
        ErrorKind::NotFound
    );
    assert_eq!(
        c.delete_route("nope", &a).await.unwrap_err().kind,
        ErrorKind::NotFound
    );
    // Re-created for another node: the stale listing no longer names it.
    c.create_route(C, "ub", &want("b", "10.244.1.0/24"))
        .await
        .unwrap();
    assert_eq!(
        c.delete_route(C, &a).await.unwrap_err().kind,
        ErrorKind::NotFound
    );
    assert_eq!(c.routes(C).len(), 1);
}

#[tokio::test(start_paused = true)]
async fn node_address_reporting_follows_the_switch() {
    let c = cloud(MemoryConfig {
        reports_node_addresses: false,
        ..MemoryConfig::default()
    });
    let r = c
        .create_route(C, "u", &want("a", "10.244.1.0/24"))
        .await
        .unwrap();
    assert!(!r.enable_node_addresses);
    assert!(!c.list_routes(C).await.unwrap()[0].enable_node_addresses);
    assert!(!c.capabilities().reports_node_addresses);
    assert!(MemoryCloud::default().capabilities().reports_node_addresses);
}

#[tokio::test(start_paused = true)]
async fn counters_are_exact_per_operation_and_result() {
    let c = MemoryCloud::default();
    let r = c
        .create_route(C, "u", &want("a", "10.244.1.0/24"))
        .await
        .unwrap();
    let _ = c.create_route(C, "u", &want("a", "10.244.1.0/24")).await;
    c.list_routes(C).await.unwrap();
    c.list_routes(C).await.unwrap();
    c.delete_route(C, &r).await.unwrap();
    let _ = c.delete_route(C, &r).await;
    let snap = c.stats().snapshot();
    let expect: BTreeMap<(&str, &str), u64> = [
        (("create", "ok"), 1),
        (("create", "already_exists"), 1),
        (("list", "ok"), 2),
        (("delete", "ok"), 1),
        (("delete", "not_found"), 1),
    ]
    .into_iter()
    .collect();
    assert_eq!(snap, expect);
    // Test controls are free.
    c.routes(C);
    c.insert_route(C, Route::new("x", cidr("10.244.9.0/24")));
    assert_eq!(c.stats().snapshot(), expect);
}

#[tokio::test(start_paused = true)]
async fn log_tags_callers_and_uses_virtual_time() {
    let base = cloud(MemoryConfig {
        latency: LatencyConfig::uniform(250),
        ..MemoryConfig::default()
    });
    let t0 = Instant::now();
    let a = base.with_caller("controller-a");
    let mut b = base.clone();
    b.set_caller("controller-b");
    assert_eq!(base.caller(), "default");
    a.create_route(C, "u1", &want("n1", "10.244.1.0/24"))
        .await
        .unwrap();
    b.create_route(C, "u2", &want("n2", "10.244.2.0/24"))
        .await
        .unwrap();
    base.list_routes(C).await.unwrap();
    assert_eq!(
        t0.elapsed(),
        Duration::from_millis(750),
        "latency is on the tokio clock"
    );

    let log = base.log();
    let who: Vec<(&str, Operation, u64)> = log
        .iter()
        .map(|r| {
            (
                &*r.caller,
                r.op,
                u64::try_from((r.at - t0).as_millis()).unwrap(),
            )
        })
        .collect();
    assert_eq!(
        who,
        vec![
            ("controller-a", Operation::Create, 250),
            ("controller-b", Operation::Create, 500),
            ("default", Operation::List, 750),
        ]
    );
    assert_eq!(log[1].node.as_deref(), Some("n2"));
    assert_eq!(log[1].destination, Some(cidr("10.244.2.0/24")));
    assert!(log[0].is_mutation() && !log[2].is_mutation());
    base.clear_log();
    assert!(a.log().is_empty(), "handles share one log");
}

#[tokio::test(start_paused = true)]
async fn latency_per_operation_overlaps_across_tasks() {
    let c = MemoryCloud::default();
    c.set_latency(Operation::Create, Duration::from_secs(2));
    c.set_latency(Operation::List, Duration::from_millis(100));
    let t0 = Instant::now();
    let (r1, r2) = (want("n1", "10.244.1.0/24"), want("n2", "10.244.2.0/24"));
    let (x, y) = tokio::join!(c.create_route(C, "u1", &r1), c.create_route(C, "u2", &r2));
    x.unwrap();
    y.unwrap();
    assert_eq!(t0.elapsed(), Duration::from_secs(2));
    c.list_routes(C).await.unwrap();
    assert_eq!(t0.elapsed(), Duration::from_millis(2100));
    assert_eq!(c.peak_concurrency(), 2);
}

#[tokio::test(start_paused = true)]
async fn rate_limit_throttles_with_retry_after_and_refills() {
    let c = cloud(MemoryConfig {
        rate_limit: Some(RateLimitConfig {
            requests: 60,
            period_secs: 60,
            burst: 3,
        }),
        ..MemoryConfig::default()
    });
    for _ in 0..3 {
        c.list_routes(C).await.unwrap();
    }
    let e = c.list_routes(C).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Throttled);
    let wait = e.retry_after.expect("retry-after is given");
    assert!(
        wait > Duration::from_millis(990) && wait <= Duration::from_secs(1),
        "{wait:?}"
    );
    // Throttled answers cost nothing from the budget: waiting as told works.
    tokio::time::sleep(wait).await;
    c.list_routes(C).await.unwrap();
    assert_eq!(c.stats().snapshot()[&("list", "throttled")], 1);
    assert_eq!(c.stats().total("list"), 5);

    c.set_rate_limit(None);
    for _ in 0..10 {
        c.list_routes(C).await.unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn hetzner_preset_allows_an_hour_of_burst_then_one_per_second() {
    let c = cloud(MemoryConfig {
        latency: LatencyConfig::default(),
        ..MemoryConfig::hetzner_like()
    });
    for _ in 0..3600 {
        c.list_routes(C).await.unwrap();
    }
    let e = c.list_routes(C).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Throttled);
    assert!(e.retry_after.unwrap() <= Duration::from_secs(1));
    tokio::time::sleep(Duration::from_secs(10)).await;
    for _ in 0..10 {
        c.list_routes(C).await.unwrap();
    }
    assert_eq!(
        c.list_routes(C).await.unwrap_err().kind,
        ErrorKind::Throttled
    );

    let caps = c.capabilities();
    assert_eq!(caps.max_routes, Some(100));
    assert_eq!(caps.max_concurrent_operations, 1);
    assert!(!caps.supports_ipv6 && !caps.supports_batch && !caps.reports_node_addresses);
}

#[tokio::test(start_paused = true)]
async fn quota_answers_quota_exceeded_until_a_route_is_deleted() {
    let c = cloud(MemoryConfig {
        max_routes: Some(2),
        ..MemoryConfig::default()
    });
    let first = c
        .create_route(C, "u", &want("a", "10.244.1.0/24"))
        .await
        .unwrap();
    c.create_route(C, "u", &want("b", "10.244.2.0/24"))
        .await
        .unwrap();
    let e = c
        .create_route(C, "u", &want("c", "10.244.3.0/24"))
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::QuotaExceeded);
    // The quota is per cluster table.
    c.create_route("c2", "u", &want("c", "10.244.3.0/24"))
        .await
        .unwrap();
    c.delete_route(C, &first).await.unwrap();
    c.create_route(C, "u", &want("c", "10.244.3.0/24"))
        .await
        .unwrap();
    c.set_max_routes(None);
    c.create_route(C, "u", &want("d", "10.244.4.0/24"))
        .await
        .unwrap();
    assert_eq!(c.routes(C).len(), 3);
}

#[tokio::test(start_paused = true)]
async fn ipv6_and_unparsable_destinations_are_invalid_requests() {
    let c = cloud(MemoryConfig {
        supports_ipv6: false,
        ..MemoryConfig::default()
    });
    let e = c
        .create_route(C, "u", &want("a", "fd00::/64"))
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidRequest);
    assert!(e.message.contains("IPv4"), "{}", e.message);
    let bad = Route::from_text("a", "not-a-cidr");
    let e = c.create_route(C, "u", &bad).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidRequest);
    assert!(c.routes(C).is_empty());
    assert!(!c.capabilities().supports_ipv6);
}

#[tokio::test(start_paused = true)]
async fn batches_need_the_switch_and_apply_deletions_then_creations() {
    let off = MemoryCloud::default();
    let e = off.apply_batch(C, &Batch::default()).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidRequest);

    let c = cloud(MemoryConfig {
        supports_batch: true,
        ..MemoryConfig::default()
    });
    assert!(c.capabilities().supports_batch);
    let old = c
        .create_route(C, "ua", &want("a", "10.244.1.0/24"))
        .await
        .unwrap();
    c.clear_log();
    let batch = Batch::new(
        &[old.clone(), Route::new("gone", cidr("10.244.7.0/24"))],
        // The first creation reuses the destination freed by the deletion.
        &[
            ("ub".into(), want("b", "10.244.1.0/24")),
            ("uc".into(), want("c", "fd00:1::/64")),
            ("ud".into(), Route::from_text("d", "junk")),
        ],
    );
    let out = c.with_caller("ctl").apply_batch(C, &batch).await.unwrap();
    assert_eq!(out.len(), 5);
    let deleted = |i: usize| &out[&batch.delete[i].0];
    let created = |i: usize| &out[&batch.create[i].0];
    assert_eq!(*deleted(0), Ok(None));
    assert_eq!(deleted(1).as_ref().unwrap_err().kind, ErrorKind::NotFound);
    assert_eq!(created(0).as_ref().unwrap().as_ref().unwrap().node, "b");
    assert!(created(1).as_ref().unwrap().is_some());
    assert_eq!(
        created(2).as_ref().unwrap_err().kind,
        ErrorKind::InvalidRequest
    );
    let mut nodes: Vec<String> = c
        .routes(C)
        .into_iter()
        .map(|r| r.node.to_string())
        .collect();
    nodes.sort();
    assert_eq!(nodes, ["b", "c"]);

    assert_eq!(c.stats().total("batch"), 1, "a batch is one request");
    let log = c.log();
    assert_eq!(log[0].op, Operation::Batch);
    assert_eq!(log.len(), 6);
    assert!(
        log[1..]
            .iter()
            .all(|r| r.batch == Some(log[0].seq) && &*r.caller == "ctl")
    );
    assert_eq!(log.iter().filter(|r| r.is_mutation()).count(), 3);
}

#[tokio::test(start_paused = true)]
async fn random_errors_are_seeded_and_reproducible() {
    async fn pattern(seed: u64) -> Vec<bool> {
        let c = cloud(MemoryConfig {
            seed,
            error_rates: ErrorRates {
                list: Some(ErrorRate {
                    probability: 0.3,
                    kind: ErrorKind::Transient,
                }),
                ..ErrorRates::default()
            },
            ..MemoryConfig::default()
        });
        let mut out = Vec::new();
        for _ in 0..400 {
            match c.list_routes(C).await {
                Ok(_) => out.push(false),
                Err(e) => {
                    assert_eq!(e.kind, ErrorKind::Transient);
                    out.push(true);
                }
            }
        }
        // Not sticky: once the rate is off, everything succeeds.
        c.set_error_rate(Operation::List, None);
        c.list_routes(C).await.unwrap();
        // Other operations are untouched by the list's rate.
        c.create_route(C, "u", &want("a", "10.244.1.0/24"))
            .await
            .unwrap();
        out
    }
    let a = pattern(7).await;
    assert_eq!(a, pattern(7).await, "same seed, same failures");
    assert_ne!(a, pattern(8).await, "another seed, other failures");
    let failures = a.iter().filter(|f| **f).count();
    assert!(
        (80..=160).contains(&failures),
        "about 30% of 400, got {failures}"
    );
    // An earlier failure never poisons a later success.
    assert!(a.windows(2).any(|w| w[0] && !w[1]));
}

#[tokio::test(start_paused = true)]
async fn fail_next_fails_exactly_n_calls_of_one_operation() {
    let c = MemoryCloud::default();
    c.fail_next(Operation::Create, 2, ErrorKind::Conflict);
    for _ in 0..2 {
        let e = c
            .create_route(C, "u", &want("a", "10.244.1.0/24"))
            .await
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Conflict);
    }
    assert!(c.routes(C).is_empty(), "failed calls change nothing");
    c.list_routes(C).await.unwrap();
    c.create_route(C, "u", &want("a", "10.244.1.0/24"))
        .await
        .unwrap();
    c.fail_next(Operation::List, 1, ErrorKind::Permanent);
    c.fail_next(Operation::List, 0, ErrorKind::Permanent);
    c.list_routes(C).await.unwrap();
    assert_eq!(c.stats().snapshot()[&("create", "conflict")], 2);
}

#[tokio::test(start_paused = true)]
async fn storm_throttles_every_call_until_it_ends() {
    let c = MemoryCloud::default();
    c.set_storm(Some(Some(Duration::from_secs(3))));
    for _ in 0..3 {
        let e = c.list_routes(C).await.unwrap_err();
        assert_eq!(e.kind, ErrorKind::Throttled);
        assert_eq!(e.retry_after, Some(Duration::from_secs(3)));
    }
    assert!(
        c.create_route(C, "u", &want("a", "10.244.1.0/24"))
            .await
            .is_err()
    );
    c.set_storm(None);
    c.create_route(C, "u", &want("a", "10.244.1.0/24"))
        .await
        .unwrap();
    assert_eq!(c.stats().snapshot()[&("list", "throttled")], 3);
}

#[tokio::test(start_paused = true)]
async fn injected_timeouts_still_take_effect() {
    let c = MemoryCloud::default();
    c.fail_next(Operation::Create, 1, ErrorKind::Timeout);
    let e = c
        .create_route(C, "u", &want("a", "10.244.1.0/24"))
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Timeout);
    let listed = c.list_routes(C).await.unwrap();
    assert_eq!(listed.len(), 1, "the creation happened");
    c.fail_next(Operation::Delete, 1, ErrorKind::Timeout);
    let e = c.delete_route(C, &listed[0]).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Timeout);
    assert!(c.routes(C).is_empty(), "the deletion happened");
    // A timed-out list changes nothing and answers nothing.
    c.fail_next(Operation::List, 1, ErrorKind::Timeout);
    assert_eq!(c.list_routes(C).await.unwrap_err().kind, ErrorKind::Timeout);
    let log = c.log();
    assert_eq!(log[0].result, Err(ErrorKind::Timeout));
}

#[tokio::test(start_paused = true)]
async fn routes_vanish_appear_and_die_behind_the_controllers_back() {
    let c = MemoryCloud::default();
    let r = c
        .create_route(C, "u", &want("a", "10.244.1.0/24"))
        .await
        .unwrap();
    let gone = c.remove_route(C, &r.destination).unwrap();
    assert_eq!(gone, r);
    assert!(c.list_routes(C).await.unwrap().is_empty());
    assert_eq!(
        c.delete_route(C, &r).await.unwrap_err().kind,
        ErrorKind::NotFound
    );

    assert!(
        c.insert_route(C, Route::new("stranger", cidr("10.244.5.0/24")))
            .is_none()
    );
    let listed = c.list_routes(C).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].node, "stranger");
    assert!(!listed[0].name.is_empty());
    c.delete_route(C, &listed[0]).await.unwrap();

    c.create_route(C, "u", &want("a", "10.244.1.0/24"))
        .await
        .unwrap();
    assert!(c.blackhole_route(C, &cidr("10.244.1.0/24")));
    assert!(!c.blackhole_route(C, &cidr("10.244.2.0/24")));
    assert!(c.list_routes(C).await.unwrap()[0].blackhole);
}

#[tokio::test(start_paused = true)]
async fn clones_share_table_counters_and_limits() {
    let test_handle = cloud(MemoryConfig {
        rate_limit: Some(RateLimitConfig {
            requests: 1,
            period_secs: 3600,
            burst: 2,
        }),
        ..MemoryConfig::default()
    });
    let controller_handle = test_handle.with_caller("controller");
    controller_handle
        .create_route(C, "u", &want("a", "10.244.1.0/24"))
        .await
        .unwrap();
    assert_eq!(test_handle.routes(C).len(), 1);
    assert_eq!(test_handle.stats().total("create"), 1);
    test_handle.list_routes(C).await.unwrap();
    let e = controller_handle.list_routes(C).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Throttled, "one budget for all handles");
}

#[tokio::test(start_paused = true)]
async fn lagging_lists_hide_new_routes_for_k_lists() {
    let c = cloud(MemoryConfig {
        list_lag: 2,
        ..MemoryConfig::default()
    });
    c.create_route(C, "u", &want("a", "10.244.1.0/24"))
        .await
        .unwrap();
    assert!(c.list_routes(C).await.unwrap().is_empty());
    assert!(c.list_routes(C).await.unwrap().is_empty());
    assert_eq!(c.list_routes(C).await.unwrap().len(), 1);
    // Still there even while hidden: a second create is refused.
    c.set_list_lag(1);
    c.create_route(C, "u", &want("b", "10.244.2.0/24"))
        .await
        .unwrap();
    let e = c
        .create_route(C, "u", &want("b", "10.244.2.0/24"))
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::AlreadyExists);
    assert_eq!(c.list_routes(C).await.unwrap().len(), 1);
    assert_eq!(c.list_routes(C).await.unwrap().len(), 2);
    assert_eq!(c.routes(C).len(), 2);
}

#[tokio::test(start_paused = true)]
async fn enforced_concurrency_answers_conflict_to_the_second_caller() {
    let c = cloud(MemoryConfig {
        max_concurrent_operations: 1,
        enforce_max_concurrency: true,
        latency: LatencyConfig::uniform(500),
        ..MemoryConfig::default()
    });
    let (r1, r2) = (want("n1", "10.244.1.0/24"), want("n2", "10.244.2.0/24"));
    let (x, y) = tokio::join!(c.create_route(C, "u1", &r1), c.create_route(C, "u2", &r2));
    assert!(x.is_ok());
    assert_eq!(y.unwrap_err().kind, ErrorKind::Conflict);
    // One at a time is fine, and lists do not count.
    let (l, z) = tokio::join!(c.list_routes(C), c.create_route(C, "u2", &r2));
    l.unwrap();
    z.unwrap();
    assert_eq!(c.capabilities().max_concurrent_operations, 1);
}

#[test]
fn config_reads_from_files_and_rejects_nonsense() {
    let cfg: MemoryConfig = serde_json::from_str(
        r#"{
            "latency": {"create_ms": 20},
            "rate_limit": {"requests": 3600, "burst": 10},
            "max_routes": 100,
            "supports_ipv6": false,
            "error_rates": {"delete": {"probability": 0.5, "kind": "throttled"}},
            "seed": 42,
            "list_lag": 1
        }"#,
    )
    .unwrap();
    assert_eq!(cfg.latency.create_ms, 20);
    assert_eq!(cfg.latency.list_ms, 0);
    assert_eq!(cfg.rate_limit.unwrap().period_secs, 3600);
    assert_eq!(cfg.error_rates.delete.unwrap().kind, ErrorKind::Throttled);
    assert!(
        cfg.reports_node_addresses,
        "unset fields keep their defaults"
    );
    assert!(cfg.validate().is_ok());

    let empty: MemoryConfig = serde_json::from_str("{}").unwrap();
    assert_eq!(empty, MemoryConfig::default());
    assert!(serde_json::from_str::<MemoryConfig>(r#"{"max_route": 3}"#).is_err());
    assert!(
        serde_json::from_str::<MemoryConfig>(
            r#"{"error_rates": {"list": {"probability": 0.1, "kind": "weird"}}}"#
        )
        .is_err()
    );

    let bad = MemoryConfig {
        error_rates: ErrorRates {
            create: Some(ErrorRate {
                probability: 1.5,
                kind: ErrorKind::Transient,
            }),
            ..ErrorRates::default()
        },
        ..MemoryConfig::default()
    };
    let e = MemoryCloud::new(bad).unwrap_err();
    assert!(e.to_string().contains("error_rates.create"), "{e}");
    let zero = MemoryConfig {
        rate_limit: Some(RateLimitConfig {
            requests: 0,
            period_secs: 3600,
            burst: 1,
        }),
        ..MemoryConfig::default()
    };
    assert!(matches!(
        zero.validate(),
        Err(MemoryConfigError::RateLimit(_))
    ));
    let nothing = MemoryConfig {
        max_concurrent_operations: 0,
        ..MemoryConfig::default()
    };
    assert_eq!(nothing.validate(), Err(MemoryConfigError::Concurrency));
    for bad in [vec!["a", "a"], vec!["a", " "]] {
        let tables = MemoryConfig {
            targets: bad.iter().map(|t| t.to_string()).collect(),
            ..MemoryConfig::default()
        };
        assert!(matches!(
            tables.validate(),
            Err(MemoryConfigError::Targets(_))
        ));
    }
}

#[tokio::test(start_paused = true)]
async fn several_route_tables_keep_their_routes_apart_and_refuse_an_unknown_one() {
    let c = MemoryCloud::new(MemoryConfig {
        targets: vec!["a".into(), "b".into()],
        max_routes: Some(1),
        ..MemoryConfig::default()
    })
    .unwrap();
    assert_eq!(c.targets(), [Text::from("a"), Text::from("b")]);
    let r = Route::from_text("n1", "10.0.1.0/24");
    let in_a = c
        .create_route("k", "u1", &r.clone().in_table("a"))
        .await
        .unwrap();
    assert_eq!(in_a.table.as_str(), "a");
    c.create_route("k", "u1", &r.clone().in_table("b"))
        .await
        .unwrap();
    let full = c
        .create_route(
            "k",
            "u2",
            &Route::from_text("n2", "10.0.2.0/24").in_table("a"),
        )
        .await
        .unwrap_err();
    assert_eq!(
        full.kind,
        ErrorKind::QuotaExceeded,
        "the quota is per table"
    );
    let unknown = c
        .create_route("k", "u1", &r.clone().in_table("c"))
        .await
        .unwrap_err();
    assert_eq!(
        unknown.kind,
        ErrorKind::NotFound,
        "as EC2's InvalidRouteTableID.NotFound: the table may have gone"
    );
    let mut listed: Vec<String> = c
        .list_routes("k")
        .await
        .unwrap()
        .iter()
        .map(|r| r.table.to_string())
        .collect();
    listed.sort();
    assert_eq!(listed, ["a", "b"]);
    c.delete_route("k", &in_a).await.unwrap();
    assert_eq!(c.routes_in("k", "a").len(), 0);
    assert_eq!(c.routes_in("k", "b").len(), 1);
}

#[tokio::test(start_paused = true)]
async fn runtime_error_rate_is_clamped_not_panicking() {
    let c = MemoryCloud::default();
    c.set_error_rate(
        Operation::List,
        Some(ErrorRate {
            probability: f64::NAN,
            kind: ErrorKind::Transient,
        }),
    );
    c.list_routes(C).await.unwrap();
    c.set_error_rate(
        Operation::List,
        Some(ErrorRate {
            probability: 7.0,
            kind: ErrorKind::Transient,
        }),
    );
    assert_eq!(
        c.list_routes(C).await.unwrap_err().kind,
        ErrorKind::Transient
    );
}
