//! The chart: cumulative cloud calls over simulated time, one line per mode.
//!
//! Hand-written SVG, no dependencies. The y axis is logarithmic because the
//! modes differ by orders of magnitude (a periodic day lists 8,640 times, an
//! incremental one a handful), and a linear axis would flatten all but one line.

use std::fmt::Write as _;

use crate::run::ModeReport;
use route_controller::Mode;

const WIDTH: f64 = 960.0;
const HEIGHT: f64 = 540.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 170.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 60.0;

fn color(mode: &str) -> &'static str {
    match mode.parse::<Mode>() {
        Ok(Mode::Periodic) => "#d62728",
        Ok(Mode::Watch) => "#1f77b4",
        Ok(Mode::Incremental) => "#2ca02c",
        Err(_) => "#7f7f7f",
    }
}

/// Escapes text for XML content and attribute values.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c if c.is_control() => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

/// The SVG document for these runs of `scenario` over `duration_s` seconds.
pub fn svg(scenario: &str, duration_s: f64, modes: &[ModeReport]) -> String {
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let duration_s = duration_s.max(1.0);
    let max = modes
        .iter()
        .filter_map(|m| m.cumulative_calls.last().copied())
        .max()
        .unwrap_or(1)
        .max(10);
    let decades = (max as f64).log10().ceil().max(1.0);
    let x = |t: f64| LEFT + (t / duration_s).clamp(0.0, 1.0) * plot_w;
    let y = |v: u64| TOP + plot_h - ((v.max(1) as f64).log10() / decades) * plot_h;

    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<?xml version="1.0" encoding="UTF-8"?>
<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">
<rect x="0" y="0" width="{WIDTH}" height="{HEIGHT}" fill="white"/>
<text x="{}" y="28" text-anchor="middle" font-size="16">Cumulative cloud calls: {}</text>"#,
        LEFT + plot_w / 2.0,
        escape(scenario)
    );
    // Horizontal grid at each decade.
    for d in 0..=(decades as u32) {
        let v = 10u64.saturating_pow(d);
        let yy = y(v);
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{yy:.1}" x2="{:.1}" y2="{yy:.1}" stroke="#dddddd"/>
<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            LEFT + plot_w,
            LEFT - 8.0,
            yy + 4.0,
            group(v)
        );
    }
    // Vertical ticks in hours (or minutes for short runs).
    let hours = duration_s / 3600.0;
    let (unit, unit_s) = if hours >= 2.0 {
        ("h", 3600.0)
    } else {
        ("min", 60.0)
    };
    let span = duration_s / unit_s;
    let step = [1.0, 2.0, 3.0, 6.0, 12.0, 24.0, 48.0, 120.0, 240.0]
        .into_iter()
        .find(|st| span / st <= 12.0)
        .unwrap_or((span / 12.0).ceil());
    let mut t = 0.0;
    while t <= span + 1e-9 {
        let xx = x(t * unit_s);
        let _ = writeln!(
            s,
            r##"<line x1="{xx:.1}" y1="{TOP}" x2="{xx:.1}" y2="{:.1}" stroke="#eeeeee"/>
<text x="{xx:.1}" y="{:.1}" text-anchor="middle">{t}</text>"##,
            TOP + plot_h,
            TOP + plot_h + 18.0
        );
        t += step;
    }
    let _ = writeln!(
        s,
        r##"<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#333333"/>
<text x="{:.1}" y="{:.1}" text-anchor="middle">simulated time ({unit})</text>
<text x="18" y="{:.1}" text-anchor="middle" transform="rotate(-90 18 {:.1})">cloud calls (log scale)</text>"##,
        LEFT + plot_w / 2.0,
        HEIGHT - 15.0,
        TOP + plot_h / 2.0,
        TOP + plot_h / 2.0
    );
    for (i, m) in modes.iter().enumerate() {
        let mut points = format!("{:.1},{:.1}", x(0.0), y(0));
        for (k, v) in m.cumulative_calls.iter().enumerate() {
            let t = (k as f64 + 1.0) * m.series_step_s;
            let _ = write!(points, " {:.1},{:.1}", x(t), y(*v));
        }
        let c = color(&m.mode);
        let ly = TOP + 20.0 + i as f64 * 40.0;
        let lx = LEFT + plot_w + 15.0;
        let _ = writeln!(
            s,
            r##"<polyline fill="none" stroke="{c}" stroke-width="2" points="{points}"/>
<line x1="{lx:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{c}" stroke-width="3"/>
<text x="{:.1}" y="{:.1}">{}</text>
<text x="{:.1}" y="{:.1}" fill="#555555">{} calls</text>"##,
            lx + 24.0,
            lx + 30.0,
            ly + 4.0,
            escape(&m.mode),
            lx + 30.0,
            ly + 19.0,
            group(m.total_calls)
        );
    }
    s.push_str("</svg>\n");
    s
}

/// `1234567` as `1,234,567`.
pub fn group(v: u64) -> String {
    let digits = v.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_thousands_and_escapes() {
        assert_eq!(group(0), "0");
        assert_eq!(group(999), "999");
        assert_eq!(group(1000), "1,000");
        assert_eq!(group(1_234_567), "1,234,567");
        assert_eq!(escape("a<b & \"c\""), "a&lt;b &amp; &quot;c&quot;");
    }
}
