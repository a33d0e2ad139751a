//! Durability of the embedded store: reopening, snapshots, leases,
//! concurrency, the directory lock.

#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use metropolis_core::store::{
    CmpOp, Compare, CompareTarget, KeyRange, Op, Revision, StoreError, Txn,
};
use metropolis_store::{EmbeddedStore, OpenError, StoreOptions};

fn open(dir: &Path, options: StoreOptions) -> EmbeddedStore {
    EmbeddedStore::open(dir, options).unwrap()
}

/// A deterministic mix of puts, deletes and compare-and-swaps.
fn workload(store: &EmbeddedStore, n: usize, tag: &str) {
    for i in 0..n {
        let key = format!("{tag}/{}", i % 37);
        let txn = match i % 5 {
            0..=2 => put(&key, &format!("v{i}")),
            3 => Txn {
                success: vec![Op::Delete(KeyRange::Prefix(b(&format!("{tag}/{}", i % 4))))],
                ..Txn::default()
            },
            _ => Txn {
                compares: vec![Compare {
                    key: b(&key),
                    op: CmpOp::Greater,
                    target: CompareTarget::Version(1),
                }],
                success: vec![Op::Delete(KeyRange::Key(b(&key)))],
                failure: vec![Op::Put {
                    key: b(&key),
                    value: b("cas"),
                    lease: 0,
                }],
            },
        };
        block_on(store.txn(txn)).unwrap();
    }
}

#[test]
fn reopen_gives_identical_state() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data");
    let store = open(&path, StoreOptions::default());
    assert_eq!(store.revision(), 1);
    workload(&store, 400, "k");
    let before = dump(&store);
    assert!(before.0 > 300);
    store.close().unwrap();

    let store = open(&path, StoreOptions::default());
    assert_eq!(dump(&store), before);
    assert_eq!(store.revision(), before.0);
    // And it goes on from there.
    let r = block_on(store.txn(put("after", "1"))).unwrap();
    assert_eq!(r.revision, before.0 + 1);
    drop(store);
    let store = open(&path, StoreOptions::default());
    assert_eq!(dump(&store).0, before.0 + 1);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
    }
}

#[test]
fn snapshots_rotate_the_wal_and_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let options = StoreOptions::default()
        .with_snapshot_threshold(4096)
        .with_history_revisions(50);
    let store = open(dir.path(), options.clone());
    workload(&store, 1000, "s");
    let before = dump(&store);
    store.close().unwrap();
    let snapshot = std::fs::metadata(dir.path().join("snapshot")).unwrap();
    assert!(snapshot.len() > 0);
    // The WAL was rotated: its header names a late first record, and it
    // holds less than the threshold and one record beyond the zeros
    // preallocated after it.
    let wal = std::fs::read(dir.path().join("wal")).unwrap();
    let first_seq = u64::from_le_bytes(wal[12..20].try_into().unwrap());
    assert!(first_seq > 500, "the WAL starts at record {first_seq}");
    let used = wal.iter().rposition(|b| *b != 0).unwrap() + 1;
    assert!(used < 4096 + 1024, "the WAL holds {used} bytes");
    assert!(!dir.path().join("wal.tmp").exists());
    assert!(!dir.path().join("snapshot.tmp").exists());

    let store = open(dir.path(), options.clone());
    assert_eq!(dump(&store), before);
    workload(&store, 300, "t");
    let before = dump(&store);
    drop(store);
    let store = open(dir.path(), options);
    assert_eq!(dump(&store), before);
}

#[test]
fn concurrent_txns_are_all_durable() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(open(dir.path(), StoreOptions::default()));
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let store = store.clone();
            std::thread::spawn(move || {
                (0..100)
                    .map(|i| {
                        let r = block_on(store.txn(put(&format!("t{t}/{i:03}"), &format!("{i}"))));
                        r.unwrap().revision
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let mut revisions: Vec<Revision> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    revisions.sort();
    revisions.dedup();
    assert_eq!(
        revisions,
        (2..=401).collect::<Vec<_>>(),
        "one revision per txn"
    );
    drop(Arc::try_unwrap(store).unwrap());

    let store = open(dir.path(), StoreOptions::default());
    let (revision, kvs) = dump(&store);
    assert_eq!(revision, 401);
    assert_eq!(kvs.len(), 400);
    assert!(kvs.iter().all(|kv| kv.version == 1));
}

#[test]
fn second_open_of_the_same_directory_fails() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), StoreOptions::default());
    let err = EmbeddedStore::open(dir.path(), StoreOptions::default()).unwrap_err();
    assert!(matches!(err, OpenError::Locked { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("in use") && msg.contains("LOCK"), "{msg}");
    drop(store);
    open(dir.path(), StoreOptions::default());
}

#[test]
fn leases_expire_durably_and_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), StoreOptions::default());
    let short = block_on(store.lease_grant(0, Duration::from_millis(200))).unwrap();
    let long = block_on(store.lease_grant(0, Duration::from_secs(3600))).unwrap();
    assert_ne!(short, long);
    let attach = |key: &str, lease| Txn {
        success: vec![Op::Put {
            key: b(key),
            value: b("x"),
            lease,
        }],
        ..Txn::default()
    };
    block_on(store.txn(attach("short", short))).unwrap();
    block_on(store.txn(attach("long", long))).unwrap();
    assert_eq!(
        block_on(store.txn(attach("bad", 12345))).unwrap_err(),
        StoreError::LeaseNotFound(12345)
    );
    assert_eq!(
        block_on(store.lease_keep_alive(long)).unwrap(),
        Duration::from_secs(3600)
    );
    // The writer thread expires the short lease.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while dump(&store).1.iter().any(|kv| kv.key == b("short")) {
        assert!(std::time::Instant::now() < deadline, "lease did not expire");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        store.lease_time_to_live(short).unwrap_err(),
        StoreError::LeaseNotFound(short)
    );
    let before = dump(&store);
    drop(store);

    let store = open(dir.path(), StoreOptions::default());
    assert_eq!(dump(&store), before);
    let info = store.lease_time_to_live(long).unwrap();
    assert_eq!(info.keys, vec![b("long")]);
    assert!(info.remaining > Duration::from_secs(3500));
    let revision = block_on(store.lease_revoke(long)).unwrap();
    assert_eq!(revision, before.0 + 1);
    drop(store);
    let store = open(dir.path(), StoreOptions::default());
    assert!(dump(&store).1.is_empty());
    // IDs are not reused after a restart.
    let next = block_on(store.lease_grant(0, Duration::from_secs(1))).unwrap();
    assert!(next > long);
}

#[test]
fn closed_store_refuses_requests() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(open(dir.path(), StoreOptions::default()));
    let pending = store.txn(put("a", "1"));
    let store = Arc::try_unwrap(store).unwrap();
    store.close().unwrap();
    // A request made before the close was written by it.
    assert_eq!(block_on(pending).unwrap().revision, 2);
    let store = open(dir.path(), StoreOptions::default());
    assert_eq!(dump(&store).0, 2);
}

/// A read for an update sees a write applied but not yet durable, so the
/// services send concurrent updates of a key at once rather than queueing
/// them behind each other's commit (`KvStore::applies_in_order`).
#[test]
fn reads_for_an_update_see_writes_in_submission_order() {
    use metropolis_core::ports::KvStore;
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), StoreOptions::default());
    assert!(store.applies_in_order());
    let first = store.txn(put("k", "1"));
    let read = block_on(KvStore::read_for_update(
        &store,
        metropolis_core::store::KeyRange::Key(b("k")),
    ))
    .unwrap();
    assert_eq!(
        read[0].value,
        b("1"),
        "the first write is applied before it is durable"
    );
    block_on(first).unwrap();
}
