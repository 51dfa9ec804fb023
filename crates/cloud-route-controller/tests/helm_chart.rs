//! The Helm chart `deploy/helm/cloud-route-controller`: it lints, renders
//! for every provider's example values, the result applies to the real API
//! server with a server-side dry run, its flags and cloud config are accepted
//! by the binary and the provider, its RBAC is exactly the kustomize RBAC of
//! `deploy/`, and values that cannot work are refused with a clear message.
//! Each way an operator gives the controller its cloud credentials (web
//! identity, workload identity, a Secret) has an example whose rendering
//! carries exactly what that mechanism reads; each also runs `plan` on
//! exactly that environment and those files: against moto's STS and EC2, a
//! metadata server and the Compute Engine fake, the Azure fake, a Keystone
//! stand-in with neutron-server, and the Hetzner fake.
//!
//! `helm` is built from its Go module by `scripts/build-gotool.sh helm`
//! (once per machine; `scripts/test.sh` does it in its tools step).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{TempDir, args_of, container, find, kind, pod_spec, run, yaml_docs};
use serde_json::Value;
use test_cluster::TestCluster;

const NAMESPACE: &str = "kube-system";
const RELEASE: &str = "cloud-route-controller";
const PROVIDERS: &[&str] = &["memory", "aws", "openstack", "hcloud", "azure", "gce"];
const RBAC_KINDS: &[&str] = &[
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
];

fn chart() -> PathBuf {
    common::repo().join("deploy/helm/cloud-route-controller")
}

fn example(provider: &str) -> PathBuf {
    chart().join("examples").join(format!("{provider}.yaml"))
}

/// Every values file in `examples/`, so a new one is linted and dry-run
/// applied without being listed anywhere.
fn all_examples() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(chart().join("examples"))
        .expect("the chart's examples/")
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
}

/// The example values per credential mechanism, with their provider.
const IDENTITY_EXAMPLES: &[(&str, &str)] = &[
    ("aws-irsa", "aws"),
    ("aws-web-identity", "aws"),
    ("gce-workload-identity", "gce"),
    ("azure-workload-identity", "azure"),
    ("openstack-application-credential", "openstack"),
    ("hcloud", "hcloud"),
];

/// The helm binary from the per-machine tools cache (built on first use).
fn helm() -> PathBuf {
    common::gotool("helm")
}

/// `helm <args>` against the cluster of `kubeconfig`, its caches and
/// repository config in `dir` (the test's), not the user's.
fn helm_against(helm: &Path, kubeconfig: &Path, dir: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(helm);
    cmd.args(args)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .env("HELM_CACHE_HOME", dir.join("cache"))
        .env("HELM_CONFIG_HOME", dir.join("config"))
        .env("HELM_DATA_HOME", dir.join("data"));
    cmd
}

/// The values the chart requires and has no default for (clusterCIDRs,
/// clusterName), as deploy/'s manifests set them.
fn cluster_values() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/chart-cluster.yaml")
}

/// `helm template` of the chart in kube-system with extra arguments only.
fn bare_template_cmd(helm: &Path, extra: &[&str]) -> Command {
    let mut cmd = Command::new(helm);
    cmd.args(["template", RELEASE])
        .arg(chart())
        .args(["-n", NAMESPACE])
        .args(extra);
    cmd
}

/// `helm template` of the chart in kube-system with the cluster's values
/// ([`cluster_values`]) and then extra arguments, which win.
fn template_cmd(helm: &Path, extra: &[&str]) -> Command {
    let values = cluster_values();
    let mut all = vec!["-f", values.to_str().expect("utf-8 path")];
    all.extend_from_slice(extra);
    bare_template_cmd(helm, &all)
}

fn template(helm: &Path, values: Option<&Path>) -> String {
    let mut extra = Vec::new();
    if let Some(v) = values {
        extra.extend(["-f", v.to_str().expect("utf-8 path")]);
    }
    run(&mut template_cmd(helm, &extra))
}

fn kubectl_bin() -> PathBuf {
    test_cluster::Binaries::locate()
        .expect("control-plane binaries")
        .kubectl()
}

/// What `kubectl kustomize deploy/` renders (no cluster needed).
fn kustomize_docs(dir: &Path) -> Vec<Value> {
    let empty = dir.join("empty-kubeconfig");
    std::fs::write(&empty, "apiVersion: v1\nkind: Config\n").expect("write kubeconfig");
    let out = run(Command::new(kubectl_bin())
        .arg("--kubeconfig")
        .arg(&empty)
        .arg("kustomize")
        .arg(common::repo().join("deploy")));
    yaml_docs(&out)
}

/// An object without what only says who rendered it (labels, annotations).
fn without_labels(v: &Value) -> Value {
    let mut v = v.clone();
    if let Some(m) = v["metadata"].as_object_mut() {
        m.remove("labels");
        m.remove("annotations");
    }
    v
}

/// The RBAC objects of a rendering, labels dropped, in a stable order.
fn rbac(docs: &[Value]) -> Vec<Value> {
    let mut r: Vec<Value> = docs
        .iter()
        .filter(|d| RBAC_KINDS.contains(&kind(d)))
        .map(without_labels)
        .collect();
    r.sort_by_key(|d| format!("{}/{}", kind(d), d["metadata"]["name"]));
    r
}

fn flag(args: &[String], name: &str) -> String {
    args.iter()
        .find_map(|a| a.strip_prefix(&format!("{name}=")))
        .unwrap_or_else(|| panic!("{name} missing from {args:?}"))
        .to_string()
}

fn cloud_yaml(docs: &[Value]) -> String {
    docs.iter()
        .find(|d| kind(d) == "ConfigMap")
        .and_then(|cm| cm["data"]["cloud.yaml"].as_str())
        .expect("a ConfigMap with cloud.yaml")
        .to_string()
}

/// The provider's own parser and validation accept the rendered config.
fn provider_accepts(provider: &str, text: &str) {
    match provider {
        "memory" => {
            let c: provider_memory::MemoryConfig =
                serde_yaml_ng::from_str(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            c.validate().unwrap_or_else(|e| panic!("{text}: {e}"));
        }
        "aws" => {
            provider_aws::AwsConfig::from_yaml(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        }
        "openstack" => {
            // The password comes from OS_PASSWORD (the Secret) at run time;
            // here it is put into the text the way the environment would.
            let with_secret = text.replacen("auth:\n", "auth:\n  password: from-the-secret\n", 1);
            provider_openstack::OpenStackConfig::from_yaml(&with_secret)
                .unwrap_or_else(|e| panic!("{with_secret}: {e}"));
        }
        "hcloud" => {
            // The network comes from HCLOUD_NETWORK (the Secret's `network`)
            // at run time; here it is given the way the environment would.
            let c = hcloud_joined(text, "network-from-the-secret");
            c.validate().unwrap_or_else(|e| panic!("{text}: {e}"));
        }
        "azure" => {
            // The secret comes from AZURE_CLIENT_SECRET (the Secret) at run
            // time; here it is put into the text the way the environment would.
            let with_secret = format!("{text}aadClientSecret: from-the-secret\n");
            provider_azure::AzureConfig::from_yaml(&with_secret)
                .and_then(|c| c.validate())
                .unwrap_or_else(|e| panic!("{with_secret}: {e}"));
        }
        "gce" => {
            let c: provider_gce::GceConfig =
                serde_yaml_ng::from_str(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            c.validate().unwrap_or_else(|e| panic!("{text}: {e}"));
        }
        other => panic!("no check for provider {other}"),
    }
}

#[test]
fn the_chart_lints_for_its_defaults_and_every_provider_example() {
    let helm = helm();
    run(Command::new(&helm)
        .args(["lint", "--strict"])
        .arg(chart())
        .arg("-f")
        .arg(cluster_values()));
    let examples = all_examples();
    for p in PROVIDERS
        .iter()
        .chain(IDENTITY_EXAMPLES.iter().map(|(e, _)| e))
    {
        assert!(examples.contains(&example(p)), "examples/{p}.yaml is gone");
    }
    for values in &examples {
        let out = run(Command::new(&helm)
            .args(["lint", "--strict"])
            .arg(chart())
            .arg("-f")
            .arg(values));
        assert!(
            out.contains("1 chart(s) linted, 0 chart(s) failed"),
            "{values:?}: {out}"
        );
    }
}

#[test]
fn the_chart_version_is_the_workspace_version() {
    let text = std::fs::read_to_string(chart().join("Chart.yaml")).expect("Chart.yaml");
    let meta: Value = serde_yaml_ng::from_str(&text).expect("Chart.yaml is YAML");
    assert_eq!(meta["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(meta["appVersion"], env!("CARGO_PKG_VERSION"));
}

/// Where the chart mounts the ConfigMap's `cloudConfig`.
const CONFIG_MAP_FILE: &str = "/etc/cloud-route-controller/cloud.yaml";

/// Every flag the chart renders is known to the binary and validates, with
/// `files` (path in the pod, content) as the files `--cloud-config` names.
fn binary_accepts(name: &str, args: &[String], files: &[(String, String)], dir: &Path) {
    let local_args: Vec<String> = args
        .iter()
        .enumerate()
        .map(|(i, a)| match a.strip_prefix("--cloud-config=") {
            Some(path) => {
                let (_, content) = files
                    .iter()
                    .find(|(p, _)| p == path)
                    .unwrap_or_else(|| panic!("{name}: no content given for {path}"));
                let local = dir.join(format!("{name}-{i}"));
                std::fs::write(&local, content).expect("write config");
                format!("--cloud-config={}", local.to_str().expect("utf-8 path"))
            }
            None => a.replace("$(POD_NAMESPACE)", NAMESPACE),
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
        "{name}: the chart's args {local_args:?} are refused: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn every_provider_example_renders_flags_and_config_the_binary_and_provider_accept() {
    let helm = helm();
    let dir = TempDir::new("helm-flags");
    for p in PROVIDERS {
        let docs = yaml_docs(&template(&helm, Some(&example(p))));
        let args = args_of(&docs);
        assert_eq!(flag(&args, "--cloud-provider"), *p);
        let config = cloud_yaml(&docs);
        provider_accepts(p, &config);

        // Credentials only ever come from a Secret, by name and key.
        let c = container(&docs);
        for e in c["env"].as_array().expect("env") {
            let name = e["name"].as_str().unwrap_or("");
            if name == "POD_NAME" || name == "POD_NAMESPACE" {
                continue;
            }
            assert!(
                e["valueFrom"]["secretKeyRef"]["name"].is_string(),
                "{p}: {name} does not come from a Secret: {e}"
            );
            assert!(e.get("value").is_none(), "{p}: {name} has a literal value");
        }

        binary_accepts(
            p,
            &args,
            &[(CONFIG_MAP_FILE.to_string(), config)],
            dir.path(),
        );
    }

    // Hetzner's dedicated servers are left out by a selector with a `!`,
    // which must reach the binary as one quoted argument.
    let docs = yaml_docs(&template(&helm, Some(&example("hcloud"))));
    let args = args_of(&docs);
    assert_eq!(
        flag(&args, "--node-selector"),
        "instance.hetzner.cloud/is-root-server!=true"
    );
    assert_eq!(flag(&args, "--route-ip-families"), "IPv4");

    // Dual-stack: both CIDRs in one --cluster-cidr, as the binary expects.
    let docs = yaml_docs(&template(&helm, Some(&example("openstack"))));
    assert_eq!(
        flag(&args_of(&docs), "--cluster-cidr"),
        "10.244.0.0/16,fd00:10:244::/56"
    );
    // The created credentials Secret is what the env refers to.
    let docs = yaml_docs(&template(&helm, Some(&example("aws"))));
    let secret = find(&docs, "Secret");
    let env = container(&docs)["env"].as_array().expect("env").clone();
    for e in env
        .iter()
        .filter(|e| e["name"].as_str() != Some("POD_NAME"))
    {
        if let Some(key) = e["valueFrom"]["secretKeyRef"]["key"].as_str() {
            assert_eq!(
                e["valueFrom"]["secretKeyRef"]["name"],
                secret["metadata"]["name"]
            );
            assert!(
                secret["stringData"][key].is_string(),
                "{key} not in {secret}"
            );
        }
    }
}

#[test]
fn the_chart_rbac_equals_the_kustomize_rbac() {
    let helm = helm();
    let dir = TempDir::new("helm-rbac");
    let kustomize = rbac(&kustomize_docs(dir.path()));
    assert_eq!(kustomize.len(), RBAC_KINDS.len(), "{kustomize:?}");
    let identity = IDENTITY_EXAMPLES.iter().map(|(e, _)| Some(*e));
    for values in [None, Some("hcloud"), Some("aws"), Some("openstack")]
        .into_iter()
        .chain(identity)
    {
        let docs = yaml_docs(&template(&helm, values.map(example).as_deref()));
        assert_eq!(
            rbac(&docs),
            kustomize,
            "RBAC of the chart ({values:?}) differs from deploy/"
        );
    }
    // Without leader election there is no Lease to guard: no Role at all,
    // and the cluster-wide part is unchanged.
    let docs = yaml_docs(&template(&helm, Some(&example("memory"))));
    let cluster_scoped: Vec<Value> = kustomize
        .iter()
        .filter(|d| !["Role", "RoleBinding"].contains(&kind(d)))
        .cloned()
        .collect();
    assert_eq!(rbac(&docs), cluster_scoped);
}

#[test]
fn the_chart_defaults_render_the_kustomize_deployment_and_config() {
    let helm = helm();
    let dir = TempDir::new("helm-equiv");
    let kustomize = kustomize_docs(dir.path());
    let chart = yaml_docs(&template(&helm, None));
    for k in ["Deployment", "PodDisruptionBudget"] {
        let mut a = find(&chart, k)["spec"].clone();
        let b = find(&kustomize, k)["spec"].clone();
        if let Some(m) = a
            .pointer_mut("/template/metadata")
            .and_then(Value::as_object_mut)
        {
            // The chart adds a checksum of the config, so a changed config rolls the pods.
            m.remove("annotations");
        }
        assert_eq!(a, b, "{k} of the chart's defaults differs from deploy/");
    }
    let parse = |t: &str| -> Value { serde_yaml_ng::from_str(t).expect("cloud.yaml is YAML") };
    assert_eq!(parse(&cloud_yaml(&chart)), parse(&cloud_yaml(&kustomize)));
}

fn openstack_secret_file() -> PathBuf {
    chart().join("examples/secrets/openstack-application-credential.yaml")
}

/// The example OpenStack Secret, its one key and that key's cloud.conf.
fn openstack_secret() -> (Value, String, String) {
    let text = std::fs::read_to_string(openstack_secret_file()).expect("the Secret");
    let secret: Value = serde_yaml_ng::from_str(&text).expect("the Secret is YAML");
    let data = secret["stringData"].as_object().expect("stringData");
    assert_eq!(data.len(), 1, "{secret}");
    let (key, value) = data.iter().next().expect("one key");
    let cloud_conf = value.as_str().expect("a file").to_string();
    (secret.clone(), key.clone(), cloud_conf)
}

/// The hcloud configuration the binary makes of HCLOUD_NETWORK (as the hcloud
/// CCM reads it) and our YAML.
fn hcloud_joined(ours: &str, network: &str) -> provider_hcloud::HcloudConfig {
    let env = provider_hcloud::native::from_ccm_env(&|k| {
        (k == "HCLOUD_NETWORK").then(|| network.to_string())
    })
    .unwrap_or_else(|e| panic!("{e}"))
    .expect("HCLOUD_NETWORK is read");
    let ours: Value = serde_yaml_ng::from_str(ours).expect("our YAML");
    let joined = ccm_config::join(Some(&env), Some(ours))
        .unwrap_or_else(|e| panic!("{e}"))
        .expect("a configuration");
    serde_json::from_value(joined).unwrap_or_else(|e| panic!("{e}"))
}

/// The OpenStack configuration the binary makes of the CCM's cloud.conf and
/// our YAML: the native file translated, then the two joined.
fn openstack_joined(cloud_conf: &str, ours: &str) -> provider_openstack::OpenStackConfig {
    assert!(ccm_config::looks_like_ini(cloud_conf));
    let native = provider_openstack::native::from_ccm_config(cloud_conf)
        .unwrap_or_else(|e| panic!("{cloud_conf}: {e}"));
    let ours: Value = serde_yaml_ng::from_str(ours).expect("our YAML");
    let joined = ccm_config::join(Some(&native), Some(ours))
        .unwrap_or_else(|e| panic!("{e}"))
        .expect("a configuration");
    provider_openstack::OpenStackConfig::from_value(joined).unwrap_or_else(|e| panic!("{e}"))
}

/// The container's variables other than the two every pod has, by name.
fn extra_env(docs: &[Value]) -> Vec<(String, Value)> {
    container(docs)["env"]
        .as_array()
        .expect("env")
        .iter()
        .map(|e| (e["name"].as_str().expect("a name").to_string(), e.clone()))
        .filter(|(n, _)| n != "POD_NAME" && n != "POD_NAMESPACE")
        .collect()
}

fn names<T>(items: &[(String, T)]) -> Vec<&str> {
    items.iter().map(|(n, _)| n.as_str()).collect()
}

fn named<'a>(list: &'a Value, name: &str) -> &'a Value {
    list.as_array()
        .and_then(|l| l.iter().find(|v| v["name"] == name))
        .unwrap_or_else(|| panic!("no {name} in {list}"))
}

fn list_names(list: &Value) -> Vec<&str> {
    list.as_array()
        .map(|l| l.iter().filter_map(|v| v["name"].as_str()).collect())
        .unwrap_or_default()
}

fn sa_annotations(docs: &[Value]) -> Value {
    find(docs, "ServiceAccount")["metadata"]["annotations"].clone()
}

#[test]
fn each_credential_example_renders_exactly_what_its_mechanism_reads() {
    let helm = helm();
    let dir = TempDir::new("helm-identity");
    let app = serde_json::json!({
        "app.kubernetes.io/name": "cloud-route-controller",
        "app.kubernetes.io/instance": RELEASE,
    });
    for (name, provider) in IDENTITY_EXAMPLES {
        let docs = yaml_docs(&template(&helm, Some(&example(name))));
        let args = args_of(&docs);
        assert_eq!(flag(&args, "--cloud-provider"), *provider, "{name}");
        let pod = pod_spec(&docs);
        let deployment = find(&docs, "Deployment");
        // Extra pod labels never reach the selector.
        assert_eq!(deployment["spec"]["selector"]["matchLabels"], app, "{name}");
        let env = extra_env(&docs);
        let annotations = sa_annotations(&docs);
        let volumes = list_names(&pod["volumes"]);
        let mounts = list_names(&container(&docs)["volumeMounts"]);
        // No example holds a secret in values: no Secret is rendered.
        assert!(
            docs.iter().all(|d| kind(d) != "Secret"),
            "{name} renders a Secret"
        );
        let files = match *name {
            "aws-irsa" => {
                // The webhook injects the variables and the token itself.
                assert_eq!(
                    annotations,
                    serde_json::json!({
                        "eks.amazonaws.com/role-arn":
                            "arn:aws:iam::111122223333:role/cloud-route-controller"
                    }),
                    "{name}"
                );
                assert!(env.is_empty(), "{name}: {:?}", names(&env));
                assert_eq!(volumes, ["cloud-config"], "{name}");
                vec![(CONFIG_MAP_FILE.to_string(), cloud_yaml(&docs))]
            }
            "aws-web-identity" => {
                assert!(annotations.is_null(), "{name}: {annotations}");
                assert_eq!(
                    names(&env),
                    ["AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE"],
                    "{name}"
                );
                let role = env[0].1["value"].as_str().expect("a literal role ARN");
                assert!(role.starts_with("arn:aws:iam::"), "{role}");
                assert!(role.contains(":role/"), "{role}");
                // The token file is the projected token, for STS's audience.
                let file = env[1].1["value"].as_str().expect("a literal path");
                assert_eq!(volumes, ["cloud-config", "aws-iam-token"], "{name}");
                assert_eq!(mounts, ["cloud-config", "aws-iam-token"], "{name}");
                let token = &named(&pod["volumes"], "aws-iam-token")["projected"]["sources"];
                assert_eq!(token.as_array().map(Vec::len), Some(1), "{token}");
                let token = &token[0]["serviceAccountToken"];
                assert_eq!(token["audience"], "sts.amazonaws.com");
                let mount = named(&container(&docs)["volumeMounts"], "aws-iam-token");
                assert_eq!(mount["readOnly"], true);
                let path = format!(
                    "{}/{}",
                    mount["mountPath"].as_str().expect("a mount path"),
                    token["path"].as_str().expect("a token path")
                );
                assert_eq!(file, path, "{name}");
                vec![(CONFIG_MAP_FILE.to_string(), cloud_yaml(&docs))]
            }
            "gce-workload-identity" => {
                assert_eq!(
                    annotations,
                    serde_json::json!({
                        "iam.gke.io/gcp-service-account":
                            "cloud-route-controller@my-project.iam.gserviceaccount.com"
                    }),
                    "{name}"
                );
                // GKE's metadata server serves only pods off the host network.
                assert!(pod.get("hostNetwork").is_none(), "{name}: {pod}");
                assert!(env.is_empty(), "{name}: {:?}", names(&env));
                assert_eq!(volumes, ["cloud-config"], "{name}");
                let config = cloud_yaml(&docs);
                let c: provider_gce::GceConfig =
                    serde_yaml_ng::from_str(&config).expect("gce config");
                // Application Default Credentials: no key file, not anonymous.
                assert!(c.credentials_file.is_none() && !c.anonymous, "{c:?}");
                vec![(CONFIG_MAP_FILE.to_string(), config)]
            }
            "azure-workload-identity" => {
                let labels = &deployment["spec"]["template"]["metadata"]["labels"];
                assert_eq!(
                    labels,
                    &serde_json::json!({
                        "app.kubernetes.io/name": "cloud-route-controller",
                        "app.kubernetes.io/instance": RELEASE,
                        "azure.workload.identity/use": "true"
                    }),
                    "{name}"
                );
                let client_id = "00000000-0000-0000-0000-000000000003";
                assert_eq!(
                    annotations,
                    serde_json::json!({ "azure.workload.identity/client-id": client_id }),
                    "{name}"
                );
                // The webhook adds the variables and the token volume.
                assert!(env.is_empty(), "{name}: {:?}", names(&env));
                assert_eq!(volumes, ["cloud-config"], "{name}");
                let config = cloud_yaml(&docs);
                // What the webhook injects as AZURE_CLIENT_ID and
                // AZURE_FEDERATED_TOKEN_FILE, put into the text the way the
                // provider takes them from the environment.
                let token_file = "/var/run/secrets/azure/tokens/azure-identity-token";
                let injected = format!(
                    "{config}aadClientId: {client_id}\naadFederatedTokenFile: {token_file}\n"
                );
                let c = provider_azure::AzureConfig::from_yaml(&injected)
                    .unwrap_or_else(|e| panic!("{injected}: {e}"));
                c.validate().unwrap_or_else(|e| panic!("{injected}: {e}"));
                assert_eq!(
                    c.credential().expect("a credential"),
                    provider_azure::Credential::WorkloadIdentity {
                        tenant: "00000000-0000-0000-0000-000000000001".into(),
                        client_id: client_id.into(),
                        token_file: token_file.into(),
                    }
                );
                vec![(CONFIG_MAP_FILE.to_string(), config)]
            }
            "openstack-application-credential" => {
                assert!(annotations.is_null(), "{name}: {annotations}");
                assert!(env.is_empty(), "{name}: {:?}", names(&env));
                // The CCM's Secret, mounted read-only beside our ConfigMap.
                assert_eq!(volumes, ["cloud-config", "cloud-config-secret"], "{name}");
                assert_eq!(mounts, ["cloud-config", "cloud-config-secret"], "{name}");
                let (secret, key, cloud_conf) = openstack_secret();
                let volume = &named(&pod["volumes"], "cloud-config-secret")["secret"];
                assert_eq!(volume["secretName"], secret["metadata"]["name"]);
                assert_eq!(
                    volume["items"],
                    serde_json::json!([{ "key": key, "path": key }])
                );
                let mount = named(&container(&docs)["volumeMounts"], "cloud-config-secret");
                assert_eq!(mount["readOnly"], true);
                let secret_file = format!(
                    "{}/{key}",
                    mount["mountPath"].as_str().expect("a mount path")
                );
                // Both files, as the binary reads two --cloud-config flags.
                let flags: Vec<&str> = args
                    .iter()
                    .filter_map(|a| a.strip_prefix("--cloud-config="))
                    .collect();
                assert_eq!(flags, [secret_file.as_str(), CONFIG_MAP_FILE], "{name}");
                let ours = cloud_yaml(&docs);
                let c = openstack_joined(&cloud_conf, &ours);
                assert_eq!(
                    c.auth_type,
                    provider_openstack::AuthType::V3ApplicationCredential
                );
                assert!(!c.auth.application_credential_id.is_empty(), "{c:?}");
                assert!(!c.auth.application_credential_secret.is_empty(), "{c:?}");
                assert!(!c.node_subnets.is_empty(), "{c:?}");

                // The Secret alone (cloudConfig ""): no ConfigMap, one file.
                let alone = yaml_docs(&run(&mut template_cmd(
                    &helm,
                    &[
                        "-f",
                        example(name).to_str().expect("utf-8 path"),
                        "--set",
                        "cloudConfig=",
                    ],
                )));
                assert!(alone.iter().all(|d| kind(d) != "ConfigMap"));
                let alone_spec = pod_spec(&alone);
                assert_eq!(list_names(&alone_spec["volumes"]), ["cloud-config-secret"]);
                let alone_flags: Vec<String> = args_of(&alone)
                    .into_iter()
                    .filter(|a| a.starts_with("--cloud-config="))
                    .collect();
                assert_eq!(alone_flags, [format!("--cloud-config={secret_file}")]);
                assert!(
                    find(&alone, "Deployment")["spec"]["template"]["metadata"]["annotations"]
                        .is_null(),
                    "a checksum of a ConfigMap that is not there"
                );
                vec![
                    (secret_file, cloud_conf),
                    (CONFIG_MAP_FILE.to_string(), ours),
                ]
            }
            "hcloud" => {
                assert!(annotations.is_null(), "{name}: {annotations}");
                assert_eq!(names(&env), ["HCLOUD_TOKEN", "HCLOUD_NETWORK"], "{name}");
                // The hcloud CCM's own Secret and keys, in its variables.
                for ((_, e), key) in env.iter().zip(["token", "network"]) {
                    assert_eq!(
                        e["valueFrom"],
                        serde_json::json!({"secretKeyRef": {"name": "hcloud", "key": key}})
                    );
                }
                assert_eq!(volumes, ["cloud-config"], "{name}");
                let config = cloud_yaml(&docs);
                let c = hcloud_joined(&config, "my-network");
                assert_eq!(c.network, "my-network");
                assert!(c.token_file.is_none(), "{c:?}");
                vec![(CONFIG_MAP_FILE.to_string(), config)]
            }
            other => panic!("no check for {other}"),
        };
        if *provider != "azure" && *provider != "openstack" {
            provider_accepts(provider, &files[0].1);
        }
        binary_accepts(name, &args, &files, dir.path());
    }
}

/// The web identity example's variables and token, as the pod would see
/// them, give the binary credentials through STS and nothing else: `plan`
/// reads a route table that exists only in the account of the role the
/// token was exchanged for (moto keeps accounts apart), and without the two
/// variables it has no credentials at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_web_identity_example_gets_the_binary_its_credentials_from_sts() {
    use provider_aws::testing::{Proxy, client, moto_endpoint};

    let c = TestCluster::acquire()
        .await
        .expect("the local control plane");
    let endpoint = moto_endpoint().await.expect("moto");
    let proxy = Proxy::start(&endpoint).await.expect("the proxy");
    let dir = TempDir::new("helm-web-identity");

    let docs = yaml_docs(&template(&helm(), Some(&example("aws-web-identity"))));
    let env = extra_env(&docs);
    let value = |name: &str| -> String {
        env.iter()
            .find(|(n, _)| n == name)
            .and_then(|(_, e)| e["value"].as_str())
            .unwrap_or_else(|| panic!("no literal {name}"))
            .to_string()
    };
    let role = value("AWS_ROLE_ARN");
    // The table, made in the role's account (moto's account header).
    let account = role
        .strip_prefix("arn:aws:iam::")
        .and_then(|r| r.split(':').next())
        .expect("an IAM role ARN")
        .to_string();
    let ec2 = client(&endpoint).await;
    let vpc = ec2
        .create_vpc()
        .cidr_block("10.48.0.0/16")
        .customize()
        .mutate_request({
            let account = account.clone();
            move |req| {
                req.headers_mut()
                    .insert("x-moto-account-id", account.clone());
            }
        })
        .send()
        .await
        .expect("CreateVpc");
    let table = ec2
        .create_route_table()
        .vpc_id(vpc.vpc().and_then(|v| v.vpc_id()).expect("a VPC id"))
        .customize()
        .mutate_request({
            let account = account.clone();
            move |req| {
                req.headers_mut()
                    .insert("x-moto-account-id", account.clone());
            }
        })
        .send()
        .await
        .expect("CreateRouteTable");
    let table = table
        .route_table()
        .and_then(|t| t.route_table_id())
        .expect("a table id")
        .to_string();
    // The projected volume, at its mount path under the test's directory.
    let mount = named(&container(&docs)["volumeMounts"], "aws-iam-token")["mountPath"]
        .as_str()
        .expect("a mount path")
        .to_string();
    let token_file = dir.path().join(
        value("AWS_WEB_IDENTITY_TOKEN_FILE")
            .strip_prefix(&format!("{mount}/"))
            .expect("the token file is in the projected volume"),
    );
    let token = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQ6a3ViZS1zeXN0ZW06Y2xvdWQtcm91dGUtY29udHJvbGxlciJ9.c2ln";
    std::fs::write(&token_file, token).expect("write the token");

    // The example's cloud config, pointed at moto's table.
    let mut config: Value =
        serde_yaml_ng::from_str(&cloud_yaml(&docs)).expect("the example's config");
    config["region"] = "us-east-1".into();
    config["route_table_id"] = table.clone().into();
    config["endpoint"] = proxy.url().into();
    let config_file = dir.path().join("aws.yaml");
    std::fs::write(&config_file, config.to_string()).expect("write the config");

    let plan = |with_identity: bool| {
        let mut cmd = pod_plan(
            c.kubeconfig_path(),
            &["--cluster-cidr", "10.244.0.0/16", "--cloud-provider", "aws"],
            &[&config_file],
        );
        // Nothing but what the pod has: no keys, no profile, no instance
        // metadata.
        cmd.env("HOME", dir.path())
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .env("AWS_ENDPOINT_URL_STS", proxy.url());
        if with_identity {
            cmd.env("AWS_ROLE_ARN", &role)
                .env("AWS_WEB_IDENTITY_TOKEN_FILE", &token_file);
        }
        run_bounded(cmd)
    };

    let out = plan(true).await;
    assert!(
        out.status.success(),
        "plan with the web identity failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let log = proxy.log();
    let assumed = log
        .iter()
        .position(|r| r.action == "AssumeRoleWithWebIdentity")
        .unwrap_or_else(|| panic!("no AssumeRoleWithWebIdentity in {log:?}"));
    let decode = |v: &str| v.replace("%3A", ":").replace("%2F", "/");
    assert_eq!(decode(log[assumed].param("RoleArn")), role);
    assert_eq!(log[assumed].param("WebIdentityToken"), token);
    assert!(
        log[assumed..]
            .iter()
            .any(|r| r.action == "DescribeRouteTables"),
        "the table was not read after the exchange: {log:?}"
    );

    let before = proxy.log().len();
    let out = plan(false).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "plan without credentials succeeded");
    assert!(
        stderr.to_lowercase().contains("credential"),
        "plan failed for another reason than credentials: {stderr}"
    );
    assert!(
        proxy.log()[before..]
            .iter()
            .all(|r| r.action != "DescribeRouteTables" && r.action != "AssumeRoleWithWebIdentity"),
        "requests without credentials: {stderr}"
    );
}

/// The Azure workload identity example with what the webhook injects
/// (AZURE_CLIENT_ID from the ServiceAccount's annotation, AZURE_TENANT_ID,
/// AZURE_FEDERATED_TOKEN_FILE, AZURE_AUTHORITY_HOST) and nothing else: `plan`
/// exchanges the projected token for an ARM token and reads the table on the
/// fake; without AZURE_CLIENT_ID it stops with a message naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_azure_workload_identity_example_runs_on_what_the_webhook_injects() {
    use provider_azure::testing::{FakeAzure, FakeConfig};

    let c = TestCluster::acquire()
        .await
        .expect("the local control plane");
    let docs = yaml_docs(&template(
        &helm(),
        Some(&example("azure-workload-identity")),
    ));
    let client_id = sa_annotations(&docs)["azure.workload.identity/client-id"]
        .as_str()
        .expect("the client id annotation")
        .to_string();
    let mut config: Value =
        serde_yaml_ng::from_str(&cloud_yaml(&docs)).expect("the example's config");
    let example_config = config.clone();
    let text = |key: &str| {
        example_config[key]
            .as_str()
            .unwrap_or_else(|| panic!("no {key} in the example"))
            .to_string()
    };
    // The fake is the example's tenant, subscription and application.
    let fake = FakeAzure::start(FakeConfig {
        tenant: text("tenantId"),
        subscription: text("subscriptionId"),
        resource_group: text("resourceGroup"),
        client_id: client_id.clone(),
        ..FakeConfig::default()
    })
    .await
    .expect("the fake starts");
    fake.add_table(&text("routeTableName"));
    // Only ARM's address changes; the authority comes from the environment.
    config["resourceManagerEndpoint"] = fake.base_url().into();
    let dir = TempDir::new("helm-azure-wi");
    let config_file = dir.path().join("azure.json");
    std::fs::write(&config_file, config.to_string()).expect("write the config");
    let token_file = dir.path().join("azure-identity-token");
    std::fs::write(&token_file, fake.config().federated_token).expect("write the token");

    let plan = |with_client_id: bool| {
        let mut cmd = pod_plan(
            c.kubeconfig_path(),
            &[
                "--cluster-cidr",
                "10.244.0.0/16",
                "--cloud-provider",
                "azure",
            ],
            &[&config_file],
        );
        cmd.env("AZURE_TENANT_ID", text("tenantId"))
            .env("AZURE_FEDERATED_TOKEN_FILE", &token_file)
            // The webhook's value ends with a slash.
            .env("AZURE_AUTHORITY_HOST", format!("{}/", fake.base_url()));
        if with_client_id {
            cmd.env("AZURE_CLIENT_ID", &client_id);
        }
        run_bounded(cmd)
    };

    let out = plan(true).await;
    assert!(
        out.status.success(),
        "plan with workload identity failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(fake.count_status("token", 200), 1, "{:?}", fake.answers());
    assert!(
        fake.count_status("get_table", 200) >= 1,
        "{:?}",
        fake.answers()
    );

    let before = fake.total();
    let out = plan(false).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "plan without a client id succeeded");
    assert!(stderr.contains("AZURE_CLIENT_ID"), "{stderr}");
    assert_eq!(fake.total(), before, "requests without a client id");
}

/// `plan` as the pod would run it: none of this process's environment (the
/// caller adds what the pod's credential mechanism gives it), `args`, and a
/// `--cloud-config` per file in `configs`.
fn pod_plan(kubeconfig: &Path, args: &[&str], configs: &[&Path]) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(common::binary());
    cmd.arg("plan")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args);
    for config in configs {
        cmd.arg("--cloud-config").arg(config);
    }
    cmd.env_clear()
        .env("RUST_LOG", "info")
        .stdin(std::process::Stdio::null());
    cmd
}

/// Runs `cmd` to its end, within 120 s.
async fn run_bounded(mut cmd: tokio::process::Command) -> std::process::Output {
    tokio::time::timeout(std::time::Duration::from_secs(120), cmd.output())
        .await
        .expect("plan finished within 120 s")
        .expect("run plan")
}

/// A metadata server as GKE's serves a workload identity's token: the token
/// of the Google service account at the default path, for requests that
/// carry `Metadata-Flavor: Google`. Records each request's path and whether
/// it carried the header.
async fn metadata_server() -> (
    String,
    std::sync::Arc<std::sync::Mutex<Vec<(String, bool)>>>,
) {
    use axum::http::{HeaderMap, StatusCode, Uri};
    use axum::response::IntoResponse;

    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let record = std::sync::Arc::clone(&seen);
    let app = axum::Router::new().fallback(move |uri: Uri, headers: HeaderMap| {
        let record = std::sync::Arc::clone(&record);
        async move {
            let flavor = headers
                .get("metadata-flavor")
                .is_some_and(|v| v == "Google");
            record
                .lock()
                .expect("the request log")
                .push((uri.path().to_string(), flavor));
            if !flavor {
                return (StatusCode::FORBIDDEN, "missing Metadata-Flavor").into_response();
            }
            match uri.path() {
                "/computeMetadata/v1/instance/service-accounts/default/token" => {
                    axum::Json(serde_json::json!({
                        "access_token": "ya29.workload-identity",
                        "expires_in": 3599,
                        "token_type": "Bearer",
                    }))
                    .into_response()
                }
                "/computeMetadata/v1/universe/universe-domain" => "googleapis.com".into_response(),
                _ => StatusCode::NOT_FOUND.into_response(),
            }
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the metadata server");
    let host = listener.local_addr().expect("its address").to_string();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (host, seen)
}

/// The GKE workload identity example: no key, no variable, the metadata
/// server alone gives `plan` its token (Application Default Credentials),
/// and the Compute Engine fake is read with it; with no metadata server
/// there is no token and no request reaches the API.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gke_workload_identity_example_takes_its_token_from_the_metadata_server() {
    use provider_gce::testing::{FakeConfig, FakeGce};

    let c = TestCluster::acquire()
        .await
        .expect("the local control plane");
    let docs = yaml_docs(&template(&helm(), Some(&example("gce-workload-identity"))));
    let mut config: Value =
        serde_yaml_ng::from_str(&cloud_yaml(&docs)).expect("the example's config");
    let project = config["project"].as_str().expect("a project").to_string();
    let network = config["network"].as_str().expect("a network").to_string();
    let fake = FakeGce::start(FakeConfig {
        project,
        ..FakeConfig::default()
    })
    .await
    .expect("the fake starts");
    fake.add_network(&network, false);
    config["endpoint"] = fake.endpoint().into();
    let dir = TempDir::new("helm-gke-wi");
    let config_file = dir.path().join("gce.yaml");
    std::fs::write(&config_file, config.to_string()).expect("write the config");
    let (metadata, seen) = metadata_server().await;
    // A port nothing listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .to_string();

    let plan = |metadata_host: String| {
        let mut cmd = pod_plan(
            c.kubeconfig_path(),
            &["--cluster-cidr", "10.64.0.0/14", "--cloud-provider", "gce"],
            &[&config_file],
        );
        // No key file, no gcloud login: only the metadata server.
        cmd.env("HOME", dir.path())
            .env("GCE_METADATA_HOST", metadata_host);
        run_bounded(cmd)
    };

    let out = plan(metadata).await;
    assert!(
        out.status.success(),
        "plan with the metadata server failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let requests = seen.lock().expect("the request log").clone();
    assert!(
        requests.contains(&(
            "/computeMetadata/v1/instance/service-accounts/default/token".to_string(),
            true
        )),
        "{requests:?}"
    );
    assert!(fake.count("list") >= 1, "{:?}", fake.requests());

    let before = fake.requests();
    let out = plan(closed).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "plan without a metadata server succeeded"
    );
    assert!(stderr.contains("authentication"), "{stderr}");
    // The cause is named, not only that no token came.
    assert!(
        stderr.contains("computeMetadata") && stderr.contains("Connection refused"),
        "{stderr}"
    );
    assert_eq!(fake.requests(), before, "requests without a token");
}

/// The OpenStack example with the CCM's Secret as the operator has it: the
/// two files the pod mounts, and no OS_* variable, get `plan` a Keystone
/// token for the application credential of cloud.conf (its id and secret,
/// no scope: the credential carries it), and the router is read on
/// neutron-server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openstack_example_authenticates_with_the_application_credential_of_the_ccms_secret() {
    use provider_openstack::testing::{Admin, Keystone, neutron_server};

    let c = TestCluster::acquire()
        .await
        .expect("the local control plane");
    let neutron = neutron_server().await.expect("neutron-server");
    let router = Admin::new(&neutron.url)
        .create_router("helm-appcred", "10.23.0.0/24")
        .await
        .expect("a router");
    let keystone = Keystone::start(&neutron.url)
        .await
        .expect("the Keystone stand-in");
    let docs = yaml_docs(&template(
        &helm(),
        Some(&example("openstack-application-credential")),
    ));
    let (_, _, cloud_conf) = openstack_secret();
    let value = |key: &str| {
        cloud_conf
            .lines()
            .find_map(|l| l.strip_prefix(key)?.trim().strip_prefix('='))
            .unwrap_or_else(|| panic!("no {key} in {cloud_conf}"))
            .trim()
            .to_string()
    };
    let (id, secret) = (
        value("application-credential-id"),
        value("application-credential-secret"),
    );
    // The Secret pointed at the stand-ins: only its addresses change.
    let cloud_conf: String = cloud_conf
        .lines()
        .map(|l| {
            if l.starts_with("auth-url") {
                format!("auth-url = {}", keystone.auth_url)
            } else if l.starts_with("router-id") {
                format!("router-id = {}", router.router_id)
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    let mut ours: Value = serde_yaml_ng::from_str(&cloud_yaml(&docs)).expect("our YAML");
    ours["node_subnets"] = serde_json::json!([router.subnet_cidr]);
    let dir = TempDir::new("helm-openstack-appcred");
    let (conf_file, ours_file) = (dir.path().join("cloud.conf"), dir.path().join("cloud.yaml"));
    std::fs::write(&conf_file, &cloud_conf).expect("write cloud.conf");
    std::fs::write(&ours_file, ours.to_string()).expect("write cloud.yaml");
    // The rendered order: the Secret's file, then the ConfigMap's.
    let flags: Vec<String> = args_of(&docs)
        .into_iter()
        .filter(|a| a.starts_with("--cloud-config="))
        .collect();
    assert_eq!(flags.len(), 2, "{flags:?}");
    assert!(flags[1].ends_with(CONFIG_MAP_FILE), "{flags:?}");

    let mut cmd = pod_plan(
        c.kubeconfig_path(),
        &[
            "--cluster-cidr",
            "10.244.0.0/16",
            "--cloud-provider",
            "openstack",
        ],
        &[&conf_file, &ours_file],
    );
    cmd.env("HOME", dir.path());
    let out = run_bounded(cmd).await;
    assert!(
        out.status.success(),
        "plan with the application credential failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let sent = keystone.requests();
    assert_eq!(sent.len(), 1, "{sent:?}");
    let auth = &sent[0]["auth"];
    assert_eq!(
        auth["identity"],
        serde_json::json!({
            "methods": ["application_credential"],
            "application_credential": { "id": id, "secret": secret },
        })
    );
    assert!(auth["scope"].is_null(), "{auth}");
}

/// The Hetzner example's variables, with the values of the hcloud CCM's
/// Secret, and its cloud config: `plan` finds the network by the name
/// HCLOUD_NETWORK gives and reads it with HCLOUD_TOKEN on the fake; a token
/// the API refuses stops it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hcloud_example_plans_with_the_ccms_secret_in_the_ccms_variables() {
    use provider_hcloud::testing::{FakeConfig, FakeHcloud};

    let c = TestCluster::acquire()
        .await
        .expect("the local control plane");
    let fake = FakeHcloud::start(FakeConfig::default())
        .await
        .expect("the fake starts");
    fake.add_network(4711, "k8s-network", "10.0.0.0/8", &["10.0.0.0/16"]);
    let docs = yaml_docs(&template(&helm(), Some(&example("hcloud"))));
    let dir = TempDir::new("helm-hcloud");
    let config_file = dir.path().join("cloud.yaml");
    std::fs::write(&config_file, cloud_yaml(&docs)).expect("write the config");
    // The Secret's keys, as the variables the chart sets name them.
    let secret = |key: &str| match key {
        "token" => fake.token(),
        "network" => "k8s-network".to_string(),
        other => panic!("the hcloud CCM's Secret has no key {other}"),
    };
    let env: Vec<(String, String)> = extra_env(&docs)
        .into_iter()
        .map(|(name, e)| {
            let key = e["valueFrom"]["secretKeyRef"]["key"]
                .as_str()
                .expect("a Secret key");
            (name, secret(key))
        })
        .collect();
    let args: Vec<String> = args_of(&docs)
        .into_iter()
        .filter(|a| a.starts_with("--cluster-cidr=") || a.starts_with("--route-ip-families="))
        .collect();

    let plan = |token: Option<&str>| {
        let args: Vec<&str> = args
            .iter()
            .map(String::as_str)
            .chain(["--cloud-provider", "hcloud"])
            .collect();
        let mut cmd = pod_plan(c.kubeconfig_path(), &args, &[&config_file]);
        cmd.envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            // The one value that is not the pod's: the API's address.
            .env("HCLOUD_ENDPOINT", fake.base_url());
        if let Some(t) = token {
            cmd.env("HCLOUD_TOKEN", t);
        }
        run_bounded(cmd)
    };

    let out = plan(None).await;
    assert!(
        out.status.success(),
        "plan with the CCM's variables failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let reads = fake.requests();
    // The name HCLOUD_NETWORK gave is looked up; nothing was refused.
    assert_eq!(fake.count("list_networks"), 1, "{reads:?}");
    assert_eq!(fake.with_status(401), 0, "{reads:?}");

    let out = plan(Some("a-token-the-api-refuses")).await;
    assert!(!out.status.success(), "plan with a refused token succeeded");
    assert!(fake.with_status(401) > 0, "{:?}", fake.requests());
}

/// EKS Pod Identity needs no chart value: with the IRSA example's config and
/// only the two variables EKS's webhook injects for a pod identity
/// association (the agent's URL and its token file), `plan` gets its
/// credentials from the agent (here a stand-in on the loopback address the
/// SDK accepts as well as the agent's link-local one) and reads the table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eks_pod_identity_credentials_reach_the_binary_without_chart_values() {
    use axum::http::{HeaderMap, StatusCode};
    use axum::response::IntoResponse;
    use provider_aws::testing::{client, create_network, moto_endpoint};

    let c = TestCluster::acquire()
        .await
        .expect("the local control plane");
    let endpoint = moto_endpoint().await.expect("moto");
    let net = create_network(&client(&endpoint).await, "10.49.0.0/16", None)
        .await
        .expect("a VPC and its route table");
    let dir = TempDir::new("helm-pod-identity");
    let token = "eks-pod-identity-token";
    let token_file = dir.path().join("eks-pod-identity-token");
    std::fs::write(&token_file, token).expect("write the token");

    // The agent: credentials for requests that carry the pod's token.
    let asked = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let record = std::sync::Arc::clone(&asked);
    let agent = axum::Router::new().route(
        "/v1/credentials",
        axum::routing::get(move |headers: HeaderMap| {
            let record = std::sync::Arc::clone(&record);
            async move {
                let auth = headers
                    .get("authorization")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_string();
                record.lock().expect("the agent's log").push(auth.clone());
                if auth != token {
                    return StatusCode::UNAUTHORIZED.into_response();
                }
                axum::Json(serde_json::json!({
                    "AccessKeyId": "ASIAPODIDENTITY",
                    "SecretAccessKey": "pod-identity-secret",
                    "Token": "pod-identity-session",
                    "Expiration": "2099-01-01T00:00:00Z",
                }))
                .into_response()
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the agent");
    let agent_url = format!(
        "http://{}/v1/credentials",
        listener.local_addr().expect("its address")
    );
    tokio::spawn(async move { axum::serve(listener, agent).await });

    let docs = yaml_docs(&template(&helm(), Some(&example("aws-irsa"))));
    assert!(extra_env(&docs).is_empty());
    let mut config: Value =
        serde_yaml_ng::from_str(&cloud_yaml(&docs)).expect("the example's config");
    config["region"] = "us-east-1".into();
    config["route_table_id"] = net.route_table_id.clone().into();
    config["endpoint"] = endpoint.clone().into();
    let config_file = dir.path().join("aws.yaml");
    std::fs::write(&config_file, config.to_string()).expect("write the config");

    let mut cmd = pod_plan(
        c.kubeconfig_path(),
        &["--cluster-cidr", "10.244.0.0/16", "--cloud-provider", "aws"],
        &[&config_file],
    );
    cmd.env("HOME", dir.path())
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env("AWS_CONTAINER_CREDENTIALS_FULL_URI", &agent_url)
        .env("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", &token_file);
    let out = run_bounded(cmd).await;
    assert!(
        out.status.success(),
        "plan with pod identity failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let asked = asked.lock().expect("the agent's log").clone();
    assert_eq!(
        asked,
        [token],
        "the agent was asked with the token file's content"
    );
}

#[test]
fn the_chart_refuses_values_that_cannot_work_with_a_clear_message() {
    let helm = helm();
    let cases: &[(&[&str], &str)] = &[
        // values.schema.json: Helm's own messages.
        (
            &["--set", "provider=gcp"],
            "at '/provider': value must be one of 'aws', 'openstack', 'hcloud', 'azure', 'gce', 'memory'",
        ),
        (
            &["--set", "clusterCIDRs=null"],
            "missing property 'clusterCIDRs'",
        ),
        (
            &["--set", "clusterCIDRs={10.0.0.0/8,fd00::/48,fd01::/48}"],
            "at '/clusterCIDRs': maxItems: got 3, want 2",
        ),
        (
            &["--set", "replicaCount=two"],
            "at '/replicaCount': got string, want integer",
        ),
        (
            &["--set", "replicas=3"],
            "additional properties 'replicas' not allowed",
        ),
        (
            &["--set", "cloudconfig=network: x"],
            "additional properties 'cloudconfig' not allowed",
        ),
        (
            &["--set", "routeIPFamilies={IPv5}"],
            "at '/routeIPFamilies/0': value must be one of 'IPv4', 'IPv6'",
        ),
        (
            &["--set", "metrics.port=0"],
            "at '/metrics/port': minimum: got 0, want 1",
        ),
        (
            &["--set", "hostNetwork=yes"],
            "at '/hostNetwork': got string, want boolean",
        ),
        (
            &["--set", "monitoring.podMonitor.enable=true"],
            "additional properties 'enable' not allowed",
        ),
        // The templates' own checks.
        (
            &["--set", "serviceAccount.create=false"],
            "serviceAccount.name must name an existing ServiceAccount",
        ),
        (
            &[
                "--set",
                "cloudConfigSecret.existingSecret=a",
                "--set",
                "cloudConfigConfigMap.existingConfigMap=b",
            ],
            "both name the provider's own config file",
        ),
        (
            &[
                "--api-versions",
                "monitoring.coreos.com/v1",
                "--set",
                "monitoring.podMonitor.enabled=true",
            ],
            "monitoring.podMonitor needs a token for /metrics",
        ),
        (
            &[
                "--api-versions",
                "monitoring.coreos.com/v1",
                "--set",
                "monitoring.podMonitor.enabled=true",
                "--set",
                "monitoring.podMonitor.tokenSecret=a",
                "--set",
                "monitoring.podMonitor.tokenServiceAccount=b",
            ],
            "set tokenSecret (an existing Secret) or tokenServiceAccount",
        ),
        (
            &["--set", "monitoring.runbookBaseURL=wiki/troubleshooting"],
            "at '/monitoring/runbookBaseURL'",
        ),
        (
            &["--set", "leaderElection.enabled=false"],
            "several replicas without a Lease",
        ),
        (
            &["--set", "credentials.existingSecret="],
            "credentials.env names Secret keys but there is no Secret",
        ),
        (
            &["--set", "credentials.create=true"],
            "either create: true (with data) or existingSecret",
        ),
        (
            &[
                "--set",
                "credentials.existingSecret=",
                "--set",
                "credentials.create=true",
                "--set",
                "credentials.data.other=x",
            ],
            "HCLOUD_TOKEN reads key \"token\", which credentials.data does not have",
        ),
        (
            &["--set", "credentials.env[0].name=HCLOUD_TOKEN"],
            "every credentials.env entry needs a name (the variable) and a key",
        ),
        (
            &[
                "--set",
                "cloudConfigSecret.existingSecret=cloud-config",
                "--set",
                "cloudConfigSecret.key=../cloud.conf",
            ],
            "cloudConfigSecret.key must be a Secret key",
        ),
        (
            &["--set", "podLabels.app\\.kubernetes\\.io/instance=other"],
            "podLabels must not set \"app.kubernetes.io/instance\"",
        ),
        (
            &[
                "--set",
                "extraEnv[0].name=HCLOUD_TOKEN",
                "--set",
                "extraEnv[0].value=x",
            ],
            "the environment variable HCLOUD_TOKEN is set twice",
        ),
        (
            &["--set", "extraEnv[0].name=POD_NAME"],
            "the environment variable POD_NAME is set twice",
        ),
        (
            &[
                "--set",
                "extraVolumes[0].name=cloud-config",
                "--set",
                "extraVolumes[0].emptyDir.medium=Memory",
            ],
            "the volume name cloud-config is taken",
        ),
        (
            &[
                "--set",
                "extraVolumeMounts[0].name=token",
                "--set",
                "extraVolumeMounts[0].mountPath=/var/run/token",
            ],
            "extraVolumeMounts mounts token, which is no volume of the pod",
        ),
        (
            &[
                "--set",
                "extraVolumes[0].name=token",
                "--set",
                "extraVolumes[0].emptyDir.medium=Memory",
                "--set",
                "extraVolumeMounts[0].name=token",
                "--set",
                "extraVolumeMounts[0].mountPath=/etc/cloud-route-controller/token",
            ],
            "would hide or shadow the cloud config",
        ),
    ];
    for (args, message) in cases {
        let out = template_cmd(&helm, args).output().expect("run helm");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} rendered");
        assert!(stderr.contains(message), "{args:?}: {stderr}");
    }
}

#[tokio::test]
async fn every_provider_example_applies_to_the_api_server_with_a_dry_run() {
    let c = TestCluster::acquire()
        .await
        .expect("the local control plane");
    let kubeconfig = c.kubeconfig_path().to_owned();
    let kubectl = c.kubectl_path().expect("kubectl");
    let helm = helm();
    let dir = TempDir::new("helm-apply");
    for values in all_examples() {
        let p = values
            .file_stem()
            .and_then(|s| s.to_str())
            .expect("a file name");
        let rendered = template(&helm, Some(&values));
        let file = dir.path().join(format!("{p}.yaml"));
        std::fs::write(&file, &rendered).expect("write rendering");
        let out = run(Command::new(&kubectl)
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(["apply", "--dry-run=server", "-f"])
            .arg(&file));
        let docs = yaml_docs(&rendered);
        for d in &docs {
            let name = d["metadata"]["name"].as_str().expect("a name");
            let k = kind(d).to_lowercase();
            // `kind[.group]/name verb (server dry run)`
            let covered = out.lines().any(|l| {
                l.ends_with("(server dry run)")
                    && l.split_once('/').is_some_and(|(resource, rest)| {
                        (resource == k || resource.starts_with(&format!("{k}.")))
                            && rest.starts_with(&format!("{name} "))
                    })
            });
            assert!(covered, "{p}: the dry run did not cover {k}/{name}:\n{out}");
        }
        let kinds: Vec<&str> = docs.iter().map(kind).collect();
        for k in ["ServiceAccount", "ClusterRole", "Deployment"] {
            assert!(kinds.contains(&k), "{p}: no {k} in {kinds:?}");
        }
        // The config file comes from the chart's ConfigMap or from a Secret
        // the operator made, never from neither.
        let volumes = list_names(&pod_spec(&docs)["volumes"]);
        assert_eq!(
            kinds.contains(&"ConfigMap"),
            volumes.contains(&"cloud-config"),
            "{p}: {kinds:?}"
        );
    }
    // The example Secret that holds OpenStack's cloud config applies too.
    run(Command::new(&kubectl)
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(["apply", "--dry-run=server", "-f"])
        .arg(openstack_secret_file()));
    // A dry run creates nothing.
    let sas: kube::Api<k8s_openapi::api::core::v1::ServiceAccount> =
        kube::Api::namespaced(c.client(), NAMESPACE);
    assert!(
        sas.get_opt(RELEASE).await.expect("get").is_none(),
        "a dry run created the ServiceAccount"
    );
}

#[tokio::test]
async fn helm_install_creates_the_release_and_helm_uninstall_removes_it() {
    // The README's `helm install` as shown, against the real API server
    // (no kubelet: the pods are never scheduled, the objects are real).
    let c = TestCluster::acquire()
        .await
        .expect("the local control plane");
    let kubeconfig = c.kubeconfig_path().to_owned();
    let helm = helm();
    let dir = TempDir::new("helm-install");
    let helm_cmd = |args: &[&str]| helm_against(&helm, &kubeconfig, dir.path(), args);
    let values = example("hcloud");
    let values = values.to_str().expect("utf-8 path");
    let chart_dir = chart();
    let chart_dir = chart_dir.to_str().expect("utf-8 path");
    run(&mut helm_cmd(&[
        "install", RELEASE, chart_dir, "-n", NAMESPACE, "-f", values,
    ]));
    let installed = std::panic::AssertUnwindSafe(async {
        let sas: kube::Api<k8s_openapi::api::core::v1::ServiceAccount> =
            kube::Api::namespaced(c.client(), NAMESPACE);
        let deployments: kube::Api<k8s_openapi::api::apps::v1::Deployment> =
            kube::Api::namespaced(c.client(), NAMESPACE);
        let roles: kube::Api<k8s_openapi::api::rbac::v1::ClusterRole> = kube::Api::all(c.client());
        let sa = sas
            .get(RELEASE)
            .await
            .expect("the release's ServiceAccount");
        let labels = sa.metadata.labels.unwrap_or_default();
        assert_eq!(
            labels
                .get("app.kubernetes.io/managed-by")
                .map(String::as_str),
            Some("Helm")
        );
        let d = deployments
            .get(RELEASE)
            .await
            .expect("the release's Deployment");
        assert_eq!(d.spec.and_then(|s| s.replicas), Some(2));
        roles.get(RELEASE).await.expect("the release's ClusterRole");
        let status = run(&mut helm_cmd(&["status", RELEASE, "-n", NAMESPACE]));
        assert!(status.contains("STATUS: deployed"), "{status}");
    });
    let result = futures::FutureExt::catch_unwind(installed).await;
    // Uninstall however the checks ended: the cluster is shared.
    run(&mut helm_cmd(&["uninstall", RELEASE, "-n", NAMESPACE]));
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
    let sas: kube::Api<k8s_openapi::api::core::v1::ServiceAccount> =
        kube::Api::namespaced(c.client(), NAMESPACE);
    let roles: kube::Api<k8s_openapi::api::rbac::v1::ClusterRole> = kube::Api::all(c.client());
    assert!(sas.get_opt(RELEASE).await.expect("get").is_none());
    assert!(roles.get_opt(RELEASE).await.expect("get").is_none());
}

/// `helm template` with `args`, parsed.
fn rendered(helm: &Path, args: &[&str]) -> Vec<Value> {
    yaml_docs(&run(&mut template_cmd(helm, args)))
}

fn named_docs<'a>(docs: &'a [Value], k: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| kind(d) == k).collect()
}

/// The names, labels and toggles an operator knows from `helm create`:
/// nameOverride/fullnameOverride, the selector pair, the standard labels,
/// replicaCount, serviceAccount.create/name, rbac.create, affinity and the
/// security contexts.
#[test]
fn the_chart_follows_helm_s_conventions_for_names_labels_and_toggles() {
    let helm = helm();
    let docs = rendered(&helm, &[]);
    let deployment = find(&docs, "Deployment");
    let selector = serde_json::json!({
        "app.kubernetes.io/name": "cloud-route-controller",
        "app.kubernetes.io/instance": RELEASE,
    });
    assert_eq!(deployment["spec"]["selector"]["matchLabels"], selector);
    for d in &docs {
        let labels = &d["metadata"]["labels"];
        for key in [
            "app.kubernetes.io/name",
            "app.kubernetes.io/instance",
            "app.kubernetes.io/version",
            "app.kubernetes.io/component",
            "app.kubernetes.io/managed-by",
            "helm.sh/chart",
        ] {
            assert!(labels[key].is_string(), "{} lacks {key}: {labels}", kind(d));
        }
    }

    let docs = rendered(
        &helm,
        &["--set", "nameOverride=routes", "--set", "replicaCount=3"],
    );
    let deployment = find(&docs, "Deployment");
    assert_eq!(
        deployment["metadata"]["name"],
        "cloud-route-controller-routes"
    );
    assert_eq!(deployment["spec"]["replicas"], 3);
    assert_eq!(
        deployment["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"],
        "routes"
    );
    let docs = rendered(&helm, &["--set", "fullnameOverride=crc"]);
    for d in docs
        .iter()
        .filter(|d| ["Deployment", "ServiceAccount", "ClusterRole"].contains(&kind(d)))
    {
        assert_eq!(d["metadata"]["name"], "crc", "{}", kind(d));
    }

    // An existing ServiceAccount and RBAC granted by hand.
    let docs = rendered(
        &helm,
        &[
            "--set",
            "serviceAccount.create=false",
            "--set",
            "serviceAccount.name=routes-sa",
            "--set",
            "rbac.create=false",
        ],
    );
    assert!(named_docs(&docs, "ServiceAccount").is_empty());
    for k in RBAC_KINDS {
        assert!(
            named_docs(&docs, k).is_empty(),
            "{k} rendered with rbac.create=false"
        );
    }
    assert_eq!(pod_spec(&docs)["serviceAccountName"], "routes-sa");
    let docs = rendered(&helm, &["--set", "serviceAccount.name=mine"]);
    assert_eq!(pod_spec(&docs)["serviceAccountName"], "mine");
    assert_eq!(find(&docs, "ServiceAccount")["metadata"]["name"], "mine");
    let binding = named_docs(&docs, "ClusterRoleBinding")[0];
    assert_eq!(binding["subjects"][0]["name"], "mine");

    // affinity replaces the default anti-affinity; the contexts are values.
    let docs = rendered(&helm, &[]);
    assert!(pod_spec(&docs)["affinity"]["podAntiAffinity"].is_object());
    let docs = rendered(
        &helm,
        &[
            "--set",
            "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].key=node-role.kubernetes.io/control-plane",
            "--set",
            "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].operator=Exists",
            "--set",
            "podSecurityContext.runAsUser=1000",
            "--set",
            "securityContext.readOnlyRootFilesystem=false",
        ],
    );
    let pod = pod_spec(&docs);
    assert!(pod["affinity"]["podAntiAffinity"].is_null());
    assert!(pod["affinity"]["nodeAffinity"].is_object());
    assert_eq!(pod["securityContext"]["runAsUser"], 1000);
    assert_eq!(
        container(&docs)["securityContext"]["readOnlyRootFilesystem"],
        false
    );
}

/// The cloud-controller-manager's own config, from its existing ConfigMap
/// by name and key, reaches `--cloud-config` beside the chart's YAML.
#[test]
fn the_cloud_config_can_come_from_the_ccms_existing_configmap() {
    let helm = helm();
    let docs = rendered(
        &helm,
        &[
            "-f",
            example("aws").to_str().expect("utf-8 path"),
            "--set",
            "cloudConfigConfigMap.existingConfigMap=aws-cloud-config",
            "--set",
            "cloudConfigConfigMap.key=cloud.conf",
        ],
    );
    let args = args_of(&docs);
    assert!(
        args.contains(
            &"--cloud-config=/etc/cloud-route-controller-configmap/cloud.conf".to_string()
        ),
        "{args:?}"
    );
    let volume = named(&pod_spec(&docs)["volumes"], "cloud-config-configmap");
    assert_eq!(volume["configMap"]["name"], "aws-cloud-config");
    assert_eq!(volume["configMap"]["items"][0]["key"], "cloud.conf");
    let mount = named(&container(&docs)["volumeMounts"], "cloud-config-configmap");
    assert_eq!(mount["mountPath"], "/etc/cloud-route-controller-configmap");
    // With no cloudConfig of the chart's own, the ConfigMap alone.
    let docs = rendered(
        &helm,
        &[
            "-f",
            example("aws").to_str().expect("utf-8 path"),
            "--set",
            "cloudConfigConfigMap.existingConfigMap=aws-cloud-config",
            "--set",
            "cloudConfig=",
        ],
    );
    let configs: Vec<String> = args_of(&docs)
        .into_iter()
        .filter(|a| a.starts_with("--cloud-config="))
        .collect();
    assert_eq!(
        configs,
        ["--cloud-config=/etc/cloud-route-controller-configmap/cloud.conf"]
    );
}

/// The monitoring objects, rendered for a release of another name: they
/// select the release's pods from Prometheus's namespace, scrape the secure
/// port over HTTPS with a token (the PodMonitor the one of a Secret the
/// chart makes beside Prometheus's service account, the ServiceMonitor
/// Prometheus's own), carry the release's labels plus `monitoring.labels`,
/// and the rule is deploy/monitoring/alerts.rules.yaml.
#[test]
fn the_chart_monitoring_objects_select_the_release_and_scrape_its_secure_port() {
    let helm = helm();
    let args = [
        common::CHART_CLUSTER,
        &["--set", "monitoring.labels.release=kube-prometheus-stack"][..],
        common::CHART_MONITORING_ON,
    ]
    .concat();
    let out = run(Command::new(&helm)
        .args([
            "template",
            "routes",
            chart().to_str().expect("utf-8 path"),
            "-n",
            NAMESPACE,
        ])
        .args(args));
    let docs = yaml_docs(&out);
    let selector = find(&docs, "Deployment")["spec"]["selector"]["matchLabels"].clone();
    assert_eq!(selector["app.kubernetes.io/instance"], "routes");
    let pm = find(&docs, "PodMonitor");
    assert_eq!(pm["metadata"]["namespace"], "monitoring");
    assert_eq!(pm["spec"]["namespaceSelector"]["matchNames"][0], NAMESPACE);
    assert_eq!(pm["spec"]["selector"]["matchLabels"], selector);
    assert_eq!(pm["metadata"]["labels"]["release"], "kube-prometheus-stack");
    assert_eq!(
        pm["metadata"]["labels"]["app.kubernetes.io/instance"],
        "routes"
    );
    let ep = &pm["spec"]["podMetricsEndpoints"][0];
    assert_eq!(ep["port"], "https");
    assert_eq!(ep["scheme"], "https");
    let token = named_docs(&docs, "Secret")
        .into_iter()
        .find(|s| s["type"] == "kubernetes.io/service-account-token")
        .expect("the scrape token Secret");
    assert_eq!(
        token["metadata"]["namespace"], "monitoring",
        "beside the service account and the PodMonitor"
    );
    assert_eq!(
        token["metadata"]["annotations"]["kubernetes.io/service-account.name"],
        "prometheus"
    );
    assert_eq!(
        ep["authorization"]["credentials"]["name"],
        token["metadata"]["name"]
    );
    let port = &container(&docs)["ports"][0];
    assert_eq!(
        port["name"], "https",
        "the PodMonitor's port is the container's"
    );
    let svc = find(&docs, "Service");
    assert_eq!(svc["metadata"]["namespace"], NAMESPACE);
    assert_eq!(svc["spec"]["selector"], selector);
    assert_eq!(svc["spec"]["ports"][0]["targetPort"], "https");
    let sm = find(&docs, "ServiceMonitor");
    assert_eq!(sm["metadata"]["namespace"], "monitoring");
    assert_eq!(sm["spec"]["namespaceSelector"]["matchNames"][0], NAMESPACE);
    assert_eq!(sm["spec"]["selector"]["matchLabels"], selector);
    assert_eq!(sm["spec"]["endpoints"][0]["scheme"], "https");
    assert_eq!(
        sm["spec"]["endpoints"][0]["bearerTokenFile"],
        "/var/run/secrets/kubernetes.io/serviceaccount/token"
    );
    let reader = named_docs(&docs, "ClusterRole")
        .into_iter()
        .find(|r| r["metadata"]["name"] == "routes-cloud-route-controller-metrics-reader")
        .expect("the metrics reader");
    assert_eq!(reader["rules"][0]["nonResourceURLs"][0], "/metrics");
    let rule = find(&docs, "PrometheusRule");
    assert_eq!(rule["metadata"]["namespace"], "monitoring");
    let file = std::fs::read_to_string(common::repo().join("deploy/monitoring/alerts.rules.yaml"))
        .expect("read the rules file");
    let groups: Value = serde_yaml_ng::from_str(&file).expect("the rules file is YAML");
    assert_eq!(
        rule["spec"]["groups"], groups["groups"],
        "the chart's rule is the rules file"
    );
    let copy =
        std::fs::read_to_string(chart().join("files/alerts.rules.yaml")).expect("the chart's copy");
    assert_eq!(
        copy, file,
        "deploy/helm/cloud-route-controller/files/alerts.rules.yaml is a copy of deploy/monitoring/alerts.rules.yaml"
    );
    // Off by default: the chart needs no Prometheus Operator.
    let defaults = rendered(&helm, &[]);
    for k in ["PodMonitor", "ServiceMonitor", "PrometheusRule", "Service"] {
        assert!(
            named_docs(&defaults, k).is_empty(),
            "{k} rendered by default"
        );
    }
}

/// Monitoring switched on where the cluster does not serve the Prometheus
/// Operator's API: nothing of it is rendered (an install would fail on the
/// unknown kinds), and the notes say so.
#[test]
fn monitoring_on_without_the_operators_crds_renders_no_monitor_and_the_notes_warn() {
    let helm = helm();
    let on: Vec<&str> = common::CHART_MONITORING_ON
        .iter()
        .copied()
        .filter(|a| !a.starts_with("--api-versions") && *a != "monitoring.coreos.com/v1")
        .collect();
    let docs = rendered(&helm, &on);
    for k in ["PodMonitor", "ServiceMonitor", "PrometheusRule"] {
        assert!(
            named_docs(&docs, k).is_empty(),
            "{k} rendered without its CRD"
        );
    }
    let notes = rendered_notes(&helm, &on);
    assert!(
        notes.contains("does not serve monitoring.coreos.com/v1"),
        "{notes}"
    );
    let with = [&["--api-versions", "monitoring.coreos.com/v1"][..], &on[..]].concat();
    let notes = rendered_notes(&helm, &with);
    assert!(!notes.contains("WARNING"), "{notes}");
}

/// `monitoring.runbookBaseURL` re-points every alert's runbook at a mirror,
/// keeping each alert's section.
#[test]
fn the_runbook_base_url_re_points_every_alert_at_its_section() {
    let helm = helm();
    let args = [
        common::CHART_MONITORING_ON,
        &[
            "--set",
            "monitoring.runbookBaseURL=https://wiki.example.com/routes/",
        ][..],
    ]
    .concat();
    let docs = rendered(&helm, &args);
    let rule = find(&docs, "PrometheusRule");
    let mut n = 0;
    for g in rule["spec"]["groups"].as_array().expect("groups") {
        for r in g["rules"].as_array().expect("rules") {
            let alert = r["alert"].as_str().expect("alert");
            assert_eq!(
                r["annotations"]["runbook_url"],
                format!(
                    "https://wiki.example.com/routes#{}",
                    alert.to_ascii_lowercase()
                ),
                "{alert}"
            );
            n += 1;
        }
    }
    assert!(n >= 9, "{n} alerts");
}

/// The chart as it was before its selector became Helm's pair (the last
/// commit with `app: <fullname>`): what an existing release runs today.
const PREVIOUS_CHART_COMMIT: &str = "5454565";

/// An existing release of the previous chart upgrades as the chart README's
/// upgrade notes say: `helm upgrade` alone is refused (a Deployment's
/// selector is immutable), deleting the Deployment first lets it through,
/// and the new Deployment selects with `app.kubernetes.io/name` +
/// `/instance`; the ServiceAccount, RBAC and Lease role are kept.
#[tokio::test]
async fn a_release_of_the_previous_chart_upgrades_after_its_deployment_is_deleted() {
    let c = TestCluster::acquire()
        .await
        .expect("the local control plane");
    let kubeconfig = c.kubeconfig_path().to_owned();
    let helm = helm();
    let dir = TempDir::new("helm-upgrade");
    let previous = dir.path().join("previous");
    std::fs::create_dir_all(&previous).expect("mkdir");
    let archive = dir.path().join("previous.tar");
    run(Command::new("git")
        .arg("-C")
        .arg(common::repo())
        .args(["archive", "--format=tar", "-o"])
        .arg(&archive)
        .arg(PREVIOUS_CHART_COMMIT)
        .arg("deploy/helm/cloud-route-controller"));
    run(Command::new("tar")
        .arg("-xf")
        .arg(&archive)
        .arg("-C")
        .arg(&previous));
    let previous_chart = previous.join("deploy/helm/cloud-route-controller");
    let helm_cmd = |args: &[&str]| helm_against(&helm, &kubeconfig, dir.path(), args);
    let path = |p: &Path| p.to_str().expect("utf-8 path").to_string();
    let old_values = path(&previous_chart.join("examples/hcloud.yaml"));
    run(&mut helm_cmd(&[
        "install",
        RELEASE,
        &path(&previous_chart),
        "-n",
        NAMESPACE,
        "-f",
        &old_values,
    ]));
    let checked = std::panic::AssertUnwindSafe(async {
        let deployments: kube::Api<k8s_openapi::api::apps::v1::Deployment> =
            kube::Api::namespaced(c.client(), NAMESPACE);
        let before = deployments.get(RELEASE).await.expect("the old Deployment");
        let old_selector = before
            .spec
            .expect("spec")
            .selector
            .match_labels
            .unwrap_or_default();
        assert_eq!(
            old_selector.get("app").map(String::as_str),
            Some(RELEASE),
            "the previous chart's selector"
        );
        let new_values = path(&example("hcloud"));
        let chart_dir = path(&chart());
        let refused = helm_cmd(&[
            "upgrade",
            RELEASE,
            &chart_dir,
            "-n",
            NAMESPACE,
            "-f",
            &new_values,
        ])
        .output()
        .expect("run helm");
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert!(
            !refused.status.success(),
            "upgraded over an immutable selector"
        );
        assert!(stderr.contains("field is immutable"), "{stderr}");
        // The upgrade note's step: routes stay as they are while no replica
        // runs; nothing deletes them.
        run(Command::new(kubectl_bin())
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args([
                "-n",
                NAMESPACE,
                "delete",
                "deployment",
                RELEASE,
                "--wait=true",
            ]));
        run(&mut helm_cmd(&[
            "upgrade",
            RELEASE,
            &chart_dir,
            "-n",
            NAMESPACE,
            "-f",
            &new_values,
        ]));
        let after = deployments.get(RELEASE).await.expect("the new Deployment");
        let selector = after
            .spec
            .expect("spec")
            .selector
            .match_labels
            .unwrap_or_default();
        assert_eq!(
            selector.get("app.kubernetes.io/name").map(String::as_str),
            Some("cloud-route-controller")
        );
        assert_eq!(
            selector
                .get("app.kubernetes.io/instance")
                .map(String::as_str),
            Some(RELEASE)
        );
        assert!(!selector.contains_key("app"));
        let sas: kube::Api<k8s_openapi::api::core::v1::ServiceAccount> =
            kube::Api::namespaced(c.client(), NAMESPACE);
        sas.get(RELEASE).await.expect("the ServiceAccount is kept");
        let status = run(&mut helm_cmd(&["status", RELEASE, "-n", NAMESPACE]));
        assert!(status.contains("STATUS: deployed"), "{status}");
    });
    let result = futures::FutureExt::catch_unwind(checked).await;
    run(&mut helm_cmd(&["uninstall", RELEASE, "-n", NAMESPACE]));
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}

/// The chart README's values table is what `scripts/chart-readme.py` makes
/// of values.yaml now, and every value in it says what it does.
#[test]
fn the_chart_readme_values_table_is_generated_from_values_yaml_and_describes_every_value() {
    let out = Command::new("python3")
        .arg(common::repo().join("scripts/chart-readme.py"))
        .arg("--check")
        .output()
        .expect("run scripts/chart-readme.py");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let readme = std::fs::read_to_string(chart().join("README.md")).expect("the chart's README");
    let table = readme
        .split("<!-- values:begin -->")
        .nth(1)
        .and_then(|t| t.split("<!-- values:end -->").next())
        .expect("the values table");
    let rows: Vec<&str> = table.lines().filter(|l| l.starts_with("| `")).collect();
    assert!(rows.len() > 40, "{table}");
    for row in &rows {
        let description = row.rsplit('|').nth(1).unwrap_or("").trim();
        assert!(
            !description.is_empty(),
            "a value without a description: {row}"
        );
    }
    let values: Value = serde_yaml_ng::from_str(
        &std::fs::read_to_string(chart().join("values.yaml")).expect("values.yaml"),
    )
    .expect("values.yaml is YAML");
    for key in values.as_object().expect("a map").keys() {
        assert!(
            rows.iter()
                .any(|r| r.starts_with(&format!("| `{key}`"))
                    || r.starts_with(&format!("| `{key}."))),
            "{key} is not in the chart README's table"
        );
    }
}

/// `helm template` with `args` only (no cluster values): it must fail; its
/// stderr.
fn refused_without(helm: &Path, args: &[&str]) -> String {
    let out = bare_template_cmd(helm, args).output().expect("run helm");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{args:?} rendered");
    stderr
}

/// The cluster's pod CIDRs have no default: a wrong one would make the
/// controller misjudge every Node, so the schema refuses a release without.
#[test]
fn helm_install_without_cluster_cidrs_fails_with_the_schemas_message() {
    let helm = helm();
    let stderr = refused_without(&helm, &["--set", "clusterName=kubernetes"]);
    assert!(
        stderr.contains("values don't meet the specifications of the schema"),
        "{stderr}"
    );
    assert!(stderr.contains("at '/clusterCIDRs'"), "{stderr}");
    // Not a CIDR: refused by the schema too.
    let stderr = refused_without(
        &helm,
        &[
            "--set",
            "clusterName=kubernetes",
            "--set",
            "clusterCIDRs={kubernetes}",
        ],
    );
    assert!(stderr.contains("at '/clusterCIDRs/0'"), "{stderr}");
    // Both CIDR families are accepted.
    for cidrs in [
        "{10.244.0.0/16}",
        "{fd00:10:244::/56}",
        "{10.244.0.0/16,fd00:10:244::/56}",
    ] {
        let set = format!("clusterCIDRs={cidrs}");
        run(&mut bare_template_cmd(
            &helm,
            &["--set", "clusterName=kubernetes", "--set", &set],
        ));
    }
}

/// The cluster's name has no default either: it is the CCM's own.
#[test]
fn helm_install_without_cluster_name_fails_with_the_schemas_message() {
    let helm = helm();
    let stderr = refused_without(&helm, &["--set", "clusterCIDRs={10.244.0.0/16}"]);
    assert!(
        stderr.contains("values don't meet the specifications of the schema"),
        "{stderr}"
    );
    assert!(stderr.contains("at '/clusterName'"), "{stderr}");
}

#[test]
fn cluster_cidrs_of_one_family_render_route_ip_families_of_that_family() {
    let helm = helm();
    let families = |extra: &[&str]| {
        let mut args = vec!["--set", "clusterName=kubernetes"];
        args.extend_from_slice(extra);
        let docs = yaml_docs(&run(&mut bare_template_cmd(&helm, &args)));
        let args = args_of(&docs);
        let with = |prefix: &str| {
            args.iter()
                .filter(|a| a.starts_with(prefix))
                .cloned()
                .collect::<Vec<_>>()
        };
        assert_eq!(with("--route-ip-families").len(), 1, "{args:?}");
        with("--route-ip-families=")[0].clone()
    };
    assert_eq!(
        families(&["--set", "clusterCIDRs={10.244.0.0/16}"]),
        "--route-ip-families=IPv4"
    );
    assert_eq!(
        families(&["--set", "clusterCIDRs={fd00:10:244::/56}"]),
        "--route-ip-families=IPv6"
    );
    // A dual-stack pair, in either order: both, IPv4 first.
    for cidrs in [
        "{10.244.0.0/16,fd00:10:244::/56}",
        "{fd00:10:244::/56,10.244.0.0/16}",
    ] {
        let set = format!("clusterCIDRs={cidrs}");
        assert_eq!(families(&["--set", &set]), "--route-ip-families=IPv4,IPv6");
    }
    // routeIPFamilies set: it wins.
    assert_eq!(
        families(&[
            "--set",
            "clusterCIDRs={10.244.0.0/16,fd00:10:244::/56}",
            "--set",
            "routeIPFamilies={IPv4}",
        ]),
        "--route-ip-families=IPv4"
    );
    assert_eq!(
        families(&[
            "--set",
            "clusterCIDRs={10.244.0.0/16}",
            "--set",
            "routeIPFamilies={IPv4,IPv6}",
        ]),
        "--route-ip-families=IPv4,IPv6"
    );
}

/// The chart rendered with the cluster's values and `extra`, and its notes.
/// `helm template` leaves NOTES.txt out and `helm install --dry-run` needs a
/// cluster: a copy of the chart renders the notes' exact text through `tpl`
/// in a template of its own.
fn render_with_notes(helm: &Path, extra: &[&str]) -> (Vec<Value>, String) {
    let dir = TempDir::new("helm-notes");
    let copy = dir.path().join("chart");
    copy_dir(&chart(), &copy);
    std::fs::copy(
        chart().join("templates/NOTES.txt"),
        copy.join("notes-under-test.txt"),
    )
    .expect("copy NOTES.txt");
    std::fs::write(
        copy.join("templates/notes-under-test.yaml"),
        "notes: {{ tpl (.Files.Get \"notes-under-test.txt\") . | toJson }}\n",
    )
    .expect("write the notes' template");
    let values = cluster_values();
    let mut cmd = Command::new(helm);
    cmd.args(["template", RELEASE])
        .arg(&copy)
        .args(["-n", NAMESPACE])
        .args(["-f", values.to_str().expect("utf-8 path")])
        .args(extra);
    let docs = yaml_docs(&run(&mut cmd));
    let notes = docs
        .iter()
        .find_map(|d| d["notes"].as_str())
        .expect("the notes rendered")
        .to_string();
    (docs, notes)
}

fn rendered_notes(helm: &Path, extra: &[&str]) -> String {
    render_with_notes(helm, extra).1
}

/// The notes' `plan` command carries the flags the Deployment runs with
/// that change what plan computes, so the operator checks the
/// configuration that will run.
#[test]
fn the_notes_plan_command_carries_the_deployments_flags() {
    let helm = helm();
    let notes = |extra: &[&str]| -> (Vec<String>, String) {
        let (docs, notes) = render_with_notes(&helm, extra);
        let plan = notes
            .lines()
            .find(|l| l.contains("cloud-route-controller plan "))
            .unwrap_or_else(|| panic!("no plan command in the notes: {notes}"));
        let plan = plan.split_once(" plan ").expect("plan").1;
        (
            plan.split(' ')
                .map(|w| w.trim_matches('\'').to_string())
                .collect(),
            args_of(&docs).join(" "),
        )
    };
    let (plan, args) = notes(&[
        "-f",
        example("hcloud").to_str().expect("utf-8 path"),
        "--set",
        "extraArgs={--route-deletion-grace=10s,--reconcile-mode=full}",
    ]);
    for flag in [
        "--cluster-cidr=10.244.0.0/16",
        "--cluster-name=kubernetes",
        "--node-selector=instance.hetzner.cloud/is-root-server!=true",
        "--route-ip-families=IPv4",
        "--cloud-provider=hcloud",
        "--cloud-config=/etc/cloud-route-controller/cloud.yaml",
        "--route-deletion-grace=10s",
    ] {
        assert!(plan.iter().any(|w| w == flag), "{flag} not in {plan:?}");
        assert!(
            args.contains(flag),
            "the Deployment runs without {flag}: {args}"
        );
    }
    assert!(
        !plan.iter().any(|w| w.starts_with("--reconcile-mode")),
        "plan takes no --reconcile-mode: {plan:?}"
    );
    // Dual-stack without routeIPFamilies: both families, as the Deployment.
    let (plan, _) = notes(&["--set", "clusterCIDRs={10.244.0.0/16,fd00:10:244::/56}"]);
    assert!(
        plan.iter().any(|w| w == "--route-ip-families=IPv4,IPv6"),
        "{plan:?}"
    );
    assert!(
        !plan.iter().any(|w| w.starts_with("--node-selector")),
        "no selector set: {plan:?}"
    );
}

/// Copies the directory `from` to `to`, recursively.
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create the copy's directory");
    for entry in std::fs::read_dir(from).expect("read the directory") {
        let entry = entry.expect("a directory entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("its type").is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy a file");
        }
    }
}

/// `dryRun=true` runs the controller with `--dry-run` under a Lease of its
/// own, which its Role grants; the default writes, under the default Lease.
#[test]
fn dry_run_renders_the_flag_and_a_lease_of_its_own() {
    let helm = helm();
    let lease_of = |docs: &[Value]| {
        let role = find(docs, "Role");
        let granted: Vec<&Value> = role["rules"]
            .as_array()
            .expect("rules")
            .iter()
            .filter_map(|r| r["resourceNames"].as_array())
            .flatten()
            .collect();
        let args = args_of(docs);
        let lease = flag(&args, "--leader-elect-resource-name");
        assert_eq!(granted, [&Value::from(lease.clone())], "{role}");
        (args.iter().any(|a| a == "--dry-run"), lease)
    };
    let writer = rendered(&helm, &[]);
    assert_eq!(
        lease_of(&writer),
        (false, "cloud-route-controller".to_string())
    );
    let shadow = rendered(&helm, &["--set", "dryRun=true"]);
    assert_eq!(
        lease_of(&shadow),
        (true, "cloud-route-controller-dry-run".to_string())
    );
    let named = rendered(
        &helm,
        &[
            "--set",
            "dryRun=true",
            "--set",
            "leaderElection.resourceName=routes",
        ],
    );
    assert_eq!(lease_of(&named), (true, "routes-dry-run".to_string()));
}

/// The bounds of a pass are values of their own, rendered as the binary's
/// flags, so a hold is released with `--set` for one rollout; a value the
/// binary would refuse is refused by the schema before anything is applied.
#[test]
fn bounded_pass_values_render_their_flags_and_a_bound_that_is_not_one_is_refused() {
    let helm = helm();
    let args = args_of(&rendered(&helm, &[]));
    assert_eq!(flag(&args, "--max-unavailable-nodes"), "10%");
    assert_eq!(flag(&args, "--max-route-deletions"), "10");
    let released = args_of(&rendered(
        &helm,
        &["--set-string", "maxRouteDeletions=100%"],
    ));
    assert_eq!(flag(&released, "--max-route-deletions"), "100%");
    for bad in ["maxRouteDeletions=ten", "maxUnavailableNodes=101%"] {
        let stderr = refused_without(
            &helm,
            &[
                "--set",
                "clusterName=kubernetes",
                "--set",
                "clusterCIDRs={10.244.0.0/16}",
                "--set-string",
                bad,
            ],
        );
        let key = bad.split('=').next().unwrap_or_default();
        assert!(stderr.contains(&format!("at '/{key}'")), "{bad}: {stderr}");
    }
}

/// The `helm test` Pod runs `plan --exit-code` with the flags the notes'
/// plan command carries, and with the Deployment's identity, credentials,
/// config mounts and placement, so it checks the configuration that runs.
#[test]
fn the_helm_test_pod_runs_plan_with_the_deployments_flags_identity_and_mounts() {
    let helm = helm();
    let values = example("hcloud");
    let extra = [
        "-f",
        values.to_str().expect("utf-8 path"),
        "--set",
        "extraArgs={--route-deletion-grace=10s}",
    ];
    let (docs, notes) = render_with_notes(&helm, &extra);
    let test = docs
        .iter()
        .find(|d| kind(d) == "Pod" && d["metadata"]["annotations"]["helm.sh/hook"] == "test")
        .expect("a helm test Pod");
    assert_eq!(test["spec"]["restartPolicy"], "Never");
    let c = &test["spec"]["containers"][0];
    let args: Vec<&str> = c["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| a.as_str().expect("an arg"))
        .collect();
    assert_eq!(args.first(), Some(&"plan"));
    assert_eq!(args.last(), Some(&"--exit-code"));
    let line = notes
        .lines()
        .find_map(|l| l.split_once("cloud-route-controller plan ").map(|(_, f)| f))
        .expect("the notes' plan command");
    let noted: Vec<String> = line
        .split(' ')
        .map(|w| w.trim_matches('\'').to_string())
        .collect();
    assert_eq!(args[1..args.len() - 1], noted, "the notes' plan flags");
    assert!(args.contains(&"--route-deletion-grace=10s"), "{args:?}");
    let deployment = container(&docs);
    assert_eq!(c["image"], deployment["image"]);
    assert_eq!(c["env"], deployment["env"], "the same credentials");
    assert_eq!(c["volumeMounts"], deployment["volumeMounts"]);
    let pod = pod_spec(&docs);
    for field in [
        "serviceAccountName",
        "volumes",
        "hostNetwork",
        "tolerations",
        "securityContext",
    ] {
        assert_eq!(test["spec"][field], pod[field], "{field}");
    }
    // Off: no test Pod.
    let off = rendered(&helm, &["--set", "helmTest.enabled=false"]);
    assert!(named_docs(&off, "Pod").is_empty());
}

/// The flags operators change most have values of their own, rendered as
/// the flags; unset, the controller's defaults apply (no flag); set both
/// as a value and in extraArgs, the chart refuses.
#[test]
fn common_flags_have_values_rendered_as_flags_and_refused_when_also_in_extra_args() {
    let helm = helm();
    let defaults = args_of(&rendered(&helm, &[]));
    for flag in [
        "--reconcile-mode",
        "--route-reconciliation-period",
        "--route-drift-check-period",
        "--leader-elect-lease-duration",
        "--v=",
        "--logging-format",
    ] {
        assert!(
            !defaults.iter().any(|a| a.starts_with(flag)),
            "{flag} rendered by default: {defaults:?}"
        );
    }
    let set = args_of(&rendered(
        &helm,
        &[
            "--set",
            "reconcileMode=periodic",
            "--set",
            "routeReconciliationPeriod=30s",
            "--set",
            "routeDriftCheckPeriod=0s",
            "--set",
            "leaderElection.leaseDuration=30s",
            "--set",
            "leaderElection.renewDeadline=20s",
            "--set",
            "leaderElection.retryPeriod=4s",
            "--set",
            "logging.verbosity=4",
            "--set",
            "logging.format=json",
        ],
    ));
    for arg in [
        "--reconcile-mode=periodic",
        "--route-reconciliation-period=30s",
        "--route-drift-check-period=0s",
        "--leader-elect-lease-duration=30s",
        "--leader-elect-renew-deadline=20s",
        "--leader-elect-retry-period=4s",
        "--v=4",
        "--logging-format=json",
    ] {
        assert!(set.iter().any(|a| a == arg), "{arg} missing: {set:?}");
    }
    let out = template_cmd(
        &helm,
        &[
            "--set",
            "reconcileMode=watch",
            "--set",
            "extraArgs={--reconcile-mode=periodic}",
        ],
    )
    .output()
    .expect("run helm");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--reconcile-mode is set twice: by its chart value and in extraArgs"),
        "{err}"
    );
    let out = template_cmd(&helm, &["--set", "reconcileMode=fast"])
        .output()
        .expect("run helm");
    assert!(!out.status.success(), "an unknown mode was accepted");
}
