//! The embedded store's file operations, as a port ([`Disk`]): everything
//! the WAL, the snapshot and the opener do to the data directory goes
//! through it. [`OsDisk`], the default, is the operating system's file
//! system; a simulator supplies a disk that loses unsynced writes and
//! tears writes in flight at a crash.
//!
//! What the store assumes of a disk, and what a simulated one must keep:
//!
//! - a [`SyncFile::write_at`] that returned is durable (the file is opened
//!   `O_DSYNC`); one interrupted by a crash may leave any subset of its
//!   512-byte sectors written, each sector holding its old or its new
//!   bytes, never a mix (devices with larger atomic units keep or lose
//!   several sectors at once); the WAL's reader relies on this to tell a
//!   torn final batch (a sector left as it was, zeros past the log's end)
//!   from a changed byte;
//! - [`Disk::write_synced`] is durable when it returns, under its name
//!   only once the directory is synced;
//! - a [`Disk::rename`] or a file creation is durable once
//!   [`Disk::sync_dir`] of its directory returned; before, a crash may
//!   undo it.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt};
use std::path::Path;

use rustix::fs::OFlags;

/// The unit a crash keeps or loses a write in: each 512-byte sector of an
/// interrupted write holds its old or its new bytes (devices with larger
/// atomic units keep or lose several at once).
pub const SECTOR: usize = 512;

/// The file operations of the embedded store.
pub trait Disk: Send + Sync + fmt::Debug + 'static {
    /// Creates `dir` and its missing parents (mode 0700).
    fn create_dir(&self, dir: &Path) -> io::Result<()>;

    /// Takes the exclusive lock of the file at `path` (created, mode 0600,
    /// if missing), held until the returned guard is dropped; `None` if
    /// another holder has it.
    fn lock(&self, path: &Path) -> io::Result<Option<Box<dyn LockGuard>>>;

    /// The whole contents of the file at `path`; `None` if there is none.
    fn read(&self, path: &Path) -> io::Result<Option<Vec<u8>>>;

    /// Creates (or truncates) the file at `path`, mode 0600, writes `parts`
    /// one after another and syncs it.
    fn write_synced(&self, path: &Path, parts: &[&[u8]]) -> io::Result<()>;

    /// Opens the file at `path` for synchronous positioned writes
    /// (`O_DSYNC`; created empty, mode 0600, if `create`), bypassing the
    /// page cache (`O_DIRECT`) if `direct` and the file system accepts it.
    fn open_synchronous(
        &self,
        path: &Path,
        create: bool,
        direct: bool,
    ) -> io::Result<Box<dyn SyncFile>>;

    /// Renames `from` over `to`.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;

    /// Removes the file at `path`; false if there was none.
    fn remove(&self, path: &Path) -> io::Result<bool>;

    /// Makes the creations and renames in `dir` durable.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
}

/// A file open for synchronous positioned writes ([`Disk::open_synchronous`]).
pub trait SyncFile: Send + fmt::Debug {
    /// Writes all of `buf` at `offset`, durably when it returns. With direct
    /// I/O, `buf`'s address, length and `offset` are block-aligned.
    fn write_at(&mut self, buf: &[u8], offset: u64) -> io::Result<()>;

    /// Reads exactly `buf.len()` bytes at `offset`.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;

    /// The file's length.
    fn size(&self) -> io::Result<u64>;

    /// Syncs the file's data and metadata.
    fn sync(&self) -> io::Result<()>;

    /// Whether writes bypass the page cache.
    fn is_direct(&self) -> bool;
}

/// A held lock ([`Disk::lock`]); dropping it releases the lock.
pub trait LockGuard: Send + Sync + fmt::Debug {}

/// The operating system's file system.
#[derive(Clone, Copy, Debug, Default)]
pub struct OsDisk;

/// A lock held with `flock`, released with the file.
#[derive(Debug)]
struct OsLock {
    _file: File,
}

impl LockGuard for OsLock {}

fn is_einval(e: &io::Error) -> bool {
    e.raw_os_error() == Some(rustix::io::Errno::INVAL.raw_os_error())
}

impl Disk for OsDisk {
    fn create_dir(&self, dir: &Path) -> io::Result<()> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
    }

    fn lock(&self, path: &Path) -> io::Result<Option<Box<dyn LockGuard>>> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)?;
        match file.try_lock() {
            Ok(()) => Ok(Some(Box::new(OsLock { _file: file }))),
            Err(std::fs::TryLockError::WouldBlock) => Ok(None),
            Err(std::fs::TryLockError::Error(e)) => Err(e),
        }
    }

    fn read(&self, path: &Path) -> io::Result<Option<Vec<u8>>> {
        match std::fs::read(path) {
            Ok(data) => Ok(Some(data)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn write_synced(&self, path: &Path, parts: &[&[u8]]) -> io::Result<()> {
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(path)?;
        for part in parts {
            file.write_all(part)?;
        }
        file.sync_all()
    }

    /// `O_DSYNC` (data and the metadata needed to read it back), not
    /// `O_SYNC`: the latter would also write the inode's modification time
    /// at every commit, the device write that the WAL's preallocation
    /// exists to avoid.
    fn open_synchronous(
        &self,
        path: &Path,
        create: bool,
        direct: bool,
    ) -> io::Result<Box<dyn SyncFile>> {
        Ok(Box::new(open_os(path, create, direct)?))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }

    fn remove(&self, path: &Path) -> io::Result<bool> {
        match std::fs::remove_file(path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }
}

/// [`OsDisk::open_synchronous`].
fn open_os(path: &Path, create: bool, direct: bool) -> io::Result<OsFile> {
    let mut options = OpenOptions::new();
    options.read(true).write(true);
    if create {
        options.create(true).truncate(true).mode(0o600);
    }
    if direct {
        let flags = libc::O_DIRECT | libc::O_DSYNC;
        match options.clone().custom_flags(flags).open(path) {
            Ok(file) => return Ok(OsFile { file, direct: true }),
            Err(e) if is_einval(&e) => {
                tracing::info!(
                    "{}: the file system refuses O_DIRECT; writing the WAL through the page cache",
                    path.display()
                );
            }
            Err(e) => return Err(e),
        }
    }
    let file = options.custom_flags(libc::O_DSYNC).open(path)?;
    Ok(OsFile {
        file,
        direct: false,
    })
}

/// A file of [`OsDisk`].
#[derive(Debug)]
struct OsFile {
    file: File,
    direct: bool,
}

impl SyncFile for OsFile {
    /// If the file system refuses an `O_DIRECT` write (`EINVAL`: it
    /// accepted the flag at open but not this alignment), turns `O_DIRECT`
    /// off on the file and retries.
    fn write_at(&mut self, buf: &[u8], offset: u64) -> io::Result<()> {
        match self.file.write_all_at(buf, offset) {
            Err(e) if self.direct && is_einval(&e) => {
                tracing::warn!(
                    "an O_DIRECT write of the WAL was refused ({e}); writing through the page cache from now on"
                );
                let flags = rustix::fs::fcntl_getfl(&self.file)?;
                rustix::fs::fcntl_setfl(&self.file, flags - OFlags::DIRECT)?;
                self.direct = false;
                self.file.write_all_at(buf, offset)
            }
            other => other,
        }
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.file.read_exact_at(buf, offset)
    }

    fn size(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }

    fn sync(&self) -> io::Result<()> {
        self.file.sync_all()
    }

    fn is_direct(&self) -> bool {
        self.direct
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fallback when `O_DIRECT` writes are refused keeps the file
    /// usable: turned off on the open file, the same writes go through.
    #[test]
    #[allow(clippy::unwrap_used)]
    fn a_refused_direct_write_falls_back_to_the_page_cache() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let mut file = open_os(&path, true, true).unwrap();
        if !file.is_direct() {
            eprintln!(
                "the file system of {} refuses O_DIRECT: nothing to test",
                dir.path().display()
            );
            return;
        }
        let flags = rustix::fs::fcntl_getfl(&file.file).unwrap();
        assert!(flags.contains(OFlags::DIRECT));
        assert_eq!(
            flags.bits() & libc::O_SYNC as u32,
            libc::O_DSYNC as u32,
            "O_DSYNC, not O_SYNC"
        );
        // A misaligned O_DIRECT write is refused with EINVAL (by ext4, xfs
        // and btrfs).
        file.write_at(b"abc", 1).unwrap();
        assert!(
            !file.is_direct(),
            "the misaligned write went through without falling back"
        );
        let flags = rustix::fs::fcntl_getfl(&file.file).unwrap();
        assert!(!flags.contains(OFlags::DIRECT));
        assert_eq!(
            flags.bits() & libc::O_SYNC as u32,
            libc::O_DSYNC as u32,
            "O_DSYNC, not O_SYNC"
        );
        assert_eq!(OsDisk.read(&path).unwrap().unwrap(), b"\0abc");
        assert_eq!(file.size().unwrap(), 4);
    }

    #[test]
    #[allow(clippy::unwrap_used)]
    fn a_second_lock_is_refused_until_the_first_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("LOCK");
        let held = OsDisk.lock(&path).unwrap().unwrap();
        assert!(OsDisk.lock(&path).unwrap().is_none());
        drop(held);
        assert!(OsDisk.lock(&path).unwrap().is_some());
        assert!(OsDisk.read(&dir.path().join("none")).unwrap().is_none());
        assert!(!OsDisk.remove(&dir.path().join("none")).unwrap());
    }
}
