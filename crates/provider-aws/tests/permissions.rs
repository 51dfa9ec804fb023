//! The IAM policy in `deploy/iam/aws-policy.json` against the provider's
//! table of requests (`provider_aws::permissions::REQUESTS`) and against
//! what the provider really sends to moto: a request the table lacks, an
//! entry no path sends, or an action the policy grants that no request
//! needs (or lacks that one needs) fails here. parliament lints the policy.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;

use provider_aws::permissions::REQUESTS;
use provider_aws::testing::{self, Proxy};
use provider_aws::{AwsConfig, cluster_tag_key};
use route_cloud::permissions::{permissions, request_kind, unaccounted};
use route_cloud::{Access, CloudRoutes, Forwarding, ForwardingCheck};
use route_core::{NodeView, Route};
use serde_json::Value;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn policy_path() -> PathBuf {
    repo().join("deploy/iam/aws-policy.json")
}

fn policy() -> Value {
    let path = policy_path();
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A string or a list of strings, as IAM writes `Action` and `Resource`.
fn strings(v: &Value) -> Vec<String> {
    match v {
        Value::String(s) => vec![s.clone()],
        Value::Array(a) => a
            .iter()
            .map(|s| {
                s.as_str()
                    .unwrap_or_else(|| panic!("not a string: {s}"))
                    .to_string()
            })
            .collect(),
        other => panic!("neither a string nor a list: {other}"),
    }
}

fn statements(policy: &Value) -> Vec<Value> {
    policy["Statement"]
        .as_array()
        .expect("Statement is a list")
        .clone()
}

#[test]
fn the_policy_grants_exactly_the_actions_the_requests_need() {
    let policy = policy();
    assert_eq!(policy["Version"], "2012-10-17");
    let mut granted = BTreeSet::new();
    for s in statements(&policy) {
        assert_eq!(s["Effect"], "Allow", "{s}");
        assert!(s.get("NotAction").is_none() && s.get("NotResource").is_none());
        for a in strings(&s["Action"]) {
            assert!(!a.contains('*'), "{a}: a wildcard grants more than is sent");
            assert!(granted.insert(a.clone()), "{a} granted twice");
        }
    }
    let needed: BTreeSet<String> = permissions(REQUESTS)
        .into_iter()
        .map(str::to_string)
        .collect();
    let extra: Vec<&String> = granted.difference(&needed).collect();
    let missing: Vec<&String> = needed.difference(&granted).collect();
    assert!(
        extra.is_empty() && missing.is_empty(),
        "deploy/iam/aws-policy.json grants {extra:?} that no request needs and lacks {missing:?}"
    );
}

#[test]
fn only_reads_are_granted_on_every_resource_and_every_write_is_scoped_to_the_cluster() {
    let tag_condition = format!("aws:ResourceTag/{}", cluster_tag_key("CLUSTER_NAME"));
    for s in statements(&policy()) {
        let resources = strings(&s["Resource"]);
        for a in strings(&s["Action"]) {
            let entry = REQUESTS
                .iter()
                .find(|r| r.permissions.contains(&a.as_str()))
                .unwrap_or_else(|| panic!("{a} is no request's"));
            match entry.access {
                // Describes support no resource-level permissions.
                Access::Read => assert_eq!(resources, ["*"], "{a}"),
                Access::Write => {
                    assert!(resources.iter().all(|r| r != "*"), "{a} on every resource");
                    assert!(s.get("Condition").is_some(), "{a} without a condition");
                }
            }
        }
        let text = s.to_string();
        if text.contains("route-table/") || text.contains("instance/") {
            // The tag the provider discovers tables by (and tells other
            // clusters' instances by), with the operator's cluster name.
            assert!(
                text.contains(&tag_condition),
                "{text} is not limited by {tag_condition}"
            );
        }
    }
}

/// Runs `scripts/iam-lint.sh` (parliament, installed into a cached
/// virtualenv on first use) on `files`: (exit status, findings).
fn parliament(files: &[PathBuf]) -> (i32, Vec<Value>) {
    let out = std::process::Command::new("bash")
        .arg(repo().join("scripts/iam-lint.sh"))
        .arg("lint")
        .args(files)
        .stderr(std::process::Stdio::inherit())
        .output()
        .expect("running scripts/iam-lint.sh");
    let findings = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect();
    (out.status.code().unwrap_or(-1), findings)
}

#[test]
fn parliament_finds_nothing_in_the_policy_and_flags_a_policy_that_grants_a_route_write_on_an_instance()
 {
    let (status, findings) = parliament(&[policy_path()]);
    assert_eq!((status, findings), (0, vec![]), "parliament's findings");
    // The linter is live: a route write on the wrong resource type and an
    // action EC2 does not have are findings.
    let dir = std::env::temp_dir().join(format!("crc-iam-lint-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad-policy.json");
    std::fs::write(
        &bad,
        serde_json::json!({
            "Version": "2012-10-17",
            "Statement": [
                {"Effect": "Allow", "Action": "ec2:CreateRoute", "Resource": "arn:aws:ec2:*:*:instance/*"},
                {"Effect": "Allow", "Action": "ec2:CreateRoutes", "Resource": "*"}
            ]
        })
        .to_string(),
    )
    .unwrap();
    let (status, findings) = parliament(&[bad]);
    std::fs::remove_dir_all(&dir).ok();
    let issues: BTreeSet<&str> = findings
        .iter()
        .filter_map(|f| f["issue"].as_str())
        .collect();
    assert_eq!(status, 1);
    assert!(
        issues.contains("RESOURCE_MISMATCH") && issues.contains("UNKNOWN_ACTION"),
        "{findings:?}"
    );
}

fn node(name: &str, instance: &testing::Instance, cidr: &str) -> NodeView {
    NodeView::new(name, format!("uid-{name}"), &[cidr]).with_provider_id(&instance.provider_id)
}

fn wanted(n: &NodeView) -> Route {
    let mut r = Route::new(n.name.clone(), n.valid_pod_cidrs()[0]);
    r.node_provider_id = n.provider_id.as_deref().map(Into::into);
    r
}

/// Every path that sends a request: table discovery by tag, a list that
/// meets an unknown interface and an instance no Node names, creations
/// (single- and multi-NIC), a creation over a route to an instance no Node
/// names, the forwarding check with a repair, a deletion. Every action moto
/// saw (and the provider counted) has an entry, and every entry was sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_sent_to_moto_has_an_entry_and_every_entry_is_sent() {
    let ep = testing::moto_endpoint().await.expect("moto server");
    let proxy = Proxy::start(&ep).await.unwrap();
    let ec2 = testing::client(&ep).await;
    let cluster = testing::unique_cluster("iam");
    let net = testing::create_network(&ec2, "10.41.0.0/16", Some(&cluster))
        .await
        .unwrap();
    let inst = testing::run_instances(&ec2, &net, 4).await.unwrap();
    // A route naming only an interface (inst[3]'s primary, which gets a
    // second one: a multi-NIC instance) and one to an instance no Node names.
    let eni = testing::add_second_interface(&ec2, &net, &inst[3])
        .await
        .unwrap();
    testing::add_route(&ec2, &net.route_table_id, "10.244.50.0/24", &eni)
        .await
        .unwrap();
    testing::add_route(&ec2, &net.route_table_id, "10.244.51.0/24", &inst[2].id)
        .await
        .unwrap();

    let p = testing::provider(
        &proxy.url(),
        AwsConfig {
            vpc_id: Some(net.vpc_id.clone()),
            ..AwsConfig::default()
        },
    )
    .await
    .unwrap();
    let a = node("node-a", &inst[0], "10.244.0.0/24");
    let b = node("node-b", &inst[1], "10.244.51.0/24");
    let m = node("node-m", &inst[3], "10.244.3.0/24");
    let nodes: Vec<Arc<NodeView>> = [&a, &b, &m].into_iter().cloned().map(Arc::new).collect();
    p.observe_nodes(&nodes);

    let targets = p.discover_targets(&cluster).await.unwrap();
    assert_eq!(targets, Some(vec![net.route_table_id.as_str().into()]));
    p.list_routes(&cluster).await.unwrap();
    p.create_route(&cluster, &a.uid, &wanted(&a)).await.unwrap();
    let mm = p.create_route(&cluster, &m.uid, &wanted(&m)).await.unwrap();
    assert_eq!(mm.next_hop.as_str(), eni, "routed to the primary interface");
    let bb = p.create_route(&cluster, &b.uid, &wanted(&b)).await.unwrap();
    assert_eq!(
        bb.next_hop.as_str(),
        inst[1].id,
        "taken over with ReplaceRoute"
    );
    testing::set_source_dest_check(&ec2, &inst[0].id, true)
        .await
        .unwrap();
    let checked = p
        .check_forwarding(
            &cluster,
            &nodes,
            ForwardingCheck {
                fresh: true,
                repair: true,
            },
        )
        .await
        .unwrap();
    assert!(
        checked
            .iter()
            .any(|(n, f)| n == "node-a" && matches!(f, Forwarding::Repaired { .. })),
        "{checked:?}"
    );
    let listed = p.list_routes(&cluster).await.unwrap();
    let route_a = listed.iter().find(|r| r.node == "node-a").unwrap();
    p.delete_route(&cluster, route_a).await.unwrap();

    let sent: BTreeSet<String> = proxy.log().into_iter().map(|l| l.action).collect();
    let counted: BTreeSet<&str> = p.stats().snapshot().keys().map(|(op, _)| *op).collect();
    let names: BTreeSet<&str> = REQUESTS.iter().map(|r| r.name).collect();
    assert_eq!(
        unaccounted(REQUESTS, sent.iter().map(String::as_str)),
        BTreeSet::new(),
        "actions moto saw without an entry"
    );
    assert_eq!(
        unaccounted(REQUESTS, counted.iter().copied()),
        BTreeSet::new(),
        "operations the provider counted without an entry"
    );
    assert_eq!(
        sent.iter().map(String::as_str).collect::<BTreeSet<_>>(),
        names,
        "every entry is a request some path sends"
    );
    for action in &sent {
        let entry = request_kind(REQUESTS, action).unwrap();
        assert_eq!(
            entry.access == Access::Write,
            provider_aws::testing::proxy::is_mutating(action),
            "{action}: EC2's own read/write class"
        );
    }
}
