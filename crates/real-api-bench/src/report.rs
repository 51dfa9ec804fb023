//! The results as Markdown tables (for BENCHMARKS.md) and JSON (for tools).

use std::fmt::Write;

use serde::Serialize;

use crate::aws::AwsSettings;
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
    /// `--cloud aws` settings; `None` for the in-process clouds.
    pub aws: Option<AwsSettings>,
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

fn latency_p50_p99(s: Option<&Summary>) -> String {
    s.map_or("–".into(), |s| {
        format!("{} / {}", fmt_ms(s.p50_ms), fmt_ms(s.p99_ms))
    })
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

fn opt_s(v: Option<f64>) -> String {
    v.map_or("–".into(), |s| format!("{s:.1} s"))
}

fn ratio(got: Option<f64>, limit: Option<f64>) -> String {
    match (got, limit) {
        (Some(g), Some(l)) if l > 0.0 => format!("{:.2} ×", g / l),
        _ => "–".into(),
    }
}

impl Report {
    /// The `--cloud aws` tables: requests and times as the proxy and moto
    /// saw them, against the physical limits.
    fn aws_markdown(&self, a: &AwsSettings, out: &mut String) {
        let s = &self.scenario;
        let _ = writeln!(
            out,
            "EC2 = moto behind the counting proxy; buckets {}; proxy latency {} ms; {}. {} Nodes in a burst, {} more one every {:.1} s, idle {} s, {} deleted (every other one's instance terminated first), {} address changes, settle {} s.\n",
            if a.buckets {
                "on (EC2's documented per-action buckets)"
            } else {
                "off"
            },
            a.latency_ms,
            if a.storm_s > 0 {
                format!(
                    "a {} s throttle storm once half the burst is created",
                    a.storm_s
                )
            } else {
                "no storm".into()
            },
            s.nodes,
            s.trickle,
            s.trickle_interval.as_secs_f64(),
            s.idle.as_secs(),
            s.scale_down,
            s.address_changes,
            s.settle.as_secs(),
        );
        let _ = writeln!(
            out,
            "| controller | EC2 requests | min. | ratio | throttled | burst: last route | fastest | ratio | last deletion | idle req/min | final table | burst latency p50 / p99 | peak RSS | CPU |"
        );
        let _ = writeln!(
            out,
            "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|--:|--:|--:|"
        );
        for r in &self.runs {
            let Some(w) = &r.aws else {
                let _ = writeln!(
                    out,
                    "| {} | failed: {} |||||||||||||",
                    r.label,
                    r.error
                        .as_deref()
                        .unwrap_or("no measurement")
                        .replace('|', "/")
                        .replace('\n', " ")
                );
                continue;
            };
            let table = if w.table.exact() {
                format!("exact ({})", w.table.routes)
            } else {
                format!(
                    "{} of {}: {} missing, {} extra, {} wrong",
                    w.table.routes,
                    w.table.expected,
                    w.table.missing,
                    w.table.extra,
                    w.table.wrong_target
                )
            };
            let (rss, cpu) = r.controller_process.map_or(("–".into(), "–".into()), |p| {
                (
                    format!("{:.1} MiB", p.peak_rss_kib as f64 / 1024.0),
                    format!("{:.1} s", p.cpu_seconds),
                )
            });
            let last_route = if r.converge_seconds.is_some() {
                opt_s(w.burst_last_route_s)
            } else {
                format!(
                    "{} ({} of {} routed)",
                    opt_s(w.burst_last_route_s),
                    w.burst_routes,
                    s.nodes
                )
            };
            let _ = writeln!(
                out,
                "| {} | {} | {} | {:.2} × | {} | {} | {} | {} | {} | {:.1} | {} | {} | {} | {} |",
                r.label,
                w.total_requests,
                w.limits.min_requests,
                w.total_requests as f64 / w.limits.min_requests.max(1) as f64,
                w.throttled,
                last_route,
                opt_s(w.limits.fastest_burst_s),
                ratio(w.burst_last_route_s, w.limits.fastest_burst_s),
                opt_s(w.last_deletion_s),
                w.idle_requests_per_min,
                table,
                if r.burst_unconfirmed > 0 {
                    format!(
                        "{} ({} never routed)",
                        latency_p50_p99(r.burst_latency.as_ref()),
                        r.burst_unconfirmed
                    )
                } else {
                    latency_p50_p99(r.burst_latency.as_ref())
                },
                rss,
                cpu,
            );
        }
        let mut actions: Vec<&String> = self
            .runs
            .iter()
            .filter_map(|r| r.aws.as_ref())
            .flat_map(|w| w.requests.keys())
            .collect();
        actions.sort();
        actions.dedup();
        let _ = writeln!(out, "\nRequests by action (throttled in parentheses):\n");
        let _ = write!(out, "| controller |");
        for a in &actions {
            let _ = write!(out, " {a} |");
        }
        let _ = writeln!(out);
        let _ = write!(out, "|---|");
        for _ in &actions {
            let _ = write!(out, "--:|");
        }
        let _ = writeln!(out);
        for r in &self.runs {
            let Some(w) = &r.aws else { continue };
            let _ = write!(out, "| {} |", r.label);
            for a in &actions {
                let cell = match w.requests.get(*a) {
                    Some(c) if c.throttled > 0 => format!("{} ({})", c.requests, c.throttled),
                    Some(c) => c.requests.to_string(),
                    None => "0".into(),
                };
                let _ = write!(out, " {cell} |");
            }
            let _ = writeln!(out);
        }
        let diffs: Vec<String> = self
            .runs
            .iter()
            .filter_map(|r| r.aws.as_ref().map(|w| (r, w)))
            .filter(|(_, w)| !w.table.exact())
            .map(|(r, w)| format!("- {}: {}", r.label, w.table.examples.join("; ")))
            .collect();
        if !diffs.is_empty() {
            let _ = writeln!(out, "\nTable differences (first few):\n");
            for d in diffs {
                let _ = writeln!(out, "{d}");
            }
        }
    }

    pub fn markdown(&self) -> String {
        let mut out = String::new();
        if let Some(a) = &self.aws {
            self.aws_markdown(a, &mut out);
            return out;
        }
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
