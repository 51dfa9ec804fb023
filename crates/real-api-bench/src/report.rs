//! The results as Markdown tables (for BENCHMARKS.md) and JSON (for tools).

use std::fmt::Write;

use serde::Serialize;

use crate::probe::Machine;
use crate::scenario::{RunResult, Scenario};
use crate::stats::Summary;

/// Everything one invocation measured.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub machine: Machine,
    pub versions: Versions,
    pub scenario: Scenario,
    pub cloud_latency_ms: u64,
    pub kube_api_qps: u32,
    pub kube_api_burst: u32,
    pub runs: Vec<RunResult>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Versions {
    pub kube_apiserver: String,
    pub etcd: String,
    pub upstream_bin: String,
    pub controller_bin: String,
}

fn latency(s: Option<&Summary>) -> String {
    match s {
        Some(s) => format!(
            "{} / {} / {}",
            fmt_ms(s.p50_ms),
            fmt_ms(s.p99_ms),
            fmt_ms(s.max_ms)
        ),
        None => "–".into(),
    }
}

/// Milliseconds below 10 s, seconds above: both stay readable.
fn fmt_ms(ms: f64) -> String {
    if ms < 10_000.0 {
        format!("{ms:.0} ms")
    } else {
        format!("{:.1} s", ms / 1000.0)
    }
}

fn calls(r: &RunResult, op: &str) -> String {
    match r.calls.get(op) {
        Some(c) if c.errors > 0 => format!("{} ({} failed)", c.calls, c.errors),
        Some(c) => c.calls.to_string(),
        None => "0".into(),
    }
}

impl Report {
    pub fn markdown(&self) -> String {
        let mut out = String::new();
        let s = &self.scenario;
        let _ = writeln!(
            out,
            "{} Nodes in a burst, {} more one every {:.1} s, {} deleted, {} address changes; heartbeat every {} s per Node; idle {} s, settle {} s; cloud latency {} ms; client QPS {} / burst {}.\n",
            s.nodes,
            s.trickle,
            s.trickle_interval.as_secs_f64(),
            s.scale_down,
            s.address_changes,
            s.heartbeat_period.as_secs(),
            s.idle.as_secs(),
            s.settle.as_secs(),
            self.cloud_latency_ms,
            self.kube_api_qps,
            self.kube_api_burst,
        );
        let _ = writeln!(
            out,
            "| controller | list | create | delete | cloud calls | min. mutations | routes at end / expected | peak RSS | CPU | wall |"
        );
        let _ = writeln!(out, "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|");
        for r in &self.runs {
            if let Some(e) = &r.error {
                let _ = writeln!(
                    out,
                    "| {} | failed: {} |||||||||",
                    r.label,
                    e.replace('|', "/").replace('\n', " ")
                );
                continue;
            }
            let (rss, cpu) = r.controller_process.map_or(("–".into(), "–".into()), |p| {
                (
                    format!("{:.1} MiB", p.peak_rss_kib as f64 / 1024.0),
                    format!("{:.1} s", p.cpu_seconds),
                )
            });
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} / {} | {} | {} | {:.0} s |",
                r.label,
                calls(r, "list"),
                calls(r, "create"),
                calls(r, "delete"),
                r.total_calls,
                r.min_mutations,
                r.routes_at_end.map_or("–".into(), |n| n.to_string()),
                r.routes_expected,
                rss,
                cpu,
                r.wall_seconds,
            );
        }
        let _ = writeln!(
            out,
            "\n| controller | burst: all routes after | burst latency p50 / p99 / max | trickle latency p50 / p99 / max | heartbeats/s (skipped) | heartbeat patch p99 | load avg start → end |"
        );
        let _ = writeln!(out, "|---|--:|--:|--:|--:|--:|--:|");
        for r in self.runs.iter().filter(|r| r.error.is_none()) {
            let converge = match r.converge_seconds {
                Some(c) => format!("{c:.1} s"),
                None => format!("timeout ({} unconfirmed)", r.burst_unconfirmed),
            };
            let trickle = if r.trickle_unconfirmed > 0 {
                format!(
                    "{} ({} unconfirmed)",
                    latency(r.trickle_latency.as_ref()),
                    r.trickle_unconfirmed
                )
            } else {
                latency(r.trickle_latency.as_ref())
            };
            let (hb, hb_p99) = r.heartbeats.as_ref().map_or(("–".into(), "–".into()), |h| {
                (
                    format!("{:.0} ({})", h.per_second, h.skipped),
                    h.patch_latency.map_or("–".into(), |l| fmt_ms(l.p99_ms)),
                )
            });
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {:.1} → {:.1} |",
                r.label,
                converge,
                latency(r.burst_latency.as_ref()),
                trickle,
                hb,
                hb_p99,
                r.load_average[0],
                r.load_average[1],
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_switch_units_at_ten_seconds() {
        assert_eq!(fmt_ms(12.4), "12 ms");
        assert_eq!(fmt_ms(9_999.0), "9999 ms");
        assert_eq!(fmt_ms(10_000.0), "10.0 s");
        assert_eq!(latency(None), "–");
    }
}
