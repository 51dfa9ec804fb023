//! The forwarding check against the fake Compute Engine API: what a Node on
//! an instance without `canIpForward` answers, and what each check costs.

use std::sync::Arc;

use provider_gce::testing::{FakeConfig, FakeGce};
use provider_gce::{GceConfig, GceRoutes, InstanceRef, disabled_fix, disabled_what};
use route_cloud::{CloudRoutes, ErrorKind, Forwarding, ForwardingCheck};
use route_core::NodeView;

const NETWORK: &str = "k8s";
const ZONE: &str = "us-central1-a";

const REMEMBERED: ForwardingCheck = ForwardingCheck {
    fresh: false,
    repair: true,
};
const FRESH: ForwardingCheck = ForwardingCheck {
    fresh: true,
    repair: true,
};

async fn fake(instances: usize) -> FakeGce {
    let fake = FakeGce::start(FakeConfig::default())
        .await
        .expect("the fake starts");
    fake.add_network(NETWORK, false);
    for i in 0..instances {
        fake.add_instance(ZONE, &format!("node-{i}"));
    }
    fake
}

async fn cloud(fake: &FakeGce) -> GceRoutes {
    GceRoutes::connect(GceConfig {
        endpoint: fake.endpoint(),
        anonymous: true,
        request_timeout_secs: 5,
        ..GceConfig::for_network(fake.project(), NETWORK)
    })
    .await
    .expect("connects")
}

fn node(fake: &FakeGce, i: usize) -> Arc<NodeView> {
    Arc::new(
        NodeView::new(format!("node-{i}"), format!("uid-{i}"), &["10.244.0.0/24"])
            .with_provider_id(format!("gce://{}/{ZONE}/node-{i}", fake.project())),
    )
}

fn disabled(fake: &FakeGce, i: usize) -> Forwarding {
    let instance =
        InstanceRef::from_provider_id(&format!("gce://{}/{ZONE}/node-{i}", fake.project()))
            .expect("a providerID literal");
    Forwarding::Disabled {
        what: disabled_what(&instance),
        fix: disabled_fix(&instance),
    }
}

fn sorted(mut answers: Vec<(String, Forwarding)>) -> Vec<(String, Forwarding)> {
    answers.sort_by(|a, b| a.0.cmp(&b.0));
    answers
}

fn instance_reads(c: &GceRoutes) -> u64 {
    c.stats()
        .snapshot()
        .iter()
        .filter(|((op, _), _)| *op == "get_instance")
        .map(|(_, n)| *n)
        .sum()
}

#[tokio::test]
async fn the_provider_says_it_checks_forwarding() {
    let fake = fake(0).await;
    assert!(cloud(&fake).await.capabilities().checks_forwarding);
}

#[tokio::test]
async fn an_instance_without_can_ip_forward_is_disabled_with_its_fix_and_one_with_it_is_ready() {
    let fake = fake(2).await;
    assert!(fake.set_can_ip_forward(ZONE, "node-1", false));
    let c = cloud(&fake).await;
    let answers = c
        .check_forwarding("k8s", &[node(&fake, 0), node(&fake, 1)], REMEMBERED)
        .await
        .unwrap();
    assert_eq!(
        sorted(answers),
        [
            ("node-0".to_string(), Forwarding::Ready),
            ("node-1".to_string(), disabled(&fake, 1)),
        ]
    );
    let Forwarding::Disabled { what, fix } = disabled(&fake, 1) else {
        unreachable!("built as Disabled above")
    };
    assert!(
        what.contains("node-1") && what.contains("canIpForward false"),
        "{what}"
    );
    assert!(
        fix.contains("--can-ip-forward")
            && fix.contains("update-from-file node-1 --zone us-central1-a"),
        "{fix}"
    );
    assert_eq!(fake.count("get_instance"), 2, "one read per instance");
    assert!(
        fake.routes().is_empty() && fake.count("insert") == 0,
        "the check changes nothing"
    );
}

#[tokio::test]
async fn after_the_first_check_remembered_checks_cost_no_request() {
    let fake = fake(3).await;
    fake.set_can_ip_forward(ZONE, "node-2", false);
    let c = cloud(&fake).await;
    let nodes: Vec<_> = (0..3).map(|i| node(&fake, i)).collect();
    let first = sorted(c.check_forwarding("k8s", &nodes, REMEMBERED).await.unwrap());
    assert_eq!(instance_reads(&c), 3);
    let before = fake.total();
    for _ in 0..5 {
        let again = sorted(c.check_forwarding("k8s", &nodes, REMEMBERED).await.unwrap());
        assert_eq!(again, first);
    }
    assert_eq!(
        fake.total(),
        before,
        "no request at all: {:?}",
        fake.requests()
    );
    assert_eq!(instance_reads(&c), 3);
}

#[tokio::test]
async fn a_fresh_check_reads_again_only_the_disabled_instances() {
    let fake = fake(4).await;
    fake.set_can_ip_forward(ZONE, "node-1", false);
    fake.set_can_ip_forward(ZONE, "node-3", false);
    let c = cloud(&fake).await;
    let nodes: Vec<_> = (0..4).map(|i| node(&fake, i)).collect();
    c.check_forwarding("k8s", &nodes, FRESH).await.unwrap();
    assert_eq!(fake.count("get_instance"), 4);
    // An instance found on cannot lose canIpForward while it runs: a
    // change behind the provider's back is the fake's liberty, not GCE's,
    // and shows that it is not read again.
    fake.set_can_ip_forward(ZONE, "node-0", false);
    let answers = sorted(c.check_forwarding("k8s", &nodes, FRESH).await.unwrap());
    assert_eq!(fake.count("get_instance"), 6, "node-1 and node-3 only");
    assert_eq!(answers[0], ("node-0".to_string(), Forwarding::Ready));
    assert_eq!(answers[1], ("node-1".to_string(), disabled(&fake, 1)));
    assert_eq!(instance_reads(&c), 6);
}

#[tokio::test]
async fn an_instance_recreated_with_can_ip_forward_is_ready_at_the_next_fresh_check() {
    let fake = fake(1).await;
    fake.set_can_ip_forward(ZONE, "node-0", false);
    let c = cloud(&fake).await;
    let n = [node(&fake, 0)];
    let first = c.check_forwarding("k8s", &n, REMEMBERED).await.unwrap();
    assert_eq!(first, [("node-0".to_string(), disabled(&fake, 0))]);
    fake.set_can_ip_forward(ZONE, "node-0", true);
    let remembered = c.check_forwarding("k8s", &n, REMEMBERED).await.unwrap();
    assert_eq!(remembered, first, "a remembered check answers from memory");
    let fresh = c.check_forwarding("k8s", &n, FRESH).await.unwrap();
    assert_eq!(fresh, [("node-0".to_string(), Forwarding::Ready)]);
    assert_eq!(fake.count("get_instance"), 2);
}

#[tokio::test]
async fn nodes_without_a_known_instance_are_left_out_without_failing_the_check() {
    let fake = fake(1).await;
    let c = cloud(&fake).await;
    let no_id = Arc::new(NodeView::new("bare", "uid-bare", &["10.244.9.0/24"]));
    let foreign = Arc::new(
        NodeView::new("aws", "uid-aws", &["10.244.8.0/24"])
            .with_provider_id("aws:///us-east-1a/i-0abc"),
    );
    let gone = node(&fake, 7);
    let answers = c
        .check_forwarding("k8s", &[no_id, foreign, gone, node(&fake, 0)], FRESH)
        .await
        .unwrap();
    assert_eq!(answers, [("node-0".to_string(), Forwarding::Ready)]);
    assert_eq!(
        fake.count("get_instance"),
        2,
        "the missing instance and node-0"
    );
}

#[tokio::test]
async fn a_failed_read_fails_the_check_and_what_was_read_is_not_read_again() {
    let fake = fake(2).await;
    let c = cloud(&fake).await;
    let first = [node(&fake, 0)];
    c.check_forwarding("k8s", &first, REMEMBERED).await.unwrap();
    fake.fail_next("get_instance", 503, "backendError");
    let both = [node(&fake, 0), node(&fake, 1)];
    let e = c
        .check_forwarding("k8s", &both, REMEMBERED)
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Transient, "{e}");
    let answers = sorted(c.check_forwarding("k8s", &both, REMEMBERED).await.unwrap());
    assert_eq!(answers.len(), 2);
    assert_eq!(
        fake.count("get_instance"),
        3,
        "node-0 once, node-1 failed then read"
    );
}
