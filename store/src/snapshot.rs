//! The snapshot file: the whole store state as of one WAL record.
//!
//! ```text
//! magic "MTRPSNAP" | u32 format version | u64 last record seq | u64 payload length | u32 CRC-32C | payload
//! ```
//!
//! The CRC covers the 28 header bytes before it and the payload (an encoded
//! [`Snapshot`]). All integers are little-endian. A snapshot is written to a
//! temporary file, synced, renamed over the previous one and the directory
//! synced, so the file under its name is always whole.

use std::io;
use std::path::{Path, PathBuf};

use metropolis_core::store::{Snapshot, decode_snapshot, encode_snapshot};

use super::crc::Crc32c;
use super::disk::Disk;
use super::error::{Corruption, OpenError, io_err};

/// Name of the snapshot file in the store directory.
pub(crate) const SNAPSHOT_FILE: &str = "snapshot";
/// Name of a snapshot being written.
pub(crate) const SNAPSHOT_TMP_FILE: &str = "snapshot.tmp";
const MAGIC: [u8; 8] = *b"MTRPSNAP";
const HEADER_LEN: usize = 28;
/// The snapshot format version this build writes and reads.
const FORMAT_VERSION: u32 = 1;

/// The path of the snapshot in `dir`.
pub(crate) fn path(dir: &Path) -> PathBuf {
    dir.join(SNAPSHOT_FILE)
}

/// Writes `snapshot`, which contains every record up to `last_seq`, and
/// makes it the directory's snapshot, durably.
pub(crate) fn write(
    disk: &dyn Disk,
    dir: &Path,
    last_seq: u64,
    snapshot: &Snapshot,
) -> io::Result<u64> {
    let (header, payload) = encode(last_seq, snapshot);
    let tmp = dir.join(SNAPSHOT_TMP_FILE);
    disk.write_synced(&tmp, &[&header, &payload])?;
    disk.rename(&tmp, &path(dir))?;
    disk.sync_dir(dir)?;
    Ok((header.len() + payload.len()) as u64)
}

/// The snapshot file of `snapshot`, which holds every record up to
/// `last_seq`: its header (with the checksum) and its payload.
pub(crate) fn encode(last_seq: u64, snapshot: &Snapshot) -> (Vec<u8>, Vec<u8>) {
    let payload = encode_snapshot(snapshot);
    let mut header = Vec::with_capacity(HEADER_LEN + 4);
    header.extend_from_slice(&MAGIC);
    header.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    header.extend_from_slice(&last_seq.to_le_bytes());
    header.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    let crc = Crc32c::new().update(&header).update(&payload).finish();
    header.extend_from_slice(&crc.to_le_bytes());
    (header, payload)
}

/// Reads the snapshot of `dir`, if there is one: the sequence number of the
/// last record it contains, and the state.
pub(crate) fn read(disk: &dyn Disk, dir: &Path) -> Result<Option<(u64, Snapshot)>, OpenError> {
    let path = path(dir);
    let Some(data) = disk.read(&path).map_err(io_err(&path, "read"))? else {
        return Ok(None);
    };
    match decode(&path, &data) {
        Ok(snapshot) => Ok(Some(snapshot)),
        Err(damaged) => {
            // Refused as damaged only if a second read agrees.
            super::recover::read_back_the_same(disk, &path, &data)?;
            Err(damaged)
        }
    }
}

/// Checks and decodes the snapshot file `data`, read from `path`: the
/// sequence number of the last record it contains, and the state.
pub(crate) fn decode(path: &Path, data: &[u8]) -> Result<(u64, Snapshot), OpenError> {
    let corrupt = |offset: u64, problem| OpenError::Corrupt {
        path: path.to_path_buf(),
        offset,
        problem,
    };
    if data.len() < HEADER_LEN + 4 {
        return Err(corrupt(0, Corruption::ShortHeader));
    }
    if data[..8] != MAGIC {
        return Err(corrupt(0, Corruption::BadMagic));
    }
    let u32_at =
        |at: usize| u32::from_le_bytes([data[at], data[at + 1], data[at + 2], data[at + 3]]);
    let u64_at = |at: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&data[at..at + 8]);
        u64::from_le_bytes(b)
    };
    let version = u32_at(8);
    if version != FORMAT_VERSION {
        return Err(corrupt(
            8,
            Corruption::UnsupportedVersion {
                found: version,
                supported: FORMAT_VERSION,
            },
        ));
    }
    let last_seq = u64_at(12);
    let declared = u64_at(20);
    let payload = &data[HEADER_LEN + 4..];
    if declared != payload.len() as u64 {
        return Err(corrupt(
            20,
            Corruption::BadLength {
                declared,
                present: payload.len() as u64,
            },
        ));
    }
    let stored = u32_at(HEADER_LEN);
    let computed = Crc32c::new()
        .update(&data[..HEADER_LEN])
        .update(payload)
        .finish();
    if stored != computed {
        return Err(corrupt(
            HEADER_LEN as u64,
            Corruption::ChecksumMismatch { stored, computed },
        ));
    }
    let snapshot = decode_snapshot(payload)
        .map_err(|e| corrupt((HEADER_LEN + 4) as u64, Corruption::Undecodable(e)))?;
    Ok((last_seq, snapshot))
}
