//! Configuration of the `aws` provider (`--cloud-config` for
//! `--cloud-provider aws`).
//!
//! The file holds no credentials: they come from the standard AWS chain
//! (environment, shared profile, web identity, container or instance
//! metadata). The file is YAML; JSON is accepted too, being YAML.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Settings of the AWS EC2 provider. Every key is optional.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AwsConfig {
    /// The region of the VPC (e.g. `eu-west-1`). When unset the standard
    /// chain decides (`AWS_REGION`, the profile, instance metadata).
    pub region: Option<String>,
    /// One route table to manage: the same as a one-element
    /// `route_table_ids` (both may be given; the lists are joined).
    pub route_table_id: Option<String>,
    /// The route tables to manage (e.g. one private table per zone): every
    /// Node's route goes into each. When neither this nor `route_table_id` is
    /// set, the tables are found by the tag `kubernetes.io/cluster/<cluster-name>`
    /// (any value) with a filtered, paginated `DescribeRouteTables`, leaving
    /// out every VPC main table; at least one table must carry the tag.
    pub route_table_ids: Vec<String>,
    /// Extra tags a discovered table must carry too (`key: value`), e.g.
    /// `{kubernetes.io/role/internal-elb: "1"}` to take only private tables
    /// (ignored with configured ids).
    pub route_table_tags: std::collections::BTreeMap<String, String>,
    /// Narrows the tag lookup to one VPC (ignored with configured ids).
    pub vpc_id: Option<String>,
    /// The EC2 endpoint URL (tests, private endpoints). `AWS_ENDPOINT_URL_EC2`
    /// and `AWS_ENDPOINT_URL` work too; this key wins over them.
    pub endpoint: Option<String>,
    /// The client-side request budget.
    pub rate_limit: RateLimitConfig,
    /// Timeout of one EC2 request, in seconds (default 30).
    pub request_timeout_seconds: u64,
    /// Route changes the controller may have in flight at once (default 10).
    pub max_concurrent_operations: usize,
    /// Routes per table the account allows (quota L-93826ACB: 50 by
    /// default historically, 500 since 2025, adjustable to 1,000), if the
    /// controller should know it in advance. It holds for each table on its
    /// own; EC2 answers `RouteLimitExceeded` past it either way.
    pub max_routes: Option<usize>,
    /// The cluster id whose tag (`kubernetes.io/cluster/<id>`) marks the
    /// cluster's route tables and instances, when it differs from
    /// `--cluster-name` (cloud-provider-aws's `KubernetesClusterID`).
    pub cluster_id: Option<String>,
    /// Whether the legacy tag `KubernetesCluster=<id>` marks the cluster's
    /// route tables and instances too, as cloud-provider-aws reads it (its
    /// `KubernetesClusterTag`); discovery then sends a second filtered
    /// `DescribeRouteTables` for it. Instances tagged `KubernetesCluster`
    /// for another cluster are that cluster's either way.
    pub legacy_cluster_tag: bool,
    /// A role to assume (STS `AssumeRole`) for every EC2 request, with the
    /// credentials of the standard chain (cloud-provider-aws's `RoleARN`).
    pub role_arn: Option<String>,
    /// The resource the role is assumed for, sent with `AssumeRole` as
    /// `x-amz-source-arn` (cloud-provider-aws's `SourceARN`), for a trust
    /// policy that conditions on `aws:SourceArn`. Only with `role_arn`.
    pub source_arn: Option<String>,
    /// The STS endpoint for `role_arn` (a `[ServiceOverride]` of `sts`).
    pub sts_endpoint: Option<String>,
}

impl Default for AwsConfig {
    fn default() -> Self {
        Self {
            region: None,
            route_table_id: None,
            route_table_ids: Vec::new(),
            route_table_tags: std::collections::BTreeMap::new(),
            vpc_id: None,
            endpoint: None,
            rate_limit: RateLimitConfig::default(),
            request_timeout_seconds: 30,
            max_concurrent_operations: 10,
            max_routes: None,
            cluster_id: None,
            legacy_cluster_tag: false,
            role_arn: None,
            source_arn: None,
            sts_endpoint: None,
        }
    }
}

/// One token bucket: a sustained rate and a burst.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Budget {
    /// Requests per second, sustained.
    pub per_second: f64,
    /// Requests that may go out at once after a quiet period.
    pub burst: u32,
}

/// The client-side budget. EC2 throttles per account, region and API action
/// with a token bucket per action; the defaults are EC2's documented buckets,
/// and this client keeps one bucket per action too. Lower them when other
/// tools in the account share the budget.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RateLimitConfig {
    /// Each read action (`DescribeRouteTables`, `DescribeInstances`):
    /// default 19.6/s, burst 100 (EC2's non-mutating bucket refills 20/s).
    pub read: Budget,
    /// Each write action (`CreateRoute`, `ReplaceRoute`, `DeleteRoute`,
    /// `ModifyInstanceAttribute`): default 4.9/s, burst 50 (EC2's mutating
    /// bucket refills 5/s).
    ///
    /// Both rates are 2 % under EC2's: with exactly EC2's refill, a request
    /// whose token this client saw a few milliseconds before EC2 did (clock
    /// phase, network jitter) reaches an empty EC2 bucket and is throttled.
    /// 2 % is 4 ms per write token, more than that jitter, and costs 0.6 s
    /// over a 30 s burst of 150 writes past the bucket.
    pub write: Budget,
    /// How long an action's bucket stops after a `RequestLimitExceeded`
    /// answer, in milliseconds (default 1000); doubles with each further
    /// throttle of that action in a row, up to 30 s.
    pub throttle_pause_ms: u64,
}

impl Default for RateLimitConfig {
    fn default() -> Self {
        Self {
            read: Budget {
                per_second: 19.6,
                burst: 100,
            },
            write: Budget {
                per_second: 4.9,
                burst: 50,
            },
            throttle_pause_ms: 1000,
        }
    }
}

/// Why a configuration cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The text does not match the schema.
    #[error("parsing the AWS cloud config: {0}")]
    Parse(String),
    /// A value is out of range or malformed.
    #[error("AWS cloud config: {0}")]
    Invalid(String),
}

impl AwsConfig {
    /// Parses YAML or JSON and validates it. An empty text is the default
    /// configuration.
    pub fn from_yaml(text: &str) -> Result<Self, ConfigError> {
        let c: Self = if text.trim().is_empty() {
            Self::default()
        } else {
            serde_yaml_ng::from_str(text).map_err(|e| ConfigError::Parse(e.to_string()))?
        };
        c.validate()?;
        Ok(c)
    }

    /// Checks values serde cannot.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Some(id) = &self.route_table_id
            && !valid_id(id, "rtb-")
        {
            return Err(ConfigError::Invalid(format!(
                "route_table_id {id:?} is not a route table id (rtb-...)"
            )));
        }
        for id in &self.route_table_ids {
            if !valid_id(id, "rtb-") {
                return Err(ConfigError::Invalid(format!(
                    "route_table_ids: {id:?} is not a route table id (rtb-...)"
                )));
            }
        }
        if self.route_table_tags.keys().any(|k| k.is_empty()) {
            return Err(ConfigError::Invalid(
                "route_table_tags: a tag key must not be empty".into(),
            ));
        }
        if let Some(id) = &self.vpc_id
            && !valid_id(id, "vpc-")
        {
            return Err(ConfigError::Invalid(format!(
                "vpc_id {id:?} is not a VPC id (vpc-...)"
            )));
        }
        if let Some(r) = &self.region
            && (r.is_empty()
                || !r
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'))
        {
            return Err(ConfigError::Invalid(format!(
                "region {r:?} is not a region name"
            )));
        }
        for (name, url) in [
            ("endpoint", &self.endpoint),
            ("sts_endpoint", &self.sts_endpoint),
        ] {
            if let Some(e) = url
                && !(e.starts_with("http://") || e.starts_with("https://"))
            {
                return Err(ConfigError::Invalid(format!(
                    "{name} {e:?} must be an http:// or https:// URL"
                )));
            }
        }
        if let Some(id) = &self.cluster_id
            && (id.is_empty() || id.contains(char::is_whitespace))
        {
            return Err(ConfigError::Invalid(format!(
                "cluster_id {id:?} is not a cluster id"
            )));
        }
        if let Some(arn) = &self.role_arn
            && !(arn.starts_with("arn:") && arn.contains(":role/"))
        {
            return Err(ConfigError::Invalid(format!(
                "role_arn {arn:?} is not an IAM role ARN (arn:aws:iam::<account>:role/<name>)"
            )));
        }
        if let Some(arn) = &self.source_arn {
            if self.role_arn.is_none() {
                return Err(ConfigError::Invalid(
                    "source_arn is sent only when a role is assumed: set role_arn too, or remove source_arn".into(),
                ));
            }
            if !arn.starts_with("arn:") || arn.splitn(6, ':').count() < 6 {
                return Err(ConfigError::Invalid(format!(
                    "source_arn {arn:?} is not an ARN (arn:<partition>:<service>:<region>:<account>:<resource>)"
                )));
            }
        }
        for (name, b) in [
            ("rate_limit.read", self.rate_limit.read),
            ("rate_limit.write", self.rate_limit.write),
        ] {
            if !(b.per_second.is_finite() && b.per_second > 0.0) || b.burst == 0 {
                return Err(ConfigError::Invalid(format!(
                    "{name} needs per_second > 0 and burst >= 1"
                )));
            }
        }
        if self.request_timeout_seconds == 0 {
            return Err(ConfigError::Invalid(
                "request_timeout_seconds must be at least 1".into(),
            ));
        }
        if self.max_concurrent_operations == 0 {
            return Err(ConfigError::Invalid(
                "max_concurrent_operations must be at least 1".into(),
            ));
        }
        Ok(())
    }

    /// The configured route tables (`route_table_id` first, then
    /// `route_table_ids`, each once); empty means discovery by tag.
    pub fn configured_tables(&self) -> Vec<String> {
        let mut ids: Vec<String> = Vec::new();
        for id in self.route_table_id.iter().chain(&self.route_table_ids) {
            if !ids.contains(id) {
                ids.push(id.clone());
            }
        }
        ids
    }

    /// The per-request timeout.
    pub fn request_timeout(&self) -> Duration {
        Duration::from_secs(self.request_timeout_seconds)
    }
}

/// `prefix` followed by at least one lowercase hex digit, nothing else.
fn valid_id(id: &str, prefix: &str) -> bool {
    id.strip_prefix(prefix).is_some_and(|rest| {
        !rest.is_empty()
            && rest
                .chars()
                .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_text_is_the_default() {
        let c = AwsConfig::from_yaml("  \n").unwrap();
        assert_eq!(c, AwsConfig::default());
        assert_eq!(c.rate_limit.write.per_second, 4.9);
        assert_eq!(c.rate_limit.read.burst, 100);
    }

    #[test]
    fn parses_every_key() {
        let c = AwsConfig::from_yaml(
            "region: eu-west-1\nroute_table_id: rtb-0a1b2c\nvpc_id: vpc-12ab\n\
             endpoint: http://127.0.0.1:5000\nrequest_timeout_seconds: 5\n\
             max_concurrent_operations: 4\nmax_routes: 500\n\
             rate_limit:\n  read: {per_second: 10, burst: 20}\n  write: {per_second: 2.5, burst: 5}\n  throttle_pause_ms: 250\n",
        )
        .unwrap();
        assert_eq!(c.region.as_deref(), Some("eu-west-1"));
        assert_eq!(c.route_table_id.as_deref(), Some("rtb-0a1b2c"));
        assert_eq!(c.vpc_id.as_deref(), Some("vpc-12ab"));
        assert_eq!(c.endpoint.as_deref(), Some("http://127.0.0.1:5000"));
        assert_eq!(c.request_timeout(), Duration::from_secs(5));
        assert_eq!(c.max_concurrent_operations, 4);
        assert_eq!(c.max_routes, Some(500));
        assert_eq!(
            c.rate_limit.write,
            Budget {
                per_second: 2.5,
                burst: 5
            }
        );
        assert_eq!(c.rate_limit.read.per_second, 10.0);
        assert_eq!(c.rate_limit.throttle_pause_ms, 250);
    }

    #[test]
    fn json_is_accepted() {
        let c =
            AwsConfig::from_yaml(r#"{"region": "us-east-1", "route_table_id": "rtb-1"}"#).unwrap();
        assert_eq!(c.route_table_id.as_deref(), Some("rtb-1"));
    }

    #[test]
    fn rejects_unknown_keys_and_bad_values() {
        for bad in [
            "route-table: rtb-1",
            "route_table_id: subnet-1",
            "route_table_id: rtb-",
            "vpc_id: rtb-1",
            "region: EU West",
            "endpoint: 127.0.0.1:5000",
            "rate_limit: {write: {per_second: 0, burst: 5}}",
            "rate_limit: {read: {per_second: 1, burst: 0}}",
            "request_timeout_seconds: 0",
            "max_concurrent_operations: 0",
            "region: [a, b]",
            "source_arn: arn:aws:eks:us-east-1:1:cluster/p",
            "role_arn: arn:aws:iam::1:role/r\nsource_arn: my-cluster",
        ] {
            assert!(AwsConfig::from_yaml(bad).is_err(), "{bad} was accepted");
        }
    }

    #[test]
    fn route_table_id_is_a_one_element_list_and_lists_join() {
        let c = AwsConfig::from_yaml("route_table_id: rtb-1").unwrap();
        assert_eq!(c.configured_tables(), vec!["rtb-1".to_string()]);
        let c = AwsConfig::from_yaml(
            "route_table_id: rtb-1\nroute_table_ids: [rtb-2, rtb-1, rtb-3]\n\
             route_table_tags: {kubernetes.io/role/internal-elb: \"1\"}",
        )
        .unwrap();
        assert_eq!(c.configured_tables(), vec!["rtb-1", "rtb-2", "rtb-3"]);
        assert_eq!(
            c.route_table_tags.get("kubernetes.io/role/internal-elb"),
            Some(&"1".to_string())
        );
        assert!(AwsConfig::default().configured_tables().is_empty());
        for bad in [
            "route_table_ids: [rtb-1, subnet-2]",
            "route_table_ids: rtb-1",
            "route_table_tags: {\"\": x}",
        ] {
            assert!(AwsConfig::from_yaml(bad).is_err(), "{bad} was accepted");
        }
    }
}
