//! Log setup: human-readable lines, or JSON lines in the shape the
//! cloud-controller-manager's component-base JSON logger writes them, so a
//! log pipeline set up for the CCM reads ours unchanged. The level follows
//! klog's `--v` (and `-v`), unless `RUST_LOG` says otherwise.
//!
//! A JSON line is one object: `ts` (Unix time in seconds), `caller`
//! (`crate/file.rs:line`), `msg`, then `v` (the line's klog verbosity: 0
//! info, 4 debug, 6 trace) on every line that is not an error, `err` for an
//! event's `error` field, and every field of the event and of the spans
//! around it, flat. A span's `id` field is written under the span's name
//! (`"pass":12`); a field set twice keeps the innermost value. Not in
//! component-base: `"level":"warn"` on warnings, which klog writes as plain
//! info lines, and `"level":"error"` on errors.
//!
//! Written here rather than with `tracing-subscriber`'s JSON formatter:
//! that one nests fields under `fields` and spans under `spans`, and names
//! the keys `timestamp`/`level`/`target`, which is the shape that pipelines
//! built for the CCM do not parse.

use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::Value;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::{JsonFields, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

use crate::cli::LogFormat;

/// The log filter for klog verbosity `v` (see `--v`).
fn filter_for(v: u8) -> &'static str {
    match v {
        0..=3 => "info",
        4..=5 => "debug,hyper=info,kube_client=info,tower=info,rustls=info",
        _ => "trace",
    }
}

pub fn init(verbosity: u8, format: LogFormat) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(filter_for(verbosity)));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .with_target(false)
            .init(),
        LogFormat::Json => builder
            .with_ansi(false)
            .fmt_fields(JsonFields::new())
            .event_format(ComponentBaseJson)
            .init(),
    }
}

/// The JSON line format of component-base (see the module docs).
struct ComponentBaseJson;

impl<S> FormatEvent<S, JsonFields> for ComponentBaseJson
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, JsonFields>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        let ts = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let meta = event.metadata();
        let mut spans = Vec::new();
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                let ext = span.extensions();
                let fields = ext
                    .get::<FormattedFields<JsonFields>>()
                    .and_then(|f| serde_json::from_str::<serde_json::Map<String, Value>>(f).ok())
                    .unwrap_or_default();
                spans.push((span.name(), fields));
            }
        }
        let mut visitor = Fields::default();
        event.record(&mut visitor);
        let line = Line {
            ts,
            level: *meta.level(),
            caller: caller(meta.file(), meta.line()),
            spans,
            event: visitor,
        };
        writeln!(writer, "{}", line.render())
    }
}

/// One log line's parts, before they are written.
struct Line<'a> {
    ts: f64,
    level: Level,
    caller: String,
    spans: Vec<(&'a str, serde_json::Map<String, Value>)>,
    event: Fields,
}

impl Line<'_> {
    fn render(self) -> String {
        // (key, value, the span it came from): an inner span's field
        // replaces an outer one's; an event's field keeps the key and moves
        // a span's field of the same name and another value to
        // `<span>_<key>`.
        let mut fields: Vec<(String, Value, Option<&str>)> = Vec::new();
        for (name, span) in &self.spans {
            for (key, value) in span {
                let key = if key == "id" {
                    name.to_string()
                } else {
                    key.clone()
                };
                match fields.iter_mut().find(|(k, ..)| *k == key) {
                    Some(slot) => *slot = (key, value.clone(), Some(name)),
                    None => fields.push((key, value.clone(), Some(name))),
                }
            }
        }
        let mut err = None;
        for (key, value) in self.event.fields {
            if key == "error" {
                err = Some(value);
                continue;
            }
            match fields.iter_mut().find(|(k, ..)| *k == key) {
                Some(slot) => {
                    if let Some(span) = slot.2.filter(|_| slot.1 != value) {
                        let moved = (format!("{span}_{key}"), slot.1.clone(), None);
                        *slot = (key, value, None);
                        fields.push(moved);
                    } else {
                        slot.1 = value;
                    }
                }
                None => fields.push((key, value, None)),
            }
        }
        let mut out = String::with_capacity(256);
        let _ = write!(
            out,
            "{{\"ts\":{:.6},\"caller\":{},\"msg\":{}",
            self.ts,
            json(&Value::String(self.caller)),
            json(&Value::String(self.event.message.unwrap_or_default())),
        );
        let v = match self.level {
            Level::ERROR => None,
            Level::WARN | Level::INFO => Some(0),
            Level::DEBUG => Some(4),
            Level::TRACE => Some(6),
        };
        if let Some(v) = v {
            let _ = write!(out, ",\"v\":{v}");
        }
        if let Some(e) = err {
            let _ = write!(out, ",\"err\":{}", json(&e));
        }
        match self.level {
            Level::WARN => out.push_str(",\"level\":\"warn\""),
            Level::ERROR => out.push_str(",\"level\":\"error\""),
            _ => {}
        }
        for (key, value, _) in fields {
            let _ = write!(out, ",{}:{}", json(&Value::String(key)), json(&value));
        }
        out.push('}');
        out
    }
}

fn json(v: &Value) -> String {
    serde_json::to_string(v).unwrap_or_else(|_| "null".into())
}

/// `crate/file.rs:line`, as klog's `dir/file.go:line`: the directory above
/// the source root (the crate) and the path below it.
fn caller(file: Option<&str>, line: Option<u32>) -> String {
    let file = file.unwrap_or("unknown");
    let parts: Vec<&str> = file.split(['/', '\\']).collect();
    let short = match parts.iter().rposition(|p| *p == "src") {
        Some(i) if i > 0 && i + 1 < parts.len() => {
            format!("{}/{}", parts[i - 1], parts[i + 1..].join("/"))
        }
        _ => parts[parts.len().saturating_sub(2)..].join("/"),
    };
    match line {
        Some(l) => format!("{short}:{l}"),
        None => short,
    }
}

/// An event's message and fields, in the order they were recorded.
#[derive(Default)]
struct Fields {
    message: Option<String>,
    fields: Vec<(String, Value)>,
}

impl Fields {
    fn put(&mut self, field: &Field, value: Value) {
        if field.name() == "message" {
            self.message = Some(match value {
                Value::String(s) => s,
                other => other.to_string(),
            });
        } else {
            self.fields.push((field.name().to_string(), value));
        }
    }
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, Value::String(value.to_string()));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, value.into());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, value.into());
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.put(field, value.into());
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, value.into());
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.put(field, Value::String(value.to_string()));
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.put(field, Value::String(format!("{value:?}")));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(v: Value) -> serde_json::Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn a_json_line_has_component_base_keys_and_the_fields_flat() {
        let line = Line {
            ts: 1_780_000_000.25,
            level: Level::INFO,
            caller: caller(Some("crates/route-controller/src/execute.rs"), Some(480)),
            spans: vec![
                (
                    "pass",
                    map(serde_json::json!({"id": 12, "trigger": "node_added", "mode": "incremental"})),
                ),
                ("cloud", map(serde_json::json!({"op": "create", "node": "n-1"}))),
            ],
            event: Fields {
                message: Some("created route".into()),
                fields: vec![
                    ("destination".into(), "10.244.1.0/24".into()),
                    ("node".into(), "n-1".into()),
                ],
            },
        }
        .render();
        let v: Value = serde_json::from_str(&line).expect("one JSON object");
        assert!(
            line.starts_with("{\"ts\":1780000000.250000,\"caller\":"),
            "{line}"
        );
        assert_eq!(v["caller"], "route-controller/execute.rs:480");
        assert_eq!(v["msg"], "created route");
        assert_eq!(v["v"], 0);
        assert_eq!(v["pass"], 12, "a span's id under the span's name");
        assert_eq!(v["trigger"], "node_added");
        assert_eq!(v["op"], "create");
        assert_eq!(v["destination"], "10.244.1.0/24");
        assert_eq!(
            line.matches("\"node\"").count(),
            1,
            "a key set twice once: {line}"
        );
        for absent in ["timestamp", "fields", "spans", "target", "level", "err"] {
            assert!(v.get(absent).is_none(), "{absent}: {line}");
        }
    }

    #[test]
    fn an_event_field_named_like_a_span_field_keeps_the_key_and_the_span_s_moves_aside() {
        let line = Line {
            ts: 1.0,
            level: Level::INFO,
            caller: "x/y.rs:1".into(),
            spans: vec![("pass", map(serde_json::json!({"id": 3, "kind": "full"})))],
            event: Fields {
                message: Some("m".into()),
                fields: vec![("kind".into(), "route_missing".into())],
            },
        }
        .render();
        let v: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["kind"], "route_missing", "{line}");
        assert_eq!(v["pass_kind"], "full", "{line}");
        assert_eq!(v["pass"], 3, "{line}");
    }

    #[test]
    fn an_error_line_has_err_and_no_verbosity() {
        let line = Line {
            ts: 1.0,
            level: Level::ERROR,
            caller: caller(
                Some("/root/.cargo/registry/src/index/kube-runtime-3.0.0/src/watcher.rs"),
                Some(7),
            ),
            spans: vec![],
            event: Fields {
                message: Some("could not list".into()),
                fields: vec![("error".into(), "connection refused".into())],
            },
        }
        .render();
        let v: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["err"], "connection refused");
        assert!(v.get("v").is_none(), "{line}");
        assert_eq!(v["level"], "error");
        assert_eq!(v["caller"], "kube-runtime-3.0.0/watcher.rs:7");
    }

    #[test]
    fn klog_verbosity_maps_to_info_debug_and_trace() {
        assert_eq!(filter_for(0), "info");
        assert_eq!(filter_for(2), "info", "the CCM manifests' usual --v=2");
        assert!(filter_for(4).starts_with("debug"));
        assert_eq!(filter_for(10), "trace");
    }
}
