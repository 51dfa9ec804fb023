//! `run`: wires the watcher, the reconcile loop, leader election and the HTTP
//! endpoint together, and owns the process lifecycle (signals, grace period,
//! exit codes).

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use prometheus_client::registry::Registry;
use route_cloud::BootClock;
use route_controller::leader::{self, KubeLeases, LeaseConfig};
use route_controller::{
    BackoffConfig, Controller, ControllerConfig, Fence, KubeStatusWriter, Metrics, NodeStore,
    Timing, pick_resync,
};
use route_core::PlanConfig;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::cli::RunArgs;
use crate::health::Health;
use crate::{http, kube_client, providers, secure};

/// KEP-5237's least time between two full passes.
const MIN_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);

pub async fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    if !args.configure_cloud_routes {
        return routes_off(&args).await;
    }
    let mode = args.mode()?;
    let cluster_cidrs = args.cluster.cluster_cidrs()?;
    let identity = identity(&args);
    let client = kube_client::client(&args.cluster).await?;
    // With an election, mutations are allowed only until each renewal's
    // deadline; the election task extends it.
    let fence = if args.leader.leader_elect {
        Fence::leased(Arc::new(BootClock::new()))
    } else {
        Fence::new(false)
    };
    let cloud = providers::build(
        args.cluster.cloud_provider(),
        &args.cluster.cloud_config,
        &identity,
        &fence,
    )
    .await?;
    let resync = pick_resync(args.min_resync_period, rand::random::<f64>());
    info!(
        mode = mode.as_str(),
        provider = cloud.name(),
        cluster = %args.cluster.cluster_name,
        cluster_cidrs = %cluster_cidrs.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(","),
        resync = ?resync,
        drift_check = ?args.route_drift_check_period,
        identity = %identity,
        dry_run = args.dry_run,
        "starting cloud-route-controller"
    );
    if args.dry_run {
        info!(
            lease = %args.lease_name(),
            "dry run: nothing is written: no route change, no forwarding prerequisite repair, no Node condition, no Event; what would change is logged as \"dry run: would ...\" and exported as route_controller_dry_run_*"
        );
    }

    let mut registry = Registry::default();
    let metrics = Metrics::register(&mut registry, cloud.clone());
    Metrics::register_fence(&mut registry, fence.clone());
    if args.dry_run {
        metrics.register_dry_run(&mut registry);
    }
    let nodes = NodeStore::new(Some(metrics.clone()));
    let first_sync = Arc::new(AtomicBool::new(false));
    let config_alarm = route_controller::ConfigAlarm::default();
    let health = Health::new(
        nodes.clone(),
        first_sync.clone(),
        fence.clone(),
        config_alarm.clone(),
    );
    let shutdown = CancellationToken::new();

    let app = http::router(Arc::new(registry), health.clone());
    let mut http_tasks = Vec::new();
    if let Some(secure) = args.serving.secure() {
        let (bound, task) =
            secure::serve(secure, client.clone(), app.clone(), shutdown.clone()).await?;
        info!(address = %bound, "serving /metrics (authenticated and authorized by the API server), /healthz, /livez and /readyz over HTTPS");
        http_tasks.push(task);
    }
    if let Some(addr) = args.plain_metrics_address()? {
        let (bound, task) = http::serve(addr, app, shutdown.clone()).await?;
        if bound.ip().is_loopback() {
            info!(address = %bound, "serving /metrics, /healthz, /livez and /readyz as plain HTTP (--metrics-bind-address)");
        } else {
            warn!(address = %bound, "serving /metrics as plain HTTP without authentication on a non-loopback address (--metrics-bind-address): anyone who reaches it reads the metrics; the secure port (--secure-port) authenticates");
        }
        http_tasks.push(task);
    }

    // Leadership: either a Lease, or always leader.
    let (leader_tx, leader_rx) = watch::channel(!args.leader.leader_elect);
    let leader_task = if args.leader.leader_elect {
        let cfg = LeaseConfig {
            namespace: lease_namespace(&args),
            name: args.lease_name(),
            identity: identity.clone(),
            lease_duration: args.leader.leader_elect_lease_duration,
            renew_deadline: args.leader.leader_elect_renew_deadline,
            retry_period: args.leader.leader_elect_retry_period,
        };
        info!(lease = %format!("{}/{}", cfg.namespace, cfg.name), "waiting for leadership");
        // A client of its own, as kube-controller-manager's
        // `leader-election` client: its own rate limit and connections, so
        // no amount of status, Event or watch traffic queues a renewal.
        let lease_client = kube_client::client(&args.cluster).await?;
        let leases = KubeLeases::new(lease_client, &cfg.namespace, &cfg.name);
        Some(tokio::spawn(leader::run(
            leases,
            cfg,
            leader_tx.clone(),
            fence.clone(),
            shutdown.clone(),
        )))
    } else {
        // Leader for the life of the process; the sender lives until the end.
        None
    };

    // The fence follows leadership directly, not only between passes: a
    // replica that loses its Lease in the middle of a pass starts no further
    // cloud call.
    {
        let mut rx = leader_rx.clone();
        let fence = fence.clone();
        tokio::spawn(async move {
            loop {
                fence.set_leader(*rx.borrow_and_update());
                if rx.changed().await.is_err() {
                    return;
                }
            }
        });
    }
    let selector = args.cluster.node_selector()?;
    let skip_families = args.cluster.skip_families()?;
    if !selector.is_everything() {
        info!(selector = %selector, "routing only the Nodes --node-selector selects; routes to the others are left alone");
    }
    for f in &skip_families {
        info!(family = %f, "not routing this address family (--route-ip-families): its pod CIDRs get no route, its routes are left alone");
    }
    let watch_task = tokio::spawn(route_controller::watch::watch_nodes(
        client.clone(),
        nodes.clone(),
        selector,
        shutdown.clone(),
    ));
    let status = Arc::new(KubeStatusWriter::new(client, identity.clone()));
    let cfg = ControllerConfig {
        cluster_name: args.cluster.cluster_name.clone(),
        plan: PlanConfig {
            cluster_cidrs,
            skip_families,
            ..PlanConfig::default()
        },
        mode,
        timing: Timing {
            period: args.route_reconciliation_period,
            min_interval: MIN_INTERVAL,
            resync,
            discovery: args.route_target_discovery_period,
            drift: args.route_drift_check_period,
        },
        backoff: BackoffConfig::default(),
        status_concurrency: args.concurrent_status_updates,
        deletion_grace: args.route_deletion_grace,
        bounds: route_controller::bounds::Bounds {
            unavailable: args.max_unavailable_nodes,
            deletions: args.max_route_deletions,
        },
    };
    if args.cluster.cloud_provider() == "memory" && !args.unsafe_memory_provider_on_cloud_nodes {
        // After the watch's first list, before the first pass can write a
        // condition; health is served meanwhile.
        info!(
            "waiting for the first Node list to check that no Node runs on a real cloud (--cloud-provider=memory)"
        );
        // `Some` ends the process before the first pass: a signal, or a refusal.
        let early_end = tokio::select! {
            () = nodes.wait_synced() => {
                let views = nodes.snapshot();
                let ids = views
                    .iter()
                    .filter_map(|n| Some((n.name.as_str(), n.provider_id.as_deref()?)));
                providers::memory_refusal(ids).map(|why| Err(anyhow::anyhow!(why)))
            }
            s = wait_for_signal() => {
                info!(signal = s, "shutting down before the first pass");
                Some(Ok(ExitCode::SUCCESS))
            }
        };
        if let Some(end) = early_end {
            shutdown.cancel();
            if let Some(t) = leader_task {
                // Gives the Lease up if it was won meanwhile.
                let _ = tokio::time::timeout(std::time::Duration::from_secs(5), t).await;
            }
            return end;
        }
    }
    let mut controller = Controller::new(cfg, nodes, cloud, status, fence.clone(), Some(metrics))
        .with_first_sync(first_sync)
        .with_config_alarm(config_alarm);
    if args.dry_run {
        controller = controller.with_dry_run();
    }
    let mut controller_task = tokio::spawn(controller.run(leader_rx, shutdown.clone()));

    let mut controller_done = false;
    let signal = wait_for_signal();
    tokio::pin!(signal);
    let mut leader_task = leader_task;
    // A JoinHandle must not be polled again once it has completed.
    let mut leader_done = false;
    let exit = tokio::select! {
        s = &mut signal => {
            info!(signal = s, "shutting down: no new cloud calls; in-flight calls may finish");
            ExitCode::SUCCESS
        }
        r = async { match leader_task.as_mut() { Some(t) => t.await, None => std::future::pending().await } } => {
            leader_done = true;
            match r {
                Ok(Err(e)) => { error!("{e}; exiting so that this replica restarts clean"); ExitCode::FAILURE }
                Ok(Ok(())) => ExitCode::SUCCESS,
                Err(e) => { error!(error = %e, "leader election task failed"); ExitCode::FAILURE }
            }
        }
        r = &mut controller_task => {
            controller_done = true;
            health.task_died.store(true, std::sync::atomic::Ordering::SeqCst);
            error!(result = ?r, "the reconcile loop stopped unexpectedly");
            ExitCode::FAILURE
        }
    };
    fence.stop();
    shutdown.cancel();
    if !controller_done
        && tokio::time::timeout(args.shutdown_grace_period, &mut controller_task)
            .await
            .is_err()
    {
        warn!(grace = ?args.shutdown_grace_period, "cloud calls still in flight after the grace period; exiting anyway");
    }
    // Release the Lease (the election task does so when it sees the shutdown).
    if let Some(t) = leader_task.filter(|_| !leader_done) {
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), t).await;
    }
    let _ = tokio::time::timeout(std::time::Duration::from_secs(2), watch_task).await;
    for t in http_tasks {
        let _ = tokio::time::timeout(std::time::Duration::from_secs(2), t).await;
    }
    drop(leader_tx);
    info!("stopped");
    Ok(exit)
}

/// `--configure-cloud-routes=false`: as a cloud-controller-manager whose
/// route controller is off, the process stays up doing nothing (an exit
/// would only restart it, forever, under a Deployment), serves `/healthz`
/// and `/readyz` as ready, and ends with SIGTERM or SIGINT.
async fn routes_off(args: &RunArgs) -> anyhow::Result<ExitCode> {
    use tokio::signal::unix::{SignalKind, signal};
    // Before anything is said: a signal sent once the line below is logged
    // ends the process cleanly.
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let shutdown = CancellationToken::new();
    let app = http::router(Arc::new(Registry::default()), Health::routes_off());
    let mut http_tasks = Vec::new();
    if let Some(secure) = args.serving.secure() {
        // The secure port asks the API server who may read /metrics.
        match kube_client::client(&args.cluster).await {
            Ok(client) => {
                let (bound, task) =
                    secure::serve(secure, client, app.clone(), shutdown.clone()).await?;
                info!(address = %bound, "serving /healthz, /livez and /readyz over HTTPS");
                http_tasks.push(task);
            }
            Err(e) => {
                warn!(error = %e, "not serving the secure port: no Kubernetes client to authorize its requests");
            }
        }
    }
    if let Some(addr) = args.plain_metrics_address()? {
        let (bound, task) = http::serve(addr, app, shutdown.clone()).await?;
        info!(address = %bound, "serving /healthz, /livez and /readyz as plain HTTP (--metrics-bind-address)");
        http_tasks.push(task);
    }
    info!(
        "will not configure cloud provider routes: --configure-cloud-routes=false; staying up, ready and idle, until SIGTERM"
    );
    let s = tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    };
    info!(signal = s, "stopped");
    shutdown.cancel();
    for t in http_tasks {
        let _ = tokio::time::timeout(std::time::Duration::from_secs(2), t).await;
    }
    Ok(ExitCode::SUCCESS)
}

fn identity(args: &RunArgs) -> String {
    if let Some(id) = &args.leader.leader_elect_identity
        && !id.is_empty()
    {
        return id.clone();
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "cloud-route-controller".into());
    // client-go appends a unique suffix so two processes on one host differ.
    format!("{host}_{:08x}", rand::random::<u32>())
}

fn lease_namespace(args: &RunArgs) -> String {
    args.leader
        .leader_elect_resource_namespace
        .clone()
        .or_else(|| {
            std::fs::read_to_string("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
                .ok()
                .map(|s| s.trim().to_string())
        })
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "kube-system".into())
}

async fn wait_for_signal() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        // Without signal handlers the process can still be killed; never exit early.
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    }
}
