//! docs/quickstart.md followed literally, once per cloud, on the local
//! control plane against that cloud's emulator or fake: installed as a
//! shadow first, it plans the Node's route and writes nothing; upgraded as
//! the page says, it routes the Node and the page's own check shows it
//! `RouteCreated`.
//!
//! How: the page's common `helm install` command and its `helm upgrade`
//! command are read from the page (not copied here), made `helm template`
//! with the same arguments (the upgrade's `--reuse-values` as the install's
//! values plus its own) and the page's placeholders filled in, and render
//! the chart with the cloud's example values as shipped. The binary then
//! runs as the rendered pod would: the container's args (`$(VAR)` expanded
//! as the kubelet does, leader election on as rendered), its environment
//! (the downward API's pod name and namespace, the Secrets' keys) and the
//! ConfigMap's cloud config. It differs only where the example marks a
//! value `REPLACE` (the operator's own ids), or where a laptop must differ
//! from the pod; each test names those where it gives them, and a value it
//! changes that the example does not mark fails the test. A Node of an
//! instance the fake has must read `NetworkUnavailable=False/RouteCreated`
//! within 60 s, its route must be in the fake's table, and the page's
//! `kubectl get nodes -o custom-columns=...` against the local control
//! plane must show it `RouteCreated`.
//!
//! A page whose command is gone, or that gains a placeholder this test does
//! not fill in, fails the test naming it.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{Controller, TempDir, args_of, container, create_aws_nodes, find, kind};
use common::{pod_routes, pod_spec, repo, run, yaml_docs};
use k8s_openapi::api::coordination::v1::Lease;
use serde_json::{Value, json};
use test_cluster::{ClusterGuard, TestCluster, TestNode, wait_until};

const PAGE: &str = "docs/quickstart.md";

/// What this test fills in for the page's placeholders (besides `<cloud>`).
const REGISTRY: &str = "registry.example.com/platform";
const POD_CIDR: &str = "10.244.0.0/16";
const CLUSTER_NAME: &str = "quickstart";

/// What the downward API gives `POD_NAME`: one replica of the Deployment.
const POD_NAME: &str = "cloud-route-controller-7d9c5b6f4-q2xkz";

/// How long a Node may wait for its route.
const ROUTED_WITHIN: Duration = Duration::from_secs(60);

/// docs/quickstart.md as it is now.
struct QuickStart {
    text: String,
}

impl QuickStart {
    fn read() -> Self {
        let text = std::fs::read_to_string(repo().join(PAGE))
            .unwrap_or_else(|e| panic!("read {PAGE}: {e}"));
        QuickStart { text }
    }

    /// The shell commands of the page's fenced code blocks, each with its
    /// continuation lines (`\` at the end) joined.
    fn commands(&self) -> Vec<String> {
        let mut commands = Vec::new();
        let mut in_block = false;
        let mut current = String::new();
        for line in self.text.lines().map(str::trim) {
            if line.starts_with("```") {
                in_block = !in_block;
                continue;
            }
            if !in_block || (current.is_empty() && line.is_empty()) {
                continue;
            }
            match line.strip_suffix('\\') {
                Some(part) => {
                    current.push_str(part);
                    current.push(' ');
                }
                None => {
                    current.push_str(line);
                    commands.push(std::mem::take(&mut current));
                }
            }
        }
        commands
    }

    /// The page's one command that starts with `start`, split into words.
    fn command(&self, start: &str, cloud: &str) -> Vec<String> {
        let found: Vec<String> = self
            .commands()
            .into_iter()
            .filter(|c| c.starts_with(start))
            .collect();
        assert!(
            found.len() == 1,
            "{PAGE} should have exactly one `{}...` command in a code block, it has \
             {found:?}: the quick start this test follows has changed; follow the new one here",
            start.trim_end()
        );
        shell_words(&fill_placeholders(&found[0], cloud))
    }

    /// The common install of every cloud: `helm install ...`.
    fn install(&self, example: &str) -> Vec<String> {
        self.command("helm install ", example)
    }

    /// The step that lets it write: `helm upgrade ... --reuse-values ...`,
    /// as the install's arguments followed by the upgrade's own values.
    fn upgrade(&self, example: &str) -> Vec<String> {
        let words = self.command("helm upgrade ", "");
        let reuse = words
            .iter()
            .position(|w| w == "--reuse-values")
            .unwrap_or_else(|| panic!("{PAGE}'s upgrade no longer reuses the values: {words:?}"));
        let mut all = self.install(example);
        all.extend(words[reuse + 1..].iter().cloned());
        all
    }

    /// Step 5's check: `kubectl get nodes -o custom-columns=...`.
    fn check(&self) -> Vec<String> {
        let words = self.command("kubectl get nodes ", "");
        assert!(
            words.iter().any(|w| w.starts_with("custom-columns=")),
            "{PAGE}'s check no longer prints custom columns: {words:?}"
        );
        words
    }

    /// The image step 2 builds and pushes: `make image ARGS="--tag <image>"`.
    fn built_image(&self) -> String {
        let make = self
            .text
            .split('`')
            .skip(1)
            .step_by(2)
            .find(|span| span.starts_with("make image "))
            .unwrap_or_else(|| {
                panic!("{PAGE} no longer says how to build the image (`make image ...`)")
            });
        let words = shell_words(&fill_placeholders(make, ""));
        words
            .iter()
            .find_map(|w| w.strip_prefix("ARGS=--tag "))
            .unwrap_or_else(|| panic!("{PAGE}: no `--tag` in {make:?}"))
            .to_string()
    }

    /// The install rendered: `helm template` with the install's arguments,
    /// run where the page's relative paths start (the repository's root).
    /// `example` is the example values file's name, `cloud` its provider.
    fn render(&self, example: &str, cloud: &str) -> Vec<Value> {
        let docs = self.render_words(&self.install(example), example, cloud);
        assert!(
            args_of(&docs).iter().any(|a| a == "--dry-run"),
            "{PAGE}'s install is no longer a shadow (--dry-run): {:?}",
            args_of(&docs)
        );
        docs
    }

    /// The upgrade that lets it write, rendered.
    fn render_upgrade(&self, example: &str, cloud: &str) -> Vec<Value> {
        let docs = self.render_words(&self.upgrade(example), example, cloud);
        assert!(
            !args_of(&docs).iter().any(|a| a == "--dry-run"),
            "{PAGE}'s upgrade leaves it a shadow: {:?}",
            args_of(&docs)
        );
        docs
    }

    fn render_words(&self, words: &[String], example: &str, cloud: &str) -> Vec<Value> {
        assert_eq!(words[..2], ["helm", "install"], "{words:?}");
        let values = format!("deploy/helm/cloud-route-controller/examples/{example}.yaml");
        assert!(
            words.windows(2).any(|w| w == ["-f", values.as_str()]),
            "{PAGE}'s install no longer uses the cloud's example values ({values}): {words:?}"
        );
        let docs = yaml_docs(&run(Command::new(common::gotool("helm"))
            .arg("template")
            .args(&words[2..])
            .current_dir(repo())));
        let args = args_of(&docs);
        assert!(
            args.contains(&format!("--cloud-provider={cloud}")),
            "{values} does not render --cloud-provider={cloud}: {args:?}"
        );
        // The image the page's step 1 pushed is the one the pod would pull.
        assert_eq!(container(&docs)["image"], self.built_image().as_str());
        docs
    }
}

/// The example values file `example` as shipped.
fn example_text(example: &str) -> String {
    let path = repo().join(format!(
        "deploy/helm/cloud-route-controller/examples/{example}.yaml"
    ));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"))
}

/// Fails unless the line of `key` (its last dotted part) in the example
/// `example` is marked `# REPLACE`: the test may change only what the
/// operator is told to.
fn assert_marked(example: &str, key: &str) {
    let last = key.rsplit('.').next().unwrap_or(key);
    let text = example_text(example);
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with(&format!("{last}:")))
        .unwrap_or_else(|| {
            panic!("{example}.yaml has no {key}: the test changes a value it does not ship")
        });
    assert!(
        line.contains("# REPLACE"),
        "{example}.yaml does not mark {key} for the operator to replace, yet the test changes it: {line:?}"
    );
}

/// Fills in the page's placeholders; a placeholder this test does not know
/// is a change of the page the test must follow, so it fails naming it.
fn fill_placeholders(command: &str, cloud: &str) -> String {
    let filled = command
        .replace("<cloud>", cloud)
        .replace("<registry>", REGISTRY)
        .replace("<pod CIDR>", POD_CIDR)
        .replace("<the CCM's --cluster-name>", CLUSTER_NAME);
    if let Some(start) = filled.find('<')
        && let Some(len) = filled[start..].find('>')
    {
        panic!(
            "{PAGE}: `{command}` has a placeholder this test does not fill in: {}",
            &filled[start..=start + len]
        );
    }
    filled
}

/// `command`'s words as a POSIX shell splits them (blanks separate, quotes
/// group and are removed). The test runs commands without a shell, so
/// anything that needs one (pipes, variables, redirections) fails here.
fn shell_words(command: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut chars = command.chars();
    while let Some(c) = chars.next() {
        match c {
            c if c.is_whitespace() => words.extend(word.take()),
            '\'' | '"' => {
                let w = word.get_or_insert_default();
                loop {
                    match chars.next() {
                        Some(q) if q == c => break,
                        Some('\\') if c == '"' => w.extend(chars.next()),
                        Some(other) => w.push(other),
                        None => panic!("{PAGE}: unterminated {c} in `{command}`"),
                    }
                }
            }
            '\\' => word.get_or_insert_default().extend(chars.next()),
            '|' | '&' | ';' | '<' | '>' | '$' | '`' | '(' | ')' => {
                panic!("{PAGE}: `{command}` needs a shell ({c}); this test runs it without one")
            }
            c => word.get_or_insert_default().push(c),
        }
    }
    words.extend(word);
    words
}

/// The rendered pod: its container's args and environment as the kubelet
/// resolves them.
struct Pod<'a> {
    docs: &'a [Value],
    /// The example values file it was rendered from.
    example: &'a str,
    args: Vec<String>,
    env: Vec<(String, String)>,
}

impl<'a> Pod<'a> {
    /// The pod of `docs`; a Secret the chart does not render (one the
    /// operator already has) is read from `existing` as (name, key, value).
    fn rendered(docs: &'a [Value], example: &'a str, existing: &[(&str, &str, String)]) -> Self {
        let namespace = find(docs, "Deployment")["metadata"]["namespace"]
            .as_str()
            .expect("the Deployment's namespace")
            .to_string();
        let env: Vec<(String, String)> = container(docs)["env"]
            .as_array()
            .expect("the container's env")
            .iter()
            .map(|e| {
                let name = e["name"].as_str().expect("a variable's name").to_string();
                let from = &e["valueFrom"];
                let value = if let Some(v) = e["value"].as_str() {
                    v.to_string()
                } else if let Some(field) = from["fieldRef"]["fieldPath"].as_str() {
                    match field {
                        "metadata.name" => POD_NAME.to_string(),
                        "metadata.namespace" => namespace.clone(),
                        other => panic!("{name}: no value for the pod's {other}"),
                    }
                } else {
                    let secret = from["secretKeyRef"]["name"].as_str();
                    let key = from["secretKeyRef"]["key"].as_str();
                    let (Some(secret), Some(key)) = (secret, key) else {
                        panic!("{name}: a source this test does not resolve: {e}")
                    };
                    secret_value(docs, existing, secret, key)
                };
                (name, value)
            })
            .collect();
        let args = args_of(docs)
            .iter()
            .map(|a| {
                env.iter().fold(a.clone(), |a, (name, value)| {
                    a.replace(&format!("$({name})"), value)
                })
            })
            .collect();
        Pod {
            docs,
            example,
            args,
            env,
        }
    }

    /// The value of `--<name>=` in the args.
    fn flag(&self, name: &str) -> &str {
        self.args
            .iter()
            .find_map(|a| a.strip_prefix(&format!("{name}=")))
            .unwrap_or_else(|| panic!("no {name} in {:?}", self.args))
    }

    /// Starts the binary as the pod runs it, with `replaced` keys of its
    /// cloud config (dotted for nested ones) set as the operator sets the
    /// values the example marks `REPLACE`, `laptop` keys set where a laptop
    /// must differ (the fakes' addresses), and `env` added to its
    /// environment; each said where the test gives it.
    fn start(
        &self,
        c: &ClusterGuard,
        dir: &TempDir,
        replaced: &[(&str, Value)],
        laptop: &[(&str, Value)],
        env: &[(&str, String)],
    ) -> Controller {
        for (key, _) in replaced {
            assert_marked(self.example, key);
        }
        let mut cloud_config = rendered_cloud_config(self.docs);
        for (key, value) in replaced.iter().chain(laptop) {
            let mut at = &mut cloud_config;
            for part in key.split('.') {
                at = &mut at[part];
            }
            *at = value.clone();
        }
        let config_file = dir.path().join("cloud.yaml");
        std::fs::write(
            &config_file,
            serde_yaml_ng::to_string(&cloud_config).expect("YAML"),
        )
        .expect("write the cloud config");
        let args: Vec<String> = self
            .args
            .iter()
            .map(|a| {
                if a.starts_with("--cloud-config=") {
                    // The same content, where this machine has it.
                    format!("--cloud-config={}", config_file.display())
                } else if a.starts_with("--secure-port=") {
                    // The pod's port is its node's own (host network); here
                    // every test shares one host, so a free one.
                    format!("--secure-port={}", common::free_port())
                } else {
                    a.clone()
                }
            })
            .collect();
        let home = dir.path().display().to_string();
        let env: Vec<(&str, &str)> = self
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            // The image's home holds no cloud login; an empty one here too,
            // not this machine's.
            .chain([("HOME", home.as_str())])
            .chain(env.iter().map(|(k, v)| (*k, v.as_str())))
            .collect();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        // The kubeconfig of the local control plane instead of the pod's
        // in-cluster configuration (Controller adds `--kubeconfig`).
        Controller::start_with_only_env(c.kubeconfig_path(), dir.path(), "controller", &args, &env)
    }

    /// Checks that the controller ran as the elected leader: the Lease the
    /// rendered flags name, in the pod's namespace, is held by this pod.
    async fn holds_the_lease(&self, c: &ClusterGuard) {
        let leases: kube::Api<Lease> =
            kube::Api::namespaced(c.client(), self.flag("--leader-elect-resource-namespace"));
        let lease = leases
            .get(self.flag("--leader-elect-resource-name"))
            .await
            .expect("the Lease the chart names");
        let holder = lease.spec.and_then(|s| s.holder_identity);
        assert_eq!(holder.as_deref(), Some(POD_NAME));
    }
}

/// The file the rendered container's one `--cloud-config` names, parsed,
/// as the pod reads it from the rendered ConfigMap mounted there.
fn rendered_cloud_config(docs: &[Value]) -> Value {
    let args = args_of(docs);
    let paths: Vec<&str> = args
        .iter()
        .filter_map(|a| a.strip_prefix("--cloud-config="))
        .collect();
    let [path] = paths[..] else {
        panic!("one --cloud-config expected: {args:?}")
    };
    let text = mounted_file(docs, path);
    serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}\n{text}"))
}

/// The value of `key` of the Secret `name`: the rendered one when the chart
/// creates it, else the operator's, from `existing`.
fn secret_value(
    docs: &[Value],
    existing: &[(&str, &str, String)],
    name: &str,
    key: &str,
) -> String {
    let rendered = docs
        .iter()
        .find(|d| kind(d) == "Secret" && d["metadata"]["name"] == name);
    if let Some(secret) = rendered {
        return secret["stringData"][key]
            .as_str()
            .unwrap_or_else(|| panic!("no {key} in the rendered Secret {name}"))
            .to_string();
    }
    existing
        .iter()
        .find(|(n, k, _)| *n == name && *k == key)
        .map(|(_, _, v)| v.clone())
        .unwrap_or_else(|| {
            panic!("the pod reads key {key} of the Secret {name}; the test gives none")
        })
}

/// The content of the file the pod sees at `path`: the key of the rendered
/// ConfigMap whose volume is mounted above it.
fn mounted_file(docs: &[Value], path: &str) -> String {
    let mounts = container(docs)["volumeMounts"].as_array().expect("mounts");
    let (mount, file) = mounts
        .iter()
        .find_map(|m| {
            let dir = m["mountPath"].as_str()?;
            Some((m, path.strip_prefix(dir)?.strip_prefix('/')?))
        })
        .unwrap_or_else(|| panic!("nothing is mounted at {path}"));
    let volume = pod_spec(docs)["volumes"]
        .as_array()
        .and_then(|v| v.iter().find(|v| v["name"] == mount["name"]))
        .unwrap_or_else(|| panic!("no volume for {mount}"));
    let Some(config_map) = volume["configMap"]["name"].as_str() else {
        panic!("{path} is not from a ConfigMap the chart renders: {volume}")
    };
    let key = volume["configMap"]["items"]
        .as_array()
        .and_then(|items| items.iter().find(|i| i["path"] == file))
        .and_then(|i| i["key"].as_str())
        .unwrap_or(file);
    docs.iter()
        .find(|d| kind(d) == "ConfigMap" && d["metadata"]["name"] == config_map)
        .and_then(|cm| cm["data"][key].as_str())
        .unwrap_or_else(|| panic!("no key {key} in a rendered ConfigMap {config_map}"))
        .to_string()
}

/// The `n`-th address of an IPv4 CIDR, as a text.
fn address_in(cidr: &Value, n: u32) -> String {
    let network: std::net::Ipv4Addr = cidr
        .as_str()
        .and_then(|c| c.split_once('/'))
        .and_then(|(ip, _)| ip.parse().ok())
        .unwrap_or_else(|| panic!("not an IPv4 CIDR: {cidr}"));
    std::net::Ipv4Addr::from(u32::from(network) + n).to_string()
}

/// Waits until `node` reads `NetworkUnavailable=False/RouteCreated`; a
/// controller that exits meanwhile fails the wait at once.
async fn wait_route_created(c: &ClusterGuard, node: &str, ctl: &mut Controller) {
    let routed = wait_until(
        ROUTED_WITHIN,
        &format!("{node} to read NetworkUnavailable=False/RouteCreated"),
        || {
            let running = ctl.is_running();
            async move {
                if !running {
                    return Some(false);
                }
                let cond = c.network_unavailable(node).await.ok()??;
                (cond.status == "False" && cond.reason.as_deref() == Some("RouteCreated"))
                    .then_some(true)
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));
    assert!(routed, "the controller exited:\n{}", ctl.log_text());
}

/// Runs the page's step-5 check against the local control plane and checks
/// that its output shows `node` with `RouteCreated`.
fn page_check_shows_route_created(page: &QuickStart, c: &ClusterGuard, node: &str) {
    let words = page.check();
    let out = run(Command::new(c.kubectl_path().expect("kubectl"))
        .args(&words[1..])
        // The local control plane instead of the operator's ~/.kube/config.
        .arg("--kubeconfig")
        .arg(c.kubeconfig_path()));
    assert!(
        out.lines()
            .any(|l| l.split_whitespace().eq([node, "RouteCreated"])),
        "{words:?} does not show {node} RouteCreated:\n{out}"
    );
}

/// Stops the controller as the kubelet stops the pod (SIGTERM), which it
/// must survive cleanly.
fn stop_as_the_kubelet(ctl: Controller) {
    let log = ctl.log_text();
    assert_eq!(ctl.stop(), Some(0), "{log}");
}

/// The page's shadow (its install, `--dry-run`): it holds its own Lease,
/// plans `node`'s route to `pod_cidr`, logs it as a dry run, and writes
/// nothing: no condition on the Node (the caller checks the cloud's table).
async fn shadow_plans_the_route_and_writes_nothing(
    c: &ClusterGuard,
    pod: &Pod<'_>,
    mut ctl: Controller,
    node: &str,
    pod_cidr: &str,
) {
    let says = format!("dry run: would create route {pod_cidr} to {node}");
    let seen = wait_until(ROUTED_WITHIN, &format!("the shadow's `{says}`"), || {
        let running = ctl.is_running();
        let log = ctl.log_text();
        let says = &says;
        async move { (!running || log.contains(says.as_str())).then_some(running) }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));
    assert!(seen, "the shadow exited:\n{}", ctl.log_text());
    assert!(
        pod.flag("--leader-elect-resource-name")
            .ends_with("-dry-run"),
        "a shadow's Lease is its own"
    );
    pod.holds_the_lease(c).await;
    assert_eq!(
        c.network_unavailable(node).await.expect("read the Node"),
        None,
        "the shadow wrote the Node's condition:\n{}",
        ctl.log_text()
    );
    stop_as_the_kubelet(ctl);
}

/// The instance metadata service's credential endpoints as EC2 serves them
/// to an instance with a profile: IMDSv2's session token (with the TTL
/// header the SDK requires, which moto's stand-in leaves out), the role's
/// name, and its temporary credentials (moto takes any). Its base URL.
async fn instance_metadata() -> String {
    use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};

    const ROLE: &str = "cloud-route-controller-nodes";
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the metadata service");
    let url = format!("http://{}", listener.local_addr().expect("its address"));
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut stream = BufReader::new(stream);
                let mut request = String::new();
                if stream.read_line(&mut request).await.is_err() {
                    return;
                }
                // The headers, up to the blank line.
                let mut line = String::new();
                while stream.read_line(&mut line).await.is_ok_and(|n| n > 2) {
                    line.clear();
                }
                let mut parts = request.split_whitespace();
                let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
                let credentials = json!({
                    "Code": "Success",
                    "Type": "AWS-HMAC",
                    "AccessKeyId": "ASIAQUICKSTARTPROFILE",
                    "SecretAccessKey": "instance-profile-secret",
                    "Token": "instance-profile-session-token",
                    "Expiration": "2099-01-01T00:00:00Z",
                    "LastUpdated": "2026-01-01T00:00:00Z",
                })
                .to_string();
                let (status, headers, body) = match (method, path) {
                    ("PUT", "/latest/api/token") => (
                        "200 OK",
                        "x-aws-ec2-metadata-token-ttl-seconds: 21600\r\n",
                        "quickstart-imds-token".to_string(),
                    ),
                    ("GET", "/latest/meta-data/iam/security-credentials/") => {
                        ("200 OK", "", ROLE.to_string())
                    }
                    ("GET", p)
                        if p == format!("/latest/meta-data/iam/security-credentials/{ROLE}") =>
                    {
                        ("200 OK", "", credentials)
                    }
                    _ => ("404 Not Found", "", String::new()),
                };
                let answer = format!(
                    "HTTP/1.1 {status}\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.get_mut().write_all(answer.as_bytes()).await;
            });
        }
    });
    url
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_aws_quick_start_with_the_instance_profile_shadows_then_routes_a_node_and_shows_route_created()
 {
    use provider_aws::testing::{REGION, client, create_network, moto_endpoint, run_instances};

    const EXAMPLE: &str = "aws-instance-profile";
    let page = QuickStart::read();
    let shadow_docs = page.render(EXAMPLE, "aws");
    let endpoint = moto_endpoint().await.expect("moto");
    let ec2 = client(&endpoint).await;
    // The example names no table: the one tagged with the page's cluster
    // name is found, as cloud-provider-aws finds it.
    let net = create_network(&ec2, "10.30.0.0/16", Some(CLUSTER_NAME))
        .await
        .expect("a VPC with a tagged route table");
    let instances = run_instances(&ec2, &net, 1).await.expect("an instance");
    let c = TestCluster::acquire()
        .await
        .expect("the local control plane");
    let dir = TempDir::new("quickstart-aws");
    // The example's region stands for yours; moto's fixtures live in this one.
    let replaced = [("region", json!(REGION))];
    // moto instead of EC2.
    let laptop = [("endpoint", json!(endpoint))];
    // No credentials in the chart: the SDK's chain asks the instance
    // metadata service, served here instead of 169.254.169.254.
    let imds = [(
        "AWS_EC2_METADATA_SERVICE_ENDPOINT",
        instance_metadata().await,
    )];
    create_aws_nodes(&c, "quickstart-aws", 7, "10.30.0", &instances).await;
    let node = "quickstart-aws-0";
    let pod_cidr = "10.244.7.0/24";

    let shadow = Pod::rendered(&shadow_docs, EXAMPLE, &[]);
    assert!(
        shadow.env.iter().all(|(k, _)| !k.starts_with("AWS_")),
        "no credentials from the chart: {:?}",
        shadow.env
    );
    let ctl = shadow.start(&c, &dir, &replaced, &laptop, &imds);
    shadow_plans_the_route_and_writes_nothing(&c, &shadow, ctl, node, pod_cidr).await;
    assert_eq!(pod_routes(&ec2, &net.route_table_id).await, Some(vec![]));

    let docs = page.render_upgrade(EXAMPLE, "aws");
    let pod = Pod::rendered(&docs, EXAMPLE, &[]);
    let mut ctl = pod.start(&c, &dir, &replaced, &laptop, &imds);
    wait_route_created(&c, node, &mut ctl).await;
    assert_eq!(
        pod_routes(&ec2, &net.route_table_id).await,
        Some(vec![(pod_cidr.to_string(), instances[0].id.clone())])
    );
    page_check_shows_route_created(&page, &c, node);
    pod.holds_the_lease(&c).await;
    stop_as_the_kubelet(ctl);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openstack_quick_start_followed_literally_shadows_then_routes_a_node_and_shows_route_created()
 {
    use provider_openstack::testing::{Admin, Keystone, neutron_server, unique_project_id};

    let page = QuickStart::read();
    let docs = page.render("openstack", "openstack");
    let neutron = neutron_server().await.expect("neutron-server");
    let admin = Admin::new(&neutron.url);
    let password = "the-password-of-the-operators-secret".to_string();
    let secret = [("openstack-routes", "password", password.clone())];
    let shadow = Pod::rendered(&docs, "openstack", &secret);
    // The Nodes' subnet is the example's node_subnets, left as it is.
    let subnet = rendered_cloud_config(&docs)["node_subnets"][0].clone();
    let router = admin
        .create_router("quickstart", subnet.as_str().expect("a subnet"))
        .await
        .expect("a router on the example's subnet");
    let keystone = Keystone::start(&neutron.url)
        .await
        .expect("the Keystone stand-in");
    // The Node's server and its port on the router's network.
    let id = unique_project_id();
    let server = format!(
        "{}-{}-{}-{}-{}",
        &id[..8],
        &id[8..12],
        &id[12..16],
        &id[16..20],
        &id[20..]
    );
    let ip = address_in(&subnet, 10);
    let port = admin
        .create_port(&router, &server, &[&ip], true, json!([]))
        .await
        .expect("the Node's port");
    let c = TestCluster::acquire()
        .await
        .expect("the local control plane");
    let dir = TempDir::new("quickstart-openstack");
    let replaced = [
        // The Keystone stand-in instead of the cloud's Keystone.
        ("auth.auth_url", json!(keystone.auth_url)),
        // The example's router id stands for yours; this one is Neutron's.
        ("router_id", json!(router.router_id)),
    ];
    // neutron-server: the stand-in's catalog has no Neutron at the
    // example's `internal` interface, a cloud's would.
    let laptop = [("endpoint", json!(neutron.url))];
    let node = "quickstart-openstack";
    let pod_cidr = "10.244.8.0/24";
    c.create_node(
        &TestNode::new(node)
            .pod_cidrs([pod_cidr])
            .internal_ip(&ip)
            .provider_id(format!("openstack:///{server}")),
    )
    .await
    .expect("create the Node");
    let ctl = shadow.start(&c, &dir, &replaced, &laptop, &[]);
    shadow_plans_the_route_and_writes_nothing(&c, &shadow, ctl, node, pod_cidr).await;
    let (routes, _) = admin.routes(&router.router_id).await.expect("the router");
    assert!(routes.is_empty(), "the shadow routed: {routes:?}");
    let shadow_sent = keystone.requests().len();

    let docs = page.render_upgrade("openstack", "openstack");
    let pod = Pod::rendered(&docs, "openstack", &secret);
    let mut ctl = pod.start(&c, &dir, &replaced, &laptop, &[]);
    wait_route_created(&c, node, &mut ctl).await;
    let (routes, _) = admin.routes(&router.router_id).await.expect("the router");
    assert_eq!(routes, [(pod_cidr.to_string(), ip.clone())]);
    assert_eq!(
        admin.pair_ips(&port).await.expect("the port"),
        [pod_cidr.to_string()],
        "the pod CIDR is an allowed address pair of the Node's port"
    );
    // The password came from the Secret, through OS_PASSWORD.
    let sent = keystone.requests();
    assert!(sent.len() > shadow_sent, "{sent:?}");
    assert_eq!(
        sent[shadow_sent]["auth"]["identity"]["password"]["user"]["password"],
        password.as_str(),
        "{sent:?}"
    );
    page_check_shows_route_created(&page, &c, node);
    pod.holds_the_lease(&c).await;
    stop_as_the_kubelet(ctl);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hcloud_quick_start_followed_literally_shadows_then_routes_a_node_and_shows_route_created()
 {
    use provider_hcloud::testing::{FakeConfig, FakeHcloud};

    const NETWORK: u64 = 4711;
    const SERVER: u64 = 1001;
    let page = QuickStart::read();
    let docs = page.render("hcloud", "hcloud");
    let fake = FakeHcloud::start(FakeConfig::default())
        .await
        .expect("the fake starts");
    fake.add_network(NETWORK, "k8s-network", "10.0.0.0/8", &["10.0.0.0/16"]);
    let ip = "10.0.0.2";
    fake.add_server(SERVER, "quickstart-hcloud", NETWORK, ip);
    // The hcloud CCM's Secret, as such a cluster has it: a token the fake
    // accepts and the network's name.
    let secret = [
        ("hcloud", "token", fake.token()),
        ("hcloud", "network", "k8s-network".to_string()),
    ];
    let shadow = Pod::rendered(&docs, "hcloud", &secret);
    let c = TestCluster::acquire()
        .await
        .expect("the local control plane");
    let dir = TempDir::new("quickstart-hcloud");
    // The fake instead of api.hetzner.cloud, in the hcloud CCM's variable
    // for it.
    let env = [("HCLOUD_ENDPOINT", fake.base_url())];
    let node = "quickstart-hcloud";
    let pod_cidr = "10.244.9.0/24";
    c.create_node(
        &TestNode::new(node)
            .pod_cidrs([pod_cidr])
            .internal_ip(ip)
            .provider_id(format!("hcloud://{SERVER}")),
    )
    .await
    .expect("create the Node");
    let ctl = shadow.start(&c, &dir, &[], &[], &env);
    shadow_plans_the_route_and_writes_nothing(&c, &shadow, ctl, node, pod_cidr).await;
    assert!(fake.routes(NETWORK).is_empty(), "the shadow routed");

    let docs = page.render_upgrade("hcloud", "hcloud");
    let pod = Pod::rendered(&docs, "hcloud", &secret);
    let mut ctl = pod.start(&c, &dir, &[], &[], &env);
    wait_route_created(&c, node, &mut ctl).await;
    assert_eq!(
        fake.routes(NETWORK),
        [(pod_cidr.to_string(), ip.to_string())]
    );
    page_check_shows_route_created(&page, &c, node);
    pod.holds_the_lease(&c).await;
    stop_as_the_kubelet(ctl);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gce_quick_start_followed_literally_shadows_then_routes_a_node_and_shows_route_created()
{
    use provider_gce::testing::{FakeConfig, FakeGce};

    const ZONE: &str = "europe-west1-b";
    let page = QuickStart::read();
    let docs = page.render("gce", "gce");
    let config = rendered_cloud_config(&docs);
    let text = |key: &str| {
        config[key]
            .as_str()
            .unwrap_or_else(|| panic!("no {key} in the example"))
            .to_string()
    };
    // The fake serves the example's project and network.
    let fake = FakeGce::start(FakeConfig {
        project: text("project"),
        ..FakeConfig::default()
    })
    .await
    .expect("the fake starts");
    fake.add_network(&text("network"), false);
    let node = "quickstart-gce";
    fake.add_instance(ZONE, node);
    let c = TestCluster::acquire()
        .await
        .expect("the local control plane");
    let dir = TempDir::new("quickstart-gce");
    // No Secret: the example's credentials are the metadata server's.
    let shadow = Pod::rendered(&docs, "gce", &[]);
    // The fake instead of compute.googleapis.com.
    let laptop = [("endpoint", json!(fake.endpoint()))];
    // The fake serves the metadata server's token here, instead of
    // metadata.google.internal.
    let env = [("GCE_METADATA_HOST", fake.metadata_host())];
    let pod_cidr = "10.244.10.0/24";
    c.create_node(
        &TestNode::new(node)
            .pod_cidrs([pod_cidr])
            .internal_ip("10.132.0.2")
            .provider_id(format!("gce://{}/{ZONE}/{node}", fake.project())),
    )
    .await
    .expect("create the Node");
    let ctl = shadow.start(&c, &dir, &[], &laptop, &env);
    shadow_plans_the_route_and_writes_nothing(&c, &shadow, ctl, node, pod_cidr).await;
    assert!(fake.routes().is_empty(), "the shadow routed");

    let docs = page.render_upgrade("gce", "gce");
    let pod = Pod::rendered(&docs, "gce", &[]);
    let mut ctl = pod.start(&c, &dir, &[], &laptop, &env);
    wait_route_created(&c, node, &mut ctl).await;
    let instance = fake.instance_url(ZONE, node);
    let routes: Vec<(String, Option<String>)> = fake
        .routes()
        .into_iter()
        .map(|r| (r.dest_range, r.next_hop_instance))
        .collect();
    assert_eq!(routes, [(pod_cidr.to_string(), Some(instance))]);
    page_check_shows_route_created(&page, &c, node);
    pod.holds_the_lease(&c).await;
    stop_as_the_kubelet(ctl);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_azure_quick_start_followed_literally_shadows_then_routes_a_node_and_shows_route_created()
 {
    use provider_azure::testing::{FakeAzure, FakeConfig};

    let page = QuickStart::read();
    let docs = page.render("azure", "azure");
    // The fake is the example's tenant, subscription, group and application.
    let example = rendered_cloud_config(&docs);
    let text = |key: &str| {
        example[key]
            .as_str()
            .unwrap_or_else(|| panic!("no {key} in the example"))
            .to_string()
    };
    let fake = FakeAzure::start(FakeConfig {
        tenant: text("tenantId"),
        subscription: text("subscriptionId"),
        resource_group: text("resourceGroup"),
        client_id: text("aadClientId"),
        ..FakeConfig::default()
    })
    .await
    .expect("the fake starts");
    let table = text("routeTableName");
    fake.add_table(&table);
    let node = "quickstart-azure";
    // A VM in the example's nodeSubnets, its NIC forwarding.
    let ip = address_in(&example["nodeSubnets"][0], 4);
    let provider_id = fake.add_vm(node, &ip);
    // The operator's Secret holds the client secret the fake accepts.
    let secret = [("azure-routes", "client-secret", fake.config().client_secret)];
    let shadow = Pod::rendered(&docs, "azure", &secret);
    let c = TestCluster::acquire()
        .await
        .expect("the local control plane");
    let dir = TempDir::new("quickstart-azure");
    let laptop = [
        // The fake instead of management.azure.com ...
        ("resourceManagerEndpoint", json!(fake.base_url())),
        // ... and instead of login.microsoftonline.com.
        ("activeDirectoryAuthorityHost", json!(fake.base_url())),
    ];
    let pod_cidr = "10.244.11.0/24";
    c.create_node(
        &TestNode::new(node)
            .pod_cidrs([pod_cidr])
            .internal_ip(&ip)
            .provider_id(provider_id),
    )
    .await
    .expect("create the Node");
    let ctl = shadow.start(&c, &dir, &[], &laptop, &[]);
    shadow_plans_the_route_and_writes_nothing(&c, &shadow, ctl, node, pod_cidr).await;
    assert!(fake.routes(&table).is_empty(), "the shadow routed");

    let docs = page.render_upgrade("azure", "azure");
    let pod = Pod::rendered(&docs, "azure", &secret);
    let mut ctl = pod.start(&c, &dir, &[], &laptop, &[]);
    wait_route_created(&c, node, &mut ctl).await;
    let routes: Vec<(String, String)> = fake
        .routes(&table)
        .into_iter()
        .map(|(_, prefix, _, hop)| (prefix, hop))
        .collect();
    assert_eq!(routes, [(pod_cidr.to_string(), ip)]);
    page_check_shows_route_created(&page, &c, node);
    pod.holds_the_lease(&c).await;
    stop_as_the_kubelet(ctl);
}
