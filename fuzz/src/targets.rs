//! One function per fuzz target. Each takes arbitrary bytes, feeds them to a
//! parser the controller runs on untrusted or operator-written input, and
//! checks what must hold for every input: no panic, and for the parsers with
//! a canonical form, that parsing what was printed gives the same value back.
//!
//! This file is compiled twice: by the `crc-fuzz` crate (cargo-fuzz) and, via
//! `#[path]`, by the main workspace's `fuzz_replay` test, so it names only
//! crates both have.

use route_core::{Cidr, Destination, PodCidr, parse_cluster_cidrs};

fn text(data: &[u8]) -> std::borrow::Cow<'_, str> {
    String::from_utf8_lossy(data)
}

/// The memory provider's `--cloud-config` (YAML and TOML), as `cloud-sim`
/// and the binary read it; a valid config must build a cloud.
pub fn memory_config(data: &[u8]) {
    let t = text(data);
    for toml in [false, true] {
        if let Ok(cfg) = cloud_sim::config::parse(&t, toml) {
            assert!(cfg.validate().is_ok(), "parse() returned an invalid config");
            provider_memory::MemoryCloud::new(cfg).expect("a validated config builds");
        }
    }
    // The binary decodes YAML to a JSON value first, then into the type.
    if let Ok(v) = serde_yaml_ng::from_str::<serde_json::Value>(&t) {
        let _ = serde_json::from_value::<provider_memory::MemoryConfig>(v.clone());
        let _ = serde_json::from_value::<cloud_sim::RemoteConfig>(v);
    }
}

/// `--cloud-provider hcloud`'s `--cloud-config`.
pub fn hcloud_config(data: &[u8]) {
    let t = text(data);
    if let Ok(cfg) = serde_yaml_ng::from_str::<provider_hcloud::HcloudConfig>(&t)
        && cfg.validate().is_ok()
    {
        let _ = cfg.network_id();
    }
    let _ = provider_hcloud::Token::new(t.trim());
}

/// `--cloud-provider openstack`'s `--cloud-config`.
pub fn openstack_config(data: &[u8]) {
    let t = text(data);
    if let Ok(mut cfg) = provider_openstack::OpenStackConfig::from_yaml(&t) {
        let _ = cfg.validate();
        cfg.fill_from_env(|_| None);
        let _ = cfg.request_timeout();
    }
}

/// A cloud-controller-manager's own config file (the gcfg INI of
/// cloud-provider-aws, cloud-provider-openstack's `cloud.conf`,
/// cloud-provider-gcp's `gce.conf`): parsing and translation never panic,
/// and a translation names only keys the parser read.
pub fn ccm_configs(data: &[u8]) {
    let t = text(data);
    if let Ok(ini) = ccm_config::Ini::parse(&t) {
        let reader = ccm_config::Reader::new(&ini);
        assert_eq!(reader.unused().len(), ini.entries.len(), "nothing read yet");
    }
    if let Ok(n) = provider_aws::native::from_ccm_config(&t) {
        let _ =
            serde_json::from_value::<provider_aws::AwsConfig>(serde_json::Value::Object(n.values));
    }
    if let Ok(n) = provider_openstack::native::from_ccm_config(&t) {
        let _ = serde_json::from_value::<provider_openstack::OpenStackConfig>(
            serde_json::Value::Object(n.values),
        );
    }
    if let Ok(n) = provider_gce::native::from_ccm_config(&t) {
        let _ =
            serde_json::from_value::<provider_gce::GceConfig>(serde_json::Value::Object(n.values));
    }
}

/// CIDR text from Nodes, flags and cloud answers: parsing is total, and a
/// parsed CIDR prints to text that parses back to itself.
pub fn cidrs(data: &[u8]) {
    let t = text(data);
    if let Ok(c) = Cidr::parse(&t) {
        let again = Cidr::parse(&c.to_string()).expect("a printed CIDR parses");
        assert_eq!(again, c, "print/parse round trip of {t:?}");
        assert!(
            c.contains(c.network()),
            "{c} contains its own network address"
        );
        assert!(c.covers(&c));
    }
    let d = Destination::parse(&t);
    assert_eq!(Destination::parse(&d.to_string()), d, "destination {t:?}");
    let _ = PodCidr::parse(&t);
    if let Ok(list) = parse_cluster_cidrs(&t) {
        assert!(!list.is_empty() && list.len() <= 2, "{t:?} gave {list:?}");
    }
}

/// Answers of the simulated cloud's HTTP API as the remote client decodes
/// them: routes, batch results, errors, capabilities; a decoded route
/// survives the trip to a `Route` and back.
pub fn sim_answers(data: &[u8]) {
    use cloud_sim::wire::{BatchResponse, WireCapabilities, WireError, WireRoute};
    if let Ok(routes) = serde_json::from_slice::<Vec<WireRoute>>(data) {
        for w in routes {
            let r = route_core::Route::from(w);
            let back = WireRoute::from(&r);
            assert_eq!(route_core::Route::from(back), r);
        }
    }
    if let Ok(b) = serde_json::from_slice::<BatchResponse>(data) {
        let _ = format!("{b:?}");
    }
    if let Ok(c) = serde_json::from_slice::<WireCapabilities>(data) {
        let _ = route_cloud::Capabilities::from(c);
    }
    if let Ok(e) = serde_json::from_slice::<WireError>(data) {
        let e = route_cloud::CloudError::from(e);
        let _ = (e.is_retryable(), e.to_string());
    }
}
