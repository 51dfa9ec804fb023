//! cloud-provider-gcp's own `--cloud-config` (`gce.conf`, the gcfg INI file
//! whose `[global]` section it reads), translated into [`GceConfig`]'s keys.
//! Key meanings follow kubernetes/cloud-provider-gcp `providers/gce/gce.go`
//! (`ConfigGlobal`, `GenerateCloudConfig`, `CreateGCECloud`); docs/providers.md's
//! table lists each key and what it does here.
//!
//! [`GceConfig`]: crate::GceConfig

use ccm_config::{Ini, NativeConfig, Reader};

use crate::ConfigError;

/// The name messages give this format.
pub const FORMAT: &str = "cloud-provider-gcp gce.conf";

/// The value of `token-url` that means Application Default Credentials.
const ADC: &str = "nil";

/// `[global]` keys the route code of cloud-provider-gcp never reads, with
/// what reads them.
const NOT_ROUTES: &[(&str, &str)] = &[
    (
        "subnetwork-name",
        "load balancers and node IPAM only; routes belong to the network",
    ),
    (
        "secondary-range-name",
        "node IPAM only (deprecated upstream)",
    ),
    (
        "node-tags",
        "firewall rules of load balancers only; routes name their instance",
    ),
    (
        "node-instance-prefix",
        "load balancers' host tags only; routes name their instance",
    ),
    (
        "container-api-endpoint",
        "the GKE API, which the route code does not call",
    ),
    ("alpha-features", "load-balancer feature gates only"),
    (
        "stack-type",
        "load balancers and node IPAM; IPv6 routes follow the network's internal IPv6 range (or `ipv6` in the YAML)",
    ),
];

/// Why the zone keys change nothing here.
const ZONES: &str = "each Node's instance and zone come from its providerID (gce://<project>/<zone>/<instance>), so no zone is looked up";

fn invalid(message: String) -> ConfigError {
    ConfigError::Invalid(format!("{FORMAT}: {message}"))
}

/// Our `endpoint` (the API's root, to which the client adds
/// `/compute/v1/projects/...`) from `api-endpoint`, which upstream uses as
/// the compute client's base path: `https://host/compute/v1/`, with or
/// without `projects/` after it (`getProjectsBasePath` accepts both).
pub fn endpoint_of_base_path(base: &str) -> Result<String, ConfigError> {
    let trimmed = base.trim().trim_end_matches('/');
    let trimmed = trimmed.strip_suffix("/projects").unwrap_or(trimmed);
    let root = trimmed
        .strip_suffix("/compute/v1")
        .filter(|r| {
            (r.starts_with("http://") || r.starts_with("https://"))
                && r.split_once("://")
                    .is_some_and(|(_, host)| !host.is_empty())
        })
        .ok_or_else(|| {
            invalid(format!(
                "[global] api-endpoint {base:?} is not the Compute API's v1 base path \
                 (`https://<host>/compute/v1/`, as upstream's default \
                 `https://www.googleapis.com/compute/v1/`)"
            ))
        })?;
    Ok(root.to_string())
}

/// `(project, network)` of a network URL, full
/// (`https://www.googleapis.com/compute/v1/projects/p/global/networks/n`)
/// or partial (`projects/p/global/networks/n`).
pub fn network_of_url(url: &str) -> Option<(String, String)> {
    let at = url.find("projects/")?;
    let parts: Vec<&str> = url[at..].trim_end_matches('/').split('/').collect();
    match parts.as_slice() {
        ["projects", p, "global", "networks", n] if !p.is_empty() && !n.is_empty() => {
            Some(((*p).to_string(), (*n).to_string()))
        }
        _ => None,
    }
}

/// Translates the INI `text`.
pub fn from_ccm_config(text: &str) -> Result<NativeConfig, ConfigError> {
    let ini = Ini::parse(text).map_err(|e| invalid(e.to_string()))?;
    let r = Reader::new(&ini);
    let mut n = NativeConfig::new(FORMAT);
    let g = "global";

    let project = r.get_set(g, "project-id");
    if let Some(p) = &project {
        n.set("project", p.clone(), "[global] project-id");
    }
    let network_project = r.get_set(g, "network-project-id");
    if let Some(p) = &network_project {
        n.set("network_project", p.clone(), "[global] network-project-id");
    }
    if let Some(network) = r.get_set(g, "network-name") {
        if network.contains('/') {
            // Upstream takes a value with a '/' as the network's URL as is;
            // our client names the network by project and name.
            let (url_project, name) = network_of_url(&network).ok_or_else(|| {
                invalid(format!(
                    "[global] network-name {network:?} holds a '/' but is not a network URL \
                     (`projects/<project>/global/networks/<name>`)"
                ))
            })?;
            let routes_project = network_project.as_ref().or(project.as_ref());
            match (&network_project, routes_project) {
                (Some(np), _) if *np != url_project => {
                    return Err(invalid(format!(
                        "[global] network-name is a network of project {url_project:?}, \
                         but network-project-id is {np:?}"
                    )));
                }
                (None, Some(p)) if *p != url_project => n.set(
                    "network_project",
                    url_project,
                    "[global] network-name (its project)",
                ),
                (None, None) => n.set(
                    "network_project",
                    url_project,
                    "[global] network-name (its project)",
                ),
                _ => {}
            }
            n.set("network", name, "[global] network-name");
        } else {
            n.set("network", network, "[global] network-name");
        }
    }
    if let Some(base) = r.get_set(g, "api-endpoint") {
        n.set(
            "endpoint",
            endpoint_of_base_path(&base)?,
            "[global] api-endpoint",
        );
    }

    // `nil` is the Application Default Credentials, used here anyway; any
    // other URL is the token endpoint cloud-provider-gcp's AltTokenSource
    // asks, and so is it here.
    let token_body = r.get_set(g, "token-body");
    match r.get_set(g, "token-url").as_deref() {
        Some(ADC) | None => {
            if token_body.is_some() {
                n.ignore(
                    "[global] token-body",
                    "read only with a token-url other than `nil`",
                );
            }
        }
        Some(url) => {
            n.set("token_url", url, "[global] token-url");
            if let Some(body) = token_body {
                n.set("token_body", body, "[global] token-body");
            }
        }
    }

    let zone = r.get_set(g, "local-zone");
    let regional = r
        .get_bool(g, "regional")
        .map_err(|e| invalid(e.to_string()))?;
    let multizone = r
        .get_bool(g, "multizone")
        .map_err(|e| invalid(e.to_string()))?;
    if let Some(z) = zone {
        n.ignore(format!("[global] local-zone = {z}"), ZONES);
    }
    if regional == Some(true) {
        n.ignore("[global] regional", ZONES);
    }
    if multizone == Some(true) {
        n.ignore("[global] multizone", ZONES);
    }
    for (key, why) in NOT_ROUTES {
        let values = r.get_all(g, key);
        if !values.is_empty() {
            n.ignore(format!("[global] {key} = {}", values.join(",")), why);
        }
    }
    for unused in r.unused() {
        n.ignore(unused, "not a key cloud-provider-gcp reads");
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::GceConfig;

    fn parse(text: &str) -> GceConfig {
        let n = from_ccm_config(text).unwrap();
        let c: GceConfig = serde_json::from_value(serde_json::Value::Object(n.values)).unwrap();
        c.validate().unwrap();
        c
    }

    // The shape of the gce.conf cluster/gce's configure-helper writes for a
    // control plane (and cloud-provider-gcp's gce_test.go reads): project,
    // network, tags, zone settings, the compute endpoint.
    #[test]
    fn a_control_plane_gce_conf_translates_to_our_keys() {
        let text = "[global]\n\
                    project-id = my-project\n\
                    network-name = k8s-net\n\
                    subnetwork-name = k8s-subnet\n\
                    node-tags = k8s-node\n\
                    node-tags = extra-tag\n\
                    node-instance-prefix = k8s-minion\n\
                    multizone = true\n\
                    regional = true\n\
                    local-zone = us-central1-b\n\
                    api-endpoint = https://www.googleapis.com/compute/v1/\n\
                    token-url = nil\n\
                    alpha-features = ILBSubsets\n\
                    stack-type = IPV4\n";
        let n = from_ccm_config(text).unwrap();
        assert_eq!(
            serde_json::Value::Object(n.values.clone()),
            json!({"project": "my-project", "network": "k8s-net",
                   "endpoint": "https://www.googleapis.com"})
        );
        assert_eq!(n.origins["network"], "[global] network-name");
        for key in [
            "subnetwork-name",
            "node-tags = k8s-node,extra-tag",
            "node-instance-prefix",
            "local-zone = us-central1-b",
            "regional",
            "multizone",
            "alpha-features",
            "stack-type",
        ] {
            assert!(
                n.ignored.iter().any(|i| i.contains(key)),
                "{key}: {:?}",
                n.ignored
            );
        }
        // `token-url = nil` is what runs here anyway: nothing to say.
        assert!(
            !n.ignored.iter().any(|i| i.contains("token")),
            "{:?}",
            n.ignored
        );
        let c = parse(text);
        assert_eq!(c.routes_project(), "my-project");
    }

    #[test]
    fn a_shared_vpc_sends_routes_to_the_network_project() {
        let c = parse(
            "[Global]\nproject-id = service-proj\nnetwork-project-id = host-proj\n\
             network-name = shared\n",
        );
        assert_eq!(c.project, "service-proj");
        assert_eq!(c.routes_project(), "host-proj");
    }

    #[test]
    fn a_network_url_gives_the_name_and_the_network_project() {
        let c = parse(
            "[global]\nproject-id = svc\nnetwork-name = \
             https://www.googleapis.com/compute/v1/projects/host/global/networks/shared\n",
        );
        assert_eq!(c.network, "shared");
        assert_eq!(c.routes_project(), "host");
        let c = parse("[global]\nproject-id = p\nnetwork-name = projects/p/global/networks/n\n");
        assert_eq!((c.network.as_str(), c.routes_project()), ("n", "p"));
        assert_eq!(c.network_project, None);
        let e = from_ccm_config(
            "[global]\nnetwork-project-id = a\nnetwork-name = projects/b/global/networks/n\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("project \"b\"") && e.contains("network-project-id is \"a\""),
            "{e}"
        );
        let e = from_ccm_config("[global]\nnetwork-name = regions/x/subnetworks/y\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a network URL"), "{e}");
    }

    #[test]
    fn api_endpoint_is_the_compute_base_path_in_either_shape() {
        for base in [
            "https://www.googleapis.com/compute/v1/",
            "https://www.googleapis.com/compute/v1",
            "https://www.googleapis.com/compute/v1/projects/",
        ] {
            assert_eq!(
                endpoint_of_base_path(base).unwrap(),
                "https://www.googleapis.com",
                "{base}"
            );
        }
        assert_eq!(
            endpoint_of_base_path("http://127.0.0.1:8080/compute/v1/").unwrap(),
            "http://127.0.0.1:8080"
        );
        for bad in [
            "https://www.googleapis.com/compute/beta/",
            "https://compute.googleapis.com",
            "/compute/v1/",
        ] {
            let e = endpoint_of_base_path(bad).unwrap_err().to_string();
            assert!(
                e.contains("api-endpoint") && e.contains("v1 base path"),
                "{e}"
            );
        }
    }

    #[test]
    fn a_custom_token_endpoint_and_its_body_are_taken_as_they_are() {
        let c = parse(
            "[global]\nproject-id = p\nnetwork-name = n\n\
             token-url = https://iamcredentials.googleapis.com/v1/projects/-/serviceAccounts/r@p.iam.gserviceaccount.com:generateAccessToken\n\
             token-body = \"{\\\"scope\\\": [\\\"https://www.googleapis.com/auth/compute\\\"]}\"\n",
        );
        assert_eq!(
            c.token_url.as_deref(),
            Some(
                "https://iamcredentials.googleapis.com/v1/projects/-/serviceAccounts/r@p.iam.gserviceaccount.com:generateAccessToken"
            )
        );
        assert_eq!(
            c.token_body.as_deref(),
            Some(r#"{"scope": ["https://www.googleapis.com/auth/compute"]}"#)
        );
        let n = from_ccm_config("[global]\ntoken-url = nil\ntoken-body = x\n").unwrap();
        assert!(!n.values.contains_key("token_url"));
        assert!(
            n.ignored
                .iter()
                .any(|i| i.starts_with("[global] token-body:")),
            "{:?}",
            n.ignored
        );
    }

    #[test]
    fn bad_files_are_refused_with_the_reason() {
        for (text, says) in [
            ("[global]\nproject_id = p\n", "not '_'"),
            ("[global]\nregional = maybe\n", "not a boolean"),
            ("project-id = p\n", "outside any [section]"),
        ] {
            let e = from_ccm_config(text).unwrap_err().to_string();
            assert!(e.contains(says) && e.contains(FORMAT), "{text:?}: {e}");
        }
    }

    #[test]
    fn keys_nobody_reads_are_named_once() {
        let n =
            from_ccm_config("[global]\nproject-id = p\nprojet-id = typo\n[LoadBalancer]\nx = 1\n")
                .unwrap();
        let named: Vec<_> = n
            .ignored
            .iter()
            .filter(|i| i.contains("projet-id") || i.contains("[loadbalancer] x"))
            .collect();
        assert_eq!(named.len(), 2, "{:?}", n.ignored);
    }

    #[test]
    fn a_key_in_both_files_names_the_native_key() {
        let n = from_ccm_config("[global]\nnetwork-name = k8s\n").unwrap();
        let e = ccm_config::join(Some(&n), Some(json!({"network": "other"})))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("[global] network-name") && e.contains(FORMAT),
            "{e}"
        );
    }
}
