//! [`AdminClient`]: what tests, the demo and the benchmark use to look at and
//! steer a running `cloud-sim` server from outside (route tables, counters,
//! the call log, faults and changes behind the controller's back). Admin calls
//! are neither counted nor logged by the simulated cloud.

use std::collections::BTreeMap;
use std::time::Duration;

use provider_memory::MemoryConfig;
use reqwest::Url;
use route_core::Route;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::client::{join, parse_endpoint};
use crate::wire::{
    Faults, Found, InsertRoute, LogEntry, Reset, RouteChange, RouteRef, StateSnapshot,
    StatsSnapshot, WireError, WireRoute,
};

/// Why an admin call failed.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// The endpoint is not an `http://` URL.
    #[error("cloud-sim endpoint {0:?} is not an http:// URL")]
    Endpoint(String),
    /// The request did not complete.
    #[error("cloud-sim admin request failed: {0}")]
    Http(#[from] reqwest::Error),
    /// The server refused the request.
    #[error("cloud-sim refused the admin request ({status}): {message}")]
    Refused {
        /// The HTTP status.
        status: u16,
        /// The server's explanation.
        message: String,
    },
}

/// A client of the `/admin` endpoints.
#[derive(Debug, Clone)]
pub struct AdminClient {
    http: reqwest::Client,
    base: Url,
}

impl AdminClient {
    /// A client for the server at `endpoint` (`http://127.0.0.1:PORT`).
    pub fn new(endpoint: &str) -> Result<Self, AdminError> {
        let base =
            parse_endpoint(endpoint).ok_or_else(|| AdminError::Endpoint(endpoint.to_string()))?;
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .no_proxy()
            .build()?;
        Ok(Self { http, base })
    }

    fn url(&self, path: &[&str]) -> Url {
        join(&self.base, path)
    }

    async fn answer<T: DeserializeOwned>(resp: reqwest::Response) -> Result<T, AdminError> {
        let status = resp.status();
        if status.is_success() {
            return Ok(resp.json().await?);
        }
        let body = resp.bytes().await?;
        let message = serde_json::from_slice::<WireError>(&body).map_or_else(
            |_| String::from_utf8_lossy(&body).chars().take(200).collect(),
            |w| w.message,
        );
        Err(AdminError::Refused {
            status: status.as_u16(),
            message,
        })
    }

    async fn get<T: DeserializeOwned>(&self, path: &[&str]) -> Result<T, AdminError> {
        Self::answer(self.http.get(self.url(path)).send().await?).await
    }

    async fn post<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &[&str],
        body: &B,
    ) -> Result<T, AdminError> {
        Self::answer(self.http.post(self.url(path)).json(body).send().await?).await
    }

    /// Every touched cluster's table as stored, and the configuration in force.
    pub async fn state(&self) -> Result<StateSnapshot, AdminError> {
        self.get(&["admin", "state"]).await
    }

    /// One cluster's table as stored (empty if never touched).
    pub async fn routes(&self, cluster: &str) -> Result<Vec<Route>, AdminError> {
        let mut s = self.state().await?;
        Ok(s.clusters
            .remove(cluster)
            .unwrap_or_default()
            .into_iter()
            .map(Route::from)
            .collect())
    }

    /// Request counters (cloud-wide and per caller).
    pub async fn stats(&self) -> Result<StatsSnapshot, AdminError> {
        self.get(&["admin", "stats"]).await
    }

    /// The call log from entry `since` on.
    pub async fn log(&self, since: u64) -> Result<Vec<LogEntry>, AdminError> {
        let mut url = self.url(&["admin", "log"]);
        url.query_pairs_mut()
            .append_pair("since", &since.to_string());
        Self::answer(self.http.get(url).send().await?).await
    }

    /// Empties the call log (counters are kept).
    pub async fn clear_log(&self) -> Result<(), AdminError> {
        let _: serde_json::Value = self.post(&["admin", "log", "clear"], &()).await?;
        Ok(())
    }

    /// Applies `faults` (only the fields set); answers the configuration in force.
    pub async fn faults(&self, faults: &Faults) -> Result<MemoryConfig, AdminError> {
        self.post(&["admin", "faults"], faults).await
    }

    /// Puts `route` in `cluster`'s table behind the controller's back; answers
    /// the route it replaced.
    pub async fn insert_route(
        &self,
        cluster: &str,
        route: &Route,
    ) -> Result<Option<Route>, AdminError> {
        let body = InsertRoute {
            cluster: cluster.to_string(),
            route: WireRoute::from(route),
        };
        let c: RouteChange = self.post(&["admin", "routes", "insert"], &body).await?;
        Ok(c.route.map(Route::from))
    }

    /// Removes the route for `destination` behind the controller's back.
    pub async fn remove_route(
        &self,
        cluster: &str,
        destination: &str,
    ) -> Result<Option<Route>, AdminError> {
        let body = RouteRef {
            cluster: cluster.to_string(),
            destination: destination.to_string(),
        };
        let c: RouteChange = self.post(&["admin", "routes", "remove"], &body).await?;
        Ok(c.route.map(Route::from))
    }

    /// Marks the route for `destination` as a blackhole; answers whether it exists.
    pub async fn blackhole_route(
        &self,
        cluster: &str,
        destination: &str,
    ) -> Result<bool, AdminError> {
        let body = RouteRef {
            cluster: cluster.to_string(),
            destination: destination.to_string(),
        };
        let f: Found = self.post(&["admin", "routes", "blackhole"], &body).await?;
        Ok(f.found)
    }

    /// Starts over with empty tables, counters, log and faults, with `config`
    /// (or the last configuration given, or the startup one).
    pub async fn reset(&self, config: Option<MemoryConfig>) -> Result<MemoryConfig, AdminError> {
        self.post(&["admin", "reset"], &Reset { config }).await
    }

    /// Route counts per cluster, for a quick look.
    pub async fn route_counts(&self) -> Result<BTreeMap<String, usize>, AdminError> {
        Ok(self
            .state()
            .await?
            .clusters
            .into_iter()
            .map(|(k, v)| (k, v.len()))
            .collect())
    }
}
