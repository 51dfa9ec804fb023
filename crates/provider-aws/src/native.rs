//! cloud-provider-aws's own `--cloud-config` (the gcfg INI file its
//! `[Global]` section and `[ServiceOverride "N"]` sections live in),
//! translated into [`AwsConfig`]'s keys. Key meanings follow
//! kubernetes/cloud-provider-aws `pkg/providers/v1/config/config.go` and
//! `aws.go`; docs/providers.md's table lists each key and what it does here.

use ccm_config::{Ini, NativeConfig, Reader};

use crate::ConfigError;

/// The name messages give this format.
pub const FORMAT: &str = "cloud-provider-aws INI";

/// Keys of `[Global]` that only the load-balancer and node code of
/// cloud-provider-aws read.
const NOT_ROUTES: &[&str] = &[
    "DisableSecurityGroupIngress",
    "ElbSecurityGroup",
    "NLBSecurityGroupMode",
    "ClusterServiceLoadBalancerHealthProbeMode",
    "ClusterServiceLoadBalancerHealthProbePort",
    "ClusterServiceLoadBalancerHealthProbePath",
    "ClusterServiceSharedLoadBalancerHealthProbePort",
    "ClusterServiceSharedLoadBalancerHealthProbePath",
    "SupportedTopologyInstanceTypePattern",
    "DisableStrictZoneCheck",
];

/// The region an availability zone is in (`us-east-1a` → `us-east-1`,
/// the Local Zone `us-west-2-lax-1a` → `us-west-2`).
pub fn region_of_zone(zone: &str) -> Option<String> {
    let zone = zone
        .strip_suffix(|c: char| c.is_ascii_lowercase())
        .unwrap_or(zone);
    let mut parts = Vec::new();
    for part in zone.split('-') {
        parts.push(part);
        if part.chars().all(|c| c.is_ascii_digit()) && !part.is_empty() {
            return (parts.len() >= 3).then(|| parts.join("-"));
        }
    }
    None
}

/// Translates the INI `text`.
pub fn from_ccm_config(text: &str) -> Result<NativeConfig, ConfigError> {
    let ini = Ini::parse(text).map_err(|e| ConfigError::Parse(format!("{FORMAT}: {e}")))?;
    let r = Reader::new(&ini);
    let mut n = NativeConfig::new(FORMAT);
    let g = "global";

    let zone = r.get_set(g, "Zone");
    let region = r.get_set(g, "Region");
    match (&zone, &region) {
        (Some(z), region) => {
            let from_zone = region_of_zone(z).ok_or_else(|| {
                ConfigError::Invalid(format!("[Global] Zone {z:?} is not an availability zone"))
            })?;
            if let Some(r) = region
                && *r != from_zone
            {
                n.ignore(
                    format!("[Global] Region = {r}"),
                    &format!("Zone {z} is in {from_zone}, and the Zone's region wins, as in cloud-provider-aws"),
                );
            }
            n.set("region", from_zone, "[Global] Zone");
        }
        (None, Some(region)) => n.set("region", region.clone(), "[Global] Region"),
        (None, None) => {}
    }
    if let Some(vpc) = r.get_set(g, "VPC") {
        n.set("vpc_id", vpc, "[Global] VPC");
    }
    if let Some(id) = r.get_set(g, "RouteTableID") {
        n.set("route_table_id", id, "[Global] RouteTableID");
    }
    let role = r.get_set(g, "RoleARN");
    if let Some(arn) = &role {
        n.set("role_arn", arn.clone(), "[Global] RoleARN");
    }
    if let Some(arn) = r.get_set(g, "SourceARN") {
        if role.is_some() {
            n.set("source_arn", arn, "[Global] SourceARN");
        } else {
            n.ignore(
                format!("[Global] SourceARN = {arn}"),
                "without RoleARN no role is assumed, so there is no AssumeRole to send it with (as in cloud-provider-aws)",
            );
        }
    }
    let id = r.get_set(g, "KubernetesClusterID");
    let legacy = r.get_set(g, "KubernetesClusterTag");
    match (id, legacy) {
        (Some(a), Some(b)) if a != b => {
            return Err(ConfigError::Invalid(format!(
                "[Global] KubernetesClusterID {a:?} and KubernetesClusterTag {b:?} name different clusters"
            )));
        }
        (Some(id), legacy) => {
            n.set("cluster_id", id, "[Global] KubernetesClusterID");
            if legacy.is_some() {
                n.set("legacy_cluster_tag", true, "[Global] KubernetesClusterTag");
            }
        }
        (None, Some(id)) => {
            n.set("cluster_id", id, "[Global] KubernetesClusterTag");
            n.set("legacy_cluster_tag", true, "[Global] KubernetesClusterTag");
        }
        (None, None) => {}
    }
    if let Some(subnet) = r.get_set(g, "SubnetID") {
        n.ignore(
            format!("[Global] SubnetID = {subnet}"),
            "load balancers only",
        );
    }
    let families = r.get_all(g, "NodeIPFamilies");
    if !families.is_empty() {
        n.ignore(
            format!("[Global] NodeIPFamilies = {}", families.join(",")),
            "node addresses only; the families routed are --route-ip-families",
        );
    }
    // Named in the start-up line like every key without effect here, so an
    // operator does not wonder whether they were read.
    for key in NOT_ROUTES {
        if let Some(v) = r.get_set(g, key) {
            n.ignore(
                format!("[Global] {key} = {v}"),
                "read by cloud-provider-aws's load-balancer and node code only",
            );
        }
    }

    // cloud-provider-aws applies an override whose Service is the SDK's
    // service id and whose Region is the client's.
    let mut seen: Vec<(String, String)> = Vec::new();
    for sub in r.subsections("ServiceOverride") {
        let field = |k: &str| -> Result<String, ConfigError> {
            r.get_in("serviceoverride", Some(&sub), k)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
                .ok_or_else(|| ConfigError::Invalid(format!("[ServiceOverride {sub:?}] needs {k}")))
        };
        let service = field("Service")?;
        let over_region = field("Region")?;
        let url = field("URL")?;
        let signing_region = field("SigningRegion")?;
        let _ = r.get_in("serviceoverride", Some(&sub), "SigningName");
        let _ = r.get_in("serviceoverride", Some(&sub), "SigningMethod");
        let pair = (service.clone(), over_region.clone());
        if seen.contains(&pair) {
            return Err(ConfigError::Invalid(format!(
                "[ServiceOverride {sub:?}]: {service} in {over_region} is overridden twice"
            )));
        }
        seen.push(pair);
        let applies = n
            .values
            .get("region")
            .and_then(|v| v.as_str())
            .is_none_or(|ours| ours == over_region);
        let key = format!("[ServiceOverride {sub:?}] URL");
        // The SDK's service ids, matched exactly as cloud-provider-aws
        // matches them: `ec2` there is silently no override, so it is none
        // here either (both controllers then talk to the same endpoint).
        match service.as_str() {
            "EC2" if applies => {
                if signing_region != over_region {
                    n.ignore(
                        format!("[ServiceOverride {sub:?}] SigningRegion = {signing_region}"),
                        "requests are signed for the client's region",
                    );
                }
                n.set("endpoint", url, key);
            }
            "STS" if applies => n.set("sts_endpoint", url, key),
            other
                if !["EC2", "STS"].contains(&other)
                    && ["ec2", "sts"].contains(&other.to_ascii_lowercase().as_str()) =>
            {
                n.ignore(
                format!("[ServiceOverride {sub:?}] Service = {service}"),
                "the service id is spelled EC2 or STS; cloud-provider-aws matches it exactly and ignores this override, and so does this controller",
                )
            }
            _ => n.ignore(
                format!("[ServiceOverride {sub:?}] {service} in {over_region}"),
                "not a service or region the route code calls",
            ),
        }
    }
    r.skip_section("serviceoverride");
    for unused in r.unused() {
        n.ignore(
            unused,
            "not a key cloud-provider-aws reads, or read only by its load-balancer and node code",
        );
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::AwsConfig;

    fn parse(text: &str) -> AwsConfig {
        let n = from_ccm_config(text).unwrap();
        let c: AwsConfig = serde_json::from_value(serde_json::Value::Object(n.values)).unwrap();
        c.validate().unwrap();
        c
    }

    #[test]
    fn regions_are_cut_from_zones() {
        assert_eq!(region_of_zone("us-east-1a").as_deref(), Some("us-east-1"));
        assert_eq!(
            region_of_zone("us-gov-west-1b").as_deref(),
            Some("us-gov-west-1")
        );
        assert_eq!(
            region_of_zone("us-west-2-lax-1a").as_deref(),
            Some("us-west-2")
        );
        assert_eq!(
            region_of_zone("eu-central-1").as_deref(),
            Some("eu-central-1")
        );
        assert_eq!(region_of_zone("nowhere"), None);
    }

    // The shape of cloud-provider-aws's docs/development.md example for a
    // control plane off AWS, and of the keys its aws_test.go reads.
    #[test]
    fn an_off_aws_control_plane_file_translates_to_our_keys() {
        let text = "[Global]\nRegion = us-west-2\nVPC = vpc-0abc123\nSubnetID = subnet-0def456\n\
                    KubernetesClusterTag = my-cluster\nKubernetesClusterID = my-cluster\n\
                    DisableSecurityGroupIngress = true\n";
        let n = from_ccm_config(text).unwrap();
        assert_eq!(
            serde_json::Value::Object(n.values.clone()),
            json!({"region": "us-west-2", "vpc_id": "vpc-0abc123", "cluster_id": "my-cluster",
                   "legacy_cluster_tag": true})
        );
        assert_eq!(n.origins["region"], "[Global] Region");
        assert!(
            n.ignored.iter().any(|i| i.contains("SubnetID")),
            "{:?}",
            n.ignored
        );
        assert!(
            n.ignored
                .iter()
                .any(|i| i.contains("DisableSecurityGroupIngress = true")),
            "a load-balancer key is named as without effect: {:?}",
            n.ignored
        );
        let c = parse(text);
        assert_eq!(c.cluster_id.as_deref(), Some("my-cluster"));
    }

    #[test]
    fn zone_wins_over_region_and_says_so() {
        let n = from_ccm_config("[global]\nzone = eu-west-1b\nregion = us-east-1\n").unwrap();
        assert_eq!(n.values["region"], "eu-west-1");
        assert!(
            n.ignored.iter().any(|i| i.contains("Region = us-east-1")),
            "{:?}",
            n.ignored
        );
    }

    #[test]
    fn route_table_role_and_ec2_override_are_honoured() {
        let c = parse(
            "[Global]\nZone = us-east-1a\nRouteTableID = rtb-0123abcd\n\
             RoleARN = arn:aws:iam::123456789012:role/routes\n\
             [ServiceOverride \"1\"]\nService = EC2\nRegion = us-east-1\n\
             URL = https://ec2.us-east-1.vpce.example\nSigningRegion = us-east-1\n\
             [ServiceOverride \"2\"]\nService = STS\nRegion = us-east-1\n\
             URL = https://sts.example\nSigningRegion = us-east-1\n\
             [ServiceOverride \"3\"]\nService = elasticloadbalancing\nRegion = us-east-1\n\
             URL = https://elb.example\nSigningRegion = us-east-1\n",
        );
        assert_eq!(c.region.as_deref(), Some("us-east-1"));
        assert_eq!(c.route_table_id.as_deref(), Some("rtb-0123abcd"));
        assert_eq!(
            c.role_arn.as_deref(),
            Some("arn:aws:iam::123456789012:role/routes")
        );
        assert_eq!(
            c.endpoint.as_deref(),
            Some("https://ec2.us-east-1.vpce.example")
        );
        assert_eq!(c.sts_endpoint.as_deref(), Some("https://sts.example"));
    }

    #[test]
    fn source_arn_goes_with_the_role_and_is_named_without_one() {
        let c = parse(
            "[Global]\nRegion = us-east-1\nRoleARN = arn:aws:iam::123456789012:role/routes\n\
             SourceARN = arn:aws:eks:us-east-1:123456789012:cluster/prod\n",
        );
        assert_eq!(
            c.source_arn.as_deref(),
            Some("arn:aws:eks:us-east-1:123456789012:cluster/prod")
        );
        let n = from_ccm_config(
            "[Global]\nRegion = us-east-1\nSourceARN = arn:aws:eks:us-east-1:1:cluster/p\n",
        )
        .unwrap();
        assert!(!n.values.contains_key("source_arn"));
        assert!(
            n.ignored
                .iter()
                .any(|i| i.contains("SourceARN") && i.contains("without RoleARN")),
            "{:?}",
            n.ignored
        );
    }

    #[test]
    fn an_override_for_another_region_does_not_apply() {
        let n = from_ccm_config(
            "[Global]\nRegion = eu-west-1\n[ServiceOverride \"x\"]\nService = EC2\n\
             Region = us-east-1\nURL = https://ec2.example\nSigningRegion = us-east-1\n",
        )
        .unwrap();
        assert!(!n.values.contains_key("endpoint"));
        assert!(
            n.ignored.iter().any(|i| i.contains("EC2 in us-east-1")),
            "{:?}",
            n.ignored
        );
    }

    // cloud-provider-aws compares Service with the SDK's id `EC2` exactly:
    // `ec2` is no override there, so it must be none here, or the two
    // controllers would talk to different endpoints.
    #[test]
    fn a_lower_case_service_id_is_no_override_as_in_cloud_provider_aws() {
        let n = from_ccm_config(
            "[Global]\nRegion = us-east-1\n[ServiceOverride \"1\"]\nService = ec2\n\
             Region = us-east-1\nURL = https://ec2.example\nSigningRegion = us-east-1\n",
        )
        .unwrap();
        assert!(!n.values.contains_key("endpoint"));
        assert!(
            n.ignored
                .iter()
                .any(|i| i.contains("Service = ec2") && i.contains("EC2 or STS")),
            "{:?}",
            n.ignored
        );
    }

    #[test]
    fn bad_files_are_refused_with_the_reason() {
        for (text, says) in [
            ("[Global]\nRoute_Table_ID = rtb-1\n", "not '_'"),
            ("[Global]\nZone = nowhere\n", "not an availability zone"),
            (
                "[Global]\nKubernetesClusterID = a\nKubernetesClusterTag = b\n",
                "name different clusters",
            ),
            (
                "[ServiceOverride \"1\"]\nService = ec2\nRegion = r\nURL = u\n",
                "needs SigningRegion",
            ),
            (
                "[ServiceOverride \"1\"]\nService = EC2\nRegion = r\nURL = u\nSigningRegion = r\n\
                 [ServiceOverride \"2\"]\nService = EC2\nRegion = r\nURL = v\nSigningRegion = r\n",
                "overridden twice",
            ),
        ] {
            let e = from_ccm_config(text).unwrap_err().to_string();
            assert!(e.contains(says), "{text:?}: {e}");
        }
    }

    #[test]
    fn keys_nobody_reads_are_named_once() {
        let n = from_ccm_config("[Global]\nRegion = us-east-1\nRegoin = typo\n[Unknown]\nx = 1\n")
            .unwrap();
        let named: Vec<_> = n
            .ignored
            .iter()
            .filter(|i| i.contains("Regoin") || i.contains("[unknown] x"))
            .collect();
        assert_eq!(named.len(), 2, "{:?}", n.ignored);
    }
}
