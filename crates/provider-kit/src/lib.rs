//! The plumbing the cloud providers share, written once: the request path
//! every request of the HTTP providers takes ([`Client::send`]: budget,
//! fence, request counters, the pause after throttling, authentication
//! through [`Auth`]), the budget, fence and counters alone ([`Meter`]) for
//! the providers that send through a cloud's official SDK, what a `Retry-After` asks for, what a request that
//! failed before its answer means for the engine, and [`Secret`] for their
//! credentials. Each provider crate stands on it; what a cloud's *answers*
//! mean stays in the provider, next to that cloud's error codes.
//!
//! [`registry`] is the other thing every provider crate shares: the one
//! value ([`Provider`]) through which the binary's registry reads its
//! `--cloud-config` and builds it.

mod http;
mod meter;
pub mod registry;
mod secret;

pub use registry::{BuildError, Building, Provider, Reads, Start};

use std::time::{Duration, SystemTime};

use route_cloud::{CloudError, ErrorKind};

pub use http::{
    Auth, Bearer, Budget, Call, Client, NoAuth, Renewing, TokenHeader, client_builder,
    connect_timeout,
};
pub use meter::Meter;
pub use secret::Secret;

/// The wait a `Retry-After` value asks for: delta-seconds or an HTTP date
/// (RFC 9110 §10.2.3), measured from `now`. A date has whole seconds, so
/// the wait is rounded up: a retry must not land just before the moment the
/// server meant. `None` for anything else.
pub fn retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let v = value.trim();
    if let Ok(s) = v.parse::<u64>() {
        return Some(Duration::from_secs(s));
    }
    let at = httpdate::parse_http_date(v).ok()?;
    let left = at.duration_since(now).unwrap_or(Duration::ZERO);
    Some(Duration::from_secs(
        left.as_secs() + u64::from(left.subsec_nanos() > 0),
    ))
}

/// The `Retry-After` of an answer's headers (see [`retry_after`]).
pub fn retry_after_header(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let v = headers.get(reqwest::header::RETRY_AFTER)?.to_str().ok()?;
    retry_after(v, SystemTime::now())
}

/// What a request that got no answer means. `what` names it (`"GET
/// /networks/4711"`); `may_have_changed` is true for a change that could
/// have taken effect although its answer was lost (not a conditional or
/// idempotent write), which the engine must treat as done-or-not: it lists
/// before it tries again.
///
/// - no answer in time: [`ErrorKind::Timeout`];
/// - no connection at all: [`ErrorKind::Transient`], nothing was sent;
/// - a request that could not be built (a bad URL in the config):
///   [`ErrorKind::Permanent`];
/// - a connection that broke: [`ErrorKind::Timeout`] when the change may
///   have happened, else [`ErrorKind::Transient`].
///
/// The text carries the error's causes (`reqwest` puts the useful one
/// last); no credential travels in a URL, so it is safe to log.
pub fn transport_error(what: &str, e: &reqwest::Error, may_have_changed: bool) -> CloudError {
    let mut text = format!("{what}: {e}");
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    if e.is_timeout() {
        CloudError::new(ErrorKind::Timeout, format!("no answer in time: {text}"))
    } else if e.is_builder() {
        CloudError::new(ErrorKind::Permanent, format!("bad request: {text}"))
    } else if e.is_connect() || !may_have_changed {
        CloudError::new(ErrorKind::Transient, format!("network error: {text}"))
    } else {
        CloudError::new(
            ErrorKind::Timeout,
            format!("network error: {text} (the change may have happened)"),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_is_seconds_or_an_http_date_rounded_up() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_millis(1_780_000_000_250);
        assert_eq!(retry_after(" 7 ", now), Some(Duration::from_secs(7)));
        let date = httpdate::fmt_http_date(now + Duration::from_secs(30));
        // The date drops the 250 ms: 29.75 s left, asked as 30 s.
        assert_eq!(retry_after(&date, now), Some(Duration::from_secs(30)));
        let past = httpdate::fmt_http_date(now - Duration::from_secs(30));
        assert_eq!(retry_after(&past, now), Some(Duration::ZERO));
        assert_eq!(retry_after("soon", now), None);
        assert_eq!(retry_after("-1", now), None);
    }

    #[tokio::test]
    async fn a_refused_connection_is_transient_and_a_builder_error_permanent() {
        let client = reqwest::Client::new();
        // Nothing listens on port 1 of loopback.
        let e = client
            .post("http://127.0.0.1:1/")
            .send()
            .await
            .expect_err("refused");
        let c = transport_error("POST /", &e, true);
        assert_eq!(c.kind, ErrorKind::Transient, "{c:?}");
        assert!(c.message.starts_with("network error: POST /"), "{c:?}");
        let e = client.get("not a url").send().await.expect_err("no URL");
        assert_eq!(transport_error("GET", &e, false).kind, ErrorKind::Permanent);
    }
}
