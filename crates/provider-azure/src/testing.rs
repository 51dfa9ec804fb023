//! A stateful fake of the parts of Azure a route controller uses (feature
//! `testing`): the ARM Network `routeTables` resource, its async-operation
//! status, ARM's throttling, and the Microsoft Entra token endpoints. Tests
//! start it on `127.0.0.1:0` with [`FakeAzure::start`] and point
//! `resourceManagerEndpoint`, `activeDirectoryAuthorityHost` and
//! `imdsEndpoint` at [`FakeAzure::base_url`]. Test hooks edit the state
//! directly and are not counted as requests.
//!
//! Where each behaviour comes from:
//!
//! | behaviour | source |
//! |---|---|
//! | `GET`/`PUT .../providers/Microsoft.Network/routeTables/{name}?api-version=`, the resource's JSON (`etag`, `location`, `tags`, `properties.routes[].properties.{addressPrefix, nextHopType, nextHopIpAddress, provisioningState}`, `disableBgpRoutePropagation`, `subnets`), `200` on update and `201` on create, `404 ResourceNotFound` | Azure REST API reference, Virtual Network, "Route Tables - Get" and "Route Tables - Create Or Update"; the recorded cassette `pkg/azclient/routetableclient/testdata/AZURECLOUD.yaml` of kubernetes-sigs/cloud-provider-azure |
//! | `nextHopType` values and "`nextHopIpAddress` only with `VirtualAppliance`" | "Route Tables - Create Or Update" (`RouteNextHopType`), "Virtual network traffic routing" (user-defined routes) |
//! | `If-Match` with the table's ETag, `412 PreconditionFailed` on a stale one | ARM's conditional requests; the upstream client sends the ETag (`pkg/azclient/policy/etag`, route-table client generated with `etag=true`); a second writer getting 412 is CAPZ #682 |
//! | a write is a long-running operation: `Azure-AsyncOperation` and `Retry-After` on the `PUT` answer; the status resource answers `{"status": "InProgress" \| "Succeeded" \| "Failed" \| "Canceled", "error": {code, message}}`; `provisioningState: Updating` until it ends | "Track asynchronous Azure operations" (Azure Resource Manager docs) |
//! | a `PUT` while the table's operation runs: `429` with code `RetryableError` and detail `RetryableErrorDueToAnotherOperation`, `Retry-After` | kubernetes/kubernetes#88151 (the logged NRP error), and the NRP behaviour the upstream 30 s batching (PR #88209) works around |
//! | ARM's token buckets per subscription (reads 250 / 25 per s, writes 200 / 10 per s), `429` with `Retry-After` (seconds; an HTTP date when `retry_after_as_date`), `x-ms-ratelimit-remaining-subscription-reads/-writes` on every answer | "Understand how Azure Resource Manager throttles requests" (request-limits-and-throttling); upstream `policy/retryrepectthrottled` reads `Retry-After` as seconds or a date. The error code `SubscriptionRequestsThrottled` is the one ARM answers in practice, not taken from that page |
//! | 1,000 routes per route table | "Azure subscription and service limits": user-defined routes per route table. The page names no error code: the fake answers `400 QuotaExceeded`, ARM's generic one |
//! | two routes with one `addressPrefix` refused | cloud-provider-azure #657 ("Routes cannot have the same AddressPrefix"); the code `InvalidRouteAddressPrefix` is the fake's own |
//! | `POST /{tenant}/oauth2/v2.0/token` with `grant_type=client_credentials` and `client_secret`, or `client_assertion_type=urn:ietf:params:oauth:client-assertion-type:jwt-bearer` + `client_assertion` (workload identity), `scope=<arm>/.default`; answer `{token_type, expires_in, access_token}`; `400/401 invalid_client` | Microsoft identity platform, "OAuth 2.0 client credentials flow" (shared secret and federated credential) |
//! | `GET /metadata/identity/oauth2/token?api-version=2018-02-01&resource=` with `Metadata: true`; `expires_in` as a string | "How to use managed identities for Azure resources on an Azure VM to acquire an access token" (IMDS) |
//! | `400 MissingApiVersionParameter` without `api-version`, `401 InvalidAuthenticationToken` without a valid bearer token | ARM's common error answers |
//! | `GET .../providers/Microsoft.Compute/virtualMachines/{name}?api-version=`: `properties.networkProfile.networkInterfaces[]` as `{id, properties: {primary}}` (`primary` left out when the VM has one NIC), `vmId`, `hardwareProfile`, `provisioningState`; `404 ResourceNotFound` | Azure REST API reference, Compute, "Virtual Machines - Get" (`NetworkInterfaceReference`) |
//! | `GET .../resourceGroups/{rg}/providers/Microsoft.Network/networkInterfaces?api-version=`: `{value: [NIC, ...]}` as each NIC's `GET` answers it, in one page (no `nextLink`); an empty list for another group | Azure REST API reference, Virtual Network, "Network Interfaces - List" |
//! | `GET .../providers/Microsoft.Network/networkInterfaces/{name}?api-version=`: `etag`, `properties.enableIPForwarding` (on unless [`FakeAzure::set_ip_forwarding`] turned it off), `primary`, `virtualMachine.id`, `ipConfigurations[].properties.{privateIPAddress, primary, privateIPAddressVersion}`; `404 ResourceNotFound` | Azure REST API reference, Virtual Network, "Network Interfaces - Get" |
//!
//! The wire format is checked by the official Azure SDK for Go, not only by
//! this crate's client: `tests/official_sdk_wire.rs` runs
//! `tools/azure-wire-check` (armnetwork v6 `RouteTablesClient` on azcore's
//! ARM pipeline) against the fake: a throttled `GET` retried after
//! `Retry-After`, a `PUT` with `If-Match` polled to the end through
//! `Azure-AsyncOperation`, `412 PreconditionFailed` and `404
//! ResourceNotFound` as `azcore.ResponseError` codes, and a `PUT` during a
//! running operation retried by the SDK. Run it with
//! `cargo test -p provider-azure --test official_sdk_wire`. The per-route
//! `routeTables/{table}/routes/{route}` resource is not served: the
//! provider writes whole tables only.

use std::collections::{BTreeMap, HashSet};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::Response;
use route_core::Cidr;
use serde_json::{Value, json};
use test_server::{Answers, Injections, Listener, TestServer};
use tokio::time::Instant;

/// Settings of the fake.
#[derive(Debug, Clone)]
pub struct FakeConfig {
    /// The subscription the tables live in.
    pub subscription: String,
    /// The resource group of the tables.
    pub resource_group: String,
    /// The tables' region (in operation URLs).
    pub location: String,
    /// The tenant whose token endpoint is served.
    pub tenant: String,
    /// The application id accepted.
    pub client_id: String,
    /// The client secret accepted.
    pub client_secret: String,
    /// The federated (service-account) token accepted as client assertion.
    pub federated_token: String,
    /// How long issued tokens live (`expires_in`).
    pub token_lifetime: Duration,
    /// Routes per table.
    pub max_routes: usize,
    /// How long a write's operation stays `InProgress`.
    pub operation_duration: Duration,
    /// The `Retry-After` (seconds) of a write's answer and of an
    /// `InProgress` status (default 10). ARM sends one; `None` sends none.
    pub operation_retry_after: Option<u64>,
    /// The read bucket's size and refill per second.
    pub reads: (u32, f64),
    /// The write bucket's size and refill per second.
    pub writes: (u32, f64),
    /// `Retry-After` of a throttling answer as an HTTP date, not seconds.
    pub retry_after_as_date: bool,
    /// How long every answer takes.
    pub latency: Duration,
}

impl Default for FakeConfig {
    fn default() -> Self {
        Self {
            subscription: "00000000-0000-0000-0000-00000000cafe".into(),
            resource_group: "k8s-rg".into(),
            location: "westeurope".into(),
            tenant: "00000000-0000-0000-0000-0000000000aa".into(),
            client_id: "00000000-0000-0000-0000-0000000000bb".into(),
            client_secret: "fake-client-secret".into(),
            federated_token: "fake.federated.token".into(),
            token_lifetime: Duration::from_secs(3599),
            max_routes: 1000,
            operation_duration: Duration::from_millis(30),
            operation_retry_after: Some(10),
            reads: (250, 25.0),
            writes: (200, 10.0),
            retry_after_as_date: false,
            latency: Duration::ZERO,
        }
    }
}

#[derive(Debug, Clone)]
struct TableState {
    name: String,
    location: String,
    tags: Value,
    etag: u64,
    disable_bgp: bool,
    routes: Vec<Value>,
    subnets: Vec<String>,
    /// The operation running on the table, and the routes to restore if it
    /// fails.
    running: Option<(String, Vec<Value>)>,
}

#[derive(Debug, Clone)]
struct OperationState {
    table: String,
    finishes: Instant,
    fail_with: Option<String>,
    outcome: Option<Option<String>>,
}

/// A standalone VM: its NICs by name, in `networkProfile` order.
#[derive(Debug, Clone)]
struct VmState {
    name: String,
    nics: Vec<(String, bool)>,
    id: u64,
}

/// A NIC: what "Network Interfaces - Get" reports.
#[derive(Debug, Clone)]
struct NicState {
    name: String,
    vm: Option<String>,
    primary: bool,
    ip_forwarding: bool,
    private_ip: String,
    etag: u64,
}

/// A change another writer makes to a table.
#[derive(Debug, Clone)]
enum Edit {
    Put(Value),
    Remove(String),
}

#[derive(Debug)]
struct Bucket {
    size: f64,
    per_second: f64,
    tokens: f64,
    refilled: Instant,
}

impl Bucket {
    fn new((size, per_second): (u32, f64)) -> Self {
        Self {
            size: f64::from(size),
            per_second,
            tokens: f64::from(size),
            refilled: Instant::now(),
        }
    }

    fn refill(&mut self, now: Instant) {
        let dt = now.saturating_duration_since(self.refilled).as_secs_f64();
        self.tokens = (self.tokens + dt * self.per_second).min(self.size);
        self.refilled = now;
    }

    /// Seconds until one token is back.
    fn wait(&self) -> u64 {
        ((1.0 - self.tokens).max(0.0) / self.per_second.max(f64::MIN_POSITIVE)).ceil() as u64
    }
}

#[derive(Debug)]
struct FakeState {
    config: FakeConfig,
    base: String,
    tables: BTreeMap<String, TableState>,
    vms: BTreeMap<String, VmState>,
    nics: BTreeMap<String, NicState>,
    operations: BTreeMap<String, OperationState>,
    next_id: u64,
    reads: Bucket,
    writes: Bucket,
    issued: HashSet<String>,
    answers: Answers,
    injected: Injections,
    failing_operations: Vec<String>,
    before_next_put: Vec<(String, Edit)>,
    hold_operations: bool,
    /// The VM's user-assigned identities as (client id, resource ID); empty:
    /// a VM with a system-assigned identity only.
    identities: Vec<(String, String)>,
    /// The identity each IMDS token request named: (client_id, msi_res_id).
    imds_requests: Vec<(Option<String>, Option<String>)>,
    /// Certificates (DER) registered for the application: a client
    /// assertion signed by one of their keys authenticates it.
    client_certificates: Vec<Vec<u8>>,
}

impl FakeState {
    fn tick(&mut self, now: Instant) {
        if self.hold_operations {
            return;
        }
        for (id, op) in &mut self.operations {
            if op.outcome.is_some() || op.finishes > now {
                continue;
            }
            op.outcome = Some(op.fail_with.take());
            if let Some(t) = self.tables.get_mut(&op.table)
                && let Some((running, before)) = t.running.take()
            {
                if running != *id {
                    t.running = Some((running, before));
                    continue;
                }
                let failed = op.outcome.as_ref().is_some_and(Option::is_some);
                let state = if failed { "Failed" } else { "Succeeded" };
                if failed {
                    t.routes = before;
                    t.etag += 1;
                }
                for r in &mut t.routes {
                    r["properties"]["provisioningState"] = json!(state);
                }
            }
        }
    }

    fn next(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    fn table_id(&self, name: &str) -> String {
        format!(
            "/subscriptions/{}/resourceGroups/{}/providers/Microsoft.Network/routeTables/{name}",
            self.config.subscription, self.config.resource_group
        )
    }

    fn group_id(&self) -> String {
        format!(
            "/subscriptions/{}/resourceGroups/{}",
            self.config.subscription, self.config.resource_group
        )
    }

    fn vm_id(&self, name: &str) -> String {
        format!(
            "{}/providers/Microsoft.Compute/virtualMachines/{name}",
            self.group_id()
        )
    }

    fn nic_id(&self, name: &str) -> String {
        format!(
            "{}/providers/Microsoft.Network/networkInterfaces/{name}",
            self.group_id()
        )
    }

    fn vm_json(&self, vm: &VmState) -> Value {
        let single = vm.nics.len() == 1;
        let nics: Vec<Value> = vm
            .nics
            .iter()
            .map(|(nic, primary)| {
                if single {
                    json!({"id": self.nic_id(nic)})
                } else {
                    json!({"id": self.nic_id(nic), "properties": {"primary": primary}})
                }
            })
            .collect();
        json!({
            "name": vm.name,
            "id": self.vm_id(&vm.name),
            "type": "Microsoft.Compute/virtualMachines",
            "location": self.config.location,
            "properties": {
                "vmId": format!("00000000-0000-0000-0001-{:012x}", vm.id),
                "hardwareProfile": {"vmSize": "Standard_D2s_v5"},
                "storageProfile": {"osDisk": {"osType": "Linux", "name": format!("{}_OsDisk", vm.name)}},
                "osProfile": {"computerName": vm.name, "adminUsername": "azureuser"},
                "networkProfile": {"networkInterfaces": nics},
                "provisioningState": "Succeeded",
            }
        })
    }

    fn nic_json(&self, nic: &NicState) -> Value {
        let id = self.nic_id(&nic.name);
        let mut properties = json!({
            "provisioningState": "Succeeded",
            "resourceGuid": format!("00000000-0000-0000-0002-{:012x}", nic.etag),
            "ipConfigurations": [{
                "name": "ipconfig1",
                "id": format!("{id}/ipConfigurations/ipconfig1"),
                "etag": etag(nic.etag),
                "type": "Microsoft.Network/networkInterfaces/ipConfigurations",
                "properties": {
                    "provisioningState": "Succeeded",
                    "privateIPAddress": nic.private_ip,
                    "privateIPAllocationMethod": "Dynamic",
                    "privateIPAddressVersion": "IPv4",
                    "primary": true,
                    "subnet": {"id": format!("{}/providers/Microsoft.Network/virtualNetworks/k8s-vnet/subnets/nodes", self.group_id())},
                },
            }],
            "enableAcceleratedNetworking": false,
            "enableIPForwarding": nic.ip_forwarding,
            "nicType": "Standard",
        });
        if let Some(vm) = &nic.vm {
            properties["primary"] = json!(nic.primary);
            properties["virtualMachine"] = json!({"id": self.vm_id(vm)});
        }
        json!({
            "name": nic.name,
            "id": id,
            "etag": etag(nic.etag),
            "type": "Microsoft.Network/networkInterfaces",
            "location": self.config.location,
            "properties": properties,
        })
    }

    fn table_json(&self, t: &TableState) -> Value {
        let id = self.table_id(&t.name);
        let etag = etag(t.etag);
        let state = if t.running.is_some() {
            "Updating"
        } else {
            "Succeeded"
        };
        let routes: Vec<Value> = t
            .routes
            .iter()
            .map(|r| {
                let name = r["name"].as_str().unwrap_or_default();
                json!({
                    "name": name,
                    "id": format!("{id}/routes/{name}"),
                    "etag": etag,
                    "type": "Microsoft.Network/routeTables/routes",
                    "properties": r["properties"],
                })
            })
            .collect();
        let mut body = json!({
            "name": t.name,
            "id": id,
            "etag": etag,
            "type": "Microsoft.Network/routeTables",
            "location": t.location,
            "properties": {
                "provisioningState": state,
                "resourceGuid": format!("00000000-0000-0000-0000-{:012x}", t.name.len()),
                "disableBgpRoutePropagation": t.disable_bgp,
                "routes": routes,
                "subnets": t.subnets.iter().map(|s| json!({"id": s})).collect::<Vec<_>>(),
            }
        });
        if !t.tags.is_null() {
            body["tags"] = t.tags.clone();
        }
        body
    }

    fn apply_edit(&mut self, table: &str, edit: Edit) {
        if let Some(t) = self.tables.get_mut(&table.to_ascii_lowercase()) {
            match edit {
                Edit::Put(route) => {
                    let name = route["name"].as_str().unwrap_or_default().to_string();
                    t.routes.retain(|r| {
                        !r["name"]
                            .as_str()
                            .unwrap_or_default()
                            .eq_ignore_ascii_case(&name)
                    });
                    t.routes.push(route);
                }
                Edit::Remove(name) => t.routes.retain(|r| {
                    !r["name"]
                        .as_str()
                        .unwrap_or_default()
                        .eq_ignore_ascii_case(&name)
                }),
            }
            t.etag += 1;
        }
    }
}

fn etag(n: u64) -> String {
    format!("W/\"00000000-0000-0000-0000-{n:012x}\"")
}

type Shared = Arc<Mutex<FakeState>>;

/// A running fake. Dropping it stops the server.
#[derive(Debug)]
pub struct FakeAzure {
    state: Shared,
    server: TestServer,
}

fn err(status: StatusCode, code: &str, message: impl Into<String>) -> (StatusCode, Value) {
    (
        status,
        json!({"error": {"code": code, "message": message.into()}}),
    )
}

fn route_json(name: &str, prefix: &str, hop_type: &str, hop: Option<&str>) -> Value {
    let mut properties = json!({
        "provisioningState": "Succeeded",
        "addressPrefix": prefix,
        "nextHopType": hop_type,
        "hasBgpOverride": false,
    });
    if let Some(h) = hop {
        properties["nextHopIpAddress"] = json!(h);
    }
    json!({"name": name, "properties": properties})
}

impl FakeAzure {
    /// Starts the fake on `127.0.0.1` on a free port.
    pub async fn start(config: FakeConfig) -> std::io::Result<Self> {
        let listener = Listener::bind().await?;
        let state: Shared = Arc::new(Mutex::new(FakeState {
            reads: Bucket::new(config.reads),
            writes: Bucket::new(config.writes),
            config,
            base: listener.url(),
            tables: BTreeMap::new(),
            vms: BTreeMap::new(),
            nics: BTreeMap::new(),
            operations: BTreeMap::new(),
            next_id: 0,
            issued: HashSet::new(),
            answers: Answers::default(),
            injected: Injections::default(),
            failing_operations: Vec::new(),
            before_next_put: Vec::new(),
            hold_operations: false,
            identities: Vec::new(),
            imds_requests: Vec::new(),
            client_certificates: Vec::new(),
        }));
        let app = Router::new()
            .fallback(handle)
            .with_state(Arc::clone(&state));
        let server = listener.serve_axum(app, "fake Azure server");
        Ok(Self { state, server })
    }

    fn lock(&self) -> MutexGuard<'_, FakeState> {
        let mut s = test_server::lock(&self.state);
        s.tick(Instant::now());
        s
    }

    /// `http://127.0.0.1:PORT`: ARM, the authority host and IMDS at once.
    pub fn base_url(&self) -> String {
        self.server.url()
    }

    /// The settings the fake runs with.
    pub fn config(&self) -> FakeConfig {
        self.lock().config.clone()
    }

    /// An `azure.json` for the provider pointing at this fake with a client
    /// secret, for `table`.
    pub fn cloud_config(&self, table: &str) -> String {
        let c = self.config();
        format!(
            "{{\"cloud\": \"AzurePublicCloud\", \"tenantId\": \"{}\", \"subscriptionId\": \"{}\", \"resourceGroup\": \"{}\", \"location\": \"{}\", \"routeTableName\": \"{table}\", \"aadClientId\": \"{}\", \"aadClientSecret\": \"{}\", \"resourceManagerEndpoint\": \"{b}\", \"activeDirectoryAuthorityHost\": \"{b}\", \"imdsEndpoint\": \"{b}\", \"operationPollIntervalMs\": 20, \"operationPollMaxMs\": 50}}",
            c.tenant,
            c.subscription,
            c.resource_group,
            c.location,
            c.client_id,
            c.client_secret,
            b = self.base_url(),
        )
    }

    /// Creates an empty table associated with the Nodes' subnet.
    pub fn add_table(&self, name: &str) {
        let mut s = self.lock();
        let subnet = format!(
            "/subscriptions/{}/resourceGroups/{}/providers/Microsoft.Network/virtualNetworks/k8s-vnet/subnets/nodes",
            s.config.subscription, s.config.resource_group
        );
        let location = s.config.location.clone();
        let n = s.next();
        s.tables.insert(
            name.to_ascii_lowercase(),
            TableState {
                name: name.into(),
                location,
                tags: Value::Null,
                etag: n,
                disable_bgp: false,
                routes: Vec::new(),
                subnets: vec![subnet],
                running: None,
            },
        );
    }

    /// Adds a standalone VM with one NIC, `<name>-nic`, whose IP forwarding
    /// is on and whose address is `private_ip`. Answers the Node
    /// `spec.providerID` of the VM.
    pub fn add_vm(&self, name: &str, private_ip: &str) -> String {
        let nic = format!("{name}-nic");
        let mut s = self.lock();
        let n = s.next();
        s.nics.insert(
            nic.to_ascii_lowercase(),
            NicState {
                name: nic.clone(),
                vm: Some(name.into()),
                primary: true,
                ip_forwarding: true,
                private_ip: private_ip.into(),
                etag: n,
            },
        );
        s.vms.insert(
            name.to_ascii_lowercase(),
            VmState {
                name: name.into(),
                nics: vec![(nic, true)],
                id: n,
            },
        );
        format!("azure://{}", s.vm_id(name))
    }

    /// Attaches one more NIC, `nic`, to `vm`; `primary` makes it the VM's
    /// primary NIC (and the others secondary). IP forwarding off, as Azure
    /// creates a NIC. `false` when there is no such VM.
    pub fn attach_nic(&self, vm: &str, nic: &str, primary: bool) -> bool {
        let mut s = self.lock();
        let Some(v) = s.vms.get_mut(&vm.to_ascii_lowercase()) else {
            return false;
        };
        if primary {
            for (_, p) in &mut v.nics {
                *p = false;
            }
        }
        v.nics.push((nic.into(), primary));
        let flags: Vec<(String, bool)> = v.nics.clone();
        for (name, p) in &flags {
            if let Some(other) = s.nics.get_mut(&name.to_ascii_lowercase()) {
                other.primary = *p;
            }
        }
        let n = s.next();
        s.nics.insert(
            nic.to_ascii_lowercase(),
            NicState {
                name: nic.into(),
                vm: Some(vm.into()),
                primary,
                ip_forwarding: false,
                private_ip: format!("10.1.{}.{}", (n >> 8) & 0xff, n & 0xff),
                etag: n,
            },
        );
        true
    }

    /// Sets a NIC's `enableIPForwarding`, as `az network nic update
    /// --ip-forwarding` would (the NIC's ETag changes); `false` when there
    /// is no such NIC.
    pub fn set_ip_forwarding(&self, nic: &str, on: bool) -> bool {
        let mut s = self.lock();
        let n = s.next();
        match s.nics.get_mut(&nic.to_ascii_lowercase()) {
            Some(state) => {
                state.ip_forwarding = on;
                state.etag = n;
                true
            }
            None => false,
        }
    }

    /// The routes of `table`: `(name, addressPrefix, nextHopType, nextHopIpAddress)`.
    pub fn routes(&self, table: &str) -> Vec<(String, String, String, String)> {
        let s = self.lock();
        s.tables
            .get(&table.to_ascii_lowercase())
            .map_or_else(Vec::new, |t| {
                t.routes
                    .iter()
                    .map(|r| {
                        let p = &r["properties"];
                        let f = |k: &str| p[k].as_str().unwrap_or_default().to_string();
                        (
                            r["name"].as_str().unwrap_or_default().to_string(),
                            f("addressPrefix"),
                            f("nextHopType"),
                            f("nextHopIpAddress"),
                        )
                    })
                    .collect()
            })
    }

    /// A write's operation is still running on `table` (a `PUT` now would be
    /// answered `429 RetryableErrorDueToAnotherOperation`).
    pub fn operation_running(&self, table: &str) -> bool {
        self.lock()
            .tables
            .get(&table.to_ascii_lowercase())
            .is_some_and(|t| t.running.is_some())
    }

    /// The table's current ETag.
    pub fn etag(&self, table: &str) -> Option<String> {
        self.lock()
            .tables
            .get(&table.to_ascii_lowercase())
            .map(|t| etag(t.etag))
    }

    /// Adds or replaces a route now, as another writer's whole-table update
    /// would (the ETag changes). `hop` only with `VirtualAppliance`.
    pub fn put_route(
        &self,
        table: &str,
        name: &str,
        prefix: &str,
        hop_type: &str,
        hop: Option<&str>,
    ) {
        let route = route_json(name, prefix, hop_type, hop);
        self.lock().apply_edit(table, Edit::Put(route));
    }

    /// Removes a route now, as another writer would (the ETag changes).
    pub fn remove_route(&self, table: &str, name: &str) {
        self.lock().apply_edit(table, Edit::Remove(name.into()));
    }

    /// A second writer adds a route just before the next `PUT` of the table
    /// arrives, so that `PUT`'s `If-Match` is stale.
    pub fn put_route_before_next_put(
        &self,
        table: &str,
        name: &str,
        prefix: &str,
        hop_type: &str,
        hop: Option<&str>,
    ) {
        let route = route_json(name, prefix, hop_type, hop);
        self.lock()
            .before_next_put
            .push((table.into(), Edit::Put(route)));
    }

    /// Registers a certificate (DER) for the application, as uploading it
    /// to the app registration does: a client assertion whose `x5t` names
    /// it and whose RS256 signature its key made is then accepted.
    pub fn register_client_certificate(&self, der: &[u8]) {
        self.lock().client_certificates.push(der.to_vec());
    }

    /// Gives the VM these user-assigned identities, each as (client id,
    /// resource ID). IMDS then answers a token request only for one of them
    /// named by `client_id` or `msi_res_id`, or, without either, when there
    /// is exactly one, as IMDS does.
    pub fn set_vm_identities(&self, identities: &[(&str, &str)]) {
        self.lock().identities = identities
            .iter()
            .map(|(c, r)| ((*c).to_string(), (*r).to_string()))
            .collect();
    }

    /// The identity each IMDS token request so far named, as
    /// (`client_id`, `msi_res_id`).
    pub fn imds_requests(&self) -> Vec<(Option<String>, Option<String>)> {
        self.lock().imds_requests.clone()
    }

    /// Answers the next `n` requests to `endpoint` (`token`, `imds_token`,
    /// `get_table`, `put_table`, `get_operation`, `get_vm`, `get_nic`) with
    /// `status` and `code`,
    /// without acting on them. A `429` carries `Retry-After: 1`.
    pub fn fail_next(&self, endpoint: &str, n: u32, status: u16, code: &str) {
        self.lock().injected.push(endpoint, n, status, code);
    }

    /// The next write's operation ends `Failed` with `code`, and the table
    /// goes back to what it was.
    pub fn fail_next_operation(&self, code: &str) {
        self.lock().failing_operations.push(code.into());
    }

    /// While held, no operation ends (each stays `InProgress`, the table
    /// `Updating`), however long it runs; released, those whose time is up
    /// end at the next request. Lets a test decide when a write finishes.
    pub fn hold_operations(&self, hold: bool) {
        self.lock().hold_operations = hold;
    }

    /// Sets how long a write's operation runs.
    pub fn set_operation_duration(&self, d: Duration) {
        self.lock().config.operation_duration = d;
    }

    /// Sets how long every answer takes.
    pub fn set_latency(&self, d: Duration) {
        self.lock().config.latency = d;
    }

    /// Spends `n` writes of the subscription's bucket, as other clients would.
    pub fn consume_writes(&self, n: u32) {
        let mut s = self.lock();
        let now = Instant::now();
        s.writes.refill(now);
        s.writes.tokens = (s.writes.tokens - f64::from(n)).max(0.0);
    }

    /// Answers by endpoint and HTTP status.
    pub fn answers(&self) -> BTreeMap<(String, u16), u64> {
        self.lock().answers.all().clone()
    }

    /// Requests to one endpoint, any status.
    pub fn count(&self, endpoint: &str) -> u64 {
        self.lock().answers.count(endpoint)
    }

    /// Answers of one endpoint with one status.
    pub fn count_status(&self, endpoint: &str, status: u16) -> u64 {
        self.lock().answers.count_status(endpoint, status)
    }

    /// All requests.
    pub fn total(&self) -> u64 {
        self.lock().answers.total()
    }

    /// Answers with one status, any endpoint.
    pub fn with_status(&self, status: u16) -> u64 {
        self.lock().answers.with_status(status)
    }
}

/// The endpoint a request is for, and the table or operation it names.
fn endpoint_of(method: &Method, path: &str, s: &FakeState) -> (&'static str, Option<String>) {
    let parts: Vec<&str> = path.trim_end_matches('/').split('/').collect();
    let eq = |a: &str, b: &str| a.eq_ignore_ascii_case(b);
    match (method, parts.as_slice()) {
        (&Method::POST, ["", tenant, "oauth2", "v2.0", "token"]) if *tenant == s.config.tenant => {
            ("token", None)
        }
        (&Method::POST, ["", _, "oauth2", "v2.0", "token"]) => ("token_unknown_tenant", None),
        (&Method::GET, ["", "metadata", "identity", "oauth2", "token"]) => ("imds_token", None),
        (m, ["", subs, sub, rgs, rg, providers, ns, kind, name])
            if eq(subs, "subscriptions")
                && eq(rgs, "resourceGroups")
                && eq(providers, "providers")
                && eq(ns, "Microsoft.Network")
                && eq(kind, "routeTables") =>
        {
            let here = eq(sub, &s.config.subscription) && eq(rg, &s.config.resource_group);
            let name = here.then(|| name.to_ascii_lowercase());
            match *m {
                Method::GET => ("get_table", name),
                Method::PUT => ("put_table", name),
                _ => ("unknown", None),
            }
        }
        (&Method::GET, ["", subs, sub, rgs, rg, providers, ns, kind, name])
            if eq(subs, "subscriptions")
                && eq(rgs, "resourceGroups")
                && eq(providers, "providers")
                && ((eq(ns, "Microsoft.Compute") && eq(kind, "virtualMachines"))
                    || (eq(ns, "Microsoft.Network") && eq(kind, "networkInterfaces"))) =>
        {
            let here = eq(sub, &s.config.subscription) && eq(rg, &s.config.resource_group);
            let name = here.then(|| name.to_ascii_lowercase());
            if eq(kind, "virtualMachines") {
                ("get_vm", name)
            } else {
                ("get_nic", name)
            }
        }
        (&Method::GET, ["", subs, sub, rgs, rg, providers, ns, kind])
            if eq(subs, "subscriptions")
                && eq(rgs, "resourceGroups")
                && eq(providers, "providers")
                && eq(ns, "Microsoft.Network")
                && eq(kind, "networkInterfaces") =>
        {
            let here = eq(sub, &s.config.subscription) && eq(rg, &s.config.resource_group);
            ("list_nics", here.then(String::new))
        }
        (&Method::GET, ["", subs, _, providers, ns, locations, _, operations, id])
            if eq(subs, "subscriptions")
                && eq(providers, "providers")
                && eq(ns, "Microsoft.Network")
                && eq(locations, "locations")
                && eq(operations, "operations") =>
        {
            ("get_operation", Some((*id).to_string()))
        }
        _ => ("unknown", None),
    }
}

fn query_param(uri: &Uri, key: &str) -> Option<String> {
    uri.query()?
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v.replace("%2F", "/").replace("%3A", ":"))
}

fn form(body: &[u8]) -> BTreeMap<String, String> {
    let text = String::from_utf8_lossy(body);
    text.split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (decode(k), decode(v)))
        .collect()
}

/// `application/x-www-form-urlencoded` decoding.
fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 2;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

struct Reply {
    status: StatusCode,
    body: Value,
    headers: Vec<(&'static str, String)>,
}

impl From<(StatusCode, Value)> for Reply {
    fn from((status, body): (StatusCode, Value)) -> Self {
        Reply {
            status,
            body,
            headers: Vec::new(),
        }
    }
}

async fn handle(
    State(state): State<Shared>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let latency = test_server::lock(&state).config.latency;
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    let mut s = test_server::lock(&state);
    let now = Instant::now();
    s.tick(now);
    s.reads.refill(now);
    s.writes.refill(now);
    let (endpoint, target) = endpoint_of(&method, uri.path(), &s);
    let reply = answer(
        &mut s, endpoint, target, &method, &uri, &headers, &body, now,
    );
    s.answers.record(endpoint, reply.status.as_u16());
    let arm = !matches!(endpoint, "token" | "token_unknown_tenant" | "imds_token");
    let mut extra = reply.headers;
    if arm {
        extra.push((
            "x-ms-ratelimit-remaining-subscription-reads",
            (s.reads.tokens.floor() as u64).to_string(),
        ));
        extra.push((
            "x-ms-ratelimit-remaining-subscription-writes",
            (s.writes.tokens.floor() as u64).to_string(),
        ));
    }
    test_server::json_response(reply.status, reply.body, extra)
}

fn retry_after_value(s: &FakeState, secs: u64) -> String {
    if s.config.retry_after_as_date {
        // A date has whole seconds: one more, so it is never earlier than meant.
        httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(secs.max(1) + 1))
    } else {
        secs.to_string()
    }
}

#[expect(
    clippy::too_many_arguments,
    reason = "one request's parts, taken apart by the handler"
)]
fn answer(
    s: &mut FakeState,
    endpoint: &'static str,
    target: Option<String>,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: &[u8],
    now: Instant,
) -> Reply {
    if let Some((status, code)) = s.injected.take(endpoint) {
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut r: Reply = if endpoint == "token" {
            (
                status,
                json!({"error": code, "error_description": "injected failure"}),
            )
                .into()
        } else {
            err(status, &code, "injected failure").into()
        };
        if status == StatusCode::TOO_MANY_REQUESTS {
            r.headers.push(("retry-after", retry_after_value(s, 1)));
        }
        return r;
    }
    match endpoint {
        "token" => return token(s, body),
        "token_unknown_tenant" => {
            return (
                StatusCode::BAD_REQUEST,
                json!({"error": "invalid_request", "error_description": "unknown tenant"}),
            )
                .into();
        }
        "imds_token" => {
            if headers.get("metadata").and_then(|v| v.to_str().ok()) != Some("true") {
                return (
                    StatusCode::BAD_REQUEST,
                    json!({"error": "invalid_request", "error_description": "Required metadata header not specified"}),
                )
                    .into();
            }
            if query_param(uri, "resource").is_none() {
                return (
                    StatusCode::BAD_REQUEST,
                    json!({"error": "invalid_request", "error_description": "Required query variable 'resource' is missing"}),
                )
                    .into();
            }
            let client_id = query_param(uri, "client_id");
            let res_id = query_param(uri, "msi_res_id");
            s.imds_requests.push((client_id.clone(), res_id.clone()));
            if !s.identities.is_empty() {
                let known = match (&client_id, &res_id) {
                    (Some(c), _) => s
                        .identities
                        .iter()
                        .any(|(id, _)| id.eq_ignore_ascii_case(c)),
                    (None, Some(r)) => s
                        .identities
                        .iter()
                        .any(|(_, id)| id.eq_ignore_ascii_case(r)),
                    (None, None) => s.identities.len() == 1,
                };
                if !known {
                    let description = if client_id.is_none() && res_id.is_none() {
                        "Multiple user assigned identities exist, please specify the clientId / resourceId of the identity in the token request"
                    } else {
                        "Identity not found"
                    };
                    return (
                        StatusCode::BAD_REQUEST,
                        json!({"error": "invalid_request", "error_description": description}),
                    )
                        .into();
                }
            }
            return issue(s, true);
        }
        "unknown" => return err(StatusCode::NOT_FOUND, "NotFound", "no such endpoint").into(),
        _ => {}
    }
    // ARM from here.
    if query_param(uri, "api-version").is_none() {
        return err(
            StatusCode::BAD_REQUEST,
            "MissingApiVersionParameter",
            "The api-version query parameter (?api-version=) is required for all requests.",
        )
        .into();
    }
    let bearer = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or_default();
    if !s.issued.contains(bearer) {
        return err(
            StatusCode::UNAUTHORIZED,
            "InvalidAuthenticationToken",
            "The access token is invalid.",
        )
        .into();
    }
    let bucket = if *method == Method::GET {
        &mut s.reads
    } else {
        &mut s.writes
    };
    if bucket.tokens < 1.0 {
        let wait = bucket.wait().max(1);
        let mut r: Reply = err(
            StatusCode::TOO_MANY_REQUESTS,
            "SubscriptionRequestsThrottled",
            "Number of requests for subscription exceeded the limit.",
        )
        .into();
        r.headers.push(("retry-after", retry_after_value(s, wait)));
        return r;
    }
    bucket.tokens -= 1.0;
    match endpoint {
        "get_table" => match target.as_ref().and_then(|t| s.tables.get(t)) {
            Some(t) => (StatusCode::OK, s.table_json(t)).into(),
            None => not_found(),
        },
        "put_table" => put_table(s, target, headers, body, now),
        "get_vm" => match target.as_ref().and_then(|t| s.vms.get(t)) {
            Some(vm) => (StatusCode::OK, s.vm_json(vm)).into(),
            None => err(
                StatusCode::NOT_FOUND,
                "ResourceNotFound",
                "The Resource 'Microsoft.Compute/virtualMachines' under the resource group was not found.",
            )
            .into(),
        },
        "get_nic" => match target.as_ref().and_then(|t| s.nics.get(t)) {
            Some(nic) => (StatusCode::OK, s.nic_json(nic)).into(),
            None => err(
                StatusCode::NOT_FOUND,
                "ResourceNotFound",
                "The Resource 'Microsoft.Network/networkInterfaces' under the resource group was not found.",
            )
            .into(),
        },
        // Every NIC of the group in one page ("Network Interfaces - List");
        // another group has none here.
        "list_nics" => {
            let value: Vec<Value> = if target.is_some() {
                s.nics.values().map(|nic| s.nic_json(nic)).collect()
            } else {
                Vec::new()
            };
            (StatusCode::OK, json!({ "value": value })).into()
        }
        "get_operation" => {
            let Some(op) = target.as_ref().and_then(|id| s.operations.get(id)) else {
                return err(StatusCode::NOT_FOUND, "NotFound", "no such operation").into();
            };
            match &op.outcome {
                None => {
                    let mut r: Reply = (StatusCode::OK, json!({"status": "InProgress"})).into();
                    if let Some(secs) = s.config.operation_retry_after {
                        r.headers.push(("retry-after", secs.to_string()));
                    }
                    r
                }
                Some(None) => (StatusCode::OK, json!({"status": "Succeeded"})).into(),
                Some(Some(code)) => (
                    StatusCode::OK,
                    json!({"status": "Failed", "error": {"code": code, "message": "the operation failed"}}),
                )
                    .into(),
            }
        }
        _ => err(StatusCode::NOT_FOUND, "NotFound", "no such endpoint").into(),
    }
}

fn not_found() -> Reply {
    err(
        StatusCode::NOT_FOUND,
        "ResourceNotFound",
        "The Resource 'Microsoft.Network/routeTables' under the resource group was not found.",
    )
    .into()
}

/// Whether `assertion` is a JWT Entra ID would take as a certificate
/// credential: `x5t` names a registered certificate, its RS256 signature
/// verifies with that certificate's key, it is for `audience`, issued by and
/// about `client_id`, and current.
fn certificate_assertion_ok(
    certificates: &[Vec<u8>],
    assertion: &str,
    client_id: &str,
    audience: &str,
) -> bool {
    use base64::Engine;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let mut parts = assertion.split('.');
    let (Some(h), Some(c), Some(sig), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    let json = |part: &str| -> Option<Value> {
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(part).ok()?).ok()
    };
    let (Some(header), Some(claims), Ok(sig)) = (json(h), json(c), URL_SAFE_NO_PAD.decode(sig))
    else {
        return false;
    };
    if header["alg"] != "RS256" {
        return false;
    }
    let Some(cert) = certificates.iter().find(|der| {
        let sha1 = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA1_FOR_LEGACY_USE_ONLY, der);
        header["x5t"].as_str() == Some(URL_SAFE_NO_PAD.encode(sha1).as_str())
    }) else {
        return false;
    };
    let der = rustls_pki_types::CertificateDer::from(cert.as_slice());
    let Ok(end_entity) = webpki::EndEntityCert::try_from(&der) else {
        return false;
    };
    if end_entity
        .verify_signature(
            webpki::aws_lc_rs::RSA_PKCS1_2048_8192_SHA256,
            format!("{h}.{c}").as_bytes(),
            &sig,
        )
        .is_err()
    {
        return false;
    }
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    claims["aud"] == audience
        && claims["iss"] == client_id
        && claims["sub"] == client_id
        && claims["exp"].as_u64().is_some_and(|exp| exp > now)
        && claims["nbf"].as_u64().is_some_and(|nbf| nbf <= now + 300)
}

fn token(s: &mut FakeState, body: &[u8]) -> Reply {
    let f = form(body);
    let get = |k: &str| f.get(k).map(String::as_str).unwrap_or_default();
    if get("grant_type") != "client_credentials" || !get("scope").ends_with("/.default") {
        return (
            StatusCode::BAD_REQUEST,
            json!({"error": "invalid_request", "error_description": "grant_type and scope are required"}),
        )
            .into();
    }
    let secret_ok = get("client_secret") == s.config.client_secret;
    let jwt_bearer =
        get("client_assertion_type") == "urn:ietf:params:oauth:client-assertion-type:jwt-bearer";
    let audience = format!("{}/{}/oauth2/v2.0/token", s.base, s.config.tenant);
    let assertion_ok = jwt_bearer
        && (get("client_assertion") == s.config.federated_token
            || certificate_assertion_ok(
                &s.client_certificates,
                get("client_assertion"),
                &s.config.client_id,
                &audience,
            ));
    if get("client_id") != s.config.client_id || !(secret_ok || assertion_ok) {
        return (
            StatusCode::UNAUTHORIZED,
            json!({"error": "invalid_client", "error_description": "AADSTS7000215: Invalid client secret or assertion provided."}),
        )
            .into();
    }
    issue(s, false)
}

fn issue(s: &mut FakeState, imds: bool) -> Reply {
    let n = s.next();
    let token = format!("fake-arm-token-{n}");
    s.issued.insert(token.clone());
    let lifetime = s.config.token_lifetime.as_secs();
    // IMDS writes numbers as strings.
    let expires: Value = if imds {
        json!(lifetime.to_string())
    } else {
        json!(lifetime)
    };
    (
        StatusCode::OK,
        json!({"token_type": "Bearer", "expires_in": expires, "access_token": token}),
    )
        .into()
}

const HOP_TYPES: [&str; 5] = [
    "VirtualNetworkGateway",
    "VnetLocal",
    "Internet",
    "VirtualAppliance",
    "None",
];

fn bad_request(code: &str, message: impl Into<String>) -> Reply {
    err(StatusCode::BAD_REQUEST, code, message).into()
}

fn put_table(
    s: &mut FakeState,
    target: Option<String>,
    headers: &HeaderMap,
    body: &[u8],
    now: Instant,
) -> Reply {
    let Some(key) = target else {
        return not_found();
    };
    // A second writer lands first.
    let pending: Vec<(String, Edit)> = std::mem::take(&mut s.before_next_put);
    for (table, edit) in pending {
        s.apply_edit(&table, edit);
    }
    if let Some(t) = s.tables.get(&key)
        && let Some((running, _)) = &t.running
    {
        let left = s.operations.get(running).map_or(1, |o| {
            o.finishes.saturating_duration_since(now).as_secs() + 1
        });
        let mut r: Reply = (
            StatusCode::TOO_MANY_REQUESTS,
            json!({"error": {"code": "RetryableError", "message": "A retryable error occurred.",
                "details": [{"code": "RetryableErrorDueToAnotherOperation",
                  "message": format!("Operation PutRouteTableOperation is updating resource {}. The call can be retried in {left} seconds.", s.table_id(&t.name))}]}}),
        )
            .into();
        r.headers.push(("retry-after", left.to_string()));
        return r;
    }
    let if_match = headers.get("if-match").and_then(|v| v.to_str().ok());
    let exists = s.tables.contains_key(&key);
    if let Some(want) = if_match {
        let current = s.tables.get(&key).map(|t| etag(t.etag));
        let ok = match &current {
            Some(c) => want == "*" || want == c,
            None => false,
        };
        if !ok {
            return err(
                StatusCode::PRECONDITION_FAILED,
                "PreconditionFailed",
                "The condition specified using HTTP conditional header(s) is not met.",
            )
            .into();
        }
    }
    let doc: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => {
            return bad_request(
                "InvalidRequestFormat",
                format!("cannot parse the request: {e}"),
            );
        }
    };
    let empty = Vec::new();
    let routes = doc["properties"]["routes"].as_array().unwrap_or(&empty);
    let mut names = HashSet::new();
    let mut prefixes: HashSet<String> = HashSet::new();
    let mut stored = Vec::with_capacity(routes.len());
    for r in routes {
        let Some(name) = r["name"].as_str().filter(|n| !n.is_empty()) else {
            return bad_request("InvalidRequestFormat", "a route has no name");
        };
        if !names.insert(name.to_ascii_lowercase()) {
            return bad_request(
                "DuplicateResourceName",
                format!("route name {name} appears twice"),
            );
        }
        let p = &r["properties"];
        let prefix = p["addressPrefix"].as_str().unwrap_or_default();
        let canonical = match Cidr::parse(prefix) {
            Ok(c) => c.to_string(),
            Err(_) => {
                return bad_request(
                    "InvalidRouteAddressPrefix",
                    format!("route {name} has an invalid addressPrefix {prefix:?}"),
                );
            }
        };
        if !prefixes.insert(canonical) {
            return bad_request(
                "InvalidRouteAddressPrefix",
                format!("Routes cannot have the same AddressPrefix ({prefix}, route {name})"),
            );
        }
        let hop_type = p["nextHopType"].as_str().unwrap_or_default();
        let Some(hop_type) = HOP_TYPES.iter().find(|h| h.eq_ignore_ascii_case(hop_type)) else {
            return bad_request(
                "InvalidRequestFormat",
                format!("route {name} has an invalid nextHopType {hop_type:?}"),
            );
        };
        let hop = p["nextHopIpAddress"].as_str().filter(|h| !h.is_empty());
        match (*hop_type == "VirtualAppliance", hop) {
            (true, Some(h)) if h.parse::<IpAddr>().is_ok() => {}
            (true, _) => {
                return bad_request(
                    "InvalidNextHopIpAddress",
                    format!("route {name}: VirtualAppliance needs a valid nextHopIpAddress"),
                );
            }
            (false, Some(_)) => {
                return bad_request(
                    "NextHopIpAddressNotAllowed",
                    format!("route {name}: nextHopIpAddress is only allowed with VirtualAppliance"),
                );
            }
            (false, None) => {}
        }
        let mut route = route_json(name, prefix, hop_type, hop);
        route["properties"]["provisioningState"] = json!("Updating");
        stored.push(route);
    }
    if stored.len() > s.config.max_routes {
        return bad_request(
            "QuotaExceeded",
            format!(
                "a route table can hold at most {} routes; the request has {}",
                s.config.max_routes,
                stored.len()
            ),
        );
    }
    let location = doc["location"]
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| s.config.location.clone());
    let n = s.next();
    let op_id = format!("00000000-0000-0000-0000-{n:012x}");
    let fail_with = (!s.failing_operations.is_empty()).then(|| s.failing_operations.remove(0));
    let duration = s.config.operation_duration;
    let etag_n = s.next();
    let subnet_default = s
        .tables
        .get(&key)
        .map(|t| t.subnets.clone())
        .unwrap_or_default();
    let before = s
        .tables
        .get(&key)
        .map(|t| t.routes.clone())
        .unwrap_or_default();
    let name = s
        .tables
        .get(&key)
        .map_or_else(|| key.clone(), |t| t.name.clone());
    s.tables.insert(
        key.clone(),
        TableState {
            name,
            location,
            tags: doc["tags"].clone(),
            etag: etag_n,
            disable_bgp: doc["properties"]["disableBgpRoutePropagation"]
                .as_bool()
                .unwrap_or(false),
            routes: stored,
            subnets: subnet_default,
            running: Some((op_id.clone(), before)),
        },
    );
    s.operations.insert(
        op_id.clone(),
        OperationState {
            table: key.clone(),
            finishes: now + duration,
            fail_with,
            outcome: None,
        },
    );
    let body = s
        .tables
        .get(&key)
        .map(|t| s.table_json(t))
        .unwrap_or(Value::Null);
    let mut r: Reply = (
        if exists {
            StatusCode::OK
        } else {
            StatusCode::CREATED
        },
        body,
    )
        .into();
    r.headers.push((
        "azure-asyncoperation",
        format!(
            "{}/subscriptions/{}/providers/Microsoft.Network/locations/{}/operations/{op_id}?api-version=2024-05-01",
            s.base, s.config.subscription, s.config.location
        ),
    ));
    if let Some(secs) = s.config.operation_retry_after {
        r.headers.push(("retry-after", secs.to_string()));
    }
    r
}
