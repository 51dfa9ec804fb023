//! Where a simulated day's CPU goes: the cost of one reconcile pass and of
//! one absorbed heartbeat at a given cluster size, and of the pieces a pass
//! is made of. `cargo run --release -p simulator --example pass_cost -- 5000`.

use std::sync::Arc;
use std::time::Instant;

use provider_memory::MemoryCloud;
use route_cloud::CloudRoutes;
use route_controller::{
    Controller, ControllerConfig, Fence, Mode, NodeEvent, NodeStore, PassKind,
    RecordingStatusWriter, SyncTrigger, Timing,
};
use route_core::{NodeAddress, NodeView, PlanConfig, parse_cluster_cidrs};

// The allocator of the `cloud-route-controller` binary.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn node(i: usize) -> NodeView {
    NodeView::new(
        format!("node-{i:06}"),
        format!("uid-{i:06}"),
        &[&format!("10.{}.{}.0/24", 64 + i / 256, i % 256)],
    )
    .with_addresses(vec![
        NodeAddress::internal_ip(format!("172.16.{}.{}", i / 250, i % 250 + 1)),
        NodeAddress {
            kind: "Hostname".into(),
            address: format!("node-{i:06}").into(),
        },
    ])
    .with_provider_id(format!("sim:///node-{i:06}"))
    .with_condition("False", "RouteCreated")
}

fn per(label: &str, n: u32, f: impl FnMut()) {
    let mut f = f;
    let t = Instant::now();
    for _ in 0..n {
        f();
    }
    println!(
        "{label:<44} {:>10.1} µs",
        t.elapsed().as_secs_f64() * 1e6 / f64::from(n)
    );
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(5000);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("runtime");
    rt.block_on(async {
        let store = NodeStore::new(None);
        store.apply(NodeEvent::Init);
        for i in 0..n {
            store.apply(NodeEvent::InitApply(node(i)));
        }
        store.apply(NodeEvent::InitDone);
        let cfg = |mode| ControllerConfig {
            cluster_name: "kubernetes".into(),
            plan: PlanConfig {
                cluster_cidrs: parse_cluster_cidrs("10.64.0.0/10").expect("cidr"),
                ..PlanConfig::default()
            },
            mode,
            timing: Timing {
                period: std::time::Duration::from_secs(10),
                min_interval: std::time::Duration::from_secs(10),
                resync: std::time::Duration::from_secs(12 * 3600),
                discovery: route_controller::schedule::DEFAULT_DISCOVERY_PERIOD,
                drift: std::time::Duration::ZERO,
            },
            backoff: Default::default(),
            status_concurrency: 10,
            deletion_grace: route_controller::controller::DEFAULT_DELETION_GRACE,
            bounds: route_controller::bounds::Bounds::NONE,
        };
        let mut last_cloud = None;
        for mode in [Mode::Periodic, Mode::Incremental] {
            let cloud = MemoryCloud::default();
            let status = Arc::new(RecordingStatusWriter::default());
            let mut ctl = Controller::new(
                cfg(mode),
                store.clone(),
                Arc::new(cloud.clone()) as Arc<dyn CloudRoutes>,
                status,
                Fence::default(),
                None,
            );
            // The first pass creates every route; later ones find nothing to do.
            ctl.pass(PassKind::Full, SyncTrigger::Periodic).await;
            println!("{n} nodes, every route in place, mode {}:", mode.as_str());
            let t = Instant::now();
            for _ in 0..20 {
                ctl.pass(PassKind::Full, SyncTrigger::Periodic).await;
            }
            println!(
                "{:<44} {:>10.1} µs",
                "  Controller::pass, full (list + plan)",
                t.elapsed().as_secs_f64() * 1e6 / 20.0
            );
            if mode.caches_route_table() {
                let t = Instant::now();
                for _ in 0..20 {
                    ctl.pass(PassKind::Cached, SyncTrigger::NodeChange).await;
                }
                println!(
                    "{:<44} {:>10.1} µs",
                    "  Controller::pass, cached (plan only)",
                    t.elapsed().as_secs_f64() * 1e6 / 20.0
                );
            }
            last_cloud = Some(cloud);
        }
        let cloud = last_cloud.expect("both modes ran");
        let views = store.snapshot();
        let routes = cloud.routes("kubernetes");
        let plan_cfg = cfg(Mode::Incremental).plan;
        println!("pieces of a pass:");
        per("  NodeStore::snapshot", 20, || drop(store.snapshot()));
        per("  copy of the route table (list / cache)", 20, || {
            drop(routes.clone())
        });
        per("  route_core::plan", 20, || {
            drop(route_core::plan(&views, &routes, &plan_cfg))
        });
        let hb = node(n / 2);
        per("one absorbed heartbeat (NodeStore::apply)", 100_000, || {
            store.apply(NodeEvent::Apply(hb.clone()))
        });
    });
}
