//! `cleanup`: removes every route this cluster owns, from every route table.
//!
//! For a teardown, or before handing the cluster's routes to another route
//! controller. Ownership is the controller's own rule: a route the provider
//! lists for this cluster (its own kind of route, in one of this cluster's
//! route tables) whose destination is inside a `--cluster-cidr`. Routes of
//! other tools, other clusters and other tables are never listed or touched.
//! It prints what it would delete and deletes only with `--yes`; the
//! controller must be stopped first, or it re-creates what is removed.

use std::fmt::Write as _;
use std::process::ExitCode;

use anyhow::Context as _;
use route_cloud::{Batch, CloudRoutes, Fence};
use route_core::{Route, is_responsible_for_route};

use crate::cli::CleanupArgs;
use crate::providers;

pub async fn cleanup(args: CleanupArgs) -> anyhow::Result<ExitCode> {
    let cidrs = args.cluster.cluster_cidrs()?;
    let cluster = args.cluster.cluster_name.as_str();
    // A dry run only reads: a closed fence makes sure of it.
    let fence = Fence::new(args.yes);
    let cloud = providers::build(
        args.cluster.cloud_provider(),
        &args.cluster.cloud_config,
        "cleanup",
        &fence,
    )
    .await?;
    // Teardown: no Node claims any route. Saying so up front lets a
    // provider that attributes routes by Node (OpenStack: next hops in
    // `node_subnets` matching no Node are this cluster's stale routes) list
    // what it owns; without it such a provider lists nothing, since it
    // cannot tell a stranger's next hop from a Node it has not seen yet.
    cloud.observe_nodes(&[]);
    let listed = cloud
        .list_routes(cluster)
        .await
        .context("listing the cloud's routes")?;
    let targets = cloud.targets();
    let owned: Vec<Route> = listed
        .into_iter()
        .filter(|r| targets.is_empty() || targets.contains(&r.table))
        .filter(|r| is_responsible_for_route(&cidrs, &r.destination))
        // Provably another cluster's (an instance tagged for it): not ours
        // to remove, even inside our cluster CIDRs.
        .filter(|r| r.foreign.is_none())
        .collect();
    print!("{}", table(cluster, &owned, args.yes));
    if !args.yes || owned.is_empty() {
        return Ok(ExitCode::SUCCESS);
    }
    let failed = delete_all(&*cloud, cluster, &owned).await;
    for (r, e) in &failed {
        eprintln!(
            "error: could not delete route {} {} in {}: {e}",
            r.name,
            r.destination,
            table_name(r)
        );
    }
    println!(
        "Deleted {} of {} routes.",
        owned.len() - failed.len(),
        owned.len()
    );
    Ok(if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Deletes `routes`: in one batch where the provider takes batches, else
/// one by one (the provider's own rate limiting paces them). Returns the
/// failures; a route already gone counts as deleted.
async fn delete_all<'r>(
    cloud: &dyn CloudRoutes,
    cluster: &str,
    routes: &'r [Route],
) -> Vec<(&'r Route, route_cloud::CloudError)> {
    let gone = |e: &route_cloud::CloudError| e.kind == route_cloud::ErrorKind::NotFound;
    if cloud.capabilities().supports_batch {
        // One deletion per route, in the routes' order: each route is
        // reported with its own deletion's result, taken by its key.
        let batch = Batch::new(routes, &[]);
        return match cloud.apply_batch(cluster, &batch).await {
            Ok(mut results) => routes
                .iter()
                .zip(&batch.delete)
                .filter_map(|(r, (key, _))| {
                    // A deletion the provider did not answer may or may
                    // not have happened: reported, so the operator looks.
                    let res = results.remove(key).unwrap_or_else(|| {
                        Err(route_cloud::CloudError::new(
                            route_cloud::ErrorKind::Timeout,
                            "the provider's batch answer has no result for this deletion",
                        ))
                    });
                    res.err().filter(|e| !gone(e)).map(|e| (r, e))
                })
                .collect(),
            Err(e) => routes.iter().map(|r| (r, e.clone())).collect(),
        };
    }
    let mut failed = Vec::new();
    for r in routes {
        if let Err(e) = cloud.delete_route(cluster, r).await
            && !gone(&e)
        {
            failed.push((r, e));
        }
    }
    failed
}

fn table_name(r: &Route) -> &str {
    if r.table.is_empty() {
        "the route table"
    } else {
        r.table.as_str()
    }
}

fn table(cluster: &str, routes: &[Route], yes: bool) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "Cluster {cluster}: {} route(s) owned by this cluster{}",
        routes.len(),
        if yes {
            "; deleting them."
        } else {
            ". Nothing has been changed; run again with --yes to delete them."
        }
    );
    if routes.is_empty() {
        return s;
    }
    let _ = writeln!(
        s,
        "  {:<24} {:<40} {:<24} {:<30}",
        "TABLE", "NAME", "DESTINATION", "TARGET NODE"
    );
    for r in routes {
        let _ = writeln!(
            s,
            "  {:<24} {:<40} {:<24} {:<30}",
            if r.table.is_empty() { "-" } else { &r.table },
            r.name,
            r.destination.to_string(),
            if r.node.is_empty() { "-" } else { &r.node }
        );
    }
    s
}
