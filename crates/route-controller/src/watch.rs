//! The Kubernetes edge of the node side: a kube-runtime watcher on Nodes
//! feeding the [`NodeStore`].
//!
//! Events are converted to [`crate::nodes::NodeView`]s as they arrive, so the
//! process never holds whole Node objects (images, managedFields, volumes).
//! Relists, 410 Gone and reconnects are the watcher's job; its backoff keeps
//! retrying, and every completed relist reaches the store as `InitDone`, which
//! triggers a reconcile that catches deletions missed during a gap.

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::runtime::{WatchStreamExt, watcher};
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::nodes::{NodeEvent, NodeStore, node_view_selected};
use crate::select::NodeSelector;

/// Watches all Nodes until `shutdown`; never returns early on API errors.
/// Every Node is watched, those outside `selector` too: their addresses
/// tell whose a route is.
pub async fn watch_nodes(
    client: kube::Client,
    store: Arc<NodeStore>,
    selector: NodeSelector,
    shutdown: CancellationToken,
) {
    let api: Api<Node> = Api::all(client);
    // resourceVersion=0 lists are served from the API server's watch cache,
    // as client-go informers do; the cache is as fresh as any watch.
    let cfg = watcher::Config::default().any_semantic();
    let stream = watcher(api, cfg).default_backoff();
    futures::pin_mut!(stream);
    loop {
        let next = tokio::select! {
            n = stream.next() => n,
            _ = shutdown.cancelled() => return,
        };
        match next {
            Some(Ok(ev)) => store.apply(convert(ev, &selector)),
            Some(Err(e)) => warn!(error = %e, "node watch error; the watcher retries with backoff"),
            None => return,
        }
    }
}

fn convert(ev: watcher::Event<Node>, selector: &NodeSelector) -> NodeEvent {
    let view = |n: &Node| node_view_selected(n, selector);
    match ev {
        watcher::Event::Init => NodeEvent::Init,
        watcher::Event::InitApply(n) => NodeEvent::InitApply(view(&n)),
        watcher::Event::InitDone => NodeEvent::InitDone,
        watcher::Event::Apply(n) => NodeEvent::Apply(view(&n)),
        watcher::Event::Delete(n) => NodeEvent::Delete(view(&n)),
    }
}
