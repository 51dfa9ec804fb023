//! The provider against the fake ARM API (feature `testing`) over HTTP: the
//! batch write path (one `PUT` per batch), `412` on a stale ETag and the
//! re-read that keeps a concurrent writer's routes, failed operations,
//! throttling, the three credentials, and ownership on a shared table.

use std::sync::Arc;
use std::time::Duration;

use provider_azure::testing::{FakeAzure, FakeConfig};
use provider_azure::{AzureConfig, AzureRoutes, ops};
use route_cloud::{Batch, CloudRoutes, ErrorKind};
use route_core::{Cidr, NodeAddress, NodeView, Route};

const TABLE: &str = "k8s-routes";

async fn fake(config: FakeConfig) -> FakeAzure {
    let f = FakeAzure::start(config).await.expect("the fake starts");
    f.add_table(TABLE);
    f
}

fn config(f: &FakeAzure) -> AzureConfig {
    AzureConfig::from_yaml(&f.cloud_config(TABLE)).expect("a config")
}

fn node(i: u32) -> NodeView {
    NodeView::new(format!("node-{i}"), format!("uid-{i}"), &[]).with_addresses(vec![
        NodeAddress::internal_ip(format!("10.0.{}.{}", i / 250, i % 250 + 4)),
    ])
}

fn cidr(i: u32) -> Cidr {
    Cidr::parse(&format!("10.244.{}.0/24", i)).expect("a CIDR")
}

fn want(n: &NodeView, d: Cidr) -> Route {
    Route::new(n.name.as_str(), d).with_addresses(n.addresses.clone(), false)
}

/// The routes of the Nodes in `range`, each with its name hint.
fn wanted(range: std::ops::Range<u32>) -> Vec<(String, Route)> {
    range
        .map(|i| {
            let n = node(i);
            (n.uid.clone(), want(&n, cidr(i)))
        })
        .collect()
}

fn creations(range: std::ops::Range<u32>) -> Batch {
    Batch::new(&[], &wanted(range))
}

fn observe(p: &AzureRoutes, range: std::ops::Range<u32>) {
    let nodes: Vec<Arc<NodeView>> = range.map(|i| Arc::new(node(i))).collect();
    p.observe_nodes(&nodes);
}

#[tokio::test]
async fn a_burst_of_100_creations_is_one_put_and_10_deletions_another() {
    let f = fake(FakeConfig::default()).await;
    let p = AzureRoutes::new(config(&f)).unwrap();
    observe(&p, 0..100);
    let results = p.apply_batch("c", &creations(0..100)).await.unwrap();
    assert_eq!(results.len(), 100);
    assert!(
        results.values().all(|r| matches!(r, Ok(Some(_)))),
        "{results:?}"
    );
    assert_eq!(f.count(ops::PUT_TABLE), 1, "{:?}", f.answers());
    assert_eq!(f.routes(TABLE).len(), 100);
    // Names are upstream's single-stack names, next hops the InternalIPs.
    assert!(f.routes(TABLE).iter().any(|r| *r
        == (
            "node-7".into(),
            "10.244.7.0/24".into(),
            "VirtualAppliance".into(),
            "10.0.0.11".into()
        )));

    let listed = p.list_routes("c").await.unwrap();
    assert_eq!(listed.len(), 100);
    let gone: Vec<Route> = listed
        .into_iter()
        .filter(|r| r.node.ends_with('3'))
        .collect();
    assert_eq!(gone.len(), 10);
    let batch = Batch::new(&gone, &[]);
    let results = p.apply_batch("c", &batch).await.unwrap();
    assert_eq!(results.len(), 10);
    assert!(
        results.values().all(|r| matches!(r, Ok(None))),
        "{results:?}"
    );
    assert_eq!(f.count(ops::PUT_TABLE), 2);
    assert_eq!(f.routes(TABLE).len(), 90);
    eprintln!(
        "azure requests for 100 creations then 10 deletions: {:?}",
        f.answers()
    );
}

#[tokio::test]
async fn a_concurrent_writers_route_survives_the_412_and_the_retry() {
    let f = fake(FakeConfig::default()).await;
    let p = AzureRoutes::new(config(&f)).unwrap();
    observe(&p, 0..10);
    p.list_routes("c").await.unwrap();
    // Between our read and our write another writer adds its route.
    f.put_route_before_next_put(
        TABLE,
        "to-firewall",
        "0.0.0.0/0",
        "VirtualAppliance",
        Some("10.0.0.4"),
    );
    let results = p.apply_batch("c", &creations(0..10)).await.unwrap();
    assert_eq!(results.len(), 10);
    assert!(
        results.values().all(|r| matches!(r, Ok(Some(_)))),
        "{results:?}"
    );
    assert_eq!(f.count_status(ops::PUT_TABLE, 412), 1, "{:?}", f.answers());
    assert_eq!(p.conflict_retries(), 1);
    let routes = f.routes(TABLE);
    assert_eq!(routes.len(), 11, "{routes:?}");
    assert!(
        routes.iter().any(|r| r.0 == "to-firewall"),
        "the other writer's route was lost: {routes:?}"
    );
    eprintln!(
        "412 retries with a concurrent writer: {}",
        p.conflict_retries()
    );
}

#[tokio::test]
async fn two_controllers_writing_one_table_lose_no_update() {
    let f = Arc::new(
        fake(FakeConfig {
            operation_duration: Duration::from_millis(200),
            ..FakeConfig::default()
        })
        .await,
    );
    let a = Arc::new(AzureRoutes::new(config(&f)).unwrap());
    let b = Arc::new(AzureRoutes::new(config(&f)).unwrap());
    let run = |p: Arc<AzureRoutes>, range: std::ops::Range<u32>| async move {
        let batch = creations(range);
        for _ in 0..20 {
            match p.apply_batch("c", &batch).await {
                Ok(r) if r.len() == batch.len() && r.values().all(Result::is_ok) => {
                    return Ok(());
                }
                Ok(r) => return Err(format!("{r:?}")),
                // Another writer's operation holds the table: wait as asked.
                Err(e) if e.kind == ErrorKind::Throttled || e.kind == ErrorKind::Conflict => {
                    tokio::time::sleep(
                        e.retry_after
                            .unwrap_or(Duration::from_millis(50))
                            .min(Duration::from_secs(2)),
                    )
                    .await;
                }
                Err(e) => return Err(e.to_string()),
            }
        }
        Err("no success in 20 tries".to_string())
    };
    let (ra, rb) = tokio::join!(run(a.clone(), 0..20), run(b.clone(), 20..40));
    ra.unwrap();
    rb.unwrap();
    assert_eq!(f.routes(TABLE).len(), 40, "{:?}", f.routes(TABLE));
    eprintln!(
        "two writers: 412 retries {} + {}, answers {:?}",
        a.conflict_retries(),
        b.conflict_retries(),
        f.answers()
    );
}

#[tokio::test]
async fn a_failed_operation_fails_the_batch_and_changes_nothing() {
    let f = fake(FakeConfig::default()).await;
    let p = AzureRoutes::new(config(&f)).unwrap();
    f.fail_next_operation("InternalServerError");
    let e = p.apply_batch("c", &creations(0..3)).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Transient, "{e}");
    assert!(f.routes(TABLE).is_empty());
    // Retried, it goes through (the ETag changed; the provider re-reads).
    let r = p.apply_batch("c", &creations(0..3)).await.unwrap();
    assert!(r.len() == 3 && r.values().all(Result::is_ok), "{r:?}");
    assert_eq!(f.routes(TABLE).len(), 3);
    f.fail_next_operation("QuotaExceeded");
    let e = p.apply_batch("c", &creations(3..4)).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::QuotaExceeded, "{e}");
}

#[tokio::test]
async fn operations_are_polled_until_they_end() {
    let f = fake(FakeConfig {
        operation_duration: Duration::from_millis(300),
        ..FakeConfig::default()
    })
    .await;
    let p = AzureRoutes::new(config(&f)).unwrap();
    p.apply_batch("c", &creations(0..2)).await.unwrap();
    // 300 ms of operation at a 20-50 ms poll interval.
    assert!(f.count("get_operation") >= 3, "{:?}", f.answers());
    // The last poll said Succeeded; the final read saw the routes settled.
    assert_eq!(
        f.count_status("get_operation", 200),
        f.count("get_operation")
    );
}

#[tokio::test]
async fn a_full_table_is_refused_without_a_request() {
    let f = fake(FakeConfig::default()).await;
    let mut c = config(&f);
    c.max_routes = 5;
    let p = AzureRoutes::new(c).unwrap();
    let batch = creations(0..7);
    let r = p.apply_batch("c", &batch).await.unwrap();
    assert_eq!(r.len(), 7);
    assert_eq!(r.values().filter(|r| r.is_ok()).count(), 5);
    assert!(
        batch.create[5..]
            .iter()
            .all(|(k, _, _)| matches!(&r[k], Err(e) if e.kind == ErrorKind::QuotaExceeded)),
        "{r:?}"
    );
    let puts = f.count(ops::PUT_TABLE);
    let e = p
        .create_route("c", "u", &want(&node(9), cidr(9)))
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::QuotaExceeded);
    assert!(e.message.contains("at most 5"), "{}", e.message);
    assert_eq!(f.count(ops::PUT_TABLE), puts, "a refused creation was sent");
}

#[tokio::test]
async fn throttling_is_classified_with_its_retry_after_and_waited_out() {
    let f = fake(FakeConfig {
        writes: (200, 1.0),
        retry_after_as_date: true,
        ..FakeConfig::default()
    })
    .await;
    let p = AzureRoutes::new(config(&f)).unwrap();
    p.list_routes("c").await.unwrap();
    f.consume_writes(200);
    let e = p.apply_batch("c", &creations(0..1)).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Throttled, "{e}");
    let wait = e.retry_after.expect("a Retry-After");
    assert!(wait <= Duration::from_secs(2), "{wait:?}");
    // The next call waits out the Retry-After instead of being refused again.
    let batch = creations(0..1);
    let r = p.apply_batch("c", &batch).await.unwrap();
    assert!(r[&batch.create[0].0].is_ok(), "{r:?}");
    assert_eq!(f.count_status(ops::PUT_TABLE, 429), 1, "{:?}", f.answers());
}

#[tokio::test]
async fn workload_identity_and_managed_identity_get_tokens_and_secrets_stay_out_of_errors() {
    let f = fake(FakeConfig::default()).await;
    let dir = std::env::temp_dir().join(format!("azure-wi-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let token_file = dir.join("token");
    std::fs::write(&token_file, f.config().federated_token).unwrap();

    let mut wi = config(&f);
    wi.aad_client_secret = provider_kit::Secret::default();
    wi.use_federated_workload_identity_extension = true;
    wi.aad_federated_token_file = Some(token_file.clone());
    let p = AzureRoutes::new(wi.clone()).unwrap();
    p.list_routes("c").await.unwrap();

    // A rotated but wrong token is refused and named as a credential problem.
    std::fs::write(&token_file, "stale.token").unwrap();
    let p = AzureRoutes::new(wi).unwrap();
    let e = p.list_routes("c").await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Permanent, "{e}");
    assert!(e.message.contains("invalid_client"), "{e}");
    assert!(!e.message.contains("stale.token"), "{e}");

    let mut mi = config(&f);
    mi.aad_client_secret = provider_kit::Secret::default();
    mi.use_managed_identity_extension = true;
    AzureRoutes::new(mi)
        .unwrap()
        .list_routes("c")
        .await
        .unwrap();
    assert_eq!(f.count("imds_token"), 1);

    let mut bad = config(&f);
    bad.aad_client_secret = provider_kit::Secret::new("wrong-secret-value");
    let p = AzureRoutes::new(bad).unwrap();
    let e = p.list_routes("c").await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Permanent);
    for shown in [e.to_string(), format!("{p:?}"), format!("{:?}", config(&f))] {
        assert!(
            !shown.contains("wrong-secret-value") && !shown.contains("fake-client-secret"),
            "{shown}"
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[tokio::test]
async fn only_this_clusters_routes_are_listed_and_foreign_ones_survive_every_write() {
    let f = fake(FakeConfig::default()).await;
    for (name, prefix, hop_type, hop) in [
        // A firewall in the hub network: a Node-like name, a next hop
        // outside the Nodes' subnet.
        (
            "to-firewall",
            "0.0.0.0/0",
            "VirtualAppliance",
            Some("10.1.0.4"),
        ),
        ("onprem", "192.168.0.0/16", "VirtualNetworkGateway", None),
        (
            "Peering_Route",
            "10.99.0.0/16",
            "VirtualAppliance",
            Some("10.0.0.5"),
        ),
        // A node-like name whose dual-stack suffix is not its prefix.
        (
            "node-1____102449024",
            "10.244.77.0/24",
            "VirtualAppliance",
            Some("10.0.0.5"),
        ),
        // Ours: a Node that is gone.
        (
            "node-gone",
            "10.244.200.0/24",
            "VirtualAppliance",
            Some("10.0.0.200"),
        ),
    ] {
        f.put_route(TABLE, name, prefix, hop_type, hop);
    }
    let mut c = config(&f);
    c.node_subnets = vec![Cidr::parse("10.0.0.0/24").unwrap()];
    let p = AzureRoutes::new(c).unwrap();
    // Before the controller shows its Nodes, no route of an unknown Node is
    // called this cluster's.
    assert!(p.list_routes("c").await.unwrap().is_empty());
    observe(&p, 0..3);
    let all = p.list_routes("c").await.unwrap();
    // The firewall route's next hop is outside the Nodes' subnet: listed as
    // someone else's, so a pod CIDR over it is reported, never routed twice.
    let theirs: Vec<&str> = all
        .iter()
        .filter(|r| r.foreign.is_some())
        .map(|r| r.name.as_str())
        .collect();
    assert_eq!(theirs, ["to-firewall"]);
    let listed: Vec<Route> = all.into_iter().filter(|r| r.foreign.is_none()).collect();
    let names: Vec<&str> = listed.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["node-gone"]);
    assert_eq!(listed[0].node, "node-gone");
    let batch = Batch::new(&listed, &wanted(0..3));
    let r = p.apply_batch("c", &batch).await.unwrap();
    assert!(r.len() == 4 && r.values().all(Result::is_ok), "{r:?}");
    let routes: Vec<String> = f.routes(TABLE).into_iter().map(|r| r.0).collect();
    assert_eq!(
        routes,
        [
            "to-firewall",
            "onprem",
            "Peering_Route",
            "node-1____102449024",
            "node-0",
            "node-1",
            "node-2"
        ]
    );
}

#[tokio::test]
async fn dual_stack_names_are_upstreams_and_one_node_takes_both_families() {
    let f = fake(FakeConfig::default()).await;
    let mut c = config(&f);
    c.ipv6_dual_stack_enabled = true;
    let p = AzureRoutes::new(c).unwrap();
    let n = NodeView::new("dual", "uid", &[]).with_addresses(vec![
        NodeAddress::internal_ip("10.0.0.9"),
        NodeAddress::internal_ip("fd00::9"),
    ]);
    let batch = Batch::new(
        &[],
        &[
            (
                n.uid.clone(),
                want(&n, Cidr::parse("10.244.9.0/24").unwrap()),
            ),
            (
                n.uid.clone(),
                want(&n, Cidr::parse("fd00:10:244:9::/64").unwrap()),
            ),
        ],
    );
    let r = p.apply_batch("c", &batch).await.unwrap();
    assert!(r.len() == 2 && r.values().all(Result::is_ok), "{r:?}");
    let mut names: Vec<String> = f.routes(TABLE).into_iter().map(|r| r.0).collect();
    names.sort();
    assert_eq!(names, ["dual____102449024", "dual____fd0010244964"]);
    // Single-stack names are one per Node: a second CIDR is refused, not
    // written over the first.
    let p1 = AzureRoutes::new(config(&f)).unwrap();
    let n2 = node(2);
    p1.create_route("c", "u", &want(&n2, cidr(2)))
        .await
        .unwrap();
    let e = p1
        .create_route("c", "u", &want(&n2, cidr(3)))
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidRequest);
    assert!(e.message.contains("ipv6DualStackEnabled"), "{e}");
}

/// A VM with two user-assigned identities: IMDS answers only a request that
/// names one, by client ID (`client_id`) or by resource ID (`msi_res_id`,
/// upstream's `userAssignedIdentityID` that names a subscription); a
/// request naming none is refused as IMDS refuses it.
#[tokio::test]
async fn a_user_assigned_identity_is_named_to_imds_by_client_id_or_resource_id() {
    let f = fake(FakeConfig::default()).await;
    let routes_id = "/subscriptions/s/resourceGroups/rg/providers/Microsoft.ManagedIdentity/userAssignedIdentities/routes";
    f.set_vm_identities(&[
        ("11111111-1111-1111-1111-111111111111", routes_id),
        (
            "22222222-2222-2222-2222-222222222222",
            "/subscriptions/s/resourceGroups/rg/providers/Microsoft.ManagedIdentity/userAssignedIdentities/kubelet",
        ),
    ]);
    let mi = |id: &str| {
        let mut c = config(&f);
        c.aad_client_secret = provider_kit::Secret::default();
        c.use_managed_identity_extension = true;
        c.user_assigned_identity_id = id.to_string();
        AzureRoutes::new(c).unwrap()
    };
    mi(routes_id).list_routes("c").await.unwrap();
    mi("22222222-2222-2222-2222-222222222222")
        .list_routes("c")
        .await
        .unwrap();
    let e = mi("").list_routes("c").await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Permanent, "{e}");
    assert!(
        e.message.contains("Multiple user assigned identities"),
        "{e}"
    );
    assert_eq!(
        f.imds_requests(),
        vec![
            (None, Some(routes_id.to_string())),
            (
                Some("22222222-2222-2222-2222-222222222222".to_string()),
                None
            ),
            (None, None),
        ]
    );
}

/// A throwaway RSA certificate and its key, as one PEM file.
fn certificate_pem(dir: &std::path::Path, name: &str) -> (std::path::PathBuf, Vec<u8>) {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_RSA_SHA256).expect("an RSA key");
    let cert = rcgen::CertificateParams::new(vec![name.to_string()])
        .expect("certificate parameters")
        .self_signed(&key)
        .expect("a self-signed certificate");
    let path = dir.join(format!("{name}.pem"));
    std::fs::write(&path, format!("{}{}", cert.pem(), key.serialize_pem())).expect("write the PEM");
    (path, cert.der().to_vec())
}

/// `aadClientCertPath` as the cloud-controller-manager reads it: a PEM
/// certificate and key sign a client assertion the token endpoint checks
/// against the certificate registered for the application; a certificate
/// the application does not have is refused as a credential problem; a
/// PKCS#12 file is refused at start with the command that converts it.
#[tokio::test]
async fn a_client_certificate_signs_the_assertion_the_token_endpoint_checks() {
    let f = fake(FakeConfig::default()).await;
    let dir = std::env::temp_dir().join(format!("azure-cert-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (registered, der) = certificate_pem(&dir, "routes");
    let (other, _) = certificate_pem(&dir, "other");
    f.register_client_certificate(&der);
    let with_cert = |path: &std::path::Path| {
        let mut c = config(&f);
        c.aad_client_secret = provider_kit::Secret::default();
        c.aad_client_cert_path = path.display().to_string();
        c
    };

    AzureRoutes::new(with_cert(&registered))
        .unwrap()
        .list_routes("c")
        .await
        .unwrap();
    assert_eq!(f.count("token"), 1);
    let e = AzureRoutes::new(with_cert(&other))
        .unwrap()
        .list_routes("c")
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Permanent, "{e}");
    assert!(e.message.contains("invalid_client"), "{e}");

    // The fake checks the signature, not only the thumbprint: the same
    // assertion with its claims changed is refused.
    let cert = provider_azure::client_cert::ClientCertificate::load(&registered, "").unwrap();
    let url = format!("{}/{}/oauth2/v2.0/token", f.base_url(), f.config().tenant);
    let client_id = f.config().client_id;
    let good = cert.assertion(&client_id, &url).unwrap();
    let tampered = {
        use base64::Engine;
        use base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let mut parts: Vec<String> = good.split('.').map(str::to_string).collect();
        let mut claims: serde_json::Value =
            serde_json::from_slice(&URL_SAFE_NO_PAD.decode(&parts[1]).unwrap()).unwrap();
        claims["jti"] = "replayed".into();
        parts[1] = URL_SAFE_NO_PAD.encode(claims.to_string());
        parts.join(".")
    };
    let post = |assertion: String| {
        let (url, client_id) = (url.clone(), client_id.clone());
        async move {
            reqwest::Client::new()
                .post(url)
                .form(&[
                    ("grant_type", "client_credentials"),
                    ("client_id", client_id.as_str()),
                    (
                        "client_assertion_type",
                        "urn:ietf:params:oauth:client-assertion-type:jwt-bearer",
                    ),
                    ("client_assertion", assertion.as_str()),
                    ("scope", "https://management.azure.com/.default"),
                ])
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    assert_eq!(post(good).await, 200);
    assert_eq!(post(tampered).await, 401);

    let pfx = dir.join("sp.pfx");
    std::fs::write(&pfx, [0x30, 0x82, 0x0a, 0x00, 0x02, 0x01, 0x03]).unwrap();
    let mut c = with_cert(&pfx);
    c.aad_client_cert_password = provider_kit::Secret::new("pfx-password");
    let e = c.credential().unwrap_err().to_string();
    assert!(
        e.contains("aadClientCertPath") && e.contains("PKCS#12") && e.contains("openssl pkcs12"),
        "{e}"
    );
    assert!(!e.contains("pfx-password"), "{e}");
    std::fs::remove_dir_all(&dir).ok();
}
