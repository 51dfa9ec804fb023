//! `--cloud-provider aws` for the binary's registry: this controller's YAML
//! joined with cloud-provider-aws's INI file ([`native`](crate::native)).

use std::sync::Arc;

use ccm_config::{Joined, Sources};
use provider_kit::{BuildError, Provider, Reads, Start};
use route_cloud::CloudRoutes;

use crate::{AwsConfig, Ec2Routes, native};

/// The AWS provider's entry in the binary's registry.
pub const PROVIDER: Provider = Provider {
    name: "aws",
    reads: Reads::Joined {
        sources: Sources {
            ini: Some(|text| Ok(native::from_ccm_config(text)?)),
            env: None,
        },
        build: |joined, start| Box::pin(build(joined, start)),
    },
};

async fn build(joined: Joined, start: Start) -> Result<Arc<dyn CloudRoutes>, BuildError> {
    // Every key has a default or is found at start (region, tables by tag).
    let config: AwsConfig = joined.parse()?.unwrap_or_default();
    let cloud = Ec2Routes::connect(config)
        .await
        .map_err(|e| BuildError::configure(PROVIDER.name, e))?
        .with_fence(start.fence);
    Ok(Arc::new(cloud))
}
