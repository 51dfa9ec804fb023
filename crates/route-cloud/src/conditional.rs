//! The optimistic-concurrency write loop of the whole-resource writers.
//!
//! Some clouds take a list (Azure's route table, a Neutron router's routes,
//! a Neutron port's allowed address pairs) only as a whole, so a write must
//! not lose what another writer put there since the last read. Each of them
//! guards its write with the version it read (an ETag, a
//! `revision_number`) and refuses a stale one (`412`, classed
//! [`ErrorKind::Conflict`] by the provider). This module owns the loop
//! around that: read, compute the new whole resource from what was read,
//! write it under the version read, and on a conflict read again and
//! recompute, a bounded number of times. The providers own everything the
//! loop calls: the requests, what the new resource is, which answers mean
//! what, and their counters and log lines (through `on_retry`).

use std::future::Future;
use std::time::Duration;

use crate::{CloudError, ErrorKind};

/// How a [`write_conditionally`] ended without an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConditionalWrite<S, W> {
    /// The change asked for nothing to be written: the resource as last read.
    Unchanged(S),
    /// The write's own result.
    Written(W),
}

/// The pause before the `attempt`-th read after a conflict: short and
/// growing, so competing writers spread apart instead of colliding again.
pub fn conflict_pause(attempt: u32) -> Duration {
    Duration::from_millis(20 * u64::from(attempt))
}

/// Writes a whole resource under its version, re-reading after a conflict.
///
/// * `known`: a state and version the caller already holds (remembered
///   from its last answer), which saves the first `read`; `None` reads.
/// * `change` computes what to write from a state read; `Ok(None)` means
///   nothing to write, which ends the loop without a write. Its error ends
///   the loop (a resource this writer must not rewrite).
/// * `write` sends the new resource under the version it was computed
///   from. An [`ErrorKind::Conflict`] answer is retried while fewer than
///   `max_retries` retries were made: `on_retry(attempt)` (1-based) runs,
///   the loop pauses [`conflict_pause`], reads, and computes again. Any
///   other error, and the conflict past the bound, is returned as it is.
/// * An error of `read` is returned as it is.
pub async fn write_conditionally<S, V, N, W, RF, WF>(
    max_retries: u32,
    known: Option<(S, V)>,
    mut read: impl FnMut() -> RF,
    mut change: impl FnMut(&S) -> Result<Option<N>, CloudError>,
    mut write: impl FnMut(N, V) -> WF,
    mut on_retry: impl FnMut(u32),
) -> Result<ConditionalWrite<S, W>, CloudError>
where
    RF: Future<Output = Result<(S, V), CloudError>>,
    WF: Future<Output = Result<W, CloudError>>,
{
    let (mut state, mut version) = match known {
        Some(k) => k,
        None => read().await?,
    };
    let mut attempt = 0;
    loop {
        let Some(new) = change(&state)? else {
            return Ok(ConditionalWrite::Unchanged(state));
        };
        match write(new, version).await {
            Ok(w) => return Ok(ConditionalWrite::Written(w)),
            Err(e) if e.kind == ErrorKind::Conflict && attempt < max_retries => {
                attempt += 1;
                on_retry(attempt);
                tokio::time::sleep(conflict_pause(attempt)).await;
                (state, version) = read().await?;
            }
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::*;

    /// An in-memory resource with a version, refusing a stale one.
    #[derive(Debug, Default)]
    struct Store {
        value: Vec<u32>,
        version: u64,
        reads: u32,
        writes: u32,
        /// Writes another writer slips in before each of ours, one per write.
        interleaved: Vec<u32>,
    }

    impl Store {
        fn read(&mut self) -> (Vec<u32>, u64) {
            self.reads += 1;
            (self.value.clone(), self.version)
        }

        fn write(&mut self, value: Vec<u32>, version: u64) -> Result<u64, CloudError> {
            self.writes += 1;
            if !self.interleaved.is_empty() {
                let theirs = self.interleaved.remove(0);
                self.value.push(theirs);
                self.version += 1;
            }
            if version != self.version {
                return Err(CloudError::new(ErrorKind::Conflict, "412 stale version"));
            }
            self.value = value;
            self.version += 1;
            Ok(self.version)
        }
    }

    /// Adds `item` to the store's list under the loop, retrying up to
    /// `max_retries` times; returns the outcome and the retries seen.
    async fn add(
        store: &RefCell<Store>,
        max_retries: u32,
        item: u32,
    ) -> (
        Result<ConditionalWrite<Vec<u32>, u64>, CloudError>,
        Vec<u32>,
    ) {
        let mut retries = Vec::new();
        let out = write_conditionally(
            max_retries,
            None,
            || async { Ok(store.borrow_mut().read()) },
            |v: &Vec<u32>| {
                Ok((!v.contains(&item)).then(|| {
                    let mut v = v.clone();
                    v.push(item);
                    v
                }))
            },
            |v, version| async move { store.borrow_mut().write(v, version) },
            |attempt| retries.push(attempt),
        )
        .await;
        (out, retries)
    }

    #[tokio::test(start_paused = true)]
    async fn writes_once_when_nobody_else_writes() {
        let store = RefCell::new(Store::default());
        let (out, retries) = add(&store, 3, 7).await;
        assert_eq!(out, Ok(ConditionalWrite::Written(1)));
        assert!(retries.is_empty());
        let s = store.borrow();
        assert_eq!((s.reads, s.writes, s.value.clone()), (1, 1, vec![7]));
    }

    #[tokio::test(start_paused = true)]
    async fn reads_again_after_a_conflict_and_keeps_the_other_write() {
        let store = RefCell::new(Store {
            interleaved: vec![5],
            ..Store::default()
        });
        let started = tokio::time::Instant::now();
        let (out, retries) = add(&store, 3, 7).await;
        assert_eq!(out, Ok(ConditionalWrite::Written(2)));
        assert_eq!(retries, vec![1]);
        assert_eq!(started.elapsed(), conflict_pause(1));
        let s = store.borrow();
        assert_eq!((s.reads, s.writes, s.value.clone()), (2, 2, vec![5, 7]));
    }

    #[tokio::test(start_paused = true)]
    async fn gives_the_last_conflict_once_the_bound_is_reached() {
        let store = RefCell::new(Store {
            interleaved: vec![1, 2, 3, 4],
            ..Store::default()
        });
        let (out, retries) = add(&store, 2, 7).await;
        let e = out.expect_err("every write met a newer version");
        assert_eq!(e.kind, ErrorKind::Conflict);
        assert_eq!(retries, vec![1, 2]);
        let s = store.borrow();
        // One write and two retries, each retry after a fresh read.
        assert_eq!((s.reads, s.writes, s.value.clone()), (3, 3, vec![1, 2, 3]));
    }

    #[tokio::test(start_paused = true)]
    async fn zero_retries_gives_the_first_conflict() {
        let store = RefCell::new(Store {
            interleaved: vec![1],
            ..Store::default()
        });
        let (out, retries) = add(&store, 0, 7).await;
        assert_eq!(out.map_err(|e| e.kind), Err(ErrorKind::Conflict));
        assert!(retries.is_empty());
        assert_eq!(store.borrow().writes, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn nothing_to_write_sends_no_write() {
        let store = RefCell::new(Store {
            value: vec![7],
            version: 4,
            ..Store::default()
        });
        let (out, retries) = add(&store, 3, 7).await;
        assert_eq!(out, Ok(ConditionalWrite::Unchanged(vec![7])));
        assert!(retries.is_empty());
        assert_eq!((store.borrow().reads, store.borrow().writes), (1, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_known_version_saves_the_first_read() {
        let cell = RefCell::new(Store::default());
        let store = &cell;
        let out = write_conditionally(
            3,
            Some((Vec::new(), 0)),
            || async { Ok(store.borrow_mut().read()) },
            |v: &Vec<u32>| Ok(v.is_empty().then(|| vec![9])),
            |v, version| async move { store.borrow_mut().write(v, version) },
            |_| {},
        )
        .await;
        assert_eq!(out, Ok(ConditionalWrite::Written(1)));
        assert_eq!((store.borrow().reads, store.borrow().writes), (0, 1));
    }

    #[tokio::test(start_paused = true)]
    async fn errors_other_than_a_conflict_are_not_retried() {
        let mut writes = 0;
        let out: Result<ConditionalWrite<(), ()>, _> = write_conditionally(
            3,
            Some(((), ())),
            || async { Ok(((), ())) },
            |_| Ok(Some(())),
            |(), ()| {
                writes += 1;
                async { Err(CloudError::new(ErrorKind::QuotaExceeded, "full")) }
            },
            |_| {},
        )
        .await;
        assert_eq!(out.map_err(|e| e.kind), Err(ErrorKind::QuotaExceeded));
        assert_eq!(writes, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_refused_change_ends_the_loop_before_any_write() {
        let mut writes = 0;
        let out: Result<ConditionalWrite<(), ()>, _> = write_conditionally(
            3,
            Some(((), ())),
            || async { Ok(((), ())) },
            |_| -> Result<Option<()>, _> {
                Err(CloudError::new(ErrorKind::InvalidRequest, "malformed"))
            },
            |(), ()| {
                writes += 1;
                async { Ok(()) }
            },
            |_| {},
        )
        .await;
        assert_eq!(out.map_err(|e| e.kind), Err(ErrorKind::InvalidRequest));
        assert_eq!(writes, 0);
    }
}
