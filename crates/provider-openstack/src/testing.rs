//! Test support (feature `testing`): a real neutron-server and the network objects a router
//! needs, for this crate's tests and for end-to-end tests in other crates.
//!
//! [`neutron_server`] uses the server named by `CRC_NEUTRON_URL` (and
//! `CRC_NEUTRON_DB`, its SQLite file) when set; otherwise it runs
//! `scripts/neutron.sh env` once per process, which installs the pinned
//! Neutron into a cached virtualenv on first use and starts (or reuses) a
//! server on 127.0.0.1. Stop it with `scripts/neutron.sh stop`.
//!
//! [`Proxy`] sits between the provider and the server to count requests
//! and inject Neutron's error answers (see [`proxy`]).
//!
//! Nothing here is used by the provider itself.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use tokio::sync::OnceCell;

pub mod keystone;
pub mod proxy;
pub use keystone::Keystone;
pub use proxy::Proxy;

/// A running neutron-server.
#[derive(Debug, Clone)]
pub struct NeutronServer {
    /// The API endpoint, `http://127.0.0.1:PORT` (without `/v2.0`).
    pub url: String,
    /// Its SQLite database, when known (for injecting rows the API refuses).
    pub db: Option<PathBuf>,
}

static SERVER: OnceCell<NeutronServer> = OnceCell::const_new();

/// The script that installs and starts the server.
pub fn script_path() -> PathBuf {
    std::env::var_os("CRC_NEUTRON_SCRIPT")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/neutron.sh")
        })
}

/// The shared test server (see the module docs).
pub async fn neutron_server() -> Result<NeutronServer, String> {
    SERVER
        .get_or_try_init(|| async {
            if let Ok(url) = std::env::var("CRC_NEUTRON_URL")
                && !url.trim().is_empty()
            {
                return Ok(NeutronServer {
                    url: url.trim().trim_end_matches('/').to_string(),
                    db: std::env::var_os("CRC_NEUTRON_DB").map(PathBuf::from),
                });
            }
            let script = script_path();
            let out = tokio::process::Command::new("bash")
                .arg(&script)
                .arg("env")
                .stderr(std::process::Stdio::inherit())
                .output()
                .await
                .map_err(|e| format!("running {}: {e}", script.display()))?;
            if !out.status.success() {
                return Err(format!("{} env failed: {}", script.display(), out.status));
            }
            let text = String::from_utf8_lossy(&out.stdout);
            let get = |k: &str| {
                text.lines()
                    .find_map(|l| l.strip_prefix(k))
                    .map(|v| v.trim().to_string())
            };
            let url = get("CRC_NEUTRON_URL=").ok_or_else(|| {
                format!("{} printed no CRC_NEUTRON_URL: {text}", script.display())
            })?;
            Ok(NeutronServer {
                url,
                db: get("CRC_NEUTRON_DB=").map(PathBuf::from),
            })
        })
        .await
        .cloned()
}

/// A router with one subnet attached, owned by its own project.
#[derive(Debug, Clone)]
pub struct TestRouter {
    /// The router id.
    pub router_id: String,
    /// The router's name.
    pub name: String,
    /// The project that owns the network, subnet and router.
    pub project_id: String,
    /// The network the router's subnets belong to.
    pub network_id: String,
    /// The subnet the router is attached to (next hops must be in it).
    pub subnet_cidr: String,
}

/// A unique 32-hex-digit project id.
pub fn unique_project_id() -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos() as u64;
    format!(
        "{:016x}{:08x}{:08x}",
        nanos,
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A small noauth admin client for setting up test objects.
#[derive(Debug, Clone)]
pub struct Admin {
    client: reqwest::Client,
    base: String,
}

impl Admin {
    /// A client for the server at `url` (without `/v2.0`).
    pub fn new(url: &str) -> Self {
        Self {
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(60))
                .build()
                .unwrap_or_default(),
            base: format!("{}/v2.0", url.trim_end_matches('/')),
        }
    }

    /// Sends a request and returns (status, JSON body or Null).
    pub async fn request(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
        if_match: Option<u64>,
    ) -> Result<(u16, Value), String> {
        let mut req = self
            .client
            .request(method.clone(), format!("{}{path}", self.base));
        if let Some(b) = body {
            req = req.json(&b);
        }
        if let Some(r) = if_match {
            req = req.header("If-Match", format!("revision_number={r}"));
        }
        let resp = req
            .send()
            .await
            .map_err(|e| format!("{method} {path}: {e}"))?;
        let status = resp.status().as_u16();
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| format!("{method} {path}: {e}"))?;
        let v = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        Ok((status, v))
    }

    async fn create(&self, path: &str, body: Value, key: &str) -> Result<Value, String> {
        let (status, v) = self
            .request(reqwest::Method::POST, path, Some(body), None)
            .await?;
        if status != 201 {
            return Err(format!("POST {path}: {status} {v}"));
        }
        Ok(v[key].clone())
    }

    /// Adds routes to a router as another tool would (`add_extraroutes`).
    pub async fn add_routes(&self, router_id: &str, routes: &[(&str, &str)]) -> Result<(), String> {
        let routes: Vec<Value> = routes
            .iter()
            .map(|(d, n)| json!({"destination": d, "nexthop": n}))
            .collect();
        let path = format!("/routers/{router_id}/add_extraroutes");
        let (status, v) = self
            .request(
                reqwest::Method::PUT,
                &path,
                Some(json!({"router": {"routes": routes}})),
                None,
            )
            .await?;
        if status != 200 {
            return Err(format!("PUT {path}: {status} {v}"));
        }
        Ok(())
    }

    /// Creates a network, a subnet of `subnet_cidr` and a router attached to it,
    /// all in a fresh project.
    pub async fn create_router(&self, name: &str, subnet_cidr: &str) -> Result<TestRouter, String> {
        let project_id = unique_project_id();
        let net = self
            .create(
                "/networks",
                json!({"network": {"name": name, "project_id": project_id}}),
                "network",
            )
            .await?;
        let ip_version = if subnet_cidr.contains(':') { 6 } else { 4 };
        let subnet = self
            .create(
                "/subnets",
                json!({"subnet": {"name": name, "network_id": net["id"], "cidr": subnet_cidr,
                                  "ip_version": ip_version, "project_id": project_id}}),
                "subnet",
            )
            .await?;
        let router = self
            .create(
                "/routers",
                json!({"router": {"name": name, "project_id": project_id}}),
                "router",
            )
            .await?;
        let router_id = router["id"].as_str().unwrap_or_default().to_string();
        let (status, v) = self
            .request(
                reqwest::Method::PUT,
                &format!("/routers/{router_id}/add_router_interface"),
                Some(json!({"subnet_id": subnet["id"]})),
                None,
            )
            .await?;
        if status != 200 {
            return Err(format!("add_router_interface: {status} {v}"));
        }
        Ok(TestRouter {
            router_id,
            name: name.to_string(),
            project_id,
            network_id: net["id"].as_str().unwrap_or_default().to_string(),
            subnet_cidr: subnet_cidr.to_string(),
        })
    }

    /// Adds a subnet of `cidr` to the router's network and attaches it to
    /// the router, so next hops in it are accepted (e.g. IPv6 ones).
    pub async fn add_subnet(&self, router: &TestRouter, cidr: &str) -> Result<(), String> {
        let ip_version = if cidr.contains(':') { 6 } else { 4 };
        let subnet = self
            .create(
                "/subnets",
                json!({"subnet": {"name": router.name, "network_id": router.network_id, "cidr": cidr,
                                  "ip_version": ip_version, "project_id": router.project_id}}),
                "subnet",
            )
            .await?;
        let (status, v) = self
            .request(
                reqwest::Method::PUT,
                &format!("/routers/{}/add_router_interface", router.router_id),
                Some(json!({"subnet_id": subnet["id"]})),
                None,
            )
            .await?;
        if status != 200 {
            return Err(format!("add_router_interface {cidr}: {status} {v}"));
        }
        Ok(())
    }

    /// Creates a port on the router's network with `fixed_ips` (addresses on
    /// its subnets), port security on or off and `pairs` as its
    /// `allowed_address_pairs`: a Node's port. Returns its id.
    pub async fn create_port(
        &self,
        router: &TestRouter,
        device_id: &str,
        fixed_ips: &[&str],
        port_security: bool,
        pairs: Value,
    ) -> Result<String, String> {
        let ips: Vec<Value> = fixed_ips
            .iter()
            .map(|ip| json!({"ip_address": ip}))
            .collect();
        let mut port = json!({"network_id": router.network_id, "project_id": router.project_id,
                              "device_id": device_id, "fixed_ips": ips,
                              "port_security_enabled": port_security});
        // Neutron refuses pairs on a port without port security.
        if port_security {
            port["allowed_address_pairs"] = pairs;
        }
        let p = self
            .create("/ports", json!({ "port": port }), "port")
            .await?;
        p["id"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| format!("the new port has no id: {p}"))
    }

    /// Creates many Node ports in one bulk request: `(device_id, fixed IP,
    /// allowed_address_pairs)` each, port security on. Returns their ids
    /// in order.
    pub async fn create_ports(
        &self,
        router: &TestRouter,
        ports: &[(String, String, Value)],
    ) -> Result<Vec<String>, String> {
        let body: Vec<Value> = ports
            .iter()
            .map(|(device, ip, pairs)| {
                json!({"network_id": router.network_id, "project_id": router.project_id,
                       "device_id": device, "fixed_ips": [{"ip_address": ip}],
                       "allowed_address_pairs": pairs})
            })
            .collect();
        let (status, v) = self
            .request(
                reqwest::Method::POST,
                "/ports",
                Some(json!({ "ports": body })),
                None,
            )
            .await?;
        if status != 201 {
            return Err(format!("POST /ports (bulk): {status} {v}"));
        }
        v["ports"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or(&[])
            .iter()
            .map(|p| {
                p["id"]
                    .as_str()
                    .map(str::to_string)
                    .ok_or_else(|| format!("a new port has no id: {p}"))
            })
            .collect()
    }

    /// Every port of the router's network: id → its `allowed_address_pairs`
    /// as read (one request).
    pub async fn pairs_on_network(
        &self,
        router: &TestRouter,
    ) -> Result<std::collections::HashMap<String, Vec<Value>>, String> {
        let path = format!(
            "/ports?network_id={}&fields=id&fields=allowed_address_pairs",
            router.network_id
        );
        let (status, v) = self
            .request(reqwest::Method::GET, &path, None, None)
            .await?;
        if status != 200 {
            return Err(format!("GET {path}: {status} {v}"));
        }
        Ok(v["ports"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or(&[])
            .iter()
            .filter_map(|p| {
                Some((
                    p["id"].as_str()?.to_string(),
                    p["allowed_address_pairs"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default(),
                ))
            })
            .collect())
    }

    /// A port as the server holds it.
    pub async fn port(&self, id: &str) -> Result<Value, String> {
        let (status, v) = self
            .request(reqwest::Method::GET, &format!("/ports/{id}"), None, None)
            .await?;
        if status != 200 {
            return Err(format!("GET port {id}: {status} {v}"));
        }
        Ok(v["port"].clone())
    }

    /// A port's `allowed_address_pairs` as `ip_address` strings, sorted:
    /// Neutron keeps the pairs in rows of their own and promises no order.
    pub async fn pair_ips(&self, id: &str) -> Result<Vec<String>, String> {
        let mut ips: Vec<String> = self.port(id).await?["allowed_address_pairs"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or(&[])
            .iter()
            .filter_map(|p| p["ip_address"].as_str().map(str::to_string))
            .collect();
        ips.sort();
        Ok(ips)
    }

    /// Replaces a port's `allowed_address_pairs` as another tool would.
    pub async fn set_pairs(&self, id: &str, pairs: Value) -> Result<(), String> {
        let (status, v) = self
            .request(
                reqwest::Method::PUT,
                &format!("/ports/{id}"),
                Some(json!({"port": {"allowed_address_pairs": pairs}})),
                None,
            )
            .await?;
        if status != 200 {
            return Err(format!("PUT port {id}: {status} {v}"));
        }
        Ok(())
    }

    /// A second router in `router`'s project, attached to the same network
    /// through a port at `ip`, so next hops on that network are valid for
    /// both routers.
    pub async fn create_sibling_router(
        &self,
        router: &TestRouter,
        name: &str,
        ip: &str,
    ) -> Result<String, String> {
        let r = self
            .create(
                "/routers",
                json!({"router": {"name": name, "project_id": router.project_id}}),
                "router",
            )
            .await?;
        let id = r["id"].as_str().unwrap_or_default().to_string();
        let port = self
            .create(
                "/ports",
                json!({"port": {"network_id": router.network_id, "project_id": router.project_id,
                                "fixed_ips": [{"ip_address": ip}]}}),
                "port",
            )
            .await?;
        let (status, v) = self
            .request(
                reqwest::Method::PUT,
                &format!("/routers/{id}/add_router_interface"),
                Some(json!({"port_id": port["id"]})),
                None,
            )
            .await?;
        if status != 200 {
            return Err(format!("add_router_interface port {ip}: {status} {v}"));
        }
        Ok(id)
    }

    /// Sets the project's route quota (routes per router).
    pub async fn set_route_quota(&self, project_id: &str, routes: i64) -> Result<(), String> {
        let (status, v) = self
            .request(
                reqwest::Method::PUT,
                &format!("/quotas/{project_id}"),
                Some(json!({"quota": {"router_route": routes}})),
                None,
            )
            .await?;
        if status != 200 {
            return Err(format!("setting the quota: {status} {v}"));
        }
        Ok(())
    }

    /// The router's `routes` as (destination, nexthop) and its revision.
    pub async fn routes(&self, router_id: &str) -> Result<(Vec<(String, String)>, u64), String> {
        let (status, v) = self
            .request(
                reqwest::Method::GET,
                &format!("/routers/{router_id}"),
                None,
                None,
            )
            .await?;
        if status != 200 {
            return Err(format!("GET router: {status} {v}"));
        }
        let routes = v["router"]["routes"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or(&[])
            .iter()
            .map(|r| {
                (
                    r["destination"].as_str().unwrap_or_default().to_string(),
                    r["nexthop"].as_str().unwrap_or_default().to_string(),
                )
            })
            .collect();
        Ok((routes, v["router"]["revision_number"].as_u64().unwrap_or(0)))
    }
}

/// Writes a route row straight into the server's database, bypassing the
/// API's validation: how a router ends up holding routes no client could have
/// created (old releases, manual database edits). Needs `python3`.
pub async fn insert_raw_route(
    server: &NeutronServer,
    router_id: &str,
    destination: &str,
    nexthop: &str,
) -> Result<(), String> {
    let db = server
        .db
        .as_ref()
        .ok_or("the server's database is unknown (set CRC_NEUTRON_DB)")?;
    let code = "import sqlite3, sys\n\
                db = sqlite3.connect(sys.argv[1], timeout=30)\n\
                db.execute('insert into routerroutes(router_id, destination, nexthop) values (?, ?, ?)', sys.argv[2:5])\n\
                db.commit()\n";
    let out = tokio::process::Command::new("python3")
        .arg("-c")
        .arg(code)
        .arg(db)
        .arg(router_id)
        .arg(destination)
        .arg(nexthop)
        .output()
        .await
        .map_err(|e| format!("python3: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "inserting the row: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(())
}
