//! cloud-provider-openstack's own `--cloud-config` (`cloud.conf`, the gcfg
//! INI file of the openstack-cloud-controller-manager), translated into
//! [`OpenStackConfig`](crate::OpenStackConfig)'s keys. Key meanings follow
//! kubernetes/cloud-provider-openstack `pkg/client/client.go` (`AuthOpts`),
//! `pkg/openstack/openstack.go` and its
//! `docs/openstack-cloud-controller-manager/using-openstack-cloud-controller-manager.md`;
//! docs/providers.md's table lists each key and what it does here.
//!
//! `use-clouds` keeps its meaning: the entry of a `clouds.yaml` fills what
//! `[Global]` leaves unset ([`CloudsYaml`], read by the provider at start).

use ccm_config::{Ini, NativeConfig, Reader};

use crate::config::ConfigError;

/// The name messages give this format.
pub const FORMAT: &str = "cloud-provider-openstack cloud.conf";

/// `[Global]` keys copied as they are: (cloud.conf key, our key).
const AUTH: &[(&str, &str)] = &[
    ("auth-url", "auth.auth_url"),
    ("username", "auth.username"),
    ("user-id", "auth.user_id"),
    ("password", "auth.password"),
    ("tenant-id", "auth.project_id"),
    ("tenant-name", "auth.project_name"),
    ("tenant-domain-id", "auth.project_domain_id"),
    ("tenant-domain-name", "auth.project_domain_name"),
    ("user-domain-id", "auth.user_domain_id"),
    ("user-domain-name", "auth.user_domain_name"),
    (
        "application-credential-id",
        "auth.application_credential_id",
    ),
    (
        "application-credential-name",
        "auth.application_credential_name",
    ),
    (
        "application-credential-secret",
        "auth.application_credential_secret",
    ),
    ("region", "region_name"),
    ("ca-file", "cacert"),
];

/// `[Global]` keys naming a way to authenticate this provider does not
/// have: refused, since dropping a credential silently would start the
/// controller as someone else, or not at all with a misleading error.
const REFUSED: &[(&str, &str)] = &[
    ("token", "a pre-issued Keystone token"),
    ("trust-id", "Keystone trusts"),
    ("trustee-id", "Keystone trusts"),
    ("trustee-password", "Keystone trusts"),
    ("cert-file", "TLS client certificates"),
    ("key-file", "TLS client certificates"),
];

/// Translates the `cloud.conf` `text`.
pub fn from_ccm_config(text: &str) -> Result<NativeConfig, ConfigError> {
    let ini = Ini::parse(text).map_err(|e| ConfigError::Parse(format!("{FORMAT}: {e}")))?;
    let r = Reader::new(&ini);
    let mut n = NativeConfig::new(FORMAT);
    let g = "global";
    for (key, what) in REFUSED {
        if r.get_set(g, key).is_some() {
            return Err(ConfigError::Invalid(format!(
                "[Global] {key}: {what} are not supported; use a password or an application credential"
            )));
        }
    }
    for (key, ours) in AUTH {
        if let Some(v) = r.get_set(g, key) {
            n.set(ours, v, format!("[Global] {key}"));
        }
    }
    // gophercloud's domain-id/-name is the domain of the user, and of the
    // project when the project names no domain of its own.
    for (key, user, project) in [
        ("domain-id", "auth.user_domain_id", "auth.project_domain_id"),
        (
            "domain-name",
            "auth.user_domain_name",
            "auth.project_domain_name",
        ),
    ] {
        if let Some(v) = r.get_set(g, key) {
            for ours in [user, project] {
                if !n.origins.contains_key(ours) {
                    n.set(ours, v.clone(), format!("[Global] {key}"));
                }
            }
        }
    }
    if n.origins.contains_key("auth.application_credential_id")
        || n.origins.contains_key("auth.application_credential_name")
    {
        n.set(
            "auth_type",
            "v3applicationcredential",
            "[Global] application-credential-*",
        );
    }
    if let Some(t) = r.get_set(g, "os-endpoint-type") {
        let interface = match t.to_ascii_lowercase().trim_end_matches("url") {
            "public" => "public",
            "internal" => "internal",
            "admin" => "admin",
            _ => {
                return Err(ConfigError::Invalid(format!(
                    "[Global] os-endpoint-type {t:?} is not public, internal or admin"
                )));
            }
        };
        n.set("interface", interface, "[Global] os-endpoint-type");
    }
    if let Some(insecure) = r
        .get_bool(g, "tls-insecure")
        .map_err(|e| ConfigError::Invalid(format!("[Global] {e}")))?
    {
        n.set("insecure", insecure, "[Global] tls-insecure");
    }
    let use_clouds = r
        .get_bool(g, "use-clouds")
        .map_err(|e| ConfigError::Invalid(format!("[Global] {e}")))?
        .unwrap_or(false);
    let clouds_file = r.get_set(g, "clouds-file");
    let cloud = r.get_set(g, "cloud");
    if use_clouds {
        if let Some(f) = clouds_file {
            n.set("clouds_file", f, "[Global] clouds-file");
        } else {
            n.set("clouds_file", "", "[Global] use-clouds");
        }
        if let Some(c) = cloud {
            n.set("cloud", c, "[Global] cloud");
        }
    } else if clouds_file.is_some() || cloud.is_some() {
        n.ignore(
            "[Global] clouds-file/cloud",
            "read only with use-clouds = true",
        );
    }

    if let Some(router) = r.get_set("route", "router-id") {
        n.set("router_id", router, "[Route] router-id");
    }
    if let Some(t) = r.get_set("metadata", "request-timeout") {
        let secs = go_duration_secs(&t).ok_or_else(|| {
            ConfigError::Invalid(format!(
                "[Metadata] request-timeout {t:?} is not a duration (e.g. 30s, 1m)"
            ))
        })?;
        n.set(
            "request_timeout_seconds",
            secs,
            "[Metadata] request-timeout",
        );
    }
    r.skip("metadata", "search-order");
    if r.get_bool("networking", "ipv6-support-disabled")
        .map_err(|e| ConfigError::Invalid(format!("[Networking] {e}")))?
        == Some(true)
    {
        n.ignore(
            "[Networking] ipv6-support-disabled",
            "IPv6 pod CIDRs are still routed; leave them out with --route-ip-families=IPv4",
        );
    }
    for key in [
        "public-network-name",
        "internal-network-name",
        "address-sort-order",
    ] {
        if !r.get_all("networking", key).is_empty() {
            n.ignore(
                format!("[Networking] {key}"),
                "the next hop is the Node's InternalIP in its status, as the CCM's route code takes it; this key only chooses which addresses the CCM writes there",
            );
        }
    }
    for section in ["loadbalancer", "loadbalancerclass", "blockstorage"] {
        r.skip_section(section);
    }
    for unused in r.unused() {
        n.ignore(
            unused,
            "not a key the openstack-cloud-controller-manager's route code reads",
        );
    }
    Ok(n)
}

/// Whole seconds of a Go duration (`30s`, `1m30s`, `2m`, `500ms` rounds up),
/// at least 1.
fn go_duration_secs(text: &str) -> Option<u64> {
    let mut total_ms: u64 = 0;
    let mut rest = text.trim();
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit())?;
        let value: u64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let per = match &rest[..unit_len] {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            _ => return None,
        };
        total_ms = total_ms.checked_add(value.checked_mul(per)?)?;
        rest = &rest[unit_len..];
    }
    Some(total_ms.div_ceil(1_000).max(1))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    // The shape of the cloud.conf in the openstack-cloud-controller-manager's
    // user guide: password auth against a project, a router for routes.
    const PASSWORD: &str = r#"
[Global]
auth-url = https://keystone.example.com:5000/v3
username = k8s
password = "p#ss;word"
tenant-name = demo
domain-name = Default
region = RegionOne
ca-file = /etc/kubernetes/ca.pem

[Networking]
public-network-name = public

[LoadBalancer]
floating-network-id = 7a2b
subnet-id = 9c3d

[Route]
router-id = 5a1c-router

[Metadata]
search-order = configDrive,metadataService
request-timeout = 1m30s
"#;

    #[test]
    fn a_password_cloud_conf_translates_to_our_keys() {
        let n = from_ccm_config(PASSWORD).unwrap();
        assert_eq!(
            serde_json::Value::Object(n.values.clone()),
            json!({
                "auth": {
                    "auth_url": "https://keystone.example.com:5000/v3",
                    "username": "k8s",
                    "password": "p#ss;word",
                    "project_name": "demo",
                    "user_domain_name": "Default",
                    "project_domain_name": "Default",
                },
                "region_name": "RegionOne",
                "cacert": "/etc/kubernetes/ca.pem",
                "router_id": "5a1c-router",
                "request_timeout_seconds": 90,
            })
        );
        assert_eq!(n.origins["router_id"], "[Route] router-id");
        assert!(
            n.ignored.iter().any(|i| i.contains("public-network-name")),
            "{:?}",
            n.ignored
        );
        assert!(
            !n.ignored.iter().any(|i| i.contains("floating-network-id")),
            "{:?}",
            n.ignored
        );
        let c = crate::OpenStackConfig::from_value(serde_json::Value::Object(n.values)).unwrap();
        assert_eq!(c.auth.password.expose(), "p#ss;word");
        assert_eq!(c.router_id.as_deref(), Some("5a1c-router"));
    }

    #[test]
    fn application_credentials_choose_their_auth_type() {
        let n = from_ccm_config(
            "[Global]\nauth-url = https://k/v3\napplication-credential-id = ac1\n\
             application-credential-secret = s3\nregion = R\nos-endpoint-type = internalURL\n\
             tls-insecure = true\n[Route]\nrouter-id = r1\n",
        )
        .unwrap();
        let c = crate::OpenStackConfig::from_value(serde_json::Value::Object(n.values)).unwrap();
        assert_eq!(c.auth_type, crate::AuthType::V3ApplicationCredential);
        assert_eq!(c.interface, crate::Interface::Internal);
        assert!(c.insecure);
    }

    #[test]
    fn use_clouds_names_the_file_and_the_cloud() {
        let n = from_ccm_config(
            "[Global]\nuse-clouds = true\nclouds-file = /etc/openstack/clouds.yaml\ncloud = prod\n[Route]\nrouter-id = r\n",
        )
        .unwrap();
        assert_eq!(n.values["clouds_file"], "/etc/openstack/clouds.yaml");
        assert_eq!(n.values["cloud"], "prod");
        let n = from_ccm_config("[Global]\ncloud = prod\n").unwrap();
        assert!(!n.values.contains_key("cloud"));
        assert!(
            n.ignored.iter().any(|i| i.contains("use-clouds")),
            "{:?}",
            n.ignored
        );
    }

    #[test]
    fn unsupported_credentials_and_bad_values_are_refused() {
        for (text, says) in [
            ("[Global]\ntoken = abc\n", "token"),
            ("[Global]\ntrust-id = t\n", "trusts"),
            ("[Global]\ncert-file = /c.pem\n", "client certificates"),
            ("[Global]\nos-endpoint-type = private\n", "not public"),
            ("[Global]\ntls-insecure = maybe\n", "not a boolean"),
            ("[Metadata]\nrequest-timeout = soon\n", "not a duration"),
            ("[Global]\nauth_url = x\n", "not '_'"),
        ] {
            let e = from_ccm_config(text).unwrap_err().to_string();
            assert!(e.contains(says), "{text:?}: {e}");
        }
    }

    #[test]
    fn go_durations_round_up_to_whole_seconds() {
        assert_eq!(go_duration_secs("60s"), Some(60));
        assert_eq!(go_duration_secs("1m30s"), Some(90));
        assert_eq!(go_duration_secs("1500ms"), Some(2));
        assert_eq!(go_duration_secs("1h"), Some(3600));
        assert_eq!(go_duration_secs("5"), None);
        assert_eq!(go_duration_secs(""), None);
    }
}
