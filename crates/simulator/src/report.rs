//! The simulation's results: the whole report and its table form.

use std::fmt::Write as _;

use serde::Serialize;

use crate::chart::group;
use crate::run::ModeReport;
use crate::scenario::{Scenario, format_duration};
use crate::timeline::{Minimum, Timeline};

/// What the scenario was, as run.
#[derive(Debug, Clone, Serialize)]
pub struct ScenarioSummary {
    /// Name.
    pub name: String,
    /// Description.
    pub description: String,
    /// Simulated time, seconds.
    pub duration_s: f64,
    /// Seed.
    pub seed: u64,
    /// Nodes at the start.
    pub initial_nodes: u32,
    /// Nodes over the whole day.
    pub nodes_total: u64,
    /// Most Nodes alive at once.
    pub peak_nodes: u32,
    /// Kubelet heartbeat period, seconds (0: none).
    pub heartbeat_period_s: f64,
    /// The resync interval drawn for `watch` and `incremental`, seconds.
    pub resync_s: f64,
    /// Minimum mutations by cause (without behind-the-back repairs).
    pub minimum: Minimum,
    /// Scale-down events that found no Node.
    pub skipped_deletes: u64,
}

impl ScenarioSummary {
    /// The summary of `scenario` as built into `timeline`.
    pub fn new(scenario: &Scenario, timeline: &Timeline) -> Self {
        Self {
            name: scenario.name.clone(),
            description: scenario.description.trim().to_string(),
            duration_s: scenario.duration.0.as_secs_f64(),
            seed: scenario.seed,
            initial_nodes: scenario.initial_nodes,
            nodes_total: timeline.nodes.len() as u64,
            peak_nodes: timeline.peak_nodes,
            heartbeat_period_s: scenario.heartbeat_period.0.as_secs_f64(),
            resync_s: timeline.resync.as_secs_f64(),
            minimum: timeline.minimum,
            skipped_deletes: timeline.skipped_deletes,
        }
    }
}

/// Everything one `simulate` run produced.
#[derive(Debug, Clone, Serialize)]
pub struct SimulationReport {
    /// The scenario.
    pub scenario: ScenarioSummary,
    /// One entry per mode, in the order asked.
    pub modes: Vec<ModeReport>,
    /// Wall-clock seconds for all modes (they run in parallel).
    pub wall_seconds: f64,
}

/// Seconds as a short human figure.
pub fn secs(s: f64) -> String {
    if s == 0.0 {
        "0".into()
    } else if s < 1.0 {
        format!("{:.0} ms", s * 1000.0)
    } else if s < 120.0 {
        format!("{s:.1} s")
    } else if s < 7200.0 {
        format!("{:.1} min", s / 60.0)
    } else {
        format!("{:.1} h", s / 3600.0)
    }
}

impl SimulationReport {
    /// The human table.
    pub fn table(&self) -> String {
        let sc = &self.scenario;
        let mut out = String::new();
        if sc.description.is_empty() {
            let _ = writeln!(out, "Scenario {}", sc.name);
        } else {
            let _ = writeln!(out, "Scenario {}: {}", sc.name, sc.description);
        }
        let _ = writeln!(
            out,
            "{} simulated, seed {}, {} nodes at start, {} over the day (peak {}), heartbeats {}, resync every {} (watch, incremental)",
            format_duration(std::time::Duration::from_secs_f64(sc.duration_s)),
            sc.seed,
            group(u64::from(sc.initial_nodes)),
            group(sc.nodes_total),
            group(u64::from(sc.peak_nodes)),
            if sc.heartbeat_period_s > 0.0 {
                format!("every {}", secs(sc.heartbeat_period_s))
            } else {
                "off".into()
            },
            secs(sc.resync_s),
        );
        let m = &sc.minimum;
        let _ = writeln!(
            out,
            "Minimum mutations: {} = initial {} + added nodes {} + removed nodes {} + address changes {} + stray routes {}, plus one repair per route removed behind the controller's back",
            group(m.total()),
            group(m.initial_creates),
            group(m.added_creates),
            group(m.removed_deletes),
            group(m.address_changes),
            group(m.stray_deletes),
        );
        out.push('\n');
        let mut rows: Vec<(String, Vec<String>)> = Vec::new();
        let mut row = |label: &str, f: &dyn Fn(&ModeReport) -> String| {
            rows.push((label.to_string(), self.modes.iter().map(f).collect()));
        };
        let calls = |m: &ModeReport, op: &str| group(m.calls.get(op).copied().unwrap_or(0));
        row("cloud calls: list", &|m| calls(m, "list"));
        row("cloud calls: create", &|m| calls(m, "create"));
        row("cloud calls: delete", &|m| calls(m, "delete"));
        if self.modes.iter().any(|m| m.calls.contains_key("batch")) {
            row("cloud calls: batch", &|m| calls(m, "batch"));
        }
        row("cloud calls: total", &|m| group(m.total_calls));
        row("calls per hour", &|m| format!("{:.1}", m.calls_per_hour));
        row("mutations done", &|m| group(m.mutations));
        row("minimum mutations", &|m| group(m.minimum_mutations));
        row("routes removed behind its back", &|m| {
            group(m.routes_removed_behind)
        });
        row("rate-limit rejections", &|m| group(m.throttled));
        row("other failed calls", &|m| {
            group(m.failed.values().sum::<u64>() - m.throttled)
        });
        row("node-to-route latency p50", &|m| secs(m.routes.p50_s));
        row("node-to-route latency p99", &|m| secs(m.routes.p99_s));
        row("node-to-route latency max", &|m| secs(m.routes.max_s));
        row("nodes routed / never routed", &|m| {
            format!(
                "{} / {}",
                group(m.routes.routed),
                group(m.routes.never_routed)
            )
        });
        row("time with routes missing", &|m| {
            format!("{} node-h", fmt_f(m.routes.missing_node_seconds / 3600.0))
        });
        row("passes (full + cached)", &|m| {
            format!(
                "{} ({} + {})",
                group(m.passes.total),
                group(m.passes.full),
                group(m.passes.cached)
            )
        });
        row("node events: heartbeats", &|m| {
            group(m.node_events.heartbeats)
        });
        row("node events: triggers", &|m| group(m.node_events.triggers));
        row("node events: absorbed", &|m| group(m.node_events.absorbed));
        row("condition patches", &|m| group(m.condition_writes));
        row("routes / nodes at end", &|m| {
            format!("{} / {}", group(m.routes_at_end), group(m.nodes_at_end))
        });
        row("wall time", &|m| format!("{:.2} s", m.wall_seconds));

        let label_w = rows.iter().map(|(l, _)| l.len()).max().unwrap_or(0);
        let col_w: Vec<usize> = self
            .modes
            .iter()
            .enumerate()
            .map(|(i, m)| {
                rows.iter()
                    .map(|(_, v)| v[i].len())
                    .chain([m.mode.len()])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let _ = write!(out, "{:label_w$}", "");
        for (m, w) in self.modes.iter().zip(&col_w) {
            let _ = write!(out, "  {:>w$}", m.mode);
        }
        out.push('\n');
        for (label, values) in &rows {
            let _ = write!(out, "{label:label_w$}");
            for (v, w) in values.iter().zip(&col_w) {
                let _ = write!(out, "  {v:>w$}");
            }
            out.push('\n');
        }
        let _ = writeln!(
            out,
            "\nSimulated in {:.2} s of wall time (modes in parallel).",
            self.wall_seconds
        );
        out
    }
}

fn fmt_f(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else if v < 0.01 {
        format!("{v:.4}")
    } else {
        format!("{v:.2}")
    }
}
