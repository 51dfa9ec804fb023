//! Serving an axum `Router` (feature `axum`), as the fake clouds do.

use axum::Router;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::{Listener, TestServer};

impl Listener {
    /// Serves `app` on the socket; `name` says whose server stopped when
    /// serving fails.
    pub fn serve_axum(self, app: Router, name: &'static str) -> TestServer {
        self.spawn(move |listener| async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::warn!(error = %e, "{name} stopped");
            }
        })
    }
}

/// A JSON answer with extra headers; a header value that is not valid in
/// HTTP is left out rather than failing the answer.
pub fn json_response(
    status: StatusCode,
    body: serde_json::Value,
    headers: impl IntoIterator<Item = (&'static str, String)>,
) -> Response {
    let mut response = (status, axum::Json(body)).into_response();
    for (name, v) in headers {
        if let Ok(v) = HeaderValue::from_str(&v) {
            response.headers_mut().insert(name, v);
        }
    }
    response
}
