//! The store model ([`MemStore`]) in memory as the [`KvStore`] port:
//! [`MemKv`], with the faults a test switches on (failing transactions,
//! lost compare-and-swap races, broken watches, compaction) and watches
//! that lag behind the store as much as the test wants
//! ([`MemKv::lagging`]).
//!
//! Transactions complete at once. A watch delivers what the model has
//! pending for it when polled, and wakes its task after every change to
//! the store, so it works under any executor; the test kit's own
//! ([`Tasks`](crate::exec::Tasks)) polls every task anyway.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use futures::Stream;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use metropolis_core::ports::{KvStore, WatchBatch};
use metropolis_core::store::{
    KeyRange, MemStore, Op, Revision, StoreError, Txn, TxnResponse, WatchId,
};

struct Shared {
    mem: MemStore,
    /// Transactions still to fail with Unavailable.
    fail_txns: u32,
    /// Compare-and-swap transactions still to lose their race: right
    /// before each, every compared key that exists is rewritten.
    conflicts: u32,
    /// Bumped to make every open watch fail with Unavailable.
    watch_epoch: u64,
    /// Lagging watches deliver nothing past this revision (`None`: they
    /// follow the store).
    watch_limit: Option<Revision>,
    /// The wakers of the open watches that found nothing pending, by the
    /// watch's number.
    wakers: BTreeMap<u64, Waker>,
    next_watch: u64,
}

impl Shared {
    /// Wakes every watch waiting for a change.
    fn changed(&mut self) {
        for (_, waker) in std::mem::take(&mut self.wakers) {
            waker.wake();
        }
    }
}

/// The store model as a [`KvStore`]; clones share the store.
///
/// Without faults it answers as the embedded store would, at once. The
/// knobs ([`fail_next`](Self::fail_next), [`conflict_next`](Self::conflict_next),
/// [`break_watches`](Self::break_watches), [`compact`](Self::compact),
/// [`lagging`](Self::lagging)) are for the fuzz harnesses and tests of the
/// service layer's error paths; [`with`](Self::with) reaches the model
/// itself, and [`put`](Self::put), [`get`](Self::get) and
/// [`delete`](Self::delete) are shorthands for what tests write behind the
/// services' backs.
#[derive(Clone)]
pub struct MemKv {
    shared: Arc<Mutex<Shared>>,
}

impl Default for MemKv {
    fn default() -> Self {
        MemKv::new()
    }
}

impl MemKv {
    /// An empty store without faults, whose watches follow it.
    pub fn new() -> MemKv {
        MemKv {
            shared: Arc::new(Mutex::new(Shared {
                mem: MemStore::new(),
                fail_txns: 0,
                conflicts: 0,
                watch_epoch: 0,
                watch_limit: None,
                wakers: BTreeMap::new(),
                next_watch: 0,
            })),
        }
    }

    /// An empty store whose watches lag: they deliver no event past the
    /// revision last given to [`catch_up`](Self::catch_up) (none before
    /// the first call), so a test decides when a watcher sees a write.
    pub fn lagging() -> MemKv {
        let kv = MemKv::new();
        kv.lock().watch_limit = Some(0);
        kv
    }

    fn lock(&self) -> MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` on the store model (then wakes the watches: `f` may have
    /// written).
    pub fn with<R>(&self, f: impl FnOnce(&mut MemStore) -> R) -> R {
        let mut s = self.lock();
        let result = f(&mut s.mem);
        s.changed();
        result
    }

    /// The store's current revision.
    pub fn revision(&self) -> Revision {
        self.lock().mem.revision()
    }

    /// Writes `value` at `key` (no lease) in the model, bypassing the
    /// faults; returns the revision of the write.
    pub fn put(&self, key: impl AsRef<[u8]>, value: impl AsRef<[u8]>) -> Revision {
        let txn = Txn {
            success: vec![Op::Put {
                key: Bytes::copy_from_slice(key.as_ref()),
                value: Bytes::copy_from_slice(value.as_ref()),
                lease: 0,
            }],
            ..Default::default()
        };
        self.with(|m| m.txn(&txn))
            .expect("an unconditional put commits")
            .revision
    }

    /// The value at `key`, if any.
    pub fn get(&self, key: impl AsRef<[u8]>) -> Option<Bytes> {
        self.lock().mem.get(key.as_ref()).map(|kv| kv.value.clone())
    }

    /// Deletes `key` in the model, bypassing the faults.
    pub fn delete(&self, key: impl AsRef<[u8]>) {
        let txn = Txn {
            success: vec![Op::Delete(KeyRange::Key(Bytes::copy_from_slice(
                key.as_ref(),
            )))],
            ..Default::default()
        };
        self.with(|m| m.txn(&txn))
            .expect("an unconditional delete commits");
    }

    /// The next `n` transactions fail with Unavailable.
    pub fn fail_next(&self, n: u32) {
        self.lock().fail_txns = n;
    }

    /// The next `n` compare-and-swap transactions lose their race.
    pub fn conflict_next(&self, n: u32) {
        self.lock().conflicts = n;
    }

    /// Whether a fault is still armed.
    pub fn faults_armed(&self) -> bool {
        let s = self.lock();
        s.fail_txns > 0 || s.conflicts > 0
    }

    /// Every open watch fails with Unavailable at its next poll.
    pub fn break_watches(&self) {
        let mut s = self.lock();
        s.watch_epoch += 1;
        s.changed();
    }

    /// Compacts the history up to the current revision.
    pub fn compact(&self) {
        let mut s = self.lock();
        let revision = s.mem.revision();
        // Fails only when already compacted there: nothing to do then.
        let _ = s.mem.compact(revision);
        s.changed();
    }

    /// Lets the watches of a [`lagging`](Self::lagging) store deliver
    /// every event up to `revision` (never less than they already may).
    /// Does nothing to a store whose watches follow it.
    pub fn catch_up(&self, revision: Revision) {
        let mut s = self.lock();
        if let Some(limit) = &mut s.watch_limit {
            *limit = (*limit).max(revision);
            s.changed();
        }
    }
}

impl KvStore for MemKv {
    fn txn(&self, txn: Txn) -> BoxFuture<'static, Result<TxnResponse, StoreError>> {
        let mut s = self.lock();
        if s.fail_txns > 0 {
            s.fail_txns -= 1;
            return Box::pin(futures::future::ready(Err(StoreError::Unavailable(
                "injected store failure".into(),
            ))));
        }
        if s.conflicts > 0 && !txn.compares.is_empty() {
            s.conflicts -= 1;
            for c in &txn.compares {
                if let Some(kv) = s.mem.get(&c.key).cloned() {
                    let rewrite = Txn {
                        success: vec![Op::Put {
                            key: kv.key,
                            value: kv.value,
                            lease: kv.lease,
                        }],
                        ..Default::default()
                    };
                    s.mem.txn(&rewrite).expect("rewriting an existing key");
                }
            }
        }
        let result = s.mem.txn(&txn);
        s.changed();
        Box::pin(futures::future::ready(result))
    }

    fn watch(
        &self,
        range: KeyRange,
        start_revision: Revision,
    ) -> BoxStream<'static, Result<WatchBatch, StoreError>> {
        let mut s = self.lock();
        let epoch = s.watch_epoch;
        let number = s.next_watch;
        s.next_watch += 1;
        let (id, pending) = match s.mem.watch(range, start_revision) {
            Ok(id) => (Some(id), None),
            Err(e) => (None, Some(e)),
        };
        Box::pin(MemWatch {
            kv: self.clone(),
            number,
            id,
            pending,
            epoch,
        })
    }
}

/// A watch of the model; polled, it takes what the model has pending (up
/// to the lagging limit).
struct MemWatch {
    kv: MemKv,
    /// Its number, for its waker.
    number: u64,
    id: Option<WatchId>,
    /// An error to yield before ending.
    pending: Option<StoreError>,
    epoch: u64,
}

impl MemWatch {
    fn end(&mut self, s: &mut Shared) {
        s.wakers.remove(&self.number);
        if let Some(id) = self.id.take() {
            s.mem.cancel_watch(id);
        }
    }
}

impl Stream for MemWatch {
    type Item = Result<WatchBatch, StoreError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if let Some(e) = this.pending.take() {
            return Poll::Ready(Some(Err(e)));
        }
        let Some(id) = this.id else {
            return Poll::Ready(None);
        };
        let kv = this.kv.clone();
        let mut s = kv.lock();
        if s.watch_epoch != this.epoch {
            this.end(&mut s);
            return Poll::Ready(Some(Err(StoreError::Unavailable(
                "injected watch failure".into(),
            ))));
        }
        let polled = match s.watch_limit {
            None => s.mem.poll_watch(id),
            Some(limit) => s.mem.poll_watch_up_to(id, limit),
        };
        match polled {
            Some(Ok(batch)) => Poll::Ready(Some(Ok(batch))),
            Some(Err(e)) => {
                this.end(&mut s);
                Poll::Ready(Some(Err(e)))
            }
            None => {
                s.wakers.insert(this.number, cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

impl Drop for MemWatch {
    fn drop(&mut self) {
        let kv = self.kv.clone();
        self.end(&mut kv.lock());
    }
}
