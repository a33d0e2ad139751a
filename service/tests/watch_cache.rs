//! The watch cache holding back a stream until it has caught up with the
//! writes acknowledged before the stream opened, and ending a node's
//! streams when the node is removed; over the store model with lagging
//! watches, driven by the test kit's executor.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use futures::{FutureExt, StreamExt};
use metropolis_core::curator::node_key;
use metropolis_core::identity::{Identity, NodeId};
use metropolis_core::ports::KvStore;
use metropolis_core::store::{KeyRange, Op, Txn};
use metropolis_proto::prelude::common;
use metropolis_proto::wire::EncodedWatchEvent;
use metropolis_service::forward::LeaderTerm;
use metropolis_service::{CuratorService, WatchCache, WatchCacheOptions, WatchStream};
use metropolis_testkit::clock::ManualClock;

/// The wall clock of the services under test.
fn clock() -> Arc<ManualClock> {
    Arc::new(ManualClock::new())
}
use metropolis_testkit::exec::{Tasks, block_on};
use metropolis_testkit::store::MemKv;
use prost::Message;

/// Polls allowed for one call or stream item (everything is in memory).
const POLLS: usize = 64;

/// Runs the cache's driver until it waits for the store.
fn settle(tasks: &Tasks) {
    tasks.run(4);
}

/// The next event of `stream`, once the driver has settled.
fn next_event(tasks: &Tasks, stream: &mut WatchStream) -> EncodedWatchEvent {
    settle(tasks);
    let bytes = block_on(stream.next(), tasks, POLLS).unwrap().unwrap();
    EncodedWatchEvent::decode(bytes).unwrap()
}

/// A cache over a lagging store (its watch delivers a write only once the
/// test lets it catch up), and the tasks that drive it.
fn lagging_cache() -> (MemKv, Tasks, WatchCache) {
    let store = MemKv::lagging();
    let tasks = Tasks::new();
    let cache = WatchCache::new(
        Arc::new(store.clone()),
        Arc::new(tasks.clone()),
        WatchCacheOptions::default(),
    );
    (store, tasks, cache)
}

#[test]
fn a_stream_waits_for_the_writes_acknowledged_before_it_opened() {
    let (store, tasks, cache) = lagging_cache();
    // A first stream starts the cache: an empty backlog.
    let mut first = cache.watch_nodes();
    let empty = next_event(&tasks, &mut first);
    assert!(empty.is_last_backlogged() && empty.nodes.is_empty());
    // A node written through the tracked store, not yet seen by the cache.
    let curator = CuratorService::new(
        cache.track_writes(Arc::new(store.clone())),
        cache.clone(),
        None,
        clock(),
    );
    let id = NodeId::from_public_key(&[3; 32]);
    let written = block_on(
        curator.register_node(
            &id,
            &[3; 32],
            common::NodeRoles::default(),
            common::NodeState::Up,
        ),
        &tasks,
        POLLS,
    )
    .unwrap();
    assert!(written);
    let mut second = cache.watch_nodes();
    settle(&tasks);
    assert!(
        second.next().now_or_never().is_none(),
        "the backlog must wait for the acknowledged write"
    );
    // The cache catches up: the backlog holds the node.
    store.catch_up(store.revision());
    let backlog = next_event(&tasks, &mut second);
    assert_eq!(backlog.nodes.len(), 1, "{backlog:?}");
    assert!(backlog.is_last_backlogged());
    // The first stream, opened before the write, got it as a change.
    let change = next_event(&tasks, &mut first);
    assert_eq!(change.nodes.len(), 1, "{change:?}");
}

/// A leader's cache may have followed the store since an earlier term,
/// behind what the leaders in between acknowledged: the first stream of a
/// new term makes it read a fresh snapshot, and no stream of that term
/// says anything before it has. Streams of the earlier term get the
/// difference; a stream of the old term opened now does not wait.
#[test]
fn a_stream_of_a_new_term_waits_for_a_fresh_snapshot() {
    let (store, tasks, cache) = lagging_cache();
    let owner = Identity::Owner;
    let mut earlier = cache.watch_nodes_as(&owner, LeaderTerm(1));
    let empty = next_event(&tasks, &mut earlier);
    assert!(empty.is_last_backlogged() && empty.nodes.is_empty());
    // Another leader registers a node; this cache's store watch lags.
    let elsewhere = CuratorService::new(Arc::new(store.clone()), cache.clone(), None, clock());
    let id = NodeId::from_public_key(&[5; 32]);
    let register = elsewhere.register_node(
        &id,
        &[5; 32],
        common::NodeRoles::default(),
        common::NodeState::Up,
    );
    assert!(block_on(register, &tasks, POLLS).unwrap());
    // In the old term, the cache serves what it has.
    let mut old_term = cache.watch_nodes_as(&owner, LeaderTerm(1));
    let stale = next_event(&tasks, &mut old_term);
    assert!(
        stale.is_last_backlogged() && stale.nodes.is_empty(),
        "{stale:?}"
    );
    // In a new term, the backlog holds it though the watch never sent it.
    let mut new_term = cache.watch_nodes_as(&owner, LeaderTerm(3));
    let backlog = next_event(&tasks, &mut new_term);
    assert_eq!(backlog.nodes.len(), 1, "{backlog:?}");
    assert!(backlog.is_last_backlogged());
    let mut of_node = cache.watch_node_as(id.as_str(), &owner, LeaderTerm(3));
    assert_eq!(next_event(&tasks, &mut of_node).nodes.len(), 1);
    // The earlier stream got the difference.
    let change = next_event(&tasks, &mut earlier);
    assert_eq!(change.nodes.len(), 1, "{change:?}");
    // The watch catching up sends nobody the node again.
    store.catch_up(store.revision());
    settle(&tasks);
    for stream in [&mut earlier, &mut new_term, &mut of_node] {
        assert!(stream.next().now_or_never().is_none());
    }
}

/// A stream a node opened lasts while the node is a member: it ends with
/// Unauthenticated when the node is deleted (also when the delete is not an
/// event the stream would send), and at once when the node is unknown. The
/// owner's stream is unaffected.
#[test]
fn a_node_s_streams_end_when_it_is_removed() {
    let (store, tasks, cache) = lagging_cache();
    let curator = CuratorService::new(
        cache.track_writes(Arc::new(store.clone())),
        cache.clone(),
        None,
        clock(),
    );
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
        assert!(block_on(register, &tasks, POLLS).unwrap());
    }
    store.catch_up(store.revision());
    let as_x = Identity::Node(x.clone());
    let mut nodes = cache.watch_nodes_as(&as_x, LeaderTerm::FIXED);
    assert_eq!(next_event(&tasks, &mut nodes).nodes.len(), 2);
    let mut of_y = cache.watch_node_as(y.as_str(), &as_x, LeaderTerm::FIXED);
    assert_eq!(next_event(&tasks, &mut of_y).nodes.len(), 1);
    let mut owners = cache.watch_nodes();
    assert_eq!(next_event(&tasks, &mut owners).nodes.len(), 2);

    let delete = Txn {
        success: vec![Op::Delete(KeyRange::Key(node_key(&x)))],
        ..Default::default()
    };
    block_on(store.txn(delete), &tasks, POLLS).unwrap();
    store.catch_up(store.revision());
    settle(&tasks);
    for stream in [&mut nodes, &mut of_y] {
        let end = block_on(stream.next(), &tasks, POLLS).unwrap().unwrap_err();
        assert_eq!(end.code(), tonic::Code::Unauthenticated, "{end:?}");
        assert!(end.message().contains(x.as_str()), "{end:?}");
        assert!(block_on(stream.next(), &tasks, POLLS).is_none());
    }
    let tombstone = next_event(&tasks, &mut owners);
    assert_eq!(tombstone.tombstones, vec![x.to_string()], "{tombstone:?}");
    // Opened after the removal: ended at once, before any event.
    let mut late = cache.watch_nodes_as(&as_x, LeaderTerm::FIXED);
    settle(&tasks);
    let end = block_on(late.next(), &tasks, POLLS).unwrap().unwrap_err();
    assert_eq!(end.code(), tonic::Code::Unauthenticated, "{end:?}");
}

/// What the cache records in its metrics: open streams, events and bytes
/// sent, and the changes of a node replaced by a newer one before a
/// stream that was not reading sent them.
#[test]
fn the_metrics_count_streams_events_and_coalesced_changes() {
    use metropolis_core::store::OpResult;
    use metropolis_service::metrics::Metrics;

    let (store, tasks, cache) = lagging_cache();
    let metrics = Metrics::new(Arc::new(metropolis_testkit::clock::ManualClock::new()));
    let cache = cache.with_metrics(&metrics);
    let sample = |name: &str| {
        let mut registry = prometheus_client::registry::Registry::default();
        metrics.register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        let line = text.lines().find(|l| l.split(' ').next() == Some(name));
        line.and_then(|l| l.split(' ').nth(1)).map(str::to_string)
    };
    let curator = CuratorService::new(Arc::new(store.clone()), cache.clone(), None, clock());
    let id = NodeId::from_public_key(&[9; 32]);
    let register = curator.register_node(
        &id,
        &[9; 32],
        common::NodeRoles::default(),
        common::NodeState::Up,
    );
    assert!(block_on(register, &tasks, POLLS).unwrap());
    store.catch_up(store.revision());
    let mut stream = cache.watch_nodes();
    assert_eq!(next_event(&tasks, &mut stream).nodes.len(), 1);
    assert_eq!(
        sample("metropolis_curator_watch_streams").as_deref(),
        Some("1")
    );

    // Three writes of the node while the stream is not read: one event.
    let read = Txn {
        success: vec![Op::Range(KeyRange::Key(node_key(&id)))],
        ..Default::default()
    };
    let mut response = block_on(store.txn(read), &tasks, POLLS).unwrap();
    let Some(OpResult::Range(kvs)) = response.results.pop() else {
        panic!("no range result");
    };
    for _ in 0..3 {
        let put = Txn {
            success: vec![Op::Put {
                key: kvs[0].key.clone(),
                value: kvs[0].value.clone(),
                lease: 0,
            }],
            ..Default::default()
        };
        block_on(store.txn(put), &tasks, POLLS).unwrap();
    }
    store.catch_up(store.revision());
    assert_eq!(next_event(&tasks, &mut stream).nodes.len(), 1);
    assert!(stream.next().now_or_never().is_none());
    assert_eq!(
        sample("metropolis_curator_watch_coalesced_total").as_deref(),
        Some("2")
    );
    assert_eq!(
        sample("metropolis_curator_watch_events_sent_total").as_deref(),
        Some("2")
    );
    let bytes: u64 = sample("metropolis_curator_watch_sent_bytes_total")
        .unwrap()
        .parse()
        .unwrap();
    assert!(bytes > 0);
    drop(stream);
    assert_eq!(
        sample("metropolis_curator_watch_streams").as_deref(),
        Some("0")
    );
}
