//! The watch cache holding back a stream until it has caught up with the
//! writes acknowledged before the stream opened.

#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};

use futures::channel::mpsc;
use futures::executor::LocalPool;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::task::LocalSpawnExt;
use futures::{FutureExt, StreamExt};
use metropolis_proto::prelude::common;

use super::*;
use crate::identity::NodeId;
use crate::ports::WatchBatch;
use crate::service::CuratorService;
use crate::store::{MemStore, TxnResponse};

/// The store model whose watch delivers only what the test forwards: a
/// watch that lags as much as the test wants.
struct Lagging {
    store: Mutex<MemStore>,
    watchers: Mutex<Vec<mpsc::UnboundedSender<Result<WatchBatch, StoreError>>>>,
}

impl KvStore for Lagging {
    fn txn(&self, txn: Txn) -> BoxFuture<'static, Result<TxnResponse, StoreError>> {
        let result = self.store.lock().unwrap().txn(&txn);
        Box::pin(futures::future::ready(result))
    }

    fn watch(
        &self,
        _: KeyRange,
        _: Revision,
    ) -> BoxStream<'static, Result<WatchBatch, StoreError>> {
        let (tx, rx) = mpsc::unbounded();
        self.watchers.lock().unwrap().push(tx);
        rx.boxed()
    }
}

impl Lagging {
    /// Delivers the events of `revision` to the open watches.
    fn deliver(&self, revision: Revision) {
        let batch = {
            let mut store = self.store.lock().unwrap();
            let id = store
                .watch(
                    KeyRange::Prefix(bytes::Bytes::from_static(NODES_PREFIX)),
                    revision,
                )
                .unwrap();
            let batch = store.poll_watch_up_to(id, revision);
            store.cancel_watch(id);
            batch.unwrap().unwrap()
        };
        for w in self.watchers.lock().unwrap().iter() {
            let _ = w.unbounded_send(Ok(batch.clone()));
        }
    }
}

/// Keeps the background tasks for the test's executor to run.
#[derive(Default)]
struct Tasks(Mutex<Vec<Pin<Box<dyn std::future::Future<Output = ()> + Send + 'static>>>>);

impl Spawner for Tasks {
    fn spawn(&self, task: Pin<Box<dyn std::future::Future<Output = ()> + Send + 'static>>) {
        self.0.lock().unwrap().push(task);
    }
}

/// One thread, no clock: the cache's driver and the streams run on a
/// local pool until nothing can progress.
struct Executor {
    pool: LocalPool,
    tasks: Arc<Tasks>,
}

impl Executor {
    fn settle(&mut self) {
        for task in self.tasks.0.lock().unwrap().drain(..) {
            self.pool.spawner().spawn_local(task).unwrap();
        }
        self.pool.run_until_stalled();
    }

    fn next_event(&mut self, stream: &mut WatchStream) -> EncodedWatchEvent {
        self.settle();
        self.pool.run_until(stream.next()).unwrap().unwrap()
    }
}

/// A cache over a [`Lagging`] store, and the executor that drives it.
fn lagging_cache() -> (Arc<Lagging>, Executor, WatchCache) {
    let store = Arc::new(Lagging {
        store: Mutex::new(MemStore::new()),
        watchers: Mutex::new(Vec::new()),
    });
    let tasks = Arc::new(Tasks::default());
    let ex = Executor {
        pool: LocalPool::new(),
        tasks: tasks.clone(),
    };
    let cache = WatchCache::new(store.clone(), tasks, WatchCacheOptions::default());
    (store, ex, cache)
}

#[test]
fn a_stream_waits_for_the_writes_acknowledged_before_it_opened() {
    let (store, mut ex, cache) = lagging_cache();
    // A first stream starts the cache: an empty backlog.
    let mut first = cache.watch_nodes();
    let empty = ex.next_event(&mut first);
    assert!(empty.is_last_backlogged() && empty.nodes.is_empty());
    // A node written through the tracked store, not yet seen by the cache.
    let curator = CuratorService::new(cache.track_writes(store.clone()), cache.clone(), None);
    let id = NodeId::from_public_key(&[3; 32]);
    let written = ex
        .pool
        .run_until(curator.register_node(
            &id,
            &[3; 32],
            common::NodeRoles::default(),
            common::NodeState::Up,
        ))
        .unwrap();
    assert!(written);
    let mut second = cache.watch_nodes();
    ex.settle();
    assert!(
        second.next().now_or_never().is_none(),
        "the backlog must wait for the acknowledged write"
    );
    // The cache catches up: the backlog holds the node.
    let revision = store.store.lock().unwrap().revision();
    store.deliver(revision);
    let backlog = ex.next_event(&mut second);
    assert_eq!(backlog.nodes.len(), 1, "{backlog:?}");
    assert!(backlog.is_last_backlogged());
    // The first stream, opened before the write, got it as a change.
    let change = ex.next_event(&mut first);
    assert_eq!(change.nodes.len(), 1, "{change:?}");
}

/// A stream a node opened lasts while the node is a member: it ends with
/// Unauthenticated when the node is deleted (also when the delete is not an
/// event the stream would send), and at once when the node is unknown. The
/// owner's stream is unaffected.
#[test]
fn a_node_s_streams_end_when_it_is_removed() {
    let (store, mut ex, cache) = lagging_cache();
    let curator = CuratorService::new(cache.track_writes(store.clone()), cache.clone(), None);
    let (x, y) = (
        NodeId::from_public_key(&[7; 32]),
        NodeId::from_public_key(&[8; 32]),
    );
    for (id, key) in [(&x, [7; 32]), (&y, [8; 32])] {
        let register = curator.register_node(
            id,
            &key,
            common::NodeRoles::default(),
            common::NodeState::Up,
        );
        assert!(ex.pool.run_until(register).unwrap());
    }
    let revision = store.store.lock().unwrap().revision();
    store.deliver(revision);
    let as_x = Identity::Node(x.clone());
    let mut nodes = cache.watch_nodes_as(&as_x);
    assert_eq!(ex.next_event(&mut nodes).nodes.len(), 2);
    let mut of_y = cache.watch_node_as(y.as_str(), &as_x);
    assert_eq!(ex.next_event(&mut of_y).nodes.len(), 1);
    let mut owners = cache.watch_nodes();
    assert_eq!(ex.next_event(&mut owners).nodes.len(), 2);

    let delete = Txn {
        success: vec![Op::Delete(KeyRange::Key(crate::curator::node_key(&x)))],
        ..Default::default()
    };
    ex.pool.run_until(store.txn(delete)).unwrap();
    let revision = store.store.lock().unwrap().revision();
    store.deliver(revision);
    ex.settle();
    for stream in [&mut nodes, &mut of_y] {
        let end = ex.pool.run_until(stream.next()).unwrap().unwrap_err();
        assert_eq!(end.code(), tonic::Code::Unauthenticated, "{end:?}");
        assert!(end.message().contains(x.as_str()), "{end:?}");
        assert!(ex.pool.run_until(stream.next()).is_none());
    }
    let tombstone = ex.next_event(&mut owners);
    assert_eq!(tombstone.tombstones, vec![x.to_string()], "{tombstone:?}");
    // Opened after the removal: ended at once, before any event.
    let mut late = cache.watch_nodes_as(&as_x);
    ex.settle();
    let end = ex.pool.run_until(late.next()).unwrap().unwrap_err();
    assert_eq!(end.code(), tonic::Code::Unauthenticated, "{end:?}");
}
