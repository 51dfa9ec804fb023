//! Go-style durations (`10s`, `1m30s`, `12h0m0s`, `500ms`), as the
//! cloud-controller-manager's flags take them.

use std::time::Duration;

/// Parses a Go `time.ParseDuration` string; negative values are refused.
pub fn parse(s: &str) -> Result<Duration, String> {
    let bad =
        || format!("invalid duration {s:?}: use a number with a unit, e.g. 10s, 1m30s, 12h, 500ms");
    let t = s.trim();
    if t == "0" {
        return Ok(Duration::ZERO);
    }
    if t.is_empty() || t.starts_with('-') {
        return Err(bad());
    }
    let t = t.strip_prefix('+').unwrap_or(t);
    let mut total = 0f64;
    let mut rest = t;
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        if num_end == 0 {
            return Err(bad());
        }
        let n: f64 = rest[..num_end].parse().map_err(|_| bad())?;
        rest = &rest[num_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let secs = match &rest[..unit_end] {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad()),
        };
        total += n * secs;
        rest = &rest[unit_end..];
    }
    if !total.is_finite() || total > 1e9 {
        return Err(bad());
    }
    Ok(Duration::from_secs_f64(total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_forms() {
        assert_eq!(parse("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(parse("1m30s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse("12h0m0s").unwrap(), Duration::from_secs(12 * 3600));
        assert_eq!(parse("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse("1.5h").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse("0").unwrap(), Duration::ZERO);
    }

    #[test]
    fn refuses_garbage() {
        for s in ["", "10", "-1s", "s", "10 s", "1d", "abc", "1e3s", "1m-2s"] {
            assert!(parse(s).is_err(), "{s:?}");
        }
    }
}
