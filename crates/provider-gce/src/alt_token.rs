//! A token endpoint of the operator's own (`token_url`, cloud-provider-gcp's
//! `[global] token-url` and `token-body`), as cloud-provider-gcp's
//! `AltTokenSource` uses it (`providers/gce/token_source.go`):
//! - a `POST` of `token_body` to `token_url`, authorized by the base
//!   credentials (there the metadata server's; here the Application Default
//!   Credentials, which on a VM are the metadata server's, or
//!   `credentials_file`);
//! - the answer is JSON `{"accessToken": "...", "expireTime": "<RFC 3339>"}`;
//! - the token is reused until shortly before it expires.
//!
//! A failure is the request's failure, with the endpoint's status and the
//! first bytes of its answer; the token itself is never logged.

use std::time::{Duration, SystemTime};

use google_cloud_auth::credentials::{
    CacheableResource, Credentials, CredentialsProvider, EntityTag,
};
use google_cloud_auth::errors::CredentialsError;
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, HeaderMap, HeaderValue};
use tokio::sync::Mutex;

/// How long before its expiry a token is asked for again.
const REFRESH_MARGIN: Duration = Duration::from_secs(60);
/// The most of an error answer quoted in the error.
const QUOTED: usize = 300;

/// A token from the endpoint, and until when it may be used.
#[derive(Debug, Clone)]
struct Token {
    headers: HeaderMap,
    tag: EntityTag,
    refresh_at: SystemTime,
}

/// Credentials whose token comes from `url`.
#[derive(Debug)]
pub struct AltToken {
    base: Credentials,
    http: reqwest::Client,
    url: String,
    body: String,
    timeout: Duration,
    current: Mutex<Option<Token>>,
}

impl AltToken {
    /// Tokens from `url` (`POST body`), the request authorized by `base`.
    pub fn new(base: Credentials, url: &str, body: &str, timeout: Duration) -> Self {
        Self {
            base,
            http: reqwest::Client::new(),
            url: url.to_string(),
            body: body.to_string(),
            timeout,
            current: Mutex::new(None),
        }
    }

    fn error(&self, transient: bool, what: impl std::fmt::Display) -> CredentialsError {
        CredentialsError::from_msg(transient, format!("token-url {}: {what}", self.url))
    }

    async fn fetch(&self) -> Result<Token, CredentialsError> {
        let base = match self.base.headers(http::Extensions::new()).await? {
            CacheableResource::New { data, .. } => data,
            // Asked without a tag, the base always answers new headers.
            CacheableResource::NotModified => HeaderMap::new(),
        };
        let mut req = self
            .http
            .post(&self.url)
            .timeout(self.timeout)
            .header(CONTENT_TYPE, "application/json")
            .body(self.body.clone());
        if let Some(auth) = base.get(AUTHORIZATION) {
            req = req.header(AUTHORIZATION, auth.clone());
        }
        let res = req
            .send()
            .await
            .map_err(|e| self.error(true, format!("request failed: {e}")))?;
        let status = res.status();
        let text = res
            .text()
            .await
            .map_err(|e| self.error(true, format!("reading the answer: {e}")))?;
        if !status.is_success() {
            let quoted: String = text.chars().take(QUOTED).collect();
            return Err(self.error(
                status.is_server_error() || status.as_u16() == 429,
                format!("answered {status}: {quoted}"),
            ));
        }
        #[derive(serde::Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Answer {
            access_token: String,
            expire_time: String,
        }
        // serde's message names the field, never the token.
        let a: Answer = serde_json::from_str(&text).map_err(|e| {
            self.error(
                false,
                format!("the answer is not {{\"accessToken\", \"expireTime\"}}: {e}"),
            )
        })?;
        if a.access_token.is_empty() {
            return Err(self.error(false, "the answer's accessToken is empty"));
        }
        let expiry = parse_rfc3339(&a.expire_time).ok_or_else(|| {
            self.error(
                false,
                format!("expireTime {:?} is not an RFC 3339 time", a.expire_time),
            )
        })?;
        let mut value = HeaderValue::from_str(&format!("Bearer {}", a.access_token))
            .map_err(|_| self.error(false, "the accessToken is not a header value"))?;
        value.set_sensitive(true);
        let mut headers = HeaderMap::new();
        headers.insert(AUTHORIZATION, value);
        Ok(Token {
            headers,
            tag: EntityTag::new(),
            refresh_at: expiry.checked_sub(REFRESH_MARGIN).unwrap_or(expiry),
        })
    }
}

impl CredentialsProvider for AltToken {
    async fn headers(
        &self,
        extensions: http::Extensions,
    ) -> Result<CacheableResource<HeaderMap>, CredentialsError> {
        let mut current = self.current.lock().await;
        let fresh = current
            .as_ref()
            .filter(|t| SystemTime::now() < t.refresh_at)
            .cloned();
        let token = match fresh {
            Some(t) => t,
            None => {
                let t = self.fetch().await?;
                *current = Some(t.clone());
                t
            }
        };
        if extensions.get::<EntityTag>() == Some(&token.tag) {
            return Ok(CacheableResource::NotModified);
        }
        Ok(CacheableResource::New {
            entity_tag: token.tag,
            data: token.headers,
        })
    }

    async fn universe_domain(&self) -> Option<String> {
        None
    }
}

/// `2026-12-02T10:00:00Z`, `2026-12-02T10:00:00.123456789+01:00`: the
/// instant, or `None`.
pub fn parse_rfc3339(s: &str) -> Option<SystemTime> {
    s.parse::<jiff::Timestamp>().ok().map(SystemTime::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: &str) -> Option<u64> {
        parse_rfc3339(s).map(|t| t.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs())
    }

    #[test]
    fn rfc3339_times_as_google_writes_them() {
        assert_eq!(secs("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(secs("2026-12-02T10:00:00Z"), Some(1_796_205_600));
        assert_eq!(secs("2026-12-02T11:00:00+01:00"), Some(1_796_205_600));
        assert_eq!(secs("2026-12-02T09:30:00.5-00:30"), Some(1_796_205_600));
        assert_eq!(secs("2024-02-29T00:00:00Z"), Some(1_709_164_800));
        let t = parse_rfc3339("2026-12-02T10:00:00.123456789Z").unwrap();
        assert_eq!(
            t.duration_since(SystemTime::UNIX_EPOCH)
                .unwrap()
                .subsec_nanos(),
            123_456_789
        );
        for bad in [
            "",
            "2026-12-02",
            "2026-13-02T10:00:00Z",
            "2026-12-02T25:00:00Z",
            "2026-12-02T10:00:00",
            "2026-12-02T10:00:00.x1Z",
            "tomorrow",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
    }
}
