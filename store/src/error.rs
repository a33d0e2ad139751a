//! Errors of opening the embedded store.

use std::fmt;
use std::io;
use std::path::PathBuf;

use metropolis_core::store::{RecordError, StoreError};

/// Why [`EmbeddedStore::open`](super::EmbeddedStore::open) failed. The
/// store never starts over an unreadable directory: it does not reset,
/// truncate or rewrite anything acknowledged.
#[derive(Debug)]
#[non_exhaustive]
pub enum OpenError {
    /// A file system operation failed.
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What was being done ("create directory", "read", …).
        action: &'static str,
        /// The error.
        source: io::Error,
    },
    /// Another process (or another `EmbeddedStore` of this process) has
    /// the directory open.
    Locked {
        /// The lock file that is held.
        path: PathBuf,
    },
    /// A store file is damaged or inconsistent.
    Corrupt {
        /// The file.
        path: PathBuf,
        /// Byte offset in the file where the damage was found.
        offset: u64,
        /// What is wrong.
        problem: Corruption,
    },
}

/// What is wrong with a damaged store file.
#[derive(Debug)]
#[non_exhaustive]
pub enum Corruption {
    /// The file does not start with the expected magic bytes.
    BadMagic,
    /// The file was written in a format version this build cannot read.
    UnsupportedVersion {
        /// The version found.
        found: u32,
        /// The newest version this build reads.
        supported: u32,
    },
    /// The file ends before its header does.
    ShortHeader,
    /// A checksum does not match the data it covers.
    ChecksumMismatch {
        /// The checksum stored in the file.
        stored: u32,
        /// The checksum of the data read.
        computed: u32,
    },
    /// A snapshot's length does not match the file's.
    BadLength {
        /// The length field.
        declared: u64,
        /// Bytes actually present.
        present: u64,
    },
    /// A record of zero length that is not part of a zero-filled tail.
    EmptyRecord,
    /// A WAL batch header has bad magic bytes, a bad checksum or an
    /// impossible length, and a valid batch follows it.
    BadBatchHeader,
    /// The checksum matches but the data cannot be decoded.
    Undecodable(RecordError),
    /// A record decodes but cannot be applied to the state before it.
    Inconsistent(StoreError),
    /// The WAL and the snapshot do not fit together: records between them
    /// are missing.
    MissingRecords {
        /// Last record contained in the snapshot (0: no snapshot).
        snapshot_seq: u64,
        /// First record of the WAL.
        wal_first_seq: u64,
    },
    /// The WAL file is missing although a snapshot exists.
    MissingWal,
}

impl fmt::Display for Corruption {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Corruption::BadMagic => write!(f, "not a store file (bad magic bytes)"),
            Corruption::UnsupportedVersion { found, supported } => {
                write!(
                    f,
                    "format version {found} is not supported (this build reads versions up to {supported})"
                )
            }
            Corruption::ShortHeader => write!(f, "the file is shorter than its header"),
            Corruption::ChecksumMismatch { stored, computed } => write!(
                f,
                "checksum mismatch (stored {stored:#010x}, computed {computed:#010x})"
            ),
            Corruption::BadLength { declared, present } => {
                write!(
                    f,
                    "length field says {declared} bytes but {present} are present"
                )
            }
            Corruption::EmptyRecord => write!(f, "zero-length record followed by data"),
            Corruption::BadBatchHeader => write!(
                f,
                "damaged batch header (bad magic bytes, checksum or length) followed by valid batches"
            ),
            Corruption::Undecodable(e) => write!(f, "record cannot be decoded: {e}"),
            Corruption::Inconsistent(e) => {
                write!(f, "record does not apply to the state before it: {e}")
            }
            Corruption::MissingRecords {
                snapshot_seq,
                wal_first_seq,
            } => write!(
                f,
                "the WAL starts at record {wal_first_seq} but the snapshot ends at record {snapshot_seq}: records are missing"
            ),
            Corruption::MissingWal => write!(f, "the WAL file is missing but a snapshot exists"),
        }
    }
}

impl fmt::Display for OpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OpenError::Io {
                path,
                action,
                source,
            } => {
                write!(
                    f,
                    "cannot open the store: {action} {}: {source}",
                    path.display()
                )
            }
            OpenError::Locked { path } => write!(
                f,
                "the store directory is in use by another process (lock file {} is held); refusing to start",
                path.display()
            ),
            OpenError::Corrupt {
                path,
                offset,
                problem,
            } => write!(
                f,
                "store file {} is corrupt at byte offset {offset}: {problem}; refusing to start \
                 (nothing was changed: restore the directory from a backup, or move it aside to start empty)",
                path.display()
            ),
        }
    }
}

impl std::error::Error for OpenError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            OpenError::Io { source, .. } => Some(source),
            OpenError::Corrupt {
                problem: Corruption::Undecodable(e),
                ..
            } => Some(e),
            OpenError::Corrupt {
                problem: Corruption::Inconsistent(e),
                ..
            } => Some(e),
            _ => None,
        }
    }
}

/// Shorthand for an [`OpenError::Io`] mapper.
pub(crate) fn io_err(
    path: &std::path::Path,
    action: &'static str,
) -> impl FnOnce(io::Error) -> OpenError {
    let path = path.to_path_buf();
    move |source| OpenError::Io {
        path,
        action,
        source,
    }
}
