//! `--cloud-provider openstack` for the binary's registry: this
//! controller's YAML joined with cloud-provider-openstack's `cloud.conf`
//! ([`native`](crate::native)).

use std::sync::Arc;

use ccm_config::{Joined, Sources};
use provider_kit::{BuildError, Provider, Reads, Start};
use route_cloud::CloudRoutes;

use crate::{OpenStackConfig, OpenStackRoutes, native};

/// The OpenStack provider's entry in the binary's registry.
pub const PROVIDER: Provider = Provider {
    name: "openstack",
    reads: Reads::Joined {
        sources: Sources {
            ini: Some(|text| Ok(native::from_ccm_config(text)?)),
            env: None,
        },
        build: |joined, start| Box::pin(std::future::ready(build(joined, start))),
    },
};

fn build(joined: Joined, start: Start) -> Result<Arc<dyn CloudRoutes>, BuildError> {
    let doc = joined.into_value().ok_or(BuildError::NeedsConfig {
        provider: PROVIDER.name,
        what: "(cloud-provider-openstack's cloud.conf, or this controller's YAML)",
    })?;
    // From the document rather than by serde alone: `clouds.yaml` and the
    // environment fill what it leaves unset.
    let config = OpenStackConfig::from_value(doc)
        .map_err(|e| BuildError::config("the openstack configuration", e))?;
    let cloud = OpenStackRoutes::new(config)
        .map_err(|e| BuildError::configure(PROVIDER.name, e))?
        .with_fence(start.fence);
    Ok(Arc::new(cloud))
}
