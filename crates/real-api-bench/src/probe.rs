//! What the driver reads from outside a controller process, the same way for
//! every controller: `/proc/<pid>` for memory and CPU, plain HTTP for
//! `/metrics` and readiness, and the machine's description.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, bail};
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Resource use of a process so far.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ProcSample {
    /// `VmHWM`: peak resident set size.
    pub peak_rss_kib: u64,
    /// `VmRSS` at the time of the sample.
    pub rss_kib: u64,
    /// utime + stime.
    pub cpu_seconds: f64,
}

/// A `kB` field of `/proc/<pid>/status`.
fn status_kib(status: &str, key: &str) -> Option<u64> {
    status.lines().find_map(|line| {
        let rest = line.strip_prefix(key)?.strip_prefix(':')?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

/// utime + stime in clock ticks from `/proc/<pid>/stat`. The command name is
/// parenthesised and may itself contain spaces or parentheses, so fields are
/// counted from the last `)`.
fn stat_ticks(stat: &str) -> Option<u64> {
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state); utime and stime are fields 14 and 15.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// Parses the two files; `ticks_per_second` is `getconf CLK_TCK`.
pub fn parse_proc(status: &str, stat: &str, ticks_per_second: u64) -> Option<ProcSample> {
    Some(ProcSample {
        peak_rss_kib: status_kib(status, "VmHWM")?,
        rss_kib: status_kib(status, "VmRSS")?,
        cpu_seconds: stat_ticks(stat)? as f64 / ticks_per_second.max(1) as f64,
    })
}

/// Clock ticks per second for `/proc/<pid>/stat`; 100 on every Linux build
/// this runs on, asked of `getconf` in case it is not.
pub fn clock_ticks() -> u64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100)
}

pub fn sample_process(pid: u32, ticks_per_second: u64) -> anyhow::Result<ProcSample> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("read /proc/{pid}/status"))?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("read /proc/{pid}/stat"))?;
    parse_proc(&status, &stat, ticks_per_second)
        .with_context(|| format!("unexpected format of /proc/{pid}/status or stat"))
}

/// Cloud calls of one operation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct OpCount {
    pub calls: u64,
    pub errors: u64,
}

/// Sums `route_controller_cloud_requests_total{operation, result}` from a
/// Prometheus text exposition by operation; results other than `ok` are errors.
pub fn cloud_requests(text: &str) -> BTreeMap<String, OpCount> {
    const NAME: &str = "route_controller_cloud_requests_total{";
    let mut out: BTreeMap<String, OpCount> = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(NAME) else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once('}') else {
            continue;
        };
        let Some(value) = value
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
        else {
            continue;
        };
        let label = |key: &str| {
            labels.split(',').find_map(|kv| {
                let (k, v) = kv.split_once('=')?;
                (k.trim() == key).then(|| v.trim().trim_matches('"').to_string())
            })
        };
        let (Some(op), Some(result)) = (label("operation"), label("result")) else {
            continue;
        };
        let entry = out.entry(op).or_default();
        // Counters are integral; the float form is only the text format's.
        let n = value.max(0.0) as u64;
        entry.calls += n;
        if result != "ok" {
            entry.errors += n;
        }
    }
    out
}

/// `GET http://<addr><path>` with a fresh connection; returns status and body.
/// Both controllers serve plain HTTP/1.1 on loopback, so a client library
/// would add nothing.
pub async fn http_get(addr: &str, path: &str, timeout: Duration) -> anyhow::Result<(u16, String)> {
    let work = async {
        let mut stream = TcpStream::connect(addr).await?;
        let request = format!(
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nAccept: text/plain\r\n\r\n"
        );
        stream.write_all(request.as_bytes()).await?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await?;
        anyhow::Ok(raw)
    };
    let raw = tokio::time::timeout(timeout, work)
        .await
        .with_context(|| format!("GET {addr}{path} timed out"))??;
    let text = String::from_utf8_lossy(&raw);
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        bail!("GET {addr}{path}: no HTTP header");
    };
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("GET {addr}{path}: bad status line"))?;
    let chunked = head.lines().any(|l| {
        l.to_ascii_lowercase()
            .starts_with("transfer-encoding: chunked")
    });
    let body = if chunked {
        dechunk(body)
    } else {
        body.to_string()
    };
    Ok((status, body))
}

/// Decodes a chunked body (what hyper sends for a streamed response).
fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let size = size.split(';').next().unwrap_or("").trim();
        let Ok(n) = usize::from_str_radix(size, 16) else {
            break;
        };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].strip_prefix("\r\n").unwrap_or(&rest[n..]);
    }
    out
}

/// The 1-minute load average (0 if unreadable).
pub fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}

/// The machine a run happened on.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    pub nproc: usize,
    pub cpu_model: String,
    pub mem_total_mib: u64,
    pub kernel: String,
}

pub fn machine() -> Machine {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    Machine {
        nproc: std::thread::available_parallelism().map_or(1, |n| n.get()),
        cpu_model: cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name")?.split_once(':'))
            .map_or_else(|| "unknown".into(), |(_, v)| v.trim().to_string()),
        mem_total_mib: status_kib(&meminfo, "MemTotal").unwrap_or(0) / 1024,
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map_or_else(|_| "unknown".into(), |s| s.trim().to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATUS: &str = "Name:\tcloud-route-con\nUmask:\t0022\nState:\tS (sleeping)\nVmPeak:\t  812340 kB\nVmSize:\t  812340 kB\nVmHWM:\t   48212 kB\nVmRSS:\t   40100 kB\nThreads:\t4\n";
    // Command name with a space and a parenthesis, as `comm` allows.
    const STAT: &str = "4242 (my (ctl) x) S 1 4242 4242 0 -1 4194560 1234 0 0 0 250 75 0 0 20 0 4 0 100 812340000 10025 18446744073709551615";

    #[test]
    fn reads_peak_rss_and_cpu() {
        let s = parse_proc(STATUS, STAT, 100).expect("sample");
        assert_eq!(s.peak_rss_kib, 48212);
        assert_eq!(s.rss_kib, 40100);
        assert!((s.cpu_seconds - 3.25).abs() < 1e-9);
        let s = parse_proc(STATUS, STAT, 1000).expect("sample");
        assert!((s.cpu_seconds - 0.325).abs() < 1e-9);
    }

    #[test]
    fn truncated_proc_files_are_none() {
        assert!(parse_proc("VmRSS:\t1 kB\n", STAT, 100).is_none());
        assert!(parse_proc(STATUS, "4242 (x) S 1 2", 100).is_none());
        assert!(parse_proc(STATUS, "", 100).is_none());
    }

    #[test]
    fn sums_cloud_requests_by_operation() {
        let text = "# HELP route_controller_cloud_requests Cloud API requests\n\
# TYPE route_controller_cloud_requests counter\n\
route_controller_cloud_requests_total{provider=\"memory\",operation=\"list\",result=\"ok\"} 7\n\
route_controller_cloud_requests_total{provider=\"memory\",operation=\"create\",result=\"ok\"} 1000\n\
route_controller_cloud_requests_total{provider=\"memory\",operation=\"create\",result=\"throttled\"} 3\n\
route_controller_cloud_requests_total{provider=\"memory\",operation=\"delete\",result=\"ok\"} 12\n\
route_controller_route_sync_total{trigger=\"resync\",outcome=\"ok\"} 2\n\
route_controller_cloud_requests_total{broken\n";
        let m = cloud_requests(text);
        assert_eq!(
            m["list"],
            OpCount {
                calls: 7,
                errors: 0
            }
        );
        assert_eq!(
            m["create"],
            OpCount {
                calls: 1003,
                errors: 3
            }
        );
        assert_eq!(
            m["delete"],
            OpCount {
                calls: 12,
                errors: 0
            }
        );
        assert_eq!(m.len(), 3);
    }

    #[test]
    fn dechunks_bodies() {
        assert_eq!(
            dechunk("5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"),
            "hello world"
        );
        assert_eq!(dechunk("zz\r\n"), "");
    }
}
