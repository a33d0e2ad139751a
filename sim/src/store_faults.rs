//! The faults of a store reached over the network, in front of the
//! simulated store, as etcd and the way to it fail:
//!
//! - drawn per request from the seed, in the order requests are made
//!   (which the runtime makes deterministic): a transaction that fails
//!   before it reaches the store; one that commits but whose reply is
//!   lost (the caller cannot know whether it committed); one answered
//!   after the client's [`REQUEST_TIMEOUT`], so the caller has given up
//!   (Unavailable) before the store commits it; replies delayed; and,
//!   drawn per watch batch, a watcher falling behind (the batch, and so
//!   every one after it, arrives late, as from etcd's slow watchers);
//! - driven by the test: the member **paused** ([`FaultyStore::pause`]:
//!   requests, watch batches and lease renewals wait until it resumes,
//!   callers give up after the timeout while what they sent is still
//!   carried out at the resume; leases do not expire while it is paused,
//!   and those whose time ran out expire when it resumes) and the member
//!   **down** ([`FaultyStore::go_down`]: requests refused, new watches
//!   end at once, renewals unanswered, leases kept; the test breaks the
//!   watches when it goes down and extends every lease when it comes
//!   back, as a restarted etcd does); broken watches and compaction (on
//!   the store model itself).
//!
//! One caller's view ([`FaultyStore::reached_from`]) also crosses the
//! [links](crate::links) between its node and the store's: a request
//! that cannot arrive fails after [`LINK_TIMEOUT`] without reaching the
//! store; one whose answer cannot come back is carried out and fails
//! after the timeout (a commit the caller cannot know of); a watch's
//! batch that cannot come back (or comes from a paused member) is held
//! until the link heals (then it arrives late, as TCP retransmits it), or
//! for [`LINK_TIMEOUT`], after which the watch ends Unavailable, as the
//! etcd client's keepalive would end it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::channel::oneshot;
use futures::future::{BoxFuture, Either};
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};
use metropolis_core::ports::{KvStore, MonotonicClock, Timer, WatchBatch};
use metropolis_core::store::{KeyRange, KeyValue, Revision, StoreError, Txn, TxnResponse};
use metropolis_core::time::Instant;

use crate::links::{LINK_TIMEOUT, Links};
use crate::rng::Rng;
use crate::runtime::{Node, NodeId};

/// How long the store's client waits for an answer before it gives up
/// (the daemon's `--etcd-request-timeout`, shortened for the simulation).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// How often a held watch batch looks whether it may go.
const HELD_BATCH_CHECK: Duration = Duration::from_millis(50);

/// How often each drawn fault strikes.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StoreFaults {
    /// Probability that a transaction fails without reaching the store.
    pub fail: f64,
    /// Probability that a transaction commits but its reply is lost.
    pub lose_reply: f64,
    /// Probability that a transaction is carried out only after the
    /// caller gave up (up to a second past [`REQUEST_TIMEOUT`]).
    pub late: f64,
    /// Replies (and failures) arrive after up to this long.
    pub max_delay: Duration,
    /// Probability that a watch batch arrives late (the watcher falls
    /// behind the store: the batches after it wait too).
    pub lag: f64,
    /// A late batch arrives after up to this long.
    pub max_lag: Duration,
}

/// What the faults did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultCounts {
    /// Transactions failed before the store.
    pub failed: u64,
    /// Transactions committed whose reply was lost.
    pub lost_replies: u64,
    /// Transactions carried out after their caller gave up.
    pub late: u64,
    /// Pauses of the member.
    pub pauses: u64,
    /// Times the member went down.
    pub downs: u64,
    /// Watch batches that arrived late.
    pub lagged: u64,
}

struct Shared {
    rng: Rng,
    faults: StoreFaults,
    counts: FaultCounts,
    /// The member is paused until then.
    paused_until: Option<Instant>,
    /// The member is down.
    down: bool,
}

/// `inner` behind a network that fails as [`StoreFaults`] say; clones
/// share the faults, the seed and the member's state.
#[derive(Clone)]
pub struct FaultyStore {
    inner: Arc<dyn KvStore>,
    /// The store's node: its timers delay the replies and its tasks
    /// carry out what outlives its caller.
    store: Node,
    shared: Arc<Mutex<Shared>>,
    /// The caller's node and the store's, and the links between them.
    route: Option<(NodeId, NodeId, Links)>,
}

/// The fate of one request.
#[derive(Clone, Copy, PartialEq)]
enum Fate {
    /// Fails without reaching the store, after the delay.
    Fail,
    /// Carried out; the reply is lost (after the delay).
    LoseReply,
    /// Carried out when the delay ends; answered if that is within the
    /// caller's timeout, else the caller gives up first.
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
                paused_until: None,
                down: false,
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

    fn lock(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Changes the drawn faults (none: the network healed).
    pub fn set_faults(&self, faults: StoreFaults) {
        self.lock().faults = faults;
    }

    /// What the faults did so far.
    pub fn counts(&self) -> FaultCounts {
        self.lock().counts
    }

    /// Pauses the member for `span` of the store's clock.
    pub fn pause(&self, span: Duration) {
        let until = self.store.now() + span;
        let mut s = self.lock();
        s.paused_until = Some(s.paused_until.map_or(until, |u| u.max(until)));
        s.counts.pauses += 1;
    }

    /// The member goes down (`true`) or comes back (`false`).
    pub fn go_down(&self, down: bool) {
        let mut s = self.lock();
        if down && !s.down {
            s.counts.downs += 1;
        }
        s.down = down;
    }

    /// Whether the member runs now (neither down nor paused): leases
    /// expire and renew only then.
    pub fn running(&self) -> bool {
        let now = self.store.now();
        let s = self.lock();
        !s.down && s.paused_until.is_none_or(|u| now >= u)
    }

    /// A handle answering [`FaultyStore::running`].
    pub fn running_fn(&self) -> Arc<dyn Fn() -> bool + Send + Sync> {
        let this = self.clone();
        Arc::new(move || this.running())
    }

    /// Whether what the store sends reaches the caller now.
    fn answers_arrive(&self) -> bool {
        self.route
            .as_ref()
            .is_none_or(|(caller, store, links)| links.up(*store, *caller))
    }

    /// How late the next watch batch arrives (zero: on time).
    fn draw_lag(&self) -> Duration {
        let mut s = self.lock();
        let faults = s.faults;
        if faults.lag <= 0.0 || !s.rng.chance(faults.lag) {
            return Duration::ZERO;
        }
        s.counts.lagged += 1;
        s.rng.duration_below(faults.max_lag)
    }

    /// This request's fate and the delay until it is carried out (or
    /// fails).
    fn draw(&self, is_txn: bool) -> (Fate, Duration) {
        let now = self.store.now();
        let mut s = self.lock();
        if s.down {
            return (Fate::Fail, Duration::from_millis(1));
        }
        let faults = s.faults;
        let mut delay = s.rng.duration_below(faults.max_delay);
        let mut fate = if s.rng.chance(faults.fail) {
            s.counts.failed += 1;
            Fate::Fail
        } else if is_txn && s.rng.chance(faults.lose_reply) {
            s.counts.lost_replies += 1;
            Fate::LoseReply
        } else if is_txn && s.rng.chance(faults.late) {
            s.counts.late += 1;
            delay = REQUEST_TIMEOUT + Duration::from_micros(s.rng.below(1_000_000));
            Fate::Deliver
        } else {
            Fate::Deliver
        };
        if fate != Fate::Fail
            && let Some(until) = s.paused_until.filter(|&u| u > now)
        {
            delay = delay.max(until - now);
        }
        drop(s);
        if let Some((caller, store, links)) = &self.route {
            if !links.up(*caller, *store) {
                (fate, delay) = (Fate::Fail, LINK_TIMEOUT);
            } else if !links.up(*store, *caller) && fate != Fate::Fail {
                fate = Fate::LoseReply;
                delay = delay.max(LINK_TIMEOUT);
            }
        }
        (fate, delay)
    }

    /// Carries out `request` on the store's node after `delay`, whoever
    /// still waits for it; the caller gets its answer if it comes within
    /// [`REQUEST_TIMEOUT`] and `fate` lets it through, else Unavailable.
    fn carry<T: Send + 'static>(
        &self,
        fate: Fate,
        delay: Duration,
        request: impl FnOnce() -> BoxFuture<'static, Result<T, StoreError>> + Send + 'static,
    ) -> BoxFuture<'static, Result<T, StoreError>> {
        let store = self.store.clone();
        let start = store.now();
        let answer = if fate == Fate::Fail {
            None
        } else {
            let (tx, rx) = oneshot::channel();
            let carrier = store.clone();
            store.spawn(async move {
                carrier.sleep_until(start + delay).await;
                let _ = tx.send(request().await);
            });
            Some(rx)
        };
        async move {
            let unavailable = |why: &str| Err(StoreError::Unavailable(format!("simulated: {why}")));
            let Some(answer) = answer else {
                store.sleep_until(start + delay).await;
                return unavailable("the store is unreachable");
            };
            let timeout = store.sleep_until(start + REQUEST_TIMEOUT);
            let result = match futures::future::select(answer, timeout).await {
                Either::Left((Ok(result), _)) => result,
                Either::Left((Err(_), _)) => return unavailable("the store dropped the request"),
                Either::Right(((), _)) => {
                    return unavailable("no answer within the request timeout");
                }
            };
            if fate == Fate::LoseReply {
                return unavailable("the connection broke before the reply");
            }
            result
        }
        .boxed()
    }
}

impl KvStore for FaultyStore {
    fn txn(&self, txn: Txn) -> BoxFuture<'static, Result<TxnResponse, StoreError>> {
        let (fate, delay) = self.draw(true);
        let inner = self.inner.clone();
        self.carry(fate, delay, move || inner.txn(txn))
    }

    fn read_for_update(
        &self,
        range: KeyRange,
    ) -> BoxFuture<'static, Result<Vec<KeyValue>, StoreError>> {
        let (fate, delay) = self.draw(false);
        let inner = self.inner.clone();
        self.carry(fate, delay, move || inner.read_for_update(range))
    }

    fn applies_in_order(&self) -> bool {
        false
    }

    fn watch(
        &self,
        range: KeyRange,
        start_revision: Revision,
    ) -> BoxStream<'static, Result<WatchBatch, StoreError>> {
        if self.lock().down {
            let refused = StoreError::Unavailable("simulated: the store is down".into());
            return futures::stream::once(async move { Err(refused) }).boxed();
        }
        let inner = self.inner.watch(range, start_revision);
        let (this, clock) = (self.clone(), self.store.clone());
        futures::stream::unfold(Some(inner), move |inner| {
            let (this, clock) = (this.clone(), clock.clone());
            async move {
                let mut inner = inner?;
                let next = inner.next().await?;
                let lag = this.draw_lag();
                if !lag.is_zero() {
                    clock.sleep_until(clock.now() + lag).await;
                }
                let deadline = clock.now() + LINK_TIMEOUT;
                while !(this.running() && this.answers_arrive()) {
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
