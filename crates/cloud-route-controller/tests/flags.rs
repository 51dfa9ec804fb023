//! The binary's command line as an operator meets it: every unusable flag
//! value stops the process before it touches a cluster or a cloud, with one
//! clear line on stderr and no panic; `--help` documents every flag.
//!
//! No cluster is needed: each case runs with an empty HOME and no kubeconfig,
//! so a check that wrongly ran only after connecting would show up as a
//! kubeconfig error instead of the expected message.

mod common;

use std::process::{Command, Output, Stdio};

use common::{TempDir, binary};

const GATE: &str = "CloudControllerManagerWatchBasedRoutesReconciliation";

/// Runs the binary with `args` in an environment without any cluster.
fn command(home: &TempDir, args: &[&str]) -> Command {
    let mut cmd = Command::new(binary());
    cmd.args(args)
        .env_clear()
        .env("HOME", home.path())
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        // A panic would print its backtrace: the tests below look for it.
        .env("RUST_BACKTRACE", "1")
        .env("RUST_LOG", "info")
        .stdin(Stdio::null());
    cmd
}

fn run(home: &TempDir, args: &[&str]) -> Output {
    command(home, args)
        .output()
        .expect("run cloud-route-controller")
}

/// Runs with `--configure-cloud-routes=false` among `args`: until the
/// process is idle, then SIGTERM.
fn run_idle(home: &TempDir, args: &[&str]) -> Output {
    common::run_until_idle(&mut command(home, args))
}

/// The lines of stderr that say something, minus clap's standard decoration
/// around its one-line message (possible values, usage, pointer to `--help`).
fn message_lines(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .filter(|l| {
            ![
                "For more information, try",
                "[possible values:",
                "tip:",
                "Usage:",
                "cloud-route-controller ",
            ]
            .iter()
            .any(|p| l.starts_with(p))
        })
        .collect()
}

/// Asserts a refusal: non-zero exit, exactly one message line that starts
/// with `error:` and contains every one of `needles`, nothing on stdout, no
/// panic or backtrace.
fn assert_refused(home: &TempDir, args: &[&str], needles: &[&str]) {
    let out = run(home, args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let ctx = format!("args {args:?}\nexit {:?}\nstderr:\n{stderr}", out.status);
    assert!(!out.status.success(), "accepted: {ctx}");
    assert_eq!(
        out.status.code(),
        Some(2),
        "a bad flag is a usage error (exit 2): {ctx}"
    );
    for bad in ["panicked", "backtrace", "RUST_BACKTRACE", "thread 'main'"] {
        assert!(!stderr.contains(bad), "{bad:?} on stderr: {ctx}");
    }
    let lines = message_lines(&stderr);
    assert_eq!(lines.len(), 1, "want one message line: {ctx}");
    assert!(lines[0].starts_with("error:"), "{ctx}");
    for n in needles {
        assert!(lines[0].contains(n), "message lacks {n:?}: {ctx}");
    }
    assert!(stdout.trim().is_empty(), "stdout: {stdout}\n{ctx}");
}

const CIDR: &[&str] = &["--cluster-cidr", "10.244.0.0/16"];

/// `--cluster-cidr` and, unless `extra` names one, `--cloud-provider memory`
/// (required) before `extra`, so each case is refused for its own flag.
fn with_cidr<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = CIDR.to_vec();
    if !extra.iter().any(|a| a.starts_with("--cloud-provider")) {
        v.extend_from_slice(&["--cloud-provider", "memory"]);
    }
    v.extend_from_slice(extra);
    v
}

#[test]
fn a_start_without_cloud_provider_is_refused_naming_the_choices() {
    let home = TempDir::new("flags-no-provider");
    for args in [CIDR, &["plan", "--cluster-cidr", "10.244.0.0/16"][..]] {
        assert_refused(
            &home,
            args,
            &[
                "--cloud-provider is required",
                "aws",
                "openstack",
                "hcloud",
                "azure",
                "gce",
                "memory (a simulated cloud)",
            ],
        );
    }
}

#[test]
fn bad_cluster_cidrs_are_refused_with_the_reason() {
    let home = TempDir::new("flags-cidr");
    assert_refused(&home, &[], &["--cluster-cidr is required"]);
    assert_refused(&home, &["--cluster-cidr", ""], &["--cluster-cidr"]);
    assert_refused(
        &home,
        &["--cluster-cidr", "nope"],
        &["--cluster-cidr", "nope"],
    );
    assert_refused(
        &home,
        &["--cluster-cidr", "10.244.0.0/33"],
        &["--cluster-cidr", "10.244.0.0/33"],
    );
    assert_refused(
        &home,
        &["--cluster-cidr", "10.244.0.0/16,10.245.0.0/16"],
        &["--cluster-cidr", "dual-stack"],
    );
    assert_refused(
        &home,
        &["--cluster-cidr", "fd00::/48,fd01::/48"],
        &["--cluster-cidr", "dual-stack"],
    );
    assert_refused(
        &home,
        &["--cluster-cidr", "10.0.0.0/8,fd00::/48,fd01::/48"],
        &["--cluster-cidr", "at most two"],
    );
    // `plan` checks the same flag the same way.
    assert_refused(
        &home,
        &["plan", "--cluster-cidr", "10.0.0.0/8,10.1.0.0/16"],
        &["dual-stack"],
    );
}

#[test]
fn bad_durations_are_refused() {
    let home = TempDir::new("flags-dur");
    for (flag, value) in [
        ("--route-reconciliation-period", "ten"),
        ("--route-reconciliation-period", "10"),
        ("--min-resync-period", "-1s"),
        ("--min-resync-period", "1d"),
        ("--leader-elect-lease-duration", "15 s"),
        ("--leader-elect-renew-deadline", "s"),
        ("--leader-elect-retry-period", "2x"),
        ("--shutdown-grace-period", "1e3s"),
    ] {
        // `=` as the CCM's Go flags take it (and so `-1s` is not read as a flag).
        let arg = format!("{flag}={value}");
        assert_refused(&home, &with_cidr(&[&arg]), &[flag, value]);
    }
    // Parsed, but unusable.
    assert_refused(
        &home,
        &with_cidr(&["--route-reconciliation-period", "0"]),
        &["--route-reconciliation-period"],
    );
    assert_refused(
        &home,
        &with_cidr(&["--min-resync-period", "0s"]),
        &["--min-resync-period"],
    );
}

#[test]
fn reconcile_mode_and_feature_gates_must_agree() {
    let home = TempDir::new("flags-mode");
    let on = format!("--feature-gates={GATE}=true");
    let off = format!("--feature-gates={GATE}=false");
    assert_refused(
        &home,
        &with_cidr(&["--reconcile-mode", "incremental", &on]),
        &["contradicts", "incremental", "watch"],
    );
    assert_refused(
        &home,
        &with_cidr(&["--reconcile-mode", "watch", &off]),
        &["contradicts", "periodic"],
    );
    assert_refused(
        &home,
        &with_cidr(&["--feature-gates=SomethingElse=true"]),
        &["--feature-gates", "SomethingElse"],
    );
    assert_refused(
        &home,
        &with_cidr(&[&format!("--feature-gates={GATE}=maybe")]),
        &["--feature-gates", "true or false"],
    );
    assert_refused(
        &home,
        &with_cidr(&[&format!("--feature-gates={GATE}")]),
        &["--feature-gates", "key=value"],
    );
    assert_refused(
        &home,
        &with_cidr(&["--reconcile-mode", "sometimes"]),
        &["--reconcile-mode", "sometimes"],
    );
}

#[test]
fn unknown_provider_and_missing_config_are_refused_before_connecting() {
    let home = TempDir::new("flags-provider");
    assert_refused(
        &home,
        &with_cidr(&["--cloud-provider", "nimbus"]),
        &["--cloud-provider", "nimbus", "memory"],
    );
    assert_refused(
        &home,
        &[
            "plan",
            "--cluster-cidr",
            "10.0.0.0/8",
            "--cloud-provider",
            "nimbus",
        ],
        &["--cloud-provider", "nimbus"],
    );
    let missing = home.path().join("no-such-cloud.yaml");
    let missing = missing.to_str().unwrap();
    assert_refused(
        &home,
        &with_cidr(&["--cloud-config", missing]),
        &["--cloud-config", missing],
    );
    assert_refused(
        &home,
        &[
            "plan",
            "--cluster-cidr",
            "10.0.0.0/8",
            "--cloud-provider",
            "memory",
            "--cloud-config",
            missing,
        ],
        &["--cloud-config", missing],
    );
}

#[test]
fn leader_election_timings_must_be_ordered() {
    let home = TempDir::new("flags-leader");
    // renew deadline beyond the lease duration (default 15s)
    assert_refused(
        &home,
        &with_cidr(&["--leader-elect-renew-deadline", "20s"]),
        &[
            "--leader-elect-lease-duration",
            "--leader-elect-renew-deadline",
        ],
    );
    // retry period not below the renew deadline (default 10s)
    assert_refused(
        &home,
        &with_cidr(&["--leader-elect-retry-period", "10s"]),
        &[
            "--leader-elect-renew-deadline",
            "--leader-elect-retry-period",
        ],
    );
    assert_refused(
        &home,
        &with_cidr(&["--leader-elect-retry-period", "0"]),
        &["--leader-elect-retry-period"],
    );
    assert_refused(
        &home,
        &with_cidr(&["--leader-elect-resource-name", " "]),
        &["--leader-elect-resource-name"],
    );
    // Without leader election the timings do not matter.
    let out = run_idle(
        &home,
        &with_cidr(&[
            "--leader-elect=false",
            "--leader-elect-renew-deadline",
            "20s",
            "--configure-cloud-routes=false",
        ]),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn other_unusable_values_are_refused() {
    let home = TempDir::new("flags-other");
    for (args, needles) in [
        (
            vec!["--metrics-bind-address", "localhost"],
            vec!["--metrics-bind-address"],
        ),
        (vec!["--kube-api-qps", "0"], vec!["--kube-api-qps"]),
        (vec!["--kube-api-qps", "NaN"], vec!["--kube-api-qps"]),
        (vec!["--kube-api-burst", "0"], vec!["--kube-api-burst"]),
        (
            vec!["--concurrent-status-updates", "0"],
            vec!["--concurrent-status-updates"],
        ),
        (vec!["--cluster-name", ""], vec!["--cluster-name"]),
        (vec!["--log-format", "xml"], vec!["--logging-format", "xml"]),
        (
            vec!["--logging-format", "xml"],
            vec!["--logging-format", "xml"],
        ),
        (vec!["--v=11"], vec!["--v", "11"]),
        (vec!["--v=two"], vec!["--v", "two"]),
        (
            vec!["--leader-elect=perhaps"],
            vec!["--leader-elect", "perhaps"],
        ),
        (vec!["--no-such-flag"], vec!["--no-such-flag"]),
    ] {
        assert_refused(&home, &with_cidr(&args), &needles);
    }
}

/// A manifest written for the cloud-controller-manager passes `--v=2` and
/// `--logging-format=json`: both are taken, and the line says why nothing
/// runs in component-base's JSON shape.
#[test]
fn ccm_verbosity_and_json_logging_format_are_accepted_and_logged_in_component_base_shape() {
    let home = TempDir::new("flags-klog");
    for format in [&["--logging-format=json"][..], &["--log-format", "json"]] {
        let mut args = with_cidr(&["--configure-cloud-routes=false", "--v=2"]);
        args.extend_from_slice(format);
        let out = run_idle(&home, &args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {stderr}");
        let line = stderr
            .lines()
            .find(|l| l.contains("configure-cloud-routes"))
            .unwrap_or_else(|| panic!("no line says why: {stderr}"));
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert!(
            v["ts"].as_f64().is_some_and(|t| t > 1.7e9),
            "ts in seconds: {line}"
        );
        assert!(
            v["caller"].as_str().is_some_and(|c| c.contains(".rs:")),
            "{line}"
        );
        assert!(
            v["msg"]
                .as_str()
                .is_some_and(|m| m.contains("--configure-cloud-routes=false")),
            "{line}"
        );
        assert_eq!(v["v"], 0, "{line}");
        for tracing_key in ["timestamp", "level", "fields", "target"] {
            assert!(v.get(tracing_key).is_none(), "{tracing_key}: {line}");
        }
    }
}

/// As a cloud-controller-manager with its route controller off: the process
/// says so once and stays up, ready, until SIGTERM (an exit would restart it
/// forever under a Deployment).
#[test]
fn configure_cloud_routes_false_says_so_and_stays_up_ready_until_sigterm() {
    let home = TempDir::new("flags-off");
    let port = common::free_port();
    let addr = format!("127.0.0.1:{port}");
    // No cluster is reachable (none configured): the process must not need one.
    let mut cmd = command(
        &home,
        &with_cidr(&[
            "--configure-cloud-routes=false",
            "--metrics-bind-address",
            &addr,
        ]),
    );
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start");
    let base = format!("http://{addr}");
    let mut ready = None;
    for _ in 0..100 {
        ready = common::http_get(&base, "/readyz");
        if ready.is_some() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let healthz = common::http_get(&base, "/healthz");
    let still_up = child.try_wait().expect("try_wait").is_none();
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(ready.map(|r| r.0), Some(200), "/readyz");
    assert_eq!(healthz.map(|r| r.0), Some(200), "/healthz");
    assert!(still_up);

    let out = run_idle(&home, &with_cidr(&["--configure-cloud-routes=false"]));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("--configure-cloud-routes=false"),
        "the log says why nothing runs: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// Every flag of `run`, as the CCM spells them.
const RUN_FLAGS: &[&str] = &[
    "--kubeconfig",
    "--cluster-name",
    "--cluster-cidr",
    "--cloud-provider",
    "--cloud-config",
    "--kube-api-qps",
    "--kube-api-burst",
    "-v",
    "--v",
    "--logging-format",
    "--reconcile-mode",
    "--feature-gates",
    "--configure-cloud-routes",
    "--route-reconciliation-period",
    "--min-resync-period",
    "--concurrent-status-updates",
    "--unsafe-memory-provider-on-cloud-nodes",
    "--shutdown-grace-period",
    "--leader-elect",
    "--leader-elect-lease-duration",
    "--leader-elect-renew-deadline",
    "--leader-elect-retry-period",
    "--leader-elect-resource-namespace",
    "--leader-elect-resource-name",
    "--leader-elect-identity",
    "--metrics-bind-address",
    "--secure-port",
    "--bind-address",
    "--tls-cert-file",
    "--tls-private-key-file",
    "--authorization-always-allow-paths",
    "--help",
    "--version",
];

fn help_of(home: &TempDir, args: &[&str]) -> String {
    let out = run(home, args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn lists_flag(help: &str, flag: &str) -> bool {
    // A flag is listed when it starts an option entry (after `-x, ` or spaces).
    help.lines().any(|l| {
        let l = l.trim_start();
        let l = l
            .strip_prefix("-v, ")
            .or_else(|| l.strip_prefix("-o, "))
            .or_else(|| l.strip_prefix("-h, "))
            .or_else(|| l.strip_prefix("-V, "))
            .unwrap_or(l);
        l.starts_with(flag)
            && l[flag.len()..]
                .chars()
                .next()
                .is_none_or(|c| matches!(c, ' ' | '=' | '<' | '[' | ',' | '.'))
    })
}

#[test]
fn help_lists_every_flag() {
    let home = TempDir::new("flags-help");
    let top = help_of(&home, &["--help"]);
    let run_help = help_of(&home, &["run", "--help"]);
    for flag in RUN_FLAGS {
        assert!(lists_flag(&top, flag), "--help lacks {flag}:\n{top}");
        if *flag != "--version" {
            assert!(
                lists_flag(&run_help, flag),
                "run --help lacks {flag}:\n{run_help}"
            );
        }
    }
    for sub in ["run", "plan"] {
        assert!(
            top.contains(sub),
            "--help lacks the {sub} subcommand:\n{top}"
        );
    }
    let plan = help_of(&home, &["plan", "--help"]);
    for flag in [
        "--kubeconfig",
        "--cluster-name",
        "--cluster-cidr",
        "--cloud-provider",
        "--cloud-config",
        "--output",
        "--logging-format",
        "--v",
    ] {
        assert!(lists_flag(&plan, flag), "plan --help lacks {flag}:\n{plan}");
    }
    // Defaults an operator needs are printed.
    for default in [
        "15s",
        "10s",
        "2s",
        "12h",
        "cloud-route-controller",
        "10288",
        "/healthz,/readyz,/livez",
    ] {
        assert!(
            top.contains(default),
            "--help lacks the default {default}:\n{top}"
        );
    }
    let version = run(&home, &["--version"]);
    assert!(version.status.success());
    let version = String::from_utf8_lossy(&version.stdout);
    assert!(
        version.contains(env!("CARGO_PKG_VERSION")),
        "--version prints the version: {version}"
    );
    // Built from this checkout: the commit git names.
    let head = Command::new("git")
        .args(["rev-parse", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    if let Some(head) = head.filter(|_| std::env::var_os("CRC_GIT_COMMIT").is_none()) {
        assert!(
            version.contains(&format!("(commit {head})")),
            "--version names the commit {head}: {version}"
        );
    }
}

/// The flags docs/flags.md's flag table names: every backticked `--flag` in the
/// first column of its rows.
fn readme_flags() -> std::collections::BTreeSet<String> {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/flags.md"))
            .expect("read docs/flags.md");
    let table = readme
        .split("| flag | default | |")
        .nth(1)
        .expect("docs/flags.md's flag table");
    let mut flags = std::collections::BTreeSet::new();
    for row in table.lines().skip(1).take_while(|l| l.starts_with('|')) {
        let first = row.split('|').nth(1).unwrap_or("");
        for token in first.split('`').skip(1).step_by(2) {
            if token.starts_with("--") {
                flags.insert(token.to_string());
            }
        }
    }
    flags
}

/// docs/flags.md's flag table and `run --help` name the same flags: none missing
/// from the table, none in it that the binary does not take.
#[test]
fn the_readme_flag_table_names_every_flag_of_run_and_no_other() {
    let home = TempDir::new("flags-readme");
    let help = help_of(&home, &["run", "--help"]);
    let mut helped = std::collections::BTreeSet::new();
    for line in help.lines() {
        let l = line.trim_start();
        let l = l.strip_prefix("-v, ").unwrap_or(l);
        let l = l.strip_prefix("-h, ").unwrap_or(l);
        if let Some(rest) = l.strip_prefix("--") {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect();
            if name != "help" {
                helped.insert(format!("--{name}"));
            }
        }
    }
    let documented = readme_flags();
    let missing: Vec<&String> = helped.difference(&documented).collect();
    assert!(
        missing.is_empty(),
        "docs/flags.md's flag table lacks {missing:?}"
    );
    // Aliases (--log-format) and --version are in the top-level help.
    let top = help_of(&home, &["--help"]);
    let unknown: Vec<&String> = documented
        .difference(&helped)
        .filter(|f| !top.contains(f.as_str()))
        .collect();
    assert!(
        unknown.is_empty(),
        "docs/flags.md's flag table names flags the binary lacks: {unknown:?}"
    );
}

/// A kubeconfig naming an API server on a loopback port nobody listens on:
/// the controller starts (a client is built without asking the server),
/// binds its secure port and waits for the Node cache, which never syncs.
fn unreachable_kubeconfig(dir: &TempDir) -> std::path::PathBuf {
    let path = dir.path().join("kubeconfig");
    let server = format!("https://127.0.0.1:{}", common::free_port());
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {server}\n    insecure-skip-tls-verify: true\nusers:\n- name: u\n  user:\n    token: none\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\n"
        ),
    )
    .expect("write the kubeconfig");
    path
}

/// The flags every start below shares: a simulated cloud, no election, an
/// API server that never answers.
fn start_args(kubeconfig: &std::path::Path) -> Vec<String> {
    [
        "--kubeconfig",
        kubeconfig.to_str().expect("temporary paths are UTF-8"),
        "--cluster-cidr",
        "10.244.0.0/16",
        "--cloud-provider",
        "memory",
        "--leader-elect=false",
    ]
    .map(String::from)
    .to_vec()
}

/// The default ports of what the survey found binding on control-plane hosts
/// (see `--secure-port`'s help): kubelet, kube-proxy, kube-controller-manager,
/// the cloud-controller-manager and its webhook, kube-scheduler, etcd, Azure's
/// CCM chart, the hcloud CCM's metrics, Cilium, Calico, ingress-nginx,
/// OpenYurt, Antrea.
const SURVEYED_PORTS: &[u16] = &[
    10250, 10248, 10249, 10256, 10257, 10258, 10260, 10259, 2379, 2380, 2381, 10267, 10268, 8233,
    4240, 4244, 9962, 9963, 9964, 9965, 9091, 9099, 10254, 10261, 10262, 10263, 10264, 10265,
    10266, 10269, 10270, 10271, 10272, 10273, 10350,
];

/// The secure port's default.
const DEFAULT_SECURE_PORT: u16 = 10288;

/// The only test of this binary that binds fixed ports (the survey's and the
/// default): the others start nothing that listens, or listen on a port of
/// their own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_listeners_on_every_default_port_of_the_survey_the_controller_starts_on_its_own_default_port()
 {
    let dir = TempDir::new("flags-survey");
    let mut held = Vec::new();
    let mut taken = Vec::new();
    for &port in SURVEYED_PORTS {
        match std::net::TcpListener::bind(("0.0.0.0", port)) {
            Ok(l) => held.push(l),
            // Already bound on this machine: held by someone else, which
            // is just as good for this test.
            Err(e) => taken.push(format!("{port} ({e})")),
        }
    }
    if !taken.is_empty() {
        eprintln!(
            "already taken on this machine, so not bound by the test: {}",
            taken.join(", ")
        );
    }
    assert!(
        std::net::TcpListener::bind(("0.0.0.0", DEFAULT_SECURE_PORT)).is_ok(),
        "{DEFAULT_SECURE_PORT} is taken on this machine: the test cannot run"
    );
    let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    let made =
        rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).expect("a certificate");
    std::fs::write(&key, made.signing_key.serialize_pem()).expect("write the key");
    std::fs::write(&cert, made.cert.pem()).expect("write the certificate");
    let ca = made.cert.der().clone();

    let kubeconfig = unreachable_kubeconfig(&dir);
    let log = dir.path().join("controller.log");
    let mut args = start_args(&kubeconfig);
    args.extend(
        [
            "--tls-cert-file",
            cert.to_str().expect("UTF-8"),
            "--tls-private-key-file",
            key.to_str().expect("UTF-8"),
        ]
        .map(String::from),
    );
    let mut child = Command::new(binary())
        .args(&args)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log file"))
        .spawn()
        .expect("start cloud-route-controller");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let answered = loop {
        let got = common::https_get(DEFAULT_SECURE_PORT, &ca, "/healthz", None).await;
        if matches!(got, Ok((200, _))) {
            break Ok(());
        }
        if let Ok(Some(status)) = child.try_wait() {
            break Err(format!("the controller exited: {status}"));
        }
        if std::time::Instant::now() >= deadline {
            break Err(format!("no 200 on /healthz within 60 s: {got:?}"));
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    let _ = child.kill();
    let _ = child.wait();
    drop(held);
    if let Err(e) = answered {
        panic!("{e}\n{}", std::fs::read_to_string(&log).unwrap_or_default());
    }
}

/// A secure port held by another process: exit 1 without a panic, and
/// stderr names the address, the port and the flag. The port is one this
/// test holds, not the default, so nothing else running can take it.
#[test]
fn with_its_default_port_taken_the_controller_exits_non_zero_naming_the_port_and_the_flag() {
    let home = TempDir::new("flags-taken");
    let holder = std::net::TcpListener::bind("0.0.0.0:0").expect("bind a free port");
    let port = holder.local_addr().expect("its address").port();
    let kubeconfig = unreachable_kubeconfig(&home);
    let mut args = start_args(&kubeconfig);
    args.push(format!("--secure-port={port}"));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = run(&home, &args);
    drop(holder);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let ctx = format!("exit {:?}\nstderr:\n{stderr}", out.status);
    assert_eq!(out.status.code(), Some(1), "{ctx}");
    assert!(
        stderr.contains(&format!(
            "cannot listen on 0.0.0.0:{port} for --secure-port: address already in use"
        )),
        "{ctx}"
    );
    assert!(
        stderr.contains("pick a free port with --secure-port"),
        "{ctx}"
    );
    assert!(!stderr.contains("panicked"), "{ctx}");
}
