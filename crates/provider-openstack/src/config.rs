//! The provider's configuration file (`--cloud-config`), in the spirit of a
//! `clouds.yaml` entry: the same key names for authentication, plus the
//! router and the provider's own knobs. Secrets may instead come from the
//! environment (`OS_PASSWORD`, `OS_APPLICATION_CREDENTIAL_SECRET`) so the file
//! can live in a ConfigMap.
//!
//! This module owns parsing and validation only; the files are read by
//! `ccm_config::load`, except the `clouds.yaml` a configuration names.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use provider_kit::Secret;
use route_core::Cidr;
use serde::Deserialize;

/// How the provider authenticates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum AuthType {
    /// Keystone v3 password authentication, scoped to a project.
    #[default]
    #[serde(alias = "v3password")]
    Password,
    /// Keystone v3 application credential (id or name, and secret).
    #[serde(alias = "application_credential", alias = "applicationcredential")]
    V3ApplicationCredential,
    /// No Keystone: call `endpoint` directly without a token (a Neutron with
    /// `auth_strategy = noauth`, as in tests).
    #[serde(alias = "none")]
    Noauth,
}

/// Which catalog endpoint of the network service to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Interface {
    /// The public endpoint.
    #[default]
    Public,
    /// The internal endpoint (typical from inside the cloud).
    Internal,
    /// The admin endpoint.
    Admin,
}

impl Interface {
    /// The catalog's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Interface::Public => "public",
            Interface::Internal => "internal",
            Interface::Admin => "admin",
        }
    }
}

/// How route changes are written to the router.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum UpdateMode {
    /// `add_extraroutes`/`remove_extraroutes` when the server lists the
    /// `extraroute-atomic` extension, else `whole_list`.
    #[default]
    Auto,
    /// Always `add_extraroutes`/`remove_extraroutes`.
    Atomic,
    /// Always a whole-list `PUT /v2.0/routers/{id}` guarded by the router's
    /// `revision_number` (`If-Match`), retried on 412.
    WholeList,
}

/// Keystone credentials (the `auth:` block of a `clouds.yaml` cloud).
#[derive(Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    /// Keystone URL, e.g. `https://keystone.example.com:5000/v3` (`/v3` is
    /// appended when missing).
    #[serde(default)]
    pub auth_url: String,
    /// User name (password auth; with `user_domain_*`).
    #[serde(default)]
    pub username: String,
    /// User id (password auth; instead of `username`).
    #[serde(default)]
    pub user_id: String,
    /// Password; or the `OS_PASSWORD` environment variable.
    #[serde(default)]
    pub password: Secret,
    /// Project name (password auth; with `project_domain_*`).
    #[serde(default)]
    pub project_name: String,
    /// Project id (password auth; instead of `project_name`).
    #[serde(default)]
    pub project_id: String,
    /// Domain name of the user (default `Default` when only names are given).
    #[serde(default)]
    pub user_domain_name: String,
    /// Domain id of the user.
    #[serde(default)]
    pub user_domain_id: String,
    /// Domain name of the project (default `Default` when only names are given).
    #[serde(default)]
    pub project_domain_name: String,
    /// Domain id of the project.
    #[serde(default)]
    pub project_domain_id: String,
    /// Application credential id.
    #[serde(default)]
    pub application_credential_id: String,
    /// Application credential name (needs `username`/`user_id` too).
    #[serde(default)]
    pub application_credential_name: String,
    /// Application credential secret; or `OS_APPLICATION_CREDENTIAL_SECRET`.
    #[serde(default)]
    pub application_credential_secret: Secret,
}

impl fmt::Debug for AuthConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AuthConfig")
            .field("auth_url", &self.auth_url)
            .field("username", &self.username)
            .field("user_id", &self.user_id)
            .field("password", &self.password)
            .field("project_name", &self.project_name)
            .field("project_id", &self.project_id)
            .field("user_domain_name", &self.user_domain_name)
            .field("user_domain_id", &self.user_domain_id)
            .field("project_domain_name", &self.project_domain_name)
            .field("project_domain_id", &self.project_domain_id)
            .field("application_credential_id", &self.application_credential_id)
            .field(
                "application_credential_name",
                &self.application_credential_name,
            )
            .field(
                "application_credential_secret",
                &self.application_credential_secret,
            )
            .finish()
    }
}

/// The client-side request budget.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimitConfig {
    /// Sustained requests per second to Keystone and Neutron together.
    #[serde(default = "default_rps")]
    pub requests_per_second: f64,
    /// Requests that may go out at once after a quiet period.
    #[serde(default = "default_burst")]
    pub burst: u32,
}

fn default_rps() -> f64 {
    10.0
}
fn default_burst() -> u32 {
    20
}

impl Default for RateLimitConfig {
    fn default() -> Self {
        Self {
            requests_per_second: default_rps(),
            burst: default_burst(),
        }
    }
}

/// The whole configuration file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpenStackConfig {
    /// `password` (default), `v3applicationcredential` or `noauth`.
    #[serde(default)]
    pub auth_type: AuthType,
    /// Keystone credentials; unused with `noauth`.
    #[serde(default)]
    pub auth: AuthConfig,
    /// Region of the network endpoint in the catalog; any region when empty.
    #[serde(default)]
    pub region_name: String,
    /// Catalog interface: `public` (default), `internal` or `admin`.
    #[serde(default)]
    pub interface: Interface,
    /// The Neutron endpoint, overriding the catalog; required with `noauth`.
    /// `/v2.0` is appended when missing.
    #[serde(default)]
    pub endpoint: Option<String>,
    /// With `noauth`: sent as `X-Project-Id` and used to narrow the router
    /// lookup by name. Ignored with Keystone (the token carries the project).
    #[serde(default)]
    pub project_id: Option<String>,
    /// A PEM file of CA certificates to trust in addition to the system's.
    #[serde(default)]
    pub cacert: Option<PathBuf>,
    /// Skip TLS certificate verification (never in production).
    #[serde(default)]
    pub insecure: bool,
    /// The router whose routes this controller manages: the same as a
    /// one-element `router_ids` (both may be given; the lists are joined).
    #[serde(default)]
    pub router_id: Option<String>,
    /// Several routers (e.g. one per availability zone or external network):
    /// every Node's route goes to each, and each router is written on its
    /// own, with its own revision and `If-Match`.
    #[serde(default)]
    pub router_ids: Vec<String>,
    /// Instead of `router_id`/`router_ids`: one router's name (must be unique).
    #[serde(default)]
    pub router_name: Option<String>,
    /// Subnets the Nodes' InternalIPs are in. A route whose next hop lies in
    /// one of them but matches no Node is a stale route of this cluster and
    /// is reported as a blackhole (so the controller deletes it when its
    /// destination is in the cluster CIDR). Routes to next hops outside them
    /// that match no Node are not this cluster's and are never listed.
    #[serde(default)]
    pub node_subnets: Vec<Cidr>,
    /// `auto` (default), `atomic` or `whole_list`.
    #[serde(default)]
    pub update_mode: UpdateMode,
    /// How often a whole-list update is retried after a 412 (revision
    /// conflict) before the conflict is returned to the controller.
    #[serde(default = "default_conflict_retries")]
    pub max_conflict_retries: u32,
    /// The router's route quota, if known (Neutron's default is 30 per
    /// router, `quota_router_route`); the controller warns before reaching it.
    #[serde(default)]
    pub max_routes: Option<usize>,
    /// Per-request timeout in seconds.
    #[serde(default = "default_timeout")]
    pub request_timeout_seconds: u64,
    /// The client-side request budget.
    #[serde(default)]
    pub rate_limit: RateLimitConfig,
    /// A `clouds.yaml` whose entry fills the credentials, region and
    /// interface left unset here (cloud.conf's `use-clouds` and
    /// `clouds-file`). Empty: `OS_CLIENT_CONFIG_FILE`, then `./clouds.yaml`,
    /// `~/.config/openstack/clouds.yaml`, `/etc/openstack/clouds.yaml`.
    #[serde(default)]
    pub clouds_file: Option<String>,
    /// The entry of `clouds_file` to use (else `OS_CLOUD`, else the file's
    /// only entry).
    #[serde(default)]
    pub cloud: Option<String>,
}

fn default_conflict_retries() -> u32 {
    5
}
fn default_timeout() -> u64 {
    30
}

/// Refuses upstream's node security group options (`manage-security-groups`,
/// `node-security-group` and the like, in any spelling) with the reason,
/// instead of serde's bare "unknown field": an operator porting an upstream
/// config must learn that the rules are theirs to keep.
fn refuse_security_groups(text: &str) -> Result<(), ConfigError> {
    let Ok(serde_yaml_ng::Value::Mapping(m)) = serde_yaml_ng::from_str(text) else {
        // Not a mapping: the typed parse reports it.
        return Ok(());
    };
    refuse_security_group_keys(m.keys().filter_map(|k| k.as_str()))
}

fn refuse_security_group_keys<'a>(keys: impl Iterator<Item = &'a str>) -> Result<(), ConfigError> {
    for key in keys {
        let k = key.to_ascii_lowercase().replace('-', "_");
        if k.contains("security_group") {
            return Err(ConfigError::Invalid(format!(
                "{key}: managing the Nodes' security groups is not supported; \
                 keep a rule that admits the pod CIDRs (or the cluster CIDR) on the Nodes' security group yourself \
                 (see the provider's README, Forwarding prerequisite)"
            )));
        }
    }
    Ok(())
}

/// A configuration that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The YAML does not match the schema.
    #[error("parsing the OpenStack cloud config: {0}")]
    Parse(String),
    /// A key is missing or contradicts another.
    #[error("OpenStack cloud config: {0}")]
    Invalid(String),
}

impl OpenStackConfig {
    /// A `noauth` configuration for a Neutron at `endpoint` (tests).
    pub fn noauth(endpoint: impl Into<String>, router_id: impl Into<String>) -> Self {
        Self {
            auth_type: AuthType::Noauth,
            auth: AuthConfig::default(),
            region_name: String::new(),
            interface: Interface::default(),
            endpoint: Some(endpoint.into()),
            project_id: None,
            cacert: None,
            insecure: false,
            router_id: Some(router_id.into()),
            router_ids: Vec::new(),
            router_name: None,
            node_subnets: Vec::new(),
            update_mode: UpdateMode::Auto,
            max_conflict_retries: default_conflict_retries(),
            max_routes: None,
            request_timeout_seconds: default_timeout(),
            rate_limit: RateLimitConfig::default(),
            clouds_file: None,
            cloud: None,
        }
    }

    /// Builds the configuration from an already parsed document (our YAML
    /// joined with a translated `cloud.conf`), reads the `clouds.yaml` it
    /// names (file I/O), fills secrets from the environment and validates.
    pub fn from_value(value: serde_json::Value) -> Result<Self, ConfigError> {
        if let serde_json::Value::Object(m) = &value {
            refuse_security_group_keys(m.keys().map(String::as_str))?;
        }
        let mut c: Self =
            serde_json::from_value(value).map_err(|e| ConfigError::Parse(e.to_string()))?;
        let env = |k: &str| std::env::var(k).ok();
        c.fill_from_clouds_yaml(&env)?;
        c.fill_from_env(env);
        c.validate()?;
        Ok(c)
    }

    /// Fills what is unset from the `clouds.yaml` entry `clouds_file` and
    /// `cloud` name, when `clouds_file` is set (explicit keys win, as in the
    /// openstack-cloud-controller-manager).
    pub fn fill_from_clouds_yaml(
        &mut self,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<(), ConfigError> {
        let Some(named) = &self.clouds_file else {
            return Ok(());
        };
        let path = if named.is_empty() {
            let home = env("HOME").map(|h| format!("{h}/.config/openstack/clouds.yaml"));
            env("OS_CLIENT_CONFIG_FILE")
                .into_iter()
                .chain(["clouds.yaml".to_string()])
                .chain(home)
                .chain(["/etc/openstack/clouds.yaml".to_string()])
                .find(|p| Path::new(p).is_file())
                .ok_or_else(|| {
                    ConfigError::Invalid(
                        "use-clouds: no clouds.yaml found (OS_CLIENT_CONFIG_FILE, ./clouds.yaml, ~/.config/openstack/clouds.yaml, /etc/openstack/clouds.yaml); set clouds-file".into(),
                    )
                })?
        } else {
            named.clone()
        };
        let text = std::fs::read_to_string(&path).map_err(|source| ConfigError::Read {
            path: PathBuf::from(&path),
            source,
        })?;
        let doc: serde_json::Value = serde_yaml_ng::from_str(&text)
            .map_err(|e| ConfigError::Parse(format!("{path}: {e}")))?;
        let clouds = doc
            .get("clouds")
            .and_then(|c| c.as_object())
            .ok_or_else(|| ConfigError::Invalid(format!("{path} has no `clouds:` mapping")))?;
        let name = match self.cloud.clone().or_else(|| env("OS_CLOUD")) {
            Some(n) => n,
            None if clouds.len() == 1 => clouds.keys().next().cloned().unwrap_or_default(),
            None => {
                return Err(ConfigError::Invalid(format!(
                    "{path} holds several clouds ({}); name one with cloud (or OS_CLOUD)",
                    clouds.keys().cloned().collect::<Vec<_>>().join(", ")
                )));
            }
        };
        let entry = clouds
            .get(&name)
            .ok_or_else(|| ConfigError::Invalid(format!("{path} has no cloud named {name:?}")))?;
        self.fill_from_cloud_entry(entry);
        Ok(())
    }

    fn fill_from_cloud_entry(&mut self, entry: &serde_json::Value) {
        let text = |v: Option<&serde_json::Value>| match v {
            Some(serde_json::Value::String(s)) if !s.is_empty() => Some(s.clone()),
            Some(serde_json::Value::Number(n)) => Some(n.to_string()),
            _ => None,
        };
        let auth = entry.get("auth");
        let from = |keys: &[&str]| keys.iter().find_map(|k| text(auth.and_then(|a| a.get(*k))));
        let a = &mut self.auth;
        let fill = |field: &mut String, keys: &[&str]| {
            if field.is_empty()
                && let Some(v) = from(keys)
            {
                *field = v;
            }
        };
        fill(&mut a.auth_url, &["auth_url"]);
        fill(&mut a.username, &["username"]);
        fill(&mut a.user_id, &["user_id"]);
        fill(&mut a.project_name, &["project_name", "tenant_name"]);
        fill(&mut a.project_id, &["project_id", "tenant_id"]);
        fill(
            &mut a.user_domain_name,
            &["user_domain_name", "domain_name"],
        );
        fill(&mut a.user_domain_id, &["user_domain_id", "domain_id"]);
        fill(
            &mut a.project_domain_name,
            &["project_domain_name", "domain_name"],
        );
        fill(
            &mut a.project_domain_id,
            &["project_domain_id", "domain_id"],
        );
        fill(
            &mut a.application_credential_id,
            &["application_credential_id"],
        );
        fill(
            &mut a.application_credential_name,
            &["application_credential_name"],
        );
        if a.password.is_empty()
            && let Some(p) = from(&["password"])
        {
            a.password = Secret::new(p);
        }
        if a.application_credential_secret.is_empty()
            && let Some(p) = from(&["application_credential_secret"])
        {
            a.application_credential_secret = Secret::new(p);
        }
        if self.region_name.is_empty()
            && let Some(r) = text(entry.get("region_name"))
        {
            self.region_name = r;
        }
        if self.interface == Interface::Public
            && let Some(i) = text(entry.get("interface"))
        {
            self.interface = match i.as_str() {
                "internal" => Interface::Internal,
                "admin" => Interface::Admin,
                _ => Interface::Public,
            };
        }
        if self.cacert.is_none()
            && let Some(c) = text(entry.get("cacert"))
        {
            self.cacert = Some(PathBuf::from(c));
        }
        if entry.get("verify") == Some(&serde_json::Value::Bool(false)) {
            self.insecure = true;
        }
        let a = &self.auth;
        if self.auth_type == AuthType::Password
            && a.password.is_empty()
            && !(a.application_credential_id.is_empty() && a.application_credential_name.is_empty())
        {
            self.auth_type = AuthType::V3ApplicationCredential;
        }
    }

    /// Parses YAML (JSON is YAML too), fills secrets from the environment and
    /// validates.
    pub fn from_yaml(text: &str) -> Result<Self, ConfigError> {
        refuse_security_groups(text)?;
        let mut c: Self =
            serde_yaml_ng::from_str(text).map_err(|e| ConfigError::Parse(e.to_string()))?;
        let env = |k: &str| std::env::var(k).ok();
        c.fill_from_clouds_yaml(&env)?;
        c.fill_from_env(env);
        c.validate()?;
        Ok(c)
    }

    /// Secrets left empty in the file come from the environment.
    pub fn fill_from_env(&mut self, env: impl Fn(&str) -> Option<String>) {
        if self.auth.password.is_empty()
            && let Some(p) = env("OS_PASSWORD")
        {
            self.auth.password = Secret::new(p);
        }
        if self.auth.application_credential_secret.is_empty()
            && let Some(s) = env("OS_APPLICATION_CREDENTIAL_SECRET")
        {
            self.auth.application_credential_secret = Secret::new(s);
        }
    }

    /// The configured router ids (`router_id` first, then `router_ids`,
    /// each once); empty when the router is configured by name.
    pub fn configured_routers(&self) -> Vec<String> {
        let mut ids: Vec<String> = Vec::new();
        for id in self.router_id.iter().chain(&self.router_ids) {
            if !ids.contains(id) {
                ids.push(id.clone());
            }
        }
        ids
    }

    /// Checks that the keys needed by `auth_type` are present.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: &str| Err(ConfigError::Invalid(m.to_string()));
        let by_id = self.router_id.is_some() || !self.router_ids.is_empty();
        match (by_id, &self.router_name) {
            (false, None) => return bad("set router_id or router_name (or router_ids)"),
            (true, Some(_)) => {
                return bad("set only one of router_id/router_ids and router_name");
            }
            (false, Some(n)) if n.trim().is_empty() => return bad("router_name is empty"),
            _ => {}
        }
        if self
            .router_id
            .iter()
            .chain(&self.router_ids)
            .any(|id| id.trim().is_empty())
        {
            return bad("router_id is empty");
        }
        // Written so that NaN is rejected too.
        if !self.rate_limit.requests_per_second.is_finite()
            || self.rate_limit.requests_per_second <= 0.0
        {
            return bad("rate_limit.requests_per_second must be positive");
        }
        if self.request_timeout_seconds == 0 {
            return bad("request_timeout_seconds must be positive");
        }
        let a = &self.auth;
        match self.auth_type {
            AuthType::Noauth => {
                if self.endpoint.as_deref().is_none_or(|e| e.trim().is_empty()) {
                    return bad("auth_type noauth needs endpoint (the Neutron URL)");
                }
            }
            AuthType::Password => {
                if a.auth_url.is_empty() {
                    return bad("auth.auth_url is required");
                }
                if a.username.is_empty() && a.user_id.is_empty() {
                    return bad("password auth needs auth.username or auth.user_id");
                }
                if a.password.is_empty() {
                    return bad("password auth needs auth.password or OS_PASSWORD");
                }
                if a.project_name.is_empty() && a.project_id.is_empty() {
                    return bad("password auth needs auth.project_name or auth.project_id");
                }
            }
            AuthType::V3ApplicationCredential => {
                if a.auth_url.is_empty() {
                    return bad("auth.auth_url is required");
                }
                if a.application_credential_secret.is_empty() {
                    return bad(
                        "application credential auth needs auth.application_credential_secret or OS_APPLICATION_CREDENTIAL_SECRET",
                    );
                }
                if a.application_credential_id.is_empty() {
                    if a.application_credential_name.is_empty() {
                        return bad(
                            "application credential auth needs auth.application_credential_id or auth.application_credential_name",
                        );
                    }
                    if a.username.is_empty() && a.user_id.is_empty() {
                        return bad(
                            "auth.application_credential_name needs auth.username or auth.user_id",
                        );
                    }
                }
            }
        }
        Ok(())
    }

    /// The per-request timeout.
    pub fn request_timeout(&self) -> Duration {
        Duration::from_secs(self.request_timeout_seconds)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWORD: &str = r#"
auth_type: password
auth:
  auth_url: https://keystone.example.com:5000/v3
  username: k8s
  password: hunter2
  project_name: demo
  user_domain_name: Default
  project_domain_name: Default
region_name: RegionOne
interface: internal
router_name: k8s-router
node_subnets: [10.0.0.0/16]
rate_limit: { requests_per_second: 2, burst: 4 }
"#;

    #[test]
    fn parses_a_password_config_and_never_prints_the_secret() {
        let c = OpenStackConfig::from_yaml(PASSWORD).unwrap();
        assert_eq!(c.auth_type, AuthType::Password);
        assert_eq!(c.interface, Interface::Internal);
        assert_eq!(c.router_name.as_deref(), Some("k8s-router"));
        assert_eq!(c.node_subnets, vec![Cidr::parse("10.0.0.0/16").unwrap()]);
        assert_eq!(c.rate_limit.burst, 4);
        assert_eq!(c.auth.password.expose(), "hunter2");
        let dbg = format!("{c:?}");
        assert!(!dbg.contains("hunter2"), "{dbg}");
        assert!(dbg.contains("<redacted>"), "{dbg}");
    }

    #[test]
    fn a_clouds_yaml_entry_fills_what_the_config_leaves_unset() {
        let dir = std::env::temp_dir().join(format!("crc-clouds-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("clouds.yaml");
        std::fs::write(
            &file,
            "clouds:\n  prod:\n    auth:\n      auth_url: https://keystone.example.com/v3\n      \
             application_credential_id: ac1\n      application_credential_secret: s3cret\n    \
             region_name: RegionTwo\n    interface: internal\n    verify: false\n  \
             other:\n    auth: {auth_url: https://elsewhere}\n",
        )
        .unwrap();
        let env = |_: &str| None;
        let mut c: OpenStackConfig = serde_yaml_ng::from_str(&format!(
            "clouds_file: {}\ncloud: prod\nregion_name: Explicit\nrouter_id: r\n",
            file.display()
        ))
        .unwrap();
        c.fill_from_clouds_yaml(&env).unwrap();
        c.validate().unwrap();
        assert_eq!(c.auth_type, AuthType::V3ApplicationCredential);
        assert_eq!(c.auth.auth_url, "https://keystone.example.com/v3");
        assert_eq!(c.auth.application_credential_secret.expose(), "s3cret");
        assert_eq!(
            c.region_name, "Explicit",
            "an explicit key wins over clouds.yaml"
        );
        assert_eq!(c.interface, Interface::Internal);
        assert!(c.insecure);
        // Two clouds and no name: refused with the names.
        let mut c: OpenStackConfig =
            serde_yaml_ng::from_str(&format!("clouds_file: {}\nrouter_id: r\n", file.display()))
                .unwrap();
        let e = c.fill_from_clouds_yaml(&env).unwrap_err().to_string();
        assert!(e.contains("other, prod"), "{e}");
        c.cloud = Some("missing".into());
        let e = c.fill_from_clouds_yaml(&env).unwrap_err().to_string();
        assert!(e.contains("no cloud named \"missing\""), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn secrets_come_from_the_environment_when_the_file_has_none() {
        let yaml = PASSWORD.replace("  password: hunter2\n", "");
        let mut c: OpenStackConfig = serde_yaml_ng::from_str(&yaml).unwrap();
        assert!(c.validate().is_err(), "no password anywhere");
        c.fill_from_env(|k| (k == "OS_PASSWORD").then(|| "from-env".to_string()));
        c.validate().unwrap();
        assert_eq!(c.auth.password.expose(), "from-env");
    }

    #[test]
    fn application_credentials_and_noauth_validate() {
        let ac = r#"
auth_type: v3applicationcredential
auth:
  auth_url: https://keystone.example.com/v3
  application_credential_id: abc
  application_credential_secret: s3cret
router_id: 5a1c
"#;
        let c = OpenStackConfig::from_yaml(ac).unwrap();
        assert_eq!(c.auth_type, AuthType::V3ApplicationCredential);
        assert!(!format!("{c:?}").contains("s3cret"));

        let e = OpenStackConfig::from_yaml("auth_type: noauth\nrouter_id: r\n").unwrap_err();
        assert!(e.to_string().contains("endpoint"), "{e}");
        let c = OpenStackConfig::from_yaml(
            "auth_type: none\nendpoint: http://127.0.0.1:9696\nrouter_id: r\n",
        )
        .unwrap();
        assert_eq!(c.auth_type, AuthType::Noauth);
    }

    #[test]
    fn router_id_is_a_one_element_router_ids_and_lists_join() {
        let c = OpenStackConfig::from_yaml("auth_type: noauth\nendpoint: http://x\nrouter_id: a\n")
            .unwrap();
        assert_eq!(c.configured_routers(), vec!["a".to_string()]);
        let c = OpenStackConfig::from_yaml(
            "auth_type: noauth\nendpoint: http://x\nrouter_id: a\nrouter_ids: [b, a, c]\n",
        )
        .unwrap();
        assert_eq!(c.configured_routers(), vec!["a", "b", "c"]);
        let c =
            OpenStackConfig::from_yaml("auth_type: noauth\nendpoint: http://x\nrouter_ids: [b]\n")
                .unwrap();
        assert_eq!(c.configured_routers(), vec!["b"]);
        for bad in [
            "auth_type: noauth\nendpoint: http://x\nrouter_ids: [b]\nrouter_name: n\n",
            "auth_type: noauth\nendpoint: http://x\nrouter_ids: [b, \" \"]\n",
        ] {
            assert!(
                OpenStackConfig::from_yaml(bad).is_err(),
                "{bad} was accepted"
            );
        }
    }

    #[test]
    fn upstream_node_security_group_options_are_refused_with_the_reason() {
        for key in [
            "manage_security_groups: true",
            "manage-security-groups: true",
            "node_security_group: 4b1c",
            "Node-Security-Group: 4b1c",
        ] {
            let yaml = format!("auth_type: noauth\nendpoint: http://x\nrouter_id: a\n{key}\n");
            let e = OpenStackConfig::from_yaml(&yaml).unwrap_err().to_string();
            assert!(e.contains("not supported"), "{key}: {e}");
            assert!(e.contains("security group"), "{key}: {e}");
        }
    }

    #[test]
    fn rejects_bad_configs_with_a_reason() {
        for (yaml, needle) in [
            (
                "auth_type: noauth\nendpoint: http://x\n",
                "router_id or router_name",
            ),
            (
                "auth_type: noauth\nendpoint: http://x\nrouter_id: a\nrouter_name: b\n",
                "only one",
            ),
            (
                "auth_type: noauth\nendpoint: http://x\nrouter_id: a\nbogus: 1\n",
                "bogus",
            ),
            ("auth_type: password\nrouter_id: a\n", "auth_url"),
            (
                "auth_type: noauth\nendpoint: http://x\nrouter_id: a\nnode_subnets: [nope]\n",
                "nope",
            ),
            (
                "auth_type: noauth\nendpoint: http://x\nrouter_id: a\nrate_limit: {requests_per_second: 0}\n",
                "positive",
            ),
        ] {
            let e = OpenStackConfig::from_yaml(yaml).unwrap_err().to_string();
            assert!(e.contains(needle), "{yaml}: {e}");
        }
    }
}
