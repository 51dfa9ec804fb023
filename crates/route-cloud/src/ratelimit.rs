//! A client-side token bucket on tokio time.
//!
//! Providers put every request through one of these so that the controller
//! stays inside the cloud's documented budget on its own, instead of learning
//! about the budget from throttling answers. It reads only `tokio::time`, so a
//! paused test clock drives it.

use std::time::Duration;

use tokio::sync::Mutex;
use tokio::time::Instant;

use crate::{CloudError, Fence};

/// A token bucket: `burst` tokens, refilled at `per_second`.
#[derive(Debug)]
pub struct TokenBucket {
    state: Mutex<State>,
    rate_per_sec: f64,
    burst: f64,
}

#[derive(Debug)]
struct State {
    tokens: f64,
    updated: Instant,
    /// Set by [`TokenBucket::pause_until`] when the server said "wait".
    paused_until: Option<Instant>,
}

impl TokenBucket {
    /// A full bucket of `burst` tokens refilled at `per_second`.
    pub fn new(per_second: f64, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        Self {
            state: Mutex::new(State {
                tokens: burst,
                updated: Instant::now(),
                paused_until: None,
            }),
            rate_per_sec: per_second.max(f64::MIN_POSITIVE),
            burst,
        }
    }

    /// A budget of `requests` per `period` with the given burst.
    pub fn per_period(requests: u32, period: Duration, burst: u32) -> Self {
        Self::new(f64::from(requests) / period.as_secs_f64(), burst)
    }

    /// Waits until a token is available and takes it. Returns how long it waited.
    pub async fn acquire(&self) -> Duration {
        let start = Instant::now();
        loop {
            let wait = {
                let mut s = self.state.lock().await;
                let now = Instant::now();
                if let Some(until) = s.paused_until {
                    if now < until {
                        until - now
                    } else {
                        s.paused_until = None;
                        continue;
                    }
                } else {
                    let elapsed = now.saturating_duration_since(s.updated).as_secs_f64();
                    s.tokens = (s.tokens + elapsed * self.rate_per_sec).min(self.burst);
                    s.updated = now;
                    if s.tokens >= 1.0 {
                        s.tokens -= 1.0;
                        return start.elapsed();
                    }
                    Duration::from_secs_f64((1.0 - s.tokens) / self.rate_per_sec)
                }
            };
            tokio::time::sleep(wait).await;
        }
    }

    /// [`TokenBucket::acquire`] for a mutating request: gives up as soon as
    /// `fence` closes, and checks it once more after the wait, so a request
    /// that waited past its replica's renew deadline is never sent.
    pub async fn acquire_fenced(&self, fence: &Fence) -> Result<Duration, CloudError> {
        let waited = fence.guard(self.acquire()).await?;
        fence.check()?;
        Ok(waited)
    }

    /// Stops handing out tokens until `until` (a server's retry-after or
    /// rate-limit reset).
    pub async fn pause_until(&self, until: Instant) {
        let mut s = self.state.lock().await;
        if s.paused_until.is_none_or(|p| p < until) {
            s.paused_until = Some(until);
        }
    }

    /// Lowers the tokens to at most `remaining` (a server's own count of what is
    /// left), so a budget shared with other clients is respected.
    pub async fn clamp_remaining(&self, remaining: f64) {
        let mut s = self.state.lock().await;
        if remaining < s.tokens {
            s.tokens = remaining.max(0.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn burst_then_steady_rate() {
        let b = TokenBucket::new(1.0, 3);
        let t0 = Instant::now();
        for _ in 0..3 {
            b.acquire().await;
        }
        assert_eq!(t0.elapsed(), Duration::ZERO, "the burst is free");
        b.acquire().await;
        b.acquire().await;
        let e = t0.elapsed();
        assert!(
            e >= Duration::from_secs(2) && e < Duration::from_millis(2100),
            "{e:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn pause_blocks_until_deadline() {
        let b = TokenBucket::new(100.0, 10);
        b.pause_until(Instant::now() + Duration::from_secs(30))
            .await;
        let waited = b.acquire().await;
        assert!(waited >= Duration::from_secs(30), "{waited:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn fenced_acquire_paused_past_renew_deadline_returns_fenced_at_the_deadline() {
        let fence = Fence::leased(std::sync::Arc::new(crate::TokioClock::new()));
        fence.set_leader(true);
        fence.renewed(fence.mark(), Duration::from_secs(10));
        let b = TokenBucket::new(100.0, 10);
        b.pause_until(Instant::now() + Duration::from_secs(30))
            .await;
        let t0 = Instant::now();
        let e = b.acquire_fenced(&fence).await.unwrap_err();
        assert_eq!(e.kind, crate::ErrorKind::Fenced);
        assert_eq!(t0.elapsed(), Duration::from_secs(10));
    }

    #[tokio::test(start_paused = true)]
    async fn clamp_remaining_spends_the_shared_budget() {
        let b = TokenBucket::per_period(3600, Duration::from_secs(3600), 10);
        b.clamp_remaining(0.0).await;
        let waited = b.acquire().await;
        assert!(waited >= Duration::from_millis(999), "{waited:?}");
    }
}
