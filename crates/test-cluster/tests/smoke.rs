//! Smoke tests of the real control plane through the fixture: the API
//! behaviour the route controller relies on (many Nodes, list + watch, 410
//! after compaction, nodes/status patches, Events, Leases, version).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{Event, Node, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::runtime::watcher;
use serde_json::json;
use test_cluster::{NETWORK_UNAVAILABLE, TestCluster, TestNode, condition, wait_until};

const NODES: usize = 1000;

fn node_name(i: usize) -> String {
    format!("smoke-{i:04}")
}

/// Collects Node names from a watcher until `want` distinct ones were seen.
async fn watch_until_seen(
    api: Api<Node>,
    config: watcher::Config,
    want: usize,
) -> Result<BTreeSet<String>, watcher::Error> {
    let mut seen = BTreeSet::new();
    let mut events = std::pin::pin!(watcher(api, config));
    while let Some(event) = events.try_next().await? {
        match event {
            watcher::Event::Apply(n) | watcher::Event::InitApply(n) => {
                if let Some(name) = n.metadata.name {
                    seen.insert(name);
                }
            }
            watcher::Event::Delete(_) | watcher::Event::Init | watcher::Event::InitDone => {}
        }
        if seen.len() >= want {
            break;
        }
    }
    Ok(seen)
}

#[tokio::test]
async fn thousand_nodes_are_listed_and_watched() {
    let cluster = TestCluster::acquire().await.expect("cluster");
    let nodes = cluster.nodes();

    // A watcher running while the Nodes are created sees them as live events.
    let live = tokio::spawn(watch_until_seen(
        nodes.clone(),
        watcher::Config::default(),
        NODES,
    ));

    let began = Instant::now();
    let created: Vec<Node> = stream::iter(0..NODES)
        .map(|i| {
            let node = TestNode::new(node_name(i))
                .pod_cidrs([format!("10.{}.{}.0/24", i / 256, i % 256)])
                .internal_ip(format!("192.168.{}.{}", i / 256, i % 256 + 1))
                .provider_id(format!("memory:///zone-a/{}", node_name(i)));
            let cluster = &cluster;
            async move { cluster.create_node(&node).await }
        })
        .buffer_unordered(32)
        .try_collect()
        .await
        .expect("create nodes");
    println!("created {NODES} Nodes in {:?}", began.elapsed());
    assert_eq!(created.len(), NODES);

    let list = nodes.list(&ListParams::default()).await.expect("list");
    assert_eq!(list.items.len(), NODES);
    let listed: BTreeSet<String> = list
        .items
        .iter()
        .filter_map(|n| n.metadata.name.clone())
        .collect();
    let expected: BTreeSet<String> = (0..NODES).map(node_name).collect();
    assert_eq!(listed, expected);
    let n17 = list
        .items
        .iter()
        .find(|n| n.metadata.name.as_deref() == Some("smoke-0017"))
        .expect("n17");
    let spec = n17.spec.as_ref().expect("spec");
    assert_eq!(
        spec.pod_cidrs.as_deref(),
        Some(&["10.0.17.0/24".to_string()][..])
    );
    assert_eq!(
        n17.status
            .as_ref()
            .and_then(|s| s.addresses.as_ref())
            .map(|a| a[0].address.as_str()),
        Some("192.168.0.18")
    );

    let seen = tokio::time::timeout(Duration::from_secs(60), live)
        .await
        .expect("live watcher finished in time")
        .expect("task")
        .expect("watch");
    assert_eq!(seen, expected);

    // A watcher started afterwards gets them from its initial (streaming) list.
    let fresh = tokio::time::timeout(
        Duration::from_secs(60),
        watch_until_seen(
            nodes.clone(),
            watcher::Config::default().streaming_lists(),
            NODES,
        ),
    )
    .await
    .expect("streaming-list watcher finished in time")
    .expect("watch");
    assert_eq!(fresh, expected);
}

fn event_for_node(name: &str, node: &str, reason: &str) -> Event {
    let now = Timestamp::now();
    Event {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some("default".into()),
            ..Default::default()
        },
        involved_object: ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(node.to_string()),
            ..Default::default()
        },
        reason: Some(reason.to_string()),
        message: Some(format!("{reason} for {node}")),
        type_: Some("Warning".into()),
        count: Some(1),
        first_timestamp: Some(Time(now)),
        last_timestamp: Some(Time(now)),
        event_time: Some(MicroTime(now)),
        reporting_component: Some("cloud-route-controller".into()),
        reporting_instance: Some("smoke".into()),
        action: Some("CreateRoute".into()),
        ..Default::default()
    }
}

fn status_code(result: &Result<WatchEvent<Event>, kube::Error>) -> Option<u16> {
    match result {
        Ok(WatchEvent::Error(status)) => Some(status.code),
        Err(kube::Error::Api(status)) => Some(status.code),
        _ => None,
    }
}

#[tokio::test]
async fn watch_from_compacted_revision_is_gone() {
    let cluster = TestCluster::acquire().await.expect("cluster");
    // Events bypass the apiserver's watch cache, so the watch reaches etcd.
    let events: Api<Event> = Api::namespaced(cluster.client(), "default");
    let first = events
        .create(
            &PostParams::default(),
            &event_for_node("compact-1", "n1", "Test"),
        )
        .await
        .expect("first event");
    let old_rv = first.metadata.resource_version.expect("rv");
    events
        .create(
            &PostParams::default(),
            &event_for_node("compact-2", "n1", "Test"),
        )
        .await
        .expect("second event");

    // Before compaction the old revision is still watchable and replays the
    // second event.
    let wp = WatchParams::default().timeout(5);
    let mut watch = events.watch(&wp, &old_rv).await.expect("watch").boxed();
    match watch.next().await {
        Some(Ok(WatchEvent::Added(e))) => assert_eq!(e.metadata.name.as_deref(), Some("compact-2")),
        other => panic!("expected the second event, got {other:?}"),
    }
    drop(watch);

    // A watch from X needs history from X + 1 on; one more write puts the
    // compaction point past that.
    events
        .create(
            &PostParams::default(),
            &event_for_node("compact-3", "n1", "Test"),
        )
        .await
        .expect("third event");
    let compacted = cluster.compact_etcd().await.expect("compact");
    assert!(compacted > old_rv.parse::<i64>().expect("numeric rv") + 1);

    let code = match events.watch(&wp, &old_rv).await {
        Err(kube::Error::Api(status)) => Some(status.code),
        Err(e) => panic!("unexpected error: {e}"),
        Ok(stream) => {
            let mut stream = stream.boxed();
            match stream.next().await {
                Some(item) => status_code(&item),
                None => None,
            }
        }
    };
    assert_eq!(
        code,
        Some(410),
        "watch from a compacted revision must be 410 Gone"
    );

    // A watch from a current revision still works after the compaction.
    let rv = events
        .list_metadata(&ListParams::default())
        .await
        .expect("list")
        .metadata
        .resource_version;
    let rv = rv.expect("list rv");
    events
        .create(
            &PostParams::default(),
            &event_for_node("compact-4", "n1", "Test"),
        )
        .await
        .expect("fourth event");
    let mut watch = events.watch(&wp, &rv).await.expect("watch").boxed();
    match watch.next().await {
        Some(Ok(WatchEvent::Added(e))) => assert_eq!(e.metadata.name.as_deref(), Some("compact-4")),
        other => panic!("expected the fourth event, got {other:?}"),
    }
}

#[tokio::test]
async fn status_patch_sets_network_unavailable_and_keeps_ready() {
    let cluster = TestCluster::acquire().await.expect("cluster");
    let node = cluster
        .create_node(
            &TestNode::new("patched")
                .pod_cidrs(["10.250.0.0/24"])
                .internal_ip("10.0.0.9"),
        )
        .await
        .expect("create");
    assert!(
        cluster
            .network_unavailable("patched")
            .await
            .expect("read")
            .is_none()
    );

    let now = Time(Timestamp::from_second(Timestamp::now().as_second()).expect("now"));
    let patch = json!({
        "status": { "conditions": [{
            "type": NETWORK_UNAVAILABLE,
            "status": "False",
            "reason": "RouteCreated",
            "message": "RouteController created a route",
            "lastTransitionTime": now,
            "lastHeartbeatTime": now,
        }]}
    });
    let patched = cluster
        .nodes()
        .patch_status(
            "patched",
            &PatchParams::default(),
            &Patch::Strategic(&patch),
        )
        .await
        .expect("patch status");
    assert_ne!(
        patched.metadata.resource_version,
        node.metadata.resource_version
    );
    let nu = condition(&patched, NETWORK_UNAVAILABLE).expect("NetworkUnavailable");
    assert_eq!(
        (nu.status.as_str(), nu.reason.as_deref()),
        ("False", Some("RouteCreated"))
    );
    let ready = condition(&patched, "Ready").expect("Ready kept");
    assert_eq!(ready.status, "True");
    // The spec is not touched by a status write.
    assert_eq!(
        patched.spec.as_ref().and_then(|s| s.pod_cidrs.clone()),
        Some(vec!["10.250.0.0/24".to_string()])
    );

    // A kubelet heartbeat moves Ready's heartbeat and leaves our condition.
    let before = ready.last_heartbeat_time.clone();
    let beat = cluster.heartbeat("patched").await.expect("heartbeat");
    assert_ne!(
        beat.metadata.resource_version,
        patched.metadata.resource_version
    );
    let ready = condition(&beat, "Ready").expect("Ready");
    assert!(
        ready.last_heartbeat_time > before,
        "heartbeat time moved forward"
    );
    let nu = cluster
        .network_unavailable("patched")
        .await
        .expect("read")
        .expect("still set");
    assert_eq!(nu.reason.as_deref(), Some("RouteCreated"));
}

#[tokio::test]
async fn events_and_leases_can_be_written() {
    let cluster = TestCluster::acquire().await.expect("cluster");
    cluster
        .create_node(&TestNode::new("evented").pod_cidrs(["10.251.0.0/24"]))
        .await
        .expect("create");
    let events: Api<Event> = Api::namespaced(cluster.client(), "default");
    events
        .create(
            &PostParams::default(),
            &event_for_node("evented.1", "evented", "FailedToCreateRoute"),
        )
        .await
        .expect("create event");
    events
        .create(
            &PostParams::default(),
            &event_for_node("other.1", "other", "FailedToCreateRoute"),
        )
        .await
        .expect("create unrelated event");
    let mine = cluster.node_events("evented").await.expect("events");
    assert_eq!(mine.len(), 1);
    assert_eq!(mine[0].reason.as_deref(), Some("FailedToCreateRoute"));

    let leases: Api<Lease> = Api::namespaced(cluster.client(), "kube-system");
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some("cloud-route-controller".into()),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some("smoke-a".into()),
            lease_duration_seconds: Some(15),
            acquire_time: Some(MicroTime(Timestamp::now())),
            renew_time: Some(MicroTime(Timestamp::now())),
            ..Default::default()
        }),
    };
    let created = leases
        .create(&PostParams::default(), &lease)
        .await
        .expect("create lease");
    // Leader election takes over with an optimistic-concurrency replace.
    let mut takeover = created.clone();
    if let Some(spec) = takeover.spec.as_mut() {
        spec.holder_identity = Some("smoke-b".into());
        spec.lease_transitions = Some(1);
    }
    let replaced = leases
        .replace("cloud-route-controller", &PostParams::default(), &takeover)
        .await
        .expect("replace lease");
    assert_eq!(
        replaced
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.as_deref()),
        Some("smoke-b")
    );
    // A stale resourceVersion is rejected.
    let stale = leases
        .replace("cloud-route-controller", &PostParams::default(), &created)
        .await;
    assert!(matches!(stale, Err(kube::Error::Api(s)) if s.code == 409));
}

#[tokio::test]
async fn acquire_hands_out_a_clean_cluster() {
    {
        let cluster = TestCluster::acquire().await.expect("cluster");
        cluster
            .create_node(&TestNode::new("leftover"))
            .await
            .expect("create");
        let events: Api<Event> = Api::namespaced(cluster.client(), "default");
        events
            .create(
                &PostParams::default(),
                &event_for_node("leftover.1", "leftover", "Test"),
            )
            .await
            .expect("event");
        let leases: Api<Lease> = Api::namespaced(cluster.client(), "kube-node-lease");
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some("leftover".into()),
                ..Default::default()
            },
            spec: Some(LeaseSpec::default()),
        };
        leases
            .create(&PostParams::default(), &lease)
            .await
            .expect("lease");
    }
    let cluster = TestCluster::acquire().await.expect("cluster");
    let nodes = cluster
        .nodes()
        .list_metadata(&ListParams::default())
        .await
        .expect("list");
    assert!(nodes.items.is_empty());
    assert!(
        cluster
            .node_events("leftover")
            .await
            .expect("events")
            .is_empty()
    );
    let leases: Api<Lease> = Api::all(cluster.client());
    let left: Vec<String> = leases
        .list_metadata(&ListParams::default())
        .await
        .expect("leases")
        .items
        .into_iter()
        .filter_map(|l| l.metadata.name)
        .collect();
    assert!(!left.iter().any(|n| n == "leftover"), "{left:?}");
    // The apiserver's identity lease survives the reset.
    assert!(left.iter().any(|n| n.starts_with("apiserver-")), "{left:?}");
}

#[tokio::test]
async fn reports_the_built_version_and_kubectl_works() {
    let cluster = TestCluster::acquire().await.expect("cluster");
    let version = cluster.client().apiserver_version().await.expect("version");
    assert_eq!(version.git_version, "v1.37.2");
    assert_eq!(
        (version.major.as_str(), version.minor.as_str()),
        ("1", "37")
    );
    if let Some(plane) = cluster.control_plane() {
        println!("control plane started in {:?}", plane.startup_time());
    }

    cluster
        .create_node(&TestNode::new("via-kubectl"))
        .await
        .expect("create");
    let kubectl = cluster.kubectl_path().expect("kubectl");
    let out = tokio::process::Command::new(&kubectl)
        .arg("--kubeconfig")
        .arg(cluster.kubeconfig_path())
        .args(["get", "nodes", "-o", "name"])
        .output()
        .await
        .expect("run kubectl");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "node/via-kubectl"
    );

    // The fixture's poll helper sees a Node that appears later.
    let nodes = cluster.nodes();
    let create = {
        let cluster = &cluster;
        async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            cluster.create_node(&TestNode::new("late")).await
        }
    };
    let wait = wait_until(Duration::from_secs(10), "Node late", || {
        let nodes = nodes.clone();
        async move { nodes.get_opt("late").await.ok().flatten() }
    });
    let (created, seen) = tokio::join!(create, wait);
    created.expect("create late");
    assert_eq!(seen.expect("seen").metadata.name.as_deref(), Some("late"));
}

#[tokio::test]
async fn apiserver_restarts_alone_and_keeps_the_data() {
    // A private control plane: the shared one serves the other tests.
    let mut plane = test_cluster::ControlPlane::start(test_cluster::StartOptions::default())
        .await
        .expect("private control plane");
    let client = test_cluster::client_from_kubeconfig(plane.kubeconfig())
        .await
        .unwrap();
    let nodes: Api<Node> = Api::all(client);
    nodes
        .create(
            &PostParams::default(),
            &TestNode::new("survivor")
                .pod_cidrs(["10.244.1.0/24"])
                .to_node(),
        )
        .await
        .unwrap();
    let pids_before = std::fs::read_to_string(plane.dir().join("pids")).unwrap();
    plane.restart_apiserver().await.unwrap();
    let pids_after = std::fs::read_to_string(plane.dir().join("pids")).unwrap();
    let (etcd_before, api_before) = pids_before.trim().split_once(' ').unwrap();
    let (etcd_after, api_after) = pids_after.trim().split_once(' ').unwrap();
    assert_eq!(etcd_before, etcd_after, "etcd keeps running");
    assert_ne!(api_before, api_after, "a new kube-apiserver process");
    let client = test_cluster::client_from_kubeconfig(plane.kubeconfig())
        .await
        .unwrap();
    let nodes: Api<Node> = Api::all(client);
    assert!(nodes.get("survivor").await.is_ok(), "data kept");
    plane.stop().unwrap();
}
