//! `--cloud-provider azure` for the binary's registry: one `--cloud-config`,
//! the cloud provider's `azure.json`, which is this controller's format too.

use std::path::PathBuf;
use std::sync::Arc;

use provider_kit::{BuildError, Provider, Reads, Start};
use route_cloud::CloudRoutes;

use crate::{AzureConfig, AzureRoutes};

/// The Azure provider's entry in the binary's registry.
pub const PROVIDER: Provider = Provider {
    name: "azure",
    reads: Reads::OneFile(|file, start| Box::pin(std::future::ready(build(file, start)))),
};

fn build(file: Option<PathBuf>, start: Start) -> Result<Arc<dyn CloudRoutes>, BuildError> {
    let path = file.ok_or(BuildError::NeedsConfig {
        provider: PROVIDER.name,
        what: "(the cloud provider's azure.json: subscriptionId, resourceGroup, routeTableName and a credential)",
    })?;
    let config = AzureConfig::from_file(&path)
        .map_err(|e| BuildError::config(format!("--cloud-config {}", path.display()), e))?;
    let cloud = AzureRoutes::new(config)
        .map_err(|e| BuildError::configure(PROVIDER.name, e))?
        .with_fence(start.fence);
    Ok(Arc::new(cloud))
}
