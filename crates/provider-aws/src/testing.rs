//! Test support (feature `testing`): a moto EC2 server and the VPC objects a
//! route table needs, for this crate's tests and other crates' end-to-end
//! tests. Nothing here is used by the provider itself.
//!
//! [`moto_endpoint`] uses the server named by `CRC_MOTO_URL` when set;
//! otherwise it runs `scripts/moto.sh start --owner-pid <this process>` once
//! per process, which installs the pinned moto into a cached virtualenv on
//! first use and starts a server that stops when this process exits.
//!
//! [`Proxy`] sits between a client and moto to record requests, inject EC2's
//! throttling answer and report routes as blackholes (see [`proxy`]).

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use aws_config::{BehaviorVersion, Region, SdkConfig};
/// The EC2 client fixtures take, for crates that do not depend on the SDK.
pub use aws_sdk_ec2::Client;
use aws_sdk_ec2::config::Credentials;
use aws_sdk_ec2::error::DisplayErrorContext;
use aws_sdk_ec2::types::{ResourceType, Tag, TagSpecification};
use tokio::sync::OnceCell;

use crate::{AwsConfig, ConfigError, Ec2Routes};

pub mod proxy;
pub use proxy::{ActionCount, Bucket, Buckets, Logged, Proxy};

/// The region fixtures live in (moto's default).
pub const REGION: &str = "us-east-1";

static ENDPOINT: OnceCell<String> = OnceCell::const_new();

/// The script that installs and starts moto.
pub fn script_path() -> PathBuf {
    std::env::var_os("CRC_MOTO_SCRIPT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/moto.sh"))
}

/// The moto endpoint for this process (see the module docs).
pub async fn moto_endpoint() -> Result<String, String> {
    ENDPOINT
        .get_or_try_init(|| async {
            if let Ok(url) = std::env::var("CRC_MOTO_URL")
                && !url.is_empty()
            {
                return Ok(url.trim_end_matches('/').to_string());
            }
            let script = script_path();
            let out = tokio::process::Command::new("bash")
                .arg(&script)
                .args(["start", "--owner-pid", &std::process::id().to_string()])
                .stderr(std::process::Stdio::inherit())
                .output()
                .await
                .map_err(|e| format!("running {}: {e}", script.display()))?;
            if !out.status.success() {
                return Err(format!("{} start failed: {}", script.display(), out.status));
            }
            let url = String::from_utf8_lossy(&out.stdout).trim().to_string();
            if !url.starts_with("http://") {
                return Err(format!(
                    "{} printed {url:?}, not an endpoint",
                    script.display()
                ));
            }
            Ok(url)
        })
        .await
        .cloned()
}

/// An SDK configuration for `endpoint` with static test credentials (moto
/// accepts any), so no credential chain or metadata service is consulted.
pub async fn sdk_config(endpoint: &str) -> SdkConfig {
    aws_config::defaults(BehaviorVersion::latest())
        .region(Region::new(REGION))
        .endpoint_url(endpoint)
        .credentials_provider(Credentials::new("testing", "testing", None, None, "tests"))
        .load()
        .await
}

/// A plain SDK client for setting up fixtures.
pub async fn client(endpoint: &str) -> Client {
    Client::new(&sdk_config(endpoint).await)
}

/// The provider against `endpoint` with test credentials.
pub async fn provider(endpoint: &str, config: AwsConfig) -> Result<Ec2Routes, ConfigError> {
    Ec2Routes::from_sdk_config(config, &sdk_config(endpoint).await)
}

/// A cluster name no other test in this process (or earlier run) uses.
pub fn unique_cluster(prefix: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    format!(
        "{prefix}-{}-{nanos:x}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A VPC with one subnet and one extra route table.
#[derive(Debug, Clone)]
pub struct Network {
    /// `vpc-...`.
    pub vpc_id: String,
    /// `subnet-...` in zone `us-east-1a`.
    pub subnet_id: String,
    /// `rtb-...`, tagged for `cluster` when one was given.
    pub route_table_id: String,
}

/// An instance as a Node would describe it.
#[derive(Debug, Clone)]
pub struct Instance {
    /// `i-...`.
    pub id: String,
    /// `spec.providerID`: `aws:///<zone>/<id>`.
    pub provider_id: String,
    /// The private DNS name (upstream's node name).
    pub private_dns_name: String,
}

fn err(what: &str, e: impl std::error::Error) -> String {
    format!("{what}: {}", DisplayErrorContext(e))
}

/// Creates a VPC with `cidr`, a subnet and a route table, the table tagged
/// `kubernetes.io/cluster/<cluster>=owned` when `cluster` is given.
pub async fn create_network(
    client: &Client,
    cidr: &str,
    cluster: Option<&str>,
) -> Result<Network, String> {
    let vpc = client
        .create_vpc()
        .cidr_block(cidr)
        .send()
        .await
        .map_err(|e| err("CreateVpc", e))?;
    let vpc_id = vpc
        .vpc()
        .and_then(|v| v.vpc_id())
        .ok_or("CreateVpc returned no id")?
        .to_string();
    // A /20 leaves room for a benchmark's thousands of instances.
    let subnet_cidr = cidr.replace("/16", "/20");
    let subnet = client
        .create_subnet()
        .vpc_id(&vpc_id)
        .cidr_block(subnet_cidr)
        .availability_zone(format!("{REGION}a"))
        .send()
        .await
        .map_err(|e| err("CreateSubnet", e))?;
    let subnet_id = subnet
        .subnet()
        .and_then(|s| s.subnet_id())
        .ok_or("CreateSubnet returned no id")?
        .to_string();
    let mut req = client.create_route_table().vpc_id(&vpc_id);
    if let Some(c) = cluster {
        req = req.tag_specifications(
            TagSpecification::builder()
                .resource_type(ResourceType::RouteTable)
                .tags(
                    Tag::builder()
                        .key(crate::cluster_tag_key(c))
                        .value("owned")
                        .build(),
                )
                .build(),
        );
    }
    let rt = req.send().await.map_err(|e| err("CreateRouteTable", e))?;
    let route_table_id = rt
        .route_table()
        .and_then(|t| t.route_table_id())
        .ok_or("CreateRouteTable returned no id")?
        .to_string();
    Ok(Network {
        vpc_id,
        subnet_id,
        route_table_id,
    })
}

/// Launches `count` instances in the network's subnet.
pub async fn run_instances(
    client: &Client,
    network: &Network,
    count: i32,
) -> Result<Vec<Instance>, String> {
    let out = client
        .run_instances()
        .image_id("ami-12c6146b")
        .instance_type(aws_sdk_ec2::types::InstanceType::T3Micro)
        .subnet_id(&network.subnet_id)
        .min_count(count)
        .max_count(count)
        .send()
        .await
        .map_err(|e| err("RunInstances", e))?;
    out.instances()
        .iter()
        .map(|i| {
            let id = i.instance_id().ok_or("RunInstances returned no id")?;
            let zone = i
                .placement()
                .and_then(|p| p.availability_zone())
                .unwrap_or("us-east-1a");
            Ok(Instance {
                id: id.to_string(),
                provider_id: format!("aws:///{zone}/{id}"),
                private_dns_name: i.private_dns_name().unwrap_or_default().to_string(),
            })
        })
        .collect()
}

/// The routes of one table as (destination, instance id or other target:
/// gateway, interface, peering connection, transit gateway; state).
pub async fn table_routes(
    client: &Client,
    route_table_id: &str,
) -> Result<Vec<(String, String, String)>, String> {
    let out = client
        .describe_route_tables()
        .route_table_ids(route_table_id)
        .send()
        .await
        .map_err(|e| err("DescribeRouteTables", e))?;
    Ok(out
        .route_tables()
        .iter()
        .flat_map(|t| t.routes())
        .map(|r| {
            (
                r.destination_cidr_block()
                    .or(r.destination_ipv6_cidr_block())
                    .unwrap_or_default()
                    .to_string(),
                r.instance_id()
                    .or(r.gateway_id())
                    .or(r.network_interface_id())
                    .or(r.vpc_peering_connection_id())
                    .or(r.transit_gateway_id())
                    .unwrap_or_default()
                    .to_string(),
                r.state()
                    .map(|s| s.as_str().to_string())
                    .unwrap_or_default(),
            )
        })
        .collect())
}

/// Creates another route table in `vpc_id`, tagged with `tags`.
pub async fn create_route_table(
    client: &Client,
    vpc_id: &str,
    tags: &[(&str, &str)],
) -> Result<String, String> {
    let mut req = client.create_route_table().vpc_id(vpc_id);
    if !tags.is_empty() {
        let mut spec = TagSpecification::builder().resource_type(ResourceType::RouteTable);
        for (k, v) in tags {
            spec = spec.tags(Tag::builder().key(*k).value(*v).build());
        }
        req = req.tag_specifications(spec.build());
    }
    let rt = req.send().await.map_err(|e| err("CreateRouteTable", e))?;
    rt.route_table()
        .and_then(|t| t.route_table_id())
        .map(str::to_string)
        .ok_or_else(|| "CreateRouteTable returned no id".to_string())
}

/// The main route table of `vpc_id`.
pub async fn main_route_table(client: &Client, vpc_id: &str) -> Result<String, String> {
    let out = client
        .describe_route_tables()
        .filters(
            aws_sdk_ec2::types::Filter::builder()
                .name("vpc-id")
                .values(vpc_id)
                .build(),
        )
        .filters(
            aws_sdk_ec2::types::Filter::builder()
                .name("association.main")
                .values("true")
                .build(),
        )
        .send()
        .await
        .map_err(|e| err("DescribeRouteTables", e))?;
    out.route_tables()
        .iter()
        .find_map(|t| t.route_table_id())
        .map(str::to_string)
        .ok_or_else(|| format!("{vpc_id} has no main route table"))
}

/// Tags one resource.
pub async fn tag(client: &Client, resource: &str, key: &str, value: &str) -> Result<(), String> {
    client
        .create_tags()
        .resources(resource)
        .tags(Tag::builder().key(key).value(value).build())
        .send()
        .await
        .map_err(|e| err("CreateTags", e))?;
    Ok(())
}

/// Gives `instance` a second network interface (device index 1) in the
/// network's subnet and returns the id of its primary (device index 0).
pub async fn add_second_interface(
    client: &Client,
    network: &Network,
    instance: &Instance,
) -> Result<String, String> {
    let eni = client
        .create_network_interface()
        .subnet_id(&network.subnet_id)
        .send()
        .await
        .map_err(|e| err("CreateNetworkInterface", e))?;
    let eni_id = eni
        .network_interface()
        .and_then(|n| n.network_interface_id())
        .ok_or("CreateNetworkInterface returned no id")?
        .to_string();
    client
        .attach_network_interface()
        .network_interface_id(&eni_id)
        .instance_id(&instance.id)
        .device_index(1)
        .send()
        .await
        .map_err(|e| err("AttachNetworkInterface", e))?;
    let out = client
        .describe_instances()
        .instance_ids(&instance.id)
        .send()
        .await
        .map_err(|e| err("DescribeInstances", e))?;
    out.reservations()
        .iter()
        .flat_map(|r| r.instances())
        .flat_map(|i| i.network_interfaces())
        .find(|n| n.attachment().and_then(|a| a.device_index()) == Some(0))
        .and_then(|n| n.network_interface_id())
        .map(str::to_string)
        .ok_or_else(|| format!("{} shows no primary interface", instance.id))
}

/// A VPC peering connection from `vpc_id` to a new VPC with `peer_cidr`.
pub async fn create_peering(
    client: &Client,
    vpc_id: &str,
    peer_cidr: &str,
) -> Result<String, String> {
    let peer = client
        .create_vpc()
        .cidr_block(peer_cidr)
        .send()
        .await
        .map_err(|e| err("CreateVpc", e))?;
    let peer_id = peer
        .vpc()
        .and_then(|v| v.vpc_id())
        .ok_or("CreateVpc returned no id")?;
    let pcx = client
        .create_vpc_peering_connection()
        .vpc_id(vpc_id)
        .peer_vpc_id(peer_id)
        .send()
        .await
        .map_err(|e| err("CreateVpcPeeringConnection", e))?;
    pcx.vpc_peering_connection()
        .and_then(|p| p.vpc_peering_connection_id())
        .map(str::to_string)
        .ok_or_else(|| "CreateVpcPeeringConnection returned no id".to_string())
}

/// A transit gateway.
pub async fn create_transit_gateway(client: &Client) -> Result<String, String> {
    let tgw = client
        .create_transit_gateway()
        .send()
        .await
        .map_err(|e| err("CreateTransitGateway", e))?;
    tgw.transit_gateway()
        .and_then(|t| t.transit_gateway_id())
        .map(str::to_string)
        .ok_or_else(|| "CreateTransitGateway returned no id".to_string())
}

/// Adds a route to a table: `target` is an instance (`i-`), an interface
/// (`eni-`), a peering connection (`pcx-`) or a transit gateway (`tgw-`).
pub async fn add_route(
    client: &Client,
    route_table_id: &str,
    destination: &str,
    target: &str,
) -> Result<(), String> {
    let req = client
        .create_route()
        .route_table_id(route_table_id)
        .destination_cidr_block(destination);
    let req = match target.split('-').next() {
        Some("i") => req.instance_id(target),
        Some("eni") => req.network_interface_id(target),
        Some("pcx") => req.vpc_peering_connection_id(target),
        Some("tgw") => req.transit_gateway_id(target),
        _ => return Err(format!("add_route: unknown target kind {target}")),
    };
    req.send().await.map_err(|e| err("CreateRoute", e))?;
    Ok(())
}

/// Terminates `ids` (moto keeps routes to them, listed `active`; EC2 lists
/// them as blackholes, which [`Proxy::blackhole`] reproduces).
pub async fn terminate_instances(client: &Client, ids: &[String]) -> Result<(), String> {
    if ids.is_empty() {
        return Ok(());
    }
    client
        .terminate_instances()
        .set_instance_ids(Some(ids.to_vec()))
        .send()
        .await
        .map_err(|e| err("TerminateInstances", e))?;
    Ok(())
}

/// Whether the source/destination check of `instance` is on, as EC2 says.
pub async fn source_dest_check(client: &Client, instance: &str) -> Result<bool, String> {
    let out = client
        .describe_instance_attribute()
        .instance_id(instance)
        .attribute(aws_sdk_ec2::types::InstanceAttributeName::SourceDestCheck)
        .send()
        .await
        .map_err(|e| DisplayErrorContext(e).to_string())?;
    out.source_dest_check()
        .and_then(|v| v.value())
        .ok_or_else(|| format!("no sourceDestCheck for {instance}"))
}

/// Sets the source/destination check of `instance`, as an operator or a
/// tool resetting instance attributes would.
pub async fn set_source_dest_check(
    client: &Client,
    instance: &str,
    on: bool,
) -> Result<(), String> {
    client
        .modify_instance_attribute()
        .instance_id(instance)
        .source_dest_check(
            aws_sdk_ec2::types::AttributeBooleanValue::builder()
                .value(on)
                .build(),
        )
        .send()
        .await
        .map(|_| ())
        .map_err(|e| DisplayErrorContext(e).to_string())
}
