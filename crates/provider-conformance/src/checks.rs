//! The checks of the contract, one `pub async fn` each.
//!
//! Owns what each check does and accepts; `lib` owns the subject and the
//! runner. A check answers `Err` with what it saw instead of panicking, so
//! [`crate::run_all`] can run the others and report every failure by name.
//!
//! Calls a check makes to set the stage or to see the outcome are sent as
//! the controller would; only the follow-ups after a fault or a cancelled
//! call are retried on the retryable classes (throttled, conflict,
//! transient), as the controller retries them too: a fake whose cancelled
//! action still runs may briefly answer "busy".

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use route_cloud::{Batch, CloudError, ErrorKind};
use route_core::{Cidr, Destination, NodeView, Route};

use crate::{Op, Subject};

/// How often a follow-up is retried before the check gives up.
const RETRIES: u32 = 12;

/// Returns `Err(format!(..))` from the check unless `cond` holds.
macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+));
        }
    };
}

/// The `i`-th IPv4 pod CIDR the checks route (inside 10.244.0.0/16).
fn v4(i: u8) -> Cidr {
    let network = IpAddr::V4(Ipv4Addr::new(10, 244, i, 0));
    Cidr::new(network, 24).unwrap_or_else(|e| unreachable!("{network}/24 has no host bits: {e}"))
}

/// The `i`-th IPv6 pod CIDR the checks route (inside fd00:10:244::/56).
fn v6(i: u8) -> Cidr {
    let network = IpAddr::V6(Ipv6Addr::new(0xfd00, 0x10, 0x244, u16::from(i), 0, 0, 0, 0));
    Cidr::new(network, 64).unwrap_or_else(|e| unreachable!("{network}/64 has no host bits: {e}"))
}

/// The route the planner asks for: the Node's name, addresses and provider id.
fn want(node: &NodeView, destination: Cidr) -> Route {
    let mut r =
        Route::new(node.name.as_str(), destination).with_addresses(node.addresses.clone(), false);
    r.node_provider_id = node.provider_id.as_deref().map(Into::into);
    r
}

fn first_node(s: &Subject) -> Result<&NodeView, String> {
    s.nodes
        .first()
        .map(|n| &**n)
        .ok_or_else(|| "the subject has no nodes to route to".to_string())
}

/// Lists as the controller does: the current Nodes first.
async fn list(s: &Subject) -> Result<Vec<Route>, CloudError> {
    s.cloud.observe_nodes(&s.nodes);
    s.cloud.list_routes(&s.cluster).await
}

async fn list_ok(s: &Subject, when: &str) -> Result<Vec<Route>, String> {
    list(s)
        .await
        .map_err(|e| format!("list_routes {when}: {e}"))
}

async fn create(s: &Subject, node: &NodeView, d: Cidr) -> Result<Route, CloudError> {
    s.cloud
        .create_route(&s.cluster, &node.uid, &want(node, d))
        .await
}

async fn create_ok(s: &Subject, node: &NodeView, d: Cidr) -> Result<Route, String> {
    create(s, node, d)
        .await
        .map_err(|e| format!("create_route {d} to {}: {e}", node.name))
}

/// The listed routes for `d`.
fn on(routes: &[Route], d: Cidr) -> Vec<&Route> {
    routes
        .iter()
        .filter(|r| r.destination == Destination::Cidr(d))
        .collect()
}

/// Exactly one listed route for `d`, to `node`, not a blackhole.
fn listed_once<'a>(routes: &'a [Route], d: Cidr, node: &NodeView) -> Result<&'a Route, String> {
    let mine = on(routes, d);
    ensure!(
        mine.len() == 1,
        "the list shows {} routes for {d}, expected one: {routes:?}",
        mine.len()
    );
    let r = mine[0];
    ensure!(
        r.node == node.name,
        "the route for {d} targets node {:?}, expected {:?}: {r:?}",
        r.node,
        node.name
    );
    ensure!(
        !r.blackhole,
        "the route for {d} is listed as a blackhole: {r:?}"
    );
    Ok(r)
}

/// Runs `call` until it answers something other than a retryable class.
async fn settle<T>(mut call: impl AsyncFnMut() -> Result<T, CloudError>) -> Result<T, CloudError> {
    let mut wait = Duration::from_millis(25);
    for _ in 0..RETRIES {
        match call().await {
            Err(e)
                if matches!(
                    e.kind,
                    ErrorKind::Throttled | ErrorKind::Conflict | ErrorKind::Transient
                ) =>
            {
                tokio::time::sleep(e.retry_after.unwrap_or(wait).min(Duration::from_secs(2))).await;
                wait = (wait * 2).min(Duration::from_millis(500));
            }
            r => return r,
        }
    }
    call().await
}

fn kind_of<T>(r: &Result<T, CloudError>) -> Result<(), ErrorKind> {
    r.as_ref().map(|_| ()).map_err(|e| e.kind)
}

/// A created route is listed with its destination and target node, not as
/// a blackhole, and exactly as `create_route` returned it; routes to two
/// nodes keep their targets apart.
pub async fn list_after_create(s: &Subject) -> Result<(), String> {
    let a = first_node(s)?;
    let b = s.nodes.last().map_or(a, |n| &**n);
    let created = create_ok(s, a, v4(1)).await?;
    ensure!(
        created.destination == Destination::Cidr(v4(1)) && created.node == a.name,
        "create_route returned {created:?} for {} to {:?}",
        v4(1),
        a.name
    );
    ensure!(
        !created.blackhole,
        "create_route returned a blackhole: {created:?}"
    );
    let second = create_ok(s, b, v4(2)).await?;
    let listed = list_ok(s, "after two creations").await?;
    // The trait: create_route returns the route "as a later list_routes
    // would show it", so the controller can cache it instead of listing.
    for (created, d, node) in [(&created, v4(1), a), (&second, v4(2), b)] {
        let shown = listed_once(&listed, d, node)?;
        ensure!(
            shown == created,
            "create_route returned {created:?}, the list shows {shown:?}"
        );
    }
    Ok(())
}

/// Deleting a route that is already gone answers `Ok` or `NotFound`, and a
/// later list does not show it.
pub async fn delete_gone(s: &Subject) -> Result<(), String> {
    let a = first_node(s)?;
    create_ok(s, a, v4(3)).await?;
    let listed = list_ok(s, "after the creation").await?;
    let route = listed_once(&listed, v4(3), a)?.clone();
    s.cloud
        .delete_route(&s.cluster, &route)
        .await
        .map_err(|e| format!("the first delete_route of {}: {e}", v4(3)))?;
    let again = s.cloud.delete_route(&s.cluster, &route).await;
    match &again {
        Ok(()) => {}
        Err(e) if e.kind == ErrorKind::NotFound => {}
        Err(e) => {
            return Err(format!(
                "deleting {} again answered {e}, expected Ok or not_found",
                v4(3)
            ));
        }
    }
    let listed = list_ok(s, "after the deletions").await?;
    ensure!(
        on(&listed, v4(3)).is_empty(),
        "the deleted route for {} is still listed: {listed:?}",
        v4(3)
    );
    Ok(())
}

/// Creating a route that already exists answers `Ok` (the route) or
/// `AlreadyExists`, and the table still holds it once.
pub async fn create_existing(s: &Subject) -> Result<(), String> {
    let a = first_node(s)?;
    create_ok(s, a, v4(4)).await?;
    match create(s, a, v4(4)).await {
        Ok(r) => ensure!(
            r.destination == Destination::Cidr(v4(4)) && r.node == a.name,
            "the second create_route of {} returned {r:?}",
            v4(4)
        ),
        Err(e) if e.kind == ErrorKind::AlreadyExists => {}
        Err(e) => {
            return Err(format!(
                "creating {} again answered {e}, expected Ok or already_exists",
                v4(4)
            ));
        }
    }
    let listed = list_ok(s, "after the second creation").await?;
    listed_once(&listed, v4(4), a)?;
    Ok(())
}

/// Every failure the fixture's server can be made to answer reaches the
/// caller as the class the fixture claims; the refused change did not
/// happen; and the next call of the same operation works again.
pub async fn error_classes(s: &Subject) -> Result<(), String> {
    let Some(faults) = &s.faults else {
        return Err("the subject has no fault knobs; exempt error_classes explicitly".into());
    };
    let pairs = faults.injectable();
    ensure!(!pairs.is_empty(), "the fault knobs claim no error classes");
    let a = first_node(s)?;
    for (i, (op, kind)) in pairs.into_iter().enumerate() {
        let d = v4(u8::try_from(100 + i).map_err(|_| "too many fault pairs".to_string())?);
        let what = format!("{op} with an injected {kind}");
        match op {
            Op::List => {
                faults.fail_next(Op::List, kind);
                let got = kind_of(&list(s).await);
                ensure!(got == Err(kind), "{what}: answered {got:?}");
                list(s)
                    .await
                    .map_err(|e| format!("the list after {what}: {e} (sticky?)"))?;
            }
            Op::Create => {
                faults.fail_next(Op::Create, kind);
                let got = kind_of(&create(s, a, d).await);
                ensure!(got == Err(kind), "{what}: answered {got:?}");
                let listed = settle(async || list(s).await)
                    .await
                    .map_err(|e| format!("the list after {what}: {e}"))?;
                ensure!(
                    on(&listed, d).is_empty(),
                    "{what}: the refused route for {d} exists: {listed:?}"
                );
                create(s, a, d)
                    .await
                    .map_err(|e| format!("the create after {what}: {e} (sticky?)"))?;
                // Room for the next pair in a table with a quota.
                let listed = list_ok(s, &format!("after {what} and a retry")).await?;
                let route = listed_once(&listed, d, a)?.clone();
                s.cloud
                    .delete_route(&s.cluster, &route)
                    .await
                    .map_err(|e| format!("deleting {d} after {what}: {e}"))?;
            }
            Op::Delete => {
                create_ok(s, a, d).await?;
                let listed = list_ok(s, &format!("before {what}")).await?;
                let route = listed_once(&listed, d, a)?.clone();
                faults.fail_next(Op::Delete, kind);
                let got = kind_of(&s.cloud.delete_route(&s.cluster, &route).await);
                ensure!(got == Err(kind), "{what}: answered {got:?}");
                let listed = settle(async || list(s).await)
                    .await
                    .map_err(|e| format!("the list after {what}: {e}"))?;
                listed_once(&listed, d, a).map_err(|e| format!("after {what}: {e}"))?;
                s.cloud
                    .delete_route(&s.cluster, &route)
                    .await
                    .map_err(|e| format!("the delete after {what}: {e} (sticky?)"))?;
            }
        }
    }
    Ok(())
}

/// IPv6 works where the capabilities say so, and is refused with
/// `InvalidRequest` (changing nothing) where they do not.
pub async fn ipv6(s: &Subject) -> Result<(), String> {
    let a = first_node(s)?;
    let d = v6(1);
    if s.cloud.capabilities().supports_ipv6 {
        let created = create_ok(s, a, d).await?;
        ensure!(
            created.destination == Destination::Cidr(d),
            "create_route returned {created:?} for {d}"
        );
        let listed = list_ok(s, "after the IPv6 creation").await?;
        listed_once(&listed, d, a)?;
        let route = listed_once(&listed, d, a)?.clone();
        s.cloud
            .delete_route(&s.cluster, &route)
            .await
            .map_err(|e| format!("delete_route {d}: {e}"))?;
    } else {
        let got = create(s, a, d).await;
        match &got {
            Err(e) if e.kind == ErrorKind::InvalidRequest => {}
            _ => {
                return Err(format!(
                    "the capabilities say no IPv6, yet creating {d} answered {got:?}, expected invalid_request"
                ));
            }
        }
        let listed = list_ok(s, "after the refused IPv6 creation").await?;
        ensure!(
            on(&listed, d).is_empty(),
            "the refused {d} is listed: {listed:?}"
        );
    }
    Ok(())
}

/// A full table refuses one more route with `QuotaExceeded` and takes it
/// once a route is deleted. Passes without a request where neither the
/// subject nor the capabilities know of a limit.
pub async fn quota(s: &Subject) -> Result<(), String> {
    let Some(max) = s.quota else {
        return match s.cloud.capabilities().max_routes {
            // A cloud without a limit has no full table to refuse from.
            None => Ok(()),
            Some(limit) => Err(format!(
                "the capabilities claim a limit of {limit} routes but the subject states no quota; exempt quota explicitly"
            )),
        };
    };
    let max =
        u8::try_from(max).map_err(|_| format!("a quota of {max} is more than the check routes"))?;
    ensure!(max > 0, "a quota of 0 leaves nothing to check");
    let a = first_node(s)?;
    for i in 0..max {
        create_ok(s, a, v4(i)).await?;
    }
    let over = create(s, a, v4(max)).await;
    match &over {
        Err(e) if e.kind == ErrorKind::QuotaExceeded => {}
        _ => {
            return Err(format!(
                "route {} of a table of {max} answered {over:?}, expected quota_exceeded",
                max + 1
            ));
        }
    }
    let listed = list_ok(s, "with a full table").await?;
    let count = (0..=max)
        .filter(|i| !on(&listed, v4(*i)).is_empty())
        .count();
    ensure!(
        count == usize::from(max),
        "a full table of {max} lists {count} of the check's routes: {listed:?}"
    );
    let first = listed_once(&listed, v4(0), a)?.clone();
    s.cloud
        .delete_route(&s.cluster, &first)
        .await
        .map_err(|e| format!("delete_route {}: {e}", v4(0)))?;
    create_ok(s, a, v4(max))
        .await
        .map_err(|e| format!("after a deletion made room: {e}"))?;
    Ok(())
}

/// Where the capabilities claim batches, `apply_batch` answers exactly one
/// result per change, under the change's key, and the table shows the
/// result; where they do not, it refuses with `InvalidRequest` and changes
/// nothing (the controller never sends one then, but a caller that does
/// must not be half-served).
pub async fn batch(s: &Subject) -> Result<(), String> {
    let a = first_node(s)?;
    let b = s.nodes.last().map_or(a, |n| &**n);
    create_ok(s, a, v4(7)).await?;
    let listed = list_ok(s, "before the batch").await?;
    let old = listed_once(&listed, v4(7), a)?.clone();
    let changes = Batch::new(
        &[old],
        &[
            (a.uid.clone(), want(a, v4(8))),
            (b.uid.clone(), want(b, v4(9))),
        ],
    );
    let answer = s.cloud.apply_batch(&s.cluster, &changes).await;
    if !s.cloud.capabilities().supports_batch {
        match &answer {
            Err(e) if e.kind == ErrorKind::InvalidRequest => {}
            _ => {
                return Err(format!(
                    "the capabilities say no batches, yet apply_batch answered {answer:?}, expected invalid_request"
                ));
            }
        }
        let listed = list_ok(s, "after the refused batch").await?;
        listed_once(&listed, v4(7), a).map_err(|e| format!("after the refused batch: {e}"))?;
        ensure!(
            on(&listed, v4(8)).is_empty() && on(&listed, v4(9)).is_empty(),
            "a refused batch created routes: {listed:?}"
        );
        return Ok(());
    }
    let results = answer.map_err(|e| format!("apply_batch: {e}"))?;
    ensure!(
        results.len() == 3 && changes.keys().all(|k| results.contains_key(k)),
        "apply_batch answered {results:?} for 1 deletion and 2 creations, expected one result under each change's key: {:?}",
        changes.keys().collect::<Vec<_>>()
    );
    let entry = |k: &route_core::OpKey| results.get(k).ok_or_else(|| format!("no result for {k}"));
    let deleted = entry(&changes.delete[0].0)?;
    ensure!(
        matches!(deleted, Ok(None)),
        "the deletion's entry is {deleted:?}, expected Ok(None)"
    );
    let listed = list_ok(s, "after the batch").await?;
    ensure!(
        on(&listed, v4(7)).is_empty(),
        "the batch's deletion of {} did not happen: {listed:?}",
        v4(7)
    );
    for ((key, _, _), d, node) in [
        (&changes.create[0], v4(8), a),
        (&changes.create[1], v4(9), b),
    ] {
        let entry = entry(key)?;
        let shown = listed_once(&listed, d, node)?;
        match entry {
            Ok(Some(created)) => ensure!(
                created == shown,
                "the batch returned {created:?} for {d}, the list shows {shown:?}"
            ),
            other => {
                return Err(format!(
                    "the creation of {d} in the batch answered {other:?}"
                ));
            }
        }
    }
    Ok(())
}

/// How long each cancelled call runs before it is dropped: from "polled
/// once" to well into a slow server's answer.
const CUTS_MS: [u64; 6] = [0, 1, 3, 10, 30, 100];

/// Dropping a create or a delete mid-flight leaves the provider usable and
/// the table in one of the two outcomes, with the route at most once.
/// At least one call must actually be cut short, or nothing was checked.
pub async fn cancel_safety(s: &Subject) -> Result<(), String> {
    let a = first_node(s)?;
    let mut cut_short = 0;
    for (i, cut) in CUTS_MS.iter().enumerate() {
        let d = v4(u8::try_from(200 + i).map_err(|_| "too many cuts".to_string())?);
        let cut = Duration::from_millis(*cut);

        let route = want(a, d);
        let call = s.cloud.create_route(&s.cluster, &a.uid, &route);
        tokio::select! {
            biased;
            _ = call => {}
            () = tokio::time::sleep(cut) => cut_short += 1,
        }
        let listed = settle(async || list(s).await)
            .await
            .map_err(|e| format!("the list after a create cut at {cut:?}: {e}"))?;
        let shown = on(&listed, d);
        ensure!(
            shown.len() <= 1 && shown.iter().all(|r| r.node == a.name && !r.blackhole),
            "after a create cut at {cut:?}, {d} is listed as {shown:?}"
        );
        match settle(async || create(s, a, d).await).await {
            Ok(_) => {}
            Err(e) if e.kind == ErrorKind::AlreadyExists => {}
            Err(e) => return Err(format!("creating {d} after a create cut at {cut:?}: {e}")),
        }
        let listed = settle(async || list(s).await)
            .await
            .map_err(|e| format!("the list after re-creating {d}: {e}"))?;
        let route = listed_once(&listed, d, a)
            .map_err(|e| format!("after a create cut at {cut:?} and a retry: {e}"))?
            .clone();

        let call = s.cloud.delete_route(&s.cluster, &route);
        tokio::select! {
            biased;
            _ = call => {}
            () = tokio::time::sleep(cut) => cut_short += 1,
        }
        let listed = settle(async || list(s).await)
            .await
            .map_err(|e| format!("the list after a delete cut at {cut:?}: {e}"))?;
        let shown = on(&listed, d);
        ensure!(
            shown.len() <= 1 && shown.iter().all(|r| r.node == a.name),
            "after a delete cut at {cut:?}, {d} is listed as {shown:?}"
        );
        match settle(async || s.cloud.delete_route(&s.cluster, &route).await).await {
            Ok(()) => {}
            Err(e) if e.kind == ErrorKind::NotFound => {}
            Err(e) => return Err(format!("deleting {d} after a delete cut at {cut:?}: {e}")),
        }
        let listed = settle(async || list(s).await)
            .await
            .map_err(|e| format!("the list after deleting {d}: {e}"))?;
        ensure!(
            on(&listed, d).is_empty(),
            "after a delete cut at {cut:?} and a retry, {d} is still listed: {listed:?}"
        );
    }
    ensure!(
        cut_short > 0,
        "every call finished before its cut: nothing was cancelled mid-flight (give the fixture some latency)"
    );
    Ok(())
}

/// The provider's request counters grow by exactly the requests its server
/// saw, over lists, creations, a deletion and a deletion of a gone route.
pub async fn request_counters(s: &Subject) -> Result<(), String> {
    let Some(server) = &s.server_requests else {
        return Err(
            "the subject cannot count the server's requests; exempt request_counters explicitly"
                .into(),
        );
    };
    let counted = || -> u64 { s.cloud.stats().snapshot().values().sum() };
    let a = first_node(s)?;
    let (server0, counted0) = (server(), counted());
    list_ok(s, "first").await?;
    create_ok(s, a, v4(5)).await?;
    create_ok(s, a, v4(6)).await?;
    let listed = list_ok(s, "after the creations").await?;
    let route = listed_once(&listed, v4(5), a)?.clone();
    s.cloud
        .delete_route(&s.cluster, &route)
        .await
        .map_err(|e| format!("delete_route {}: {e}", v4(5)))?;
    // Its answer does not matter here (see `delete_gone`), only its count.
    let _ = s.cloud.delete_route(&s.cluster, &route).await;
    list_ok(s, "last").await?;
    let (seen, sent) = (
        server().saturating_sub(server0),
        counted().saturating_sub(counted0),
    );
    ensure!(
        seen == sent,
        "the server saw {seen} requests, the provider's counters say {sent}: {:?}",
        s.cloud.stats().snapshot()
    );
    ensure!(seen > 0, "the server saw no requests at all");
    Ok(())
}

/// A provider that checks forwarding prerequisites answers about the Nodes
/// it was asked about, each at most once, and finds the fixture's Nodes
/// (whose instances can forward, as every fixture builds them) not
/// disabled once a route to one exists; a remembered check right after a
/// fresh one sends no request. A provider without the capability answers
/// nothing at all.
pub async fn forwarding(s: &Subject) -> Result<(), String> {
    use route_cloud::{Forwarding, ForwardingCheck};
    let a = first_node(s)?;
    create_ok(s, a, v4(7)).await?;
    list_ok(s, "after the creation").await?;
    let asked: Vec<std::sync::Arc<NodeView>> = s.nodes.clone();
    let check = |fresh| ForwardingCheck {
        fresh,
        repair: false,
    };
    let fresh = s
        .cloud
        .check_forwarding(&s.cluster, &asked, check(true))
        .await
        .map_err(|e| format!("a fresh check_forwarding failed: {e}"))?;
    if !s.cloud.capabilities().checks_forwarding {
        ensure!(
            fresh.is_empty(),
            "check_forwarding answered {fresh:?} although the capabilities say it does not check"
        );
        return Ok(());
    }
    let mut names: Vec<&str> = fresh.iter().map(|(n, _)| n.as_str()).collect();
    names.sort_unstable();
    let before = names.len();
    names.dedup();
    ensure!(names.len() == before, "a Node answered twice: {fresh:?}");
    ensure!(
        names.iter().all(|n| asked.iter().any(|a| a.name == *n)),
        "answers about Nodes not asked about: {fresh:?}"
    );
    match fresh.iter().find(|(n, _)| *n == a.name) {
        Some((_, Forwarding::Ready)) => {}
        other => {
            return Err(format!(
                "the Node with a route, on an instance that can forward, was answered {other:?}, not Ready"
            ));
        }
    }
    ensure!(
        !fresh
            .iter()
            .any(|(_, f)| matches!(f, Forwarding::Repaired { .. })),
        "a check asked not to repair answered Repaired: {fresh:?}"
    );
    let server_before = s.server_requests.as_ref().map(|f| f());
    let remembered = s
        .cloud
        .check_forwarding(&s.cluster, &asked[..1], check(false))
        .await
        .map_err(|e| format!("a remembered check_forwarding failed: {e}"))?;
    ensure!(
        remembered
            .iter()
            .all(|(n, f)| *n == a.name && *f == Forwarding::Ready),
        "a remembered check after a fresh one answered {remembered:?}"
    );
    if let (Some(before), Some(count)) = (server_before, &s.server_requests) {
        let sent = count().saturating_sub(before);
        ensure!(
            sent == 0,
            "a remembered check right after a fresh one sent {sent} request(s)"
        );
    }
    Ok(())
}
