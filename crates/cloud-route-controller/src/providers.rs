//! The provider registry: which clouds `--cloud-provider` can name, each
//! provider crate's [`Provider`] entry (feature-gated, so a build for one
//! cloud compiles no other), and the one loop that builds the one chosen.
//! Adding a cloud adds its entry to [`REGISTRY`] and its Cargo feature;
//! nothing here knows any cloud's configuration.
//!
//! `--cloud-config` takes the cloud-controller-manager's own file (the INI
//! of cloud-provider-aws, cloud-provider-openstack's `cloud.conf`,
//! cloud-provider-gcp's `gce.conf`; hcloud's environment needs no file), our
//! YAML, or both (the flag given twice): [`ccm_config::load`] reads them for
//! every provider, each provider crate translating its native format into
//! its YAML keys.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::bail;
use provider_kit::{Provider, Start};
use route_cloud::{CloudRoutes, Fence};

/// The providers this build knows, the simulated one first.
pub const REGISTRY: &[Provider] = &[
    #[cfg(feature = "lab")]
    cloud_sim::PROVIDER,
    #[cfg(feature = "aws")]
    provider_aws::PROVIDER,
    #[cfg(feature = "openstack")]
    provider_openstack::PROVIDER,
    #[cfg(feature = "hcloud")]
    provider_hcloud::PROVIDER,
    #[cfg(feature = "azure")]
    provider_azure::PROVIDER,
    #[cfg(feature = "gce")]
    provider_gce::PROVIDER,
];

/// Whether this build knows the provider `name`.
pub fn is_known(name: &str) -> bool {
    REGISTRY.iter().any(|p| p.name == name)
}

/// The choices of `--cloud-provider`, for messages: the real clouds first,
/// the simulated one named as such.
pub fn choices() -> String {
    let real: Vec<&str> = REGISTRY
        .iter()
        .map(|p| p.name)
        .filter(|p| *p != "memory")
        .collect();
    match (real.is_empty(), is_known("memory")) {
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

/// Builds the provider named by `--cloud-provider` from its
/// `--cloud-config` files and the environment. Providers that wait inside a
/// call (token buckets, throttling pauses) check `fence` again after each
/// wait.
pub async fn build(
    name: &str,
    configs: &[PathBuf],
    identity: &str,
    fence: &Fence,
) -> anyhow::Result<Arc<dyn CloudRoutes>> {
    let Some(provider) = REGISTRY.iter().find(|p| p.name == name) else {
        // A name without a native format to join takes one file, and that
        // is checked before the name is.
        ccm_config::one_file(name, configs)?;
        bail!(
            "--cloud-provider {name:?} is not known; this build supports: {}",
            choices()
        );
    };
    let start = Start {
        identity: identity.to_string(),
        fence: fence.clone(),
    };
    Ok(provider.build(configs, start).await?)
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
