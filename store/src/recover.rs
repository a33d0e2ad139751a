//! Recovery at open: the snapshot loaded, the WAL replayed, a torn final
//! batch zeroed.

use std::io;
use std::path::Path;

use metropolis_core::store::MemStore;
use metropolis_core::time::Instant;

use super::aligned::round_down;
use super::disk::Disk;
use super::error::{Corruption, OpenError, io_err};
use super::wal::{self, FORMAT_VERSION_1, Wal};
use super::{snapshot, wal_read};

/// The state rebuilt from the directory.
pub(super) struct Recovered {
    pub(super) mem: MemStore,
    /// Sequence number of the last record in the state.
    pub(super) last_seq: u64,
    /// The WAL, open for appending.
    pub(super) wal: Wal,
    /// Number of WAL records applied.
    pub(super) replayed: usize,
}

/// Loads the snapshot and replays the WAL of `dir`; zeroes a torn final
/// batch (or, in a version 1 WAL, ignores a torn tail); creates the WAL of
/// a fresh directory.
/// A version 1 WAL is replaced by a snapshot and a fresh version 2 WAL.
/// `direct`: see [`StoreOptions::direct_io`].
pub(super) fn recover(
    disk: &dyn Disk,
    dir: &Path,
    now: Instant,
    direct: bool,
) -> Result<Recovered, OpenError> {
    let snap = snapshot::read(disk, dir)?;
    let (mut mem, snapshot_seq) = match snap {
        Some((seq, snap)) => (MemStore::from_snapshot(snap, now), seq),
        None => (MemStore::new(), 0),
    };
    let wal_path = wal::path(dir);
    let read = disk.read(&wal_path);
    let read = if canary_planted!(ReadErrorAsMissing) {
        Ok(read.unwrap_or(None))
    } else {
        read
    };
    let Some(data) = read.map_err(io_err(&wal_path, "read"))? else {
        if snapshot_seq != 0 {
            return Err(OpenError::Corrupt {
                path: wal_path,
                offset: 0,
                problem: Corruption::MissingWal,
            });
        }
        let wal = Wal::create(disk, dir, 1, direct).map_err(io_err(&wal_path, "create"))?;
        return Ok(Recovered {
            mem,
            last_seq: 0,
            wal,
            replayed: 0,
        });
    };
    let contents = match wal_read::read(&wal_path, &data) {
        Ok(contents) => contents,
        Err(damaged) => {
            read_back_the_same(disk, &wal_path, &data)?;
            return Err(damaged);
        }
    };
    if contents.torn_len > 0 && !canary_planted!(RepairOnOneRead) {
        // Repairing a torn final batch zeroes it durably: only when a
        // second read shows the same bytes, so that a sector misread there
        // once does not erase an acknowledged batch.
        read_back_the_same(disk, &wal_path, &data)?;
    }
    // Within `data`, as the reader measured it; a mismatch fails the
    // reopen below.
    let tail = data
        .get(round_down(contents.valid_len) as usize..contents.valid_len as usize)
        .map(<[u8]>::to_vec)
        .unwrap_or_default();
    drop(data);
    if contents.first_seq == 0 || contents.first_seq > snapshot_seq + 1 {
        return Err(OpenError::Corrupt {
            path: wal_path,
            offset: 0,
            problem: Corruption::MissingRecords {
                snapshot_seq,
                wal_first_seq: contents.first_seq,
            },
        });
    }
    let mut replayed = 0;
    let mut seq = contents.first_seq;
    for (offset, record) in &contents.records {
        if seq > snapshot_seq {
            mem.apply(record, now).map_err(|e| OpenError::Corrupt {
                path: wal_path.clone(),
                offset: *offset,
                problem: Corruption::Inconsistent(e),
            })?;
            replayed += 1;
        }
        seq += 1;
    }
    let last_in_wal = seq - 1;
    if contents.torn_len > 0 {
        tracing::warn!(
            "{}: discarding {} bytes at offset {}: an unfinished write from a crash, never acknowledged",
            wal_path.display(),
            contents.torn_len,
            contents.valid_len
        );
    }
    let wal = if last_in_wal <= snapshot_seq {
        // Everything in the WAL is in the snapshot (a crash between writing
        // a snapshot and starting the next WAL): start the next WAL now.
        Wal::create(disk, dir, snapshot_seq + 1, direct).map_err(io_err(&wal_path, "create"))?
    } else if contents.version == FORMAT_VERSION_1 {
        // A WAL of the first format: its records go into a snapshot, and
        // the log continues in the current format.
        snapshot::write(disk, dir, last_in_wal, &mem.snapshot())
            .map_err(io_err(&snapshot::path(dir), "write"))?;
        tracing::info!(
            "{}: converted a version 1 WAL (records up to {last_in_wal}) into a snapshot and a version {} WAL",
            wal_path.display(),
            wal::FORMAT_VERSION
        );
        Wal::create(disk, dir, last_in_wal + 1, direct).map_err(io_err(&wal_path, "create"))?
    } else {
        Wal::reopen(
            disk,
            &wal_path,
            contents.valid_len,
            contents.valid_len + contents.torn_len,
            &tail,
            direct,
        )
        .map_err(io_err(&wal_path, "reopen"))?
    };
    Ok(Recovered {
        mem,
        last_seq: last_in_wal.max(snapshot_seq),
        wal,
        replayed,
    })
}

/// Reads `path` again after its bytes `first` looked damaged or torn:
/// the same bytes confirm what the first read showed; other bytes (or
/// none) mean the device, its link or memory returned wrong bytes, an I/O
/// error: nothing is repaired or refused on such a read.
pub(super) fn read_back_the_same(
    disk: &dyn Disk,
    path: &Path,
    first: &[u8],
) -> Result<(), OpenError> {
    match disk.read(path).map_err(io_err(path, "read again"))? {
        Some(again) if again == first => Ok(()),
        _ => Err(OpenError::Io {
            path: path.to_path_buf(),
            action: "read",
            source: io::Error::new(
                io::ErrorKind::InvalidData,
                "two reads returned different bytes (a failing device, cable or memory); nothing was changed",
            ),
        }),
    }
}
