//! Choosing and configuring the cloud provider (`--cloud-provider`,
//! `--cloud-config`). Each provider lives in its own crate; this is the only
//! place that names them.
//!
//! `--cloud-config` takes the cloud-controller-manager's own file (the INI
//! of cloud-provider-aws, cloud-provider-openstack's `cloud.conf`,
//! cloud-provider-gcp's `gce.conf`; hcloud's environment needs no file), our
//! YAML, or both (the flag given twice): each provider crate translates its
//! native format into its YAML keys, and [`ccm_config::join`] lays our YAML
//! over that, refusing a key both set.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context as _, bail};
use ccm_config::NativeConfig;
use route_cloud::{CloudRoutes, Fence};
use serde::de::DeserializeOwned;
use tracing::{info, warn};

/// The providers this build knows.
pub const PROVIDERS: &[&str] = &[
    #[cfg(feature = "lab")]
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

/// The choices of `--cloud-provider`, for messages: the real clouds first,
/// the simulated one named as such.
pub fn choices() -> String {
    let real: Vec<&str> = PROVIDERS
        .iter()
        .copied()
        .filter(|p| *p != "memory")
        .collect();
    match (real.is_empty(), PROVIDERS.contains(&"memory")) {
        (true, _) => "memory (a simulated cloud)".into(),
        (false, true) => format!("{}, or memory (a simulated cloud)", real.join(", ")),
        (false, false) => real.join(", "),
    }
}

/// The `spec.providerID` schemes of the clouds a cloud-controller-manager
/// runs on, as their CCMs write them (`aws:///zone/i-…`, `hcloud://42`, …).
const REAL_SCHEMES: &[&str] = &["aws", "openstack", "hcloud", "gce", "azure"];

/// Why the simulated cloud must not start for a cluster whose Nodes (name,
/// `spec.providerID`) run on a real one, or `None`. It would mark every such
/// Node `RouteCreated` while no route exists in its cloud: the most silent
/// way to be wrong, reached by leaving `--cloud-provider` at a copied value.
pub fn memory_refusal<'a>(nodes: impl IntoIterator<Item = (&'a str, &'a str)>) -> Option<String> {
    let mut by_scheme: std::collections::BTreeMap<&str, Vec<&str>> = Default::default();
    for (node, id) in nodes {
        let Some((scheme, _)) = id.split_once("://") else {
            continue;
        };
        if let Some(real) = REAL_SCHEMES.iter().find(|s| scheme.eq_ignore_ascii_case(s)) {
            by_scheme.entry(real).or_default().push(node);
        }
    }
    let (&main, _) = by_scheme.iter().max_by_key(|(_, n)| n.len())?;
    let found: Vec<String> = by_scheme
        .iter()
        .map(|(scheme, nodes)| {
            let shown: Vec<&str> = nodes.iter().take(3).copied().collect();
            let more = nodes.len().saturating_sub(shown.len());
            let tail = if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            };
            let noun = if nodes.len() == 1 { "Node" } else { "Nodes" };
            format!(
                "{} {noun} on {scheme} ({}{tail})",
                nodes.len(),
                shown.join(", ")
            )
        })
        .collect();
    Some(format!(
        "--cloud-provider=memory is a simulated cloud, but the cluster has {}: it would mark them RouteCreated while no route exists in their cloud; start with --cloud-provider={main}, or with --{UNSAFE_MEMORY_FLAG} if a simulation is meant",
        found.join(", ")
    ))
}

/// The flag that lets the memory provider start against Nodes of a real
/// cloud; long and plain so that nobody sets it by accident.
pub const UNSAFE_MEMORY_FLAG: &str = "unsafe-memory-provider-on-cloud-nodes";

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
    configs: &[PathBuf],
    identity: &str,
    fence: &Fence,
) -> anyhow::Result<Arc<dyn CloudRoutes>> {
    let config = single(name, configs)?;
    match name {
        #[cfg(feature = "lab")]
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
            let cfg: provider_aws::AwsConfig = joined_config(
                name,
                configs,
                provider_aws::native::is_ccm_config,
                |text| Ok(provider_aws::native::from_ccm_config(text)?),
                None,
            )?
            .unwrap_or_default();
            let cloud = provider_aws::Ec2Routes::connect(cfg)
                .await
                .context("configuring the aws provider")?
                .with_fence(fence.clone());
            Ok(Arc::new(cloud))
        }
        #[cfg(feature = "hcloud")]
        "hcloud" => {
            // hcloud-cloud-controller-manager has no file, only its
            // environment (HCLOUD_NETWORK, HCLOUD_ENDPOINT, ...): every
            // --cloud-config is ours, and the environment is the native side.
            let env = provider_hcloud::native::from_ccm_env(&|k| std::env::var(k).ok())?;
            let cfg: Option<provider_hcloud::HcloudConfig> = joined_config(
                name,
                configs,
                |_| false,
                |_| bail!("hcloud-cloud-controller-manager has no config file to translate"),
                env,
            )?;
            let cfg = cfg.filter(|c| !c.network.trim().is_empty()).context(
                "--cloud-provider hcloud needs --cloud-config (at least `network: <id or name>`) or HCLOUD_NETWORK, as hcloud-cloud-controller-manager reads it",
            )?;
            let cloud = provider_hcloud::HcloudRoutes::from_config(cfg)
                .context("--cloud-config for the hcloud provider")?
                .with_fence(fence.clone());
            Ok(Arc::new(cloud))
        }
        #[cfg(feature = "openstack")]
        "openstack" => {
            let doc: serde_json::Value = joined_config(
                name,
                configs,
                provider_openstack::native::is_ccm_config,
                |text| Ok(provider_openstack::native::from_ccm_config(text)?),
                None,
            )?
            .context("--cloud-provider openstack needs --cloud-config (cloud-provider-openstack's cloud.conf, or this controller's YAML)")?;
            let cfg = provider_openstack::OpenStackConfig::from_value(doc)
                .context("the openstack configuration")?;
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
            let cfg: provider_gce::GceConfig = joined_config(
                name,
                configs,
                provider_gce::native::is_ccm_config,
                |text| Ok(provider_gce::native::from_ccm_config(text)?),
                None,
            )?
            .context(
                "--cloud-provider gce needs --cloud-config (cloud-provider-gcp's gce.conf with project-id and network-name, or this controller's YAML with at least `project` and `network`)",
            )?;
            let cloud = provider_gce::GceRoutes::connect(cfg)
                .await
                .context("configuring the gce provider")?
                .with_fence(fence.clone());
            Ok(Arc::new(cloud))
        }
        other => bail!(
            "--cloud-provider {other:?} is not known; this build supports: {}",
            choices()
        ),
    }
}

/// The one `--cloud-config` of a provider without a native format of its own
/// to join (the memory cloud; Azure, whose `azure.json` is both).
fn single<'a>(name: &str, configs: &'a [PathBuf]) -> anyhow::Result<Option<&'a Path>> {
    match configs {
        [] => Ok(None),
        [one] => Ok(Some(one.as_path())),
        _ if NATIVE.contains(&name) => Ok(None),
        _ => bail!(
            "--cloud-provider {name} takes one --cloud-config, not {}",
            configs.len()
        ),
    }
}

/// The providers whose cloud-controller-manager has a config format of its
/// own that `--cloud-config` reads beside ours.
const NATIVE: &[&str] = &["aws", "openstack", "gce", "hcloud"];

/// Reads the `--cloud-config` files of a provider with a native format: at
/// most one native file (told by `is_native` from its text, and translated
/// by `translate`) and at most one of ours, plus what the environment says
/// natively (`env`, hcloud). Returns our YAML schema's value of the two
/// joined, or `None` when nothing was given.
#[cfg_attr(
    not(any(
        feature = "aws",
        feature = "hcloud",
        feature = "openstack",
        feature = "gce"
    )),
    allow(dead_code, reason = "only the providers with a native config read it")
)]
pub fn joined_config<T: DeserializeOwned>(
    provider: &str,
    configs: &[PathBuf],
    is_native: impl Fn(&str) -> bool,
    translate: impl Fn(&str) -> anyhow::Result<NativeConfig>,
    env: Option<NativeConfig>,
) -> anyhow::Result<Option<T>> {
    let mut native: Option<(PathBuf, NativeConfig)> = None;
    let mut ours: Option<(PathBuf, serde_json::Value)> = None;
    for path in configs {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading --cloud-config {}", path.display()))?;
        if is_native(&text) {
            if let Some((first, _)) = &native {
                bail!(
                    "--cloud-config {} and {} are both {provider} cloud-controller-manager files; give one",
                    first.display(),
                    path.display()
                );
            }
            let n =
                translate(&text).with_context(|| format!("--cloud-config {}", path.display()))?;
            native = Some((path.clone(), n));
        } else {
            if let Some((first, _)) = &ours {
                bail!(
                    "--cloud-config {} and {} are both YAML configs; give one (and at most one cloud-controller-manager file)",
                    first.display(),
                    path.display()
                );
            }
            let value: serde_json::Value = read_config(Some(path))?.unwrap_or_default();
            ours = Some((path.clone(), value));
        }
    }
    let native = match (native, env) {
        (Some((path, _)), Some(e)) => bail!(
            "--cloud-config {} and the {} both configure {provider}; use one",
            path.display(),
            e.format
        ),
        (Some((path, n)), None) => Some((path.display().to_string(), n)),
        (None, Some(e)) => Some((e.format.clone(), e)),
        (None, None) => None,
    };
    if let Some((from, n)) = &native {
        info!(source = %from, format = %n.format, keys = ?n.origins.values().collect::<Vec<_>>(), "reading the cloud-controller-manager's configuration");
        for note in &n.ignored {
            warn!(source = %from, "{note}");
        }
    }
    let ours_path = ours.as_ref().map(|(p, _)| p.display().to_string());
    let joined = ccm_config::join(native.as_ref().map(|(_, n)| n), ours.map(|(_, v)| v))
        .map_err(|e| anyhow::anyhow!("{e}"))
        .with_context(|| match &ours_path {
            Some(p) => format!("joining the {provider} configuration with --cloud-config {p}"),
            None => format!("the {provider} configuration"),
        })?;
    joined
        .map(|v| {
            serde_json::from_value(v)
                .map_err(|e| anyhow::anyhow!("{e}"))
                .with_context(|| format!("the {provider} configuration is not valid"))
        })
        .transpose()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_memory_provider_is_refused_for_nodes_of_a_real_cloud_and_names_it() {
        let nodes = [
            ("a", "aws:///us-east-1a/i-1"),
            ("b", "aws:///us-east-1a/i-2"),
            ("c", "memory://c"),
            ("d", "hcloud://42"),
            ("e", ""),
            ("f", "aws:///us-east-1b/i-3"),
            ("g", "aws:///us-east-1b/i-4"),
        ];
        let why = memory_refusal(nodes).expect("refused");
        assert!(why.contains("4 Nodes on aws (a, b, f and 1 more)"), "{why}");
        assert!(why.contains("1 Node on hcloud (d)"), "{why}");
        assert!(
            why.contains("--cloud-provider=aws"),
            "the most common cloud: {why}"
        );
        assert!(why.contains(UNSAFE_MEMORY_FLAG), "{why}");
    }

    #[test]
    fn the_memory_provider_starts_for_simulated_nodes_and_nodes_without_a_provider_id() {
        assert_eq!(
            memory_refusal([("a", "memory://a"), ("b", ""), ("c", "kind://x")]),
            None
        );
        assert_eq!(memory_refusal([]), None);
    }

    #[cfg(feature = "lab")]
    #[test]
    fn choices_name_the_simulated_cloud_last_and_as_such() {
        assert!(
            choices().ends_with("memory (a simulated cloud)"),
            "{}",
            choices()
        );
    }
}
