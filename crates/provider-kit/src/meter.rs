//! What every request of a provider passes on its way out, whatever sends
//! it: a token of the provider's budget, the [`Fence`] in front of every
//! change, and [`RequestStats`]. [`crate::Client::send`] stands on it, and
//! so do the providers that send through a cloud's official SDK (AWS, GCE),
//! which leave these three to the caller.

use std::future::Future;

use route_cloud::ratelimit::TokenBucket;
use route_cloud::{CloudError, Fence, RequestStats};

/// The budget wait, the fence and the counters of one provider.
#[derive(Debug, Default)]
pub struct Meter {
    stats: RequestStats,
    fence: Fence,
}

impl Meter {
    /// The counters of every request sent.
    pub fn stats(&self) -> &RequestStats {
        &self.stats
    }

    /// Replaces the fence every change passes; it is open until then.
    pub fn set_fence(&mut self, fence: Fence) {
        self.fence = fence;
    }

    /// Waits for a token of `bucket` and adds the wait to the stats. A
    /// `change` takes it through the fence: one that waited past this
    /// replica's renew deadline is refused with
    /// [`route_cloud::ErrorKind::Fenced`], neither sent nor counted.
    pub async fn take(&self, bucket: &TokenBucket, change: bool) -> Result<(), CloudError> {
        let waited = if change {
            bucket.acquire_fenced(&self.fence).await?
        } else {
            bucket.acquire().await
        };
        if !waited.is_zero() {
            self.stats.add_rate_limit_wait(waited);
        }
        Ok(())
    }

    /// Counts one request's answer under `op`: `ok`, or its error class.
    pub fn count<T>(&self, op: &'static str, answer: &Result<T, CloudError>) {
        self.stats.record(
            op,
            answer.as_ref().map_or_else(|e| e.kind.as_str(), |_| "ok"),
        );
    }

    /// One request of an SDK: [`Meter::take`], then `request` (a future
    /// that sends nothing before it is polled, as the SDKs' `send()` is),
    /// its error made a [`CloudError`] by `classify`, counted under `op`.
    /// What a throttling answer pauses is the caller's: each cloud says how
    /// long its budget needs.
    pub async fn call<T, E>(
        &self,
        op: &'static str,
        bucket: &TokenBucket,
        change: bool,
        request: impl Future<Output = Result<T, E>>,
        classify: impl FnOnce(E) -> CloudError,
    ) -> Result<T, CloudError> {
        self.take(bucket, change).await?;
        let answer = request.await.map_err(classify);
        self.count(op, &answer);
        answer
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use route_cloud::ErrorKind;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_change_is_not_sent_through_a_closed_fence_and_a_read_is_sent_and_counted() {
        let mut meter = Meter::default();
        meter.set_fence(Fence::new(false));
        let bucket = TokenBucket::new(10.0, 1);
        let mut sent = 0;
        let change = meter
            .call(
                "write",
                &bucket,
                true,
                async {
                    sent += 1;
                    Ok::<_, ()>(())
                },
                |()| CloudError::new(ErrorKind::Permanent, "no"),
            )
            .await;
        assert_eq!(change.unwrap_err().kind, ErrorKind::Fenced);
        assert_eq!(sent, 0, "nothing was sent past the fence");
        let read = meter
            .call(
                "read",
                &bucket,
                false,
                async { Err::<(), _>("busy") },
                |e| CloudError::new(ErrorKind::Throttled, e),
            )
            .await;
        assert_eq!(read.unwrap_err().kind, ErrorKind::Throttled);
        let counts = meter.stats().snapshot();
        assert_eq!(counts.get(&("read", "throttled")), Some(&1), "{counts:?}");
        assert_eq!(counts.get(&("write", "fenced")), None, "{counts:?}");
        assert_eq!(counts.len(), 1, "{counts:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn the_wait_for_a_token_is_added_to_the_stats() {
        let meter = Meter::default();
        let bucket = TokenBucket::new(1.0, 1);
        meter.take(&bucket, false).await.unwrap();
        assert_eq!(meter.stats().rate_limit_wait(), Duration::ZERO);
        meter.take(&bucket, false).await.unwrap();
        assert!(meter.stats().rate_limit_wait() >= Duration::from_millis(900));
    }
}
