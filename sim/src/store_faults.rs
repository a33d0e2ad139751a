//! The faults of a store reached over the network, in front of the
//! simulated store: transactions that fail before they reach it, replies
//! lost after a commit (the caller cannot know whether it committed),
//! replies delayed, and, driven by the test, broken watches and
//! compaction. Each transaction's fate is drawn from the seed in the
//! order transactions are made, which the runtime makes deterministic.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use metropolis_core::ports::{KvStore, MonotonicClock, Timer, WatchBatch};
use metropolis_core::store::{KeyRange, KeyValue, Revision, StoreError, Txn, TxnResponse};

use crate::rng::Rng;
use crate::runtime::Node;

/// How often each fault strikes.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StoreFaults {
    /// Probability that a transaction fails without reaching the store.
    pub fail: f64,
    /// Probability that a transaction commits but its reply is lost.
    pub lose_reply: f64,
    /// Replies (and failures) arrive after up to this long.
    pub max_delay: Duration,
}

/// What the faults did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultCounts {
    /// Transactions failed before the store.
    pub failed: u64,
    /// Transactions committed whose reply was lost.
    pub lost_replies: u64,
}

struct Shared {
    rng: Rng,
    faults: StoreFaults,
    counts: FaultCounts,
}

/// `inner` behind a network that fails as [`StoreFaults`] say; clones
/// share the faults and the seed.
#[derive(Clone)]
pub struct FaultyStore {
    inner: Arc<dyn KvStore>,
    /// The store's node: its timers delay the replies.
    store: Node,
    shared: Arc<Mutex<Shared>>,
}

/// The fate of one transaction.
enum Fate {
    Fail,
    LoseReply,
    Deliver,
}

impl FaultyStore {
    /// `inner` with `faults`, drawn from `seed`, delays on `store`'s
    /// clock.
    pub fn new(inner: Arc<dyn KvStore>, store: Node, seed: u64, faults: StoreFaults) -> Self {
        FaultyStore {
            inner,
            store,
            shared: Arc::new(Mutex::new(Shared {
                rng: Rng::new(seed),
                faults,
                counts: FaultCounts::default(),
            })),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Changes the faults (none: the network healed).
    pub fn set_faults(&self, faults: StoreFaults) {
        self.lock().faults = faults;
    }

    /// What the faults did so far.
    pub fn counts(&self) -> FaultCounts {
        self.lock().counts
    }

    /// This call's fate and delay.
    fn draw(&self) -> (Fate, Duration) {
        let mut s = self.lock();
        let faults = s.faults;
        let fate = if s.rng.chance(faults.fail) {
            s.counts.failed += 1;
            Fate::Fail
        } else if s.rng.chance(faults.lose_reply) {
            s.counts.lost_replies += 1;
            Fate::LoseReply
        } else {
            Fate::Deliver
        };
        let max = u64::try_from(faults.max_delay.as_micros()).unwrap_or(u64::MAX);
        let delay = Duration::from_micros(if max == 0 { 0 } else { s.rng.below(max) });
        (fate, delay)
    }

    /// Waits `delay` on the store's clock.
    fn delayed(&self, delay: Duration) -> BoxFuture<'static, ()> {
        if delay.is_zero() {
            return futures::future::ready(()).boxed();
        }
        self.store.sleep_until(self.store.now() + delay)
    }
}

impl KvStore for FaultyStore {
    fn txn(&self, txn: Txn) -> BoxFuture<'static, Result<TxnResponse, StoreError>> {
        let (fate, delay) = self.draw();
        let wait = self.delayed(delay);
        let sent = match fate {
            Fate::Fail => None,
            Fate::LoseReply | Fate::Deliver => Some(self.inner.txn(txn)),
        };
        async move {
            let result = match sent {
                None => Err(StoreError::Unavailable(
                    "simulated: the store is unreachable".into(),
                )),
                Some(sent) => sent.await,
            };
            wait.await;
            match fate {
                Fate::LoseReply => Err(StoreError::Unavailable(
                    "simulated: the connection broke before the reply".into(),
                )),
                _ => result,
            }
        }
        .boxed()
    }

    fn read_for_update(
        &self,
        range: KeyRange,
    ) -> BoxFuture<'static, Result<Vec<KeyValue>, StoreError>> {
        let (fate, delay) = self.draw();
        let wait = self.delayed(delay);
        let read = self.inner.read_for_update(range);
        async move {
            let result = read.await;
            wait.await;
            match fate {
                Fate::Deliver => result,
                _ => Err(StoreError::Unavailable(
                    "simulated: the store is unreachable".into(),
                )),
            }
        }
        .boxed()
    }

    fn applies_in_order(&self) -> bool {
        false
    }

    fn watch(
        &self,
        range: KeyRange,
        start_revision: Revision,
    ) -> BoxStream<'static, Result<WatchBatch, StoreError>> {
        self.inner.watch(range, start_revision)
    }
}
