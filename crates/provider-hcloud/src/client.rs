//! The HTTP layer: the request budget, `RateLimit-*` headers and the
//! classification of every answer into a [`CloudError`].
//!
//! Every request leaves through [`Http::call`] and so through the kit's
//! request path, whose token bucket and [`route_cloud::RequestStats`] see
//! all of them (polls and server pages included). The token is sent as a
//! sensitive header and appears in no error or log line.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use provider_kit::{Bearer, Budget, Call, Client, transport_error};
use reqwest::header::HeaderMap;
use reqwest::{Method, Response, StatusCode, Url};
use route_cloud::ratelimit::TokenBucket;
use route_cloud::{CloudError, ErrorKind};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::time::Instant;

use crate::config::{ConfigError, HcloudConfig, Token};
use crate::schema::ErrorEnvelope;

/// The HTTP client of one provider.
#[derive(Debug)]
pub(crate) struct Http {
    pub(crate) kit: Client,
    /// The endpoint without a trailing slash.
    base: String,
    token: Token,
    per_second: f64,
    reserve: f64,
    use_headers: bool,
}

impl Http {
    pub(crate) fn new(config: &HcloudConfig, token: Token) -> Result<Self, ConfigError> {
        let client = provider_kit::client_builder(config.request_timeout())
            .build()
            .map_err(|e| ConfigError::Client(e.to_string()))?;
        let bucket = TokenBucket::per_period(
            config.requests_per_hour,
            Duration::from_secs(3600),
            config.burst,
        );
        Ok(Self {
            kit: Client::new("hcloud", client, Budget::Shared(bucket)),
            base: config.endpoint.trim_end_matches('/').to_string(),
            token,
            per_second: config.per_second(),
            reserve: f64::from(config.keep_in_reserve),
            use_headers: config.use_rate_limit_headers,
        })
    }

    /// Sends one request after taking a token from the budget, reads the
    /// rate-limit headers, counts it under `op` and decodes the answer.
    pub(crate) async fn call<T: DeserializeOwned>(
        &self,
        op: &'static str,
        method: Method,
        path: &str,
        query: &[(&str, &str)],
        body: Option<&(impl Serialize + Sync)>,
    ) -> Result<T, CloudError> {
        let request = Url::parse(&format!("{}{path}", self.base))
            .map(|mut url| {
                if !query.is_empty() {
                    url.query_pairs_mut().extend_pairs(query);
                }
                let req = self.kit.http().request(method.clone(), url);
                match body {
                    Some(b) => req.json(b),
                    None => req,
                }
            })
            .map_err(|e| {
                CloudError::new(ErrorKind::Permanent, format!("{op}: bad endpoint URL: {e}"))
            });
        // Hetzner's actions are neither conditional nor idempotent: one whose
        // answer was lost may have happened.
        let call = Call::new(op, op, &method).uncertain();
        let may_have_changed = method != Method::GET;
        let auth = Bearer(self.token.secret());
        let result = self
            .kit
            .send(call, &auth, request, |resp| {
                self.answer(op, resp, may_have_changed)
            })
            .await;
        if let Err(e) = &result
            && e.kind == ErrorKind::Fenced
        {
            // This provider's counters have always shown the changes the
            // fence kept back, which the kit does not count as requests.
            self.kit.stats().record(op, e.kind.as_str());
        }
        result
    }

    /// Reads the rate-limit headers of an answer and decodes it.
    async fn answer<T: DeserializeOwned>(
        &self,
        op: &'static str,
        resp: Response,
        may_have_changed: bool,
    ) -> Result<T, CloudError> {
        let status = resp.status();
        let retry_after = self.observe(resp.headers(), status).await;
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| transport_error(op, &e, may_have_changed))?;
        if status.is_success() {
            return serde_json::from_slice(&bytes).map_err(|e| {
                CloudError::new(
                    ErrorKind::Transient,
                    format!("{op}: unexpected answer ({status}): {e}"),
                )
            });
        }
        let api = serde_json::from_slice::<ErrorEnvelope>(&bytes)
            .map(|e| e.error)
            .unwrap_or_default();
        let kind = classify(status.as_u16(), &api.code, &api.message);
        let mut err = CloudError::new(
            kind,
            format!(
                "{op}: {status} {}: {}",
                if api.code.is_empty() { "-" } else { &api.code },
                api.message
            ),
        );
        if kind == ErrorKind::Throttled {
            err.retry_after = retry_after;
        }
        Err(err)
    }

    /// Reads `RateLimit-Remaining`/`RateLimit-Reset`. Lowers the client's
    /// budget to what the server says is left above the reserve, and once the
    /// reserve is reached paces requests at the refill rate. For a 429 it
    /// pauses all requests and returns how long.
    async fn observe(&self, headers: &HeaderMap, status: StatusCode) -> Option<Duration> {
        let remaining = header_f64(headers, "ratelimit-remaining");
        let until_reset = header_f64(headers, "ratelimit-reset").and_then(|reset| {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .ok()?
                .as_secs_f64();
            Some(Duration::from_secs_f64((reset - now).max(0.0)))
        });
        if status == StatusCode::TOO_MANY_REQUESTS {
            // Waiting for the full reset could take an hour; waiting until the
            // budget is back above the reserve is enough to stop throttling and
            // leaves the others sharing the project room to work.
            let refill = Duration::from_secs_f64((self.reserve + 1.0) / self.per_second);
            let wait = match until_reset {
                Some(r) if !r.is_zero() => r.min(refill),
                _ => refill,
            };
            self.kit.clamp_remaining(0.0).await;
            self.kit.pause_until(Instant::now() + wait).await;
            return Some(wait);
        }
        if self.use_headers
            && let Some(rem) = remaining
        {
            let spare = rem - self.reserve;
            if spare >= 1.0 {
                self.kit.clamp_remaining(spare).await;
            } else {
                self.kit.clamp_remaining(0.0).await;
                let wait = Duration::from_secs_f64((1.0 - spare) / self.per_second);
                self.kit.pause_until(Instant::now() + wait).await;
            }
        }
        None
    }
}

fn header_f64(headers: &HeaderMap, name: &str) -> Option<f64> {
    headers
        .get(name)?
        .to_str()
        .ok()?
        .trim()
        .parse::<f64>()
        .ok()
        .filter(|v| v.is_finite())
}

/// Classifies an error answer by its API error code, then by HTTP status.
pub(crate) fn classify(status: u16, code: &str, message: &str) -> ErrorKind {
    match code {
        "rate_limit_exceeded" => return ErrorKind::Throttled,
        "locked" | "conflict" => return ErrorKind::Conflict,
        "uniqueness_error" => return ErrorKind::AlreadyExists,
        "not_found" => return ErrorKind::NotFound,
        "resource_limit_exceeded" => return ErrorKind::QuotaExceeded,
        "invalid_input" | "json_error" => {
            let m = message.to_ascii_lowercase();
            return if m.contains("already exists") || m.contains("already exist") {
                ErrorKind::AlreadyExists
            } else {
                ErrorKind::InvalidRequest
            };
        }
        "unauthorized" | "forbidden" | "token_readonly" | "protected" => {
            return ErrorKind::Permanent;
        }
        "timeout" => return ErrorKind::Timeout,
        "server_error" | "service_error" | "unavailable" | "maintenance" | "bad_gateway" => {
            return ErrorKind::Transient;
        }
        _ => {}
    }
    match status {
        401 | 403 => ErrorKind::Permanent,
        404 => ErrorKind::NotFound,
        409 | 412 | 423 => ErrorKind::Conflict,
        429 => ErrorKind::Throttled,
        408 | 504 => ErrorKind::Timeout,
        400 | 422 => ErrorKind::InvalidRequest,
        s if s >= 500 => ErrorKind::Transient,
        _ => ErrorKind::Permanent,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_codes_and_statuses_map_to_kinds() {
        for (status, code, msg, kind) in [
            (429, "rate_limit_exceeded", "", ErrorKind::Throttled),
            (423, "locked", "", ErrorKind::Conflict),
            (409, "conflict", "", ErrorKind::Conflict),
            (409, "uniqueness_error", "", ErrorKind::AlreadyExists),
            (
                400,
                "invalid_input",
                "route already exists",
                ErrorKind::AlreadyExists,
            ),
            (
                400,
                "invalid_input",
                "bad gateway ip",
                ErrorKind::InvalidRequest,
            ),
            (404, "not_found", "", ErrorKind::NotFound),
            (403, "resource_limit_exceeded", "", ErrorKind::QuotaExceeded),
            (403, "forbidden", "", ErrorKind::Permanent),
            (401, "unauthorized", "", ErrorKind::Permanent),
            (401, "", "", ErrorKind::Permanent),
            (503, "unavailable", "", ErrorKind::Transient),
            (500, "", "", ErrorKind::Transient),
            (502, "", "", ErrorKind::Transient),
            (504, "", "", ErrorKind::Timeout),
            (504, "timeout", "", ErrorKind::Timeout),
            (423, "", "", ErrorKind::Conflict),
            (418, "", "", ErrorKind::Permanent),
        ] {
            assert_eq!(classify(status, code, msg), kind, "{status} {code} {msg}");
        }
    }
}
