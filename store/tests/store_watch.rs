//! Watch streams of the embedded store.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::*;
use futures::StreamExt;
use metropolis_core::ports::KvStore;
use metropolis_core::store::{EventKind, KeyRange, Op, Revision, StoreError, Txn};
use metropolis_store::{EmbeddedStore, StoreOptions};

fn txn(store: &EmbeddedStore, t: Txn) -> Revision {
    block_on(KvStore::txn(store, t)).unwrap().revision
}

#[test]
fn events_arrive_in_order_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(dir.path(), StoreOptions::default()).unwrap();
    txn(&store, put("a/0", "old"));
    let mut from_start = KvStore::watch(&store, KeyRange::Prefix(b("a/")), 1);
    let mut live = KvStore::watch(&store, KeyRange::Prefix(b("a/")), 0);
    let mut expected = vec![(EventKind::Put, b("a/0"), 2)];
    for i in 0..50 {
        let key = format!("a/{}", i % 7);
        let rev = txn(&store, put(&key, &i.to_string()));
        expected.push((EventKind::Put, b(&key), rev));
        txn(&store, put("b/other", "x"));
        if i % 10 == 9 {
            let rev = txn(
                &store,
                Txn {
                    success: vec![Op::Delete(KeyRange::Key(b(&key)))],
                    ..Txn::default()
                },
            );
            expected.push((EventKind::Delete, b(&key), rev));
        }
    }
    let last = expected.last().unwrap().2;
    for (stream, skip) in [(&mut from_start, 0), (&mut live, 1)] {
        let mut got = vec![];
        while got.len() < expected.len() - skip {
            let batch = block_on(stream.next()).unwrap().unwrap();
            assert!(batch.revision >= batch.events.last().unwrap().kv.mod_revision);
            got.extend(
                batch
                    .events
                    .into_iter()
                    .map(|e| (e.kind, e.kv.key, e.kv.mod_revision)),
            );
        }
        assert_eq!(got, expected[skip..]);
        assert_eq!(got.last().unwrap().2, last);
    }
    // Nothing more is pending: a new change arrives next.
    let rev = txn(&store, put("a/new", "1"));
    let batch = block_on(live.next()).unwrap().unwrap();
    assert_eq!(batch.events.len(), 1);
    assert_eq!(batch.events[0].kv.mod_revision, rev);
}

#[test]
fn a_watch_left_behind_gets_compacted_and_ends() {
    let dir = tempfile::tempdir().unwrap();
    let options = StoreOptions::default().with_history_revisions(8);
    let store = EmbeddedStore::open(dir.path(), options).unwrap();
    let mut behind = KvStore::watch(&store, KeyRange::Prefix(Bytes::new()), 0);
    for i in 0..40 {
        txn(&store, put("k", &i.to_string()));
    }
    match block_on(behind.next()) {
        Some(Err(StoreError::Compacted { compact_revision })) => assert!(compact_revision >= 30),
        other => panic!("{other:?}"),
    }
    assert!(block_on(behind.next()).is_none());
    // Starting at a compacted revision fails at once; a recent one works.
    let mut old = KvStore::watch(&store, KeyRange::Prefix(Bytes::new()), 2);
    assert!(matches!(
        block_on(old.next()),
        Some(Err(StoreError::Compacted { .. }))
    ));
    assert!(block_on(old.next()).is_none());
    let mut recent = KvStore::watch(&store, KeyRange::Prefix(Bytes::new()), 40);
    let batch = block_on(recent.next()).unwrap().unwrap();
    assert_eq!(batch.events.first().unwrap().kv.mod_revision, 40);
    assert_eq!(batch.events.last().unwrap().kv.mod_revision, 41);
}

#[test]
fn watch_is_woken_from_another_thread_and_ends_on_close() {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(dir.path(), StoreOptions::default()).unwrap();
    let mut stream = KvStore::watch(&store, KeyRange::Key(b("k")), 0);
    let waiter = std::thread::spawn(move || {
        let first = block_on(stream.next()).unwrap().unwrap();
        let end = block_on(stream.next());
        (first, end, block_on(stream.next()).is_none())
    });
    std::thread::sleep(Duration::from_millis(50));
    let rev = txn(&store, put("k", "v"));
    std::thread::sleep(Duration::from_millis(50));
    store.close().unwrap();
    let (first, end, ended) = waiter.join().unwrap();
    assert_eq!(first.events[0].kv.mod_revision, rev);
    assert!(
        matches!(end, Some(Err(StoreError::Unavailable(_)))),
        "{end:?}"
    );
    assert!(ended);
}

#[test]
fn watch_from_the_future_gets_no_older_events() {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(dir.path(), StoreOptions::default()).unwrap();
    let mut stream = KvStore::watch(&store, KeyRange::Prefix(Bytes::new()), 5);
    for i in 0..6 {
        txn(&store, put("k", &i.to_string()));
    }
    let batch = block_on(stream.next()).unwrap().unwrap();
    let revisions: Vec<Revision> = batch.events.iter().map(|e| e.kv.mod_revision).collect();
    assert_eq!(revisions, vec![5, 6, 7]);
}
