//! `--cloud aws`: each run gets a fresh moto EC2 server with one VPC, one
//! route table and an instance per Node, and the controllers reach it only
//! through provider-aws's testing proxy, which counts every request by
//! action and can enforce EC2's per-action token buckets, add latency and
//! answer a throttle storm. Fixture requests (VPC, instances, terminations,
//! table reads) go to moto directly, so the proxy's counters hold the
//! controller's requests and nothing else.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use provider_aws::testing::{self, Buckets, Proxy};
use serde::Serialize;
use tracing::{info, warn};

/// The zone every instance is in.
pub const ZONE: &str = "us-east-1a";

/// EC2's mutating bucket, which bounds how fast routes can be created
/// (`CreateRoute`) and instances prepared (`ModifyInstanceAttribute`).
const MUTATING_BURST: f64 = Buckets::EC2.mutating.burst;
const MUTATING_RATE: f64 = Buckets::EC2.mutating.per_second;

/// How the proxy stands in for EC2 in one invocation.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct AwsSettings {
    /// EC2's documented per-action buckets enforced by the proxy.
    pub buckets: bool,
    /// Added to every answer by the proxy.
    pub latency_ms: u64,
    /// A throttle storm of this many seconds (every request answered
    /// `RequestLimitExceeded`), starting once half the burst is created.
    pub storm_s: u64,
}

/// One run's EC2: moto, the proxy in front of it, the fixtures.
pub struct World {
    moto_name: String,
    pub proxy: Arc<Proxy>,
    client: testing::Client,
    pub route_table_id: String,
    pub vpc_id: String,
    pub subnet_id: String,
    /// Instance of Node `i`.
    pub instances: Vec<testing::Instance>,
}

impl std::fmt::Debug for World {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("World")
            .field("moto", &self.moto_name)
            .field("route_table_id", &self.route_table_id)
            .finish()
    }
}

async fn moto(cmd: &str, name: &str) -> anyhow::Result<String> {
    let script = testing::script_path();
    let out = tokio::process::Command::new("bash")
        .arg(&script)
        .args([
            cmd,
            "--name",
            name,
            "--owner-pid",
            &std::process::id().to_string(),
        ])
        .stderr(std::process::Stdio::inherit())
        .output()
        .await
        .with_context(|| format!("run {}", script.display()))?;
    if !out.status.success() {
        bail!("{} {cmd} failed: {}", script.display(), out.status);
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

impl World {
    /// Starts moto under `name`, creates the network and `instances`
    /// instances, and the proxy with `settings`.
    pub async fn start(
        name: &str,
        instances: usize,
        settings: AwsSettings,
    ) -> anyhow::Result<Self> {
        let began = Instant::now();
        let endpoint = moto("start", name).await?;
        let client = testing::client(&endpoint).await;
        let network = testing::create_network(&client, "172.31.0.0/16", Some("kubernetes"))
            .await
            .map_err(anyhow::Error::msg)?;
        let mut all = Vec::with_capacity(instances);
        // moto launches a few hundred per call comfortably.
        while all.len() < instances {
            let n = (instances - all.len()).min(250);
            let mut got = testing::run_instances(&client, &network, n as i32)
                .await
                .map_err(anyhow::Error::msg)?;
            all.append(&mut got);
        }
        let proxy = Proxy::start(&endpoint).await.map_err(anyhow::Error::msg)?;
        if settings.buckets {
            proxy.enforce_buckets(Some(Buckets::EC2));
        }
        proxy.set_latency(Duration::from_millis(settings.latency_ms));
        info!(
            moto = %endpoint,
            proxy = %proxy.url(),
            instances,
            seconds = began.elapsed().as_secs_f64(),
            "fresh moto with its instances"
        );
        Ok(World {
            moto_name: name.to_string(),
            proxy: Arc::new(proxy),
            client,
            route_table_id: network.route_table_id,
            vpc_id: network.vpc_id,
            subnet_id: network.subnet_id,
            instances: all,
        })
    }

    /// Stops this run's moto.
    pub async fn stop(self) {
        if let Err(e) = moto("stop", &self.moto_name).await {
            warn!(error = %e, "stopping moto");
        }
    }

    /// Instance routes of the table as destination → instance, read from
    /// moto directly (not counted by the proxy).
    pub async fn table(&self) -> anyhow::Result<BTreeMap<String, String>> {
        let routes = testing::table_routes(&self.client, &self.route_table_id)
            .await
            .map_err(anyhow::Error::msg)?;
        Ok(routes
            .into_iter()
            .filter(|(_, t, _)| t.starts_with("i-"))
            .map(|(d, t, _)| (d, t))
            .collect())
    }

    /// Terminates the instances of Nodes `nodes`; the proxy then lists
    /// routes to them as blackholes, as EC2 does.
    pub async fn terminate(&self, nodes: &[usize]) -> anyhow::Result<()> {
        let ids: Vec<String> = nodes
            .iter()
            .map(|&i| self.instances[i].id.clone())
            .collect();
        testing::terminate_instances(&self.client, &ids)
            .await
            .map_err(anyhow::Error::msg)?;
        for id in &ids {
            self.proxy.blackhole(id);
        }
        Ok(())
    }

    /// Writes the two controllers' cloud configs into `dir`: the upstream
    /// provider's gcfg INI (the same keys as the Go baseline's
    /// `awscloud.Config`) and this project's YAML, both aimed at the proxy.
    pub fn write_configs(
        &self,
        dir: &Path,
    ) -> anyhow::Result<(std::path::PathBuf, std::path::PathBuf)> {
        let region = testing::REGION;
        let url = self.proxy.url();
        let upstream = dir.join("aws-cloud.conf");
        std::fs::write(
            &upstream,
            format!(
                "[Global]\nZone = {ZONE}\nRegion = {region}\nVPC = {}\nSubnetID = {}\nRouteTableID = {}\nKubernetesClusterTag = kubernetes\n\n[ServiceOverride \"ec2\"]\nService = EC2\nRegion = {region}\nURL = {url}\nSigningRegion = {region}\n",
                self.vpc_id, self.subnet_id, self.route_table_id
            ),
        )
        .with_context(|| format!("write {}", upstream.display()))?;
        let ours = dir.join("aws.yaml");
        std::fs::write(
            &ours,
            format!(
                "region: {region}\nroute_table_id: {}\nendpoint: {url}\n",
                self.route_table_id
            ),
        )
        .with_context(|| format!("write {}", ours.display()))?;
        Ok((upstream, ours))
    }
}

/// The environment both controllers get: fake static credentials (moto
/// accepts any) and no instance metadata service.
pub const ENV: [(&str, &str); 4] = [
    ("AWS_ACCESS_KEY_ID", "testing"),
    ("AWS_SECRET_ACCESS_KEY", "testing"),
    ("AWS_REGION", testing::REGION),
    ("AWS_EC2_METADATA_DISABLED", "true"),
];

/// Requests the proxy saw for one action.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Requests {
    pub requests: u64,
    pub throttled: u64,
    pub errors: u64,
}

/// The proxy's counters as plain numbers.
pub fn requests(proxy: &Proxy) -> BTreeMap<String, Requests> {
    proxy
        .counts()
        .into_iter()
        .map(|(k, c)| {
            (
                k,
                Requests {
                    requests: c.requests,
                    throttled: c.throttled,
                    errors: c.errors,
                },
            )
        })
        .collect()
}

/// Seconds from `since` to the last successful answer to `action`, if one
/// came after `since`.
pub fn last_ok_after(proxy: &Proxy, action: &str, since: Instant) -> Option<f64> {
    proxy
        .counts()
        .get(action)
        .and_then(|c| c.last_ok)
        .filter(|t| *t >= since)
        .map(|t| t.duration_since(since).as_secs_f64())
}

/// Total requests in the counters.
pub fn total(r: &BTreeMap<String, Requests>) -> u64 {
    r.values().map(|c| c.requests).sum()
}

/// What no controller can do better, for the run's scenario.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Limits {
    /// One `DescribeRouteTables` to learn the table, one
    /// `ModifyInstanceAttribute` (source/destination check off) and one
    /// `CreateRoute` per new Node, one `DeleteRoute` per removed one.
    pub min_requests: u64,
    /// Fastest time from the first burst Node to its last route under the
    /// buckets (and the storm); `None` when nothing bounds it but moto.
    pub fastest_burst_s: Option<f64>,
    /// Fastest time from the scale-down to its last deletion.
    pub fastest_deletion_s: Option<f64>,
}

/// Seconds a full mutating bucket needs to grant `n` requests.
pub fn bucket_seconds(n: u64) -> f64 {
    ((n as f64 - MUTATING_BURST).max(0.0)) / MUTATING_RATE
}

/// The limits for `nodes + trickle` creations, `removed` deletions, with
/// the buckets on or off and a storm of `storm_s` seconds starting
/// `storm_start_s` after the first burst creation, when `created_at_storm`
/// Nodes exist.
pub fn limits(
    nodes: u64,
    trickle: u64,
    removed: u64,
    buckets: bool,
    storm: Option<(f64, f64, u64)>,
) -> Limits {
    let min_requests = 1 + 2 * (nodes + trickle) + removed;
    let fastest_burst_s = match (buckets, storm) {
        (true, None) => Some(bucket_seconds(nodes)),
        (true, Some((start, lasting, created))) => {
            // Before the storm: the burst plus the refill, at most the Nodes
            // that exist; during it nothing; it refills the bucket to its
            // burst, and the rest goes at the refill rate.
            let before = (MUTATING_BURST + MUTATING_RATE * start)
                .floor()
                .min(created as f64) as u64;
            let rest = nodes.saturating_sub(before);
            Some(if rest == 0 {
                bucket_seconds(nodes).min(start)
            } else {
                start + lasting + bucket_seconds(rest)
            })
        }
        (false, Some((start, lasting, created))) => Some(if created >= nodes {
            0.0
        } else {
            start + lasting
        }),
        (false, None) => None,
    };
    Limits {
        min_requests,
        fastest_burst_s,
        fastest_deletion_s: buckets.then(|| bucket_seconds(removed)),
    }
}

/// What one `--cloud aws` run measured, from the proxy and moto.
#[derive(Debug, Clone, Serialize)]
pub struct AwsRun {
    /// Requests by action ([`provider_aws::testing::proxy::bucket_key`]).
    pub requests: BTreeMap<String, Requests>,
    pub total_requests: u64,
    pub throttled: u64,
    pub limits: Limits,
    /// First burst creation to the last successful `CreateRoute` answered
    /// by the end of the burst wait.
    pub burst_last_route_s: Option<f64>,
    /// Instance routes in moto's table when the burst wait ended.
    pub burst_routes: usize,
    /// When the storm began, after the first burst creation.
    pub storm_start_s: Option<f64>,
    /// Scale-down start to the last successful `DeleteRoute`.
    pub last_deletion_s: Option<f64>,
    /// Removed Nodes whose instances were terminated first (the rest keep
    /// running).
    pub removed_terminated: usize,
    /// Requests per minute over the idle period.
    pub idle_requests_per_min: f64,
    pub table: TableCheck,
}

/// The final table against the one expected.
#[derive(Debug, Clone, Default, Serialize)]
pub struct TableCheck {
    pub routes: usize,
    pub expected: usize,
    /// Expected destinations absent.
    pub missing: usize,
    /// Destinations present that should not be (removed Nodes).
    pub extra: usize,
    /// Present but pointing at another instance.
    pub wrong_target: usize,
    /// A few of the differences, for the notes.
    pub examples: Vec<String>,
}

impl TableCheck {
    pub fn exact(&self) -> bool {
        self.missing == 0 && self.extra == 0 && self.wrong_target == 0
    }

    pub fn compare(got: &BTreeMap<String, String>, want: &BTreeMap<String, String>) -> Self {
        let mut c = TableCheck {
            routes: got.len(),
            expected: want.len(),
            ..TableCheck::default()
        };
        for (d, i) in want {
            match got.get(d) {
                None => {
                    c.missing += 1;
                    if c.examples.len() < 5 {
                        c.examples.push(format!("missing {d}"));
                    }
                }
                Some(g) if g != i => {
                    c.wrong_target += 1;
                    if c.examples.len() < 5 {
                        c.examples.push(format!("{d} → {g}, want {i}"));
                    }
                }
                Some(_) => {}
            }
        }
        for d in got.keys().filter(|d| !want.contains_key(*d)) {
            c.extra += 1;
            if c.examples.len() < 5 {
                c.examples.push(format!("extra {d}"));
            }
        }
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_limit_is_the_refill_after_the_burst() {
        assert_eq!(bucket_seconds(1000), 190.0);
        assert_eq!(bucket_seconds(200), 30.0);
        assert_eq!(bucket_seconds(20), 0.0);
        let l = limits(1000, 50, 100, true, None);
        // 1 + 2 × 1,050 + 100.
        assert_eq!(l.min_requests, 2201);
        assert_eq!(l.fastest_burst_s, Some(190.0));
        assert_eq!(l.fastest_deletion_s, Some(10.0));
        assert_eq!(limits(1000, 50, 100, false, None).fastest_burst_s, None);
    }

    #[test]
    fn a_storm_adds_its_length_and_refills_the_bucket() {
        // 200 Nodes, storm after 1 s for 30 s, 100 Nodes exist by then:
        // 55 routed before, 145 after: 30 s of storm, 50 at once, 95 at 5/s.
        let l = limits(200, 0, 0, true, Some((1.0, 30.0, 100)));
        assert_eq!(l.fastest_burst_s, Some(1.0 + 30.0 + 19.0));
        // Without buckets the Nodes created after the storm began wait it out.
        let l = limits(200, 0, 0, false, Some((1.0, 30.0, 100)));
        assert_eq!(l.fastest_burst_s, Some(31.0));
    }

    #[test]
    fn table_check_counts_each_kind_of_difference() {
        let want: BTreeMap<String, String> = [("a", "i-1"), ("b", "i-2"), ("c", "i-3")]
            .into_iter()
            .map(|(d, i)| (d.to_string(), i.to_string()))
            .collect();
        let got: BTreeMap<String, String> = [("a", "i-1"), ("b", "i-9"), ("x", "i-7")]
            .into_iter()
            .map(|(d, i)| (d.to_string(), i.to_string()))
            .collect();
        let c = TableCheck::compare(&got, &want);
        assert_eq!((c.missing, c.extra, c.wrong_target), (1, 1, 1));
        assert!(!c.exact());
        assert!(TableCheck::compare(&want, &want).exact());
    }
}
