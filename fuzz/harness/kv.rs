//! The [`KvStore`] port over the store model ([`MemStore`]) in memory,
//! with faults the harness switches on: failing transactions, lost
//! compare-and-swap races, broken watches, compaction.

use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

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
}

/// The store model as a [`KvStore`]; clones share the store.
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
    /// An empty store without faults.
    pub fn new() -> MemKv {
        MemKv {
            shared: Arc::new(Mutex::new(Shared {
                mem: MemStore::new(),
                fail_txns: 0,
                conflicts: 0,
                watch_epoch: 0,
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` on the store model.
    pub fn with<R>(&self, f: impl FnOnce(&mut MemStore) -> R) -> R {
        f(&mut self.lock().mem)
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
        self.lock().watch_epoch += 1;
    }

    /// Compacts the history up to the current revision.
    pub fn compact(&self) {
        let mut s = self.lock();
        let revision = s.mem.revision();
        // Fails only when already compacted there: nothing to do then.
        let _ = s.mem.compact(revision);
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
        Box::pin(futures::future::ready(result))
    }

    fn watch(
        &self,
        range: KeyRange,
        start_revision: Revision,
    ) -> BoxStream<'static, Result<WatchBatch, StoreError>> {
        let mut s = self.lock();
        let epoch = s.watch_epoch;
        let (id, pending) = match s.mem.watch(range, start_revision) {
            Ok(id) => (Some(id), None),
            Err(e) => (None, Some(e)),
        };
        Box::pin(MemWatch {
            kv: self.clone(),
            id,
            pending,
            epoch,
        })
    }
}

/// A watch of the model; polled, it takes what the model has pending.
struct MemWatch {
    kv: MemKv,
    id: Option<WatchId>,
    /// An error to yield before ending.
    pending: Option<StoreError>,
    epoch: u64,
}

impl MemWatch {
    fn end(&mut self, s: &mut Shared) {
        if let Some(id) = self.id.take() {
            s.mem.cancel_watch(id);
        }
    }
}

impl Stream for MemWatch {
    type Item = Result<WatchBatch, StoreError>;

    fn poll_next(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
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
        match s.mem.poll_watch(id) {
            Some(Ok(batch)) => Poll::Ready(Some(Ok(batch))),
            Some(Err(e)) => {
                this.end(&mut s);
                Poll::Ready(Some(Err(e)))
            }
            // The harness polls every task after each input, so no waker
            // is needed.
            None => Poll::Pending,
        }
    }
}

impl Drop for MemWatch {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            self.kv.lock().mem.cancel_watch(id);
        }
    }
}
