//! hcloud-cloud-controller-manager's own configuration: it has no file, only
//! environment variables (`internal/config/config.go` of
//! hetznercloud/hcloud-cloud-controller-manager, with the token and endpoint
//! read by hcloud-go), translated into [`HcloudConfig`](crate::HcloudConfig)'s
//! keys, so that the Secret and the `env:` block of the CCM's Deployment
//! configure this controller unchanged.
//!
//! | variable | here |
//! |---|---|
//! | `HCLOUD_NETWORK` | `network` (id or name) |
//! | `HCLOUD_ENDPOINT` | `endpoint` |
//! | `HCLOUD_TOKEN` | the token, read by [`Token::from_env`](crate::Token::from_env) as before |
//! | `HCLOUD_TOKEN_FILE` | `token_file`, unless `HCLOUD_TOKEN` is set, which wins as in hcloud-go |
//! | `HCLOUD_NETWORK_ROUTES_ENABLED` | `false` refuses to start (see [`from_ccm_env`]); read only with `HCLOUD_NETWORK`, as the CCM reads it |
//! | `ROBOT_ENABLED` | noted: the CCM refuses routes with Robot; here `--node-selector` leaves dedicated servers out |
//! | the rest | noted once at start as without effect on routes |
//!
//! Booleans are read as Go's `strconv.ParseBool` reads them (the CCM fails
//! to start on anything else, and so does this). An empty variable counts
//! as unset: an `env:` entry with `value: ""` is how a chart leaves one out.

use ccm_config::NativeConfig;

use crate::ConfigError;

/// The name messages give this format.
pub const FORMAT: &str = "hcloud-cloud-controller-manager environment";

/// The variables hcloud-cloud-controller-manager reads, all in one place.
pub mod vars {
    /// The API token (read by [`crate::Token::from_env`]).
    pub const TOKEN: &str = crate::config::TOKEN_ENV;
    /// A file holding the token; `HCLOUD_TOKEN` wins when both are set.
    pub const TOKEN_FILE: &str = "HCLOUD_TOKEN_FILE";
    /// The API base URL.
    pub const ENDPOINT: &str = "HCLOUD_ENDPOINT";
    /// The network whose routes are managed, by id or name.
    pub const NETWORK: &str = "HCLOUD_NETWORK";
    /// The CCM's switch of its route controller; read only with `HCLOUD_NETWORK`.
    pub const NETWORK_ROUTES_ENABLED: &str = "HCLOUD_NETWORK_ROUTES_ENABLED";
    /// Dedicated (Robot) servers in the cluster.
    pub const ROBOT_ENABLED: &str = "ROBOT_ENABLED";
    /// HTTP request dumps.
    pub const DEBUG: &str = "HCLOUD_DEBUG";
    /// The address families of Node addresses.
    pub const INSTANCES_ADDRESS_FAMILY: &str = "HCLOUD_INSTANCES_ADDRESS_FAMILY";

    /// Variables the CCM reads for other controllers than routes, each with
    /// why it does nothing here.
    pub const NOT_ROUTES: &[(&str, &str)] = &[
        (
            "HCLOUD_NETWORK_DISABLE_ATTACHED_CHECK",
            "the CCM's check that its own server is in the network; this controller does not ask the metadata service",
        ),
        ("HCLOUD_INSTANCES_ZONE_LABEL_ENABLED", "Node labels only"),
        (
            "HCLOUD_SERVER_CACHE_MODE",
            "the CCM's server cache; this provider's server list is refreshed at most every `server_refresh_min_interval_secs`",
        ),
        (
            "HCLOUD_SERVER_CACHE_MAX_AGE",
            "the CCM's server cache; this provider's server list is refreshed at most every `server_refresh_min_interval_secs`",
        ),
        (
            "HCLOUD_METRICS_ENABLED",
            "metrics are served on --metrics-bind-address",
        ),
        (
            "HCLOUD_METRICS_ADDRESS",
            "metrics are served on --metrics-bind-address",
        ),
        ("HCLOUD_LOAD_BALANCERS_ENABLED", "load balancers only"),
        ("HCLOUD_LOAD_BALANCERS_LOCATION", "load balancers only"),
        ("HCLOUD_LOAD_BALANCERS_NETWORK_ZONE", "load balancers only"),
        (
            "HCLOUD_LOAD_BALANCERS_USE_PRIVATE_IP",
            "load balancers only",
        ),
        (
            "HCLOUD_LOAD_BALANCERS_DISABLE_PRIVATE_INGRESS",
            "load balancers only",
        ),
        (
            "HCLOUD_LOAD_BALANCERS_DISABLE_PUBLIC_NETWORK",
            "load balancers only",
        ),
        ("HCLOUD_LOAD_BALANCERS_DISABLE_IPV6", "load balancers only"),
        (
            "HCLOUD_LOAD_BALANCERS_ALGORITHM_TYPE",
            "load balancers only",
        ),
        (
            "HCLOUD_LOAD_BALANCERS_HEALTH_CHECK_INTERVAL",
            "load balancers only",
        ),
        (
            "HCLOUD_LOAD_BALANCERS_HEALTH_CHECK_TIMEOUT",
            "load balancers only",
        ),
        (
            "HCLOUD_LOAD_BALANCERS_HEALTH_CHECK_RETRIES",
            "load balancers only",
        ),
        ("HCLOUD_LOAD_BALANCERS_TYPE", "load balancers only"),
        (
            "HCLOUD_LOAD_BALANCERS_PRIVATE_SUBNET_IP_RANGE",
            "load balancers only",
        ),
        (
            "HCLOUD_LOAD_BALANCERS_UNINITIALIZED_NODES",
            "load balancers only",
        ),
        ("ROBOT_USER", "dedicated servers' Node data only"),
        ("ROBOT_USER_FILE", "dedicated servers' Node data only"),
        ("ROBOT_PASSWORD", "dedicated servers' Node data only"),
        ("ROBOT_PASSWORD_FILE", "dedicated servers' Node data only"),
        ("ROBOT_CACHE_TIMEOUT", "dedicated servers' Node data only"),
        (
            "ROBOT_RATE_LIMIT_WAIT_TIME",
            "dedicated servers' Node data only",
        ),
        (
            "ROBOT_FORWARD_INTERNAL_IPS",
            "dedicated servers' Node data only",
        ),
    ];
}

/// What to do instead of `HCLOUD_NETWORK_ROUTES_ENABLED=false`, in the
/// refusal's message.
const ROUTES_OFF: &str = "routes are switched off in this environment. That variable is \
     hcloud-cloud-controller-manager's switch for its own route controller; this controller's \
     only job is routes, so it will not run with it. In this controller's Deployment leave it \
     unset or set it to true (an `env:` entry overrides one from `envFrom:`), or, to run \
     without routes, scale this controller to zero or pass --configure-cloud-routes=false";

/// Go's `strconv.ParseBool`: exactly these spellings, nothing trimmed.
pub fn parse_go_bool(name: &str, value: &str) -> Result<bool, ConfigError> {
    match value {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        other => Err(ConfigError::Invalid(format!(
            "{name}={other:?} is not a boolean (1, t, T, TRUE, true, True, 0, f, F, FALSE, false or False, as hcloud-cloud-controller-manager reads it)"
        ))),
    }
}

/// Translates the environment `env` (a lookup, `std::env::var(..).ok()` in
/// the binary). `None` when none of `HCLOUD_NETWORK`, `HCLOUD_ENDPOINT` and
/// `HCLOUD_TOKEN_FILE` is set: `HCLOUD_TOKEN` alone is the token every
/// configuration reads, and says nothing about which network to route.
///
/// `HCLOUD_NETWORK_ROUTES_ENABLED=false` beside `HCLOUD_NETWORK` is an
/// error, not a quiet exit: it is the CCM's way to say "no cloud routes in
/// this cluster", and an operator who copies that env block into this
/// controller's Deployment gets a controller that stops with the reason
/// rather than one that creates the routes the block switched off (the
/// explicit way to run without routes is `--configure-cloud-routes=false`,
/// which stays up idle and says so).
pub fn from_ccm_env(
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<NativeConfig>, ConfigError> {
    let get = |name: &str| env(name).filter(|v| !v.is_empty());
    let bool_var = |name: &str| -> Result<Option<bool>, ConfigError> {
        get(name).map(|v| parse_go_bool(name, &v)).transpose()
    };
    let network = get(vars::NETWORK);
    let endpoint = get(vars::ENDPOINT);
    let token_file = get(vars::TOKEN_FILE);
    if network.is_none() && endpoint.is_none() && token_file.is_none() {
        return Ok(None);
    }
    let mut n = NativeConfig::new(FORMAT);

    if let Some(network) = network {
        let network = network.trim().to_string();
        if let Some(v) = get(vars::NETWORK_ROUTES_ENABLED)
            && !parse_go_bool(vars::NETWORK_ROUTES_ENABLED, &v)?
        {
            return Err(ConfigError::Invalid(format!(
                "{}={v} beside {}={network}: {ROUTES_OFF}",
                vars::NETWORK_ROUTES_ENABLED,
                vars::NETWORK
            )));
        }
        n.set("network", network, vars::NETWORK);
    } else if let Some(v) = get(vars::NETWORK_ROUTES_ENABLED) {
        n.ignore(
            format!("{}={v}", vars::NETWORK_ROUTES_ENABLED),
            "read only with HCLOUD_NETWORK, as hcloud-cloud-controller-manager reads it",
        );
    }
    if let Some(endpoint) = endpoint {
        n.set("endpoint", endpoint.trim().to_string(), vars::ENDPOINT);
    }
    if let Some(file) = token_file {
        if env(vars::TOKEN).is_some() {
            // hcloud-go looks the plain variable up first and takes it when
            // it is set at all.
            n.ignore(
                format!("{}={file}", vars::TOKEN_FILE),
                "HCLOUD_TOKEN is set as well and wins, as in hcloud-go",
            );
        } else {
            n.set("token_file", file.trim().to_string(), vars::TOKEN_FILE);
        }
    }
    if bool_var(vars::ROBOT_ENABLED)? == Some(true) {
        n.ignore(
            format!("{}=true", vars::ROBOT_ENABLED),
            "hcloud-cloud-controller-manager runs no routes with Robot; this controller does, and \
             leaves the dedicated servers' Nodes out with --node-selector \
             (e.g. instance.hetzner.cloud/is-root-server!=true), whose routes over the vSwitch \
             stay as they are",
        );
    }
    if bool_var(vars::DEBUG)? == Some(true) {
        n.ignore(
            format!("{}=true", vars::DEBUG),
            "no HTTP dumps here; RUST_LOG=provider_hcloud=debug logs failed requests, and the request counters are on /metrics",
        );
    }
    if let Some(family) = get(vars::INSTANCES_ADDRESS_FAMILY) {
        n.ignore(
            format!("{}={family}", vars::INSTANCES_ADDRESS_FAMILY),
            "Node addresses only; Hetzner network routes are IPv4, and the families routed are --route-ip-families",
        );
    }
    for (name, why) in vars::NOT_ROUTES {
        if let Some(v) = get(name) {
            // Secrets among them (ROBOT_PASSWORD) are named, never shown.
            let shown = if name.contains("PASSWORD") || name.contains("USER") {
                "<set>".to_string()
            } else {
                v
            };
            n.ignore(format!("{name}={shown}"), why);
        }
    }
    Ok(Some(n))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use serde_json::json;

    use super::*;
    use crate::HcloudConfig;

    fn translate(pairs: &[(&str, &str)]) -> Result<Option<NativeConfig>, ConfigError> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        from_ccm_env(&|k| map.get(k).cloned())
    }

    fn config(pairs: &[(&str, &str)]) -> HcloudConfig {
        let n = translate(pairs).unwrap().expect("configured");
        let c: HcloudConfig = serde_json::from_value(serde_json::Value::Object(n.values)).unwrap();
        c.validate().unwrap();
        c
    }

    // The env block of the CCM's deploy/ccm-networks.yaml and its chart
    // with networking on: the token from a Secret, the network by name.
    #[test]
    fn the_ccm_networks_manifest_env_translates_to_our_keys() {
        let n = translate(&[
            (vars::TOKEN, "t0ken"),
            (vars::NETWORK, "k8s-net"),
            ("HCLOUD_METRICS_ENABLED", "false"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            serde_json::Value::Object(n.values.clone()),
            json!({"network": "k8s-net"})
        );
        assert_eq!(n.origins["network"], "HCLOUD_NETWORK");
        assert!(
            n.ignored
                .iter()
                .any(|i| i.contains("HCLOUD_METRICS_ENABLED")),
            "{:?}",
            n.ignored
        );
        assert_eq!(config(&[(vars::NETWORK, "4711")]).network_id(), Some(4711));
    }

    #[test]
    fn the_token_alone_configures_nothing() {
        assert_eq!(translate(&[(vars::TOKEN, "t")]).unwrap(), None);
        assert_eq!(translate(&[]).unwrap(), None);
        assert_eq!(translate(&[(vars::NETWORK, "")]).unwrap(), None);
        // The route switch and Robot say nothing without a network either.
        assert_eq!(
            translate(&[(vars::ROBOT_ENABLED, "true"), (vars::DEBUG, "1")]).unwrap(),
            None
        );
    }

    #[test]
    fn endpoint_and_token_file_are_honoured() {
        let c = config(&[
            (vars::NETWORK, "k8s"),
            (vars::ENDPOINT, "http://127.0.0.1:8080/v1"),
            (vars::TOKEN_FILE, "/etc/hcloud/token"),
        ]);
        assert_eq!(c.endpoint, "http://127.0.0.1:8080/v1");
        assert_eq!(
            c.token_file.as_deref(),
            Some(std::path::Path::new("/etc/hcloud/token"))
        );
        // Either alone is a configuration (the network then comes from YAML).
        let n = translate(&[(vars::ENDPOINT, "https://api.example/v1")])
            .unwrap()
            .unwrap();
        assert_eq!(n.values["endpoint"], "https://api.example/v1");
        let n = translate(&[(vars::TOKEN_FILE, "/t")]).unwrap().unwrap();
        assert_eq!(n.values["token_file"], "/t");
    }

    #[test]
    fn hcloud_token_wins_over_the_token_file_as_in_hcloud_go() {
        let n = translate(&[
            (vars::NETWORK, "k8s"),
            (vars::TOKEN, "plain"),
            (vars::TOKEN_FILE, "/etc/hcloud/token"),
        ])
        .unwrap()
        .unwrap();
        assert!(!n.values.contains_key("token_file"));
        assert!(
            n.ignored
                .iter()
                .any(|i| i.contains("HCLOUD_TOKEN_FILE") && i.contains("wins")),
            "{:?}",
            n.ignored
        );
    }

    #[test]
    fn routes_switched_off_beside_a_network_refuse_to_start_with_the_way_out() {
        for off in ["false", "0", "f", "F", "FALSE", "False"] {
            let e = translate(&[(vars::NETWORK, "k8s"), (vars::NETWORK_ROUTES_ENABLED, off)])
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(&format!("HCLOUD_NETWORK_ROUTES_ENABLED={off} beside"))
                    && e.contains("routes are switched off")
                    && e.contains("--configure-cloud-routes=false"),
                "{off}: {e}"
            );
        }
        for on in ["true", "1", "t", "T", "TRUE", "True", ""] {
            let c = config(&[(vars::NETWORK, "k8s"), (vars::NETWORK_ROUTES_ENABLED, on)]);
            assert_eq!(c.network, "k8s", "{on}");
        }
    }

    #[test]
    fn the_route_switch_without_a_network_is_not_read_as_in_the_ccm() {
        let n = translate(&[
            (vars::ENDPOINT, "https://api.example/v1"),
            (vars::NETWORK_ROUTES_ENABLED, "false"),
        ])
        .unwrap()
        .unwrap();
        assert!(!n.values.contains_key("network"));
        assert!(
            n.ignored
                .iter()
                .any(|i| i.contains("HCLOUD_NETWORK_ROUTES_ENABLED") && i.contains("only with")),
            "{:?}",
            n.ignored
        );
    }

    #[test]
    fn robot_says_how_to_leave_dedicated_servers_out() {
        let n = translate(&[(vars::NETWORK, "k8s"), (vars::ROBOT_ENABLED, "true")])
            .unwrap()
            .unwrap();
        assert!(
            n.ignored
                .iter()
                .any(|i| i.starts_with("ROBOT_ENABLED=true") && i.contains("--node-selector")),
            "{:?}",
            n.ignored
        );
        let n = translate(&[(vars::NETWORK, "k8s"), (vars::ROBOT_ENABLED, "false")])
            .unwrap()
            .unwrap();
        assert!(n.ignored.is_empty(), "{:?}", n.ignored);
    }

    #[test]
    fn bad_booleans_are_refused_with_the_variable_named() {
        for name in [
            vars::NETWORK_ROUTES_ENABLED,
            vars::ROBOT_ENABLED,
            vars::DEBUG,
        ] {
            for bad in ["yes", "no", "on", " true", "tRUE", "2"] {
                let e = translate(&[(vars::NETWORK, "k8s"), (name, bad)])
                    .unwrap_err()
                    .to_string();
                assert!(
                    e.contains(&format!("{name}={bad:?} is not a boolean")),
                    "{name}={bad}: {e}"
                );
            }
        }
    }

    #[test]
    fn variables_of_other_controllers_are_named_and_secrets_not_shown() {
        let n = translate(&[
            (vars::NETWORK, "k8s"),
            (vars::DEBUG, "true"),
            (vars::INSTANCES_ADDRESS_FAMILY, "dualstack"),
            ("HCLOUD_LOAD_BALANCERS_LOCATION", "fsn1"),
            ("ROBOT_PASSWORD", "hunter2"),
        ])
        .unwrap()
        .unwrap();
        let all = n.ignored.join("\n");
        for name in [
            "HCLOUD_DEBUG=true",
            "HCLOUD_INSTANCES_ADDRESS_FAMILY=dualstack",
            "HCLOUD_LOAD_BALANCERS_LOCATION=fsn1",
            "ROBOT_PASSWORD=<set>",
        ] {
            assert!(all.contains(name), "{name} missing from {all}");
        }
        assert!(!all.contains("hunter2"), "{all}");
        assert_eq!(n.values.len(), 1);
    }

    #[test]
    fn go_bools_are_exactly_strconv_parse_bool() {
        for t in ["1", "t", "T", "TRUE", "true", "True"] {
            assert!(parse_go_bool("X", t).unwrap());
        }
        for f in ["0", "f", "F", "FALSE", "false", "False"] {
            assert!(!parse_go_bool("X", f).unwrap());
        }
        assert!(parse_go_bool("X", "").is_err());
    }
}
