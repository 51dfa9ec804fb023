//! End to end: the binary with `--cloud-provider aws` against the real API
//! server and a moto EC2 server: routes land in the route table tagged for
//! this cluster, follow Node deletions, and another cluster's table is never
//! touched. Through `provider_aws::testing::Proxy`: a route EC2 reports as a
//! blackhole is replaced, and throttling answers slow the controller down
//! without losing routes.

mod common;

use std::time::Duration;

use common::{Controller, TempDir};
use common::{create_aws_nodes, http_get_async, metric_sum};
use provider_aws::testing::{Instance, Logged, Proxy};
use provider_aws::testing::{
    client, create_network, moto_endpoint, run_instances, set_source_dest_check, source_dest_check,
    table_routes, unique_cluster,
};
use test_cluster::{ClusterGuard, TestCluster, TestNode, wait_until};

#[tokio::test]
async fn nodes_get_routes_in_their_clusters_table_and_lose_them_on_deletion() {
    let c = TestCluster::acquire().await.unwrap();
    let endpoint = moto_endpoint().await.unwrap();
    let ec2 = client(&endpoint).await;
    let cluster = unique_cluster("e2e");
    let other = unique_cluster("other");
    let net = create_network(&ec2, "10.30.0.0/16", Some(&cluster))
        .await
        .unwrap();
    let foreign = create_network(&ec2, "10.31.0.0/16", Some(&other))
        .await
        .unwrap();
    let instances = run_instances(&ec2, &net, 3).await.unwrap();
    let foreign_before = table_routes(&ec2, &foreign.route_table_id).await.unwrap();
    for (i, inst) in instances.iter().enumerate() {
        c.create_node(
            &TestNode::new(format!("aws-{i}"))
                .pod_cidrs([format!("10.244.{}.0/24", 40 + i)])
                .internal_ip(format!("10.30.0.{}", 10 + i))
                .provider_id(&inst.provider_id),
        )
        .await
        .unwrap();
    }
    let dir = TempDir::new("aws");
    let cfg = dir.path().join("aws.yaml");
    std::fs::write(&cfg, format!("region: us-east-1\nendpoint: {endpoint}\n")).unwrap();
    let mut ctl = Controller::start_with_env(
        c.kubeconfig_path(),
        dir.path(),
        "controller",
        &[
            "--cluster-cidr",
            "10.244.0.0/16",
            "--cluster-name",
            &cluster,
            "--cloud-provider",
            "aws",
            "--cloud-config",
            cfg.to_str().unwrap(),
            "--leader-elect=false",
            "--metrics-bind-address",
            "0",
        ],
        &[
            ("AWS_ACCESS_KEY_ID", "testing"),
            ("AWS_SECRET_ACCESS_KEY", "testing"),
            ("AWS_REGION", "us-east-1"),
        ],
    );
    let ours = |routes: Vec<(String, String, String)>| -> Vec<(String, String)> {
        let mut v: Vec<(String, String)> = routes
            .into_iter()
            .filter(|(d, _, _)| d.starts_with("10.244."))
            .map(|(d, t, _)| (d, t))
            .collect();
        v.sort();
        v
    };
    wait_until(
        Duration::from_secs(120),
        "3 routes in the cluster's table",
        || async {
            let r = ours(table_routes(&ec2, &net.route_table_id).await.ok()?);
            (r.len() == 3).then_some(())
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));
    let r = ours(table_routes(&ec2, &net.route_table_id).await.unwrap());
    assert_eq!(
        r[0],
        ("10.244.40.0/24".to_string(), instances[0].id.clone())
    );
    c.delete_node("aws-1").await.unwrap();
    wait_until(
        Duration::from_secs(60),
        "route of the deleted node removed",
        || async {
            let r = ours(table_routes(&ec2, &net.route_table_id).await.ok()?);
            (r.len() == 2 && !r.iter().any(|(d, _)| d == "10.244.41.0/24")).then_some(())
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));
    assert_eq!(
        table_routes(&ec2, &foreign.route_table_id).await.unwrap(),
        foreign_before,
        "another cluster's route table was touched"
    );
    assert!(ctl.is_running());
    let log = ctl.log_text();
    assert_eq!(ctl.stop(), Some(0), "{log}");
}

/// The pod-CIDR routes (`10.244.*`) of one table as (destination, target,
/// state), sorted; the table's local route is left out.
fn pod_routes(routes: Vec<(String, String, String)>) -> Vec<(String, String, String)> {
    let mut v: Vec<_> = routes
        .into_iter()
        .filter(|(d, _, _)| d.starts_with("10.244."))
        .collect();
    v.sort();
    v
}

async fn create_nodes(c: &ClusterGuard, prefix: &str, first_octet: usize, instances: &[Instance]) {
    create_aws_nodes(c, prefix, first_octet, "10.30.1", instances).await;
}

fn start_aws(
    c: &ClusterGuard,
    dir: &TempDir,
    cluster: &str,
    endpoint: &str,
    extra_yaml: &str,
    extra: &[&str],
) -> (Controller, String) {
    common::start_aws(
        c.kubeconfig_path(),
        dir,
        cluster,
        endpoint,
        extra_yaml,
        extra,
    )
}

/// The destination CIDR a route-writing request names (form-decoded).
fn destination(r: &Logged) -> String {
    r.param("DestinationCidrBlock").replace("%2F", "/")
}

fn is_route_write(r: &Logged) -> bool {
    matches!(
        r.action.as_str(),
        "CreateRoute" | "ReplaceRoute" | "DeleteRoute"
    )
}

async fn wait_network_available(c: &ClusterGuard, nodes: &[String], ctl: &Controller) {
    wait_until(
        Duration::from_secs(60),
        "NetworkUnavailable=False on every node",
        || async {
            for n in nodes {
                let cond = c.network_unavailable(n).await.ok()??;
                if cond.status != "False" {
                    return None;
                }
            }
            Some(())
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));
}

#[tokio::test]
async fn a_blackhole_route_is_replaced_by_a_route_to_the_nodes_instance() {
    let c = TestCluster::acquire().await.unwrap();
    let endpoint = moto_endpoint().await.unwrap();
    let ec2 = client(&endpoint).await;
    let proxy = Proxy::start(&endpoint).await.unwrap();
    let cluster = unique_cluster("e2e-bh");
    let net = create_network(&ec2, "10.32.0.0/16", Some(&cluster))
        .await
        .unwrap();
    let instances = run_instances(&ec2, &net, 3).await.unwrap();
    create_nodes(&c, "aws-bh", 50, &instances).await;
    let names: Vec<String> = (0..3).map(|i| format!("aws-bh-{i}")).collect();
    let dir = TempDir::new("aws-bh");
    // The incremental mode plans node changes against its cached table, so
    // only a resync shows it the blackhole: make that frequent.
    let (mut ctl, _) = start_aws(
        &c,
        &dir,
        &cluster,
        &proxy.url(),
        "",
        &["--min-resync-period", "5s"],
    );
    wait_until(Duration::from_secs(120), "3 routes", || async {
        let r = pod_routes(table_routes(&ec2, &net.route_table_id).await.ok()?);
        (r.len() == 3).then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));
    wait_network_available(&c, &names, &ctl).await;
    let victim = &names[1];
    let dest = "10.244.51.0/24";
    let before = c.network_unavailable(victim).await.unwrap().unwrap();

    // EC2 now reports the route to node 1's instance as a blackhole, as it
    // does while the instance behind a route is stopped or replaced.
    let mark = proxy.log().len();
    let t0 = std::time::Instant::now();
    proxy.blackhole(&instances[1].id);
    let rewrite = wait_until(
        Duration::from_secs(60),
        "the blackhole route rewritten",
        || async {
            let log = proxy.log();
            log[mark..]
                .iter()
                .position(|r| {
                    matches!(r.action.as_str(), "CreateRoute" | "ReplaceRoute")
                        && destination(r) == dest
                })
                .map(|i| i + mark)
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));
    // The replacement is active from here on.
    proxy.unblackhole(&instances[1].id);
    let replaced_after = t0.elapsed();

    let log = proxy.log();
    let w = &log[rewrite];
    assert_eq!(
        w.param("InstanceId"),
        instances[1].id,
        "the new route targets the node's current instance: {}",
        w.body
    );
    let listed = log[mark..rewrite]
        .iter()
        .position(|r| r.action == "DescribeRouteTables")
        .map(|i| i + mark)
        .expect("a list showed the blackhole before the rewrite");
    // One ReplaceRoute: no DeleteRoute first, no moment without a route.
    assert_eq!(w.action, "ReplaceRoute", "{}", w.body);
    assert!(
        !log[listed..rewrite]
            .iter()
            .any(|r| r.action == "DeleteRoute" && destination(r) == dest),
        "the blackhole was deleted before it was replaced"
    );
    let writes: Vec<String> = log[mark..]
        .iter()
        .filter(|r| is_route_write(r))
        .map(|r| format!("{} {}", r.action, destination(r)))
        .collect();
    assert!(
        log[mark..]
            .iter()
            .filter(|r| is_route_write(r))
            .all(|r| destination(r) == dest),
        "only the blackhole's destination was written: {writes:?}"
    );

    // The next resync sees an active route and leaves it alone.
    wait_until(Duration::from_secs(30), "the next resync", || async {
        proxy.log()[rewrite..]
            .iter()
            .any(|r| r.action == "DescribeRouteTables")
            .then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let log = proxy.log();
    let later: Vec<&Logged> = log[rewrite + 1..]
        .iter()
        .filter(|r| is_route_write(r))
        .collect();
    assert!(later.is_empty(), "writes after the replacement: {later:?}");
    let routes = pod_routes(table_routes(&ec2, &net.route_table_id).await.unwrap());
    assert_eq!(routes.len(), 3, "{routes:?}");
    assert!(
        routes.contains(&(
            dest.to_string(),
            instances[1].id.clone(),
            "active".to_string()
        )),
        "{routes:?}"
    );
    let after = c.network_unavailable(victim).await.unwrap().unwrap();
    assert_eq!(after.status, "False");
    assert_eq!(
        after.last_transition_time, before.last_transition_time,
        "NetworkUnavailable never flipped while the route was replaced"
    );
    eprintln!(
        "blackhole replaced {replaced_after:?} after it appeared, with {writes:?}; {} requests since",
        log.len() - mark
    );
    assert!(ctl.is_running());
    let text = ctl.log_text();
    assert_eq!(ctl.stop(), Some(0), "{text}");
}

#[tokio::test]
async fn throttling_slows_the_controller_down_without_losing_routes() {
    const NODES: usize = 10;
    const PAUSE: Duration = Duration::from_millis(1000);
    let c = TestCluster::acquire().await.unwrap();
    let endpoint = moto_endpoint().await.unwrap();
    let ec2 = client(&endpoint).await;
    let proxy = Proxy::start(&endpoint).await.unwrap();
    let cluster = unique_cluster("e2e-throttle");
    let net = create_network(&ec2, "10.33.0.0/16", Some(&cluster))
        .await
        .unwrap();
    let instances = run_instances(&ec2, &net, NODES as i32).await.unwrap();
    let names: Vec<String> = (0..NODES).map(|i| format!("aws-t-{i}")).collect();
    let dir = TempDir::new("aws-throttle");
    proxy.throttle_every(3);
    let (mut ctl, metrics) = start_aws(
        &c,
        &dir,
        &cluster,
        &proxy.url(),
        &format!("rate_limit:\n  throttle_pause_ms: {}\n", PAUSE.as_millis()),
        &[],
    );
    let t0 = std::time::Instant::now();
    create_nodes(&c, "aws-t", 60, &instances).await;
    wait_until(Duration::from_secs(180), "a route per node", || async {
        let r = pod_routes(table_routes(&ec2, &net.route_table_id).await.ok()?);
        (r.len() == NODES).then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));
    let converged = t0.elapsed();
    wait_network_available(&c, &names, &ctl).await;

    let routes = pod_routes(table_routes(&ec2, &net.route_table_id).await.unwrap());
    for (i, inst) in instances.iter().enumerate() {
        let want = (
            format!("10.244.{}.0/24", 60 + i),
            inst.id.clone(),
            "active".to_string(),
        );
        assert!(routes.contains(&want), "missing {want:?} in {routes:?}");
    }

    let log = proxy.log();
    let throttled = log.iter().filter(|r| r.throttled).count();
    assert_eq!(throttled, log.len() / 3, "every 3rd request was throttled");
    assert!(
        throttled >= 5,
        "only {throttled} throttled of {}",
        log.len()
    );
    // One table lookup, one source/dest check per instance, one route per node.
    let minimum = 1 + 2 * NODES;
    assert!(
        log.len() <= 3 * minimum,
        "{} requests for a minimum of {minimum}",
        log.len()
    );
    // After a throttle, the same action waits out its pause; only requests
    // already on the wire when the answer came back may arrive in between.
    let in_flight = Duration::from_millis(200);
    let mut gaps = Vec::new();
    for (i, r) in log.iter().enumerate().filter(|(_, r)| r.throttled) {
        let next = log[i + 1..]
            .iter()
            .find(|n| n.action == r.action && n.at.duration_since(r.at) > in_flight);
        if let Some(n) = next {
            let gap = n.at.duration_since(r.at);
            assert!(
                gap >= PAUSE - Duration::from_millis(20),
                "{} was sent again {gap:?} after a throttle",
                r.action
            );
            gaps.push(gap);
        }
    }
    assert!(!gaps.is_empty());

    let (code, body) = http_get_async(&metrics, "/metrics").await.unwrap();
    assert_eq!(code, 200);
    let reported = metric_sum(
        &body,
        "route_controller_cloud_requests_total",
        &["provider=\"aws\"", "result=\"throttled\""],
    );
    assert_eq!(reported, throttled as f64, "{body}");
    let all = metric_sum(
        &body,
        "route_controller_cloud_requests_total",
        &["provider=\"aws\""],
    );
    assert_eq!(all, log.len() as f64, "every request counted once\n{body}");
    let waited = metric_sum(
        &body,
        "route_controller_cloud_rate_limit_wait_seconds_total",
        &[],
    );
    let mut by_action: std::collections::BTreeMap<&str, (usize, usize)> = Default::default();
    for r in &log {
        let e = by_action.entry(r.action.as_str()).or_default();
        e.0 += 1;
        e.1 += usize::from(r.throttled);
    }
    eprintln!(
        "{NODES} routes in {converged:?}: {} requests (minimum {minimum}), {throttled} throttled, \
         per action (sent, throttled) {by_action:?}, gaps after throttles {gaps:?}, \
         rate-limit wait {waited}s",
        log.len()
    );
    assert!(ctl.is_running());
    let text = ctl.log_text();
    assert_eq!(ctl.stop(), Some(0), "{text}");
}

#[tokio::test]
async fn a_source_dest_check_turned_back_on_behind_the_controllers_back_is_repaired_within_the_drift_period_with_one_warning()
 {
    let c = TestCluster::acquire().await.unwrap();
    let endpoint = moto_endpoint().await.unwrap();
    let ec2 = client(&endpoint).await;
    let proxy = Proxy::start(&endpoint).await.unwrap();
    let cluster = unique_cluster("e2e-sdc");
    let net = create_network(&ec2, "10.34.0.0/16", Some(&cluster))
        .await
        .unwrap();
    let instances = run_instances(&ec2, &net, 3).await.unwrap();
    create_nodes(&c, "aws-sdc", 60, &instances).await;
    let names: Vec<String> = (0..3).map(|i| format!("aws-sdc-{i}")).collect();
    let dir = TempDir::new("aws-sdc");
    let (ctl, _) = start_aws(
        &c,
        &dir,
        &cluster,
        &proxy.url(),
        "",
        &["--route-drift-check-period", "5s"],
    );
    wait_network_available(&c, &names, &ctl).await;
    for i in &instances {
        assert_eq!(
            source_dest_check(&ec2, &i.id).await,
            Ok(false),
            "turned off before its first route"
        );
    }
    // Something resets the attribute (an operator, a tool, a re-created
    // interface): EC2 now drops the pod traffic this Node forwards.
    let victim = &instances[1].id;
    set_source_dest_check(&ec2, victim, true).await.unwrap();
    let mark = proxy.log().len();
    wait_until(Duration::from_secs(30), "the check off again", || async {
        (source_dest_check(&ec2, victim).await == Ok(false)).then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));
    let log = proxy.log();
    let repair: Vec<&Logged> = log[mark..]
        .iter()
        .filter(|r| r.action == "ModifyInstanceAttribute")
        .collect();
    assert_eq!(repair.len(), 1, "one repair: {repair:?}");
    assert_eq!(repair[0].param("InstanceId"), *victim);
    wait_until(
        Duration::from_secs(10),
        "one ForwardingRepaired Warning",
        || async {
            let events = c.node_events(&names[1]).await.ok()?;
            let n = events
                .iter()
                .filter(|e| e.reason.as_deref() == Some("ForwardingRepaired"))
                .count();
            (n == 1).then_some(())
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));
    // The other Nodes were only read, batched with it.
    for n in [&names[0], &names[2]] {
        let events = c.node_events(n).await.unwrap();
        assert!(
            !events
                .iter()
                .any(|e| e.reason.as_deref() == Some("ForwardingRepaired")),
            "{n}: {events:?}"
        );
    }
    // A drift check reads every routed instance in one request and writes
    // nothing while nothing was reset.
    let settled = proxy.log().len();
    wait_until(Duration::from_secs(60), "two more drift checks", || async {
        let n = proxy.log()[settled..]
            .iter()
            .filter(|r| r.action == "DescribeInstances")
            .count();
        (n >= 2).then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));
    let log = proxy.log();
    assert!(
        !log[settled..]
            .iter()
            .any(|r| r.action.starts_with("Modify") || is_route_write(r)),
        "a settled drift check writes nothing"
    );
    let cond = c.network_unavailable(&names[1]).await.unwrap().unwrap();
    assert_eq!(cond.reason.as_deref(), Some("RouteCreated"));
    let text = ctl.log_text();
    assert_eq!(ctl.stop(), Some(0), "{text}");
}

/// cloud-provider-aws's own INI, as an operator running the AWS
/// cloud-controller-manager off AWS has it (`Zone`, `VPC`, `SubnetID`,
/// `KubernetesClusterID`, a `RoleARN`, load-balancer keys, and
/// `[ServiceOverride]` sections pointing EC2 and STS at private endpoints):
/// the table is found by `KubernetesClusterID`'s tag although
/// `--cluster-name` says something else, the role is assumed once through
/// STS with cloud-provider-aws's `x-amz-source-account` and `SourceARN`'s
/// `x-amz-source-arn` among its signed headers, and the Nodes are routed
/// with the assumed credentials.
#[tokio::test]
async fn the_aws_ccms_ini_config_routes_nodes_with_the_assumed_role() {
    let c = TestCluster::acquire().await.unwrap();
    let endpoint = moto_endpoint().await.unwrap();
    let ec2 = client(&endpoint).await;
    let cluster = unique_cluster("ini");
    let net = create_network(&ec2, "10.33.0.0/16", Some(&cluster))
        .await
        .unwrap();
    let instances = run_instances(&ec2, &net, 2).await.unwrap();
    for (i, inst) in instances.iter().enumerate() {
        c.create_node(
            &TestNode::new(format!("ini-{i}"))
                .pod_cidrs([format!("10.244.{}.0/24", 150 + i)])
                .internal_ip(format!("10.33.0.{}", 10 + i))
                .provider_id(&inst.provider_id),
        )
        .await
        .unwrap();
    }
    let proxy = Proxy::start(&endpoint).await.unwrap();
    let dir = TempDir::new("aws-ini");
    let ini = dir.path().join("cloud.conf");
    std::fs::write(
        &ini,
        format!(
            "[Global]\nZone = us-east-1a\nVPC = {vpc}\nSubnetID = {subnet}\n\
             KubernetesClusterID = {cluster}\nRoleARN = arn:aws:iam::123456789012:role/route-controller\n\
             SourceARN = arn:aws:eks:us-east-1:123456789012:cluster/prod\n\
             DisableSecurityGroupIngress = true\nNodeIPFamilies = ipv4\n\n\
             [ServiceOverride \"1\"]\nService = EC2\nRegion = us-east-1\nURL = {url}\nSigningRegion = us-east-1\n\n\
             [ServiceOverride \"2\"]\nService = STS\nRegion = us-east-1\nURL = {url}\nSigningRegion = us-east-1\n",
            vpc = net.vpc_id,
            subnet = net.subnet_id,
            url = proxy.url(),
        ),
    )
    .unwrap();
    let ctl = Controller::start_with_env(
        c.kubeconfig_path(),
        dir.path(),
        "controller",
        &[
            "--cluster-cidr",
            "10.244.0.0/16",
            "--cluster-name",
            "kubernetes",
            "--cloud-provider",
            "aws",
            "--cloud-config",
            ini.to_str().unwrap(),
            "--leader-elect=false",
            "--metrics-bind-address",
            "0",
        ],
        &[
            ("AWS_ACCESS_KEY_ID", "testing"),
            ("AWS_SECRET_ACCESS_KEY", "testing"),
        ],
    );
    wait_until(
        Duration::from_secs(120),
        "2 routes in the table tagged for KubernetesClusterID",
        || async {
            let r = pod_routes(table_routes(&ec2, &net.route_table_id).await.ok()?);
            (r.len() == 2).then_some(())
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));
    let r = pod_routes(table_routes(&ec2, &net.route_table_id).await.unwrap());
    assert_eq!(
        (r[0].0.as_str(), r[0].1.as_str()),
        ("10.244.150.0/24", instances[0].id.as_str())
    );
    let counts = proxy.counts();
    let n = |a: &str| counts.get(a).map_or(0, |c| c.requests);
    assert_eq!(
        n("AssumeRole"),
        1,
        "one AssumeRole, its credentials reused: {counts:?}"
    );
    assert_eq!(n("CreateRoute"), 2, "{counts:?}");
    let sent = proxy.log();
    let assume = sent
        .iter()
        .find(|r| r.action == "AssumeRole")
        .expect("an AssumeRole");
    let header = |r: &Logged, h: &str| {
        r.headers
            .get(h)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string()
    };
    assert_eq!(header(assume, "x-amz-source-account"), "123456789012");
    assert_eq!(
        header(assume, "x-amz-source-arn"),
        "arn:aws:eks:us-east-1:123456789012:cluster/prod"
    );
    let auth = header(assume, "authorization");
    assert!(
        auth.contains("x-amz-source-account") && auth.contains("x-amz-source-arn"),
        "both headers are signed: {auth}"
    );
    assert!(
        auth.contains("Credential=testing/"),
        "the role is assumed with the standard chain's keys: {auth}"
    );
    // moto hands out fresh keys for the role; every EC2 request is signed
    // with them, none with the base keys.
    for r in sent.iter().filter(|r| r.action != "AssumeRole") {
        let auth = header(r, "authorization");
        assert!(
            auth.contains("Credential=") && !auth.contains("Credential=testing/"),
            "{} signed with the base keys, not the role's: {auth}",
            r.action
        );
    }
    let log = ctl.log_text();
    assert_eq!(ctl.stop(), Some(0), "{log}");
    assert!(log.contains("cloud-provider-aws INI"), "{log}");
    assert!(
        log.contains("SubnetID"),
        "the key without effect is named: {log}"
    );
}
