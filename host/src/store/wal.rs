//! The write-ahead log file: a header, then checksummed record frames.
//!
//! ```text
//! header (24 bytes):  magic "MTRPWAL\n" | u32 format version | u64 first record seq | u32 CRC-32C of the 20 bytes before
//! frame, repeated:    u32 payload length | u32 CRC-32C of payload | payload (an encoded Record)
//! ```
//!
//! All integers are little-endian. Record sequence numbers are implicit:
//! the n-th frame (from 0) holds record `first_seq + n`.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use metropolis_core::store::{Record, decode_record};

use super::crc::crc32c;
use super::error::{Corruption, OpenError, io_err};

/// Name of the WAL file in the store directory.
pub(crate) const WAL_FILE: &str = "wal";
/// Name of the WAL being created, before it is renamed over [`WAL_FILE`].
pub(crate) const WAL_TMP_FILE: &str = "wal.tmp";
/// Magic bytes at the start of a WAL file.
const MAGIC: [u8; 8] = *b"MTRPWAL\n";
/// The WAL format version this build writes and reads.
pub(crate) const FORMAT_VERSION: u32 = 1;
/// Length of the header.
pub(crate) const HEADER_LEN: u64 = 24;
/// Length of a frame header.
pub(crate) const FRAME_HEADER_LEN: usize = 8;
/// The largest record payload written or accepted (64 MiB). A larger length
/// field is damage, not a torn write.
pub(crate) const MAX_RECORD_LEN: usize = 64 << 20;

/// An empty frame with room for a payload of `payload_len` bytes: its
/// header is reserved, for [`seal_frame`] to fill once the payload has been
/// appended.
pub(crate) fn start_frame(payload_len: usize) -> Vec<u8> {
    let mut frame = Vec::with_capacity(FRAME_HEADER_LEN + payload_len);
    frame.extend_from_slice(&[0; FRAME_HEADER_LEN]);
    frame
}

/// Fills the header of a frame from [`start_frame`] whose payload has been
/// appended: length and checksum.
pub(crate) fn seal_frame(frame: &mut [u8]) {
    let (header, payload) = frame.split_at_mut(FRAME_HEADER_LEN);
    debug_assert!(
        payload.len() <= MAX_RECORD_LEN,
        "records are limited in size"
    );
    header[..4].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    header[4..].copy_from_slice(&crc32c(payload).to_le_bytes());
}

/// One frame holding `payload`.
pub(crate) fn frame(payload: &[u8]) -> Vec<u8> {
    let mut frame = start_frame(payload.len());
    frame.extend_from_slice(payload);
    seal_frame(&mut frame);
    frame
}

/// Opens `path` for writing, creating it with mode 0600.
fn create_file(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
}

/// Makes renames and creations in `dir` durable.
pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// The open WAL, appended to by the writer thread.
#[derive(Debug)]
pub(crate) struct Wal {
    file: File,
    size: u64,
}

impl Wal {
    /// Creates a fresh, empty WAL whose first record will be `first_seq`,
    /// atomically replacing any WAL in `dir`: [`prepare`](Self::prepare)
    /// then [`install`](Self::install).
    pub(crate) fn create(dir: &Path, first_seq: u64) -> io::Result<Wal> {
        let wal = Wal::prepare(dir, first_seq)?;
        wal.install(dir)?;
        Ok(wal)
    }

    /// Writes a fresh, empty WAL whose first record will be `first_seq` to
    /// a temporary file, and syncs it. Nothing changes under the WAL's
    /// name yet.
    pub(crate) fn prepare(dir: &Path, first_seq: u64) -> io::Result<Wal> {
        let mut file = create_file(&dir.join(WAL_TMP_FILE))?;
        let mut header = Vec::with_capacity(HEADER_LEN as usize);
        header.extend_from_slice(&MAGIC);
        header.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        header.extend_from_slice(&first_seq.to_le_bytes());
        let crc = crc32c(&header);
        header.extend_from_slice(&crc.to_le_bytes());
        file.write_all(&header)?;
        file.sync_all()?;
        Ok(Wal {
            file,
            size: HEADER_LEN,
        })
    }

    /// Renames a prepared WAL over the WAL of `dir`, and syncs the
    /// directory.
    pub(crate) fn install(&self, dir: &Path) -> io::Result<()> {
        std::fs::rename(dir.join(WAL_TMP_FILE), dir.join(WAL_FILE))?;
        sync_dir(dir)
    }

    /// Opens an existing WAL for appending after its first `valid_len`
    /// bytes, cutting anything after them (a torn write) durably.
    pub(crate) fn reopen(path: &Path, valid_len: u64) -> io::Result<Wal> {
        let mut file = OpenOptions::new().write(true).open(path)?;
        if file.metadata()?.len() != valid_len {
            file.set_len(valid_len)?;
            file.sync_all()?;
        }
        file.seek(SeekFrom::Start(valid_len))?;
        Ok(Wal {
            file,
            size: valid_len,
        })
    }

    /// Appends already framed records and makes them durable (one
    /// `fdatasync`).
    pub(crate) fn append(&mut self, frames: &[u8]) -> io::Result<()> {
        self.file.write_all(frames)?;
        self.file.sync_data()?;
        self.size += frames.len() as u64;
        Ok(())
    }

    /// Bytes in the file.
    pub(crate) fn size(&self) -> u64 {
        self.size
    }
}

/// What [`read`] found in a WAL file.
#[derive(Debug)]
pub(crate) struct WalContents {
    /// Sequence number of the first record.
    pub(crate) first_seq: u64,
    /// The records, with the byte offset of their frame.
    pub(crate) records: Vec<(u64, Record)>,
    /// Bytes of header and whole, valid frames.
    pub(crate) valid_len: u64,
    /// Bytes after them: a torn final write, to be cut off.
    pub(crate) torn_len: u64,
}

/// Reads and checks a whole WAL file. A final frame cut short (by a crash
/// during its write, so never acknowledged) or a zero-filled tail is
/// reported in `torn_len`; any other damage is an error naming the offset.
pub(crate) fn read(path: &Path) -> Result<WalContents, OpenError> {
    let mut data = Vec::new();
    File::open(path)
        .and_then(|mut f| f.read_to_end(&mut data))
        .map_err(io_err(path, "read"))?;
    let corrupt = |offset: u64, problem| OpenError::Corrupt {
        path: path.to_path_buf(),
        offset,
        problem,
    };
    let first_seq = parse_header(&data).map_err(|(offset, problem)| corrupt(offset, problem))?;
    let mut records = Vec::new();
    let mut pos = HEADER_LEN as usize;
    let torn_at = loop {
        let rest = &data[pos..];
        if rest.is_empty() {
            break None;
        }
        if rest.len() < FRAME_HEADER_LEN {
            break Some(pos);
        }
        let len = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        let stored = u32::from_le_bytes([rest[4], rest[5], rest[6], rest[7]]);
        if len == 0 {
            if rest.iter().all(|b| *b == 0) {
                break Some(pos);
            }
            return Err(corrupt(pos as u64, Corruption::EmptyRecord));
        }
        if len > MAX_RECORD_LEN {
            return Err(corrupt(
                pos as u64,
                Corruption::BadLength {
                    declared: len as u64,
                    present: (rest.len() - 8) as u64,
                },
            ));
        }
        if rest.len() - FRAME_HEADER_LEN < len {
            // The frame runs past the end of the file: a torn final write,
            // unless a whole valid frame follows its header, which proves
            // the length field itself is damaged.
            if let Some(next) = find_frame(&data, pos + FRAME_HEADER_LEN) {
                return Err(corrupt(
                    pos as u64,
                    Corruption::BadLength {
                        declared: len as u64,
                        present: (next - pos - FRAME_HEADER_LEN) as u64,
                    },
                ));
            }
            break Some(pos);
        }
        let payload = &rest[FRAME_HEADER_LEN..FRAME_HEADER_LEN + len];
        let computed = crc32c(payload);
        if computed != stored {
            return Err(corrupt(
                pos as u64,
                Corruption::ChecksumMismatch { stored, computed },
            ));
        }
        let record =
            decode_record(payload).map_err(|e| corrupt(pos as u64, Corruption::Undecodable(e)))?;
        records.push((pos as u64, record));
        pos += FRAME_HEADER_LEN + len;
    };
    let valid_len = torn_at.unwrap_or(data.len()) as u64;
    Ok(WalContents {
        first_seq,
        records,
        valid_len,
        torn_len: data.len() as u64 - valid_len,
    })
}

/// The offset of the first whole frame with a matching checksum starting
/// at or after `from`, if any. A torn final write has no frame after it;
/// random bytes match a checksum once in 2^32 tries.
fn find_frame(data: &[u8], from: usize) -> Option<usize> {
    (from..data.len().saturating_sub(FRAME_HEADER_LEN)).find(|&p| {
        let len = u32::from_le_bytes([data[p], data[p + 1], data[p + 2], data[p + 3]]) as usize;
        let start = p + FRAME_HEADER_LEN;
        if len == 0 || len > MAX_RECORD_LEN || len > data.len() - start {
            return false;
        }
        let stored = u32::from_le_bytes([data[p + 4], data[p + 5], data[p + 6], data[p + 7]]);
        crc32c(&data[start..start + len]) == stored
    })
}

/// Checks the header; returns the first record's sequence number, or the
/// offset and nature of the damage.
fn parse_header(data: &[u8]) -> Result<u64, (u64, Corruption)> {
    if data.len() < HEADER_LEN as usize {
        // A header is written whole to a temporary file before the WAL
        // exists under its name, so a short one is damage.
        if !MAGIC.starts_with(&data[..data.len().min(8)]) {
            return Err((0, Corruption::BadMagic));
        }
        return Err((0, Corruption::ShortHeader));
    }
    if data[..8] != MAGIC {
        return Err((0, Corruption::BadMagic));
    }
    let version = u32::from_le_bytes([data[8], data[9], data[10], data[11]]);
    if version != FORMAT_VERSION {
        return Err((
            8,
            Corruption::UnsupportedVersion {
                found: version,
                supported: FORMAT_VERSION,
            },
        ));
    }
    let stored = u32::from_le_bytes([data[20], data[21], data[22], data[23]]);
    let computed = crc32c(&data[..20]);
    if stored != computed {
        return Err((20, Corruption::ChecksumMismatch { stored, computed }));
    }
    let mut seq = [0u8; 8];
    seq.copy_from_slice(&data[12..20]);
    Ok(u64::from_le_bytes(seq))
}

/// The path of the WAL in `dir`.
pub(crate) fn path(dir: &Path) -> PathBuf {
    dir.join(WAL_FILE)
}
