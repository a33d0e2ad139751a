//! The faults of a store reached over the network, in front of the
//! simulated store: transactions that fail before they reach it, replies
//! lost after a commit (the caller cannot know whether it committed),
//! replies delayed, and, driven by the test, broken watches and
//! compaction. Each transaction's fate is drawn from the seed in the
//! order transactions are made, which the runtime makes deterministic.
//!
//! One caller's view ([`FaultyStore::reached_from`]) also crosses the
//! [links](crate::links) between its node and the store's: a request
//! that cannot arrive fails after [`LINK_TIMEOUT`] without reaching the
//! store; one whose answer cannot come back is carried out and fails
//! after the timeout (a commit the caller cannot know of); a watch's
//! batch that cannot come back is held until the link heals (then it
//! arrives late, as TCP retransmits it), or for [`LINK_TIMEOUT`], after
//! which the watch ends Unavailable, as the etcd client's keepalive would
//! end it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};
use metropolis_core::ports::{KvStore, MonotonicClock, Timer, WatchBatch};
use metropolis_core::store::{KeyRange, KeyValue, Revision, StoreError, Txn, TxnResponse};

use crate::links::{LINK_TIMEOUT, Links};
use crate::rng::Rng;
use crate::runtime::{Node, NodeId};

/// How often a watch batch held by a cut link looks whether it healed.
const HELD_BATCH_CHECK: Duration = Duration::from_millis(50);

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
    /// The caller's node and the store's, and the links between them.
    route: Option<(NodeId, NodeId, Links)>,
}

/// Where a request crossing the links goes.
#[derive(Clone, Copy, PartialEq)]
enum Crossing {
    /// Both ways up (or no links).
    Open,
    /// The request cannot reach the store.
    RequestLost,
    /// The store's answer cannot come back.
    AnswerLost,
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
            route: None,
        }
    }

    /// The store as node `caller` reaches it: across the links between
    /// `caller` and node `store` (the faults and their seed shared).
    pub fn reached_from(&self, caller: NodeId, store: NodeId, links: Links) -> FaultyStore {
        FaultyStore {
            route: Some((caller, store, links)),
            ..self.clone()
        }
    }

    fn crossing(&self) -> Crossing {
        match &self.route {
            Some((caller, store, links)) if !links.up(*caller, *store) => Crossing::RequestLost,
            Some((caller, store, links)) if !links.up(*store, *caller) => Crossing::AnswerLost,
            _ => Crossing::Open,
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
        let crossing = self.crossing();
        let (mut fate, mut delay) = self.draw();
        match crossing {
            Crossing::Open => {}
            Crossing::RequestLost => (fate, delay) = (Fate::Fail, LINK_TIMEOUT),
            Crossing::AnswerLost => (fate, delay) = (Fate::LoseReply, LINK_TIMEOUT),
        }
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
        let (mut fate, mut delay) = self.draw();
        if self.crossing() != Crossing::Open {
            (fate, delay) = (Fate::Fail, LINK_TIMEOUT);
        }
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
        let inner = self.inner.watch(range, start_revision);
        let Some((caller, store, links)) = self.route.clone() else {
            return inner;
        };
        let clock = self.store.clone();
        futures::stream::unfold(Some(inner), move |inner| {
            let (links, clock) = (links.clone(), clock.clone());
            async move {
                let mut inner = inner?;
                let next = inner.next().await?;
                let deadline = clock.now() + LINK_TIMEOUT;
                while !links.up(store, caller) {
                    if clock.now() >= deadline {
                        let broke = StoreError::Unavailable(
                            "simulated: the store's watch stopped answering".into(),
                        );
                        return Some((Err(broke), None));
                    }
                    clock.sleep_until(clock.now() + HELD_BATCH_CHECK).await;
                }
                Some((next, Some(inner)))
            }
        })
        .boxed()
    }
}
