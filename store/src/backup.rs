//! Backups of a running store and their restore into an empty directory,
//! as `etcdctl snapshot save` and `snapshot restore` do for etcd.
//!
//! A backup is the bytes of a snapshot file (see [`snapshot`](super::snapshot):
//! magic, format version, record sequence, CRC-32C, the encoded state),
//! taken at the latest revision and returned only once every change
//! applied before it is durable, so it never holds a write that could
//! still be lost. A restore checks those bytes (magic, version, checksum,
//! decoding) and writes them as the snapshot of an empty directory with
//! an empty WAL after it: the store then opens over it as over its own.

use std::fmt;
use std::path::{Path, PathBuf};

use futures::FutureExt;
use futures::future::BoxFuture;
use metropolis_core::store::{Revision, StoreError};

use super::error::OpenError;
use super::snapshot::SNAPSHOT_FILE;
use super::wal::{WAL_FILE, Wal};
use super::{EmbeddedStore, LOCK_FILE, StoreOptions, durable, snapshot};

/// A backup of a running store ([`EmbeddedStore::backup`]).
#[derive(Clone, Debug)]
pub struct Backup {
    /// The snapshot file's bytes.
    pub bytes: Vec<u8>,
    /// The store revision it holds.
    pub revision: Revision,
}

/// What [`restore`] wrote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Restored {
    /// The store revision the directory now holds.
    pub revision: Revision,
    /// How many keys.
    pub keys: usize,
}

/// Why [`restore`] refused.
#[derive(Debug)]
#[non_exhaustive]
pub enum RestoreError {
    /// The directory holds a store already (this file of it).
    NotEmpty {
        /// The store file found.
        path: PathBuf,
    },
    /// A store is open in the directory (this lock file is held).
    Locked {
        /// The lock file.
        path: PathBuf,
    },
    /// The backup is not a snapshot file this build reads (bad magic,
    /// another format version, a checksum mismatch, undecodable state).
    Invalid(OpenError),
    /// Writing the directory failed.
    Io {
        /// The directory.
        path: PathBuf,
        /// The failure.
        source: std::io::Error,
    },
}

impl fmt::Display for RestoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RestoreError::NotEmpty { path } => write!(
                f,
                "{} exists: restore only into an empty data directory",
                path.display()
            ),
            RestoreError::Locked { path } => write!(
                f,
                "{} is held: a daemon runs over this directory",
                path.display()
            ),
            RestoreError::Invalid(e) => write!(f, "not a backup this build restores: {e}"),
            RestoreError::Io { path, source } => write!(f, "{}: {source}", path.display()),
        }
    }
}

impl std::error::Error for RestoreError {}

impl EmbeddedStore {
    /// A backup of the store at its latest revision, returned once every
    /// change applied up to it is durable. Unavailable if the store has
    /// failed or is closed.
    pub fn backup(&self) -> BoxFuture<'static, Result<Backup, StoreError>> {
        let mut state = self.shared.lock();
        if let Err(e) = state.check_open() {
            return futures::future::ready(Err(e)).boxed();
        }
        let state_now = state.mem.snapshot();
        let revision = state.mem.revision();
        let last_seq = state.next_seq - 1;
        let rx = state.barrier();
        drop(state);
        async move {
            durable(rx).await?;
            let (mut bytes, payload) = snapshot::encode(last_seq, &state_now);
            bytes.extend_from_slice(&payload);
            Ok(Backup { bytes, revision })
        }
        .boxed()
    }
}

impl metropolis_core::ports::StoreBackup for EmbeddedStore {
    fn backup(&self) -> BoxFuture<'static, Result<(Vec<u8>, Revision), StoreError>> {
        EmbeddedStore::backup(self)
            .map(|r| r.map(|b| (b.bytes, b.revision)))
            .boxed()
    }
}

/// Writes `backup` (the bytes of [`EmbeddedStore::backup`]) as the store
/// of `dir`, which must hold no store yet (it is created, mode 0700, if
/// missing), on `options`' disk. The store then opens over it.
pub fn restore(
    dir: &Path,
    backup: &[u8],
    options: &StoreOptions,
) -> Result<Restored, RestoreError> {
    let (last_seq, state) =
        snapshot::decode(Path::new("backup"), backup).map_err(RestoreError::Invalid)?;
    let disk = options.disk.as_ref();
    let io = |source| RestoreError::Io {
        path: dir.to_path_buf(),
        source,
    };
    disk.create_dir(dir).map_err(io)?;
    let lock_path = dir.join(LOCK_FILE);
    let Some(_lock) = disk.lock(&lock_path).map_err(io)? else {
        return Err(RestoreError::Locked { path: lock_path });
    };
    for name in [WAL_FILE, SNAPSHOT_FILE] {
        // Opened, not read: a store's WAL can be large.
        let path = dir.join(name);
        match disk.open_synchronous(&path, false, false) {
            Ok(_) => return Err(RestoreError::NotEmpty { path }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(e)),
        }
    }
    let restored = Restored {
        revision: state.revision,
        keys: state.kvs.len(),
    };
    snapshot::write(disk, dir, last_seq, &state).map_err(io)?;
    Wal::create(disk, dir, last_seq + 1, options.direct_io).map_err(io)?;
    Ok(restored)
}
