//! Backups of a running store (`EmbeddedStore::backup`) and their restore
//! into an empty directory (`metropolis_store::restore`): the restored
//! store holds exactly what the backup's revision held; a directory with
//! a store, one a daemon holds, and damaged or foreign bytes are refused.

// Test code: a failed setup or check should panic.
#![allow(clippy::unwrap_used)]

mod common;

use common::{block_on, dump, put};
use metropolis_store::{EmbeddedStore, RestoreError, StoreOptions, restore};

#[test]
fn a_restored_store_holds_what_the_backup_held_and_takes_writes() {
    let dir = tempfile::tempdir().unwrap();
    let options = StoreOptions::default().with_snapshot_threshold(4 << 10);
    let store = EmbeddedStore::open(&dir.path().join("a"), options.clone()).unwrap();
    // Enough to snapshot and rotate the WAL a few times, and a delete.
    for i in 0..200 {
        block_on(store.txn(put(&format!("k/{i:03}"), &"v".repeat(64)))).unwrap();
    }
    block_on(store.txn(metropolis_core::store::Txn {
        success: vec![metropolis_core::store::Op::Delete(
            metropolis_core::store::KeyRange::Key(common::b("k/007")),
        )],
        ..Default::default()
    }))
    .unwrap();
    let backup = block_on(store.backup()).unwrap();
    let (revision, kvs) = dump(&store);
    assert_eq!(backup.revision, revision);
    // Later writes are not in it.
    block_on(store.txn(put("k/later", "x"))).unwrap();

    let target = dir.path().join("b");
    let restored = restore(&target, &backup.bytes, &options).unwrap();
    assert_eq!((restored.revision, restored.keys), (revision, 199));
    let copy = EmbeddedStore::open(&target, options.clone()).unwrap();
    assert_eq!(dump(&copy), (revision, kvs.clone()));
    block_on(copy.txn(put("k/new", "y"))).unwrap();
    drop(copy);
    let copy = EmbeddedStore::open(&target, options.clone()).unwrap();
    let (after, with_new) = dump(&copy);
    assert_eq!((after, with_new.len()), (revision + 1, kvs.len() + 1));

    // Not over a store, a directory a store holds, or damaged bytes.
    match restore(&target, &backup.bytes, &options) {
        Err(RestoreError::Locked { .. }) => {}
        other => panic!("over an open store: {other:?}"),
    }
    drop(copy);
    match restore(&target, &backup.bytes, &options) {
        Err(RestoreError::NotEmpty { path }) => assert!(path.ends_with("wal")),
        other => panic!("over a store: {other:?}"),
    }
    let fresh = dir.path().join("c");
    for (at, what) in [(0, "magic"), (8, "version"), (40, "checksum")] {
        let mut bad = backup.bytes.clone();
        bad[at] ^= 0x01;
        match restore(&fresh, &bad, &options) {
            Err(RestoreError::Invalid(e)) => assert!(e.to_string().contains("backup"), "{e}"),
            other => panic!("{what} damaged: {other:?}"),
        }
    }
    assert!(restore(&fresh, &backup.bytes[..10], &options).is_err());
    assert!(
        !fresh.join("wal").exists(),
        "nothing written for a refused backup"
    );
}

/// A backup is returned only once what it holds is durable: with the
/// writer stepped by the test, it waits for the step that writes the
/// change before it.
#[test]
fn a_backup_waits_for_what_it_holds_to_be_durable() {
    use futures::FutureExt;
    use std::task::{Context, Waker};
    let dir = tempfile::tempdir().unwrap();
    let (store, mut writer) =
        EmbeddedStore::open_stepped(dir.path(), StoreOptions::default()).unwrap();
    let mut cx = Context::from_waker(Waker::noop());
    let mut write = store.txn(put("a", "1"));
    let mut backup = store.backup();
    assert!(write.poll_unpin(&mut cx).is_pending());
    assert!(
        backup.poll_unpin(&mut cx).is_pending(),
        "before the write is durable"
    );
    while matches!(
        writer.step(Waker::noop()),
        metropolis_store::WriterStep::Wrote
    ) {}
    assert!(write.poll_unpin(&mut cx).is_ready());
    let std::task::Poll::Ready(Ok(backup)) = backup.poll_unpin(&mut cx) else {
        panic!("no backup once durable");
    };
    let target = dir.path().join("copy");
    restore(&target, &backup.bytes, &StoreOptions::default()).unwrap();
    drop(store);
    drop(writer);
    let copy = EmbeddedStore::open(&target, StoreOptions::default()).unwrap();
    assert_eq!(dump(&copy).1.len(), 1);
}
