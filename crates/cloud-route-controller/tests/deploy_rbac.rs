//! `deploy/` against the real API server: the manifests apply with a
//! server-side dry run, the controller routes Nodes with nothing but the
//! deploy ServiceAccount's token, and that identity can neither read Secrets
//! nor change Nodes beyond their status.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{Controller, TempDir, free_port, http_get, https_get};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Node, Secret, ServiceAccount};
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use test_cluster::{TestCluster, TestNode, client_from_kubeconfig, wait_until};

const NAMESPACE: &str = "kube-system";
const NAME: &str = "cloud-route-controller";
const RBAC_KINDS: &[&str] = &[
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
];

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

/// Runs kubectl against the fixture's cluster; returns stdout or panics with stderr.
fn kubectl(kubectl: &Path, kubeconfig: &Path, args: &[&str]) -> String {
    let out = Command::new(kubectl)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .output()
        .expect("run kubectl");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "kubectl {args:?} failed\nstdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The objects `kubectl apply -k deploy/` would send, as JSON values.
fn rendered(kubectl_bin: &Path, kubeconfig: &Path) -> Vec<Value> {
    let yaml = kubectl(
        kubectl_bin,
        kubeconfig,
        &["kustomize", deploy_dir().to_str().expect("utf-8 path")],
    );
    let mut docs = Vec::new();
    for doc in serde_yaml_ng::Deserializer::from_str(&yaml) {
        let v: Value = serde::Deserialize::deserialize(doc).expect("kustomize output is YAML");
        if !v.is_null() {
            docs.push(v);
        }
    }
    docs
}

fn kind(v: &Value) -> &str {
    v["kind"].as_str().unwrap_or("")
}

fn find<'a>(docs: &'a [Value], k: &str) -> &'a Value {
    docs.iter()
        .find(|d| kind(d) == k)
        .unwrap_or_else(|| panic!("deploy/ renders no {k}"))
}

/// Deletes the applied objects however the test ends; the cluster is shared.
struct Applied {
    kubectl: PathBuf,
    kubeconfig: PathBuf,
    file: PathBuf,
}

impl Drop for Applied {
    fn drop(&mut self) {
        let _ = Command::new(&self.kubectl)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(["delete", "--ignore-not-found", "--wait=false", "-f"])
            .arg(&self.file)
            .output();
    }
}

/// A kubeconfig for the same server and CA as `admin`, authenticated by `token`.
fn token_kubeconfig(admin: &Path, token: &str, out: &Path) {
    let kc = kube::config::Kubeconfig::read_from(admin).expect("fixture kubeconfig");
    let cluster = kc
        .clusters
        .first()
        .and_then(|c| c.cluster.clone())
        .expect("a cluster entry");
    let server = cluster.server.expect("server");
    let ca = cluster
        .certificate_authority_data
        .expect("the fixture embeds its CA");
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\nusers:\n- name: {NAME}\n  user:\n    token: {token}\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: {NAME}\ncurrent-context: c\n"
    );
    std::fs::write(out, text).expect("write kubeconfig");
}

fn forbidden<T: std::fmt::Debug>(what: &str, r: Result<T, kube::Error>) {
    match r {
        Err(kube::Error::Api(s)) if s.code == 403 => {}
        other => panic!("{what}: expected 403 Forbidden, got {other:?}"),
    }
}

/// Whether a controller log shows a permission error: the API server's
/// `Forbidden` reason or a 403 status code, not any "403" (a random resync
/// period such as `80639.187808403s` contains one).
fn was_refused(log: &str) -> bool {
    log.to_lowercase().contains("forbidden")
        || log.contains("code: 403")
        || log.contains(" 403 ")
        || log.contains("status=403")
}

#[test]
fn a_resync_period_with_403_in_its_digits_is_not_a_permission_error() {
    assert!(!was_refused(
        "INFO starting cloud-route-controller resync=80639.187808403s identity=rbac-test-0"
    ));
    assert!(was_refused(
        "ERROR patch failed: ApiError: nodes \"a\" is forbidden: User cannot patch (ErrorResponse { reason: \"Forbidden\", code: 403 })"
    ));
    assert!(was_refused("WARN request failed status=403"));
}

#[test]
fn the_rendered_deployment_is_hardened_and_its_flags_are_accepted() {
    // Needs only kubectl (for kustomize), not the cluster.
    let kubectl_bin = test_cluster::Binaries::locate()
        .expect("control-plane binaries")
        .kubectl();
    let dir = TempDir::new("deploy-static");
    let empty = dir.path().join("empty-kubeconfig");
    std::fs::write(&empty, "apiVersion: v1\nkind: Config\n").unwrap();
    let docs = rendered(&kubectl_bin, &empty);

    assert!(
        docs.iter().all(|d| kind(d) != "Secret"),
        "credentials must not be part of the kustomization"
    );
    for d in &docs {
        if kind(d) != "ClusterRole" && kind(d) != "ClusterRoleBinding" {
            assert_eq!(d["metadata"]["namespace"], NAMESPACE, "{d}");
        }
    }

    let deploy = find(&docs, "Deployment");
    assert_eq!(deploy["spec"]["replicas"], 2);
    let pod = &deploy["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], NAME);
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    let containers = pod["containers"].as_array().expect("containers");
    assert_eq!(containers.len(), 1);
    let c = &containers[0];
    let sc = &c["securityContext"];
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]));
    assert!(c["resources"]["requests"]["cpu"].is_string());
    assert!(c["resources"]["requests"]["memory"].is_string());

    // The probes reach the binary's --metrics-bind-address port.
    let port_of = |p: &Value| -> i64 {
        match &p["httpGet"]["port"] {
            Value::Number(n) => n.as_i64().unwrap(),
            Value::String(name) => c["ports"]
                .as_array()
                .unwrap()
                .iter()
                .find(|x| x["name"] == *name)
                .and_then(|x| x["containerPort"].as_i64())
                .unwrap_or_else(|| panic!("no port named {name}")),
            other => panic!("probe port {other}"),
        }
    };
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(port_of(&c["livenessProbe"]), 10288);
    assert_eq!(port_of(&c["readinessProbe"]), 10288);

    // Identity and Lease namespace from the downward API.
    let env = c["env"].as_array().expect("env");
    let env_field = |name: &str| {
        env.iter()
            .find(|e| e["name"] == name)
            .map(|e| e["valueFrom"].clone())
            .unwrap_or(Value::Null)
    };
    assert_eq!(
        env_field("POD_NAME")["fieldRef"]["fieldPath"],
        "metadata.name"
    );
    assert_eq!(
        env_field("POD_NAMESPACE")["fieldRef"]["fieldPath"],
        "metadata.namespace"
    );
    assert!(
        env_field("HCLOUD_TOKEN")["secretKeyRef"]["name"].is_string(),
        "the token comes from a Secret"
    );

    // The config the Deployment mounts is a valid provider config.
    let args: Vec<String> = c["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| a.as_str().expect("string arg").to_string())
        .collect();
    let flag = |name: &str| {
        args.iter()
            .find_map(|a| a.strip_prefix(&format!("{name}=")))
            .unwrap_or_else(|| panic!("{name} missing from {args:?}"))
            .to_string()
    };
    let config_path = flag("--cloud-config");
    let mount = c["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| config_path.starts_with(m["mountPath"].as_str().unwrap_or("-")))
        .expect("--cloud-config lies in a mounted volume");
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == mount["name"])
        .expect("the mounted volume");
    let cm_name = volume["configMap"]["name"].as_str().expect("a ConfigMap");
    let file = Path::new(&config_path)
        .file_name()
        .unwrap()
        .to_str()
        .unwrap();
    let cm = docs
        .iter()
        .find(|d| kind(d) == "ConfigMap" && d["metadata"]["name"] == cm_name)
        .expect("the ConfigMap is part of deploy/");
    let cloud_yaml = cm["data"][file].as_str().expect("the config file key");
    assert_eq!(flag("--cloud-provider"), "hcloud");
    let parsed: Result<provider_hcloud::HcloudConfig, _> = serde_yaml_ng::from_str(cloud_yaml);
    assert!(parsed.is_ok(), "{cloud_yaml}: {parsed:?}");
    assert_eq!(
        flag("--leader-elect-resource-namespace"),
        "$(POD_NAMESPACE)"
    );

    // Every flag is known to the binary and validates: run it with the
    // Deployment's args (config path and namespace made local) and
    // --configure-cloud-routes=false, which stays up idle until SIGTERM, then exits 0.
    let local_config = dir.path().join(file);
    std::fs::write(&local_config, cloud_yaml).unwrap();
    let local_args: Vec<String> = args
        .iter()
        .map(|a| {
            a.replace(&config_path, local_config.to_str().unwrap())
                .replace("$(POD_NAMESPACE)", NAMESPACE)
        })
        .collect();
    let out = common::run_until_idle(
        Command::new(common::binary())
            .args(&local_args)
            .arg("--configure-cloud-routes=false")
            .env_remove("POD_NAME"),
    );
    assert!(
        out.status.success(),
        "the Deployment's args are refused: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn deploy_applies_and_its_service_account_routes_nodes_with_least_privilege() {
    let c = TestCluster::acquire().await.unwrap();
    let admin_kubeconfig = c.kubeconfig_path().to_owned();
    let kubectl_bin = c.kubectl_path().unwrap();
    let deploy = deploy_dir();
    let deploy = deploy.to_str().unwrap();

    // 1. Everything applies with a server-side dry run (admission and
    //    validation included), and nothing is created by it.
    let out = kubectl(
        &kubectl_bin,
        &admin_kubeconfig,
        &["apply", "--dry-run=server", "-k", deploy],
    );
    for k in [
        "serviceaccount/",
        "clusterrole.rbac.authorization.k8s.io/",
        "role.rbac.authorization.k8s.io/",
        "deployment.apps/",
        "configmap/",
    ] {
        assert!(out.contains(k), "dry run did not cover {k}:\n{out}");
    }
    let sas: Api<ServiceAccount> = Api::namespaced(c.client(), NAMESPACE);
    assert!(
        sas.get_opt(NAME).await.unwrap().is_none(),
        "a dry run created the ServiceAccount"
    );

    // 2. The RBAC objects, exactly as kustomize renders them, for real.
    let dir = TempDir::new("deploy-rbac");
    let docs: Vec<Value> = rendered(&kubectl_bin, &admin_kubeconfig)
        .into_iter()
        .filter(|d| RBAC_KINDS.contains(&kind(d)))
        .collect();
    assert_eq!(docs.len(), RBAC_KINDS.len(), "{docs:?}");
    let rbac_file = dir.path().join("rbac.json");
    std::fs::write(
        &rbac_file,
        serde_json::to_string(&json!({"apiVersion": "v1", "kind": "List", "items": docs})).unwrap(),
    )
    .unwrap();
    let _applied = Applied {
        kubectl: kubectl_bin.clone(),
        kubeconfig: admin_kubeconfig.clone(),
        file: rbac_file.clone(),
    };
    kubectl(
        &kubectl_bin,
        &admin_kubeconfig,
        &["apply", "-f", rbac_file.to_str().unwrap()],
    );

    // 3. A token of the ServiceAccount, and a kubeconfig that uses only it.
    let tr = sas
        .create_token_request(
            NAME,
            &PostParams::default(),
            &TokenRequest {
                spec: TokenRequestSpec {
                    expiration_seconds: Some(3600),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await
        .expect("TokenRequest for the deploy ServiceAccount");
    let token = tr.status.expect("token status").token;
    let sa_kubeconfig = dir.path().join("sa-kubeconfig");
    token_kubeconfig(&admin_kubeconfig, &token, &sa_kubeconfig);
    let sa = client_from_kubeconfig(&sa_kubeconfig).await.unwrap();

    // 4. The controller with that identity, leader election on, routes Nodes
    // and checks scrapers' tokens on its secure port.
    let metrics = format!("127.0.0.1:{}", free_port());
    let secure_port = free_port();
    let secure_arg = secure_port.to_string();
    let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    let made = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).unwrap();
    std::fs::write(&key, made.signing_key.serialize_pem()).unwrap();
    std::fs::write(&cert, made.cert.pem()).unwrap();
    let ca = made.cert.der().clone();
    let identity = "rbac-test-0";
    let ctl = Controller::start(
        &sa_kubeconfig,
        dir.path(),
        "controller",
        &[
            "--cluster-cidr",
            "10.244.0.0/16",
            "--cloud-provider",
            "memory",
            "--leader-elect=true",
            "--leader-elect-resource-namespace",
            NAMESPACE,
            "--leader-elect-identity",
            identity,
            "--metrics-bind-address",
            &metrics,
            "--secure-port",
            &secure_arg,
            "--bind-address",
            "127.0.0.1",
            "--tls-cert-file",
            cert.to_str().unwrap(),
            "--tls-private-key-file",
            key.to_str().unwrap(),
        ],
    );
    for i in 0..3 {
        c.create_node(
            &TestNode::new(format!("rbac-{i}"))
                .pod_cidrs([format!("10.244.{i}.0/24")])
                .internal_ip(format!("10.0.0.{}", i + 10)),
        )
        .await
        .unwrap();
    }
    // A pod CIDR outside --cluster-cidr: the controller must be able to say so with an Event.
    c.create_node(
        &TestNode::new("rbac-outside")
            .pod_cidrs(["192.168.7.0/24"])
            .internal_ip("10.0.0.99"),
    )
    .await
    .unwrap();
    for i in 0..3 {
        let name = format!("rbac-{i}");
        wait_until(
            Duration::from_secs(60),
            &format!("NetworkUnavailable=False/RouteCreated on {name}"),
            || async {
                let cond = c.network_unavailable(&name).await.ok()??;
                (cond.status == "False" && cond.reason.as_deref() == Some("RouteCreated"))
                    .then_some(())
            },
        )
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));
    }
    wait_until(
        Duration::from_secs(30),
        "a PodCIDROutsideClusterCIDR Event on rbac-outside",
        || async {
            let ev = c.node_events("rbac-outside").await.ok()?;
            ev.iter()
                .any(|e| e.reason.as_deref() == Some("PodCIDROutsideClusterCIDR"))
                .then_some(())
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));
    let leases: Api<Lease> = Api::namespaced(c.client(), NAMESPACE);
    let lease = leases.get(NAME).await.expect("the controller's Lease");
    assert_eq!(
        lease.spec.and_then(|s| s.holder_identity).as_deref(),
        Some(identity)
    );
    let (code, _) = http_get(&format!("http://{metrics}"), "/readyz").expect("/readyz answers");
    assert_eq!(code, 200, "{}", ctl.log_text());
    // The secure port's TokenReview and SubjectAccessReview run under the
    // deployed role: the controller's own token is known (not 401) and has
    // no grant on /metrics (403, not 503, which would mean a review failed).
    let (code, body) = https_get(secure_port, &ca, "/metrics", Some(&token))
        .await
        .expect("the secure port answers");
    assert_eq!(code, 403, "{body}\n{}", ctl.log_text());
    let (code, _) = https_get(secure_port, &ca, "/metrics", None)
        .await
        .expect("the secure port answers");
    assert_eq!(code, 401);

    // 5. What the identity must not do: every request below is refused.
    let sa_secrets_ns: Api<Secret> = Api::namespaced(sa.clone(), NAMESPACE);
    forbidden(
        "list Secrets in kube-system",
        sa_secrets_ns.list(&ListParams::default()).await,
    );
    let sa_secrets_all: Api<Secret> = Api::all(sa.clone());
    forbidden(
        "list Secrets cluster-wide",
        sa_secrets_all.list(&ListParams::default()).await,
    );
    let sa_secrets_default: Api<Secret> = Api::namespaced(sa.clone(), "default");
    forbidden(
        "get a Secret in default",
        sa_secrets_default.get("anything").await,
    );
    let sa_nodes: Api<Node> = Api::all(sa.clone());
    forbidden(
        "patch a Node's labels",
        sa_nodes
            .patch(
                "rbac-0",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"owned": "yes"}}})),
            )
            .await,
    );
    forbidden(
        "cordon a Node (spec.unschedulable)",
        sa_nodes
            .patch(
                "rbac-0",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"unschedulable": true}})),
            )
            .await,
    );
    let mut node = sa_nodes.get("rbac-1").await.expect("the SA may read Nodes");
    node.spec.get_or_insert_default().unschedulable = Some(true);
    forbidden(
        "update a Node",
        sa_nodes
            .replace("rbac-1", &PostParams::default(), &node)
            .await,
    );
    forbidden(
        "delete a Node",
        sa_nodes.delete("rbac-2", &DeleteParams::default()).await,
    );
    let sa_events: Api<Event> = Api::namespaced(sa.clone(), "default");
    forbidden("list Events", sa_events.list(&ListParams::default()).await);
    let sa_leases: Api<Lease> = Api::namespaced(sa.clone(), NAMESPACE);
    forbidden(
        "read another Lease",
        sa_leases.get("some-other-lease").await,
    );
    let sa_leases_default: Api<Lease> = Api::namespaced(sa.clone(), "default");
    forbidden(
        "create a Lease outside its namespace",
        sa_leases_default
            .create(
                &PostParams::default(),
                &Lease {
                    metadata: kube::api::ObjectMeta {
                        name: Some(NAME.into()),
                        ..Default::default()
                    },
                    spec: None,
                },
            )
            .await,
    );

    // The refused writes changed nothing the controller's status writes would hide.
    let n0 = c.nodes().get("rbac-0").await.unwrap();
    assert!(!n0.metadata.labels.unwrap_or_default().contains_key("owned"));
    assert_ne!(n0.spec.and_then(|s| s.unschedulable), Some(true));

    // 6. The controller never hit a permission error and stops cleanly,
    //    releasing its Lease.
    let log = ctl.log_text();
    assert!(
        !was_refused(&log),
        "the controller was refused something:\n{log}"
    );
    assert_eq!(ctl.stop(), Some(0), "{log}");
    let released = leases.get(NAME).await.unwrap();
    assert_eq!(
        released.spec.and_then(|s| s.holder_identity),
        None,
        "the Lease is released on SIGTERM"
    );
}
