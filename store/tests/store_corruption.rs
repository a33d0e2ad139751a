//! The embedded store refuses damaged files, and recovers a torn tail.

#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;

use common::*;
use metropolis_core::store::{KeyValue, Revision};
use metropolis_store::{Corruption, EmbeddedStore, OpenError, StoreOptions};

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

/// The WAL's batches, from the documented format (version 2): offset and
/// length of the frames of each.
fn batches(wal: &Path) -> Vec<(usize, usize)> {
    let data = std::fs::read(wal).unwrap();
    assert_eq!(&data[8..12], &2u32.to_le_bytes(), "a version 2 WAL");
    let mut out = Vec::new();
    let mut pos = 24;
    while &data[pos..pos + 4] == b"MTRB" {
        let len = u32::from_le_bytes(data[pos + 4..pos + 8].try_into().unwrap()) as usize;
        out.push((pos, len));
        pos += 16 + len;
    }
    assert!(data[pos..].iter().all(|b| *b == 0), "zeros after the log");
    out
}

/// Writes `bytes` over the WAL at `offset`.
fn overwrite(wal: &Path, offset: usize, bytes: &[u8]) {
    let mut data = std::fs::read(wal).unwrap();
    data[offset..offset + bytes.len()].copy_from_slice(bytes);
    std::fs::write(wal, data).unwrap();
}

/// A crash may leave any of the last, unacknowledged batch's 512-byte
/// sectors on disk and the others as they were (zeros): the open drops
/// that batch, keeps everything before it, zeroes the rest and goes on
/// appending.
#[test]
fn torn_final_batch_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let wal = dir.path().join("wal");
    let state = populate(dir.path(), 20, StoreOptions::default());
    let original = std::fs::read(&wal).unwrap();
    let store = EmbeddedStore::open(dir.path(), StoreOptions::default()).unwrap();
    block_on(store.txn(put("more", "x".repeat(5000).as_str()))).unwrap();
    store.close().unwrap();
    let (last, len) = *batches(&wal).last().unwrap();
    let end = last + 16 + len;

    let sector = |offset: usize| offset / 512 * 512;
    let tears = [
        (last, sector(last) + 512),                      // its header's sector
        (sector(last) + 512, end),                       // every sector after it
        (sector(last + 100) + 512, sector(last + 4200)), // some in the middle
        (sector(end - 1), end),                          // its last sector
    ];
    for (from, to) in tears {
        overwrite(&wal, from, &vec![0; to - from]);
        let store = EmbeddedStore::open(dir.path(), StoreOptions::default()).unwrap();
        assert_eq!(dump(&store), state, "tear {from}..{to}");
        drop(store);
        let data = std::fs::read(&wal).unwrap();
        assert!(
            data[last..].iter().all(|b| *b == 0),
            "the torn batch was zeroed"
        );
        assert_eq!(&data[..last], &original[..last]);
        // Put the batch back for the next tear.
        overwrite(&wal, last, &{
            let store = EmbeddedStore::open(dir.path(), StoreOptions::default()).unwrap();
            block_on(store.txn(put("more", "x".repeat(5000).as_str()))).unwrap();
            store.close().unwrap();
            std::fs::read(&wal).unwrap()[last..end].to_vec()
        });
    }

    // A batch's frames after the log without its header's sector (a torn
    // write that lost it): dropped too, and the store appends after its
    // last batch.
    let store = EmbeddedStore::open(dir.path(), StoreOptions::default()).unwrap();
    let with_more = dump(&store);
    drop(store);
    let frames_at = sector(end) + 512;
    overwrite(&wal, frames_at, &[0xAB; 700]);
    let store = EmbeddedStore::open(dir.path(), StoreOptions::default()).unwrap();
    assert_eq!(dump(&store), with_more);
    block_on(store.txn(put("after", "1"))).unwrap();
    store.close().unwrap();
    assert_eq!(batches(&wal).len(), 22, "20 + \"more\" + \"after\"");
}

/// A change to the last, acknowledged batch that no lost sector explains
/// (a byte flipped where every sector holds data) is damage: refused, not
/// dropped as a torn write. So is a batch header that does not check out
/// in a sector that was written.
#[test]
fn damage_to_the_last_batch_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    populate(dir.path(), 20, StoreOptions::default());
    let wal = dir.path().join("wal");
    let store = EmbeddedStore::open(dir.path(), StoreOptions::default()).unwrap();
    block_on(store.txn(put("last", "y".repeat(3000).as_str()))).unwrap();
    store.close().unwrap();
    let original = std::fs::read(&wal).unwrap();
    let (last, len) = *batches(&wal).last().unwrap();
    for byte in [last + 16 + len / 2, last + 16 + len - 1] {
        std::fs::write(&wal, &original).unwrap();
        flip(&wal, byte as u64);
        let (offset, problem) = assert_refused(dir.path(), "wal");
        assert_eq!(offset, last as u64);
        assert!(
            matches!(problem, Corruption::ChecksumMismatch { .. }),
            "{problem:?}"
        );
    }
    std::fs::write(&wal, &original).unwrap();
    flip(&wal, last as u64 + 5);
    let (offset, problem) = assert_refused(dir.path(), "wal");
    assert_eq!(offset, last as u64);
    assert!(matches!(problem, Corruption::BadBatchHeader), "{problem:?}");
    // Junk after the log that claims to be a batch, in a written sector.
    std::fs::write(&wal, &original).unwrap();
    let end = last + 16 + len;
    let mut junk = b"MTRB".to_vec();
    junk.extend_from_slice(&[0xAB; 40]);
    overwrite(&wal, end, &junk);
    let (offset, _) = assert_refused(dir.path(), "wal");
    assert_eq!(offset, end as u64);
}

#[test]
fn flipped_byte_in_the_middle_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    populate(dir.path(), 50, StoreOptions::default());
    let wal = dir.path().join("wal");
    let (at, len) = batches(&wal)[25];
    flip(&wal, (at + 16 + len / 2) as u64);
    let (offset, problem) = assert_refused(dir.path(), "wal");
    assert_eq!(offset, at as u64);
    assert!(
        matches!(problem, Corruption::ChecksumMismatch { .. }),
        "{problem:?}"
    );
}

#[test]
fn damaged_batch_header_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    populate(dir.path(), 50, StoreOptions::default());
    let wal = dir.path().join("wal");
    let original = std::fs::read(&wal).unwrap();
    let (at, _) = batches(&wal)[10];
    // Its length field, made huge: not a torn write, batches follow.
    for byte in [at, at + 7, at + 13] {
        std::fs::write(&wal, &original).unwrap();
        flip(&wal, byte as u64);
        let (offset, problem) = assert_refused(dir.path(), "wal");
        assert_eq!(offset, at as u64);
        assert!(matches!(problem, Corruption::BadBatchHeader), "{problem:?}");
    }
    // Or zeroed: a hole inside the log, not its end.
    std::fs::write(&wal, &original).unwrap();
    overwrite(&wal, at, &[0; 16]);
    let (offset, _) = assert_refused(dir.path(), "wal");
    assert_eq!(offset, at as u64);
}

/// A WAL of the first format (frames straight after the header) opens to
/// the same state, and is replaced by a snapshot and a current WAL.
#[test]
fn version_1_wal_is_read_and_converted() {
    let dir = tempfile::tempdir().unwrap();
    let state = populate(dir.path(), 30, StoreOptions::default());
    let wal = dir.path().join("wal");
    let data = std::fs::read(&wal).unwrap();
    // The same records as version 1: header with version 1 (and its CRC),
    // then the frames of every batch, then a torn frame.
    let mut v1 = data[..24].to_vec();
    v1[8..12].copy_from_slice(&1u32.to_le_bytes());
    let crc = crc32c(&v1[..20]);
    v1[20..24].copy_from_slice(&crc.to_le_bytes());
    for (at, len) in batches(&wal) {
        v1.extend_from_slice(&data[at + 16..at + 16 + len]);
    }
    v1.extend_from_slice(&[200, 0, 0, 0, 1, 2, 3]);
    std::fs::write(&wal, &v1).unwrap();

    let store = EmbeddedStore::open(dir.path(), StoreOptions::default()).unwrap();
    assert_eq!(dump(&store), state);
    block_on(store.txn(put("v2", "1"))).unwrap();
    let state = dump(&store);
    store.close().unwrap();
    assert!(dir.path().join("snapshot").exists());
    assert_eq!(
        batches(&wal).len(),
        1,
        "a fresh version 2 WAL after the snapshot"
    );
    let store = EmbeddedStore::open(dir.path(), StoreOptions::default()).unwrap();
    assert_eq!(dump(&store), state);
}

/// CRC-32C (Castagnoli), bitwise: the WAL header's checksum.
fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for byte in data {
        crc ^= u32::from(*byte);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// Without direct I/O (the fallback where the file system refuses it) the
/// same file is written.
#[test]
fn page_cache_writes_give_the_same_log() {
    let direct = tempfile::tempdir().unwrap();
    let cached = tempfile::tempdir().unwrap();
    let a = populate(direct.path(), 40, StoreOptions::default());
    let b = populate(
        cached.path(),
        40,
        StoreOptions::default().with_direct_io(false),
    );
    assert_eq!(a, b);
    assert_eq!(
        std::fs::read(direct.path().join("wal")).unwrap(),
        std::fs::read(cached.path().join("wal")).unwrap()
    );
    let store = EmbeddedStore::open(cached.path(), StoreOptions::default()).unwrap();
    assert_eq!(dump(&store), b);
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
                supported: 2
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
