//! Configuration of the `azure` provider (`--cloud-config` for
//! `--cloud-provider azure`).
//!
//! The keys are the Azure cloud provider's own (`azure.json`, camelCase:
//! `tenantId`, `subscriptionId`, `resourceGroup`, `routeTableName`,
//! `aadClientId`, ...), so the file the cloud-controller-manager already
//! reads works here too. Keys this provider does not use (`loadBalancerSku`,
//! `vnetName`, ...) are accepted and ignored; their names, never their values,
//! are logged once at debug level.
//!
//! Secrets (`aadClientSecret`, `AZURE_CLIENT_SECRET`, the federated token)
//! live in a [`Secret`], whose `Debug` prints a placeholder.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// ARM's routes-per-route-table limit (Azure subscription and service
/// limits, "User-defined routes per route table": 1,000).
pub const DEFAULT_MAX_ROUTES: usize = 1000;

/// The Network API version the requests name.
pub const DEFAULT_API_VERSION: &str = "2024-05-01";

/// The instance metadata service, for managed identity.
pub const DEFAULT_IMDS_ENDPOINT: &str = "http://169.254.169.254";

/// Environment variables the workload identity webhook (and the Azure SDKs)
/// use.
pub mod env {
    /// The application (client) id.
    pub const CLIENT_ID: &str = "AZURE_CLIENT_ID";
    /// The tenant id.
    pub const TENANT_ID: &str = "AZURE_TENANT_ID";
    /// A client secret, when `aadClientSecret` is not in the file.
    pub const CLIENT_SECRET: &str = "AZURE_CLIENT_SECRET";
    /// The projected service-account token file for workload identity.
    pub const FEDERATED_TOKEN_FILE: &str = "AZURE_FEDERATED_TOKEN_FILE";
    /// The Microsoft Entra authority host.
    pub const AUTHORITY_HOST: &str = "AZURE_AUTHORITY_HOST";
}

/// A credential: printed as `***`, never logged.
#[derive(Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The value, for the one place that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// No value.
    pub fn is_empty(&self) -> bool {
        self.0.trim().is_empty()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_empty() { "\"\"" } else { "***" })
    }
}

/// Why a configuration cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The file does not parse.
    #[error("{0}")]
    Parse(String),
    /// A required key is missing or a value is out of range.
    #[error("{0}")]
    Invalid(String),
}

/// Settings of the Azure provider: the route table and how to authenticate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct AzureConfig {
    /// `AzurePublicCloud` (default), `AzureChinaCloud` or
    /// `AzureUSGovernmentCloud`: picks the default endpoints.
    pub cloud: String,
    /// The Microsoft Entra tenant (else `AZURE_TENANT_ID`).
    pub tenant_id: String,
    /// The subscription holding the route table. `subscription` is
    /// accepted too.
    #[serde(alias = "subscription")]
    pub subscription_id: String,
    /// The cluster's resource group.
    pub resource_group: String,
    /// The route table's resource group, when it is not `resourceGroup`.
    pub route_table_resource_group: String,
    /// The route table whose routes this controller manages.
    pub route_table_name: String,
    /// The application (client) id (else `AZURE_CLIENT_ID`).
    pub aad_client_id: String,
    /// The client secret (else `AZURE_CLIENT_SECRET`).
    pub aad_client_secret: Secret,
    /// Authenticate with the VM's managed identity (IMDS).
    pub use_managed_identity_extension: bool,
    /// The client id of a user-assigned managed identity.
    #[serde(rename = "userAssignedIdentityID", alias = "userAssignedIdentityId")]
    pub user_assigned_identity_id: String,
    /// Authenticate with workload identity: the projected service-account
    /// token is exchanged for an ARM token.
    pub use_federated_workload_identity_extension: bool,
    /// The projected token file (else `AZURE_FEDERATED_TOKEN_FILE`).
    pub aad_federated_token_file: Option<PathBuf>,
    /// ARM's base URL (default from `cloud`; tests point it at the fake).
    pub resource_manager_endpoint: String,
    /// The Microsoft Entra authority (else `AZURE_AUTHORITY_HOST`, else from
    /// `cloud`).
    pub active_directory_authority_host: String,
    /// The instance metadata service (managed identity).
    pub imds_endpoint: String,
    /// Name routes `<node>____<cidr without : . />` (upstream's dual-stack
    /// format), so a Node can have one route per pod CIDR. Off: the route
    /// name is the node name, one route per Node (upstream's single-stack
    /// format). Routes of either format are recognised as this cluster's.
    #[serde(rename = "ipv6DualStackEnabled")]
    pub ipv6_dual_stack_enabled: bool,
    /// The Nodes' subnets (this project's key, not upstream's). A route
    /// named for a Node that does not exist (any more) is this cluster's only
    /// when its next hop is inside one of them; empty: any next hop.
    pub node_subnets: Vec<route_core::Cidr>,
    /// Routes the table accepts (ARM: 1,000).
    pub max_routes: usize,
    /// How often a whole-table write is retried after a `412` (another
    /// writer changed the table) on a fresh read.
    pub max_conflict_retries: u32,
    /// Per-request timeout.
    pub request_timeout_seconds: u64,
    /// The poll interval of a long-running operation when ARM's answer has
    /// no `Retry-After`.
    pub operation_poll_interval_ms: u64,
    /// The longest a poll waits, whatever `Retry-After` asks.
    pub operation_poll_max_ms: u64,
    /// How long a long-running operation may take before the write counts
    /// as timed out.
    pub operation_timeout_seconds: u64,
    /// The Network API version.
    pub api_version: String,
    /// Client-side read budget per second (ARM's per-principal read bucket
    /// refills 25 per second).
    #[serde(rename = "cloudProviderRateLimitQPS")]
    pub cloud_provider_rate_limit_qps: f64,
    /// Client-side read burst (ARM's bucket: 250).
    pub cloud_provider_rate_limit_bucket: u32,
    /// Client-side write budget per second (ARM: 10 per second).
    #[serde(rename = "cloudProviderRateLimitQPSWrite")]
    pub cloud_provider_rate_limit_qps_write: f64,
    /// Client-side write burst (ARM: 200).
    pub cloud_provider_rate_limit_bucket_write: u32,
    /// Every other key of `azure.json`: accepted, not used.
    #[serde(flatten, skip_serializing)]
    pub ignored: BTreeMap<String, serde_json::Value>,
}

impl Default for AzureConfig {
    fn default() -> Self {
        Self {
            cloud: "AzurePublicCloud".into(),
            tenant_id: String::new(),
            subscription_id: String::new(),
            resource_group: String::new(),
            route_table_resource_group: String::new(),
            route_table_name: String::new(),
            aad_client_id: String::new(),
            aad_client_secret: Secret::default(),
            use_managed_identity_extension: false,
            user_assigned_identity_id: String::new(),
            use_federated_workload_identity_extension: false,
            aad_federated_token_file: None,
            resource_manager_endpoint: String::new(),
            active_directory_authority_host: String::new(),
            imds_endpoint: DEFAULT_IMDS_ENDPOINT.into(),
            ipv6_dual_stack_enabled: false,
            node_subnets: Vec::new(),
            max_routes: DEFAULT_MAX_ROUTES,
            max_conflict_retries: 5,
            request_timeout_seconds: 30,
            operation_poll_interval_ms: 1000,
            operation_poll_max_ms: 10_000,
            operation_timeout_seconds: 300,
            api_version: DEFAULT_API_VERSION.into(),
            cloud_provider_rate_limit_qps: 25.0,
            cloud_provider_rate_limit_bucket: 250,
            cloud_provider_rate_limit_qps_write: 10.0,
            cloud_provider_rate_limit_bucket_write: 200,
            ignored: BTreeMap::new(),
        }
    }
}

/// How the provider gets its ARM tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credential {
    /// OAuth 2.0 client credentials with a secret.
    ClientSecret {
        /// Tenant.
        tenant: String,
        /// Application id.
        client_id: String,
        /// The secret.
        secret: Secret,
    },
    /// Workload identity: the projected token file is the client assertion.
    WorkloadIdentity {
        /// Tenant.
        tenant: String,
        /// Application id.
        client_id: String,
        /// Re-read before every exchange (the kubelet rotates it).
        token_file: PathBuf,
    },
    /// The VM's managed identity through IMDS.
    ManagedIdentity {
        /// A user-assigned identity's client id, if any.
        client_id: Option<String>,
    },
}

fn or_env(value: &str, var: &str) -> String {
    if value.trim().is_empty() {
        std::env::var(var).unwrap_or_default()
    } else {
        value.trim().to_string()
    }
}

impl AzureConfig {
    /// Reads a YAML or JSON file (`azure.json` is valid YAML).
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_yaml(&text)
    }

    /// Parses YAML or JSON text.
    pub fn from_yaml(text: &str) -> Result<Self, ConfigError> {
        let c: Self =
            serde_yaml_ng::from_str(text).map_err(|e| ConfigError::Parse(e.to_string()))?;
        Ok(c)
    }

    /// The route table's resource group.
    pub fn table_resource_group(&self) -> &str {
        if self.route_table_resource_group.trim().is_empty() {
            &self.resource_group
        } else {
            &self.route_table_resource_group
        }
    }

    /// The ARM base URL without a trailing slash.
    pub fn arm_endpoint(&self) -> String {
        let e = if self.resource_manager_endpoint.trim().is_empty() {
            match self.cloud.to_ascii_lowercase().as_str() {
                "azurechinacloud" => "https://management.chinacloudapi.cn",
                "azureusgovernmentcloud" => "https://management.usgovcloudapi.net",
                _ => "https://management.azure.com",
            }
            .to_string()
        } else {
            self.resource_manager_endpoint.trim().to_string()
        };
        e.trim_end_matches('/').to_string()
    }

    /// The token audience: ARM's own URL (`.../.default` as scope).
    pub fn arm_scope(&self) -> String {
        format!("{}/.default", self.arm_endpoint())
    }

    /// The Microsoft Entra authority without a trailing slash.
    pub fn authority_host(&self) -> String {
        let configured = or_env(&self.active_directory_authority_host, env::AUTHORITY_HOST);
        let h = if configured.is_empty() {
            match self.cloud.to_ascii_lowercase().as_str() {
                "azurechinacloud" => "https://login.chinacloudapi.cn".to_string(),
                "azureusgovernmentcloud" => "https://login.microsoftonline.us".to_string(),
                _ => "https://login.microsoftonline.com".to_string(),
            }
        } else {
            configured
        };
        h.trim_end_matches('/').to_string()
    }

    /// The ARM path of the route table.
    pub fn table_path(&self) -> String {
        format!(
            "/subscriptions/{}/resourceGroups/{}/providers/Microsoft.Network/routeTables/{}",
            self.subscription_id.trim(),
            self.table_resource_group().trim(),
            self.route_table_name.trim()
        )
    }

    /// Per-request timeout.
    pub fn request_timeout(&self) -> Duration {
        Duration::from_secs(self.request_timeout_seconds.max(1))
    }

    /// The credential the settings and the environment name.
    pub fn credential(&self) -> Result<Credential, ConfigError> {
        let tenant = or_env(&self.tenant_id, env::TENANT_ID);
        let client_id = or_env(&self.aad_client_id, env::CLIENT_ID);
        if self.use_federated_workload_identity_extension {
            let token_file = self
                .aad_federated_token_file
                .clone()
                .or_else(|| std::env::var_os(env::FEDERATED_TOKEN_FILE).map(PathBuf::from))
                .ok_or_else(|| {
                    ConfigError::Invalid(format!(
                        "workload identity needs aadFederatedTokenFile or {}",
                        env::FEDERATED_TOKEN_FILE
                    ))
                })?;
            need(&tenant, "tenantId", env::TENANT_ID)?;
            need(&client_id, "aadClientId", env::CLIENT_ID)?;
            return Ok(Credential::WorkloadIdentity {
                tenant,
                client_id,
                token_file,
            });
        }
        if self.use_managed_identity_extension {
            let id = self.user_assigned_identity_id.trim();
            return Ok(Credential::ManagedIdentity {
                client_id: (!id.is_empty()).then(|| id.to_string()),
            });
        }
        let secret = if self.aad_client_secret.is_empty() {
            Secret::new(std::env::var(env::CLIENT_SECRET).unwrap_or_default())
        } else {
            self.aad_client_secret.clone()
        };
        need(&tenant, "tenantId", env::TENANT_ID)?;
        need(&client_id, "aadClientId", env::CLIENT_ID)?;
        if secret.is_empty() {
            return Err(ConfigError::Invalid(format!(
                "no credential: set aadClientSecret (or {}), useFederatedWorkloadIdentityExtension or useManagedIdentityExtension",
                env::CLIENT_SECRET
            )));
        }
        Ok(Credential::ClientSecret {
            tenant,
            client_id,
            secret,
        })
    }

    /// Checks what serde cannot.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (key, value) in [
            ("subscriptionId", &self.subscription_id),
            ("routeTableName", &self.route_table_name),
        ] {
            if value.trim().is_empty() {
                return Err(ConfigError::Invalid(format!("{key} is required")));
            }
        }
        if self.table_resource_group().trim().is_empty() {
            return Err(ConfigError::Invalid(
                "resourceGroup (or routeTableResourceGroup) is required".into(),
            ));
        }
        if self.max_routes == 0 {
            return Err(ConfigError::Invalid("maxRoutes must be at least 1".into()));
        }
        for (key, v) in [
            (
                "cloudProviderRateLimitQPS",
                self.cloud_provider_rate_limit_qps,
            ),
            (
                "cloudProviderRateLimitQPSWrite",
                self.cloud_provider_rate_limit_qps_write,
            ),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(ConfigError::Invalid(format!("{key} must be above 0")));
            }
        }
        if self.cloud_provider_rate_limit_bucket == 0
            || self.cloud_provider_rate_limit_bucket_write == 0
        {
            return Err(ConfigError::Invalid(
                "cloudProviderRateLimitBucket and cloudProviderRateLimitBucketWrite must be at least 1"
                    .into(),
            ));
        }
        self.credential().map(|_| ())
    }
}

fn need(value: &str, key: &str, var: &str) -> Result<(), ConfigError> {
    if value.trim().is_empty() {
        return Err(ConfigError::Invalid(format!(
            "{key} (or {var}) is required"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_azure_json_of_the_cloud_provider_is_read_as_is() {
        let c = AzureConfig::from_yaml(
            r#"{
              "cloud": "AzurePublicCloud",
              "tenantId": "t1",
              "subscriptionId": "s1",
              "aadClientId": "c1",
              "aadClientSecret": "very-secret",
              "resourceGroup": "rg",
              "location": "westeurope",
              "vnetName": "vnet",
              "routeTableName": "rt",
              "loadBalancerSku": "standard"
            }"#,
        )
        .unwrap();
        c.validate().unwrap();
        assert_eq!(
            c.table_path(),
            "/subscriptions/s1/resourceGroups/rg/providers/Microsoft.Network/routeTables/rt"
        );
        assert_eq!(c.arm_endpoint(), "https://management.azure.com");
        assert!(c.ignored.contains_key("vnetName"));
        let shown = format!("{c:?}");
        assert!(!shown.contains("very-secret"), "{shown}");
        assert!(matches!(
            c.credential().unwrap(),
            Credential::ClientSecret { .. }
        ));
    }

    #[test]
    fn subscription_is_an_alias_and_the_table_may_live_elsewhere() {
        let c = AzureConfig::from_yaml(
            "subscription: s\nresourceGroup: rg\nrouteTableResourceGroup: net\nrouteTableName: rt\nuseManagedIdentityExtension: true\nuserAssignedIdentityID: mi-1\n",
        )
        .unwrap();
        c.validate().unwrap();
        assert!(c.table_path().contains("/resourceGroups/net/"));
        assert_eq!(
            c.credential().unwrap(),
            Credential::ManagedIdentity {
                client_id: Some("mi-1".into())
            }
        );
    }

    #[test]
    fn missing_keys_are_named() {
        let e = AzureConfig::from_yaml("resourceGroup: rg\n")
            .unwrap()
            .validate()
            .unwrap_err();
        assert!(e.to_string().contains("subscriptionId"), "{e}");
        let c = AzureConfig::from_yaml(
            "subscriptionId: s\nresourceGroup: rg\nrouteTableName: rt\ntenantId: t\naadClientId: c\nuseFederatedWorkloadIdentityExtension: true\naadFederatedTokenFile: /var/run/token\n",
        )
        .unwrap();
        assert!(matches!(
            c.credential().unwrap(),
            Credential::WorkloadIdentity { .. }
        ));
    }
}
