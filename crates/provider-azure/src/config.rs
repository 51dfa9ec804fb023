//! Configuration of the `azure` provider (`--cloud-config` for
//! `--cloud-provider azure`).
//!
//! The keys are the Azure cloud provider's own (`azure.json`, camelCase:
//! `tenantId`, `subscriptionId`, `resourceGroup`, `routeTableName`,
//! `aadClientId`, ...), so the file the cloud-controller-manager already
//! reads works here too, read the way it reads it
//! (kubernetes-sigs/cloud-provider-azure `pkg/provider/config/azure.go`,
//! `pkg/azclient/auth.go`, `cloud.go`): keys match in any case, as Go's
//! `encoding/json` matches them (`tenantID` is `tenantId`); the workload
//! identity webhook's `AZURE_TENANT_ID`, `AZURE_CLIENT_ID` and
//! `AZURE_FEDERATED_TOKEN_FILE` win over the file; `cloud` is trimmed and
//! read in any case, with upstream's aliases. Keys the route code has no use
//! for (the load balancer's, `vnetName`, ...) are accepted; their names,
//! never their values, are logged once when the file is read, with why for
//! those that touch routes upstream. A credential setting that cannot be
//! honoured here (a client certificate, a network tenant of its own, a
//! managed identity named by resource ID) is refused, never dropped.
//!
//! Secrets (`aadClientSecret`, `AZURE_CLIENT_SECRET`, the federated token)
//! live in a [`Secret`], whose `Debug` prints a placeholder.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use provider_kit::Secret;
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
    /// `AzurePublicCloud` (default; also `AzureCloud`), `AzureChinaCloud`
    /// or `AzureUSGovernmentCloud` (also `AzureUSGovernment`), in any case
    /// and trimmed: picks the default endpoints. A name upstream does not
    /// know means the public cloud there and here, with a warning.
    pub cloud: String,
    /// The Microsoft Entra tenant (`AZURE_TENANT_ID` wins when set).
    pub tenant_id: String,
    /// The cluster's subscription. `subscription` is accepted too.
    #[serde(alias = "subscription")]
    pub subscription_id: String,
    /// The subscription holding the network resources, the route table
    /// among them, when it is not `subscriptionId`.
    #[serde(rename = "networkResourceSubscriptionID")]
    pub network_resource_subscription_id: String,
    /// The tenant of the network resources. Only the cluster's own tenant
    /// is supported: a different one is refused (upstream then signs with
    /// a second, auxiliary token, which this provider does not send).
    #[serde(rename = "networkResourceTenantID")]
    pub network_resource_tenant_id: String,
    /// The cluster's resource group.
    pub resource_group: String,
    /// The route table's resource group, when it is not `resourceGroup`.
    pub route_table_resource_group: String,
    /// The route table whose routes this controller manages.
    pub route_table_name: String,
    /// The application (client) id (`AZURE_CLIENT_ID` wins when set).
    pub aad_client_id: String,
    /// The client secret (else `AZURE_CLIENT_SECRET`).
    pub aad_client_secret: Secret,
    /// A client certificate (PKCS#12). Not supported: refused when it is
    /// the credential upstream would use.
    pub aad_client_cert_path: String,
    /// The certificate's password; read only to tell whether upstream would
    /// use the certificate.
    pub aad_client_cert_password: Secret,
    /// Where upstream reads its config from: `file`, `secret` or `merge`
    /// (its default). Only the file is read here, so `secret` is refused.
    pub cloud_config_type: String,
    /// Authenticate with the VM's managed identity (IMDS).
    pub use_managed_identity_extension: bool,
    /// The client id of a user-assigned managed identity.
    #[serde(rename = "userAssignedIdentityID")]
    pub user_assigned_identity_id: String,
    /// Authenticate with workload identity: the projected service-account
    /// token is exchanged for an ARM token. `AZURE_FEDERATED_TOKEN_FILE`
    /// set turns it on too, as upstream.
    pub use_federated_workload_identity_extension: bool,
    /// The projected token file (`AZURE_FEDERATED_TOKEN_FILE` wins when set).
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
    /// What reading the file noticed (a key spelled twice), for [`AzureConfig::notes`].
    #[serde(skip)]
    pub read_notes: Vec<String>,
}

impl Default for AzureConfig {
    fn default() -> Self {
        Self {
            cloud: "AzurePublicCloud".into(),
            tenant_id: String::new(),
            subscription_id: String::new(),
            network_resource_subscription_id: String::new(),
            network_resource_tenant_id: String::new(),
            resource_group: String::new(),
            route_table_resource_group: String::new(),
            route_table_name: String::new(),
            aad_client_id: String::new(),
            aad_client_secret: Secret::default(),
            aad_client_cert_path: String::new(),
            aad_client_cert_password: Secret::default(),
            cloud_config_type: String::new(),
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
            read_notes: Vec::new(),
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
    /// OAuth 2.0 client credentials with a certificate: each request
    /// carries a client assertion signed with its key.
    ClientCertificate {
        /// Tenant.
        tenant: String,
        /// Application id.
        client_id: String,
        /// The certificate and key of `aadClientCertPath`.
        certificate: crate::client_cert::ClientCertificate,
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
        /// A user-assigned identity's resource ID
        /// (`/subscriptions/…/providers/Microsoft.ManagedIdentity/userAssignedIdentities/<name>`),
        /// if named that way instead.
        resource_id: Option<String>,
    },
}

/// Every key of this schema as `azure.json` spells it, so a key written in
/// another case (`tenantID`, `TenantId`) is matched as upstream's Go
/// `encoding/json` matches it.
pub const KEYS: &[&str] = &[
    "cloud",
    "tenantId",
    "subscriptionId",
    "subscription",
    "networkResourceSubscriptionID",
    "networkResourceTenantID",
    "resourceGroup",
    "routeTableResourceGroup",
    "routeTableName",
    "aadClientId",
    "aadClientSecret",
    "aadClientCertPath",
    "aadClientCertPassword",
    "cloudConfigType",
    "useManagedIdentityExtension",
    "userAssignedIdentityID",
    "useFederatedWorkloadIdentityExtension",
    "aadFederatedTokenFile",
    "resourceManagerEndpoint",
    "activeDirectoryAuthorityHost",
    "imdsEndpoint",
    "ipv6DualStackEnabled",
    "nodeSubnets",
    "maxRoutes",
    "maxConflictRetries",
    "requestTimeoutSeconds",
    "operationPollIntervalMs",
    "operationPollMaxMs",
    "operationTimeoutSeconds",
    "apiVersion",
    "cloudProviderRateLimitQPS",
    "cloudProviderRateLimitBucket",
    "cloudProviderRateLimitQPSWrite",
    "cloudProviderRateLimitBucketWrite",
];

/// Keys upstream's route code reads that have no effect here, with why
/// (cloud-provider-azure `pkg/provider/azure_routes.go`,
/// `pkg/provider/config/azure.go`).
pub const ROUTE_KEYS_WITHOUT_EFFECT: &[(&str, &str)] = &[
    (
        "routeUpdateIntervalInSeconds",
        "changes are written as one table PUT per reconcile pass, not on a timer of their own",
    ),
    (
        "routeUpdateWaitingInSeconds",
        "changes are written as one table PUT per reconcile pass, not on a timer of their own",
    ),
    (
        "routeTableCacheTTLInSeconds",
        "the table is read as the reconcile mode says, not from a cache with a TTL",
    ),
    (
        "location",
        "upstream creates a missing route table there; this controller never creates the table, it must exist",
    ),
    (
        "tags",
        "upstream tags the route table; this controller never changes the table's tags",
    ),
    (
        "tagsMap",
        "upstream tags the route table; this controller never changes the table's tags",
    ),
    (
        "systemTags",
        "upstream tags the route table; this controller never changes the table's tags",
    ),
    (
        "useInstanceMetadata",
        "the next hop is each Node's InternalIP from its status, not read from the VM",
    ),
    (
        "vmType",
        "the next hop is each Node's InternalIP from its status, not read from the VM or scale set",
    ),
    (
        "vnetName",
        "the route code does not use it (upstream neither)",
    ),
    (
        "vnetResourceGroup",
        "the route code does not use it (upstream neither)",
    ),
    (
        "subnetName",
        "the route code does not use it (upstream neither)",
    ),
    (
        "cloudProviderRateLimit",
        "the client-side budgets (cloudProviderRateLimitQPS and the rest) always apply here",
    ),
];

/// Upstream reads the endpoints of another cloud from the file this
/// variable names (`pkg/azclient/cloud.go`).
pub const ENVIRONMENT_FILEPATH: &str = "AZURE_ENVIRONMENT_FILEPATH";

/// The cloud `cloud` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AzureCloud {
    /// `AzurePublicCloud`, `AzureCloud`, empty, or a name upstream does not
    /// know (it falls back to the public cloud too).
    Public,
    /// `AzureChinaCloud`.
    China,
    /// `AzureUSGovernment` or `AzureUSGovernmentCloud`.
    UsGovernment,
}

impl AzureCloud {
    /// `cloud` as upstream reads it (trimmed, any case); `None` for a name
    /// it does not know, which upstream takes for the public cloud.
    pub fn from_name(name: &str) -> Option<Self> {
        match name.trim().to_ascii_uppercase().as_str() {
            "" | "AZUREPUBLICCLOUD" | "AZURECLOUD" => Some(Self::Public),
            "AZURECHINACLOUD" => Some(Self::China),
            "AZUREUSGOVERNMENT" | "AZUREUSGOVERNMENTCLOUD" => Some(Self::UsGovernment),
            _ => None,
        }
    }
}

/// The environment, as a lookup (tests pass their own).
pub type Env<'a> = &'a dyn Fn(&str) -> Option<String>;

fn process_env(var: &str) -> Option<String> {
    std::env::var(var).ok()
}

fn set(v: Option<String>) -> Option<String> {
    v.map(|v| v.trim().to_string()).filter(|v| !v.is_empty())
}

/// Upstream's order for the workload identity webhook's variables: the
/// variable, when set, wins over the file.
fn env_first(value: &str, var: &str, vars: Env<'_>) -> String {
    set(vars(var)).unwrap_or_else(|| value.trim().to_string())
}

fn or_env(value: &str, var: &str) -> String {
    if value.trim().is_empty() {
        std::env::var(var).unwrap_or_default()
    } else {
        value.trim().to_string()
    }
}

/// Renames every top-level key that matches a key of [`KEYS`] in another
/// case to that key's spelling. Two spellings of one key: the later wins,
/// as in `encoding/json`, and a note says so.
fn canonical_keys(
    doc: serde_yaml_ng::Value,
) -> Result<(serde_yaml_ng::Value, Vec<String>), ConfigError> {
    use serde_yaml_ng::Value;
    let map = match doc {
        Value::Null => return Ok((Value::Mapping(Default::default()), Vec::new())),
        Value::Mapping(m) => m,
        _ => {
            return Err(ConfigError::Parse(
                "the Azure cloud config must be a mapping of keys (azure.json is one JSON object)"
                    .into(),
            ));
        }
    };
    let mut out = serde_yaml_ng::Mapping::new();
    let mut written: BTreeMap<String, String> = BTreeMap::new();
    let mut notes = Vec::new();
    for (k, v) in map {
        let Value::String(key) = k else {
            return Err(ConfigError::Parse(format!(
                "a key of the Azure cloud config is not a string: {k:?}"
            )));
        };
        let canonical = KEYS
            .iter()
            .find(|known| known.eq_ignore_ascii_case(&key))
            .map_or_else(|| key.clone(), |k| (*k).to_string());
        let folded = canonical.to_ascii_lowercase();
        if let Some(first) = written.insert(folded.clone(), key.clone()) {
            notes.push(format!(
                "{first} and {key} are one key written twice; the later, {key}, is used (as upstream)"
            ));
            let stale: Vec<Value> = out
                .keys()
                .filter(|k| k.as_str().is_some_and(|s| s.eq_ignore_ascii_case(&folded)))
                .cloned()
                .collect();
            for k in stale {
                out.remove(&k);
            }
        }
        out.insert(Value::String(canonical), v);
    }
    Ok((Value::Mapping(out), notes))
}

impl AzureConfig {
    /// Reads a YAML or JSON file (`azure.json` is valid YAML) and logs once
    /// which of its keys have no effect here.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let c = Self::from_yaml(&text)?;
        let (route, other) = c.notes();
        for note in route {
            tracing::warn!(file = %path.display(), "{note}");
        }
        if !other.is_empty() {
            // Names only: a value may be a secret.
            tracing::info!(file = %path.display(), keys = ?other, "azure cloud config keys the route controller does not read (load balancer, node and other controllers' settings)");
        }
        Ok(c)
    }

    /// Parses YAML or JSON text, matching keys in any case.
    pub fn from_yaml(text: &str) -> Result<Self, ConfigError> {
        let doc: serde_yaml_ng::Value =
            serde_yaml_ng::from_str(text).map_err(|e| ConfigError::Parse(e.to_string()))?;
        let (doc, notes) = canonical_keys(doc)?;
        let mut c: Self =
            serde_yaml_ng::from_value(doc).map_err(|e| ConfigError::Parse(e.to_string()))?;
        c.read_notes = notes;
        Ok(c)
    }

    /// What the file says that has no effect here: notes on keys upstream's
    /// route code reads (one line each, with why), and the names of the
    /// other keys nothing here reads.
    pub fn notes(&self) -> (Vec<String>, Vec<String>) {
        let mut route = self.read_notes.clone();
        if AzureCloud::from_name(&self.cloud).is_none() {
            route.push(format!(
                "cloud: {:?} is not a cloud upstream knows; the public cloud's endpoints are used, as upstream does",
                self.cloud
            ));
        }
        if self.cloud_config_type.trim().eq_ignore_ascii_case("merge") {
            route.push(
                "cloudConfigType: merge: only this file is read here, not upstream's Secret (--cloud-config-secret-name); give the merged result as the file"
                    .into(),
            );
        }
        let mut other = Vec::new();
        for key in self.ignored.keys() {
            match ROUTE_KEYS_WITHOUT_EFFECT
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(key))
            {
                Some((_, why)) => route.push(format!("{key}: {why}")),
                None => other.push(key.clone()),
            }
        }
        (route, other)
    }

    /// The cloud `cloud` names.
    pub fn azure_cloud(&self) -> AzureCloud {
        AzureCloud::from_name(&self.cloud).unwrap_or(AzureCloud::Public)
    }

    /// The subscription that holds the route table.
    pub fn table_subscription(&self) -> &str {
        if self.network_resource_subscription_id.trim().is_empty() {
            self.subscription_id.trim()
        } else {
            self.network_resource_subscription_id.trim()
        }
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
            match self.azure_cloud() {
                AzureCloud::China => "https://management.chinacloudapi.cn",
                AzureCloud::UsGovernment => "https://management.usgovcloudapi.net",
                AzureCloud::Public => "https://management.azure.com",
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
            match self.azure_cloud() {
                AzureCloud::China => "https://login.chinacloudapi.cn",
                AzureCloud::UsGovernment => "https://login.microsoftonline.us",
                AzureCloud::Public => "https://login.microsoftonline.com",
            }
            .to_string()
        } else {
            configured
        };
        h.trim_end_matches('/').to_string()
    }

    /// The ARM path of the route table.
    pub fn table_path(&self) -> String {
        format!(
            "/subscriptions/{}/resourceGroups/{}/providers/Microsoft.Network/routeTables/{}",
            self.table_subscription(),
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
        self.credential_in(&process_env)
    }

    /// [`AzureConfig::credential`] with `env` as the environment. The order
    /// is upstream's (`pkg/azclient/auth.go`): `AZURE_TENANT_ID` and
    /// `AZURE_CLIENT_ID` win over the file, `AZURE_FEDERATED_TOKEN_FILE`
    /// turns workload identity on; then workload identity, managed identity,
    /// client secret, client certificate.
    pub fn credential_in(&self, vars: Env<'_>) -> Result<Credential, ConfigError> {
        let tenant = env_first(&self.tenant_id, env::TENANT_ID, vars);
        let client_id = env_first(&self.aad_client_id, env::CLIENT_ID, vars);
        let network_tenant = self.network_resource_tenant_id.trim();
        if !network_tenant.is_empty() && !network_tenant.eq_ignore_ascii_case(&tenant) {
            return Err(ConfigError::Invalid(format!(
                "networkResourceTenantID {network_tenant:?} differs from tenantId {tenant:?}: a route table in another tenant (upstream's auxiliary token) is not supported here"
            )));
        }
        let federated_file = set(vars(env::FEDERATED_TOKEN_FILE));
        if self.use_federated_workload_identity_extension || federated_file.is_some() {
            let token_file = federated_file
                .map(PathBuf::from)
                .or_else(|| self.aad_federated_token_file.clone())
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
            // Upstream's rule (`pkg/azclient/auth.go`): an id that names a
            // subscription is a resource ID, anything else a client ID.
            if id.to_ascii_uppercase().contains("/SUBSCRIPTIONS/") {
                if !id
                    .to_ascii_lowercase()
                    .contains("/providers/microsoft.managedidentity/userassignedidentities/")
                {
                    return Err(ConfigError::Invalid(format!(
                        "userAssignedIdentityID {id:?} names a resource that is no user-assigned identity                          (/subscriptions/<id>/resourceGroups/<group>/providers/Microsoft.ManagedIdentity/userAssignedIdentities/<name>)"
                    )));
                }
                return Ok(Credential::ManagedIdentity {
                    client_id: None,
                    resource_id: Some(id.to_string()),
                });
            }
            return Ok(Credential::ManagedIdentity {
                client_id: (!id.is_empty()).then(|| id.to_string()),
                resource_id: None,
            });
        }
        let secret = if self.aad_client_secret.is_blank() {
            Secret::new(vars(env::CLIENT_SECRET).unwrap_or_default())
        } else {
            self.aad_client_secret.clone()
        };
        let cert_path = self.aad_client_cert_path.trim();
        if secret.is_blank() && !cert_path.is_empty() {
            need(&tenant, "tenantId", env::TENANT_ID)?;
            need(&client_id, "aadClientId", env::CLIENT_ID)?;
            let certificate = crate::client_cert::ClientCertificate::load(
                Path::new(cert_path),
                self.aad_client_cert_password.expose(),
            )
            .map_err(|e| ConfigError::Invalid(format!("aadClientCertPath: {e}")))?;
            return Ok(Credential::ClientCertificate {
                tenant,
                client_id,
                certificate,
            });
        }
        need(&tenant, "tenantId", env::TENANT_ID)?;
        need(&client_id, "aadClientId", env::CLIENT_ID)?;
        if secret.is_blank() {
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
        self.validate_in(&process_env)
    }

    /// The checks of [`AzureConfig::validate`] that read the environment.
    pub fn validate_in(&self, vars: Env<'_>) -> Result<(), ConfigError> {
        match self.cloud_config_type.trim().to_ascii_lowercase().as_str() {
            "" | "file" | "merge" => {}
            "secret" => {
                return Err(ConfigError::Invalid(
                    "cloudConfigType: secret: upstream reads its config from a Secret then; only the file is read here: give the Secret's cloud-config as the file and drop cloudConfigType"
                        .into(),
                ));
            }
            other => {
                return Err(ConfigError::Invalid(format!(
                    "cloudConfigType {other:?} is none of file, secret, merge"
                )));
            }
        }
        if set(vars(ENVIRONMENT_FILEPATH)).is_some() {
            return Err(ConfigError::Invalid(format!(
                "{ENVIRONMENT_FILEPATH} is set: the endpoints of a cloud described by a file (Azure Stack) are not read from it here; set resourceManagerEndpoint and activeDirectoryAuthorityHost in the config and unset the variable"
            )));
        }
        self.credential_in(vars).map(|_| ())
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
                client_id: Some("mi-1".into()),
                resource_id: None,
            }
        );
    }

    // Upstream takes an id naming a subscription as the identity's resource
    // ID (azidentity.ResourceID), which IMDS takes as `msi_res_id`.
    #[test]
    fn a_user_assigned_identity_may_be_named_by_its_resource_id() {
        let id = "/subscriptions/s/resourceGroups/rg/providers/Microsoft.ManagedIdentity/userAssignedIdentities/routes";
        let c = AzureConfig::from_yaml(&format!(
            "subscriptionId: s\nresourceGroup: rg\nrouteTableName: rt\nuseManagedIdentityExtension: true\nuserAssignedIdentityID: {id}\n"
        ))
        .unwrap();
        assert_eq!(
            c.credential().unwrap(),
            Credential::ManagedIdentity {
                client_id: None,
                resource_id: Some(id.into()),
            }
        );
        let e = AzureConfig::from_yaml(
            "subscriptionId: s\nresourceGroup: rg\nrouteTableName: rt\nuseManagedIdentityExtension: true\n\
             userAssignedIdentityID: /subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/vm\n",
        )
        .unwrap()
        .credential()
        .unwrap_err();
        assert!(e.to_string().contains("no user-assigned identity"), "{e}");
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

    /// An azure.json shaped like the example of cloud-provider-azure's
    /// "Cloud Provider Config" page (`content/en/install/configs.md`):
    /// credentials, the cluster's network, load-balancer settings.
    const CCM_DOCS_SHAPE: &str = r#"{
        "cloud": "AzurePublicCloud",
        "tenantID": "00000000-0000-0000-0000-00000000000a",
        "subscriptionId": "00000000-0000-0000-0000-00000000000b",
        "aadClientId": "00000000-0000-0000-0000-00000000000c",
        "aadClientSecret": "docs-secret-value",
        "resourceGroup": "cluster-rg",
        "location": "eastus",
        "subnetName": "k8s-subnet",
        "securityGroupName": "k8s-nsg",
        "securityGroupResourceGroup": "cluster-rg",
        "vnetName": "k8s-vnet",
        "vnetResourceGroup": "",
        "routeTableName": "k8s-routes",
        "primaryAvailabilitySetName": "agentpool-as",
        "cloudProviderBackoff": true,
        "cloudProviderBackoffRetries": 6,
        "cloudProviderBackoffDuration": 5,
        "cloudProviderRateLimit": true,
        "cloudProviderRateLimitQPS": 6,
        "cloudProviderRateLimitBucket": 20,
        "useManagedIdentityExtension": false,
        "userAssignedIdentityID": "",
        "useInstanceMetadata": true,
        "loadBalancerSku": "Standard",
        "excludeMasterFromStandardLB": false,
        "maximumLoadBalancerRuleCount": 250,
        "vmType": "vmss",
        "routeUpdateIntervalInSeconds": 30,
        "routeTableCacheTTLInSeconds": 120,
        "tags": "owner=k8s",
        "disableOutboundSNAT": false
    }"#;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    fn read(text: &str) -> AzureConfig {
        let c = AzureConfig::from_yaml(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        c.validate_in(&no_env)
            .unwrap_or_else(|e| panic!("{text}: {e}"));
        c
    }

    #[test]
    fn the_ccm_docs_azure_json_is_read_with_its_load_balancer_keys_named_and_never_their_values() {
        let c = read(CCM_DOCS_SHAPE);
        assert_eq!(c.tenant_id, "00000000-0000-0000-0000-00000000000a");
        assert_eq!(
            c.table_path(),
            "/subscriptions/00000000-0000-0000-0000-00000000000b/resourceGroups/cluster-rg/providers/Microsoft.Network/routeTables/k8s-routes"
        );
        assert_eq!(c.cloud_provider_rate_limit_qps, 6.0);
        assert_eq!(c.cloud_provider_rate_limit_bucket, 20);
        assert!(matches!(
            c.credential_in(&no_env).unwrap(),
            Credential::ClientSecret { ref tenant, .. } if tenant == "00000000-0000-0000-0000-00000000000a"
        ));
        let (route, other) = c.notes();
        for key in [
            "location:",
            "useInstanceMetadata:",
            "vmType:",
            "routeUpdateIntervalInSeconds:",
            "routeTableCacheTTLInSeconds:",
            "tags:",
            "vnetName:",
            "subnetName:",
            "cloudProviderRateLimit:",
        ] {
            assert!(route.iter().any(|n| n.starts_with(key)), "{key}: {route:?}");
        }
        for key in [
            "loadBalancerSku",
            "securityGroupName",
            "primaryAvailabilitySetName",
            "cloudProviderBackoff",
            "disableOutboundSNAT",
        ] {
            assert!(other.iter().any(|k| k == key), "{key}: {other:?}");
        }
        let all = format!("{route:?}{other:?}");
        assert!(
            !all.contains("docs-secret-value") && !all.contains("owner=k8s"),
            "{all}"
        );
    }

    #[test]
    fn keys_match_in_any_case_as_go_encoding_json_matches_them() {
        let c = read(
            "TENANTID: t\nSubscriptionID: s\nresourcegroup: rg\nRouteTableName: rt\n\
             AADClientID: c\naadclientsecret: x\nRouteTableResourceGroup: net\n",
        );
        assert_eq!((c.tenant_id.as_str(), c.aad_client_id.as_str()), ("t", "c"));
        assert!(
            c.table_path()
                .ends_with("/s/resourceGroups/net/providers/Microsoft.Network/routeTables/rt"),
            "{}",
            c.table_path()
        );
        assert!(c.ignored.is_empty(), "{:?}", c.ignored);
        let c = read(
            "subscriptionId: s\nresourceGroup: rg\nrouteTableName: rt\nuseManagedIdentityExtension: true\nuserAssignedIdentityId: mi-1\n",
        );
        assert_eq!(c.user_assigned_identity_id, "mi-1");
        // One key twice: the later wins, as in encoding/json, and a note says so.
        let c = read(
            "tenantId: first\ntenantID: second\nsubscriptionId: s\nresourceGroup: rg\nrouteTableName: rt\naadClientId: c\naadClientSecret: x\n",
        );
        assert_eq!(c.tenant_id, "second");
        let (route, _) = c.notes();
        assert!(
            route.iter().any(|n| n.contains("tenantId and tenantID")),
            "{route:?}"
        );
    }

    #[test]
    fn cloud_names_are_trimmed_read_in_any_case_with_upstreams_aliases() {
        for (name, arm, login) in [
            (
                "AzurePublicCloud",
                "https://management.azure.com",
                "https://login.microsoftonline.com",
            ),
            (
                "AzureCloud",
                "https://management.azure.com",
                "https://login.microsoftonline.com",
            ),
            (
                "",
                "https://management.azure.com",
                "https://login.microsoftonline.com",
            ),
            (
                " azurechinacloud ",
                "https://management.chinacloudapi.cn",
                "https://login.chinacloudapi.cn",
            ),
            (
                "AzureUSGovernment",
                "https://management.usgovcloudapi.net",
                "https://login.microsoftonline.us",
            ),
            (
                "AZUREUSGOVERNMENTCLOUD",
                "https://management.usgovcloudapi.net",
                "https://login.microsoftonline.us",
            ),
        ] {
            let c = AzureConfig {
                cloud: name.into(),
                active_directory_authority_host: "".into(),
                ..AzureConfig::default()
            };
            assert_eq!(c.arm_endpoint(), arm, "{name:?}");
            assert_eq!(c.arm_scope(), format!("{arm}/.default"), "{name:?}");
            if std::env::var(env::AUTHORITY_HOST).is_err() {
                assert_eq!(c.authority_host(), login, "{name:?}");
            }
            assert!(c.notes().0.is_empty(), "{name:?}: {:?}", c.notes());
        }
        let c = AzureConfig {
            cloud: "AzureGermanCloud".into(),
            ..AzureConfig::default()
        };
        assert_eq!(c.arm_endpoint(), "https://management.azure.com");
        assert!(
            c.notes()
                .0
                .iter()
                .any(|n| n.contains("AzureGermanCloud") && n.contains("public")),
            "{:?}",
            c.notes()
        );
    }

    #[test]
    fn a_route_table_in_the_network_subscription_is_addressed_there() {
        let c = read(
            "tenantId: t\nsubscriptionId: cluster-sub\nnetworkResourceSubscriptionID: net-sub\nnetworkResourceTenantID: T\nresourceGroup: rg\nrouteTableName: rt\naadClientId: c\naadClientSecret: x\n",
        );
        assert_eq!(c.table_subscription(), "net-sub");
        assert!(
            c.table_path()
                .starts_with("/subscriptions/net-sub/resourceGroups/rg/"),
            "{}",
            c.table_path()
        );
        let e = AzureConfig::from_yaml(
            "tenantId: t\nsubscriptionId: s\nnetworkResourceTenantID: other\nresourceGroup: rg\nrouteTableName: rt\naadClientId: c\naadClientSecret: x\n",
        )
        .unwrap()
        .validate_in(&no_env)
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("networkResourceTenantID") && e.contains("not supported"),
            "{e}"
        );
    }

    #[test]
    fn the_workload_identity_webhooks_variables_win_over_the_file_as_upstream() {
        let c = AzureConfig::from_yaml(
            "tenantId: file-tenant\naadClientId: file-client\naadClientSecret: x\nsubscriptionId: s\nresourceGroup: rg\nrouteTableName: rt\n",
        )
        .unwrap();
        let webhook = |k: &str| match k {
            "AZURE_TENANT_ID" => Some("env-tenant".to_string()),
            "AZURE_CLIENT_ID" => Some("env-client".to_string()),
            "AZURE_FEDERATED_TOKEN_FILE" => {
                Some("/var/run/secrets/azure/tokens/azure-identity-token".to_string())
            }
            _ => None,
        };
        assert_eq!(
            c.credential_in(&webhook).unwrap(),
            Credential::WorkloadIdentity {
                tenant: "env-tenant".into(),
                client_id: "env-client".into(),
                token_file: "/var/run/secrets/azure/tokens/azure-identity-token".into(),
            }
        );
        assert!(matches!(
            c.credential_in(&no_env).unwrap(),
            Credential::ClientSecret { ref tenant, ref client_id, .. } if tenant == "file-tenant" && client_id == "file-client"
        ));
    }

    #[test]
    fn credential_keys_that_cannot_be_honoured_are_refused_by_name() {
        let base = "tenantId: t\naadClientId: c\nsubscriptionId: s\nresourceGroup: rg\nrouteTableName: rt\n";
        let refused = |extra: &str, says: &str| {
            let e = AzureConfig::from_yaml(&format!("{base}{extra}"))
                .unwrap()
                .validate_in(&no_env)
                .unwrap_err()
                .to_string();
            assert!(e.contains(says), "{extra}: {e}");
            assert!(!e.contains("pfx-password"), "{e}");
        };
        refused(
            "aadClientCertPath: /etc/kubernetes/sp.pfx\naadClientCertPassword: pfx-password\n",
            "aadClientCertPath",
        );
        refused(
            "aadClientSecret: x\ncloudConfigType: secret\n",
            "cloudConfigType: secret",
        );
        refused(
            "aadClientSecret: x\ncloudConfigType: both\n",
            "none of file, secret, merge",
        );
        // The secret comes first in upstream's order: the certificate is
        // then unused there too.
        let c = read(&format!(
            "{base}aadClientSecret: x\naadClientCertPath: /etc/kubernetes/sp.pfx\naadClientCertPassword: pfx-password\n"
        ));
        assert!(matches!(
            c.credential_in(&no_env).unwrap(),
            Credential::ClientSecret { .. }
        ));
        let shown = format!("{c:?}");
        assert!(!shown.contains("pfx-password"), "{shown}");
        // Endpoints from AZURE_ENVIRONMENT_FILEPATH are not read: refused.
        let c = AzureConfig::from_yaml(&format!("{base}aadClientSecret: x\n")).unwrap();
        let stack = |k: &str| {
            (k == ENVIRONMENT_FILEPATH).then(|| "/etc/kubernetes/azurestackcloud.json".to_string())
        };
        let e = c.validate_in(&stack).unwrap_err().to_string();
        assert!(e.contains(ENVIRONMENT_FILEPATH), "{e}");
        // `merge`, upstream's default, reads only the file here: said once.
        let c = read(&format!(
            "{base}aadClientSecret: x\ncloudConfigType: merge\n"
        ));
        assert!(
            c.notes()
                .0
                .iter()
                .any(|n| n.starts_with("cloudConfigType: merge")),
            "{:?}",
            c.notes()
        );
        let c = read(&format!(
            "{base}aadClientSecret: x\ncloudConfigType: file\n"
        ));
        assert!(c.notes().0.is_empty(), "{:?}", c.notes());
    }

    #[test]
    fn every_key_of_the_schema_is_in_the_case_insensitive_list() {
        let shown = serde_json::to_value(AzureConfig::default()).unwrap();
        let mut fields: Vec<&str> = shown
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        fields.push("subscription");
        fields.sort_unstable();
        let mut keys = KEYS.to_vec();
        keys.sort_unstable();
        assert_eq!(fields, keys);
    }
}
