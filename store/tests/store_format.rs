//! Files written by earlier builds open in this one: a store directory
//! (a snapshot and a version 2 WAL after it) written before the CRC-32C
//! came from the `crc32c` crate, kept in `fixtures/store-v2/`. It was
//! made by 40 transactions, the `i`-th putting `value {i} ` and `3 * i`
//! times `x` at `key/{i % 12}`, with a 2 KiB snapshot threshold.

#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;

use common::{block_on, dump, put};
use metropolis_store::{EmbeddedStore, StoreOptions};

/// What the 40 transactions left: for each key, its value, create and
/// mod revisions and version.
fn expected() -> Vec<(String, String, i64, i64, i64)> {
    (0..12usize)
        .map(|k| {
            let writes: Vec<usize> = (0..40).filter(|i| i % 12 == k).collect();
            let last = *writes.last().unwrap();
            (
                format!("key/{k:02}"),
                format!("value {last} {}", "x".repeat(last * 3)),
                k as i64 + 2,
                last as i64 + 2,
                writes.len() as i64,
            )
        })
        .collect()
}

#[test]
fn a_store_written_by_an_earlier_build_opens_with_every_write() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/store-v2");
    let dir = tempfile::tempdir().unwrap();
    for name in ["snapshot", "wal"] {
        std::fs::copy(fixture.join(name), dir.path().join(name)).unwrap();
    }
    let store = EmbeddedStore::open(dir.path(), StoreOptions::default()).unwrap();
    let (revision, kvs) = dump(&store);
    assert_eq!(revision, 41);
    let found: Vec<_> = kvs
        .iter()
        .map(|kv| {
            (
                String::from_utf8(kv.key.to_vec()).unwrap(),
                String::from_utf8(kv.value.to_vec()).unwrap(),
                kv.create_revision,
                kv.mod_revision,
                kv.version,
            )
        })
        .collect();
    assert_eq!(found, expected());
    // And it goes on from there: a new write lands after them.
    let r = block_on(store.txn(put("key/new", "after"))).unwrap();
    assert_eq!(r.revision, 42);
    store.close().unwrap();
}
