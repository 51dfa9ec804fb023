//! `cloud-route-controller cleanup` against a cloud-sim server with three
//! route tables: a dry run lists exactly the cluster's routes in every table
//! and changes nothing; `--yes` deletes them and leaves every foreign route
//! (outside the cluster CIDRs, another cluster's, a table not this
//! cluster's) where it was.

mod common;

use std::process::Stdio;
use std::time::Duration;

use cloud_sim::SimServer;
use common::{TempDir, binary, sim_cloud_config};
use provider_memory::{MemoryConfig, Operation};
use route_core::Route;

const CLUSTER: &str = "kubernetes";
const TABLES: [&str; 3] = ["rtb-a", "rtb-b", "rtb-c"];

async fn cleanup(config: &std::path::Path, extra: &[&str]) -> (bool, String) {
    let out = tokio::process::Command::new(binary())
        .arg("cleanup")
        .args([
            "--cluster-cidr",
            "10.244.0.0/16",
            "--cloud-provider",
            "memory",
        ])
        .arg("--cloud-config")
        .arg(config)
        .args(extra)
        .stdin(Stdio::null())
        .output();
    let out = tokio::time::timeout(Duration::from_secs(60), out)
        .await
        .expect("cleanup finished within 60 s")
        .expect("run cleanup");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.is_empty() || !stderr.contains("panicked"),
        "{stderr}"
    );
    (out.status.success(), stdout)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleanup_removes_the_clusters_routes_from_every_table_and_only_with_yes() {
    let sim = SimServer::start_local(MemoryConfig {
        targets: TABLES
            .iter()
            .map(|t| t.to_string())
            .chain(["rtb-other".into()])
            .collect(),
        ..MemoryConfig::default()
    })
    .await
    .expect("start cloud-sim");
    let cloud = sim.cloud();
    for t in TABLES {
        for i in 0..3 {
            cloud.insert_route(
                CLUSTER,
                Route::from_text(format!("n{i}"), &format!("10.244.{i}.0/24")).in_table(t),
            );
        }
        // A VPN route in the same table, outside the cluster CIDR.
        cloud.insert_route(
            CLUSTER,
            Route::from_text("vpn", "192.168.7.0/24")
                .named(format!("vpn-{t}"))
                .in_table(t),
        );
        // Another cluster's route for the same range.
        cloud.insert_route("other", Route::from_text("n0", "10.244.0.0/24").in_table(t));
    }
    let dir = TempDir::new("cleanup");
    let config = sim_cloud_config(dir.path(), "cloud.yaml", &sim.url(), None);
    let before = cloud.routes(CLUSTER).len();
    assert_eq!(before, 3 * 4);

    let (ok, out) = cleanup(&config, &[]).await;
    assert!(ok, "{out}");
    assert!(out.contains("9 route(s) owned by this cluster"), "{out}");
    assert!(out.contains("run again with --yes"), "{out}");
    for t in TABLES {
        assert_eq!(out.matches(t).count(), 3, "three routes of {t}: {out}");
    }
    assert!(!out.contains("192.168.7.0/24"), "{out}");
    assert_eq!(
        cloud.routes(CLUSTER).len(),
        before,
        "a dry run changes nothing"
    );
    assert!(
        cloud.log().iter().all(|c| c.op == Operation::List),
        "a dry run only lists"
    );

    let (ok, out) = cleanup(&config, &["--yes"]).await;
    assert!(ok, "{out}");
    assert!(out.contains("Deleted 9 of 9 routes."), "{out}");
    let left: Vec<String> = cloud
        .routes(CLUSTER)
        .iter()
        .map(|r| r.destination.to_string())
        .collect();
    assert_eq!(left, ["192.168.7.0/24"; 3], "only the VPN routes are left");
    assert_eq!(
        cloud.routes("other").len(),
        3,
        "another cluster's routes stay"
    );

    let (ok, out) = cleanup(&config, &["--yes"]).await;
    assert!(ok && out.contains("0 route(s) owned"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleanup_without_a_cluster_cidr_is_refused_with_exit_status_2() {
    let out = tokio::process::Command::new(binary())
        .args(["cleanup", "--cloud-provider", "memory"])
        .output()
        .await
        .expect("run cleanup");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--cluster-cidr is required"), "{stderr}");
}
