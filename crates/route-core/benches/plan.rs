//! `plan` on clusters of 1,000, 5,000 and 50,000 nodes in steady state: every
//! route present with tracked addresses, except one node in a thousand whose
//! route is missing and a handful of stale routes of deleted nodes.
//!
//! `plan/tables-3` is the 5,000-node cluster with three route tables (AWS,
//! one per zone): every route is in each table, so the planner sees three
//! times the routes; the cost per route is what to compare.
//!
//! Run: `cargo bench -p route-core --bench plan`

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use route_core::{Cidr, NodeAddress, NodeView, PlanConfig, Route, plan};

struct Cluster {
    nodes: Vec<NodeView>,
    routes: Vec<Route>,
    config: PlanConfig,
}

fn v4(i: usize) -> String {
    format!("10.{}.{}.0/24", (i >> 8) & 0xff, i & 0xff)
}

fn v6(i: usize) -> String {
    format!("fd00:0:0:{:x}::/64", i & 0xffff)
}

fn cluster(n: usize, dual_stack: bool) -> Cluster {
    let nodes: Vec<NodeView> = (0..n)
        .map(|i| {
            let name = format!("worker-pool-a-{i:06}");
            let mut cidrs = vec![v4(i)];
            if dual_stack {
                cidrs.push(v6(i));
            }
            let cidrs: Vec<&str> = cidrs.iter().map(String::as_str).collect();
            NodeView::new(
                name.clone(),
                format!("6f1c2d3e-0000-4000-8000-{i:012}"),
                &cidrs,
            )
            .with_addresses(vec![
                NodeAddress::internal_ip(format!("172.16.{}.{}", (i >> 8) & 0xff, i & 0xff)),
                NodeAddress {
                    kind: "Hostname".into(),
                    address: name.into(),
                },
            ])
            .with_provider_id(format!("hcloud://{}", 10_000_000 + i))
            .with_condition("False", "RouteCreated")
        })
        .collect();
    let mut routes = Vec::with_capacity(n * 2);
    for (i, node) in nodes.iter().enumerate() {
        if i % 1000 == 999 {
            continue; // a new node whose route is not there yet
        }
        for (k, c) in node.valid_pod_cidrs().into_iter().enumerate() {
            routes.push(
                Route::new(node.name.clone(), c)
                    .named(format!("k8s-{}-{k}", node.uid))
                    .with_addresses(node.addresses.clone(), true),
            );
        }
    }
    // Stale routes of deleted nodes, inside the cluster CIDR.
    for j in 0..5 {
        routes.push(
            Route::from_text(format!("gone-{j}"), &v4(n + j)).with_addresses(Vec::new(), true),
        );
    }
    // Clouds list in their own order, not node order.
    routes.reverse();
    let mut cluster_cidrs = vec![Cidr::parse("10.0.0.0/8").expect("valid")];
    if dual_stack {
        cluster_cidrs.push(Cidr::parse("fd00::/48").expect("valid"));
    }
    Cluster {
        nodes,
        routes,
        config: PlanConfig {
            cluster_cidrs,
            ..PlanConfig::default()
        },
    }
}

fn bench_plan(c: &mut Criterion) {
    let mut group = c.benchmark_group("plan");
    for (n, dual) in [
        (1_000, false),
        (5_000, false),
        (5_000, true),
        (50_000, false),
    ] {
        let cl = cluster(n, dual);
        // Sanity: the scenario is what it claims to be.
        let p = plan(&cl.nodes, &cl.routes, &cl.config);
        assert_eq!(p.deletions.len(), 5);
        assert_eq!(p.creations.len(), (n / 1000) * if dual { 2 } else { 1 });
        if n >= 50_000 {
            group.sample_size(20);
        }
        group.throughput(Throughput::Elements(n as u64));
        let label = if dual { "dual-stack" } else { "ipv4" };
        group.bench_with_input(BenchmarkId::new(label, n), &cl, |b, cl| {
            b.iter(|| {
                plan(
                    black_box(&cl.nodes),
                    black_box(&cl.routes),
                    black_box(&cl.config),
                )
            })
        });
    }
    // Three route tables: every Node's route in each.
    let base = cluster(5_000, false);
    let tables = ["rtb-a", "rtb-b", "rtb-c"];
    let routes: Vec<Route> = tables
        .iter()
        .flat_map(|t| base.routes.iter().map(move |r| r.clone().in_table(*t)))
        .collect();
    let config = PlanConfig {
        tables: tables.iter().map(|t| (*t).into()).collect(),
        ..base.config.clone()
    };
    let cl = Cluster {
        nodes: base.nodes,
        routes,
        config,
    };
    let p = plan(&cl.nodes, &cl.routes, &cl.config);
    assert_eq!(p.deletions.len(), 15);
    assert_eq!(p.creations.len(), 15);
    group.throughput(Throughput::Elements(5_000));
    group.bench_with_input(BenchmarkId::new("tables-3", 5_000), &cl, |b, cl| {
        b.iter(|| {
            plan(
                black_box(&cl.nodes),
                black_box(&cl.routes),
                black_box(&cl.config),
            )
        })
    });
    group.finish();
}

criterion_group!(benches, bench_plan);
criterion_main!(benches);
