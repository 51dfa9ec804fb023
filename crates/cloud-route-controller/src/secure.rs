//! The secure port, served as the cloud-controller-manager serves its own:
//! HTTPS, and every path but the always-allowed health paths behind the API
//! server's delegated authentication and authorization. A request's bearer
//! token is checked with a `TokenReview`; the user it names must be allowed
//! `get` on the non-resource URL (`/metrics`) by a `SubjectAccessReview`.
//! Answers are cached for [`CACHE_TTL`], as the delegating authenticator and
//! authorizer cache theirs. When the API server cannot be asked the answer is
//! 503: an outage never opens the door.
//!
//! The certificate is the pair `--tls-cert-file`/`--tls-private-key-file`,
//! read again on the first handshake after either file changed (a rotated
//! Secret), or a self-signed one made in memory at start.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::Api;
use kube::api::PostParams;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::net::TcpListener;
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// How long a review's answer is reused: the delegating authenticator's and
/// authorizer's default.
pub const CACHE_TTL: Duration = Duration::from_secs(10);

/// How long one review may take before the request is answered 503.
const REVIEW_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a client may take for its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Cached answers at most; the oldest half goes when full.
const CACHE_SIZE: usize = 1024;

/// Settings of the secure port (the `--secure-port` flags).
#[derive(Debug, Clone)]
pub struct SecureConfig {
    pub addr: SocketAddr,
    pub cert_files: Option<(PathBuf, PathBuf)>,
    pub always_allow: Vec<String>,
}

/// The user a token belongs to, as the TokenReview named it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub uid: Option<String>,
    pub groups: Vec<String>,
    pub extra: std::collections::BTreeMap<String, Vec<String>>,
}

/// Asks the API server; a `String` error means it could not be asked.
pub trait Review: Send + Sync + 'static {
    /// `Ok(None)`: the token is not valid.
    fn authenticate(
        &self,
        token: &str,
    ) -> impl Future<Output = Result<Option<User>, String>> + Send;
    /// Whether `user` may `verb` the non-resource `path`.
    fn authorize(
        &self,
        user: &User,
        path: &str,
        verb: &str,
    ) -> impl Future<Output = Result<bool, String>> + Send;
}

/// What the filter answers a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Allow,
    /// 401: no token, or one the API server does not know.
    Unauthenticated,
    /// 403: a known user without the permission.
    Forbidden,
    /// 503: the API server could not be asked.
    Unavailable,
}

/// A cached authorization: user, path, verb.
type Grant = (String, String, String);

/// The delegated authentication and authorization filter, with its caches.
pub struct Delegated<R> {
    review: R,
    always_allow: Vec<String>,
    users: Mutex<HashMap<String, (Instant, Option<User>)>>,
    grants: Mutex<HashMap<Grant, (Instant, bool)>>,
}

impl<R: Review> Delegated<R> {
    pub fn new(review: R, always_allow: Vec<String>) -> Self {
        Self {
            review,
            always_allow,
            users: Mutex::default(),
            grants: Mutex::default(),
        }
    }

    /// Whether a request for `path` with this `Authorization` header value
    /// and `verb` (`get`) is let through.
    pub async fn decide(&self, path: &str, verb: &str, authorization: Option<&str>) -> Decision {
        if self.always_allowed(path) {
            return Decision::Allow;
        }
        let Some(token) = authorization
            .and_then(|h| h.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|t| !t.is_empty())
        else {
            return Decision::Unauthenticated;
        };
        let user = match self.user(token).await {
            Ok(Some(u)) => u,
            Ok(None) => return Decision::Unauthenticated,
            Err(e) => {
                warn!(error = %e, "could not authenticate a request to the secure port: the API server's TokenReview failed; answering 503");
                return Decision::Unavailable;
            }
        };
        match self.allowed(&user, path, verb).await {
            Ok(true) => Decision::Allow,
            Ok(false) => {
                debug!(user = %user.name, path, verb, "forbidden on the secure port");
                Decision::Forbidden
            }
            Err(e) => {
                warn!(error = %e, "could not authorize a request to the secure port: the API server's SubjectAccessReview failed; answering 503");
                Decision::Unavailable
            }
        }
    }

    /// `--authorization-always-allow-paths`: exact paths, or prefixes ending in `/*`.
    fn always_allowed(&self, path: &str) -> bool {
        self.always_allow.iter().any(|p| match p.strip_suffix('*') {
            Some(prefix) => path.starts_with(prefix),
            None => p == path,
        })
    }

    async fn user(&self, token: &str) -> Result<Option<User>, String> {
        if let Some(hit) = cached(&self.users, token) {
            return Ok(hit);
        }
        let answer = timed(self.review.authenticate(token)).await?;
        store(&self.users, token.to_string(), answer.clone());
        Ok(answer)
    }

    async fn allowed(&self, user: &User, path: &str, verb: &str) -> Result<bool, String> {
        let key = (user.name.clone(), path.to_string(), verb.to_string());
        if let Some(hit) = cached(&self.grants, &key) {
            return Ok(hit);
        }
        let answer = timed(self.review.authorize(user, path, verb)).await?;
        store(&self.grants, key, answer);
        Ok(answer)
    }
}

async fn timed<T>(f: impl Future<Output = Result<T, String>>) -> Result<T, String> {
    tokio::time::timeout(REVIEW_TIMEOUT, f)
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {REVIEW_TIMEOUT:?}")))
}

fn cached<K, Q, V>(cache: &Mutex<HashMap<K, (Instant, V)>>, key: &Q) -> Option<V>
where
    K: std::borrow::Borrow<Q> + std::hash::Hash + Eq,
    Q: std::hash::Hash + Eq + ?Sized,
    V: Clone,
{
    let cache = cache.lock().unwrap_or_else(|p| p.into_inner());
    cache
        .get(key)
        .filter(|(at, _)| at.elapsed() < CACHE_TTL)
        .map(|(_, v)| v.clone())
}

fn store<K: std::hash::Hash + Eq + Clone, V>(
    cache: &Mutex<HashMap<K, (Instant, V)>>,
    key: K,
    v: V,
) {
    let mut cache = cache.lock().unwrap_or_else(|p| p.into_inner());
    if cache.len() >= CACHE_SIZE {
        cache.retain(|_, (at, _)| at.elapsed() < CACHE_TTL);
        if cache.len() >= CACHE_SIZE {
            let mut ages: Vec<Instant> = cache.values().map(|(at, _)| *at).collect();
            ages.sort_unstable();
            let cut = ages[ages.len() / 2];
            cache.retain(|_, (at, _)| *at > cut);
        }
    }
    cache.insert(key, (Instant::now(), v));
}

/// The reviews, asked of the API server.
pub struct KubeReview {
    client: kube::Client,
}

impl KubeReview {
    pub fn new(client: kube::Client) -> Self {
        Self { client }
    }
}

impl Review for KubeReview {
    async fn authenticate(&self, token: &str) -> Result<Option<User>, String> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_string()),
                audiences: None,
            },
            ..Default::default()
        };
        let api: Api<TokenReview> = Api::all(self.client.clone());
        let answer = api
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| format!("TokenReview: {e}"))?;
        let Some(status) = answer.status else {
            return Ok(None);
        };
        if status.authenticated != Some(true) {
            return Ok(None);
        }
        let info = status.user.unwrap_or_default();
        Ok(Some(User {
            name: info.username.unwrap_or_default(),
            uid: info.uid,
            groups: info.groups.unwrap_or_default(),
            extra: info.extra.unwrap_or_default(),
        }))
    }

    async fn authorize(&self, user: &User, path: &str, verb: &str) -> Result<bool, String> {
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(user.name.clone()),
                uid: user.uid.clone(),
                groups: Some(user.groups.clone()),
                extra: Some(user.extra.clone()),
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some(path.to_string()),
                    verb: Some(verb.to_string()),
                }),
                resource_attributes: None,
            },
            ..Default::default()
        };
        let api: Api<SubjectAccessReview> = Api::all(self.client.clone());
        let answer = api
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| format!("SubjectAccessReview: {e}"))?;
        Ok(answer.status.is_some_and(|s| s.allowed))
    }
}

/// The Kubernetes verb of a non-resource request, as the API server maps it.
fn verb_of(method: &axum::http::Method) -> &'static str {
    use axum::http::Method;
    match *method {
        Method::GET | Method::HEAD => "get",
        Method::POST => "post",
        Method::PUT => "put",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        Method::OPTIONS => "options",
        _ => "unknown",
    }
}

async fn filter(
    State(auth): State<Arc<Delegated<KubeReview>>>,
    req: Request,
    next: Next,
) -> Response {
    let authorization = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let decision = auth
        .decide(req.uri().path(), verb_of(req.method()), authorization)
        .await;
    match decision {
        Decision::Allow => next.run(req).await,
        Decision::Unauthenticated => (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            "Unauthorized: a bearer token the API server's TokenReview accepts is needed\n",
        )
            .into_response(),
        Decision::Forbidden => (
            StatusCode::FORBIDDEN,
            format!(
                "Forbidden: the user may not {} {}; grant it with a ClusterRole rule on nonResourceURLs\n",
                verb_of(req.method()),
                req.uri().path()
            ),
        )
            .into_response(),
        Decision::Unavailable => (
            StatusCode::SERVICE_UNAVAILABLE,
            "the API server could not be asked to authenticate or authorize this request\n",
        )
            .into_response(),
    }
}

/// Binds the secure port and serves `app` behind the filter until `shutdown`.
pub async fn serve(
    cfg: SecureConfig,
    client: kube::Client,
    app: Router,
    shutdown: CancellationToken,
) -> anyhow::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let certs = Arc::new(CertSource::new(cfg.cert_files.clone())?);
    let mut tls = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_cert_resolver(certs);
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = TlsAcceptor::from(Arc::new(tls));
    let listener = TcpListener::bind(cfg.addr)
        .await
        .map_err(|e| anyhow::anyhow!(bind_error(cfg.addr, &e)))?;
    let local = listener.local_addr()?;
    let auth = Arc::new(Delegated::new(
        KubeReview::new(client),
        cfg.always_allow.clone(),
    ));
    let app = app.layer(axum::middleware::from_fn_with_state(auth, filter));
    let listener = TlsListener::start(listener, acceptor, local, shutdown.clone());
    let handle = tokio::spawn(async move {
        let r = axum::serve(listener, app)
            .with_graceful_shutdown(async move { shutdown.cancelled().await })
            .await;
        if let Err(e) = r {
            tracing::error!(error = %e, "HTTPS server failed");
        }
    });
    Ok((local, handle))
}

/// Ports bound by default on control-plane hosts, and who binds them: the
/// survey behind `--secure-port`'s default (inclusive ranges).
const WELL_KNOWN_PORTS: &[(u16, u16, &str)] = &[
    (2379, 2380, "etcd's client and peer ports"),
    (2381, 2381, "etcd's metrics port"),
    (4240, 4240, "Cilium's health port"),
    (4244, 4245, "Cilium's Hubble ports"),
    (
        8233,
        8233,
        "the hcloud cloud-controller-manager's metrics port",
    ),
    (9091, 9091, "Calico's (Felix's) metrics port"),
    (9099, 9099, "Calico's health port"),
    (9962, 9965, "Cilium's metrics ports"),
    (10248, 10248, "the kubelet's healthz port"),
    (10249, 10249, "kube-proxy's metrics port"),
    (10250, 10250, "the kubelet's port"),
    (10254, 10254, "ingress-nginx's metrics and health port"),
    (10256, 10256, "kube-proxy's healthz port"),
    (10257, 10257, "kube-controller-manager's secure port"),
    (10258, 10258, "the cloud-controller-manager's secure port"),
    (10259, 10259, "kube-scheduler's secure port"),
    (
        10260,
        10260,
        "the cloud-controller-manager's webhook port (--webhook-secure-port, bound on 0.0.0.0 by k8s.io/cloud-provider v0.27-v0.31 whether or not a webhook is enabled, from v0.32 when --webhooks is set; cert-manager's webhook is also often moved there under hostNetwork)",
    ),
    (10261, 10273, "OpenYurt's components"),
    (
        10267,
        10268,
        "Azure's cloud-controller-manager (its chart's --secure-port)",
    ),
    (10350, 10350, "Antrea's agent API port"),
];

/// Who usually holds `port` on a control-plane host, per the survey.
pub fn usual_holder(port: u16) -> Option<&'static str> {
    // Azure's narrower range wins over OpenYurt's wider one.
    WELL_KNOWN_PORTS
        .iter()
        .filter(|(lo, hi, _)| (*lo..=*hi).contains(&port))
        .min_by_key(|(lo, hi, _)| hi - lo)
        .map(|(_, _, who)| *who)
}

/// The message for a secure port that cannot be bound: the address, the
/// flag, and for an address in use who usually holds the port.
fn bind_error(addr: SocketAddr, e: &std::io::Error) -> String {
    if e.kind() == std::io::ErrorKind::AddrInUse {
        let port = addr.port();
        let who = usual_holder(port).map_or_else(
            || "another process holds it".to_string(),
            |who| format!("on a control-plane host {port} is usually {who}"),
        );
        format!(
            "cannot listen on {addr} for --secure-port: address already in use; {who} \u{2014} pick a free port with --secure-port (0 turns the secure port off)"
        )
    } else {
        format!(
            "cannot listen on {addr} for --bind-address/--secure-port: {e} (0 as --secure-port turns the secure port off)"
        )
    }
}

/// Accepts TCP connections and hands on those whose TLS handshake
/// succeeded; each handshake runs on its own task, so a slow or silent
/// client holds up nobody else.
struct TlsListener {
    rx: tokio::sync::mpsc::Receiver<(TlsStream<tokio::net::TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

impl TlsListener {
    fn start(
        listener: TcpListener,
        acceptor: TlsAcceptor,
        local: SocketAddr,
        shutdown: CancellationToken,
    ) -> Self {
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    a = listener.accept() => a,
                    () = shutdown.cancelled() => return,
                };
                let (tcp, peer) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        debug!(error = %e, "accept on the secure port failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let acceptor = acceptor.clone();
                let tx = tx.clone();
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                        Ok(Ok(tls)) => {
                            let _ = tx.send((tls, peer)).await;
                        }
                        Ok(Err(e)) => debug!(peer = %peer, error = %e, "TLS handshake failed"),
                        Err(_) => debug!(peer = %peer, "TLS handshake timed out"),
                    }
                });
            }
        });
        Self { rx, local }
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<tokio::net::TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.rx.recv().await {
            Some(c) => c,
            // The acceptor stopped (shutdown): wait for the server to stop.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}

/// What identifies a version of a file on disk.
type Stamp = Option<(SystemTime, u64)>;

fn stamp(path: &Path) -> Stamp {
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len()))
}

/// The serving certificate: from files, read again when they change, or
/// self-signed in memory.
struct CertSource {
    files: Option<(PathBuf, PathBuf)>,
    current: Mutex<(Stamp, Stamp, Arc<CertifiedKey>)>,
}

impl std::fmt::Debug for CertSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertSource")
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

impl CertSource {
    fn new(files: Option<(PathBuf, PathBuf)>) -> anyhow::Result<Self> {
        let (a, b, key) = match &files {
            Some((cert, key)) => {
                let loaded = load_pair(cert, key).map_err(|e| anyhow::anyhow!(e))?;
                info!(cert = %cert.display(), key = %key.display(), "serving the secure port with --tls-cert-file");
                (stamp(cert), stamp(key), loaded)
            }
            None => {
                let loaded = self_signed()?;
                info!(
                    "serving the secure port with a self-signed certificate made at start (--tls-cert-file names a real one)"
                );
                (None, None, loaded)
            }
        };
        Ok(Self {
            files,
            current: Mutex::new((a, b, Arc::new(key))),
        })
    }
}

impl ResolvesServerCert for CertSource {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((cert, key)) = &self.files {
            let now = (stamp(cert), stamp(key));
            if now != (current.0, current.1) {
                // A half-written pair fails to load or match: keep serving
                // the old one and try again on the next handshake.
                match load_pair(cert, key) {
                    Ok(loaded) => {
                        info!(cert = %cert.display(), "the serving certificate changed on disk; serving the new one");
                        *current = (now.0, now.1, Arc::new(loaded));
                    }
                    Err(e) => {
                        warn!(error = %e, "the serving certificate changed on disk but cannot be loaded; still serving the previous one")
                    }
                }
            }
        }
        Some(current.2.clone())
    }
}

fn load_pair(cert: &Path, key: &Path) -> Result<CertifiedKey, String> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .and_then(|it| it.collect::<Result<_, _>>())
        .map_err(|e| format!("--tls-cert-file {}: {e}", cert.display()))?;
    if chain.is_empty() {
        return Err(format!(
            "--tls-cert-file {}: no PEM certificate in it",
            cert.display()
        ));
    }
    let der = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| format!("--tls-private-key-file {}: {e}", key.display()))?;
    let provider = rustls::crypto::aws_lc_rs::default_provider();
    CertifiedKey::from_der(chain, der, &provider).map_err(|e| {
        format!(
            "--tls-cert-file {} and --tls-private-key-file {}: {e}",
            cert.display(),
            key.display()
        )
    })
}

fn self_signed() -> anyhow::Result<CertifiedKey> {
    let mut names = vec!["localhost".to_string(), "127.0.0.1".to_string()];
    if let Ok(host) = std::fs::read_to_string("/proc/sys/kernel/hostname") {
        let host = host.trim();
        if !host.is_empty() {
            names.push(host.to_string());
        }
    }
    let made = rcgen::generate_simple_self_signed(names)
        .map_err(|e| anyhow::anyhow!("making the self-signed serving certificate: {e}"))?;
    let der = PrivateKeyDer::try_from(made.signing_key.serialize_der())
        .map_err(|e| anyhow::anyhow!("the self-signed serving key: {e}"))?;
    let provider = rustls::crypto::aws_lc_rs::default_provider();
    CertifiedKey::from_der(vec![made.cert.der().clone()], der, &provider)
        .map_err(|e| anyhow::anyhow!("the self-signed serving certificate: {e}"))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[test]
    fn a_taken_secure_port_names_the_address_the_flag_and_its_usual_holder() {
        let in_use = std::io::Error::from(std::io::ErrorKind::AddrInUse);
        let m = bind_error("0.0.0.0:10260".parse().unwrap(), &in_use);
        assert!(
            m.starts_with(
                "cannot listen on 0.0.0.0:10260 for --secure-port: address already in use; on a control-plane host 10260 is usually the cloud-controller-manager's webhook port"
            ),
            "{m}"
        );
        assert!(m.ends_with("pick a free port with --secure-port (0 turns the secure port off)"));
        let m = bind_error("127.0.0.1:10257".parse().unwrap(), &in_use);
        assert!(
            m.contains("usually kube-controller-manager's secure port"),
            "{m}"
        );
        let m = bind_error("0.0.0.0:10288".parse().unwrap(), &in_use);
        assert!(
            m.contains(
                "0.0.0.0:10288 for --secure-port: address already in use; another process holds it"
            ),
            "{m}"
        );
        let denied = std::io::Error::from(std::io::ErrorKind::PermissionDenied);
        let m = bind_error("0.0.0.0:443".parse().unwrap(), &denied);
        assert!(
            m.contains("0.0.0.0:443 for --bind-address/--secure-port"),
            "{m}"
        );
    }

    #[test]
    fn the_survey_names_the_holders_of_the_control_plane_ports_and_none_of_the_default() {
        for (port, who) in [
            (10250, "kubelet"),
            (10248, "kubelet"),
            (10249, "kube-proxy"),
            (10256, "kube-proxy"),
            (10257, "kube-controller-manager"),
            (10258, "cloud-controller-manager"),
            (10259, "kube-scheduler"),
            (10260, "webhook"),
            (2379, "etcd"),
            (2381, "etcd"),
            (10267, "Azure"),
            (10268, "Azure"),
            (10261, "OpenYurt"),
            (10273, "OpenYurt"),
            (8233, "hcloud"),
            (4240, "Cilium"),
            (9963, "Cilium"),
            (9091, "Calico"),
            (9099, "Calico"),
            (10254, "ingress-nginx"),
            (10350, "Antrea"),
        ] {
            let got = usual_holder(port).unwrap_or_else(|| panic!("{port} has no holder"));
            assert!(got.contains(who), "{port}: {got}");
        }
        for free in 10280..=10299 {
            assert_eq!(usual_holder(free), None, "{free}");
        }
    }

    /// A review answering from a table; counts the questions.
    #[derive(Default)]
    struct Table {
        users: HashMap<String, User>,
        allowed: Vec<String>,
        down: std::sync::atomic::AtomicBool,
        asked: AtomicUsize,
    }

    impl Review for Arc<Table> {
        async fn authenticate(&self, token: &str) -> Result<Option<User>, String> {
            self.asked.fetch_add(1, Ordering::SeqCst);
            if self.down.load(Ordering::SeqCst) {
                return Err("connection refused".into());
            }
            Ok(self.users.get(token).cloned())
        }
        async fn authorize(&self, user: &User, _: &str, _: &str) -> Result<bool, String> {
            self.asked.fetch_add(1, Ordering::SeqCst);
            if self.down.load(Ordering::SeqCst) {
                return Err("connection refused".into());
            }
            Ok(self.allowed.contains(&user.name))
        }
    }

    fn user(name: &str) -> User {
        User {
            name: name.into(),
            uid: None,
            groups: vec![],
            extra: Default::default(),
        }
    }

    fn filter() -> (Arc<Table>, Delegated<Arc<Table>>) {
        let table = Arc::new(Table {
            users: [
                ("good".to_string(), user("prometheus")),
                ("other".to_string(), user("nobody")),
            ]
            .into(),
            allowed: vec!["prometheus".into()],
            ..Default::default()
        });
        let always = vec!["/healthz".into(), "/readyz".into(), "/livez".into()];
        (table.clone(), Delegated::new(table, always))
    }

    #[tokio::test]
    async fn tokens_are_reviewed_and_health_paths_need_none() {
        let (_, f) = filter();
        assert_eq!(f.decide("/healthz", "get", None).await, Decision::Allow);
        assert_eq!(f.decide("/livez", "get", None).await, Decision::Allow);
        assert_eq!(
            f.decide("/metrics", "get", None).await,
            Decision::Unauthenticated
        );
        assert_eq!(
            f.decide("/metrics", "get", Some("Basic abc")).await,
            Decision::Unauthenticated
        );
        assert_eq!(
            f.decide("/metrics", "get", Some("Bearer bad")).await,
            Decision::Unauthenticated
        );
        assert_eq!(
            f.decide("/metrics", "get", Some("Bearer other")).await,
            Decision::Forbidden
        );
        assert_eq!(
            f.decide("/metrics", "get", Some("Bearer good")).await,
            Decision::Allow
        );
    }

    #[tokio::test(start_paused = true)]
    async fn answers_are_cached_for_ten_seconds_and_an_outage_is_503_never_allow() {
        let (table, f) = filter();
        assert_eq!(
            f.decide("/metrics", "get", Some("Bearer good")).await,
            Decision::Allow
        );
        let asked = table.asked.load(Ordering::SeqCst);
        assert_eq!(
            f.decide("/metrics", "get", Some("Bearer good")).await,
            Decision::Allow
        );
        assert_eq!(
            table.asked.load(Ordering::SeqCst),
            asked,
            "answered from the cache"
        );
        table.down.store(true, Ordering::SeqCst);
        tokio::time::advance(CACHE_TTL).await;
        assert_eq!(
            f.decide("/metrics", "get", Some("Bearer good")).await,
            Decision::Unavailable
        );
        assert_eq!(
            f.decide("/metrics", "get", Some("Bearer new")).await,
            Decision::Unavailable
        );
        assert_eq!(f.decide("/healthz", "get", None).await, Decision::Allow);
    }

    #[test]
    fn always_allowed_paths_are_exact_or_a_prefix_with_a_star() {
        let f = Delegated::new(
            Arc::new(Table::default()),
            vec!["/healthz".into(), "/debug/*".into()],
        );
        assert!(f.always_allowed("/healthz"));
        assert!(!f.always_allowed("/healthz/extra"));
        assert!(f.always_allowed("/debug/pprof"));
        assert!(!f.always_allowed("/metrics"));
    }

    #[test]
    fn a_self_signed_certificate_is_made_and_a_bad_pair_is_a_clear_error() {
        assert!(self_signed().is_ok());
        let dir = std::env::temp_dir().join(format!("crc-secure-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cert = dir.join("tls.crt");
        let key = dir.join("tls.key");
        std::fs::write(&cert, "not a certificate").unwrap();
        std::fs::write(&key, "not a key").unwrap();
        let e = load_pair(&cert, &key).unwrap_err();
        assert!(e.contains("--tls-cert-file"), "{e}");
        let made = rcgen::generate_simple_self_signed(vec!["a".to_string()]).unwrap();
        std::fs::write(&cert, made.cert.pem()).unwrap();
        std::fs::write(&key, made.signing_key.serialize_pem()).unwrap();
        assert!(load_pair(&cert, &key).is_ok());
        let other = rcgen::generate_simple_self_signed(vec!["b".to_string()]).unwrap();
        std::fs::write(&key, other.signing_key.serialize_pem()).unwrap();
        let e = load_pair(&cert, &key).unwrap_err();
        assert!(
            e.contains("--tls-private-key-file"),
            "a key that does not match: {e}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
