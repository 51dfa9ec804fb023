//! The one request path of the HTTP providers: the client-side budget, the
//! [`Fence`] in front of every change, [`RequestStats`], the pause after a
//! throttling answer, what a lost answer means, and the hooks a cloud fills
//! in: how it authenticates ([`Auth`]) and what its answers mean (the
//! `read` closure of [`Client::send`], next to that cloud's error codes).
//!
//! The budget is [`route_cloud::ratelimit::TokenBucket`], not a crate such
//! as `governor`: the providers also lower it to what a server says is left
//! and pause it until a server's reset, and a change must give up its wait
//! as soon as the fence closes; the bucket does all three on tokio time, so
//! a paused test clock drives it.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use reqwest::header::HeaderValue;
use reqwest::{Method, RequestBuilder, Response};
use route_cloud::ratelimit::TokenBucket;
use route_cloud::{CloudError, ErrorKind, Fence, RequestStats};
use tokio::time::Instant;

use crate::{Meter, Secret, transport_error};

/// A connection that takes longer than this is not going to come: the
/// request is reported before a long request timeout has passed.
const MAX_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The connect timeout of a client whose requests time out after
/// `request`: at most ten seconds.
pub fn connect_timeout(request: Duration) -> Duration {
    request.min(MAX_CONNECT_TIMEOUT)
}

/// A `reqwest` client builder with what every provider's client has: the
/// request `timeout`, a connect timeout of at most ten seconds, and the
/// controller's user agent. A provider adds its own (trusted roots) and
/// builds it.
pub fn client_builder(timeout: Duration) -> reqwest::ClientBuilder {
    reqwest::Client::builder()
        .timeout(timeout)
        .connect_timeout(connect_timeout(timeout))
        .user_agent(concat!(
            "cloud-route-controller/",
            env!("CARGO_PKG_VERSION")
        ))
}

/// The client-side request budget of one provider.
#[derive(Debug)]
pub enum Budget {
    /// One bucket for reads and changes.
    Shared(TokenBucket),
    /// Reads and changes counted apart, for a cloud that limits them apart
    /// (ARM).
    Split {
        /// Taken by every `GET`.
        reads: TokenBucket,
        /// Taken by every change, through the fence.
        writes: TokenBucket,
    },
}

impl Budget {
    fn reads(&self) -> &TokenBucket {
        match self {
            Self::Shared(b) | Self::Split { reads: b, .. } => b,
        }
    }

    fn writes(&self) -> &TokenBucket {
        match self {
            Self::Shared(b) | Self::Split { writes: b, .. } => b,
        }
    }

    fn buckets(&self) -> impl Iterator<Item = &TokenBucket> {
        let (first, second) = match self {
            Self::Shared(b) => (b, None),
            Self::Split { reads, writes } => (reads, Some(writes)),
        };
        std::iter::once(first).chain(second)
    }
}

/// Which budget a request takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Take {
    Read,
    Write,
    Nothing,
}

/// What the request path needs to know of one request besides the request
/// itself.
#[derive(Debug, Clone)]
pub struct Call<'a> {
    op: &'static str,
    label: &'a str,
    take: Take,
    may_have_changed: bool,
    pauses: bool,
}

impl<'a> Call<'a> {
    /// A request to the cloud's API, counted under `op`; `label` names it
    /// in the text of a failure before an answer. A `GET` takes a token of
    /// the read budget; any other method is a change: it takes one of the
    /// write budget through the fence, and is not sent once the fence has
    /// closed. A throttling answer pauses the whole budget.
    pub fn new(op: &'static str, label: &'a str, method: &Method) -> Self {
        Self {
            op,
            label,
            take: if method == Method::GET {
                Take::Read
            } else {
                Take::Write
            },
            may_have_changed: false,
            pauses: true,
        }
    }

    /// A change that could have taken effect although its answer was lost
    /// (neither conditional nor idempotent): see [`transport_error`].
    pub fn uncertain(mut self) -> Self {
        self.may_have_changed = self.take == Take::Write;
        self
    }

    /// A request for credentials to an identity service, counted under
    /// `op`. It takes a token of the read budget when `budgeted` (a service
    /// the cloud's API budget covers); a throttling answer from it pauses
    /// nothing, since the API did not throttle.
    pub fn credentials(op: &'static str, label: &'a str, budgeted: bool) -> Self {
        Self {
            op,
            label,
            take: if budgeted { Take::Read } else { Take::Nothing },
            may_have_changed: false,
            pauses: false,
        }
    }
}

/// How a cloud authenticates its requests. [`Client::send`] asks for the
/// credentials before the request waits for its budget (obtaining them is
/// a request of its own, which the implementation sends through the same
/// [`Client`], so it is counted too), adds them to the request, and tells
/// the implementation about every failed answer, so a refused token can be
/// dropped and obtained anew.
pub trait Auth: Sync {
    /// What [`Auth::apply`] adds to a request.
    type Credentials: Send;

    /// Valid credentials, obtained or renewed first when needed.
    fn credentials(
        &self,
        client: &Client,
    ) -> impl Future<Output = Result<Self::Credentials, CloudError>> + Send;

    /// `request` with `credentials` added.
    fn apply(&self, credentials: &Self::Credentials, request: RequestBuilder) -> RequestBuilder;

    /// A request with these credentials failed with `error`: forget what it
    /// says is no longer good. Nothing by default.
    fn refused(&self, error: &CloudError) -> impl Future<Output = ()> + Send {
        let _ = error;
        async {}
    }
}

/// No credentials (a token endpoint, an unauthenticated test deployment).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoAuth;

impl Auth for NoAuth {
    type Credentials = ();

    async fn credentials(&self, _: &Client) -> Result<(), CloudError> {
        Ok(())
    }

    fn apply(&self, (): &(), request: RequestBuilder) -> RequestBuilder {
        request
    }
}

/// A static `Authorization: Bearer` token (Hetzner Cloud's API token).
#[derive(Debug, Clone, Copy)]
pub struct Bearer<'a>(pub &'a Secret);

impl Auth for Bearer<'_> {
    type Credentials = ();

    async fn credentials(&self, _: &Client) -> Result<(), CloudError> {
        Ok(())
    }

    fn apply(&self, (): &(), request: RequestBuilder) -> RequestBuilder {
        // `bearer_auth` marks the header sensitive.
        request.bearer_auth(self.0.expose())
    }
}

/// A token in a header of its own (Keystone's `X-Auth-Token`), marked
/// sensitive; `None` sends none.
#[derive(Debug, Clone, Copy)]
pub struct TokenHeader<'a> {
    /// The header's name.
    pub name: &'static str,
    /// The token.
    pub token: Option<&'a Secret>,
}

impl Auth for TokenHeader<'_> {
    type Credentials = ();

    async fn credentials(&self, _: &Client) -> Result<(), CloudError> {
        Ok(())
    }

    fn apply(&self, (): &(), request: RequestBuilder) -> RequestBuilder {
        let Some(token) = self.token else {
            return request;
        };
        match HeaderValue::from_str(token.expose()) {
            Ok(mut v) => {
                v.set_sensitive(true);
                request.header(self.name, v)
            }
            // Handed on as text, so the request fails when it is sent, as a
            // request that cannot be built (never with the value in the text).
            Err(_) => request.header(self.name, token.expose()),
        }
    }
}

/// Credentials obtained once and reused until they are due for renewal, or
/// until [`Renewing::forget`] drops them. Obtaining holds the lock, so
/// requests that find none wait for one exchange instead of each starting
/// their own.
pub struct Renewing<T> {
    cached: tokio::sync::Mutex<Option<(T, Option<Instant>)>>,
}

impl<T> Default for Renewing<T> {
    fn default() -> Self {
        Self {
            cached: tokio::sync::Mutex::new(None),
        }
    }
}

impl<T> fmt::Debug for Renewing<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Renewing").finish_non_exhaustive()
    }
}

impl<T: Clone> Renewing<T> {
    /// The cached credentials while it is before their renewal instant (for
    /// ever when it is `None`), else what `obtain` gives, which is cached
    /// with its renewal instant.
    pub async fn get<F, Fut>(&self, obtain: F) -> Result<T, CloudError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<(T, Option<Instant>), CloudError>>,
    {
        let mut cached = self.cached.lock().await;
        if let Some((t, renew_at)) = &*cached
            && renew_at.is_none_or(|at| Instant::now() < at)
        {
            return Ok(t.clone());
        }
        let (t, renew_at) = obtain().await?;
        *cached = Some((t.clone(), renew_at));
        Ok(t)
    }

    /// Drops the cached credentials: the next [`Renewing::get`] obtains new
    /// ones.
    pub async fn forget(&self) {
        *self.cached.lock().await = None;
    }
}

/// The HTTP client of one provider: every request it sends, credential
/// exchanges included, goes through [`Client::send`].
#[derive(Debug)]
pub struct Client {
    http: reqwest::Client,
    budget: Budget,
    meter: Meter,
    provider: &'static str,
    throttle_pause: Option<Duration>,
}

impl Client {
    /// A client of `provider` (the name its log lines carry) that sends with
    /// `http` inside `budget`; the fence is open until
    /// [`Client::set_fence`].
    pub fn new(provider: &'static str, http: reqwest::Client, budget: Budget) -> Self {
        Self {
            http,
            budget,
            meter: Meter::default(),
            provider,
            throttle_pause: None,
        }
    }

    /// How long a throttling answer that names no wait pauses the budget
    /// (by default it pauses nothing).
    pub fn with_throttle_pause(mut self, pause: Duration) -> Self {
        self.throttle_pause = Some(pause);
        self
    }

    /// The `reqwest` client, for building requests.
    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    /// The counters of every request sent.
    pub fn stats(&self) -> &RequestStats {
        self.meter.stats()
    }

    /// Replaces the fence every change passes.
    pub fn set_fence(&mut self, fence: Fence) {
        self.meter.set_fence(fence);
    }

    /// Hands out no budget before `until` (a server's reset).
    pub async fn pause_until(&self, until: Instant) {
        for b in self.budget.buckets() {
            b.pause_until(until).await;
        }
    }

    /// Lowers the budget to at most `remaining` (what a server says is left
    /// of a budget it shares with other clients).
    pub async fn clamp_remaining(&self, remaining: f64) {
        for b in self.budget.buckets() {
            b.clamp_remaining(remaining).await;
        }
    }

    /// Sends one request and returns what `read` makes of its answer.
    ///
    /// In order: the credentials of `auth`; a token of the budget `call`
    /// names, the wait added to the stats (a change that waited past the
    /// fence's closing is refused with [`ErrorKind::Fenced`], neither sent
    /// nor counted); the request, or the error that kept it from being
    /// built; a failure before an answer mapped by [`transport_error`]; the
    /// result counted under the call's op; after a throttling result, the
    /// budget paused for its `retry_after` (or the client's default); and
    /// `auth` told of a failure.
    pub async fn send<A, T, F, Fut>(
        &self,
        call: Call<'_>,
        auth: &A,
        request: Result<RequestBuilder, CloudError>,
        read: F,
    ) -> Result<T, CloudError>
    where
        A: Auth,
        F: FnOnce(Response) -> Fut,
        Fut: Future<Output = Result<T, CloudError>>,
    {
        let credentials = auth.credentials(self).await?;
        match call.take {
            Take::Read => self.meter.take(self.budget.reads(), false).await?,
            Take::Write => self.meter.take(self.budget.writes(), true).await?,
            Take::Nothing => {}
        }
        let result = match request {
            Err(e) => Err(e),
            Ok(r) => match auth.apply(&credentials, r).send().await {
                Err(e) => Err(transport_error(call.label, &e, call.may_have_changed)),
                Ok(resp) => read(resp).await,
            },
        };
        self.meter.count(call.op, &result);
        match &result {
            Err(e) => {
                if call.pauses
                    && e.kind == ErrorKind::Throttled
                    && let Some(wait) = e.retry_after.or(self.throttle_pause)
                {
                    // Waiting here keeps a retry that comes early from
                    // being refused again, and the other requests of this
                    // replica from adding to the throttling.
                    self.pause_until(Instant::now() + wait).await;
                }
                auth.refused(e).await;
                tracing::debug!(provider = self.provider, op = call.op, error = %e, "request failed");
            }
            Ok(_) => tracing::trace!(provider = self.provider, op = call.op, "answered"),
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    use axum::Router;
    use axum::http::{HeaderMap, StatusCode};
    use axum::routing::{get, post};

    use super::*;

    /// What the test server saw.
    #[derive(Default)]
    struct Seen {
        writes: AtomicU32,
        authorization: std::sync::Mutex<Vec<String>>,
    }

    /// `GET /ok`; `POST /write`; `GET /throttled` (429, `Retry-After: 1`);
    /// `GET /busy` (429 without one); `POST /token` (a new token each
    /// time); `GET /auth` (401 for the first token, 200 after).
    async fn server() -> (test_server::TestServer, Arc<Seen>) {
        let seen = Arc::new(Seen::default());
        let tokens = Arc::new(AtomicU32::new(0));
        let (w, a) = (seen.clone(), seen.clone());
        let app =
            Router::new()
                .route("/ok", get(|| async { "ok" }))
                .route(
                    "/write",
                    post(move || async move {
                        w.writes.fetch_add(1, Ordering::SeqCst);
                        "done"
                    }),
                )
                .route(
                    "/throttled",
                    get(|| async { (StatusCode::TOO_MANY_REQUESTS, [("retry-after", "1")], "") }),
                )
                .route("/busy", get(|| async { StatusCode::TOO_MANY_REQUESTS }))
                .route(
                    "/token",
                    post(move || async move {
                        format!("t{}", tokens.fetch_add(1, Ordering::SeqCst) + 1)
                    }),
                )
                .route(
                    "/auth",
                    get(move |h: HeaderMap| async move {
                        let v = h["authorization"].to_str().unwrap().to_string();
                        let first = v == "Bearer t1";
                        a.authorization.lock().unwrap().push(v);
                        if first {
                            StatusCode::UNAUTHORIZED
                        } else {
                            StatusCode::OK
                        }
                    }),
                );
        let l = test_server::Listener::bind().await.unwrap();
        (l.serve_axum(app, "kit-test"), seen)
    }

    /// The test cloud's answers: 2xx is its status, 401 permanent, 429
    /// throttled with its `Retry-After`.
    async fn read(resp: Response) -> Result<u16, CloudError> {
        let status = resp.status().as_u16();
        match status {
            200..=299 => Ok(status),
            401 => Err(CloudError::new(ErrorKind::Permanent, "401")),
            429 => Err(CloudError::throttled(
                "429",
                crate::retry_after_header(resp.headers()),
            )),
            _ => Err(CloudError::new(ErrorKind::Transient, status.to_string())),
        }
    }

    fn client(budget: Budget) -> Client {
        Client::new(
            "test",
            client_builder(Duration::from_secs(5)).build().unwrap(),
            budget,
        )
    }

    fn get_(c: &Client, url: String) -> Result<RequestBuilder, CloudError> {
        Ok(c.http().get(url))
    }

    #[tokio::test]
    async fn a_change_is_not_sent_through_a_closed_fence_but_a_read_is() {
        let (s, seen) = server().await;
        let mut c = client(Budget::Shared(TokenBucket::new(100.0, 10)));
        c.set_fence(Fence::new(false));
        let write = Call::new("write", "POST /write", &Method::POST);
        let e = c
            .send(
                write,
                &NoAuth,
                Ok(c.http().post(format!("{}/write", s.url()))),
                read,
            )
            .await
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Fenced, "{e}");
        assert_eq!(seen.writes.load(Ordering::SeqCst), 0, "not sent");
        let ok = Call::new("read", "GET /ok", &Method::GET);
        let r = c
            .send(ok, &NoAuth, get_(&c, format!("{}/ok", s.url())), read)
            .await;
        assert_eq!(r.unwrap(), 200);
        // A refused change was no request: only the read is counted.
        let counts = c.stats().snapshot();
        assert_eq!(
            counts.into_iter().collect::<Vec<_>>(),
            [(("read", "ok"), 1)]
        );
    }

    #[tokio::test]
    async fn a_throttling_answer_pauses_every_budget_for_its_retry_after() {
        let (s, _) = server().await;
        let c = client(Budget::Split {
            reads: TokenBucket::new(100.0, 10),
            writes: TokenBucket::new(100.0, 10),
        });
        let call = || Call::new("get", "GET", &Method::GET);
        let e = c
            .send(
                call(),
                &NoAuth,
                get_(&c, format!("{}/throttled", s.url())),
                read,
            )
            .await
            .unwrap_err();
        assert_eq!(
            (e.kind, e.retry_after),
            (ErrorKind::Throttled, Some(Duration::from_secs(1)))
        );
        assert!(c.stats().rate_limit_wait() < Duration::from_millis(100));
        let started = Instant::now();
        let write = Call::new("put", "POST", &Method::POST);
        c.send(
            write,
            &NoAuth,
            Ok(c.http().post(format!("{}/write", s.url()))),
            read,
        )
        .await
        .unwrap();
        assert!(
            started.elapsed() >= Duration::from_millis(900),
            "{:?}",
            started.elapsed()
        );
        assert!(c.stats().rate_limit_wait() >= Duration::from_millis(900));
        let counts = c.stats().snapshot();
        assert_eq!(counts[&("get", "throttled")], 1);
        assert_eq!(counts[&("put", "ok")], 1);
    }

    #[tokio::test]
    async fn a_throttling_answer_without_a_wait_pauses_for_the_default_or_not_at_all() {
        let (s, _) = server().await;
        for (pause, least) in [
            (None, Duration::ZERO),
            (Some(Duration::from_millis(400)), Duration::from_millis(350)),
        ] {
            let mut c = client(Budget::Shared(TokenBucket::new(100.0, 10)));
            if let Some(p) = pause {
                c = c.with_throttle_pause(p);
            }
            let call = || Call::new("get", "GET", &Method::GET);
            let e = c
                .send(call(), &NoAuth, get_(&c, format!("{}/busy", s.url())), read)
                .await
                .unwrap_err();
            assert_eq!((e.kind, e.retry_after), (ErrorKind::Throttled, None));
            c.send(call(), &NoAuth, get_(&c, format!("{}/ok", s.url())), read)
                .await
                .unwrap();
            assert!(c.stats().rate_limit_wait() >= least, "{pause:?}");
            if pause.is_none() {
                assert!(c.stats().rate_limit_wait() < Duration::from_millis(100));
            }
        }
    }

    /// Tokens from `POST /token`, each good for `lifetime`, dropped when a
    /// request is refused as permanent.
    struct Tokens {
        url: String,
        lifetime: Duration,
        cache: Renewing<Secret>,
        obtained: AtomicU32,
    }

    impl Auth for Tokens {
        type Credentials = Secret;

        async fn credentials(&self, client: &Client) -> Result<Secret, CloudError> {
            self.cache
                .get(|| async {
                    self.obtained.fetch_add(1, Ordering::SeqCst);
                    let call = Call::credentials("token", "token request", false);
                    let req = Ok(client.http().post(&self.url));
                    let t = client
                        .send(call, &NoAuth, req, |r: Response| async move {
                            r.text()
                                .await
                                .map_err(|e| transport_error("token", &e, false))
                        })
                        .await?;
                    Ok((Secret::new(t), Some(Instant::now() + self.lifetime)))
                })
                .await
        }

        fn apply(&self, token: &Secret, request: RequestBuilder) -> RequestBuilder {
            request.bearer_auth(token.expose())
        }

        async fn refused(&self, error: &CloudError) {
            if error.kind == ErrorKind::Permanent {
                self.cache.forget().await;
            }
        }
    }

    #[tokio::test]
    async fn credentials_are_obtained_once_renewed_when_due_and_dropped_when_refused() {
        let (s, seen) = server().await;
        let c = client(Budget::Shared(TokenBucket::new(100.0, 10)));
        let auth = Tokens {
            url: format!("{}/token", s.url()),
            lifetime: Duration::from_millis(300),
            cache: Renewing::default(),
            obtained: AtomicU32::new(0),
        };
        let call = || Call::new("get", "GET", &Method::GET);
        let url = format!("{}/auth", s.url());
        // t1 is refused: it is dropped, and t2 obtained for the next request.
        let e = c
            .send(call(), &auth, get_(&c, url.clone()), read)
            .await
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Permanent);
        c.send(call(), &auth, get_(&c, url.clone()), read)
            .await
            .unwrap();
        c.send(call(), &auth, get_(&c, url.clone()), read)
            .await
            .unwrap();
        assert_eq!(auth.obtained.load(Ordering::SeqCst), 2, "t2 is reused");
        tokio::time::sleep(Duration::from_millis(350)).await;
        c.send(call(), &auth, get_(&c, url.clone()), read)
            .await
            .unwrap();
        assert_eq!(auth.obtained.load(Ordering::SeqCst), 3, "renewed when due");
        assert_eq!(
            *seen.authorization.lock().unwrap(),
            ["Bearer t1", "Bearer t2", "Bearer t2", "Bearer t3"]
        );
        let counts = c.stats().snapshot();
        assert_eq!(counts[&("token", "ok")], 3, "exchanges are counted");
        assert_eq!(counts[&("get", "ok")], 3);
        assert_eq!(counts[&("get", "permanent")], 1);
    }

    #[tokio::test]
    async fn failures_before_an_answer_and_unbuilt_requests_are_counted() {
        let c = client(Budget::Shared(TokenBucket::new(100.0, 10)));
        // Nothing listens on port 1 of loopback.
        let call = Call::new("put", "PUT /x", &Method::PUT).uncertain();
        let e = c
            .send(
                call,
                &NoAuth,
                Ok(c.http().put("http://127.0.0.1:1/x")),
                read,
            )
            .await
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Transient, "nothing was sent: {e}");
        assert!(e.message.contains("PUT /x"), "{e}");
        let bad = Err(CloudError::new(ErrorKind::Permanent, "bad URL"));
        let e = c
            .send(Call::new("get", "GET", &Method::GET), &NoAuth, bad, read)
            .await
            .unwrap_err();
        assert_eq!(e.message, "bad URL");
        let counts = c.stats().snapshot();
        assert_eq!(counts[&("put", "transient")], 1);
        assert_eq!(counts[&("get", "permanent")], 1);
    }

    #[tokio::test]
    async fn token_headers_are_sent_only_when_there_is_a_token() {
        let c = client(Budget::Shared(TokenBucket::new(100.0, 10)));
        let t = Secret::new("abc");
        let with = TokenHeader {
            name: "x-auth-token",
            token: Some(&t),
        };
        let r = with.apply(&(), c.http().get("http://h/")).build().unwrap();
        assert_eq!(r.headers()["x-auth-token"], "abc");
        assert!(r.headers()["x-auth-token"].is_sensitive());
        let without = TokenHeader {
            name: "x-auth-token",
            token: None,
        };
        let r = without
            .apply(&(), c.http().get("http://h/"))
            .build()
            .unwrap();
        assert!(r.headers().get("x-auth-token").is_none());
        let r = Bearer(&t)
            .apply(&(), c.http().get("http://h/"))
            .build()
            .unwrap();
        assert_eq!(r.headers()["authorization"], "Bearer abc");
    }
}
