//! `--cloud-provider memory` for the binary's registry: one
//! `--cloud-config` (YAML, or TOML by its name). With `endpoint:` the
//! simulated cloud is a separate `cloud-sim` process (shared by replicas,
//! surviving restarts); without it, an in-process
//! [`MemoryCloud`](provider_memory::MemoryCloud).

use std::path::PathBuf;
use std::sync::Arc;

use provider_kit::{BuildError, Provider, Reads, Start};
use provider_memory::{MemoryCloud, MemoryConfig};
use route_cloud::CloudRoutes;

use crate::{RemoteConfig, RemoteMemoryCloud};

/// The simulated cloud's entry in the binary's registry.
pub const PROVIDER: Provider = Provider {
    name: "memory",
    reads: Reads::OneFile(|file, start| Box::pin(std::future::ready(build(file, &start)))),
};

const WHAT: &str = "--cloud-config for the memory provider";

fn build(file: Option<PathBuf>, start: &Start) -> Result<Arc<dyn CloudRoutes>, BuildError> {
    let config: MemoryConfig = match &file {
        None => MemoryConfig::default(),
        Some(path) => {
            let doc: serde_json::Value = ccm_config::read_file(path)?;
            if doc.get("endpoint").is_some() {
                // Parsed from the text again, not from `doc`, for the
                // parser's line and column in a message.
                let mut remote: RemoteConfig = ccm_config::read_file(path)?;
                if remote.caller.is_none() {
                    remote.caller = Some(start.identity.clone());
                }
                // No request here: capabilities are fetched on first use, so
                // a simulator that starts after the controller is not an
                // error.
                let cloud = RemoteMemoryCloud::new(&remote).map_err(|e| {
                    BuildError::config(
                        "--cloud-config for the remote memory provider",
                        e.to_string(),
                    )
                })?;
                return Ok(Arc::new(cloud));
            }
            serde_json::from_value(doc).map_err(|e| BuildError::config(WHAT, e.to_string()))?
        }
    };
    let cloud = MemoryCloud::new(config)
        .map_err(|e| BuildError::config(WHAT, e))?
        .with_caller(&start.identity);
    Ok(Arc::new(cloud))
}
