//! The embedded store refuses damaged files, and recovers a torn tail.

#![allow(clippy::unwrap_used)]

mod common;

use std::io::Write;
use std::path::Path;

use common::*;
use metropolis_core::store::{KeyValue, Revision};
use metropolis_host::store::{Corruption, EmbeddedStore, OpenError, StoreOptions};

/// A store with `n` committed puts, closed; returns its state.
fn populate(dir: &Path, n: usize, options: StoreOptions) -> (Revision, Vec<KeyValue>) {
    let store = EmbeddedStore::open(dir, options).unwrap();
    for i in 0..n {
        block_on(store.txn(put(&format!("key{}", i % 10), &format!("value-{i}")))).unwrap();
    }
    let state = dump(&store);
    store.close().unwrap();
    state
}

fn flip(path: &Path, offset: u64) {
    let mut data = std::fs::read(path).unwrap();
    data[offset as usize] ^= 0x40;
    std::fs::write(path, data).unwrap();
}

/// Opening must fail with `Corrupt` naming `file`, and change nothing.
fn assert_refused(dir: &Path, file: &str) -> (u64, Corruption) {
    let path = dir.join(file);
    let bytes = std::fs::read(&path).unwrap();
    let err = EmbeddedStore::open(dir, StoreOptions::default()).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains(&path.display().to_string()), "{msg}");
    assert!(msg.contains("refusing to start"), "{msg}");
    assert!(msg.contains("byte offset"), "{msg}");
    assert_eq!(
        std::fs::read(&path).unwrap(),
        bytes,
        "a refused open changes nothing"
    );
    match err {
        OpenError::Corrupt {
            path: p,
            offset,
            problem,
        } => {
            assert_eq!(p, path);
            (offset, problem)
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn torn_final_record_is_cut_off() {
    let dir = tempfile::tempdir().unwrap();
    let state = populate(dir.path(), 20, StoreOptions::default());
    let wal = dir.path().join("wal");
    let len = std::fs::metadata(&wal).unwrap().len();

    // A frame header announcing 100 bytes, followed by only 10.
    let mut f = std::fs::OpenOptions::new().append(true).open(&wal).unwrap();
    f.write_all(&100u32.to_le_bytes()).unwrap();
    f.write_all(&[0xAB; 14]).unwrap();
    drop(f);
    let store = EmbeddedStore::open(dir.path(), StoreOptions::default()).unwrap();
    assert_eq!(dump(&store), state);
    assert_eq!(
        std::fs::metadata(&wal).unwrap().len(),
        len,
        "the torn tail was cut off"
    );
    block_on(store.txn(put("more", "1"))).unwrap();
    drop(store);

    // A final record cut in the middle: that record (never acknowledged in
    // a real crash) is lost, everything before it is kept.
    let len = std::fs::metadata(&wal).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&wal)
        .unwrap()
        .set_len(len - 3)
        .unwrap();
    let store = EmbeddedStore::open(dir.path(), StoreOptions::default()).unwrap();
    assert_eq!(dump(&store), state);
    drop(store);

    // A zero-filled tail (space allocated, data never written).
    let mut f = std::fs::OpenOptions::new().append(true).open(&wal).unwrap();
    f.write_all(&[0; 4096]).unwrap();
    drop(f);
    let store = EmbeddedStore::open(dir.path(), StoreOptions::default()).unwrap();
    assert_eq!(dump(&store), state);
    // A header cut short in the frame header: also torn.
    drop(store);
    let mut f = std::fs::OpenOptions::new().append(true).open(&wal).unwrap();
    f.write_all(&[5, 0, 0]).unwrap();
    drop(f);
    let store = EmbeddedStore::open(dir.path(), StoreOptions::default()).unwrap();
    assert_eq!(dump(&store), state);
}

#[test]
fn flipped_byte_in_the_middle_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    populate(dir.path(), 50, StoreOptions::default());
    let wal = dir.path().join("wal");
    let len = std::fs::metadata(&wal).unwrap().len();
    flip(&wal, len / 2);
    let (offset, problem) = assert_refused(dir.path(), "wal");
    assert!(offset <= len / 2 && offset > 0);
    assert!(
        matches!(problem, Corruption::ChecksumMismatch { .. }),
        "{problem:?}"
    );
}

#[test]
fn damaged_length_field_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    populate(dir.path(), 50, StoreOptions::default());
    // The first frame's length field, made huge: not a torn write.
    let wal = dir.path().join("wal");
    flip(&wal, 24 + 3);
    let (offset, problem) = assert_refused(dir.path(), "wal");
    assert_eq!(offset, 24);
    assert!(
        matches!(problem, Corruption::BadLength { .. }),
        "{problem:?}"
    );
    // Or made larger than the rest of the file: a valid frame after it
    // shows this is not a torn final write.
    let mut data = std::fs::read(&wal).unwrap();
    data[24 + 3] ^= 0x40;
    data[24 + 1] ^= 0x40;
    std::fs::write(&wal, data).unwrap();
    let (offset, problem) = assert_refused(dir.path(), "wal");
    assert_eq!(offset, 24);
    assert!(
        matches!(problem, Corruption::BadLength { .. }),
        "{problem:?}"
    );
    // Or made zero, with data after it.
    let mut data = std::fs::read(&wal).unwrap();
    data[24..28].copy_from_slice(&[0, 0, 0, 0]);
    std::fs::write(&wal, data).unwrap();
    let (_, problem) = assert_refused(dir.path(), "wal");
    assert!(matches!(problem, Corruption::EmptyRecord), "{problem:?}");
}

#[test]
fn corrupt_headers_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    populate(dir.path(), 5, StoreOptions::default());
    let wal = dir.path().join("wal");
    let original = std::fs::read(&wal).unwrap();

    flip(&wal, 0);
    let (offset, problem) = assert_refused(dir.path(), "wal");
    assert_eq!(offset, 0);
    assert!(matches!(problem, Corruption::BadMagic), "{problem:?}");

    std::fs::write(&wal, &original).unwrap();
    flip(&wal, 13); // first sequence number
    let (_, problem) = assert_refused(dir.path(), "wal");
    assert!(
        matches!(problem, Corruption::ChecksumMismatch { .. }),
        "{problem:?}"
    );

    let mut future = original.clone();
    future[8] = 9;
    std::fs::write(&wal, &future).unwrap();
    let (offset, problem) = assert_refused(dir.path(), "wal");
    assert_eq!(offset, 8);
    assert!(
        matches!(
            problem,
            Corruption::UnsupportedVersion {
                found: 9,
                supported: 1
            }
        ),
        "{problem:?}"
    );

    std::fs::write(&wal, &original[..10]).unwrap();
    let (_, problem) = assert_refused(dir.path(), "wal");
    assert!(matches!(problem, Corruption::ShortHeader), "{problem:?}");

    std::fs::write(&wal, &original).unwrap();
    EmbeddedStore::open(dir.path(), StoreOptions::default()).unwrap();
}

#[test]
fn corrupt_snapshot_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let options = StoreOptions::default().with_snapshot_threshold(2048);
    let state = populate(dir.path(), 200, options.clone());
    let snapshot = dir.path().join("snapshot");
    let original = std::fs::read(&snapshot).unwrap();

    flip(&snapshot, original.len() as u64 - 5);
    let (_, problem) = assert_refused(dir.path(), "snapshot");
    assert!(
        matches!(problem, Corruption::ChecksumMismatch { .. }),
        "{problem:?}"
    );

    std::fs::write(&snapshot, &original[..original.len() - 1]).unwrap();
    let (_, problem) = assert_refused(dir.path(), "snapshot");
    assert!(
        matches!(problem, Corruption::BadLength { .. }),
        "{problem:?}"
    );

    std::fs::write(&snapshot, &original).unwrap();
    let store = EmbeddedStore::open(dir.path(), options).unwrap();
    assert_eq!(dump(&store), state);
}

#[test]
fn missing_wal_next_to_a_snapshot_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let options = StoreOptions::default().with_snapshot_threshold(2048);
    populate(dir.path(), 200, options);
    std::fs::remove_file(dir.path().join("wal")).unwrap();
    let err = EmbeddedStore::open(dir.path(), StoreOptions::default()).unwrap_err();
    assert!(
        matches!(
            err,
            OpenError::Corrupt {
                problem: Corruption::MissingWal,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("refusing to start"));
}
