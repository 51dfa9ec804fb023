//! `--cloud-provider hcloud` for the binary's registry.
//! hcloud-cloud-controller-manager has no file, only its environment
//! (`HCLOUD_NETWORK`, `HCLOUD_ENDPOINT`, ...; [`native`](crate::native)):
//! every `--cloud-config` is ours, and the environment is the native side.

use std::sync::Arc;

use ccm_config::{Joined, Sources};
use provider_kit::{BuildError, Provider, Reads, Start};
use route_cloud::CloudRoutes;

use crate::{HcloudConfig, HcloudRoutes, native};

/// The Hetzner Cloud provider's entry in the binary's registry.
pub const PROVIDER: Provider = Provider {
    name: "hcloud",
    reads: Reads::Joined {
        sources: Sources {
            ini: None,
            env: Some(|env| Ok(native::from_ccm_env(env)?)),
        },
        build: |joined, start| Box::pin(std::future::ready(build(joined, start))),
    },
};

fn build(joined: Joined, start: Start) -> Result<Arc<dyn CloudRoutes>, BuildError> {
    let config: Option<HcloudConfig> = joined.parse()?;
    let config = config
        .filter(|c| !c.network.trim().is_empty())
        .ok_or(BuildError::NeedsConfig {
            provider: PROVIDER.name,
            what: "(at least `network: <id or name>`) or HCLOUD_NETWORK, as hcloud-cloud-controller-manager reads it",
        })?;
    let cloud = HcloudRoutes::from_config(config)
        .map_err(|e| BuildError::config("--cloud-config for the hcloud provider", e))?
        .with_fence(start.fence);
    Ok(Arc::new(cloud))
}
