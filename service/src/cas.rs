//! Read-modify-write of one key by compare-and-swap, the way every record
//! update of the services is done: correct across instances, no
//! process-local lock deciding what is written.
//!
//! Over a remote store (etcd: [`KvStore::applies_in_order`] false),
//! updates of one key from this process also queue behind each other
//! ([`UpdateQueues`]): concurrent updates of a key would otherwise race,
//! one win per round and every other attempt a wasted transaction (over
//! etcd, 16 callers on one key spent 16 transactions per update). Queued,
//! each update starts from the value the previous one wrote, so it needs
//! neither a read first nor a second attempt unless another writer (another
//! instance, a deletion) got in between, which its compare-and-swap still
//! catches. A key's queue lives while updates of it are in flight; after
//! the last, what it wrote is kept (bounded, see [`UpdateQueues`]) for the
//! next update of the key, which then needs no read either: one
//! transaction per update in the common case, as a client of etcd that
//! knows the revision it wrote would send. The embedded store applies
//! writes in order in memory before their group commit, so there
//! concurrent updates of a key go at once and share one commit, each
//! reading what the one before it applied: queueing them behind each
//! other's commit would cost a commit per update of the key.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use futures::lock::Mutex as AsyncMutex;
use tonic::Status;

use metropolis_core::ports::KvStore;
use metropolis_core::store::{
    CmpOp, Compare, CompareTarget, KeyRange, KeyValue, Op, OpResult, Txn,
};

/// How often an update retries after losing a compare-and-swap race before
/// giving up with Aborted.
pub(crate) const MAX_CAS_ATTEMPTS: usize = 256;

/// What an update of a key left for the next one queued behind it: the
/// key as that update wrote it (None: read it first).
type Slot = Arc<AsyncMutex<Option<KeyValue>>>;

/// Bytes of keys and values [`Recent`] holds at most.
const RECENT_BYTES: usize = 16 << 20;
/// Keys [`Recent`] holds at most.
const RECENT_KEYS: usize = 65_536;

/// The queues of the keys updated in this process, one per key while
/// updates of it are in flight, and the keys as this process last wrote
/// them (see the [module](self)). Cloning shares them; each service keeps
/// one for the records it updates.
#[derive(Clone, Default)]
pub(crate) struct UpdateQueues {
    inner: Arc<Mutex<Queues>>,
}

#[derive(Default)]
struct Queues {
    slots: HashMap<Bytes, Slot>,
    recent: Recent,
}

/// Keys as this process last wrote them, for the next update of a key
/// with no update in flight, so that it needs no read first: at most
/// [`RECENT_KEYS`] keys and [`RECENT_BYTES`], the oldest written dropped
/// first. A value another writer replaced since costs that update one
/// failed compare-and-swap, whose failure branch reads the current value.
#[derive(Default)]
struct Recent {
    /// Each key's value and the stamp of its entry in `order`.
    values: HashMap<Bytes, (KeyValue, u64)>,
    /// Keys in the order they were written; entries whose stamp is not
    /// their key's in `values` are stale.
    order: VecDeque<(Bytes, u64)>,
    bytes: usize,
    stamp: u64,
}

fn size(kv: &KeyValue) -> usize {
    kv.key.len() + kv.value.len()
}

impl Recent {
    fn take(&mut self, key: &Bytes) -> Option<KeyValue> {
        let (kv, _) = self.values.remove(key)?;
        self.bytes -= size(&kv);
        Some(kv)
    }

    fn put(&mut self, kv: KeyValue) {
        if size(&kv) > RECENT_BYTES {
            return;
        }
        self.stamp += 1;
        self.bytes += size(&kv);
        self.order.push_back((kv.key.clone(), self.stamp));
        if let Some((old, _)) = self.values.insert(kv.key.clone(), (kv, self.stamp)) {
            self.bytes -= size(&old);
        }
        while self.bytes > RECENT_BYTES || self.values.len() > RECENT_KEYS {
            let Some((key, stamp)) = self.order.pop_front() else {
                break;
            };
            if self.values.get(&key).is_some_and(|(_, s)| *s == stamp) {
                self.take(&key);
            }
        }
        if self.order.len() > 2 * self.values.len() + 64 {
            let values = &self.values;
            self.order
                .retain(|(key, stamp)| values.get(key).is_some_and(|(_, s)| s == stamp));
        }
    }
}

/// A place in a key's queue; leaving it as the last one removes the queue
/// and keeps what was written in [`Recent`] (also when the update's future
/// is dropped).
struct InQueue<'a> {
    queues: &'a UpdateQueues,
    key: Bytes,
    slot: Slot,
}

impl UpdateQueues {
    fn lock(&self) -> std::sync::MutexGuard<'_, Queues> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn join(&self, key: &Bytes) -> InQueue<'_> {
        let slot = self.lock().slots.entry(key.clone()).or_default().clone();
        InQueue {
            queues: self,
            key: key.clone(),
            slot,
        }
    }

    /// The key as this process last wrote it, if kept.
    fn recent(&self, key: &Bytes) -> Option<KeyValue> {
        self.lock().recent.take(key)
    }

    /// Keys with updates in flight, and keys kept as last written (for
    /// tests).
    #[cfg(test)]
    fn len(&self) -> (usize, usize) {
        let queues = self.lock();
        (queues.slots.len(), queues.recent.values.len())
    }
}

impl Drop for InQueue<'_> {
    fn drop(&mut self) {
        let mut queues = self.queues.lock();
        // The map's reference and ours: nobody else waits, so the slot's
        // lock is free.
        if Arc::strong_count(&self.slot) == 2 {
            queues.slots.remove(&self.key);
            let written = self.slot.try_lock().and_then(|mut last| last.take());
            if let Some(kv) = written {
                queues.recent.put(kv);
            }
        }
    }
}

/// Computes the new value of `key` with `change` and writes it with a
/// compare-and-swap on the key's modification revision, after the updates
/// of `key` queued before it in `queues`. It starts from the value the
/// previous update from this process wrote, or reads the key when that is
/// not known. On
/// a conflict the failed transaction reads the current value, and `change`
/// runs again on it; `change` refusing a value it did not read itself also
/// makes it read and try again. `what` names the record in errors ("node
/// X"), formatted only for an error; a missing key is NotFound.
pub(crate) async fn update<T>(
    store: &dyn KvStore,
    queues: &UpdateQueues,
    key: Bytes,
    what: impl Fn() -> String,
    change: impl FnMut(&KeyValue) -> Result<(Bytes, T), Status>,
) -> Result<T, Status> {
    if store.applies_in_order() {
        // Concurrent updates share the store's commit; each reads what the
        // one before it applied. Nothing to queue or keep.
        return Box::pin(update_from(store, key, what, change, None))
            .await
            .0;
    }
    let place = queues.join(&key);
    let mut last = place.slot.lock().await;
    let known = last.take().or_else(|| queues.recent(&key));
    // Boxed, here and above: the loop's state would otherwise push every
    // call's future past the allocator's fast path (service/tests/call_size.rs).
    let (result, written) = Box::pin(update_from(store, key, what, change, known)).await;
    *last = written;
    drop(last);
    drop(place);
    result
}

/// The compare-and-swap loop of [`update`], from `known` (unverified: as
/// the previous update wrote it) or a fresh read. Returns the outcome and
/// the key as this update wrote it.
async fn update_from<T>(
    store: &dyn KvStore,
    key: Bytes,
    what: impl Fn() -> String,
    mut change: impl FnMut(&KeyValue) -> Result<(Bytes, T), Status>,
    known: Option<KeyValue>,
) -> (Result<T, Status>, Option<KeyValue>) {
    let read = || async {
        store
            .read_for_update(KeyRange::Key(key.clone()))
            .await
            .map(|mut kvs| kvs.pop())
            .map_err(crate::status::store)
    };
    let mut verified = known.is_none();
    let mut current = match known {
        Some(kv) => Some(kv),
        None => match read().await {
            Ok(kv) => kv,
            Err(e) => return (Err(e), None),
        },
    };
    for _ in 0..MAX_CAS_ATTEMPTS {
        let Some(kv) = current else {
            return (
                Err(Status::not_found(format!("{} not found", what()))),
                None,
            );
        };
        let (value, out) = match change(&kv) {
            Ok(changed) => changed,
            Err(e) if verified => return (Err(e), None),
            Err(_) => {
                // Refused on what an earlier update wrote: decide on what
                // the store holds now.
                verified = true;
                current = match read().await {
                    Ok(kv) => kv,
                    Err(e) => return (Err(e), None),
                };
                continue;
            }
        };
        let txn = Txn {
            compares: vec![Compare {
                key: key.clone(),
                op: CmpOp::Equal,
                target: CompareTarget::ModRevision(kv.mod_revision),
            }],
            success: vec![Op::Put {
                key: key.clone(),
                value: value.clone(),
                lease: 0,
            }],
            failure: vec![Op::Range(KeyRange::Key(key.clone()))],
        };
        let mut response = match store.txn(txn).await {
            Ok(response) => response,
            Err(e) => return (Err(crate::status::store(e)), None),
        };
        if response.succeeded {
            // The put's revision is the transaction's.
            let written = KeyValue {
                value,
                mod_revision: response.revision,
                version: kv.version + 1,
                lease: 0,
                ..kv
            };
            return (Ok(out), Some(written));
        }
        verified = true;
        current = match response.results.pop() {
            Some(OpResult::Range(mut kvs)) => kvs.pop(),
            _ => {
                return (
                    Err(Status::internal("store returned no range result")),
                    None,
                );
            }
        };
    }
    (
        Err(Status::aborted(format!(
            "{}: {MAX_CAS_ATTEMPTS} concurrent modifications in a row; request can be retried",
            what()
        ))),
        None,
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Poll;

    use futures::future::BoxFuture;
    use futures::stream::BoxStream;

    use super::*;
    use metropolis_core::ports::WatchBatch;
    use metropolis_core::store::{MemStore, Revision, StoreError, TxnResponse};

    /// The store model behind the port, each call yielding once before it
    /// answers (so that concurrent updates overlap), counting calls.
    #[derive(Clone, Default)]
    struct Counted(Arc<Counts>);

    #[derive(Default)]
    struct Counts {
        store: Mutex<MemStore>,
        txns: AtomicUsize,
        reads: AtomicUsize,
    }

    impl std::ops::Deref for Counted {
        type Target = Counts;

        fn deref(&self) -> &Counts {
            &self.0
        }
    }

    /// Pending once, then ready.
    async fn yield_once() {
        let mut yielded = false;
        futures::future::poll_fn(|cx| {
            if yielded {
                Poll::Ready(())
            } else {
                yielded = true;
                cx.waker().wake_by_ref();
                Poll::Pending
            }
        })
        .await
    }

    impl KvStore for Counted {
        fn txn(&self, txn: Txn) -> BoxFuture<'static, Result<TxnResponse, StoreError>> {
            let this = self.clone();
            Box::pin(async move {
                yield_once().await;
                this.txns.fetch_add(1, Ordering::Relaxed);
                this.store.lock().unwrap().txn(&txn)
            })
        }

        fn read_for_update(
            &self,
            range: KeyRange,
        ) -> BoxFuture<'static, Result<Vec<KeyValue>, StoreError>> {
            let this = self.clone();
            Box::pin(async move {
                yield_once().await;
                this.reads.fetch_add(1, Ordering::Relaxed);
                Ok(this.store.lock().unwrap().range(&range))
            })
        }

        fn watch(
            &self,
            _: KeyRange,
            _: Revision,
        ) -> BoxStream<'static, Result<WatchBatch, StoreError>> {
            Box::pin(futures::stream::empty())
        }
    }

    fn put(store: &Counted, key: &Bytes, value: &str) {
        let txn = Txn {
            success: vec![Op::Put {
                key: key.clone(),
                value: Bytes::copy_from_slice(value.as_bytes()),
                lease: 0,
            }],
            ..Txn::default()
        };
        store.store.lock().unwrap().txn(&txn).unwrap();
    }

    fn value(store: &Counted) -> String {
        let kv = store.store.lock().unwrap().get(b"k").cloned().unwrap();
        String::from_utf8(kv.value.to_vec()).unwrap()
    }

    /// Appends `c` to the value.
    fn append(c: char) -> impl FnMut(&KeyValue) -> Result<(Bytes, ()), Status> {
        move |kv| {
            let mut v = String::from_utf8(kv.value.to_vec()).unwrap();
            v.push(c);
            Ok((Bytes::from(v), ()))
        }
    }

    #[test]
    fn concurrent_updates_of_a_key_queue_instead_of_racing() {
        let store = Counted::default();
        let key = Bytes::from_static(b"k");
        put(&store, &key, "");
        let queues = UpdateQueues::default();
        let updates =
            ('a'..='p').map(|c| update(&store, &queues, key.clone(), || "k".into(), append(c)));
        let results = futures::executor::block_on(futures::future::join_all(updates));
        assert!(results.iter().all(Result::is_ok), "{results:?}");
        // Every change applied once, in queue order; one read, no lost race.
        assert_eq!(value(&store), "abcdefghijklmnop");
        assert_eq!(store.reads.load(Ordering::Relaxed), 1);
        assert_eq!(store.txns.load(Ordering::Relaxed), 16);
        assert_eq!(queues.len(), (0, 1), "the queue goes with its last update");
        // The next update starts from what the last one wrote: no read.
        let next = update(&store, &queues, key.clone(), || "k".into(), append('q'));
        futures::executor::block_on(next).unwrap();
        assert_eq!(value(&store), "abcdefghijklmnopq");
        assert_eq!(store.reads.load(Ordering::Relaxed), 1);
        assert_eq!(store.txns.load(Ordering::Relaxed), 17);
    }

    #[test]
    fn another_writer_between_queued_updates_is_caught_by_the_compare() {
        let store = Counted::default();
        let key = Bytes::from_static(b"k");
        put(&store, &key, "x");
        let queues = UpdateQueues::default();
        let first = update(&store, &queues, key.clone(), || "k".into(), append('a'));
        // Queued behind the first; by the time it runs, another writer
        // (another instance) replaced the value.
        let outsider = store.clone();
        let second = update(&store, &queues, key.clone(), || "k".into(), {
            let mut once = Some(());
            let mut inner = append('b');
            move |kv| {
                if once.take().is_some() {
                    put(&outsider, &Bytes::from_static(b"k"), "y");
                }
                inner(kv)
            }
        });
        let (a, b) = futures::executor::block_on(futures::future::join(first, second));
        assert!(a.is_ok() && b.is_ok());
        assert_eq!(
            value(&store),
            "yb",
            "the second update ran again on the outsider's value"
        );
    }

    #[test]
    fn a_refusal_of_a_queued_value_is_decided_on_a_fresh_read() {
        let store = Counted::default();
        let key = Bytes::from_static(b"k");
        put(&store, &key, "");
        let queues = UpdateQueues::default();
        let first = update(&store, &queues, key.clone(), || "k".into(), append('a'));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let second = update(&store, &queues, key.clone(), || "k".into(), {
            let (store, seen) = (store.clone(), seen.clone());
            move |kv: &KeyValue| {
                seen.lock().unwrap().push(kv.value.clone());
                if seen.lock().unwrap().len() == 1 {
                    // Refuses the value the first update wrote, after an
                    // outsider changed the key.
                    put(&store, &Bytes::from_static(b"k"), "ok");
                    return Err(Status::failed_precondition("not yet"));
                }
                Ok((kv.value.clone(), ()))
            }
        });
        let (a, b) = futures::executor::block_on(futures::future::join(first, second));
        assert!(a.is_ok());
        assert!(b.is_ok(), "{b:?}");
        assert_eq!(
            *seen.lock().unwrap(),
            vec![Bytes::from_static(b"a"), Bytes::from_static(b"ok")]
        );
    }

    #[test]
    fn a_missing_key_is_not_found_and_leaves_no_queue() {
        let store = Counted::default();
        let queues = UpdateQueues::default();
        let key = Bytes::from_static(b"k");
        let r =
            futures::executor::block_on(update(&store, &queues, key, || "k".into(), append('a')));
        assert_eq!(r.unwrap_err().code(), tonic::Code::NotFound);
        assert_eq!(queues.len(), (0, 0));
    }

    #[test]
    fn a_kept_value_another_writer_replaced_costs_one_failed_compare() {
        let store = Counted::default();
        let key = Bytes::from_static(b"k");
        put(&store, &key, "");
        let queues = UpdateQueues::default();
        let run = |c| {
            futures::executor::block_on(update(
                &store,
                &queues,
                key.clone(),
                || "k".into(),
                append(c),
            ))
        };
        run('a').unwrap();
        put(&store, &key, "z");
        run('b').unwrap();
        assert_eq!(value(&store), "zb");
        // One read (the first update), three transactions (a, b's lost
        // compare, b).
        assert_eq!(store.reads.load(Ordering::Relaxed), 1);
        assert_eq!(store.txns.load(Ordering::Relaxed), 3);
        // Deleted meanwhile: NotFound, and nothing is kept.
        store
            .store
            .lock()
            .unwrap()
            .txn(&Txn {
                success: vec![Op::Delete(KeyRange::Key(key.clone()))],
                ..Txn::default()
            })
            .unwrap();
        assert_eq!(run('c').unwrap_err().code(), tonic::Code::NotFound);
        assert_eq!(queues.len(), (0, 0));
    }

    fn kv(key: String, value_len: usize) -> KeyValue {
        KeyValue {
            key: Bytes::from(key),
            value: Bytes::from(vec![0u8; value_len]),
            create_revision: 1,
            mod_revision: 1,
            version: 1,
            lease: 0,
        }
    }

    #[test]
    fn what_is_kept_is_bounded_in_keys_and_bytes_oldest_first() {
        let mut recent = Recent::default();
        for i in 0..RECENT_KEYS + 10 {
            recent.put(kv(format!("k{i}"), 0));
        }
        assert_eq!(recent.values.len(), RECENT_KEYS);
        assert!(
            recent.take(&Bytes::from("k0")).is_none(),
            "the oldest went first"
        );
        assert!(
            recent
                .take(&Bytes::from(format!("k{}", RECENT_KEYS + 9)))
                .is_some()
        );

        let mut recent = Recent::default();
        for i in 0..20 {
            recent.put(kv(format!("big{i}"), 1 << 20));
        }
        assert!(recent.bytes <= RECENT_BYTES);
        assert!(recent.values.len() < 20);
        // One key written again and again: its order entries do not pile up.
        for _ in 0..10_000 {
            recent.put(kv("same".into(), 1));
            recent.take(&Bytes::from("same"));
            recent.put(kv("same".into(), 1));
        }
        assert!(recent.order.len() <= 2 * recent.values.len() + 64);
        // A value larger than the whole budget is not kept.
        recent.put(kv("huge".into(), RECENT_BYTES + 1));
        assert!(recent.take(&Bytes::from("huge")).is_none());
    }

    /// The embedded store's case: updates are not queued (each reads what
    /// the one before it applied), and nothing is kept.
    struct InOrder(Counted);

    impl KvStore for InOrder {
        fn txn(&self, txn: Txn) -> BoxFuture<'static, Result<TxnResponse, StoreError>> {
            self.0.txn(txn)
        }

        fn read_for_update(
            &self,
            range: KeyRange,
        ) -> BoxFuture<'static, Result<Vec<KeyValue>, StoreError>> {
            self.0.read_for_update(range)
        }

        fn applies_in_order(&self) -> bool {
            true
        }

        fn watch(
            &self,
            range: KeyRange,
            start: Revision,
        ) -> BoxStream<'static, Result<WatchBatch, StoreError>> {
            self.0.watch(range, start)
        }
    }

    #[test]
    fn over_a_store_that_applies_in_order_updates_are_not_queued() {
        let counted = Counted::default();
        let key = Bytes::from_static(b"k");
        put(&counted, &key, "");
        let store = InOrder(counted.clone());
        let queues = UpdateQueues::default();
        let run = |c| update(&store, &queues, key.clone(), || "k".into(), append(c));
        futures::executor::block_on(futures::future::join(run('a'), run('b')))
            .0
            .unwrap();
        futures::executor::block_on(run('c')).unwrap();
        assert_eq!(
            counted.reads.load(Ordering::Relaxed),
            3,
            "every update reads"
        );
        assert_eq!(queues.len(), (0, 0));
    }
}
