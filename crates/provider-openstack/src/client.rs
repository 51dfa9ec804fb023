//! The HTTP layer: Keystone tokens and the catalog, and the classification
//! of every Neutron answer into a [`CloudError`].
//!
//! Everything that leaves the process goes through [`Http::call`] and the
//! kit's request path, so the token bucket and
//! [`route_cloud::RequestStats`] see every request, Keystone's included.
//! Tokens and secrets are kept in [`Secret`]s and never appear in errors or logs.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use provider_kit::{Budget, Call, Client, NoAuth, Renewing, Secret, TokenHeader, transport_error};
use reqwest::{Method, Response, StatusCode};
use route_cloud::ratelimit::TokenBucket;
use route_cloud::{CloudError, ErrorKind};
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::config::{AuthType, OpenStackConfig};

/// Names a request in the text of a failure before an answer.
const LABEL: &str = "OpenStack request";

/// A throttling answer without `Retry-After` pauses the budget this long.
const THROTTLE_PAUSE: Duration = Duration::from_secs(1);

/// A token and the Neutron endpoint it is good for.
#[derive(Clone)]
struct Session {
    token: Option<Secret>,
    /// Ends in `/v2.0`, no trailing slash.
    endpoint: String,
}

/// A JSON answer.
#[derive(Debug)]
pub(crate) struct Answer {
    pub body: Value,
}

/// The HTTP client of one provider.
pub(crate) struct Http {
    pub(crate) kit: Client,
    config: Arc<OpenStackConfig>,
    /// Renewed a while before the token expires; for ever without Keystone.
    session: Renewing<Session>,
}

impl Http {
    pub(crate) fn new(config: Arc<OpenStackConfig>) -> Result<Self, CloudError> {
        let mut b = provider_kit::client_builder(config.request_timeout());
        if let Some(path) = &config.cacert {
            let pem = std::fs::read(path).map_err(|e| {
                CloudError::new(
                    ErrorKind::Permanent,
                    format!("reading cacert {}: {e}", path.display()),
                )
            })?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| {
                CloudError::new(
                    ErrorKind::Permanent,
                    format!("cacert {}: {e}", path.display()),
                )
            })?;
            for c in certs {
                b = b.add_root_certificate(c);
            }
        }
        if config.insecure {
            b = b.danger_accept_invalid_certs(true);
        }
        let client = b.build().map_err(|e| {
            CloudError::new(
                ErrorKind::Permanent,
                format!("building the HTTP client: {e}"),
            )
        })?;
        let bucket = TokenBucket::new(
            config.rate_limit.requests_per_second,
            config.rate_limit.burst,
        );
        Ok(Self {
            kit: Client::new("openstack", client, Budget::Shared(bucket))
                .with_throttle_pause(THROTTLE_PAUSE),
            config,
            session: Renewing::default(),
        })
    }

    /// Sends one Neutron request (`path` is relative to `/v2.0`) and returns
    /// its JSON answer or a classified error. A 401 from Neutron re-authenticates
    /// once (an expired or revoked token); nothing else is retried here.
    /// Router and port writes carry `If-Match`, so a write whose answer was
    /// lost is safe to send again.
    pub(crate) async fn call(
        &self,
        op: &'static str,
        method: Method,
        path: &str,
        body: Option<&Value>,
        if_match: Option<u64>,
    ) -> Result<Answer, CloudError> {
        let mut reauthenticated = false;
        loop {
            let session = self.session().await?;
            let url = format!("{}{}", session.endpoint, path);
            let mut req = self.kit.http().request(method.clone(), &url);
            if self.config.auth_type == AuthType::Noauth
                && let Some(p) = &self.config.project_id
            {
                req = req.header("X-Project-Id", p);
            }
            if let Some(rev) = if_match {
                req = req.header("If-Match", format!("revision_number={rev}"));
            }
            if let Some(b) = body {
                req = req.json(b);
            }
            let auth = TokenHeader {
                name: "X-Auth-Token",
                token: session.token.as_ref(),
            };
            let mut status = None;
            let result = self
                .kit
                .send(Call::new(op, LABEL, &method), &auth, Ok(req), |resp| {
                    status = Some(resp.status());
                    read_answer(resp)
                })
                .await;
            match result {
                Err(_)
                    if status == Some(StatusCode::UNAUTHORIZED)
                        && session.token.is_some()
                        && !reauthenticated =>
                {
                    tracing::info!(op, "Neutron refused the token; authenticating again");
                    self.session.forget().await;
                    reauthenticated = true;
                }
                Ok(a) => return Ok(a),
                Err(mut e) => {
                    e.message = format!("{op} {method} {path}: {}", e.message);
                    return Err(e);
                }
            }
        }
    }

    /// The current session, authenticating first when there is none or it is
    /// about to expire.
    async fn session(&self) -> Result<Session, CloudError> {
        self.session
            .get(|| async {
                match self.config.auth_type {
                    AuthType::Noauth => Ok((
                        Session {
                            token: None,
                            endpoint: neutron_base(
                                self.config.endpoint.as_deref().unwrap_or_default(),
                            ),
                        },
                        None,
                    )),
                    AuthType::Password | AuthType::V3ApplicationCredential => {
                        self.authenticate().await
                    }
                }
            })
            .await
    }

    /// `POST /v3/auth/tokens`: a token from `X-Subject-Token`, the network
    /// endpoint from the catalog (or the configured override), and when to
    /// renew it.
    async fn authenticate(&self) -> Result<(Session, Option<Instant>), CloudError> {
        let url = format!("{}/auth/tokens", keystone_base(&self.config.auth.auth_url));
        let body = token_request(&self.config);
        let started = Instant::now();
        // Keystone shares the cloud's budget; its throttling pauses nothing.
        let call = Call::credentials("auth", LABEL, true);
        let mut answered = false;
        let request = Ok(self.kit.http().post(&url).json(&body));
        let (token, endpoint, lifetime) = self
            .kit
            .send(call, &NoAuth, request, |resp| {
                answered = true;
                self.read_token(&url, resp)
            })
            .await
            .map_err(|e| {
                if answered {
                    e
                } else {
                    CloudError {
                        message: format!("Keystone {url}: {}", e.message),
                        ..e
                    }
                }
            })?;
        // Renew well before expiry: a tenth of the lifetime, at most five minutes.
        let margin = (lifetime / 10).min(Duration::from_secs(300));
        tracing::info!(
            endpoint = %endpoint,
            lifetime_s = lifetime.as_secs(),
            "authenticated with Keystone"
        );
        let session = Session {
            token: Some(token),
            endpoint,
        };
        Ok((session, Some(started + lifetime.saturating_sub(margin))))
    }

    /// A Keystone token answer: the token, the Neutron endpoint and the
    /// token's lifetime.
    async fn read_token(
        &self,
        url: &str,
        resp: Response,
    ) -> Result<(Secret, String, Duration), CloudError> {
        let status = resp.status();
        let token = resp
            .headers()
            .get("X-Subject-Token")
            .and_then(|v| v.to_str().ok())
            .map(Secret::new);
        let retry = retry_after(resp.headers());
        let bytes = resp.bytes().await.unwrap_or_default();
        if !status.is_success() {
            let e = classify(status, retry, &bytes);
            return Err(CloudError {
                message: format!("Keystone authentication at {url}: {}", e.message),
                ..e
            });
        }
        let fail =
            |m: String| CloudError::new(ErrorKind::Permanent, format!("Keystone {url}: {m}"));
        let Some(token) = token else {
            return Err(fail("the answer has no X-Subject-Token header".into()));
        };
        let doc: Value = serde_json::from_slice(&bytes)
            .map_err(|e| fail(format!("the token answer is not JSON: {e}")))?;
        let endpoint = match &self.config.endpoint {
            Some(e) => neutron_base(e),
            None => catalog_endpoint(
                &doc,
                self.config.interface.as_str(),
                &self.config.region_name,
            )
            .map(|e| neutron_base(&e))
            .map_err(fail)?,
        };
        let lifetime = token_lifetime(&doc).unwrap_or(Duration::from_secs(3600));
        Ok((token, endpoint, lifetime))
    }
}

/// A Neutron answer: its JSON body (`null` when empty), or the class of its
/// failure.
async fn read_answer(resp: Response) -> Result<Answer, CloudError> {
    let status = resp.status();
    let retry_after = retry_after(resp.headers());
    let bytes = resp
        .bytes()
        .await
        .map_err(|e| transport_error(LABEL, &e, false))?;
    if !status.is_success() {
        return Err(classify(status, retry_after, &bytes));
    }
    if bytes.is_empty() {
        return Ok(Answer { body: Value::Null });
    }
    serde_json::from_slice(&bytes)
        .map(|body| Answer { body })
        .map_err(|e| {
            CloudError::new(
                ErrorKind::Transient,
                format!("{status}: the answer is not JSON: {e}"),
            )
        })
}

/// The JSON body of a Keystone v3 token request (contains the secret).
pub(crate) fn token_request(c: &OpenStackConfig) -> Value {
    let a = &c.auth;
    let domain = |id: &str, name: &str| {
        if !id.is_empty() {
            json!({ "id": id })
        } else if !name.is_empty() {
            json!({ "name": name })
        } else {
            json!({ "name": "Default" })
        }
    };
    let user = || {
        if !a.user_id.is_empty() {
            json!({ "id": a.user_id })
        } else {
            json!({ "name": a.username, "domain": domain(&a.user_domain_id, &a.user_domain_name) })
        }
    };
    match c.auth_type {
        AuthType::V3ApplicationCredential => {
            let mut cred = if !a.application_credential_id.is_empty() {
                json!({ "id": a.application_credential_id })
            } else {
                json!({ "name": a.application_credential_name, "user": user() })
            };
            cred["secret"] = json!(a.application_credential_secret.expose());
            json!({ "auth": { "identity": {
                "methods": ["application_credential"],
                "application_credential": cred,
            }}})
        }
        _ => {
            let mut u = user();
            u["password"] = json!(a.password.expose());
            let project = if !a.project_id.is_empty() {
                json!({ "id": a.project_id })
            } else {
                json!({
                    "name": a.project_name,
                    "domain": domain(&a.project_domain_id, &a.project_domain_name),
                })
            };
            json!({ "auth": {
                "identity": { "methods": ["password"], "password": { "user": u } },
                "scope": { "project": project },
            }})
        }
    }
}

/// The network endpoint of a token's catalog for `interface` (and `region`
/// when given).
pub(crate) fn catalog_endpoint(
    doc: &Value,
    interface: &str,
    region: &str,
) -> Result<String, String> {
    let catalog = doc["token"]["catalog"]
        .as_array()
        .ok_or("the token has no catalog (is it scoped to a project?)")?;
    let network = catalog
        .iter()
        .find(|s| s["type"] == "network")
        .ok_or("the catalog has no network service")?;
    let endpoints = network["endpoints"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    endpoints
        .iter()
        .find(|e| {
            e["interface"] == interface
                && (region.is_empty() || e["region_id"] == region || e["region"] == region)
        })
        .and_then(|e| e["url"].as_str())
        .map(str::to_string)
        .ok_or_else(|| {
            format!(
                "the catalog has no {interface} network endpoint{}",
                if region.is_empty() {
                    String::new()
                } else {
                    format!(" in region {region}")
                }
            )
        })
}

/// `https://x/v3/` and `https://x` both become `https://x/v3`.
fn keystone_base(url: &str) -> String {
    let u = url.trim().trim_end_matches('/');
    if u.ends_with("/v3") {
        u.to_string()
    } else {
        format!("{u}/v3")
    }
}

/// `http://x:9696/` and `http://x:9696/v2.0/` both become `http://x:9696/v2.0`.
pub(crate) fn neutron_base(url: &str) -> String {
    let u = url.trim().trim_end_matches('/');
    if u.ends_with("/v2.0") {
        u.to_string()
    } else {
        format!("{u}/v2.0")
    }
}

/// `expires_at - issued_at` of a token answer.
fn token_lifetime(doc: &Value) -> Option<Duration> {
    let expires = unix_seconds(doc["token"]["expires_at"].as_str()?)?;
    let issued = unix_seconds(doc["token"]["issued_at"].as_str()?)?;
    u64::try_from(expires - issued)
        .ok()
        .map(Duration::from_secs)
}

/// Seconds since the epoch of an ISO 8601 time such as
/// `2026-11-29T16:20:46.000000Z`; one without an offset is UTC, as
/// Keystone means it.
fn unix_seconds(s: &str) -> Option<i64> {
    let t = s.parse::<jiff::Timestamp>().ok().or_else(|| {
        let civil: jiff::civil::DateTime = s.parse().ok()?;
        civil
            .to_zoned(jiff::tz::TimeZone::UTC)
            .ok()
            .map(|z| z.timestamp())
    })?;
    Some(t.as_second())
}

use provider_kit::retry_after_header as retry_after;

/// The `NeutronError` of an answer: (type, message).
fn neutron_error(body: &[u8]) -> (String, String) {
    let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let e = &v["NeutronError"];
    if e.is_object() {
        return (
            e["type"].as_str().unwrap_or_default().to_string(),
            e["message"].as_str().unwrap_or_default().to_string(),
        );
    }
    // Keystone and proxies answer {"error": {"message": ...}} or plain text.
    if let Some(m) = v["error"]["message"].as_str() {
        return (String::new(), m.to_string());
    }
    let text = String::from_utf8_lossy(body);
    (String::new(), text.chars().take(300).collect())
}

/// Classifies a non-2xx answer. The message starts with the status code.
pub(crate) fn classify(
    status: StatusCode,
    retry_after: Option<Duration>,
    body: &[u8],
) -> CloudError {
    let (kind_name, msg) = neutron_error(body);
    let what = if kind_name.is_empty() {
        msg.clone()
    } else {
        format!("{kind_name}: {msg}")
    };
    let message = format!("{} {what}", status.as_u16());
    let kind = match status.as_u16() {
        // OverQuota is the route quota (quota_router_route, Neutron >= 2026.2);
        // RoutesExhausted the older per-router max_routes.
        _ if kind_name == "OverQuota" || kind_name == "RoutesExhausted" => ErrorKind::QuotaExceeded,
        // The Node's port holds `max_allowed_address_pair` pairs already:
        // that port takes no more until an operator frees or raises some,
        // whatever happens to routes elsewhere.
        _ if kind_name == "AllowedAddressPairExhausted" => ErrorKind::TargetUnavailable,
        429 => ErrorKind::Throttled,
        413 if retry_after.is_some() => ErrorKind::Throttled,
        401 | 403 => ErrorKind::Permanent,
        404 => ErrorKind::NotFound,
        409 | 412 => ErrorKind::Conflict,
        408 => ErrorKind::Timeout,
        500..=599 => ErrorKind::Transient,
        _ => ErrorKind::InvalidRequest,
    };
    CloudError {
        kind,
        message,
        retry_after,
    }
}

/// Whether `ip` is inside any of `subnets`.
pub(crate) fn in_subnets(ip: IpAddr, subnets: &[route_core::Cidr]) -> bool {
    subnets.iter().any(|s| s.contains(ip))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{AuthConfig, OpenStackConfig};

    #[test]
    fn classifies_neutron_answers() {
        let c = |code: u16, body: &str, ra: Option<u64>| {
            classify(
                StatusCode::from_u16(code).unwrap(),
                ra.map(Duration::from_secs),
                body.as_bytes(),
            )
        };
        let quota = c(
            409,
            r#"{"NeutronError": {"type": "OverQuota", "message": "Quota exceeded for resources: ['router_route'].", "detail": ""}}"#,
            None,
        );
        assert_eq!(quota.kind, ErrorKind::QuotaExceeded);
        assert!(quota.message.contains("router_route"), "{}", quota.message);
        let old_quota = c(
            400,
            r#"{"NeutronError": {"type": "RoutesExhausted", "message": "The number of routes exceeds the maximum 30.", "detail": ""}}"#,
            None,
        );
        assert_eq!(old_quota.kind, ErrorKind::QuotaExceeded);
        assert_eq!(
            c(
                400,
                r#"{"NeutronError": {"type": "AllowedAddressPairExhausted", "message": "The number of allowed address pair exceeds the maximum 10.", "detail": ""}}"#,
                None,
            )
            .kind,
            ErrorKind::TargetUnavailable
        );
        let rev = c(
            412,
            r#"{"NeutronError": {"type": "RevisionNumberConstraintFailed", "message": "Constrained to 1, but current revision is 3", "detail": ""}}"#,
            None,
        );
        assert_eq!(rev.kind, ErrorKind::Conflict);
        assert!(
            rev.message
                .starts_with("412 RevisionNumberConstraintFailed")
        );
        assert_eq!(
            c(
                409,
                r#"{"NeutronError": {"type": "RouterInUse", "message": "x"}}"#,
                None
            )
            .kind,
            ErrorKind::Conflict
        );
        let t = c(429, "slow down", Some(7));
        assert_eq!(
            (t.kind, t.retry_after),
            (ErrorKind::Throttled, Some(Duration::from_secs(7)))
        );
        assert_eq!(c(413, "", Some(3)).kind, ErrorKind::Throttled);
        assert_eq!(
            c(
                404,
                r#"{"NeutronError": {"type": "RouterNotFound", "message": "gone"}}"#,
                None
            )
            .kind,
            ErrorKind::NotFound
        );
        assert_eq!(
            c(
                400,
                r#"{"NeutronError": {"type": "InvalidRoutes", "message": "nexthop"}}"#,
                None
            )
            .kind,
            ErrorKind::InvalidRequest
        );
        assert_eq!(c(401, "", None).kind, ErrorKind::Permanent);
        assert_eq!(
            c(403, r#"{"error": {"message": "policy"}}"#, None).kind,
            ErrorKind::Permanent
        );
        assert_eq!(
            c(502, "<html>bad gateway</html>", None).kind,
            ErrorKind::Transient
        );
        assert_eq!(c(503, "", None).kind, ErrorKind::Transient);
    }

    #[test]
    fn token_requests_have_the_keystone_shape() {
        let mut c = OpenStackConfig::noauth("http://x", "r");
        c.auth_type = AuthType::Password;
        c.auth = AuthConfig {
            auth_url: "https://k/v3".into(),
            username: "u".into(),
            password: Secret::new("pw"),
            project_name: "p".into(),
            ..AuthConfig::default()
        };
        let b = token_request(&c);
        assert_eq!(b["auth"]["identity"]["methods"][0], "password");
        assert_eq!(b["auth"]["identity"]["password"]["user"]["name"], "u");
        assert_eq!(b["auth"]["identity"]["password"]["user"]["password"], "pw");
        assert_eq!(
            b["auth"]["identity"]["password"]["user"]["domain"]["name"],
            "Default"
        );
        assert_eq!(b["auth"]["scope"]["project"]["name"], "p");
        assert_eq!(b["auth"]["scope"]["project"]["domain"]["name"], "Default");

        c.auth_type = AuthType::V3ApplicationCredential;
        c.auth.application_credential_id = "ac".into();
        c.auth.application_credential_secret = Secret::new("sec");
        let b = token_request(&c);
        assert_eq!(
            b["auth"]["identity"]["methods"][0],
            "application_credential"
        );
        assert_eq!(b["auth"]["identity"]["application_credential"]["id"], "ac");
        assert_eq!(
            b["auth"]["identity"]["application_credential"]["secret"],
            "sec"
        );
        assert!(
            b["auth"]["scope"].is_null(),
            "application credentials carry their scope"
        );
    }

    #[test]
    fn finds_the_network_endpoint_in_the_catalog() {
        let doc = json!({"token": {"catalog": [
            {"type": "identity", "endpoints": [{"interface": "public", "region_id": "R1", "url": "http://k"}]},
            {"type": "network", "endpoints": [
                {"interface": "public", "region_id": "R1", "url": "https://net-r1-public"},
                {"interface": "internal", "region_id": "R1", "url": "http://net-r1-internal"},
                {"interface": "public", "region_id": "R2", "url": "https://net-r2-public"}
            ]}
        ]}});
        assert_eq!(
            catalog_endpoint(&doc, "public", "R2").unwrap(),
            "https://net-r2-public"
        );
        assert_eq!(
            catalog_endpoint(&doc, "internal", "").unwrap(),
            "http://net-r1-internal"
        );
        assert!(
            catalog_endpoint(&doc, "admin", "")
                .unwrap_err()
                .contains("admin")
        );
        assert!(catalog_endpoint(&json!({"token": {}}), "public", "").is_err());
    }

    #[test]
    fn normalises_urls_and_times() {
        assert_eq!(neutron_base("http://h:9696/"), "http://h:9696/v2.0");
        assert_eq!(neutron_base("http://h:9696/v2.0/"), "http://h:9696/v2.0");
        assert_eq!(keystone_base("https://k:5000"), "https://k:5000/v3");
        assert_eq!(keystone_base("https://k:5000/v3/"), "https://k:5000/v3");
        assert_eq!(unix_seconds("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(
            unix_seconds("2000-03-01T00:00:01.123456Z"),
            Some(951_868_801)
        );
        assert_eq!(unix_seconds("garbage"), None);
        let doc = json!({"token": {"issued_at": "2026-11-29T15:20:46.000000Z", "expires_at": "2026-11-29T16:20:46.000000Z"}});
        assert_eq!(token_lifetime(&doc), Some(Duration::from_secs(3600)));
    }
}
