//! The two etcd calls the fixture needs (current revision, compaction), over
//! etcd's JSON gateway on loopback. A dozen lines of HTTP/1.1 is cheaper than
//! an etcd client crate for this.

use std::time::Duration;

use base64::Engine as _;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::Error;

const TIMEOUT: Duration = Duration::from_secs(30);

fn host_port(url: &str) -> Result<&str, Error> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| Error::Etcd(format!("only http:// endpoints are supported, got {url:?}")))?;
    Ok(rest.trim_end_matches('/'))
}

async fn post(url: &str, path: &str, body: &Value) -> Result<Value, Error> {
    let addr = host_port(url)?;
    let body = body.to_string();
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let exchange = async {
        let mut stream = TcpStream::connect(addr).await?;
        stream.write_all(request.as_bytes()).await?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await?;
        Ok::<_, std::io::Error>(response)
    };
    let response = tokio::time::timeout(TIMEOUT, exchange)
        .await
        .map_err(|_| Error::Etcd(format!("{url}{path}: no answer within {TIMEOUT:?}")))?
        .map_err(|e| Error::Etcd(format!("{url}{path}: {e}")))?;
    let text = String::from_utf8_lossy(&response);
    let (head, payload) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| Error::Etcd(format!("{url}{path}: malformed HTTP response")))?;
    let status = head.lines().next().unwrap_or("");
    if status.split_whitespace().nth(1) != Some("200") {
        return Err(Error::Etcd(format!(
            "{url}{path}: {status}: {}",
            payload.trim()
        )));
    }
    // Connection: close, so etcd answers without chunked encoding.
    serde_json::from_str(payload.trim()).map_err(|e| Error::Etcd(format!("{url}{path}: {e}")))
}

fn revision(v: &Value) -> Option<i64> {
    // The gateway renders int64 as a JSON string.
    match &v["header"]["revision"] {
        Value::String(s) => s.parse().ok(),
        Value::Number(n) => n.as_i64(),
        _ => None,
    }
}

/// The current etcd revision (the newest resourceVersion of the cluster).
pub(crate) async fn current_revision(url: &str) -> Result<i64, Error> {
    let key = base64::engine::general_purpose::STANDARD.encode("/");
    let v = post(
        url,
        "/v3/kv/range",
        &json!({ "key": key, "count_only": true }),
    )
    .await?;
    revision(&v).ok_or_else(|| Error::Etcd(format!("no revision in range response: {v}")))
}

/// Compacts etcd history up to the current revision; returns that revision.
pub(crate) async fn compact(url: &str) -> Result<i64, Error> {
    let rev = current_revision(url).await?;
    post(
        url,
        "/v3/kv/compaction",
        &json!({ "revision": rev.to_string(), "physical": true }),
    )
    .await?;
    Ok(rev)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_revision_in_both_renderings() {
        assert_eq!(revision(&json!({"header": {"revision": "42"}})), Some(42));
        assert_eq!(revision(&json!({"header": {"revision": 7}})), Some(7));
        assert_eq!(revision(&json!({"header": {}})), None);
    }

    #[test]
    fn rejects_non_http_endpoints() {
        assert!(host_port("https://127.0.0.1:1").is_err());
        assert_eq!(
            host_port("http://127.0.0.1:2379/").ok(),
            Some("127.0.0.1:2379")
        );
    }
}
