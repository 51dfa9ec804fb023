//! [`RemoteMemoryCloud`]: the `memory` provider talking to a `cloud-sim`
//! server instead of holding the table itself, so several controller
//! processes (and a restarted one) share one simulated cloud.
//!
//! It classifies answers exactly as the in-process cloud would: the server
//! sends the [`ErrorKind`] and retry-after of the simulated failure, and the
//! client hands them back unchanged. Failures of the transport itself are
//! classified by what they mean for the request: a refused connection never
//! reached the cloud (`Transient`); anything after the request was sent
//! (a timeout, a reset, an unreadable answer to a change) may or may not have
//! taken effect (`Timeout`, which makes the controller re-list).

use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use reqwest::{StatusCode, Url};
use route_cloud::{
    Batch, BatchResult, Capabilities, CloudError, CloudRoutes, DEFAULT_REQUEST_TIMEOUT, ErrorKind,
    RequestStats,
};
use route_core::{OpKey, Route};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::wire::{
    BatchCreate, BatchRequest, BatchResponse, CALLER_HEADER, CreateRequest, DeleteRequest,
    MAX_CALLER_LEN, WireCapabilities, WireError, WireRoute, kind_for_bare_status,
};

/// Where and as whom the remote client talks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoteConfig {
    /// The server's base URL, e.g. `http://127.0.0.1:7070`.
    pub endpoint: String,
    /// The caller tag recorded in the server's call log (the controller's
    /// identity); defaults to `anonymous` on the server side when unset.
    #[serde(default)]
    pub caller: Option<String>,
    /// Per-request timeout in milliseconds (default 30 s).
    #[serde(default)]
    pub request_timeout_ms: Option<u64>,
}

impl RemoteConfig {
    /// A config for `endpoint` with caller `caller` and the default timeout.
    pub fn new(endpoint: impl Into<String>, caller: impl Into<String>) -> Self {
        Self {
            endpoint: endpoint.into(),
            caller: Some(caller.into()),
            request_timeout_ms: None,
        }
    }

    /// Builder: sets the per-request timeout.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout_ms = Some(u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX));
        self
    }

    fn timeout(&self) -> Duration {
        self.request_timeout_ms
            .map_or(DEFAULT_REQUEST_TIMEOUT, Duration::from_millis)
    }
}

/// Why a [`RemoteConfig`] is unusable.
#[derive(Debug, thiserror::Error)]
pub enum RemoteConfigError {
    /// The endpoint is not an `http://` URL.
    #[error("memory cloud endpoint {0:?} is not an http:// URL")]
    Endpoint(String),
    /// The caller tag cannot go into a header.
    #[error("memory cloud caller must be 1 to {MAX_CALLER_LEN} visible ASCII characters")]
    Caller,
    /// A zero timeout.
    #[error("memory cloud request_timeout_ms must be above zero")]
    Timeout,
    /// The HTTP client could not be built.
    #[error("memory cloud HTTP client: {0}")]
    Client(#[source] reqwest::Error),
}

/// Checks a URL is a usable base (http, with a host) and returns it parsed.
pub(crate) fn parse_endpoint(endpoint: &str) -> Option<Url> {
    let url = Url::parse(endpoint).ok()?;
    (url.scheme() == "http" && url.host().is_some() && !url.cannot_be_a_base()).then_some(url)
}

/// `base` with `segments` appended as path segments (each percent-encoded,
/// so any cluster name is safe).
pub(crate) fn join(base: &Url, segments: &[&str]) -> Url {
    let mut url = base.clone();
    if let Ok(mut p) = url.path_segments_mut() {
        p.pop_if_empty().extend(segments);
    }
    url
}

/// The `memory` provider backed by a `cloud-sim` server.
#[derive(Debug)]
pub struct RemoteMemoryCloud {
    http: reqwest::Client,
    base: Url,
    caller: Option<String>,
    stats: RequestStats,
    capabilities: Mutex<Option<Capabilities>>,
    /// The server's route targets, fetched with the capabilities.
    targets: Mutex<Vec<route_core::Text>>,
}

impl RemoteMemoryCloud {
    /// A client without capabilities yet: they are fetched by
    /// [`Self::refresh_capabilities`] or the first `list_routes`, and read as
    /// [`Capabilities::default`] until then. Prefer [`Self::connect`].
    pub fn new(config: &RemoteConfig) -> Result<Self, RemoteConfigError> {
        let base = parse_endpoint(&config.endpoint)
            .ok_or_else(|| RemoteConfigError::Endpoint(config.endpoint.clone()))?;
        if let Some(c) = &config.caller
            && (c.is_empty()
                || c.len() > MAX_CALLER_LEN
                || !c.bytes().all(|b| b.is_ascii_graphic() || b == b' '))
        {
            return Err(RemoteConfigError::Caller);
        }
        let timeout = config.timeout();
        if timeout.is_zero() {
            return Err(RemoteConfigError::Timeout);
        }
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout.min(Duration::from_secs(5)))
            // Loopback plain HTTP; a proxy from the environment would only get in the way.
            .no_proxy()
            .build()
            .map_err(RemoteConfigError::Client)?;
        Ok(Self {
            http,
            base,
            caller: config.caller.clone(),
            stats: RequestStats::default(),
            capabilities: Mutex::new(None),
            targets: Mutex::new(Vec::new()),
        })
    }

    /// A client with the server's capabilities fetched; fails if the server
    /// cannot be reached (classified like any call, so `Transient` means
    /// "not up yet, try again").
    pub async fn connect(config: &RemoteConfig) -> Result<Self, CloudError> {
        let c =
            Self::new(config).map_err(|e| CloudError::new(ErrorKind::Permanent, e.to_string()))?;
        c.refresh_capabilities().await?;
        Ok(c)
    }

    /// Fetches `GET /v1/capabilities` again (after the server was reconfigured).
    pub async fn refresh_capabilities(&self) -> Result<Capabilities, CloudError> {
        let url = join(&self.base, &["v1", "capabilities"]);
        let w: WireCapabilities = self.send("capabilities", false, self.http.get(url)).await?;
        *self.targets.lock().unwrap_or_else(|e| e.into_inner()) =
            w.targets.iter().map(|t| t.as_str().into()).collect();
        let caps = Capabilities::from(w);
        *self.capabilities.lock().unwrap_or_else(|e| e.into_inner()) = Some(caps.clone());
        Ok(caps)
    }

    /// The base URL.
    pub fn endpoint(&self) -> &Url {
        &self.base
    }

    fn routes_url(&self, cluster: &str, tail: &[&str]) -> Url {
        let mut segs = vec!["v1", "clusters", cluster];
        segs.extend_from_slice(tail);
        join(&self.base, &segs)
    }

    /// Sends one request and decodes a 2xx answer as `T`; counts it under
    /// `op` (capability fetches are not counted). `mutating` decides how an
    /// answer lost after sending is classified.
    async fn send<T: DeserializeOwned>(
        &self,
        op: &'static str,
        mutating: bool,
        req: reqwest::RequestBuilder,
    ) -> Result<T, CloudError> {
        let req = match &self.caller {
            Some(c) => req.header(CALLER_HEADER, c),
            None => req,
        };
        let result = self.exchange(mutating, req).await;
        if op != "capabilities" {
            self.stats
                .record(op, result.as_ref().err().map_or("ok", |e| e.kind.as_str()));
        }
        if let Err(e) = &result {
            tracing::debug!(provider = "memory", endpoint = %self.base, op, error = %e, "remote memory cloud call failed");
        }
        result
    }

    async fn exchange<T: DeserializeOwned>(
        &self,
        mutating: bool,
        req: reqwest::RequestBuilder,
    ) -> Result<T, CloudError> {
        let resp = req
            .send()
            .await
            .map_err(|e| transport_error(&e, mutating))?;
        let status = resp.status();
        let retry_after = retry_after_header(&resp);
        let body = resp
            .bytes()
            .await
            .map_err(|e| transport_error(&e, mutating))?;
        if status.is_success() {
            return serde_json::from_slice(&body).map_err(|e| {
                lost_answer(
                    mutating,
                    format!("unreadable answer from the memory cloud: {e}"),
                )
            });
        }
        Err(classify(status, retry_after, &body))
    }
}

/// The error of a non-2xx answer.
pub(crate) fn classify(
    status: StatusCode,
    retry_after: Option<Duration>,
    body: &[u8],
) -> CloudError {
    match serde_json::from_slice::<WireError>(body) {
        Ok(w) => {
            let mut e = CloudError::from(w);
            if e.retry_after.is_none() {
                e.retry_after = retry_after;
            }
            e
        }
        Err(_) => {
            let kind = kind_for_bare_status(status.as_u16());
            let text = String::from_utf8_lossy(body);
            let text: String = text.chars().take(200).collect();
            CloudError {
                kind,
                message: format!("the memory cloud endpoint answered {status}: {text}"),
                retry_after: retry_after.filter(|_| kind == ErrorKind::Throttled),
            }
        }
    }
}

fn retry_after_header(resp: &reqwest::Response) -> Option<Duration> {
    provider_kit::retry_after_header(resp.headers())
}

fn lost_answer(mutating: bool, message: String) -> CloudError {
    // A list changes nothing, so losing its answer is only a failed read.
    let kind = if mutating {
        ErrorKind::Timeout
    } else {
        ErrorKind::Transient
    };
    CloudError::new(kind, message)
}

pub(crate) fn transport_error(e: &reqwest::Error, mutating: bool) -> CloudError {
    provider_kit::transport_error("the memory cloud", e, mutating)
}

#[async_trait]
impl CloudRoutes for RemoteMemoryCloud {
    fn name(&self) -> &'static str {
        "memory"
    }

    fn targets(&self) -> Vec<route_core::Text> {
        self.targets
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn capabilities(&self) -> Capabilities {
        self.capabilities
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .unwrap_or_default()
    }

    fn stats(&self) -> &RequestStats {
        &self.stats
    }

    async fn list_routes(&self, cluster: &str) -> Result<Vec<Route>, CloudError> {
        let known = self
            .capabilities
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some();
        if !known {
            self.refresh_capabilities().await?;
        }
        let url = self.routes_url(cluster, &["routes"]);
        let routes: Vec<WireRoute> = self.send("list", false, self.http.get(url)).await?;
        Ok(routes.into_iter().map(Route::from).collect())
    }

    async fn create_route(
        &self,
        cluster: &str,
        name_hint: &str,
        route: &Route,
    ) -> Result<Route, CloudError> {
        let url = self.routes_url(cluster, &["routes"]);
        let body = CreateRequest {
            name_hint: name_hint.to_string(),
            route: WireRoute::from(route),
        };
        let created: WireRoute = self
            .send("create", true, self.http.post(url).json(&body))
            .await?;
        Ok(Route::from(created))
    }

    async fn delete_route(&self, cluster: &str, route: &Route) -> Result<(), CloudError> {
        let url = self.routes_url(cluster, &["routes", "delete"]);
        let body = DeleteRequest {
            route: WireRoute::from(route),
        };
        let _: serde_json::Value = self
            .send("delete", true, self.http.post(url).json(&body))
            .await?;
        Ok(())
    }

    async fn apply_batch(&self, cluster: &str, batch: &Batch) -> Result<BatchResult, CloudError> {
        let url = self.routes_url(cluster, &["batch"]);
        let body = BatchRequest {
            delete: batch
                .delete
                .iter()
                .map(|(_, r)| WireRoute::from(r))
                .collect(),
            create: batch
                .create
                .iter()
                .map(|(_, hint, r)| BatchCreate {
                    name_hint: hint.clone(),
                    route: WireRoute::from(r),
                })
                .collect(),
        };
        let answer: BatchResponse = self
            .send("batch", true, self.http.post(url).json(&body))
            .await?;
        by_key(batch, answer)
    }
}

/// The server's `answer` to `batch`, by the keys the changes were sent
/// under. The wire names each change by its place in the request, which is
/// the order of [`Batch::keys`]. Which changes happened is unknown when the
/// answer does not name each change exactly once: the whole batch is then
/// a timeout, and the controller lists again.
fn by_key(batch: &Batch, answer: BatchResponse) -> Result<BatchResult, CloudError> {
    let keys: Vec<&OpKey> = batch.keys().collect();
    let garbled = |what: String| {
        CloudError::new(
            ErrorKind::Timeout,
            format!("the memory cloud's batch answer {what}"),
        )
    };
    let mut out = BatchResult::new();
    for item in answer.results {
        let Some(&key) = keys.get(item.index) else {
            return Err(garbled(format!(
                "names change {} of {}",
                item.index,
                keys.len()
            )));
        };
        let r = match (item.error, item.route) {
            (Some(e), _) => Err(CloudError::from(e)),
            (None, r) => Ok(r.map(Route::from)),
        };
        if out.insert(key.clone(), r).is_some() {
            return Err(garbled(format!("answers change {} twice", item.index)));
        }
    }
    if out.len() != keys.len() {
        return Err(garbled(format!(
            "answers {} of {} changes",
            out.len(),
            keys.len()
        )));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_must_be_http_bases() {
        assert!(parse_endpoint("http://127.0.0.1:7070").is_some());
        assert!(parse_endpoint("http://127.0.0.1:7070/sim/").is_some());
        for bad in [
            "",
            "127.0.0.1:7070",
            "https://x",
            "file:///tmp/x",
            "mailto:a@b",
        ] {
            assert!(parse_endpoint(bad).is_none(), "{bad}");
        }
        let e = RemoteMemoryCloud::new(&RemoteConfig::new("nope", "c")).unwrap_err();
        assert!(matches!(e, RemoteConfigError::Endpoint(_)));
        let e = RemoteMemoryCloud::new(&RemoteConfig::new("http://127.0.0.1:1", "bad\ncaller"))
            .unwrap_err();
        assert!(matches!(e, RemoteConfigError::Caller));
        let e = RemoteMemoryCloud::new(
            &RemoteConfig::new("http://127.0.0.1:1", "c").with_timeout(Duration::ZERO),
        )
        .unwrap_err();
        assert!(matches!(e, RemoteConfigError::Timeout));
    }

    #[test]
    fn batch_answers_are_read_by_change_not_by_order() {
        use crate::wire::BatchItem;
        let cidr = |s: &str| route_core::Cidr::parse(s).unwrap();
        let batch = Batch::new(
            &[Route::new("a", cidr("10.244.1.0/24"))],
            &[
                ("ub".into(), Route::new("b", cidr("10.244.2.0/24"))),
                ("uc".into(), Route::new("c", cidr("10.244.3.0/24"))),
            ],
        );
        let item = |index: usize, route: Option<&Route>| BatchItem {
            index,
            route: route.map(WireRoute::from),
            error: None,
        };
        let (b, c) = (&batch.create[0].2, &batch.create[1].2);
        // Answered out of order: each result still lands on its change.
        let answer = BatchResponse {
            results: vec![item(2, Some(c)), item(0, None), item(1, Some(b))],
        };
        let out = by_key(&batch, answer).unwrap();
        assert_eq!(out.len(), 3);
        assert_eq!(out[&batch.delete[0].0], Ok(None));
        assert_eq!(out[&batch.create[0].0], Ok(Some(b.clone())));
        assert_eq!(out[&batch.create[1].0], Ok(Some(c.clone())));
        // A change left out, answered twice or unknown: the outcome is not
        // known, for the whole batch.
        for results in [
            vec![item(0, None), item(1, Some(b))],
            vec![item(0, None), item(1, Some(b)), item(1, Some(b))],
            vec![item(0, None), item(1, Some(b)), item(3, Some(c))],
        ] {
            let e = by_key(&batch, BatchResponse { results }).unwrap_err();
            assert_eq!(e.kind, ErrorKind::Timeout, "{e}");
        }
    }

    #[test]
    fn cluster_names_are_escaped_into_one_segment() {
        let base = parse_endpoint("http://127.0.0.1:7070/prefix/").unwrap();
        let url = join(&base, &["v1", "clusters", "a/b ?#c", "routes"]);
        assert_eq!(
            url.as_str(),
            "http://127.0.0.1:7070/prefix/v1/clusters/a%2Fb%20%3F%23c/routes"
        );
    }

    #[test]
    fn bare_answers_are_classified_by_status() {
        let e = classify(StatusCode::NOT_FOUND, None, b"<html>nope</html>");
        assert_eq!(
            e.kind,
            ErrorKind::Permanent,
            "a wrong endpoint is not a missing route"
        );
        let e = classify(
            StatusCode::TOO_MANY_REQUESTS,
            Some(Duration::from_secs(3)),
            b"",
        );
        assert_eq!(e.kind, ErrorKind::Throttled);
        assert_eq!(e.retry_after, Some(Duration::from_secs(3)));
        let e = classify(StatusCode::BAD_GATEWAY, Some(Duration::from_secs(3)), b"");
        assert_eq!(e.kind, ErrorKind::Transient);
        assert_eq!(e.retry_after, None);
        // The body's kind wins over the status, and its exact wait over the header's.
        let e = classify(
            StatusCode::TOO_MANY_REQUESTS,
            Some(Duration::from_secs(1)),
            br#"{"kind":"throttled","message":"m","retry_after_ms":250}"#,
        );
        assert_eq!(e.retry_after, Some(Duration::from_millis(250)));
        let e = classify(
            StatusCode::CONFLICT,
            None,
            br#"{"kind":"already_exists","message":"dup"}"#,
        );
        assert_eq!(
            (e.kind, e.message.as_str()),
            (ErrorKind::AlreadyExists, "dup")
        );
    }
}
