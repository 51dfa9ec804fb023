//! The fake's wire format checked by the official Azure SDK for Go: the
//! program `tools/azure-wire-check` (armnetwork v6 `RouteTablesClient` on
//! azcore's unmodified ARM pipeline) drives the fake over HTTP, so the
//! requests are the SDK's and every answer the SDK needs is decoded by the
//! SDK. The program is built by `scripts/build-gotool.sh azure-wire-check`
//! once per machine (`make test` builds it in the background).

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use provider_azure::testing::{FakeAzure, FakeConfig};

const TABLE: &str = "k8s-routes";

/// The repository root: this crate is `crates/provider-azure`.
fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Builds (once per machine) and returns the Go program, as the binary
/// crate's tests do for helm and promtool.
fn wire_check() -> PathBuf {
    let out = Command::new(repo().join("scripts/build-gotool.sh"))
        .arg("azure-wire-check")
        .output()
        .expect("run scripts/build-gotool.sh azure-wire-check");
    assert!(
        out.status.success(),
        "scripts/build-gotool.sh azure-wire-check failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .expect("the script prints the binary's path")
        .to_string();
    PathBuf::from(path)
}

/// Runs every check of `tools/azure-wire-check` against a fake started with
/// `config` (its table throttled once), asserts each passed and what the
/// fake saw, and returns the program's output.
async fn run_all_checks(config: FakeConfig) -> String {
    let tool = tokio::task::spawn_blocking(wire_check)
        .await
        .expect("the build task");
    let f = FakeAzure::start(FakeConfig {
        // Long enough that the SDK's poller sees `InProgress` at least once
        // and the back-to-back second write meets the running operation.
        operation_duration: Duration::from_millis(2000),
        operation_retry_after: Some(1),
        ..config
    })
    .await
    .expect("the fake starts");
    f.add_table(TABLE);
    let etag_before = f.etag(TABLE).expect("the table exists");
    // ARM throttles the first read once; the SDK's retry policy must wait
    // Retry-After and retry.
    f.fail_next("get_table", 1, 429, "SubscriptionRequestsThrottled");

    let c = f.config();
    let mut cmd = Command::new(&tool);
    cmd.args(["-endpoint", &f.base_url()])
        .args(["-tenant", &c.tenant])
        .args(["-client-id", &c.client_id])
        .args(["-subscription", &c.subscription])
        .args(["-resource-group", &c.resource_group])
        .args(["-table", TABLE])
        .arg("-throttled-get")
        .env("AZURE_CLIENT_SECRET", &c.client_secret);
    let out = tokio::task::spawn_blocking(move || cmd.output())
        .await
        .expect("the check task")
        .expect("run azure-wire-check");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // One line per check, shown with `--nocapture`.
    println!("{stdout}");
    assert!(
        out.status.success(),
        "azure-wire-check failed ({}):\n{stdout}\n{stderr}\nfake saw {:?}",
        out.status,
        f.answers()
    );
    for check in [
        "throttled-get-retried",
        "token",
        "get",
        "put-if-match",
        "poll-until-done",
        "get-after-put",
        "stale-etag-412",
        "missing-table-404",
        "put-during-operation-retried",
    ] {
        assert!(
            stdout
                .lines()
                .any(|l| l.starts_with(&format!("ok {check}: "))),
            "no `ok {check}` line:\n{stdout}"
        );
    }
    assert!(stdout.contains("all checks passed"), "{stdout}");

    // What the fake saw, answer by answer.
    let answers = f.answers();
    let n = |e: &str, s: u16| f.count_status(e, s);
    assert_eq!(n("token", 200), 1, "one token for the run: {answers:?}");
    assert_eq!(n("get_table", 429), 1, "the injected throttle: {answers:?}");
    // The first GET's retry, the first poller's final GET, the GET after
    // the write, and the last two pollers' final GETs.
    assert_eq!(n("get_table", 200), 5, "{answers:?}");
    assert_eq!(n("get_table", 404), 1, "the missing table: {answers:?}");
    // The If-Match write, then the back-to-back pair.
    assert_eq!(n("put_table", 200), 3, "{answers:?}");
    assert_eq!(n("put_table", 201), 0, "no table was created: {answers:?}");
    assert_eq!(n("put_table", 412), 1, "the stale ETag: {answers:?}");
    assert_eq!(
        n("put_table", 429),
        1,
        "the second write met the first's operation once: {answers:?}"
    );
    assert!(
        n("get_operation", 200) >= 3,
        "each of the three writes' operations was polled: {answers:?}"
    );
    assert_eq!(
        f.total(),
        answers
            .iter()
            .filter(|((e, s), _)| {
                matches!(
                    (e.as_str(), s),
                    ("token", 200)
                        | ("get_table", 200 | 404 | 429)
                        | ("put_table", 200 | 412 | 429)
                        | ("get_operation", 200)
                )
            })
            .map(|(_, n)| n)
            .sum::<u64>(),
        "no other request or answer (no 400, 401 or unknown endpoint): {answers:?}"
    );
    // The table is left as found, with a new ETag.
    assert!(f.routes(TABLE).is_empty(), "{:?}", f.routes(TABLE));
    assert_ne!(f.etag(TABLE).as_deref(), Some(etag_before.as_str()));
    stdout.into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_go_sdk_reads_writes_and_polls_the_fake() {
    let out = run_all_checks(FakeConfig::default()).await;
    let line = out
        .lines()
        .find(|l| l.starts_with("ok throttled-get-retried: "))
        .expect("the throttling check ran");
    assert!(line.contains("Retry-After \"1\""), "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_go_sdk_waits_out_a_retry_after_http_date() {
    let out = run_all_checks(FakeConfig {
        retry_after_as_date: true,
        ..FakeConfig::default()
    })
    .await;
    let line = out
        .lines()
        .find(|l| l.starts_with("ok throttled-get-retried: "))
        .expect("the throttling check ran");
    assert!(
        line.contains(" GMT\""),
        "Retry-After was not a date: {line}"
    );
}
