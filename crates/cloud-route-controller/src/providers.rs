//! Choosing and configuring the cloud provider (`--cloud-provider`,
//! `--cloud-config`). Each provider lives in its own crate; this is the only
//! place that names them.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context as _, bail};
use route_cloud::{CloudRoutes, Fence};
use serde::de::DeserializeOwned;

/// The providers this build knows.
pub const PROVIDERS: &[&str] = &[
    "memory",
    #[cfg(feature = "aws")]
    "aws",
    #[cfg(feature = "openstack")]
    "openstack",
    #[cfg(feature = "hcloud")]
    "hcloud",
    #[cfg(feature = "azure")]
    "azure",
    #[cfg(feature = "gce")]
    "gce",
];

/// Builds the provider named by `--cloud-provider`.
/// Providers that wait inside a call (token buckets, throttling pauses)
/// check `fence` again after each wait.
#[cfg_attr(
    not(any(
        feature = "aws",
        feature = "hcloud",
        feature = "openstack",
        feature = "azure",
        feature = "gce"
    )),
    allow(unused_variables, reason = "only the real providers use the fence")
)]
pub async fn build(
    name: &str,
    config: Option<&Path>,
    identity: &str,
    fence: &Fence,
) -> anyhow::Result<Arc<dyn CloudRoutes>> {
    match name {
        "memory" => {
            // With `endpoint:` the simulated cloud is a separate `cloud-sim`
            // process (shared by replicas, surviving restarts); without it,
            // an in-process table.
            let doc: Option<serde_json::Value> = read_config(config)?;
            if doc.as_ref().is_some_and(|d| d.get("endpoint").is_some()) {
                let mut cfg: cloud_sim::RemoteConfig =
                    read_config(config)?.context("--cloud-config for the memory provider")?;
                if cfg.caller.is_none() {
                    cfg.caller = Some(identity.to_string());
                }
                // No request here: capabilities are fetched on first use, so a
                // simulator that starts after the controller is not an error.
                let cloud = cloud_sim::RemoteMemoryCloud::new(&cfg)
                    .map_err(|e| anyhow::anyhow!("{e}"))
                    .context("--cloud-config for the remote memory provider")?;
                return Ok(Arc::new(cloud));
            }
            let cfg: provider_memory::MemoryConfig = match doc {
                Some(d) => serde_json::from_value(d)
                    .map_err(|e| anyhow::anyhow!("--cloud-config for the memory provider: {e}"))?,
                None => Default::default(),
            };
            let cloud = provider_memory::MemoryCloud::new(cfg)
                .context("--cloud-config for the memory provider")?
                .with_caller(identity);
            Ok(Arc::new(cloud))
        }
        #[cfg(feature = "aws")]
        "aws" => {
            let cfg: provider_aws::AwsConfig = read_config(config)?.unwrap_or_default();
            let cloud = provider_aws::Ec2Routes::connect(cfg)
                .await
                .context("configuring the aws provider")?
                .with_fence(fence.clone());
            Ok(Arc::new(cloud))
        }
        #[cfg(feature = "hcloud")]
        "hcloud" => {
            let cfg: provider_hcloud::HcloudConfig = read_config(config)?.context(
                "--cloud-provider hcloud needs --cloud-config (at least `network: <id or name>`)",
            )?;
            let cloud = provider_hcloud::HcloudRoutes::from_config(cfg)
                .context("--cloud-config for the hcloud provider")?
                .with_fence(fence.clone());
            Ok(Arc::new(cloud))
        }
        #[cfg(feature = "openstack")]
        "openstack" => {
            let path = config.context("--cloud-provider openstack needs --cloud-config")?;
            let cfg = provider_openstack::OpenStackConfig::from_file(path)
                .with_context(|| format!("--cloud-config {}", path.display()))?;
            let cloud = provider_openstack::OpenStackRoutes::new(cfg)
                .map_err(|e| anyhow::anyhow!("{e}"))
                .context("configuring the openstack provider")?
                .with_fence(fence.clone());
            Ok(Arc::new(cloud))
        }
        #[cfg(feature = "azure")]
        "azure" => {
            let path = config.context(
                "--cloud-provider azure needs --cloud-config (the cloud provider's azure.json: subscriptionId, resourceGroup, routeTableName and a credential)",
            )?;
            let cfg = provider_azure::AzureConfig::from_file(path)
                .with_context(|| format!("--cloud-config {}", path.display()))?;
            let cloud = provider_azure::AzureRoutes::new(cfg)
                .map_err(|e| anyhow::anyhow!("{e}"))
                .context("configuring the azure provider")?
                .with_fence(fence.clone());
            Ok(Arc::new(cloud))
        }
        #[cfg(feature = "gce")]
        "gce" => {
            let cfg: provider_gce::GceConfig = read_config(config)?.context(
                "--cloud-provider gce needs --cloud-config (at least `project` and `network`)",
            )?;
            let cloud = provider_gce::GceRoutes::connect(cfg)
                .await
                .context("configuring the gce provider")?
                .with_fence(fence.clone());
            Ok(Arc::new(cloud))
        }
        other => bail!(
            "--cloud-provider {other:?} is not known; this build supports: {}",
            PROVIDERS.join(", ")
        ),
    }
}

/// Reads a provider config file: TOML when the name ends in `.toml`, YAML otherwise.
pub fn read_config<T: DeserializeOwned>(path: Option<&Path>) -> anyhow::Result<Option<T>> {
    let Some(path) = path else { return Ok(None) };
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading --cloud-config {}", path.display()))?;
    let parsed = if path.extension().is_some_and(|e| e == "toml") {
        toml::from_str(&text).map_err(|e| anyhow::anyhow!("{e}"))
    } else {
        serde_yaml_ng::from_str(&text).map_err(|e| anyhow::anyhow!("{e}"))
    };
    parsed.map(Some).with_context(|| {
        format!(
            "--cloud-config {} is not a valid configuration",
            path.display()
        )
    })
}
