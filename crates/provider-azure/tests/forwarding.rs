//! The forwarding check against the fake ARM API: a Node whose primary NIC
//! has IP forwarding off, and what each check costs.

use std::sync::Arc;

use provider_azure::testing::{FakeAzure, FakeConfig};
use provider_azure::{AzureConfig, AzureRoutes, ops};
use route_cloud::{CloudRoutes, ErrorKind, Forwarding, ForwardingCheck};
use route_core::NodeView;

const TABLE: &str = "k8s-routes";

const REMEMBERED: ForwardingCheck = ForwardingCheck {
    fresh: false,
    repair: true,
};
const FRESH: ForwardingCheck = ForwardingCheck {
    fresh: true,
    repair: true,
};

/// The fake with VMs `node-0` .. and the provider, plus the Nodes on them.
async fn setup(vms: usize) -> (FakeAzure, AzureRoutes, Vec<Arc<NodeView>>) {
    let f = FakeAzure::start(FakeConfig::default())
        .await
        .expect("the fake starts");
    f.add_table(TABLE);
    let nodes = (0..vms)
        .map(|i| {
            let id = f.add_vm(&format!("node-{i}"), &format!("10.0.0.{}", i + 4));
            Arc::new(
                NodeView::new(format!("node-{i}"), format!("uid-{i}"), &["10.244.0.0/24"])
                    .with_provider_id(id),
            )
        })
        .collect();
    let p = AzureRoutes::new(AzureConfig::from_yaml(&f.cloud_config(TABLE)).expect("a config"))
        .expect("a provider");
    (f, p, nodes)
}

fn disabled(vm: &str) -> Forwarding {
    Forwarding::Disabled {
        what: format!(
            "NIC {vm}-nic of VM {vm} has enableIPForwarding false: Azure drops the pod traffic routed to it"
        ),
        fix: format!(
            "az network nic update --resource-group k8s-rg --name {vm}-nic --ip-forwarding true"
        ),
    }
}

fn sorted(mut answers: Vec<(String, Forwarding)>) -> Vec<(String, Forwarding)> {
    answers.sort_by(|a, b| a.0.cmp(&b.0));
    answers
}

fn counted(p: &AzureRoutes, op: &str) -> u64 {
    p.stats()
        .snapshot()
        .iter()
        .filter(|((o, _), _)| *o == op)
        .map(|(_, n)| *n)
        .sum()
}

#[tokio::test]
async fn a_nic_without_ip_forwarding_is_disabled_with_the_az_fix_and_one_with_it_is_ready() {
    let (f, p, nodes) = setup(2).await;
    assert!(p.capabilities().checks_forwarding);
    assert!(f.set_ip_forwarding("node-1-nic", false));
    let answers = sorted(p.check_forwarding("k8s", &nodes, REMEMBERED).await.unwrap());
    assert_eq!(
        answers,
        [
            ("node-0".to_string(), Forwarding::Ready),
            ("node-1".to_string(), disabled("node-1")),
        ]
    );
    assert_eq!((f.count("get_vm"), f.count("get_nic")), (2, 2));
    assert_eq!(f.count("put_table"), 0, "the check changes nothing");
}

#[tokio::test]
async fn the_primary_nic_of_a_vm_with_two_is_the_one_checked() {
    let (f, p, nodes) = setup(1).await;
    // node-0-nic (forwarding on) becomes secondary; the new primary is off.
    assert!(f.attach_nic("node-0", "node-0-primary", true));
    let answers = p.check_forwarding("k8s", &nodes, REMEMBERED).await.unwrap();
    let [(name, Forwarding::Disabled { what, fix })] = answers.as_slice() else {
        panic!("one Disabled answer expected: {answers:?}");
    };
    assert_eq!(name, "node-0");
    assert!(what.contains("NIC node-0-primary"), "{what}");
    assert!(fix.contains("--name node-0-primary "), "{fix}");
    assert_eq!(f.count("get_nic"), 1, "only the primary NIC is read");
}

#[tokio::test]
async fn after_the_first_check_remembered_checks_cost_no_request() {
    let (f, p, nodes) = setup(3).await;
    f.set_ip_forwarding("node-2-nic", false);
    let first = sorted(p.check_forwarding("k8s", &nodes, REMEMBERED).await.unwrap());
    assert_eq!(first.len(), 3);
    let before = f.total();
    for _ in 0..5 {
        let again = sorted(p.check_forwarding("k8s", &nodes, REMEMBERED).await.unwrap());
        assert_eq!(again, first);
    }
    assert_eq!(f.total(), before, "no request at all: {:?}", f.answers());
    assert_eq!(
        (counted(&p, ops::GET_VM), counted(&p, ops::GET_NIC)),
        (3, 3)
    );
}

#[tokio::test]
async fn a_fresh_check_reads_every_nic_again_in_one_list_of_the_resource_group() {
    let (f, p, nodes) = setup(4).await;
    f.set_ip_forwarding("node-1-nic", false);
    f.set_ip_forwarding("node-3-nic", false);
    p.check_forwarding("k8s", &nodes, FRESH).await.unwrap();
    assert_eq!(
        (f.count("get_vm"), f.count("get_nic"), f.count("list_nics")),
        (4, 4, 0),
        "the first check reads each VM and NIC once"
    );
    let answers = sorted(p.check_forwarding("k8s", &nodes, FRESH).await.unwrap());
    assert_eq!(
        (f.count("get_vm"), f.count("get_nic"), f.count("list_nics")),
        (4, 4, 1),
        "again: one list for the group, no VM, no NIC on its own"
    );
    assert_eq!(answers[1], ("node-1".to_string(), disabled("node-1")));
    assert_eq!(answers[2], ("node-2".to_string(), Forwarding::Ready));
    assert_eq!(counted(&p, ops::LIST_NICS), 1);
}

/// Regression: a NIC found with IP forwarding on was never read again, so
/// one someone turned off later left its Node `RouteCreated` while Azure
/// dropped its pods' traffic, for the life of the process.
#[tokio::test]
async fn ip_forwarding_turned_off_after_it_was_read_on_is_found_by_the_next_fresh_check() {
    let (f, p, nodes) = setup(2).await;
    let first = sorted(p.check_forwarding("k8s", &nodes, FRESH).await.unwrap());
    assert!(
        first.iter().all(|(_, a)| *a == Forwarding::Ready),
        "{first:?}"
    );
    assert!(f.set_ip_forwarding("node-0-nic", false));
    let remembered = sorted(p.check_forwarding("k8s", &nodes, REMEMBERED).await.unwrap());
    assert_eq!(remembered, first, "a remembered check answers from memory");
    let fresh = sorted(p.check_forwarding("k8s", &nodes, FRESH).await.unwrap());
    assert_eq!(
        fresh,
        [
            ("node-0".to_string(), disabled("node-0")),
            ("node-1".to_string(), Forwarding::Ready),
        ]
    );
}

#[tokio::test]
async fn a_nic_turned_on_later_is_ready_at_the_next_fresh_check() {
    let (f, p, nodes) = setup(1).await;
    f.set_ip_forwarding("node-0-nic", false);
    let first = p.check_forwarding("k8s", &nodes, REMEMBERED).await.unwrap();
    assert_eq!(first, [("node-0".to_string(), disabled("node-0"))]);
    f.set_ip_forwarding("node-0-nic", true);
    let remembered = p.check_forwarding("k8s", &nodes, REMEMBERED).await.unwrap();
    assert_eq!(remembered, first, "a remembered check answers from memory");
    let fresh = p.check_forwarding("k8s", &nodes, FRESH).await.unwrap();
    assert_eq!(fresh, [("node-0".to_string(), Forwarding::Ready)]);
    assert_eq!(
        (f.count("get_vm"), f.count("get_nic"), f.count("list_nics")),
        (1, 1, 1)
    );
}

#[tokio::test]
async fn nodes_without_a_known_vm_are_left_out_without_failing_the_check() {
    let (f, p, mut nodes) = setup(1).await;
    let sub = f.config().subscription;
    let with_id = |name: &str, id: String| {
        Arc::new(
            NodeView::new(name, format!("uid-{name}"), &["10.244.9.0/24"]).with_provider_id(id),
        )
    };
    nodes.push(Arc::new(NodeView::new(
        "bare",
        "uid-bare",
        &["10.244.8.0/24"],
    )));
    nodes.push(with_id(
        "gone",
        format!("azure:///subscriptions/{sub}/resourceGroups/k8s-rg/providers/Microsoft.Compute/virtualMachines/gone"),
    ));
    nodes.push(with_id(
        "vmss",
        format!("azure:///subscriptions/{sub}/resourceGroups/k8s-rg/providers/Microsoft.Compute/virtualMachineScaleSets/pool/virtualMachines/0"),
    ));
    let answers = p.check_forwarding("k8s", &nodes, FRESH).await.unwrap();
    assert_eq!(answers, [("node-0".to_string(), Forwarding::Ready)]);
    assert_eq!(
        (f.count("get_vm"), f.count("get_nic")),
        (2, 1),
        "node-0's VM and NIC, and the missing VM"
    );
}

#[tokio::test]
async fn a_failed_read_fails_the_check_and_what_was_read_is_not_read_again() {
    let (f, p, nodes) = setup(2).await;
    p.check_forwarding("k8s", &nodes[..1], REMEMBERED)
        .await
        .unwrap();
    f.fail_next("get_nic", 1, 503, "ServiceUnavailable");
    let e = p
        .check_forwarding("k8s", &nodes, REMEMBERED)
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Transient, "{e}");
    let answers = p.check_forwarding("k8s", &nodes, REMEMBERED).await.unwrap();
    assert_eq!(answers.len(), 2);
    assert_eq!(
        (f.count("get_vm"), f.count("get_nic")),
        (2, 3),
        "node-1's VM once; its NIC failed, then read"
    );
}
