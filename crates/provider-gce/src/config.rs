//! Configuration of the `gce` provider (`--cloud-config` for
//! `--cloud-provider gce`).
//!
//! Credentials are never part of this file: they come from Google's
//! Application Default Credentials chain (`GOOGLE_APPLICATION_CREDENTIALS`
//! naming a service-account key or a workload-identity-federation file, the
//! gcloud application-default login, or the metadata server on GCE and GKE
//! workload identity), or from the key file named by `credentials_file`.
//! Only the file's path is ever printed.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// `max_routes` unless set: the default static-routes quota of a project's
/// networks (Compute Engine's `ROUTES` quota).
pub const DEFAULT_MAX_ROUTES: usize = 300;

/// The public Compute Engine endpoint (the client's default).
pub const DEFAULT_ENDPOINT: &str = "https://compute.googleapis.com";

/// The environment variable the project is read from when `project` is unset.
pub const PROJECT_ENV: &str = "GOOGLE_CLOUD_PROJECT";

/// Settings of the GCE provider. `network` is required, and `project` unless
/// `GOOGLE_CLOUD_PROJECT` names it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GceConfig {
    /// The project the cluster's instances run in (`gce.conf` `project-id`).
    pub project: String,
    /// The VPC network whose routes are managed: its name (`gce.conf`
    /// `network-name`). Routes are global resources of the network's
    /// project; one network per cluster, as upstream.
    pub network: String,
    /// The project that owns the network when it is a Shared VPC host
    /// project (`gce.conf` `network-project-id`); routes are created there.
    /// Defaults to `project`.
    pub network_project: Option<String>,
    /// The API endpoint (default `https://compute.googleapis.com`; a Private
    /// Service Connect endpoint, or a test server).
    pub endpoint: String,
    /// A service-account key file (JSON). When unset the Application
    /// Default Credentials chain is used.
    pub credentials_file: Option<PathBuf>,
    /// A token endpoint of the operator's own (cloud-provider-gcp's
    /// `token-url`): every request's token is `POST`ed for there, with
    /// `token_body`, authorized by the credentials above (Application
    /// Default Credentials or `credentials_file`); it answers
    /// `{"accessToken", "expireTime"}`, as IAM Credentials'
    /// `generateAccessToken` does.
    pub token_url: Option<String>,
    /// The body sent to `token_url` (cloud-provider-gcp's `token-body`),
    /// e.g. `{"scope": ["https://www.googleapis.com/auth/compute"]}`.
    pub token_body: Option<String>,
    /// Send requests without credentials. Only for test servers; refused
    /// unless `endpoint` is set to something other than Google's.
    pub anonymous: bool,
    /// IPv6 routes: `None` (default) asks the network once at start
    /// (`enableUlaInternalIpv6`); `true` or `false` overrides that.
    pub ipv6: Option<bool>,
    /// The static-routes quota of the network, if known (default 300, the
    /// documented default per network), so the controller refuses locally
    /// what cannot fit; `0` means unknown.
    pub max_routes: usize,
    /// Route creations and deletions in flight at once (default 10).
    pub max_concurrent_operations: usize,
    /// Timeout of one HTTP request, in seconds (default 30).
    pub request_timeout_secs: u64,
    /// How long to wait for one insert or delete operation to finish, in
    /// seconds (default 300; route operations usually take 10-30 s).
    pub operation_timeout_secs: u64,
    /// How long one `globalOperations.wait` may block on the server, in
    /// seconds (default 60; the API returns by 2 minutes at the latest).
    pub operation_wait_secs: u64,
    /// The shortest pause between two reads of one operation, in
    /// milliseconds (default 1000, upstream's `operationPollInterval`), for
    /// when the server answers a wait at once without the operation done.
    pub operation_poll_min_ms: u64,
    /// Reads of operations per second and their burst (default 5 and 5,
    /// upstream's `operationPollRateLimiter`).
    pub operation_polls_per_second: f64,
    /// The burst of operation reads (default 5).
    pub operation_poll_burst: u32,
    /// The client's own budget for list, insert, delete and get requests,
    /// per minute (default 1200, under the documented 1,500 per minute per
    /// project of each quota group, leaving room for other tools).
    pub requests_per_minute: u32,
    /// The burst of that budget (default 100).
    pub burst: u32,
    /// The length of the API's rate-limit window, in seconds (default 60:
    /// Compute Engine's per-minute quotas refill at the minute boundary).
    /// After a `rateLimitExceeded` answer the client waits for the next
    /// boundary of this window.
    pub quota_window_secs: u64,
    /// Routes per `routes.list` page (default 500, the API's maximum).
    pub page_size: u32,
}

impl Default for GceConfig {
    fn default() -> Self {
        Self {
            project: String::new(),
            network: String::new(),
            network_project: None,
            endpoint: DEFAULT_ENDPOINT.to_string(),
            credentials_file: None,
            token_url: None,
            token_body: None,
            anonymous: false,
            ipv6: None,
            max_routes: DEFAULT_MAX_ROUTES,
            max_concurrent_operations: 10,
            request_timeout_secs: 30,
            operation_timeout_secs: 300,
            operation_wait_secs: 60,
            operation_poll_min_ms: 1000,
            operation_polls_per_second: 5.0,
            operation_poll_burst: 5,
            requests_per_minute: 1200,
            burst: 100,
            quota_window_secs: 60,
            page_size: 500,
        }
    }
}

/// Why the provider cannot start.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A required field is missing or a value is out of range.
    #[error("gce: {0}")]
    Invalid(String),
    /// The key file could not be read or parsed.
    #[error("gce: reading the credentials file {path}: {reason}")]
    CredentialsFile {
        /// The file.
        path: PathBuf,
        /// Why (never the file's contents).
        reason: String,
    },
    /// The client or its credentials could not be built.
    #[error("gce: building the Compute Engine client: {0}")]
    Client(String),
    /// The network could not be read at start.
    #[error("gce: reading network {network} of project {project}: {reason}")]
    Network {
        /// The project.
        project: String,
        /// The network.
        network: String,
        /// What the API answered.
        reason: String,
    },
}

impl GceConfig {
    /// A configuration for `network` in `project`, every other field at its default.
    pub fn for_network(project: impl Into<String>, network: impl Into<String>) -> Self {
        Self {
            project: project.into(),
            network: network.into(),
            ..Self::default()
        }
    }

    /// Fills `project` from `GOOGLE_CLOUD_PROJECT` when unset and checks the values.
    pub fn resolve(mut self) -> Result<Self, ConfigError> {
        if self.project.trim().is_empty()
            && let Ok(p) = std::env::var(PROJECT_ENV)
        {
            self.project = p;
        }
        self.project = self.project.trim().to_string();
        self.network = self.network.trim().to_string();
        self.validate()?;
        Ok(self)
    }

    /// Checks the values a file may get wrong.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.project.is_empty() {
            return Err(ConfigError::Invalid(format!(
                "`project` is required (or set {PROJECT_ENV})"
            )));
        }
        if self.network.is_empty() {
            return Err(ConfigError::Invalid(
                "`network` (the name of the VPC network) is required".into(),
            ));
        }
        if self.network.contains('/') {
            return Err(ConfigError::Invalid(format!(
                "`network` is the network's name, not a URL: {:?}",
                self.network
            )));
        }
        if !(self.endpoint.starts_with("http://") || self.endpoint.starts_with("https://")) {
            return Err(ConfigError::Invalid(format!(
                "`endpoint` must be an http(s) URL, got {:?}",
                self.endpoint
            )));
        }
        if self.anonymous && self.endpoint.trim_end_matches('/') == DEFAULT_ENDPOINT {
            return Err(ConfigError::Invalid(
                "`anonymous` is for test servers; Google's endpoint needs credentials".into(),
            ));
        }
        if let Some(url) = &self.token_url {
            if self.anonymous {
                return Err(ConfigError::Invalid(
                    "`anonymous` and `token_url` exclude each other: the token endpoint is asked with credentials".into(),
                ));
            }
            if !(url.starts_with("https://") || url.starts_with("http://")) {
                return Err(ConfigError::Invalid(format!(
                    "token_url {url:?} is not an http(s) URL"
                )));
            }
        } else if self.token_body.is_some() {
            return Err(ConfigError::Invalid(
                "token_body is sent only to a token_url: set token_url too, or remove token_body"
                    .into(),
            ));
        }
        if self.anonymous && self.credentials_file.is_some() {
            return Err(ConfigError::Invalid(
                "`anonymous` and `credentials_file` exclude each other".into(),
            ));
        }
        for (name, v) in [
            (
                "max_concurrent_operations",
                self.max_concurrent_operations as u64,
            ),
            ("request_timeout_secs", self.request_timeout_secs),
            ("operation_timeout_secs", self.operation_timeout_secs),
            ("operation_wait_secs", self.operation_wait_secs),
            ("requests_per_minute", u64::from(self.requests_per_minute)),
            ("burst", u64::from(self.burst)),
            ("operation_poll_burst", u64::from(self.operation_poll_burst)),
            ("quota_window_secs", self.quota_window_secs),
            ("page_size", u64::from(self.page_size)),
        ] {
            if v == 0 {
                return Err(ConfigError::Invalid(format!("`{name}` must be above zero")));
            }
        }
        if self.page_size > 500 {
            return Err(ConfigError::Invalid(
                "`page_size` is at most 500 (the API's maxResults limit)".into(),
            ));
        }
        if !(self.operation_polls_per_second.is_finite() && self.operation_polls_per_second > 0.0) {
            return Err(ConfigError::Invalid(
                "`operation_polls_per_second` must be above zero".into(),
            ));
        }
        Ok(())
    }

    /// The project that holds the network and its routes.
    pub fn routes_project(&self) -> &str {
        self.network_project
            .as_deref()
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .unwrap_or(&self.project)
    }

    pub(crate) fn request_timeout(&self) -> Duration {
        Duration::from_secs(self.request_timeout_secs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_follow_upstream_and_the_documented_limits() {
        let c: GceConfig = serde_json::from_str(r#"{"project": "p", "network": "k8s"}"#).unwrap();
        assert_eq!(c.endpoint, DEFAULT_ENDPOINT);
        assert_eq!(c.max_routes, 300);
        assert_eq!(c.operation_poll_min_ms, 1000);
        assert_eq!(c.operation_polls_per_second, 5.0);
        assert_eq!(c.quota_window_secs, 60);
        assert_eq!(c.routes_project(), "p");
        assert!(c.validate().is_ok());
        let shared = GceConfig {
            network_project: Some("host".into()),
            ..c
        };
        assert_eq!(shared.routes_project(), "host");
        assert!(serde_json::from_str::<GceConfig>(r#"{"netwrk": "x"}"#).is_err());
    }

    #[test]
    fn nonsense_is_refused_with_the_field_named() {
        let e = GceConfig::for_network("", "k8s").validate().unwrap_err();
        assert!(e.to_string().contains("`project`"), "{e}");
        let e = GceConfig::for_network("p", "").validate().unwrap_err();
        assert!(e.to_string().contains("`network`"), "{e}");
        let e = GceConfig::for_network("p", "projects/p/global/networks/k8s")
            .validate()
            .unwrap_err();
        assert!(e.to_string().contains("not a URL"), "{e}");
        let e = GceConfig {
            burst: 0,
            ..GceConfig::for_network("p", "k8s")
        }
        .validate()
        .unwrap_err();
        assert!(e.to_string().contains("`burst`"), "{e}");
        let e = GceConfig {
            anonymous: true,
            ..GceConfig::for_network("p", "k8s")
        }
        .validate()
        .unwrap_err();
        assert!(e.to_string().contains("anonymous"), "{e}");
        let e = GceConfig {
            page_size: 501,
            ..GceConfig::for_network("p", "k8s")
        }
        .validate()
        .unwrap_err();
        assert!(e.to_string().contains("page_size"), "{e}");
        for (bad, says) in [
            (
                GceConfig {
                    token_url: Some("http://127.0.0.1:1/token".into()),
                    anonymous: true,
                    endpoint: "http://127.0.0.1:2".into(),
                    ..GceConfig::for_network("p", "k8s")
                },
                "exclude each other",
            ),
            (
                GceConfig {
                    token_url: Some("iamcredentials.googleapis.com/v1".into()),
                    ..GceConfig::for_network("p", "k8s")
                },
                "not an http(s) URL",
            ),
            (
                GceConfig {
                    token_body: Some("{}".into()),
                    ..GceConfig::for_network("p", "k8s")
                },
                "set token_url too",
            ),
        ] {
            let e = bad.validate().unwrap_err().to_string();
            assert!(e.contains(says), "{e}");
        }
    }
}
