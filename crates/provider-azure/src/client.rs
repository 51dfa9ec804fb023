//! The HTTP layer: ARM tokens, the client-side read and write budgets,
//! and the classification of every answer into a [`CloudError`].
//!
//! Every request, token requests and operation polls included, leaves
//! through the kit's request path, so [`route_cloud::RequestStats`] sees all
//! of them. The bearer token and the client secret are sent as sensitive
//! headers or form fields and appear in no error or log line; error texts
//! carry only ARM's `code` and `message` or Entra's `error` and
//! `error_description`.

use std::time::Duration;

use provider_kit::{Auth, Budget, Call, Client, NoAuth, Renewing, Secret, transport_error};
use reqwest::header::{HeaderMap, HeaderValue};
use reqwest::{Method, RequestBuilder, Response, StatusCode, Url};
use route_cloud::ratelimit::TokenBucket;
use route_cloud::{CloudError, ErrorKind};
use serde_json::Value;
use tokio::time::Instant;

use crate::config::{AzureConfig, Credential};
use crate::ops;

/// A token is renewed this long before it expires.
const TOKEN_MARGIN: Duration = Duration::from_secs(300);

/// Names a request in the text of a failure before an answer.
const LABEL: &str = "ARM request";

/// One answer of ARM.
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Value,
}

impl Answer {
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// The HTTP client of one provider.
pub(crate) struct Http {
    pub(crate) kit: Client,
    base: String,
    api_version: String,
    aad: Aad,
}

impl std::fmt::Debug for Http {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Http")
            .field("base", &self.base)
            .field("authority", &self.aad.authority)
            .finish_non_exhaustive()
    }
}

impl Http {
    pub(crate) fn new(config: &AzureConfig) -> Result<Self, CloudError> {
        let credential = config
            .credential()
            .map_err(|e| CloudError::new(ErrorKind::Permanent, e.to_string()))?;
        let client = provider_kit::client_builder(config.request_timeout())
            .build()
            .map_err(|e| CloudError::new(ErrorKind::Permanent, format!("HTTP client: {e}")))?;
        // After a 429 the whole client holds off until Retry-After (the
        // upstream client's throttle, `retryrepectthrottled`, fails fast
        // instead; waiting keeps a retry that comes early from being refused
        // again): the kit pauses both budgets.
        let budget = Budget::Split {
            reads: TokenBucket::new(
                config.cloud_provider_rate_limit_qps,
                config.cloud_provider_rate_limit_bucket,
            ),
            writes: TokenBucket::new(
                config.cloud_provider_rate_limit_qps_write,
                config.cloud_provider_rate_limit_bucket_write,
            ),
        };
        Ok(Self {
            kit: Client::new("azure", client, budget),
            base: config.arm_endpoint(),
            api_version: config.api_version.clone(),
            aad: Aad {
                credential,
                scope: config.arm_scope(),
                authority: config.authority_host(),
                imds: config.imds_endpoint.trim_end_matches('/').to_string(),
                token: Renewing::default(),
            },
        })
    }

    /// Sends one request to ARM (a path under the endpoint, or a full URL
    /// ARM handed out, such as `Azure-AsyncOperation`) and counts it under
    /// `op`. `if_match` guards a write with the table's ETag, so a write
    /// whose answer was lost is safe to send again.
    pub(crate) async fn call(
        &self,
        op: &'static str,
        method: Method,
        path_or_url: &str,
        body: Option<&Value>,
        if_match: Option<&str>,
    ) -> Result<Answer, CloudError> {
        let request = self.url(path_or_url).map(|url| {
            let mut req = self.kit.http().request(method.clone(), url);
            if let Some(tag) = if_match {
                req = req.header(reqwest::header::IF_MATCH, tag);
            }
            if let Some(b) = body {
                req = req.json(b);
            }
            req
        });
        let call = Call::new(op, LABEL, &method);
        self.kit.send(call, &self.aad, request, read_answer).await
    }

    fn url(&self, path_or_url: &str) -> Result<Url, CloudError> {
        let text = if path_or_url.starts_with("http://") || path_or_url.starts_with("https://") {
            path_or_url.to_string()
        } else {
            format!("{}{path_or_url}", self.base)
        };
        let mut url = Url::parse(&text)
            .map_err(|e| CloudError::new(ErrorKind::Permanent, format!("bad ARM URL: {e}")))?;
        if !url.query_pairs().any(|(k, _)| k == "api-version") {
            url.query_pairs_mut()
                .append_pair("api-version", &self.api_version);
        }
        Ok(url)
    }
}

/// An ARM answer: its JSON body (`null` when there is none), or the class
/// of its failure.
async fn read_answer(resp: Response) -> Result<Answer, CloudError> {
    let status = resp.status();
    let headers = resp.headers().clone();
    let bytes = resp
        .bytes()
        .await
        .map_err(|e| transport_error(LABEL, &e, false))?;
    let body: Value = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes).unwrap_or(Value::Null)
    };
    if status.is_success() {
        return Ok(Answer {
            status,
            headers,
            body,
        });
    }
    Err(classify(status, &headers, &body))
}

/// ARM tokens from Microsoft Entra ID or the instance metadata service,
/// cached until shortly before they expire and dropped when ARM refuses
/// one.
struct Aad {
    credential: Credential,
    scope: String,
    authority: String,
    imds: String,
    token: Renewing<Secret>,
}

impl Auth for Aad {
    type Credentials = Secret;

    async fn credentials(&self, client: &Client) -> Result<Secret, CloudError> {
        self.token
            .get(|| async {
                // Token requests are not ARM's: they take nothing of its
                // budget, and a throttled one pauses nothing.
                let call = Call::credentials(ops::TOKEN, LABEL, false);
                let (token, lifetime) = client
                    .send(call, &NoAuth, self.token_request(client), read_token)
                    .await?;
                let expires = Instant::now() + lifetime;
                let renew_at = expires
                    .checked_sub(TOKEN_MARGIN)
                    .unwrap_or_else(Instant::now);
                Ok((token, Some(renew_at)))
            })
            .await
    }

    fn apply(&self, token: &Secret, request: RequestBuilder) -> RequestBuilder {
        // `bearer_auth` marks the header sensitive.
        request.bearer_auth(token.expose())
    }

    async fn refused(&self, error: &CloudError) {
        if error.kind == ErrorKind::Permanent {
            // A rejected token is fetched anew next time.
            self.token.forget().await;
        }
    }
}

impl Aad {
    /// Entra ID's token endpoint for `tenant`.
    fn token_url(&self, tenant: &str) -> String {
        format!("{}/{tenant}/oauth2/v2.0/token", self.authority)
    }

    /// Client credentials proven by a signed assertion (a certificate's, or
    /// workload identity's projected token).
    fn assertion_request(
        &self,
        client: &Client,
        url: String,
        client_id: &str,
        assertion: &str,
    ) -> RequestBuilder {
        client.http().post(url).form(&[
            ("grant_type", "client_credentials"),
            ("client_id", client_id),
            (
                "client_assertion_type",
                "urn:ietf:params:oauth:client-assertion-type:jwt-bearer",
            ),
            ("client_assertion", assertion),
            ("scope", self.scope.as_str()),
        ])
    }

    /// The token request of the credential.
    fn token_request(&self, client: &Client) -> Result<RequestBuilder, CloudError> {
        Ok(match &self.credential {
            Credential::ClientSecret {
                tenant,
                client_id,
                secret,
            } => client.http().post(self.token_url(tenant)).form(&[
                ("grant_type", "client_credentials"),
                ("client_id", client_id.as_str()),
                ("client_secret", secret.expose()),
                ("scope", self.scope.as_str()),
            ]),
            Credential::ClientCertificate {
                tenant,
                client_id,
                certificate,
            } => {
                let url = self.token_url(tenant);
                let assertion = certificate
                    .assertion(client_id, &url)
                    .map_err(|e| CloudError::new(ErrorKind::Permanent, e))?;
                self.assertion_request(client, url, client_id, &assertion)
            }
            Credential::WorkloadIdentity {
                tenant,
                client_id,
                token_file,
            } => {
                // Read on every exchange: the kubelet rotates the file.
                let assertion = std::fs::read_to_string(token_file).map_err(|e| {
                    CloudError::new(
                        ErrorKind::Permanent,
                        format!(
                            "cannot read the federated token file {}: {e}",
                            token_file.display()
                        ),
                    )
                })?;
                self.assertion_request(client, self.token_url(tenant), client_id, assertion.trim())
            }
            Credential::ManagedIdentity {
                client_id,
                resource_id,
            } => {
                let resource = self.scope.trim_end_matches(".default").to_string();
                let mut query = vec![("api-version", "2018-02-01"), ("resource", &resource)];
                if let Some(id) = client_id {
                    query.push(("client_id", id));
                }
                // IMDS's name for a user-assigned identity's resource ID.
                if let Some(id) = resource_id {
                    query.push(("msi_res_id", id));
                }
                let mut url = Url::parse(&format!("{}/metadata/identity/oauth2/token", self.imds))
                    .map_err(|e| {
                        CloudError::new(ErrorKind::Permanent, format!("bad IMDS endpoint: {e}"))
                    })?;
                url.query_pairs_mut().extend_pairs(query);
                client
                    .http()
                    .get(url)
                    .header("Metadata", HeaderValue::from_static("true"))
            }
        })
    }
}

/// A token answer of Entra ID or IMDS: the token and its lifetime.
async fn read_token(resp: Response) -> Result<(Secret, Duration), CloudError> {
    let status = resp.status();
    let headers = resp.headers().clone();
    let body: Value = resp.json().await.unwrap_or(Value::Null);
    if !status.is_success() {
        let what = format!(
            "token request answered {}: {} {}",
            status.as_u16(),
            body["error"].as_str().unwrap_or_default(),
            body["error_description"].as_str().unwrap_or_default()
        );
        return Err(match status.as_u16() {
            429 => CloudError::throttled(what, retry_after(&headers)),
            s if s >= 500 => CloudError::new(ErrorKind::Transient, what),
            _ => CloudError::new(ErrorKind::Permanent, what),
        });
    }
    let token = body["access_token"].as_str().unwrap_or_default();
    if token.is_empty() {
        return Err(CloudError::new(
            ErrorKind::Transient,
            "the token answer has no access_token",
        ));
    }
    // `expires_in` is a number from Entra, a string from IMDS.
    let lifetime = match &body["expires_in"] {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
    .unwrap_or(3600);
    Ok((Secret::new(token), Duration::from_secs(lifetime)))
}

/// ARM's `{"error": {"code", "message", "details": [...]}}`: the code, the
/// message, and the codes of the details (NRP nests the useful one there).
pub(crate) fn arm_error(body: &Value) -> (String, String, Vec<String>) {
    let e = &body["error"];
    let details = e["details"]
        .as_array()
        .map(|d| {
            d.iter()
                .filter_map(|x| x["code"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    (
        e["code"].as_str().unwrap_or_default().to_string(),
        e["message"].as_str().unwrap_or_default().to_string(),
        details,
    )
}

/// A code that says a limit is reached (ARM has no single code for a full
/// route table: `QuotaExceeded` is its generic one).
fn is_quota_code(code: &str) -> bool {
    [
        "Quota",
        "LimitExceeded",
        "LimitReached",
        "ExceedsLimit",
        "TooMany",
    ]
    .iter()
    .any(|k| code.contains(k))
        && code != "TooManyRequests"
}

/// The class of an error code inside a failed long-running operation.
pub(crate) fn classify_code(code: &str, message: &str) -> CloudError {
    let what = format!("{code}: {message}");
    let kind = if is_quota_code(code) {
        ErrorKind::QuotaExceeded
    } else if code.starts_with("RetryableError") || code == "AnotherOperationInProgress" {
        ErrorKind::Conflict
    } else if matches!(
        code,
        "InternalServerError" | "InternalServerErrorRetryable" | "ServiceUnavailable"
    ) {
        ErrorKind::Transient
    } else if matches!(
        code,
        "NotFound" | "ResourceNotFound" | "ResourceGroupNotFound"
    ) {
        ErrorKind::NotFound
    } else {
        ErrorKind::InvalidRequest
    };
    CloudError::new(kind, what)
}

/// The class of a failed ARM answer.
pub(crate) fn classify(status: StatusCode, headers: &HeaderMap, body: &Value) -> CloudError {
    let (code, message, details) = arm_error(body);
    let what = format!(
        "ARM answered {}{}{}{}",
        status.as_u16(),
        if code.is_empty() { "" } else { " " },
        code,
        if message.is_empty() {
            String::new()
        } else {
            format!(": {message}")
        }
    );
    match status.as_u16() {
        429 => CloudError::throttled(what, retry_after(headers)),
        412 => CloudError::new(ErrorKind::Conflict, what),
        409 => CloudError::new(ErrorKind::Conflict, what),
        404 => CloudError::new(ErrorKind::NotFound, what),
        400 if is_quota_code(&code) || details.iter().any(|d| is_quota_code(d)) => {
            CloudError::new(ErrorKind::QuotaExceeded, what)
        }
        400 | 422 => CloudError::new(ErrorKind::InvalidRequest, what),
        401 | 403 => CloudError::new(ErrorKind::Permanent, what),
        504 => CloudError::new(ErrorKind::Timeout, what),
        408 | 500..=599 => CloudError {
            retry_after: retry_after(headers),
            ..CloudError::new(ErrorKind::Transient, what)
        },
        _ => CloudError::new(ErrorKind::InvalidRequest, what),
    }
}

/// `Retry-After`: delta-seconds or an HTTP date; ARM sends seconds, the
/// upstream client accepts both.
pub(crate) use provider_kit::retry_after_header as retry_after;

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use super::*;
    use serde_json::json;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn retry_after_is_seconds_or_an_http_date() {
        assert_eq!(
            retry_after(&headers(&[("retry-after", "17")])),
            Some(Duration::from_secs(17))
        );
        let later = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(30));
        let d = retry_after(&headers(&[("retry-after", &later)])).unwrap();
        assert!(
            d <= Duration::from_secs(30) && d >= Duration::from_secs(29),
            "{d:?}"
        );
        assert_eq!(
            retry_after(&headers(&[(
                "retry-after",
                "Sun, 06 Nov 1994 08:49:37 GMT"
            )])),
            Some(Duration::ZERO)
        );
        assert_eq!(retry_after(&headers(&[("retry-after", "soon")])), None);
    }

    #[test]
    fn answers_are_classified_by_status_and_code() {
        let err = |code: &str| json!({"error": {"code": code, "message": "m"}});
        let k = |s: u16, b: Value| {
            classify(StatusCode::from_u16(s).unwrap(), &HeaderMap::new(), &b).kind
        };
        assert_eq!(k(412, err("PreconditionFailed")), ErrorKind::Conflict);
        assert_eq!(
            k(429, err("SubscriptionRequestsThrottled")),
            ErrorKind::Throttled
        );
        assert_eq!(k(400, err("QuotaExceeded")), ErrorKind::QuotaExceeded);
        assert_eq!(
            k(400, err("InvalidRequestFormat")),
            ErrorKind::InvalidRequest
        );
        assert_eq!(
            k(
                400,
                json!({"error": {"code": "InvalidResourceReference", "details": [{"code": "RouteTableRoutesLimitExceeded"}]}})
            ),
            ErrorKind::QuotaExceeded
        );
        assert_eq!(k(404, err("ResourceNotFound")), ErrorKind::NotFound);
        assert_eq!(k(403, err("AuthorizationFailed")), ErrorKind::Permanent);
        assert_eq!(k(503, Value::Null), ErrorKind::Transient);
        assert_eq!(
            classify_code("RetryableErrorDueToAnotherOperation", "").kind,
            ErrorKind::Conflict
        );
    }
}
