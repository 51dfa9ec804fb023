//! `--cloud-provider gce` for the binary's registry: this controller's YAML
//! joined with cloud-provider-gcp's `gce.conf` ([`native`](crate::native)).

use std::sync::Arc;

use ccm_config::{Joined, Sources};
use provider_kit::{BuildError, Provider, Reads, Start};
use route_cloud::CloudRoutes;

use crate::{GceConfig, GceRoutes, native};

/// The GCE provider's entry in the binary's registry.
pub const PROVIDER: Provider = Provider {
    name: "gce",
    reads: Reads::Joined {
        sources: Sources {
            ini: Some(|text| Ok(native::from_ccm_config(text)?)),
            env: None,
        },
        build: |joined, start| Box::pin(build(joined, start)),
    },
};

async fn build(joined: Joined, start: Start) -> Result<Arc<dyn CloudRoutes>, BuildError> {
    let config: GceConfig = joined.parse()?.ok_or(BuildError::NeedsConfig {
        provider: PROVIDER.name,
        what: "(cloud-provider-gcp's gce.conf with project-id and network-name, or this controller's YAML with at least `project` and `network`)",
    })?;
    let cloud = GceRoutes::connect(config)
        .await
        .map_err(|e| BuildError::configure(PROVIDER.name, e))?
        .with_fence(start.fence);
    Ok(Arc::new(cloud))
}
