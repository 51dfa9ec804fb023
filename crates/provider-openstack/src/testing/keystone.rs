//! A Keystone v3 stand-in for end-to-end tests: `POST /v3/auth/tokens`
//! answers 201 with a token in `X-Subject-Token` and a catalog whose
//! network endpoint (region `RegionOne`, interface `public`) is the given
//! neutron-server; every other path is a 404. The request bodies are kept,
//! so a test can check which identity and scope were sent.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use hyper::Request;
use hyper::body::Incoming;
use serde_json::{Value, json};
use test_server::proxy::{self as plumbing, Answer};
use test_server::{Listener, TestServer, lock};

/// A running stand-in.
#[derive(Debug)]
pub struct Keystone {
    /// The `auth-url` to configure (`http://127.0.0.1:PORT/v3`).
    pub auth_url: String,
    seen: Arc<Mutex<Vec<Value>>>,
    _server: TestServer,
}

impl Keystone {
    /// Starts one whose catalog points at `neutron` (the URL without `/v2.0`).
    pub async fn start(neutron: &str) -> std::io::Result<Self> {
        let listener = Listener::bind().await?;
        let auth_url = format!("{}/v3", listener.url());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let neutron = neutron.to_string();
        let kept = Arc::clone(&seen);
        let server = listener.serve_hyper(move |req: Request<Incoming>| {
            let (neutron, kept) = (neutron.clone(), Arc::clone(&kept));
            async move { Ok::<Answer, Infallible>(answer(req, &neutron, &kept).await) }
        });
        Ok(Self {
            auth_url,
            seen,
            _server: server,
        })
    }

    /// The token requests' bodies so far.
    pub fn requests(&self) -> Vec<Value> {
        lock(&self.seen).clone()
    }
}

async fn answer(req: Request<Incoming>, neutron: &str, seen: &Mutex<Vec<Value>>) -> Answer {
    let path = req.uri().path().to_string();
    let body = plumbing::collect(req.into_body()).await.unwrap_or_default();
    if path != "/v3/auth/tokens" {
        return plumbing::reply(404, "application/json", r#"{"error": {"code": 404}}"#);
    }
    lock(seen).push(serde_json::from_slice(&body).unwrap_or(Value::Null));
    let token = json!({"token": {
        "issued_at": "2026-01-01T00:00:00.000000Z",
        "expires_at": "2099-01-01T00:00:00.000000Z",
        "catalog": [{"type": "network", "name": "neutron", "endpoints": [
            {"interface": "internal", "region_id": "RegionOne", "url": "http://127.0.0.1:1"},
            {"interface": "public", "region_id": "RegionOne", "url": neutron}
        ]}]
    }});
    let mut resp = plumbing::reply(201, "application/json", token.to_string());
    resp.headers_mut().insert(
        "X-Subject-Token",
        hyper::header::HeaderValue::from_static("tok-e2e"),
    );
    resp
}
