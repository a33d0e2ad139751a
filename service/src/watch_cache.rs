//! The shared watch cache: one upstream store watch feeds every `Watch`
//! stream of the process.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use futures::future::{AbortHandle, Abortable};
use futures::{FutureExt, Stream, StreamExt};
use prost::Message;
use tonic::Status;

use super::forward::LeaderTerm;
use super::metrics::{Metrics, WatchMetrics};
use metropolis_core::curator::{NODES_PREFIX, cached_node, id_from_key};
use metropolis_core::identity::Identity;
use metropolis_core::ports::{KvStore, Spawner};
use metropolis_core::store::{EventKind, KeyRange, Op, OpResult, Revision, StoreError, Txn};
use metropolis_core::watch::{MAX_EVENT_BYTES, NodeCache, NodeChange, NodeWatch, NodesWatch};

/// Tunables of the watch cache.
#[derive(Clone, Debug)]
pub struct WatchCacheOptions {
    /// Largest encoded event sent on a stream.
    pub max_event_bytes: usize,
}

impl Default for WatchCacheOptions {
    fn default() -> Self {
        WatchCacheOptions {
            max_event_bytes: MAX_EVENT_BYTES,
        }
    }
}

enum Machine {
    Nodes(NodesWatch),
    Node(NodeWatch),
}

struct Slot {
    machine: Machine,
    waker: Option<Waker>,
    end: Option<Status>,
    /// The stream says nothing until the cache has caught up with this
    /// revision: the last node write acknowledged through this process
    /// when the stream opened (so a client sees its own writes).
    after: Revision,
    /// The node that opened the stream, when a node did: the stream ends
    /// with Unauthenticated once the cache no longer holds it.
    member: Option<Arc<str>>,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum State {
    /// No driver runs; the next subscription starts one.
    Idle,
    /// A driver is reading the initial snapshot.
    Loading,
    /// The cache follows the store.
    Ready,
}

struct Shared {
    cache: NodeCache,
    state: State,
    /// Incremented whenever the current driver is abandoned, so that a
    /// stale driver stops at its next step.
    generation: u64,
    streams: BTreeMap<u64, Slot>,
    next_stream: u64,
    /// The revision of the last write to nodes acknowledged through
    /// [`WatchCache::track_writes`].
    written: Revision,
    /// The latest leadership term a stream was opened in: the running
    /// driver read (or is reading) its snapshot in this term, so once
    /// [`State::Ready`] the cache holds every write committed before the
    /// term began.
    term: u64,
    /// Stops the running driver (it may be waiting on a store watch that
    /// stays silent).
    driver: Option<AbortHandle>,
    /// Where streams, events and coalesced changes are counted.
    metrics: Option<WatchMetrics>,
}

impl Shared {
    fn feed(&mut self, change: &NodeChange) {
        for slot in self.streams.values_mut() {
            let (relevant, coalesced) = match &mut slot.machine {
                Machine::Nodes(m) => (true, m.handle_change(change)),
                Machine::Node(m) => {
                    let relevant = m.node_id() == change.id().as_ref();
                    (relevant, m.handle_change(change))
                }
            };
            if coalesced && let Some(metrics) = &self.metrics {
                metrics.coalesced();
            }
            let member_gone = matches!(change, NodeChange::Delete { id, .. }
                if slot.member.as_deref() == Some(id.as_ref()));
            if (relevant || member_gone)
                && let Some(w) = slot.waker.take()
            {
                w.wake();
            }
        }
    }

    fn wake_all(&mut self) {
        for slot in self.streams.values_mut() {
            if let Some(w) = slot.waker.take() {
                w.wake();
            }
        }
    }

    /// Abandons the running driver, if any: it stops at once, and the next
    /// one starts from a fresh snapshot.
    fn abandon_driver(&mut self) {
        self.generation += 1;
        if let Some(driver) = self.driver.take() {
            driver.abort();
        }
    }

    /// Unregisters stream `id`.
    fn remove(&mut self, id: u64) {
        self.streams.remove(&id);
        if let Some(metrics) = &self.metrics {
            metrics.set_streams(self.streams.len());
        }
    }

    fn end_all(&mut self, status: &Status) {
        for slot in self.streams.values_mut() {
            slot.end = Some(status.clone());
        }
        self.wake_all();
    }
}

/// One cache of every node, kept up to date by a single store watch, and
/// the registry of open `Watch` streams fed from it.
///
/// Each store event is decoded and encoded once (into a
/// [`CachedNode`](metropolis_core::watch::CachedNode)); streams share those bytes.
/// If the store compacts past the cache's revision, the cache re-reads a
/// snapshot and feeds streams the difference, so no stream misses a delete
/// and none sees an error. If the store fails, every open stream ends with
/// Unavailable, and the next subscription starts afresh.
///
/// Under an elected leader, a stream is opened in the leadership term its
/// call was routed in ([`LeaderTerm`]). The first stream of a newer term
/// than the cache's snapshot makes the cache read a fresh snapshot (and
/// feed open streams the difference), and every stream says nothing until
/// it has: the cache may have been following the store since an earlier
/// term, behind the writes another leader acknowledged in between, while
/// the read-your-writes gate covers only this process's own writes.
#[derive(Clone)]
pub struct WatchCache {
    shared: Arc<Mutex<Shared>>,
    store: Arc<dyn KvStore>,
    spawner: Arc<dyn Spawner>,
    options: WatchCacheOptions,
}

fn lock(shared: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    // A panic while holding the lock leaves the machines consistent (every
    // mutation is a single step), so a poisoned lock is still usable.
    shared.lock().unwrap_or_else(|e| e.into_inner())
}

impl WatchCache {
    /// A cache over `store`; its driver is spawned on first use.
    pub fn new(
        store: Arc<dyn KvStore>,
        spawner: Arc<dyn Spawner>,
        options: WatchCacheOptions,
    ) -> Self {
        let shared = Shared {
            cache: NodeCache::new(),
            state: State::Idle,
            generation: 0,
            streams: BTreeMap::new(),
            next_stream: 0,
            written: 0,
            term: 0,
            driver: None,
            metrics: None,
        };
        WatchCache {
            shared: Arc::new(Mutex::new(shared)),
            store,
            spawner,
            options,
        }
    }

    /// Counts the open streams, the events and bytes they send and the
    /// changes coalesced for slow readers in `metrics`.
    pub fn with_metrics(self, metrics: &Metrics) -> Self {
        lock(&self.shared).metrics = Some(metrics.watch.clone());
        self
    }

    /// Opens a `NodesInCluster` stream.
    pub fn watch_nodes(&self) -> WatchStream {
        self.watch_nodes_as(&Identity::Owner, LeaderTerm::FIXED)
    }

    /// Opens a `NodeInCluster` stream for node `id`.
    pub fn watch_node(&self, id: &str) -> WatchStream {
        self.watch_node_as(id, &Identity::Owner, LeaderTerm::FIXED)
    }

    /// Opens a `NodesInCluster` stream for `caller`, in leadership term
    /// `term` (see the type's documentation). A node's stream ends
    /// with Unauthenticated as soon as the cache no longer holds that node
    /// (it was removed, or never was a member): a removed node's
    /// certificate stops working for streams it opened before.
    pub fn watch_nodes_as(&self, caller: &Identity, term: LeaderTerm) -> WatchStream {
        let machine = Machine::Nodes(NodesWatch::new(self.options.max_event_bytes));
        self.subscribe(member_of(caller), term, |_| machine)
    }

    /// Opens a `NodeInCluster` stream for node `id` on behalf of `caller`,
    /// in leadership term `term` (a node's stream ends as
    /// [`watch_nodes_as`](Self::watch_nodes_as) says).
    pub fn watch_node_as(&self, id: &str, caller: &Identity, term: LeaderTerm) -> WatchStream {
        let id: Arc<str> = Arc::from(id);
        self.subscribe(member_of(caller), term, |cache| {
            Machine::Node(NodeWatch::new(id, cache))
        })
    }

    /// Number of open streams.
    pub fn stream_count(&self) -> usize {
        lock(&self.shared).streams.len()
    }

    /// Ends every open stream with `status` (shutdown, loss of
    /// leadership) and stops following the store until the next
    /// subscription.
    pub fn close_all(&self, status: Status) {
        let mut shared = lock(&self.shared);
        shared.abandon_driver();
        shared.state = State::Idle;
        shared.cache = NodeCache::new();
        shared.end_all(&status);
    }

    fn subscribe(
        &self,
        member: Option<Arc<str>>,
        LeaderTerm(term): LeaderTerm,
        make: impl FnOnce(&NodeCache) -> Machine,
    ) -> WatchStream {
        let mut shared = lock(&self.shared);
        let id = shared.next_stream;
        shared.next_stream += 1;
        let machine = make(&shared.cache);
        let after = shared.written;
        shared.streams.insert(
            id,
            Slot {
                machine,
                waker: None,
                end: None,
                after,
                member,
            },
        );
        if let Some(metrics) = &shared.metrics {
            metrics.set_streams(shared.streams.len());
        }
        // A newer term than the running driver's: it may be behind writes
        // acknowledged by the leaders before this term, so a new driver
        // reads a fresh snapshot (open streams wait, then get the
        // difference).
        if term > shared.term {
            shared.term = term;
            if shared.state != State::Idle {
                shared.abandon_driver();
                shared.state = State::Idle;
            }
        }
        if shared.state == State::Idle {
            shared.state = State::Loading;
            let generation = shared.generation;
            let (abort, registration) = AbortHandle::new_pair();
            shared.driver = Some(abort);
            let driver = drive(self.shared.clone(), self.store.clone(), generation);
            self.spawner
                .spawn(Box::pin(Abortable::new(driver, registration).map(|_| ())));
        }
        WatchStream {
            shared: self.shared.clone(),
            id,
        }
    }
}

/// The node whose membership a stream opened by `caller` depends on.
fn member_of(caller: &Identity) -> Option<Arc<str>> {
    match caller {
        Identity::Node(id) => Some(Arc::from(id.as_str())),
        _ => None,
    }
}

/// The status that ends the streams of a node that is not a member.
pub(crate) fn not_a_member(id: &str) -> Status {
    Status::unauthenticated(format!(
        "node {id} is not a member of the cluster (removed, or never added): \
         its certificate is no longer accepted"
    ))
}

fn to_change(event: &metropolis_core::store::Event) -> Option<NodeChange> {
    match event.kind {
        EventKind::Put => match cached_node(&event.kv) {
            Ok(node) => Some(NodeChange::Put(node)),
            Err(e) => {
                tracing::error!(error = %e, "skipping unreadable node record");
                None
            }
        },
        EventKind::Delete => {
            if crate::canary_planted!(DropTombstones) {
                return None;
            }
            let id = id_from_key(&event.kv.key)?;
            Some(NodeChange::Delete {
                id: Arc::from(id),
                revision: event.kv.mod_revision,
            })
        }
    }
}

impl WatchCache {
    /// `store`, with every acknowledged transaction that changed a node
    /// noted: a `Watch` opened afterwards says nothing until the cache has
    /// caught up with it, so that a client reading after its own write
    /// (through this process, e.g. the leader) sees it. Give the services
    /// this store for their writes.
    pub fn track_writes(&self, store: Arc<dyn KvStore>) -> Arc<dyn KvStore> {
        Arc::new(TrackedStore {
            inner: store,
            shared: self.shared.clone(),
        })
    }
}

/// See [`WatchCache::track_writes`].
struct TrackedStore {
    inner: Arc<dyn KvStore>,
    shared: Arc<Mutex<Shared>>,
}

/// Which operations of a branch may change a node: whether one puts a
/// node key, and the positions of its deletes (whose results say whether
/// they removed a node: a delete of nothing makes no event the cache could
/// wait for).
#[derive(Default)]
struct NodeWrites {
    puts: bool,
    deletes: Vec<usize>,
}

impl NodeWrites {
    fn of(ops: &[Op]) -> NodeWrites {
        let mut w = NodeWrites::default();
        for (i, op) in ops.iter().enumerate() {
            match op {
                Op::Put { key, .. } => w.puts |= key.starts_with(NODES_PREFIX),
                Op::Delete(_) => w.deletes.push(i),
                Op::Range(_) => {}
            }
        }
        w
    }

    fn changed(&self, results: &[OpResult]) -> bool {
        self.puts
            || self.deletes.iter().any(|&i| {
                matches!(results.get(i), Some(OpResult::Delete(deleted))
                    if deleted.iter().any(|kv| kv.key.starts_with(NODES_PREFIX)))
            })
    }
}

impl KvStore for TrackedStore {
    fn txn(
        &self,
        txn: Txn,
    ) -> futures::future::BoxFuture<'static, Result<metropolis_core::store::TxnResponse, StoreError>>
    {
        let success = NodeWrites::of(&txn.success);
        let failure = NodeWrites::of(&txn.failure);
        let reads_only = !success.puts
            && success.deletes.is_empty()
            && !failure.puts
            && failure.deletes.is_empty();
        let sent = self.inner.txn(txn);
        if reads_only {
            return sent;
        }
        let shared = self.shared.clone();
        Box::pin(async move {
            let response = sent.await?;
            let branch = if response.succeeded {
                &success
            } else {
                &failure
            };
            if crate::canary_planted!(SkipReadYourWrites) {
                return Ok(response);
            }
            if branch.changed(&response.results) {
                let mut s = lock(&shared);
                s.written = s.written.max(response.revision);
            }
            Ok(response)
        })
    }

    fn read_for_update(
        &self,
        range: KeyRange,
    ) -> futures::future::BoxFuture<
        'static,
        Result<Vec<metropolis_core::store::KeyValue>, StoreError>,
    > {
        self.inner.read_for_update(range)
    }

    fn applies_in_order(&self) -> bool {
        self.inner.applies_in_order()
    }

    fn watch(
        &self,
        range: KeyRange,
        start_revision: Revision,
    ) -> futures::stream::BoxStream<'static, Result<metropolis_core::ports::WatchBatch, StoreError>>
    {
        self.inner.watch(range, start_revision)
    }
}

/// Follows the store: snapshot, then watch from just after it; on
/// compaction, snapshot again.
async fn drive(shared: Arc<Mutex<Shared>>, store: Arc<dyn KvStore>, generation: u64) {
    let range = KeyRange::Prefix(bytes::Bytes::from_static(NODES_PREFIX));
    let stale = |s: &Shared| s.generation != generation;
    loop {
        let snapshot = store
            .txn(Txn {
                success: vec![Op::Range(range.clone())],
                ..Default::default()
            })
            .await;
        let (revision, kvs) = match snapshot {
            Ok(mut r) => match r.results.pop() {
                Some(OpResult::Range(kvs)) => (r.revision, kvs),
                _ => return fail(&shared, generation, "store returned no range result".into()),
            },
            Err(e) => return fail(&shared, generation, e.to_string()),
        };
        let nodes = kvs
            .iter()
            .filter_map(|kv| {
                cached_node(kv)
                    .map_err(|e| tracing::error!(error = %e, "skipping unreadable node record"))
                    .ok()
            })
            .collect();
        {
            let mut s = lock(&shared);
            if stale(&s) {
                return;
            }
            for change in s.cache.handle_resync(revision, nodes) {
                s.feed(&change);
            }
            s.state = State::Ready;
            s.wake_all();
        }
        let mut watch = store.watch(range.clone(), revision + 1);
        loop {
            match watch.next().await {
                Some(Ok(batch)) => {
                    let mut s = lock(&shared);
                    if stale(&s) {
                        return;
                    }
                    for event in &batch.events {
                        if let Some(change) = to_change(event)
                            && s.cache.handle_change(&change)
                        {
                            s.feed(&change);
                        }
                    }
                    s.cache.handle_progress(batch.revision);
                    // Streams held back until the cache reached a revision.
                    let revision = s.cache.revision();
                    for slot in s.streams.values_mut() {
                        if slot.after > 0
                            && slot.after <= revision
                            && let Some(w) = slot.waker.take()
                        {
                            w.wake();
                        }
                    }
                }
                Some(Err(StoreError::Compacted { compact_revision })) => {
                    tracing::warn!(
                        compact_revision,
                        "store compacted past the watch cache; re-reading a snapshot"
                    );
                    break;
                }
                Some(Err(e)) => return fail(&shared, generation, e.to_string()),
                None => return fail(&shared, generation, "store watch ended".into()),
            }
        }
    }
}

fn fail(shared: &Mutex<Shared>, generation: u64, why: String) {
    let mut s = lock(shared);
    if s.generation != generation {
        return;
    }
    tracing::error!(error = %why, "watch cache lost the store; ending open Watch streams");
    s.abandon_driver();
    s.state = State::Idle;
    s.cache = NodeCache::new();
    if crate::canary_planted!(SkipCacheFailure) {
        return;
    }
    s.end_all(&Status::unavailable(format!(
        "store failed: {why}; request can be retried"
    )));
}

/// One open `Watch` stream: each item is one encoded `WatchEvent`
/// (decode it with `WatchEvent` or
/// [`EncodedWatchEvent`](metropolis_proto::wire::EncodedWatchEvent)).
/// A `NodesInCluster` stream's backlog is the cache's shared encoding
/// ([`NodeCache::shared_backlog`]): streams opening at one revision share
/// its bytes. Dropping the stream unregisters it.
pub struct WatchStream {
    shared: Arc<Mutex<Shared>>,
    id: u64,
}

impl Stream for WatchStream {
    type Item = Result<Bytes, Status>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let mut guard = lock(&self.shared);
        let s = &mut *guard;
        let Some(slot) = s.streams.get_mut(&self.id) else {
            return Poll::Ready(None);
        };
        if let Some(status) = slot.end.take() {
            s.remove(self.id);
            return Poll::Ready(Some(Err(status)));
        }
        if s.state == State::Ready && s.cache.revision() >= slot.after {
            if let Some(member) = &slot.member
                && s.cache.get(member).is_none()
            {
                let status = not_a_member(member);
                s.remove(self.id);
                return Poll::Ready(Some(Err(status)));
            }
            let event = match &mut slot.machine {
                Machine::Nodes(m) => m.poll_encoded(&mut s.cache),
                Machine::Node(m) => m
                    .poll_event()
                    .map(|event| Bytes::from(event.encode_to_vec())),
            };
            if let Some(event) = event {
                if let Some(metrics) = &s.metrics {
                    metrics.sent(event.len());
                }
                return Poll::Ready(Some(Ok(event)));
            }
        }
        slot.waker = Some(cx.waker().clone());
        Poll::Pending
    }
}

impl Drop for WatchStream {
    fn drop(&mut self) {
        lock(&self.shared).remove(self.id);
    }
}
