//! The endpoints `/metrics`, `/healthz`, `/livez` and `/readyz`, and the
//! plain HTTP server (`--metrics-bind-address`); the secure port is
//! [`crate::secure`].

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use crate::health::Health;

#[derive(Clone)]
struct AppState {
    registry: Arc<Registry>,
    health: Arc<Health>,
}

/// The endpoints, served on the secure port behind its filter and, on
/// request, as plain HTTP.
pub fn router(registry: Arc<Registry>, health: Arc<Health>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/livez", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(AppState { registry, health })
}

/// Binds `addr` and serves `app` as plain HTTP until `shutdown`; returns
/// the bound address.
pub async fn serve(
    addr: SocketAddr,
    app: Router,
    shutdown: CancellationToken,
) -> anyhow::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("--metrics-bind-address {addr}: {e}"))?;
    let local = listener.local_addr()?;
    let handle = tokio::spawn(async move {
        let r = axum::serve(listener, app)
            .with_graceful_shutdown(async move { shutdown.cancelled().await })
            .await;
        if let Err(e) = r {
            tracing::error!(error = %e, "HTTP server failed");
        }
    });
    Ok((local, handle))
}

async fn metrics(State(s): State<AppState>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        route_controller::metrics::encode(&s.registry),
    )
}

async fn healthz(State(s): State<AppState>) -> impl IntoResponse {
    match s.health.live() {
        Ok(()) => (StatusCode::OK, "ok\n".to_string()),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
    }
}

async fn readyz(State(s): State<AppState>) -> impl IntoResponse {
    match s.health.ready() {
        Ok(()) => (StatusCode::OK, "ok\n".to_string()),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
    }
}
