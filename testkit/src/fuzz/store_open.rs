//! The `store_open` target: the embedded store opened over hostile files
//! (a WAL, a snapshot, leftover temporary files), on the in-memory disk
//! ([`SimDisk`]): the WAL reader, the snapshot reader, the record decoder
//! and the replay.
//!
//! Input: a flags byte (bit 0: direct I/O; bits 1-4: a `wal`, `snapshot`,
//! `wal.tmp`, `snapshot.tmp` follows), then each file present as a
//! `u16`-length-prefixed byte string followed by a `u16` count of zero
//! bytes that end the file (a WAL is preallocated with zeros).
//!
//! Checked: the open either succeeds or fails with
//! [`OpenError::Corrupt`] naming the `wal` or the `snapshot` and an
//! offset within that file (never a panic, never another error on a disk
//! that never fails); an opened store reads, takes a write, and opens
//! again with exactly what it held plus that write (what it repaired at
//! the first open is accepted at the second).
//!
//! The store runs its writer thread while open; this harness waits for
//! each write, so its result depends only on the input.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use metropolis_core::store::{KeyRange, Op, OpResult, Txn};
use metropolis_store::disk::Disk;
use metropolis_store::{EmbeddedStore, OpenError, StoreOptions};

use super::input::Input;
use crate::disk::SimDisk;

/// The files an input may hold, by flag bit.
pub const FILES: [(u8, &str); 4] = [
    (1 << 1, "wal"),
    (1 << 2, "snapshot"),
    (1 << 3, "wal.tmp"),
    (1 << 4, "snapshot.tmp"),
];

/// The store's directory on the in-memory disk.
pub const DIR: &str = "/fuzz/store";

fn everything(store: &EmbeddedStore) -> BTreeMap<Bytes, Bytes> {
    let read = Txn {
        compares: Vec::new(),
        success: vec![Op::Range(KeyRange::Prefix(Bytes::new()))],
        failure: Vec::new(),
    };
    let response = match futures::executor::block_on(store.txn(read)) {
        Ok(response) => response,
        Err(e) => panic!("an opened store refused a read: {e:?}"),
    };
    match response.results.into_iter().next() {
        Some(OpResult::Range(kvs)) => kvs.into_iter().map(|kv| (kv.key, kv.value)).collect(),
        other => panic!("a range read answered {other:?}"),
    }
}

/// Runs one input.
pub fn run(data: &[u8]) {
    let mut input = Input::new(data);
    let flags = input.u8();
    let disk = SimDisk::new(0);
    let dir = Path::new(DIR);
    let mut sizes: BTreeMap<&str, usize> = BTreeMap::new();
    for (bit, name) in FILES {
        if flags & bit == 0 {
            continue;
        }
        let mut contents = input.lp().to_vec();
        let zeros = usize::from(input.u16());
        contents.resize(contents.len() + zeros, 0);
        sizes.insert(name, contents.len());
        if disk.write_synced(&dir.join(name), &[&contents]).is_err() {
            panic!("the in-memory disk refused a file");
        }
    }
    if disk.sync_dir(dir).is_err() {
        panic!("the in-memory disk refused a sync");
    }
    let options = StoreOptions::default()
        .with_direct_io(flags & 1 != 0)
        .with_commit_delay(Duration::ZERO)
        .with_disk(Arc::new(disk.clone()));
    let store = match EmbeddedStore::open(dir, options.clone()) {
        Ok(store) => store,
        Err(OpenError::Corrupt { path, offset, .. }) => {
            let name = path
                .strip_prefix(dir)
                .ok()
                .and_then(|p| p.to_str())
                .unwrap_or("");
            assert!(
                name == "wal" || name == "snapshot",
                "damage reported in {path:?}"
            );
            let size = sizes.get(name).copied().unwrap_or(0);
            assert!(
                offset as usize <= size,
                "damage at {offset} of {name}, {size} bytes long"
            );
            return;
        }
        Err(other) => panic!("open failed otherwise: {other}"),
    };
    let mut held = everything(&store);
    let probe = Txn {
        compares: Vec::new(),
        success: vec![Op::Put {
            key: Bytes::from_static(b"\xfffuzz-probe"),
            value: Bytes::from_static(b"written after the open"),
            lease: 0,
        }],
        failure: Vec::new(),
    };
    if let Err(e) = futures::executor::block_on(store.txn(probe)) {
        panic!("an opened store refused a write: {e:?}");
    }
    held.insert(
        Bytes::from_static(b"\xfffuzz-probe"),
        Bytes::from_static(b"written after the open"),
    );
    drop(store);
    disk.restart();
    let again = match EmbeddedStore::open(dir, options) {
        Ok(store) => store,
        Err(e) => panic!("the store opened, then did not open again: {e}"),
    };
    assert_eq!(everything(&again), held, "the second open differs");
}
