//! Latency summaries: nearest-rank percentiles over the measured samples.
//!
//! Nearest rank (the smallest sample with at least p % of the samples at or
//! below it) never invents a value between two samples, so every reported
//! percentile is a latency that one Node really saw.

use std::time::Duration;

use serde::Serialize;

/// p50 / p99 / max of a set of latencies, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Summary {
    pub count: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

/// The nearest-rank `p`-th percentile (0 < p ≤ 100) of `sorted`, which must
/// be in ascending order. `None` for no samples or a `p` outside (0, 100].
pub fn percentile(sorted: &[Duration], p: f64) -> Option<Duration> {
    if sorted.is_empty() || !(p > 0.0 && p <= 100.0) {
        return None;
    }
    let n = sorted.len();
    // ceil(p/100 · n) as a 1-based rank; the float product is exact enough
    // for the sample counts here, and clamping keeps rounding at n harmless.
    let rank = ((p / 100.0) * n as f64).ceil() as usize;
    sorted.get(rank.clamp(1, n) - 1).copied()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Summarises `samples` (any order); `None` when there are none.
pub fn summarize(samples: &[Duration]) -> Option<Summary> {
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    Some(Summary {
        count: sorted.len(),
        p50_ms: ms(percentile(&sorted, 50.0)?),
        p99_ms: ms(percentile(&sorted, 99.0)?),
        max_ms: ms(*sorted.last()?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn millis(v: &[u64]) -> Vec<Duration> {
        v.iter().copied().map(Duration::from_millis).collect()
    }

    #[test]
    fn nearest_rank_on_one_to_hundred() {
        let sorted: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&sorted, 50.0), Some(Duration::from_millis(50)));
        assert_eq!(percentile(&sorted, 99.0), Some(Duration::from_millis(99)));
        assert_eq!(percentile(&sorted, 100.0), Some(Duration::from_millis(100)));
        assert_eq!(percentile(&sorted, 0.5), Some(Duration::from_millis(1)));
    }

    #[test]
    fn p99_of_small_sets_is_the_maximum() {
        // With fewer than 100 samples the 99th percentile rank rounds up to n.
        let sorted = millis(&[3, 5, 8, 13, 21]);
        assert_eq!(percentile(&sorted, 99.0), Some(Duration::from_millis(21)));
        assert_eq!(percentile(&sorted, 50.0), Some(Duration::from_millis(8)));
        // 40 % of 5 is exactly rank 2.
        assert_eq!(percentile(&sorted, 40.0), Some(Duration::from_millis(5)));
    }

    #[test]
    fn outlier_shows_in_p99_only_above_one_percent() {
        // 1,000 samples, 10 slow: 1 % exactly, so p99 still sees a fast one.
        let mut samples = vec![Duration::from_millis(20); 990];
        samples.extend(vec![Duration::from_secs(10); 10]);
        let s = summarize(&samples).expect("summary");
        assert_eq!(s.p99_ms, 20.0);
        assert_eq!(s.max_ms, 10_000.0);
        samples.push(Duration::from_secs(10));
        let s = summarize(&samples).expect("summary");
        assert_eq!(s.p99_ms, 10_000.0);
        assert_eq!(s.count, 1001);
    }

    #[test]
    fn summary_sorts_its_input() {
        let s = summarize(&millis(&[900, 100, 500])).expect("summary");
        assert_eq!(s.p50_ms, 500.0);
        assert_eq!(s.max_ms, 900.0);
        assert_eq!(s.count, 3);
    }

    #[test]
    fn empty_or_bad_input_gives_none() {
        assert_eq!(summarize(&[]), None);
        let one = millis(&[7]);
        assert_eq!(percentile(&one, 0.0), None);
        assert_eq!(percentile(&one, 101.0), None);
        assert_eq!(percentile(&one, f64::NAN), None);
        assert_eq!(percentile(&one, 50.0), Some(Duration::from_millis(7)));
    }
}
