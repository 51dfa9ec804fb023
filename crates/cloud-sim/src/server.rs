//! The HTTP server around one [`MemoryCloud`].
//!
//! Ownership: the server owns the simulated cloud (one table per cluster, its
//! counters, call log and faults); every API request gets a handle tagged
//! with the request's `X-Caller`, so the call log tells controller processes
//! apart. The admin endpoints read and change the same cloud without being
//! counted or logged by it.
//!
//! A call, once received, runs to the end in its own task even if the client
//! gives up or dies: a real cloud also finishes a change whose answer nobody
//! reads, and the crash-between-create-and-status tests depend on that.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, RwLock};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use provider_memory::{MemoryCloud, MemoryConfig, MemoryConfigError, Operation};
use route_cloud::{Batch, CloudError, CloudRoutes, ErrorKind};
use route_core::{Destination, OpKey, Route};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::wire::{
    ANONYMOUS_CALLER, BatchItem, BatchRequest, BatchResponse, CALLER_HEADER, CallerCount, Count,
    CreateRequest, DeleteRequest, Faults, Found, InsertRoute, LogEntry, MAX_CALLER_LEN, Reset,
    RouteChange, RouteRef, StateSnapshot, StatsSnapshot, WireCapabilities, WireError, WireRoute,
    duration_ms_ceil, status_for,
};

/// Why the server cannot start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The configuration is unusable.
    #[error(transparent)]
    Config(#[from] MemoryConfigError),
    /// A non-loopback address without `allow_remote`.
    #[error(
        "refusing to listen on {0}: the simulated cloud has no authentication; use a loopback address or --allow-remote"
    )]
    NotLoopback(SocketAddr),
    /// Binding failed.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
}

/// The shared state behind every handler.
struct Sim {
    /// Replaced whole by a reset; handlers clone a handle out of it.
    cloud: RwLock<MemoryCloud>,
    /// What a reset without a body goes back to.
    base_config: Mutex<MemoryConfig>,
    /// Every cluster name a request or admin edit has touched (the cloud has
    /// no listing of its tables).
    clusters: Mutex<BTreeSet<String>>,
    /// Requests per (caller, operation, result), as answered.
    by_caller: Mutex<BTreeMap<(String, &'static str, &'static str), u64>>,
    /// Time zero of the log's `at_ms`.
    epoch: Instant,
}

impl Sim {
    fn cloud(&self) -> MemoryCloud {
        self.cloud.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn touch(&self, cluster: &str) {
        let mut c = self.clusters.lock().unwrap_or_else(|e| e.into_inner());
        if !c.contains(cluster) {
            c.insert(cluster.to_string());
        }
    }

    fn count(&self, caller: &str, op: &'static str, result: &'static str) {
        let mut m = self.by_caller.lock().unwrap_or_else(|e| e.into_inner());
        *m.entry((caller.to_string(), op, result)).or_default() += 1;
    }
}

/// A running server, for tests and for the `cloud-sim` binary.
pub struct SimServer {
    addr: SocketAddr,
    sim: Arc<Sim>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<std::io::Result<()>>,
}

impl std::fmt::Debug for SimServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimServer")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl SimServer {
    /// Starts a server on an ephemeral loopback port.
    pub async fn start_local(config: MemoryConfig) -> Result<Self, ServeError> {
        Self::bind(SocketAddr::from(([127, 0, 0, 1], 0)), false, config).await
    }

    /// Starts a server on `listen`; a non-loopback address is refused unless
    /// `allow_remote`, because the API has no authentication.
    pub async fn bind(
        listen: SocketAddr,
        allow_remote: bool,
        config: MemoryConfig,
    ) -> Result<Self, ServeError> {
        if !listen.ip().is_loopback() && !allow_remote {
            return Err(ServeError::NotLoopback(listen));
        }
        let cloud = MemoryCloud::new(config.clone())?;
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .map_err(|source| ServeError::Bind {
                addr: listen,
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| ServeError::Bind {
            addr: listen,
            source,
        })?;
        let sim = Arc::new(Sim {
            cloud: RwLock::new(cloud),
            base_config: Mutex::new(config),
            clusters: Mutex::new(BTreeSet::new()),
            by_caller: Mutex::new(BTreeMap::new()),
            epoch: Instant::now(),
        });
        let app = router(Arc::clone(&sim));
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = stopped.await;
                })
                .await
        });
        tracing::info!(%addr, "simulated cloud listening");
        Ok(Self {
            addr,
            sim,
            stop: Some(stop),
            task,
        })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR`, the base URL clients take.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A handle on the simulated cloud currently served (replaced by a reset).
    pub fn cloud(&self) -> MemoryCloud {
        self.sim.cloud()
    }

    /// Stops accepting, lets requests in progress finish, and waits.
    pub async fn shutdown(mut self) -> std::io::Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match (&mut self.task).await {
            Ok(r) => r,
            Err(e) => Err(std::io::Error::other(e)),
        }
    }

    /// Runs until the server fails or `until` resolves, then shuts down.
    pub async fn run_until(mut self, until: impl Future<Output = ()>) -> std::io::Result<()> {
        tokio::select! {
            r = &mut self.task => match r {
                Ok(r) => r,
                Err(e) => Err(std::io::Error::other(e)),
            },
            () = until => self.shutdown().await,
        }
    }
}

impl Drop for SimServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

fn router(sim: Arc<Sim>) -> Router {
    Router::new()
        .route("/v1/capabilities", get(capabilities))
        .route(
            "/v1/clusters/{cluster}/routes",
            get(list_routes).post(create_route),
        )
        .route("/v1/clusters/{cluster}/routes/delete", post(delete_route))
        .route("/v1/clusters/{cluster}/batch", post(apply_batch))
        .route("/admin/state", get(admin_state))
        .route("/admin/stats", get(admin_stats))
        .route("/admin/log", get(admin_log))
        .route("/admin/log/clear", post(admin_clear_log))
        .route("/admin/faults", post(admin_faults))
        .route("/admin/routes/insert", post(admin_insert))
        .route("/admin/routes/remove", post(admin_remove))
        .route("/admin/routes/blackhole", post(admin_blackhole))
        .route("/admin/reset", post(admin_reset))
        .with_state(sim)
}

// ---- answers ----

fn error_response(e: &CloudError) -> Response {
    let status =
        StatusCode::from_u16(status_for(e.kind)).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut resp = (status, axum::Json(WireError::from(e))).into_response();
    if let Some(wait) = e.retry_after {
        let secs = duration_ms_ceil(wait).div_ceil(1000);
        if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
            resp.headers_mut().insert(header::RETRY_AFTER, v);
        }
    }
    resp
}

fn invalid(message: impl Into<String>) -> CloudError {
    CloudError::new(ErrorKind::InvalidRequest, message)
}

fn parse_body<T: DeserializeOwned>(body: &Bytes) -> Result<T, CloudError> {
    serde_json::from_slice(body).map_err(|e| invalid(format!("bad request body: {e}")))
}

fn caller_of(headers: &HeaderMap) -> Result<String, CloudError> {
    let Some(v) = headers.get(CALLER_HEADER) else {
        return Ok(ANONYMOUS_CALLER.to_string());
    };
    let s = v
        .to_str()
        .map_err(|_| invalid("X-Caller must be visible ASCII"))?;
    if s.is_empty() || s.len() > MAX_CALLER_LEN {
        return Err(invalid(format!(
            "X-Caller must be 1 to {MAX_CALLER_LEN} characters"
        )));
    }
    Ok(s.to_string())
}

fn result_label<T>(r: &Result<T, CloudError>) -> &'static str {
    r.as_ref().err().map_or("ok", |e| e.kind.as_str())
}

/// Runs one API call on a handle tagged with the caller, in its own task so
/// it completes even if the client disconnects, and counts it per caller.
async fn run<T, Fut>(
    sim: &Sim,
    headers: &HeaderMap,
    cluster: Option<&str>,
    op: &'static str,
    call: impl FnOnce(MemoryCloud) -> Result<Fut, CloudError>,
) -> Response
where
    T: serde::Serialize,
    Fut: Future<Output = Result<T, CloudError>> + Send + 'static,
    T: Send + 'static,
{
    let caller = match caller_of(headers) {
        Ok(c) => c,
        Err(e) => return error_response(&e),
    };
    if let Some(c) = cluster {
        sim.touch(c);
    }
    let cloud = sim.cloud().with_caller(&caller);
    let result = match call(cloud) {
        Ok(fut) => tokio::spawn(fut).await.unwrap_or_else(|e| {
            Err(CloudError::new(
                ErrorKind::Transient,
                format!("the simulated call was aborted: {e}"),
            ))
        }),
        Err(e) => Err(e),
    };
    sim.count(&caller, op, result_label(&result));
    match result {
        Ok(v) => axum::Json(v).into_response(),
        Err(e) => {
            tracing::debug!(%caller, op, error = %e, "answering an error");
            error_response(&e)
        }
    }
}

fn wire_routes(routes: &[Route]) -> Vec<WireRoute> {
    routes.iter().map(WireRoute::from).collect()
}

// ---- the cloud API ----

async fn capabilities(State(sim): State<Arc<Sim>>, headers: HeaderMap) -> Response {
    run(&sim, &headers, None, "capabilities", |cloud| {
        Ok(async move {
            let mut caps = WireCapabilities::from(&cloud.capabilities());
            caps.targets = cloud.targets().iter().map(|t| t.to_string()).collect();
            Ok(caps)
        })
    })
    .await
}

async fn list_routes(
    State(sim): State<Arc<Sim>>,
    Path(cluster): Path<String>,
    headers: HeaderMap,
) -> Response {
    let c = cluster.clone();
    run(
        &sim,
        &headers,
        Some(&c),
        Operation::List.as_str(),
        |cloud| Ok(async move { cloud.list_routes(&cluster).await.map(|r| wire_routes(&r)) }),
    )
    .await
}

async fn create_route(
    State(sim): State<Arc<Sim>>,
    Path(cluster): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let c = cluster.clone();
    run(
        &sim,
        &headers,
        Some(&c),
        Operation::Create.as_str(),
        |cloud| {
            let req: CreateRequest = parse_body(&body)?;
            Ok(async move {
                let route = Route::from(req.route);
                cloud
                    .create_route(&cluster, &req.name_hint, &route)
                    .await
                    .map(|r| WireRoute::from(&r))
            })
        },
    )
    .await
}

async fn delete_route(
    State(sim): State<Arc<Sim>>,
    Path(cluster): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let c = cluster.clone();
    run(
        &sim,
        &headers,
        Some(&c),
        Operation::Delete.as_str(),
        |cloud| {
            let req: DeleteRequest = parse_body(&body)?;
            Ok(async move {
                let route = Route::from(req.route);
                cloud
                    .delete_route(&cluster, &route)
                    .await
                    .map(|()| serde_json::json!({}))
            })
        },
    )
    .await
}

async fn apply_batch(
    State(sim): State<Arc<Sim>>,
    Path(cluster): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let c = cluster.clone();
    run(
        &sim,
        &headers,
        Some(&c),
        Operation::Batch.as_str(),
        |cloud| {
            let req: BatchRequest = parse_body(&body)?;
            let delete: Vec<Route> = req.delete.into_iter().map(Route::from).collect();
            let create: Vec<(String, Route)> = req
                .create
                .into_iter()
                .map(|c| (c.name_hint, Route::from(c.route)))
                .collect();
            // The request's changes keyed as the planner keys them: a
            // controller's plan never holds one change twice, and the
            // answer must name each change apart.
            let batch = Batch::new(&delete, &create);
            let keys: BTreeSet<&OpKey> = batch.keys().collect();
            if keys.len() != batch.len() {
                return Err(invalid(
                    "a batch holds the same creation twice (same name hint, destination and table)",
                ));
            }
            Ok(async move {
                let mut results = cloud.apply_batch(&cluster, &batch).await?;
                // Each change's answer under its index in the request; one
                // the cloud left unanswered is left out, which the client
                // takes as an unknown outcome.
                Ok(BatchResponse {
                    results: batch
                        .keys()
                        .enumerate()
                        .filter_map(|(index, key)| {
                            results.remove(key).map(|r| match r {
                                Ok(route) => BatchItem {
                                    index,
                                    route: route.as_ref().map(WireRoute::from),
                                    error: None,
                                },
                                Err(e) => BatchItem {
                                    index,
                                    route: None,
                                    error: Some(WireError::from(&e)),
                                },
                            })
                        })
                        .collect(),
                })
            })
        },
    )
    .await
}

// ---- admin ----

fn admin_answer<T: serde::Serialize>(r: Result<T, CloudError>) -> Response {
    match r {
        Ok(v) => axum::Json(v).into_response(),
        Err(e) => error_response(&e),
    }
}

fn snapshot(sim: &Sim) -> StateSnapshot {
    let cloud = sim.cloud();
    let names: Vec<String> = sim
        .clusters
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .cloned()
        .collect();
    StateSnapshot {
        clusters: names
            .into_iter()
            .map(|n| {
                let routes = wire_routes(&cloud.routes(&n));
                (n, routes)
            })
            .collect(),
        config: cloud.config(),
        peak_concurrency: cloud.peak_concurrency(),
    }
}

async fn admin_state(State(sim): State<Arc<Sim>>) -> Response {
    axum::Json(snapshot(&sim)).into_response()
}

async fn admin_stats(State(sim): State<Arc<Sim>>) -> Response {
    let cloud = sim.cloud();
    let counts = cloud
        .stats()
        .snapshot()
        .into_iter()
        .map(|((op, result), count)| Count {
            operation: op.to_string(),
            result: result.to_string(),
            count,
        })
        .collect();
    let by_caller = sim
        .by_caller
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .map(|((caller, op, result), count)| CallerCount {
            caller: caller.clone(),
            operation: (*op).to_string(),
            result: (*result).to_string(),
            count: *count,
        })
        .collect();
    axum::Json(StatsSnapshot {
        counts,
        by_caller,
        peak_concurrency: cloud.peak_concurrency(),
    })
    .into_response()
}

#[derive(Debug, Deserialize)]
struct LogQuery {
    #[serde(default)]
    since: u64,
}

async fn admin_log(State(sim): State<Arc<Sim>>, Query(q): Query<LogQuery>) -> Response {
    let entries: Vec<LogEntry> = sim
        .cloud()
        .log()
        .into_iter()
        .filter(|r| r.seq >= q.since)
        .map(|r| LogEntry {
            seq: r.seq,
            at_ms: u64::try_from(r.at.saturating_duration_since(sim.epoch).as_millis())
                .unwrap_or(u64::MAX),
            caller: r.caller.to_string(),
            cluster: r.cluster,
            op: r.op,
            node: r.node,
            destination: r.destination.map(|d| d.to_string()),
            batch: r.batch,
            result: r.result.err().map_or("ok", ErrorKind::as_str).to_string(),
        })
        .collect();
    axum::Json(entries).into_response()
}

async fn admin_clear_log(State(sim): State<Arc<Sim>>) -> Response {
    sim.cloud().clear_log();
    axum::Json(serde_json::json!({})).into_response()
}

fn check_faults(f: &Faults) -> Result<(), CloudError> {
    for (op, rate) in &f.error_rates {
        if let Some(r) = rate
            && !(0.0..=1.0).contains(&r.probability)
        {
            return Err(invalid(format!(
                "error_rates.{op}.probability must be within [0, 1], got {}",
                r.probability
            )));
        }
    }
    if let Some(Some(rl)) = f.rate_limit
        && (rl.requests == 0 || rl.period_secs == 0 || rl.burst == 0)
    {
        return Err(invalid(
            "rate_limit needs requests, period_secs and burst above zero",
        ));
    }
    Ok(())
}

async fn admin_faults(State(sim): State<Arc<Sim>>, body: Bytes) -> Response {
    admin_answer((|| {
        let f: Faults = parse_body(&body)?;
        // All or nothing: a bad field changes no other.
        check_faults(&f)?;
        let cloud = sim.cloud();
        for n in &f.fail_next {
            cloud.fail_next(n.op, n.count, n.kind);
        }
        for (op, rate) in &f.error_rates {
            cloud.set_error_rate(*op, *rate);
        }
        for (op, ms) in &f.latency_ms {
            cloud.set_latency(*op, std::time::Duration::from_millis(*ms));
        }
        if let Some(rl) = f.rate_limit {
            cloud.set_rate_limit(rl);
        }
        if let Some(max) = f.max_routes {
            cloud.set_max_routes(max);
        }
        if let Some(lag) = f.list_lag {
            cloud.set_list_lag(lag);
        }
        tracing::info!(faults = ?f, "faults changed");
        Ok(cloud.config())
    })())
}

async fn admin_insert(State(sim): State<Arc<Sim>>, body: Bytes) -> Response {
    admin_answer((|| {
        let req: InsertRoute = parse_body(&body)?;
        sim.touch(&req.cluster);
        let replaced = sim
            .cloud()
            .insert_route(&req.cluster, Route::from(req.route));
        Ok(RouteChange {
            route: replaced.as_ref().map(WireRoute::from),
        })
    })())
}

async fn admin_remove(State(sim): State<Arc<Sim>>, body: Bytes) -> Response {
    admin_answer((|| {
        let req: RouteRef = parse_body(&body)?;
        let removed = sim
            .cloud()
            .remove_route(&req.cluster, &Destination::parse(&req.destination));
        Ok(RouteChange {
            route: removed.as_ref().map(WireRoute::from),
        })
    })())
}

async fn admin_blackhole(State(sim): State<Arc<Sim>>, body: Bytes) -> Response {
    admin_answer((|| {
        let req: RouteRef = parse_body(&body)?;
        let found = sim
            .cloud()
            .blackhole_route(&req.cluster, &Destination::parse(&req.destination));
        Ok(Found { found })
    })())
}

async fn admin_reset(State(sim): State<Arc<Sim>>, body: Bytes) -> Response {
    admin_answer((|| {
        let req: Reset = if body.iter().all(u8::is_ascii_whitespace) {
            Reset::default()
        } else {
            parse_body(&body)?
        };
        let mut base = sim.base_config.lock().unwrap_or_else(|e| e.into_inner());
        let config = req.config.unwrap_or_else(|| base.clone());
        let fresh = MemoryCloud::new(config.clone()).map_err(|e| invalid(e.to_string()))?;
        *base = config.clone();
        drop(base);
        *sim.cloud.write().unwrap_or_else(|e| e.into_inner()) = fresh;
        sim.clusters
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        sim.by_caller
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        tracing::info!("simulated cloud reset");
        Ok(config)
    })())
}
