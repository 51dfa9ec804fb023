//! The simulator end to end: small scenarios whose numbers can be worked out
//! by hand, scenario errors, and the chart.

use route_controller::Mode;
use simulator::{ModeReport, Scenario, SimulationReport, run_scenario};

fn run(toml: &str) -> SimulationReport {
    let s = Scenario::parse(toml, "test").expect("the test scenario parses");
    run_scenario(&s, &Mode::ALL).expect("the scenario runs")
}

fn mode(r: &SimulationReport, m: Mode) -> &ModeReport {
    r.modes
        .iter()
        .find(|x| x.mode == m.as_str())
        .expect("every requested mode was simulated")
}

fn calls(m: &ModeReport, op: &str) -> u64 {
    m.calls.get(op).copied().unwrap_or(0)
}

const IDLE: &str = r#"
name = "idle-20"
duration = "1h"
cluster_cidr = "10.244.0.0/16"
initial_nodes = 20
heartbeat_period = "10s"
"#;

#[test]
fn idle_cluster_costs_one_list_per_period_or_one_in_all() {
    let r = run(IDLE);
    assert_eq!(r.scenario.minimum.total(), 20);
    for m in &r.modes {
        assert_eq!(calls(m, "create"), 20, "{}", m.mode);
        assert_eq!(calls(m, "delete"), 0, "{}", m.mode);
        assert_eq!(m.mutations, 20, "{}", m.mode);
        assert_eq!(m.minimum_mutations, 20, "{}", m.mode);
        // Every kubelet patches 360 times an hour (first one within 10 s)...
        assert_eq!(m.node_events.heartbeats, 20 * 360, "{}", m.mode);
        // ...and none of them, nor the controller's own 20 condition patches,
        // is a trigger.
        assert_eq!(m.node_events.triggers, 0, "{}", m.mode);
        assert_eq!(m.node_events.absorbed, 20 * 360 + 20, "{}", m.mode);
        assert_eq!(m.condition_writes, 20, "{}", m.mode);
        assert_eq!(m.routes.routed, 20);
        assert_eq!(m.routes.max_s, 0.0, "a zero-latency cloud routes at once");
        assert_eq!(m.routes.missing_node_seconds, 0.0);
        assert_eq!(m.routes_at_end, 20);
        assert_eq!(m.throttled, 0);
    }
    // A pass at 0 s, 10 s, ..., 3600 s.
    let p = mode(&r, Mode::Periodic);
    assert_eq!(calls(p, "list"), 361);
    assert_eq!(p.passes.total, 361);
    // The resync is at least 12 h away: one list at start, then one per
    // drift check (every 5 minutes: 12 in the hour).
    for m in [Mode::Watch, Mode::Incremental] {
        let x = mode(&r, m);
        assert_eq!(calls(x, "list"), 13, "{m:?}");
        assert_eq!(x.passes.total, 13, "{m:?}");
        assert_eq!(x.total_calls, 33, "{m:?}");
    }
}

// Events sit 5 s past the minute so that none coincides with a periodic pass.
const CHURN: &str = r#"
name = "churn"
duration = "1h"
seed = 11
cluster_cidr = "10.244.0.0/16"
initial_nodes = 10
heartbeat_period = "10s"
controller = { retry_jitter = 0.0 }

[[scale_up]]
at = "10m5s"
count = 5

[[routes_added]]
at = "20m5s"
count = 1

[[scale_down]]
at = "30m5s"
count = 3

[[address_changes]]
at = "40m5s"
count = 1

[[address_changes]]
at = "45m5s"
count = 1

[[routes_removed]]
at = "50m5s"
count = 2
"#;

#[test]
fn churn_is_counted_against_the_minimum_in_every_mode() {
    let r = run(CHURN);
    let min = r.scenario.minimum;
    assert_eq!(min.initial_creates, 10);
    assert_eq!(min.added_creates, 5);
    assert_eq!(min.removed_deletes, 3);
    assert_eq!(min.address_changes, 4, "a delete and a create per change");
    assert_eq!(min.stray_deletes, 1);
    for m in &r.modes {
        assert_eq!(m.routes_removed_behind, 2, "{}", m.mode);
        assert_eq!(m.minimum_mutations, 25, "{}", m.mode);
        // 5 adds, 3 deletes, 2 address changes.
        assert_eq!(m.node_events.triggers, 10, "{}", m.mode);
        assert_eq!(m.nodes_at_end, 12);
    }

    // Periodic lists every 10 s and so repairs everything, 5 s after each
    // change; twice more when a hold ends (the deleted Nodes' and the
    // stray's deletion grace), without moving the period's phase.
    let p = mode(&r, Mode::Periodic);
    assert_eq!(calls(p, "list"), 363);
    assert_eq!(p.mutations, 25);
    assert_eq!(p.routes_at_end, 12);
    assert_eq!(p.routes.p50_s, 0.0);
    assert_eq!(p.routes.max_s, 5.0, "added nodes wait for the next tick");
    // 5 nodes × 5 s before their route, 2 removed routes × 5 s before repair;
    // an address change is a delete and a create in the same instant.
    assert_eq!(p.routes.missing_node_seconds, 35.0);

    // Watch: a full pass per burst of triggers (start, adds, deletes, two
    // address changes), one when the deleted Nodes' routes have waited out
    // the deletion grace, and a drift check whenever 5 minutes went by
    // without one; the drift check after the routes were removed behind the
    // controller's back repairs them. A Node added right after a drift
    // check waits out the 10 s spacing (5 s here).
    let w = mode(&r, Mode::Watch);
    assert_eq!(calls(w, "list"), 15);
    assert_eq!(w.passes.total, 15);
    assert_eq!(w.mutations, 25);
    assert_eq!(w.routes_at_end, 12);
    assert_eq!(w.routes.max_s, 5.0);
    assert_eq!(w.routes.missing_node_seconds, 25.0);

    // Incremental: every trigger planned against the cached table; a list
    // at start and at each of the 12 drift checks, which find the stray and
    // the removed routes (within 5 minutes, where the resync took 12–24 h).
    let i = mode(&r, Mode::Incremental);
    assert_eq!(calls(i, "list"), 13);
    assert_eq!(i.passes.full, 13);
    // One cached pass per burst, and one when the deletion grace ends.
    assert_eq!(i.passes.cached, 6);
    assert_eq!(i.mutations, 25);
    assert_eq!(i.routes_at_end, 12);
    assert_eq!(i.routes.missing_node_seconds, 2.0 * 295.0);
}

#[test]
fn the_same_seed_gives_the_same_day() {
    let a = run(CHURN);
    let b = run(CHURN);
    for (x, y) in a.modes.iter().zip(&b.modes) {
        assert_eq!(x.calls, y.calls);
        assert_eq!(x.cumulative_calls, y.cumulative_calls);
        assert_eq!(x.routes, y.routes);
    }
}

#[test]
fn latency_and_throttling_follow_the_cloud() {
    // One action at a time, 1 s each, 30 nodes at once: the last route comes
    // 30 s after the first call, in every mode.
    let r = run(r#"
name = "slow"
duration = "10m"
cluster_cidr = "10.244.0.0/16"
initial_nodes = 30
heartbeat_period = "0s"
[cloud]
latency = { create = "1s" }
max_concurrent_operations = 1
enforce_max_concurrency = true
"#);
    for m in &r.modes {
        assert_eq!(m.routes.max_s, 30.0, "{}", m.mode);
        assert_eq!(m.routes.p50_s, 15.0, "{}", m.mode);
        // 1 + 2 + ... + 30 seconds of waiting.
        assert_eq!(m.routes.missing_node_seconds, 465.0, "{}", m.mode);
        assert!(!m.failed.contains_key("conflict"), "{}", m.mode);
    }

    // A budget of 60 calls an hour with a bucket of 5: periodic mode's list
    // every 10 s runs into it, and the controller then paces itself to the
    // budget instead of listing 361 times; incremental's one list is never
    // throttled.
    let r = run(r#"
name = "budget"
duration = "1h"
cluster_cidr = "10.244.0.0/16"
initial_nodes = 2
heartbeat_period = "0s"
[cloud]
rate_limit = { requests = 60, per = "1h", burst = 5 }
"#);
    let p = mode(&r, Mode::Periodic);
    assert!(p.throttled >= 1, "{}", p.throttled);
    assert_eq!(p.failed.get("throttled").copied(), Some(p.throttled));
    let accepted = p.total_calls - p.throttled;
    assert!(accepted <= 5 + 60 + 1, "{accepted} accepted calls");
    assert!(calls(p, "list") < 100, "{} lists", calls(p, "list"));
    assert_eq!(calls(p, "create"), 2);
    assert_eq!(mode(&r, Mode::Incremental).throttled, 0);
}

#[test]
fn scenario_errors_name_the_problem() {
    let err = |toml: &str| Scenario::parse(toml, "bad.toml").unwrap_err().to_string();
    let base =
        "name = \"x\"\nduration = \"1h\"\ncluster_cidr = \"10.0.0.0/16\"\ninitial_nodes = 1\n";

    let e = err(&format!("{base}nodes = 5\n"));
    assert!(
        e.contains("bad.toml") && e.contains("unknown field `nodes`"),
        "{e}"
    );
    let e = err(&format!("{base}[cloud]\nlatncy = {{}}\n"));
    assert!(e.contains("unknown field `latncy`"), "{e}");
    let e = err(&format!("{base}heartbeat_period = \"10\"\n"));
    assert!(e.contains("missing unit"), "{e}");
    let e = err(&format!("{base}heartbeat_period = \"10 parsecs\"\n"));
    assert!(e.contains("unknown unit"), "{e}");
    let e = err("name = \"x\"\nduration = \"1h\"\ncluster_cidr = \"10.0.0.0/16\"\n");
    assert!(e.contains("missing field `initial_nodes`"), "{e}");
    let e = err(&base.replace("10.0.0.0/16", "10.0.0.0"));
    assert!(e.contains("cluster_cidr"), "{e}");
    let e = err(&base.replace("10.0.0.0/16", "fd00::/48"));
    assert!(e.contains("IPv4"), "{e}");
    let e = err(&format!("{base}[cloud]\nerror_rate = 1.5\n"));
    assert!(e.contains("cloud.error_rate") && e.contains("1.5"), "{e}");
    let e = err(&format!("{base}[cloud]\nerror_kind = \"gremlins\"\n"));
    assert!(e.contains("gremlins"), "{e}");
    let e = err(&format!(
        "{base}[[scale_up]]\nat = \"50m\"\ncount = 3\nover = \"20m\"\n"
    ));
    assert!(e.contains("scale_up[0]") && e.contains("ends after"), "{e}");
    let e = err(&format!("{base}node_cidr_mask = 8\n"));
    assert!(e.contains("node_cidr_mask"), "{e}");
    let e = err(&format!("{base}[cloud]\nrate_limit = {{ requests = 0 }}\n"));
    assert!(e.contains("rate_limit"), "{e}");
    let e = err("this is not toml");
    assert!(e.contains("bad.toml"), "{e}");

    let e = Scenario::load(std::path::Path::new("no-such-scenario"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("idle-1000") && e.contains("flaky-hetzner"),
        "{e}"
    );
    // Shipped scenarios load by name, with or without the extension.
    assert_eq!(
        Scenario::load(std::path::Path::new("idle-1000.toml"))
            .unwrap()
            .initial_nodes,
        1000
    );
}

#[test]
fn too_many_nodes_for_the_cluster_cidr_is_an_error() {
    let s = Scenario::parse(
        "name = \"x\"\nduration = \"1h\"\ncluster_cidr = \"10.0.0.0/22\"\ninitial_nodes = 3\n[[scale_up]]\nat = \"1m\"\ncount = 2\n",
        "t",
    )
    .unwrap();
    let e = run_scenario(&s, &[Mode::Incremental])
        .unwrap_err()
        .to_string();
    assert!(e.contains("room for 4 /24"), "{e}");
}

#[test]
fn the_chart_is_well_formed_svg_with_one_line_per_mode() {
    let r = run(CHURN);
    let svg = simulator::chart::svg("churn <&> test", 3600.0, &r.modes);
    let mut stack: Vec<String> = Vec::new();
    let mut root = None;
    let mut polylines = 0;
    let mut texts = Vec::new();
    let mut in_text = false;
    for token in xmlparser::Tokenizer::from(svg.as_str()) {
        match token.unwrap_or_else(|e| panic!("not well-formed: {e}")) {
            xmlparser::Token::ElementStart { local, .. } => {
                root.get_or_insert_with(|| local.to_string());
                if local.as_str() == "polyline" {
                    polylines += 1;
                }
                in_text = local.as_str() == "text";
                stack.push(local.to_string());
            }
            xmlparser::Token::ElementEnd { end, .. } => match end {
                xmlparser::ElementEnd::Open => {}
                xmlparser::ElementEnd::Close(_, local) => {
                    assert_eq!(stack.pop().as_deref(), Some(local.as_str()));
                }
                xmlparser::ElementEnd::Empty => {
                    stack.pop();
                }
            },
            xmlparser::Token::Text { text } if in_text => texts.push(text.to_string()),
            _ => {}
        }
    }
    assert!(stack.is_empty(), "unclosed: {stack:?}");
    assert_eq!(root.as_deref(), Some("svg"));
    assert_eq!(polylines, 3);
    assert!(texts.iter().any(|t| t.contains("churn &lt;&amp;&gt; test")));
    for m in ["periodic", "watch", "incremental"] {
        assert!(texts.iter().any(|t| t == m), "legend for {m}");
    }
}

#[test]
fn simulate_writes_the_chart_and_accepts_a_seed_override() {
    let dir = std::env::temp_dir().join(format!("simulator-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let scenario = dir.join("idle.toml");
    std::fs::write(&scenario, IDLE).unwrap();
    let chart = dir.join("out.svg");
    simulator::simulate(simulator::SimulateArgs {
        scenario: scenario.clone(),
        modes: vec![Mode::Incremental, Mode::Incremental],
        output: simulator::Output::Json,
        chart: Some(chart.clone()),
        seed: Some(5),
    })
    .unwrap();
    let svg = std::fs::read_to_string(&chart).unwrap();
    assert!(svg.starts_with("<?xml") && svg.trim_end().ends_with("</svg>"));
    assert_eq!(
        svg.matches("<polyline").count(),
        1,
        "duplicate modes run once"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

const THREE_TABLES: &str = r#"
name = "three-tables-20"
duration = "1h"
cluster_cidr = "10.244.0.0/16"
initial_nodes = 20
heartbeat_period = "10s"

[cloud]
latency = { list = "100ms", create = "100ms", delete = "100ms" }
max_routes = 30
tables = 3

[[scale_up]]
at = "10m"
count = 10

[[scale_down]]
at = "30m"
count = 5
"#;

#[test]
fn every_node_is_routed_in_each_of_three_tables_up_to_each_tables_quota() {
    let r = run(THREE_TABLES);
    assert_eq!(r.scenario.minimum.total(), (20 + 10 + 5) * 3);
    for m in &r.modes {
        // 30 Nodes at the peak fill each table's quota exactly; at the end
        // 25 Nodes, each in all three tables.
        assert_eq!(m.nodes_at_end, 25, "{}", m.mode);
        assert_eq!(m.routes_at_end, 75, "{}", m.mode);
        assert_eq!(m.routes.never_routed, 0, "{}", m.mode);
        assert_eq!(m.routes.unrouted_at_end, 0, "{}", m.mode);
    }
}
