//! Configuration of the `hcloud` provider (`--cloud-config` for
//! `--cloud-provider hcloud`) and the API token.
//!
//! The token never comes from the configuration file itself: it is read from
//! `HCLOUD_TOKEN` or from the file named by `token_file` (a mounted Secret),
//! and it lives in a [`Token`] whose `Debug` and `Display` print a placeholder.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use provider_kit::Secret;
use serde::{Deserialize, Serialize};

/// The public API's base URL.
pub const DEFAULT_ENDPOINT: &str = "https://api.hetzner.cloud/v1";

/// The environment variable the token is read from when no `token_file` is set.
pub const TOKEN_ENV: &str = "HCLOUD_TOKEN";

/// Why one cluster's routes live in exactly one hcloud network: a network
/// route's gateway must be a server's private IP on that same network, and a
/// Node is one server attached to the network whose range holds its
/// InternalIP. A second network would need every Node attached to it as
/// well and a route per network pointing at a different address of the same
/// Node; hcloud routes are also slow, one asynchronous action at a time per
/// network, out of a project-wide hourly budget. So the provider manages one
/// network, `targets()` stays empty, and a second network is refused.
pub const ONE_NETWORK: &str = "hcloud manages the routes of exactly one network per cluster: a route's gateway must be a server's private IP on that network, so a second network cannot be routed to the same Nodes; set `network` to the one network the Nodes' InternalIPs are in";

/// `network` as a string, a number, or a one-element list; a longer list is
/// refused with [`ONE_NETWORK`].
fn one_network<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        Name(String),
        Id(u64),
        List(Vec<serde_json::Value>),
    }
    match OneOrMany::deserialize(d)? {
        OneOrMany::Name(s) => Ok(s),
        OneOrMany::Id(n) => Ok(n.to_string()),
        OneOrMany::List(v) => match v.as_slice() {
            [serde_json::Value::String(s)] => Ok(s.clone()),
            [serde_json::Value::Number(n)] => Ok(n.to_string()),
            [_, _, ..] => Err(serde::de::Error::custom(ONE_NETWORK)),
            _ => Err(serde::de::Error::custom(
                "`network` is the id or name of one network",
            )),
        },
    }
}

/// Settings of the Hetzner Cloud provider. Only `network` is required.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HcloudConfig {
    /// The private network whose routes are managed: its numeric id, or its
    /// name (resolved once with `GET /networks?name=`). Exactly one: a
    /// second network is refused (see [`ONE_NETWORK`]).
    #[serde(deserialize_with = "one_network")]
    pub network: String,
    /// Refused when given: a cluster's routes live in one network (see
    /// [`ONE_NETWORK`]). The key exists so that `networks: [...]` gets that
    /// explanation instead of "unknown field".
    #[serde(default, skip_serializing)]
    pub networks: Option<serde_json::Value>,
    /// The API base URL, ending in `/v1` (default `https://api.hetzner.cloud/v1`;
    /// tests point it at the fake server).
    pub endpoint: String,
    /// A file holding the API token; when unset the token comes from
    /// `HCLOUD_TOKEN`. Surrounding whitespace is ignored.
    pub token_file: Option<PathBuf>,
    /// The request budget this client allows itself per hour (default 3600,
    /// Hetzner's documented project limit; refilled evenly, one per second).
    /// Never set it above the project's real limit: the server's
    /// `RateLimit-Remaining` only ever lowers the budget.
    pub requests_per_hour: u32,
    /// Requests the client may send at once on a full budget (default 300,
    /// five minutes of refill: enough for a burst of node joins without
    /// spending the hour's budget the project shares with other tools).
    pub burst: u32,
    /// Requests left to other users of the project's budget (CSI driver,
    /// autoscaler, Terraform): once `RateLimit-Remaining` falls to this, the
    /// client sends only as fast as the budget refills (default 300).
    pub keep_in_reserve: u32,
    /// Read `RateLimit-*` headers to slow down before the shared budget is
    /// gone (default true; switching it off exists for tests that show why).
    pub use_rate_limit_headers: bool,
    /// Timeout of one HTTP request, in seconds (default 30).
    pub request_timeout_secs: u64,
    /// How long to wait for a route action to finish, in seconds (default 120).
    pub action_timeout_secs: u64,
    /// First pause before polling an action, in milliseconds (default 500, the
    /// interval hcloud-go uses); later pauses double up to `action_poll_max_ms`.
    pub action_poll_initial_ms: u64,
    /// Longest pause between two polls of one action, in milliseconds (default 4000).
    pub action_poll_max_ms: u64,
    /// The server list is fetched again for an unknown gateway or node at most
    /// this often, in seconds (default 30), so stale routes cannot cause a
    /// flood of `GET /servers`.
    pub server_refresh_min_interval_secs: u64,
}

impl Default for HcloudConfig {
    fn default() -> Self {
        Self {
            network: String::new(),
            networks: None,
            endpoint: DEFAULT_ENDPOINT.to_string(),
            token_file: None,
            requests_per_hour: 3600,
            burst: 300,
            keep_in_reserve: 300,
            use_rate_limit_headers: true,
            request_timeout_secs: 30,
            action_timeout_secs: 120,
            action_poll_initial_ms: 500,
            action_poll_max_ms: 4000,
            server_refresh_min_interval_secs: 30,
        }
    }
}

/// Why the provider cannot start.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// `network` is empty.
    #[error("hcloud: `network` (the id or name of the private network) is required")]
    MissingNetwork,
    /// A field is out of range.
    #[error("hcloud: {0}")]
    Invalid(String),
    /// Neither `token_file` nor `HCLOUD_TOKEN` gave a token.
    #[error("hcloud: no API token: set HCLOUD_TOKEN or `token_file`")]
    MissingToken,
    /// The token file could not be read.
    #[error("hcloud: reading the token file {path}")]
    TokenFile {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The HTTP client could not be built (TLS setup).
    #[error("hcloud: building the HTTP client: {0}")]
    Client(String),
}

impl HcloudConfig {
    /// A configuration for `network` with every other field at its default.
    pub fn for_network(network: impl Into<String>) -> Self {
        Self {
            network: network.into(),
            ..Self::default()
        }
    }

    /// Checks the values a file may get wrong.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.networks.is_some() {
            return Err(ConfigError::Invalid(format!(
                "`networks` is not a setting: {ONE_NETWORK}"
            )));
        }
        if self.network.trim().is_empty() {
            return Err(ConfigError::MissingNetwork);
        }
        if !(self.endpoint.starts_with("http://") || self.endpoint.starts_with("https://")) {
            return Err(ConfigError::Invalid(format!(
                "`endpoint` must be an http(s) URL, got {:?}",
                self.endpoint
            )));
        }
        for (name, v) in [
            ("requests_per_hour", u64::from(self.requests_per_hour)),
            ("burst", u64::from(self.burst)),
            ("request_timeout_secs", self.request_timeout_secs),
            ("action_timeout_secs", self.action_timeout_secs),
            ("action_poll_initial_ms", self.action_poll_initial_ms),
        ] {
            if v == 0 {
                return Err(ConfigError::Invalid(format!("`{name}` must be above zero")));
            }
        }
        Ok(())
    }

    /// The network as a numeric id, when it is one.
    pub fn network_id(&self) -> Option<u64> {
        self.network.trim().parse().ok()
    }

    pub(crate) fn request_timeout(&self) -> Duration {
        Duration::from_secs(self.request_timeout_secs)
    }

    pub(crate) fn per_second(&self) -> f64 {
        f64::from(self.requests_per_hour) / 3600.0
    }

    /// Reads the token from `token_file`, else from `HCLOUD_TOKEN`.
    pub fn load_token(&self) -> Result<Token, ConfigError> {
        match &self.token_file {
            Some(path) => Token::from_file(path),
            None => Token::from_env(),
        }
    }
}

/// The API token: a [`Secret`] that is never empty. Printing it in any way
/// shows a placeholder.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Token(Secret);

impl Token {
    /// Wraps a token (surrounding whitespace removed); empty is refused.
    pub fn new(token: impl Into<String>) -> Result<Self, ConfigError> {
        let t = token.into().trim().to_string();
        if t.is_empty() {
            return Err(ConfigError::MissingToken);
        }
        Ok(Self(Secret::new(t)))
    }

    /// Reads `HCLOUD_TOKEN`.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::new(std::env::var(TOKEN_ENV).map_err(|_| ConfigError::MissingToken)?)
    }

    /// Reads a token file.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::TokenFile {
            path: path.to_path_buf(),
            source,
        })?;
        Self::new(text)
    }

    pub(crate) fn secret(&self) -> &Secret {
        &self.0
    }

    #[cfg(test)]
    fn expose(&self) -> &str {
        self.0.expose()
    }
}

/// Kept for callers that print a configuration: never the value.
impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_the_documented_budget_and_files_override_them() {
        let c: HcloudConfig =
            serde_json::from_str(r#"{"network": "k8s", "burst": 20, "token_file": "/run/t"}"#)
                .unwrap();
        assert_eq!(c.requests_per_hour, 3600);
        assert_eq!(c.burst, 20);
        assert_eq!(c.endpoint, DEFAULT_ENDPOINT);
        assert_eq!(c.network_id(), None);
        assert!(c.validate().is_ok());
        assert_eq!(HcloudConfig::for_network(" 42 ").network_id(), Some(42));
        assert!(serde_json::from_str::<HcloudConfig>(r#"{"netwrk": "x"}"#).is_err());
    }

    #[test]
    fn a_second_network_is_refused_with_the_reason() {
        let e = serde_json::from_str::<HcloudConfig>(r#"{"network": ["a", "b"]}"#).unwrap_err();
        assert!(e.to_string().contains("exactly one network"), "{e}");
        let c: HcloudConfig =
            serde_json::from_str(r#"{"networks": ["a", "b"], "network": "a"}"#).unwrap();
        let e = c.validate().unwrap_err();
        assert!(e.to_string().contains("exactly one network"), "{e}");
        let c: HcloudConfig = serde_json::from_str(r#"{"network": ["k8s"]}"#).unwrap();
        assert_eq!(c.network, "k8s");
        let c: HcloudConfig = serde_json::from_str(r#"{"network": 42}"#).unwrap();
        assert_eq!(c.network_id(), Some(42));
    }

    #[test]
    fn nonsense_is_refused_with_the_field_named() {
        assert!(matches!(
            HcloudConfig::default().validate(),
            Err(ConfigError::MissingNetwork)
        ));
        let e = HcloudConfig {
            burst: 0,
            ..HcloudConfig::for_network("1")
        }
        .validate()
        .unwrap_err();
        assert!(e.to_string().contains("`burst`"), "{e}");
        let e = HcloudConfig {
            endpoint: "api.hetzner.cloud".into(),
            ..HcloudConfig::for_network("1")
        }
        .validate()
        .unwrap_err();
        assert!(e.to_string().contains("endpoint"), "{e}");
    }

    #[test]
    fn tokens_never_print() {
        let t = Token::new("  s3cr3t-token\n").unwrap();
        assert_eq!(t.expose(), "s3cr3t-token");
        assert!(!format!("{t:?} {t}").contains("s3cr3t"));
        assert!(matches!(Token::new(" \n"), Err(ConfigError::MissingToken)));
        let dir = std::env::temp_dir().join(format!("hcloud-token-{}", std::process::id()));
        std::fs::write(&dir, "file-token\n").unwrap();
        let cfg = HcloudConfig {
            token_file: Some(dir.clone()),
            ..HcloudConfig::for_network("1")
        };
        assert_eq!(cfg.load_token().unwrap().expose(), "file-token");
        std::fs::remove_file(&dir).unwrap();
        let e = cfg.load_token().unwrap_err();
        assert!(matches!(e, ConfigError::TokenFile { .. }), "{e}");
    }
}
