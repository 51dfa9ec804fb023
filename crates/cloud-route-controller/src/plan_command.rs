//! `plan`: what the controller would change right now, without changing it.
//!
//! Reads every Node and lists the cloud's routes once, runs the same planner
//! and gate the controller runs, and prints the result: each operation with
//! the verdict a freshly started controller's first pass would give it (run,
//! held for the deletion grace, no room under the route limit, blocked).
//! Only read calls are made, so an operator can run it before switching from
//! the built-in route controller.

use std::fmt::Write as _;
use std::process::ExitCode;

use anyhow::Context as _;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::ListParams;
use route_controller::nodes::node_view_selected;
use route_core::{Plan, PlanConfig};
use serde::Serialize;

use crate::cli::{Output, PlanArgs};
use crate::{kube_client, providers};

#[derive(Serialize)]
struct Report<'a> {
    cluster_name: &'a str,
    nodes: usize,
    routes: usize,
    /// The route targets (tables, routers) the routes are kept in; empty for
    /// a provider with a single table.
    targets: Vec<String>,
    plan: &'a Plan,
    /// What a freshly started controller's first pass would do with each
    /// operation, in plan order (deletions, then creations).
    first_pass: Vec<FirstPass>,
    conditions: Vec<ConditionChange<'a>>,
    /// Nodes whose forwarding prerequisite is off: the cloud drops the pod
    /// traffic they forward even with every route in place.
    forwarding: Vec<ForwardingGap>,
    /// Every Node's `NetworkUnavailable` reason once the first pass ran.
    node_reasons: Vec<NodeReason>,
    /// Routes missing although their Node reads `RouteCreated`: changed
    /// behind the controller's back since it last looked (or it is not
    /// running). Its next drift check repairs them.
    drift: Vec<DriftFound>,
    /// What the controller's drift checks repaired lately: its
    /// `RouteRepaired` and `ForwardingRepaired` Warnings, newest first.
    recent_repairs: Vec<Repair>,
    /// Why `recent_repairs` could not be read, if it could not (the
    /// controller's own ServiceAccount may not list Events): the section
    /// is unknown then, not empty.
    #[serde(skip_serializing_if = "Option::is_none")]
    recent_repairs_unreadable: Option<String>,
}

#[derive(Serialize)]
struct DriftFound {
    node: String,
    destination: String,
    /// The route table; empty for a provider with one.
    table: String,
}

#[derive(Serialize)]
struct Repair {
    node: String,
    reason: String,
    message: String,
    /// When it was last seen (RFC 3339), and how often.
    last_seen: Option<String>,
    count: i32,
}

/// How many of the latest repairs `plan` shows.
const RECENT_REPAIRS: usize = 20;

#[derive(Serialize)]
struct NodeReason {
    node: String,
    /// The reason (one of the controller's closed set), or `null` for a
    /// Node outside `--node-selector` that was never a route controller's:
    /// its condition is left as it is.
    reason: Option<&'static str>,
    /// The condition as it is now, `status/reason`.
    current: Option<String>,
}

#[derive(Serialize)]
struct ForwardingGap {
    node: String,
    what: String,
    fix: String,
    /// The controller turns it back on itself (AWS); otherwise the Node's
    /// condition will say `ForwardingDisabled` until the operator fixes it.
    repaired_by_controller: bool,
}

#[derive(Serialize)]
struct FirstPass {
    operation: String,
    runs: bool,
    verdict: String,
}

#[derive(Serialize)]
struct ConditionChange<'a> {
    node: &'a str,
    status: &'static str,
    reason: &'static str,
    current: Option<String>,
}

pub async fn plan(args: PlanArgs) -> anyhow::Result<ExitCode> {
    let cidrs = args.cluster.cluster_cidrs()?;
    let selector = args.cluster.node_selector()?;
    let skip_families = args.cluster.skip_families()?;
    let client = kube_client::client(&args.cluster).await?;
    let cloud = providers::build(
        args.cluster.cloud_provider(),
        &args.cluster.cloud_config,
        "plan",
        // `plan` only reads: a closed fence makes sure of it.
        &route_cloud::Fence::new(false),
    )
    .await?;
    let mut nodes: Vec<_> = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .context("listing Nodes")?
        .items
        .iter()
        .map(|n| std::sync::Arc::new(node_view_selected(n, &selector)))
        .collect();
    // Providers that recognise their routes by the Nodes (AWS instance ids,
    // OpenStack next hops) must see them before listing, as in `run`.
    cloud.observe_nodes(&nodes);
    let routes = cloud
        .list_routes(&args.cluster.cluster_name)
        .await
        .context("listing the cloud's routes")?;
    let forwarding = forwarding_gaps(&*cloud, &args.cluster.cluster_name, &mut nodes).await?;
    let plan = route_core::plan(
        &nodes,
        &routes,
        &PlanConfig {
            cluster_cidrs: cidrs,
            needs: cloud.capabilities().needs,
            replace_blackholes: cloud.capabilities().replaces_blackholes,
            tables: cloud.targets(),
            skip_families,
        },
    );
    let (first_pass, room_left) = first_pass(
        &plan,
        &routes,
        &*cloud,
        args.route_deletion_grace,
        args.max_route_deletions,
    );
    let node_reasons = node_reasons(&nodes, &plan, &room_left);
    let conditions: Vec<ConditionChange<'_>> = plan
        .conditions_if_all_succeed()
        .map(|(n, c)| ConditionChange {
            node: &n.node,
            status: c.status(),
            reason: c.reason(),
            current: n
                .current
                .as_ref()
                .map(|c| format!("{}/{}", c.status, c.reason)),
        })
        .collect();
    let drift = drift_found(&plan);
    let (recent_repairs, recent_repairs_unreadable) = recent_repairs(client).await;
    let report = Report {
        cluster_name: &args.cluster.cluster_name,
        nodes: nodes.len(),
        routes: routes.len(),
        targets: cloud.targets().iter().map(|t| t.to_string()).collect(),
        plan: &plan,
        first_pass,
        conditions,
        forwarding,
        node_reasons,
        drift,
        recent_repairs,
        recent_repairs_unreadable,
    };
    let out = match args.output {
        Output::Json => serde_json::to_string_pretty(&report)? + "\n",
        Output::Table => table(&report),
    };
    print!("{out}");
    Ok(if args.exit_code && !in_step(&report) {
        ExitCode::from(CHANGES_PENDING)
    } else {
        ExitCode::SUCCESS
    })
}

/// `plan --exit-code`'s status when the plan is not "no change needed":
/// 1 and 2 are taken by errors and bad flags.
pub const CHANGES_PENDING: u8 = 3;

/// The cloud and the Nodes are as `run` would leave them: nothing to
/// create, delete or write, nothing in conflict, left out or waiting.
fn in_step(r: &Report<'_>) -> bool {
    let p = r.plan;
    p.is_noop()
        && r.conditions.is_empty()
        && p.conflicts.is_empty()
        && p.outside_cluster.is_empty()
        && p.awaiting_node_data.is_empty()
        && r.forwarding.is_empty()
}

/// The planned creations whose Node reads `RouteCreated`: a route it had is
/// gone (pure).
fn drift_found(plan: &Plan) -> Vec<DriftFound> {
    let routed: std::collections::HashSet<&str> = plan
        .nodes
        .iter()
        .filter(|n| route_core::NetworkCondition::RouteCreated.already_set(n.current.as_ref()))
        .map(|n| n.node.as_str())
        .collect();
    plan.creations
        .iter()
        .filter(|c| c.replaces.is_none() && routed.contains(c.route.node.as_str()))
        .map(|c| DriftFound {
            node: c.route.node.to_string(),
            destination: c.route.destination.to_string(),
            table: c.route.table.to_string(),
        })
        .collect()
}

/// The controller's latest drift repairs, from its Warning Events (API
/// reads only). An API server that refuses the read costs the section, not
/// the plan, and says why in its place.
async fn recent_repairs(client: kube::Client) -> (Vec<Repair>, Option<String>) {
    use k8s_openapi::api::core::v1::Event;
    let events: Api<Event> = Api::namespaced(client, "default");
    let mut out = Vec::new();
    let mut unreadable = None;
    for reason in ["RouteRepaired", "ForwardingRepaired"] {
        let params = ListParams::default().fields(&format!(
            "reason={reason},source={}",
            route_controller::status::EVENT_COMPONENT
        ));
        match events.list(&params).await {
            Ok(list) => out.extend(list.items.into_iter().map(|e| {
                let last = e
                    .last_timestamp
                    .as_ref()
                    .map(|t| t.0.to_string())
                    .or_else(|| e.event_time.as_ref().map(|t| t.0.to_string()));
                Repair {
                    node: e.involved_object.name.unwrap_or_default(),
                    reason: reason.to_string(),
                    message: e.message.unwrap_or_default(),
                    last_seen: last,
                    count: e.count.unwrap_or(1),
                }
            })),
            Err(e) => {
                tracing::debug!(error = %e, reason, "could not read the controller's repair Events");
                unreadable = Some(events_unreadable(&e));
                break;
            }
        }
    }
    if unreadable.is_some() {
        out.clear();
    }
    out.sort_by(|a, b| b.last_seen.cmp(&a.last_seen));
    out.truncate(RECENT_REPAIRS);
    (out, unreadable)
}

/// What the repairs section says when the Events cannot be listed. The
/// controller's ServiceAccount may only create and patch Events (least
/// privilege), so `plan` run in its pod lands here.
fn events_unreadable(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(a) if a.code == 403 => {
            "could not read Events: forbidden — run plan with your own kubeconfig to see repairs"
                .into()
        }
        e => format!("could not read Events: {e}"),
    }
}

/// The gate's verdicts for a controller that starts now, with no failures
/// behind it and no hold begun: the deletion grace, the route limit,
/// `--max-route-deletions` and the order between deletions and creations.
fn first_pass(
    plan: &Plan,
    routes: &[route_core::Route],
    cloud: &dyn route_cloud::CloudRoutes,
    grace: std::time::Duration,
    deletions: route_controller::bounds::Budget,
) -> (Vec<FirstPass>, std::collections::HashSet<route_core::OpKey>) {
    use route_controller::gate::{Holds, Room, gate};
    use route_controller::{BackoffConfig, retry::RetryBook};
    let backoff = BackoffConfig::default();
    let mut holds = Holds::new(grace, backoff.max);
    let caps = cloud.capabilities();
    let room = Room::new(caps.max_routes, caps.max_routes_per_family, routes)
        .with_unlisted(cloud.unlisted_routes())
        .with_deletion_budget(deletions, routes);
    let now = tokio::time::Instant::now();
    let gated = gate(plan, &mut holds, &RetryBook::new(backoff), &room, now, true);
    let no_room = gated
        .iter()
        .filter(|(_, v)| matches!(v, route_controller::gate::Verdict::NoRoom { .. }))
        .map(|(k, _)| k.clone())
        .collect();
    let passes = plan
        .deletions
        .iter()
        .map(|d| d.key())
        .chain(plan.creations.iter().map(|c| c.key()))
        .map(|key| {
            let (runs, verdict) = gated
                .verdict(&key)
                .map_or((false, "not gated".into()), |v| (v.runs(), v.describe(now)));
            FirstPass {
                operation: key.to_string(),
                runs,
                verdict,
            }
        })
        .collect();
    (passes, no_room)
}

/// Every Node's reason once a first pass whose creations all run succeeded,
/// except those the route limit refuses.
fn node_reasons(
    nodes: &[std::sync::Arc<route_core::NodeView>],
    plan: &Plan,
    no_room: &std::collections::HashSet<route_core::OpKey>,
) -> Vec<NodeReason> {
    use route_core::NetworkCondition;
    let planned: std::collections::HashMap<&str, &route_core::NodePlan> =
        plan.nodes.iter().map(|o| (o.node.as_str(), o)).collect();
    nodes
        .iter()
        .map(|n| {
            let current = n.network_unavailable.as_ref();
            let reason = match planned.get(n.name.as_str()) {
                Some(o) => Some(
                    o.condition_given(|k| {
                        no_room
                            .contains(k)
                            .then_some(NetworkCondition::RouteQuotaExceeded)
                    })
                    .unwrap_or_else(|| o.planned())
                    .reason(),
                ),
                None if n.excluded && !n.leaving() => None,
                None => current
                    .and_then(|c| NetworkCondition::from_reason(&c.reason))
                    .map(NetworkCondition::reason),
            };
            NodeReason {
                node: n.name.clone(),
                reason,
                current: current.map(|c| format!("{}/{}", c.status, c.reason)),
            }
        })
        .collect()
}

/// Reads every routable Node's forwarding prerequisite afresh, without
/// repairing anything, and marks the views of those the controller cannot
/// fix, so the planned conditions say `ForwardingDisabled` as `run` would.
async fn forwarding_gaps(
    cloud: &dyn route_cloud::CloudRoutes,
    cluster: &str,
    nodes: &mut [std::sync::Arc<route_core::NodeView>],
) -> anyhow::Result<Vec<ForwardingGap>> {
    use route_cloud::{Forwarding, ForwardingCheck};
    if !cloud.capabilities().checks_forwarding {
        return Ok(Vec::new());
    }
    let routable: Vec<_> = nodes
        .iter()
        .filter(|n| !n.pod_cidrs.is_empty() && !n.deleting)
        .cloned()
        .collect();
    let check = ForwardingCheck {
        fresh: true,
        repair: false,
    };
    let answers = cloud
        .check_forwarding(cluster, &routable, check)
        .await
        .context("checking the Nodes' forwarding prerequisites")?;
    let mut gaps = Vec::new();
    for (node, answer) in answers {
        let gap = match answer {
            Forwarding::Ready | Forwarding::Repaired { .. } => continue,
            Forwarding::WouldRepair { what } => ForwardingGap {
                node,
                what,
                fix: "the controller turns it back on when it runs".into(),
                repaired_by_controller: true,
            },
            Forwarding::Disabled { what, fix } => ForwardingGap {
                node,
                what,
                fix,
                repaired_by_controller: false,
            },
        };
        if !gap.repaired_by_controller
            && let Some(v) = nodes.iter_mut().find(|v| v.name == gap.node)
        {
            std::sync::Arc::make_mut(v).forwarding_disabled = true;
        }
        gaps.push(gap);
    }
    gaps.sort_by(|a, b| a.node.cmp(&b.node));
    Ok(gaps)
}

fn table(r: &Report<'_>) -> String {
    let mut s = String::new();
    let p = r.plan;
    let _ = writeln!(
        s,
        "Cluster {}: {} nodes, {} cloud routes. Nothing has been changed.\n",
        r.cluster_name, r.nodes, r.routes
    );
    if !r.targets.is_empty() {
        let _ = writeln!(
            s,
            "Route targets ({}): {}\n",
            r.targets.len(),
            r.targets.join(", ")
        );
    }
    if in_step(r) {
        let _ = writeln!(s, "The cloud and the Nodes are in step: no change needed.");
    }
    if !p.deletions.is_empty() {
        let _ = writeln!(s, "ROUTES TO DELETE ({})", p.deletions.len());
        let _ = writeln!(
            s,
            "  {:<40} {:<24} {:<30} {:<18} FIRST PASS",
            "NAME", "DESTINATION", "TARGET NODE", "REASON"
        );
        for (d, first) in p.deletions.iter().zip(&r.first_pass) {
            let _ = writeln!(
                s,
                "  {:<40} {:<24} {:<30} {:<18} {}",
                d.route.name,
                d.route.destination.to_string(),
                if d.route.node.is_empty() {
                    "-"
                } else {
                    &d.route.node
                },
                format!("{:?}", d.reason),
                first.verdict
            );
        }
        s.push('\n');
    }
    if !p.creations.is_empty() {
        let _ = writeln!(s, "ROUTES TO CREATE ({})", p.creations.len());
        let _ = writeln!(
            s,
            "  {:<24} {:<30} {:<20} {:<18} FIRST PASS",
            "DESTINATION", "TARGET NODE", "AFTER DELETION", "REASON"
        );
        let firsts = r.first_pass.iter().skip(p.deletions.len());
        for (c, first) in p.creations.iter().zip(firsts) {
            let after = if c.after.is_empty() {
                "-".to_string()
            } else {
                c.after
                    .iter()
                    .filter_map(|k| p.deletions.iter().find(|d| d.key() == *k))
                    .map(|d| d.route.name.to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            };
            let _ = writeln!(
                s,
                "  {:<24} {:<30} {:<20} {:<18} {}",
                c.route.destination.to_string(),
                c.route.node,
                after,
                format!("{:?}", c.reason),
                first.verdict
            );
        }
        s.push('\n');
    }
    if !r.conditions.is_empty() {
        let _ = writeln!(
            s,
            "NODE CONDITIONS TO SET, if every creation succeeds ({})",
            r.conditions.len()
        );
        for c in &r.conditions {
            let want = format!("NetworkUnavailable={}/{}", c.status, c.reason);
            let _ = writeln!(
                s,
                "  {:<30} {:<40} (now: {})",
                c.node,
                want,
                c.current.as_deref().unwrap_or("not set")
            );
        }
        s.push('\n');
    }
    if !r.forwarding.is_empty() {
        let _ = writeln!(
            s,
            "FORWARDING PREREQUISITES MISSING ({}): the cloud drops the pod traffic these Nodes forward",
            r.forwarding.len()
        );
        for g in &r.forwarding {
            let _ = writeln!(
                s,
                "  {:<30} {}\n  {:<30} fix: {}",
                g.node, g.what, "", g.fix
            );
        }
        s.push('\n');
    }
    if !r.node_reasons.is_empty() {
        let mut counts: std::collections::BTreeMap<&str, usize> = Default::default();
        for n in &r.node_reasons {
            *counts.entry(n.reason.unwrap_or("left out")).or_default() += 1;
        }
        let summary: Vec<String> = counts.iter().map(|(k, v)| format!("{k} {v}")).collect();
        let _ = writeln!(s, "NODES BY REASON: {}", summary.join(", "));
        for n in r
            .node_reasons
            .iter()
            .filter(|n| n.reason != Some("RouteCreated"))
        {
            let _ = writeln!(
                s,
                "  {:<30} {:<20} (now {})",
                n.node,
                n.reason
                    .unwrap_or("left out: outside --node-selector, condition untouched"),
                n.current.as_deref().unwrap_or("not set")
            );
        }
        s.push('\n');
    }
    for o in &p.overlaps {
        let _ = writeln!(
            s,
            "OVERLAP: node {} has pod CIDR {}, which overlaps route {} of {}; no route will be created for it",
            o.node, o.cidr, o.route, o.owner
        );
    }
    for c in &p.conflicts {
        let _ = writeln!(
            s,
            "CONFLICT: pod CIDR {} is claimed by {}; no route will be created for it",
            c.cidr,
            c.nodes.join(", ")
        );
    }
    for o in &p.outside_cluster {
        let _ = writeln!(
            s,
            "OUTSIDE CLUSTER CIDR: node {} has pod CIDR {}; no route will be created for it",
            o.node, o.cidr
        );
    }
    for a in &p.awaiting_node_data {
        let _ = writeln!(
            s,
            "WAITING FOR NODE DATA: node {} has pod CIDR {} but no {} yet; its route is created when it arrives",
            a.node, a.cidr, a.missing
        );
    }
    for i in &p.invalid_pod_cidrs {
        let _ = writeln!(s, "INVALID POD CIDR: node {} has {:?}", i.node, i.text);
    }
    for u in &p.unparsable_routes {
        let _ = writeln!(
            s,
            "IGNORED CLOUD ROUTE (unparsable destination): {} {}",
            u.name, u.destination
        );
    }
    if !r.drift.is_empty() {
        let _ = writeln!(
            s,
            "\nDRIFT ({}): routes missing although their Node reads RouteCreated; changed behind the controller's back since it last looked (its next drift check creates them again), or it is not running",
            r.drift.len()
        );
        for d in &r.drift {
            let table = if d.table.is_empty() {
                String::new()
            } else {
                format!(" in {}", d.table)
            };
            let _ = writeln!(s, "  {} {}{table}", d.node, d.destination);
        }
    }
    if let Some(why) = &r.recent_repairs_unreadable {
        let _ = writeln!(s, "\nREPAIRED BY THE DRIFT CHECK: ({why})");
    } else if !r.recent_repairs.is_empty() {
        let _ = writeln!(
            s,
            "\nREPAIRED BY THE DRIFT CHECK (latest {}, from the controller's Warning Events):",
            r.recent_repairs.len()
        );
        for e in &r.recent_repairs {
            let _ = writeln!(
                s,
                "  {} {} {} (x{}): {}",
                e.last_seen.as_deref().unwrap_or("-"),
                e.node,
                e.reason,
                e.count,
                e.message
            );
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The controller's ServiceAccount may not list Events: `plan` in its
    /// pod says why the repairs section is unknown instead of showing it
    /// empty.
    #[test]
    fn repairs_that_cannot_be_read_are_said_so_not_shown_empty() {
        let forbidden = kube::Error::Api(Box::new(kube::core::Status {
            code: 403,
            ..Default::default()
        }));
        let why = events_unreadable(&forbidden);
        assert_eq!(
            why,
            "could not read Events: forbidden — run plan with your own kubeconfig to see repairs"
        );
        let plan = Plan::default();
        let report = Report {
            cluster_name: "kubernetes",
            nodes: 0,
            routes: 0,
            targets: Vec::new(),
            plan: &plan,
            first_pass: Vec::new(),
            conditions: Vec::new(),
            forwarding: Vec::new(),
            node_reasons: Vec::new(),
            drift: Vec::new(),
            recent_repairs: Vec::new(),
            recent_repairs_unreadable: Some(why.clone()),
        };
        let text = table(&report);
        assert!(
            text.contains(&format!("REPAIRED BY THE DRIFT CHECK: ({why})")),
            "{text}"
        );
        let json = serde_json::to_value(&report).expect("json");
        assert_eq!(json["recent_repairs_unreadable"], why.as_str());
    }
}
