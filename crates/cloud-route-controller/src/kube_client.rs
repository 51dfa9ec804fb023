//! The Kubernetes client, with the client-side rate limit of
//! `--kube-api-qps` / `--kube-api-burst` (kube-rs has none of its own).

use std::sync::Arc;
use std::task::{Context, Poll};

use anyhow::Context as _;
use futures::future::BoxFuture;
use route_cloud::ratelimit::TokenBucket;
use tower::{Layer, Service};

use crate::cli::ClusterArgs;

/// Loads the configuration: --kubeconfig, else in-cluster, else $KUBECONFIG / ~/.kube/config.
pub async fn config(args: &ClusterArgs) -> anyhow::Result<kube::Config> {
    match &args.kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .with_context(|| format!("using kubeconfig {}", path.display()))
        }
        None => kube::Config::infer()
            .await
            .context("no --kubeconfig given, and neither in-cluster configuration nor $KUBECONFIG/~/.kube/config is usable"),
    }
}

/// A client limited to `qps` requests per second with `burst`.
pub async fn client(args: &ClusterArgs) -> anyhow::Result<kube::Client> {
    let cfg = config(args).await?;
    let bucket = Arc::new(TokenBucket::new(
        f64::from(args.kube_api_qps),
        args.kube_api_burst,
    ));
    let client = kube::client::ClientBuilder::try_from(cfg)
        .context("building the Kubernetes client")?
        .with_layer(&RateLimitLayer { bucket })
        .build();
    Ok(client)
}

#[derive(Clone)]
struct RateLimitLayer {
    bucket: Arc<TokenBucket>,
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimited<S>;
    fn layer(&self, inner: S) -> Self::Service {
        RateLimited {
            inner,
            bucket: self.bucket.clone(),
            pending: None,
            has_token: false,
        }
    }
}

/// Takes a token in `poll_ready`, so a request is only started once the
/// budget allows it and the inner service is ready.
struct RateLimited<S> {
    inner: S,
    bucket: Arc<TokenBucket>,
    pending: Option<BoxFuture<'static, ()>>,
    has_token: bool,
}

impl<S, R> Service<R> for RateLimited<S>
where
    S: Service<R>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        if !self.has_token {
            let bucket = self.bucket.clone();
            let fut = self.pending.get_or_insert_with(|| {
                Box::pin(async move {
                    bucket.acquire().await;
                })
            });
            if fut.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            self.pending = None;
            self.has_token = true;
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: R) -> Self::Future {
        self.has_token = false;
        Box::pin(self.inner.call(req))
    }
}
