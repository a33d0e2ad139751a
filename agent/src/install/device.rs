//! The root device an image is installed onto, and the rule that keeps it
//! from booting unverified bytes.
//!
//! # Head last
//!
//! Everything a machine boots from starts in the first mebibyte of its
//! disk (the MBR and the primary GPT) or ends in the last (the backup
//! GPT, which firmware falls back to when the primary is invalid). So:
//!
//! 1. Before the first byte of the new image is written, the first and
//!    the last [`GUARD_BYTES`] of a block device are zeroed and synced
//!    ([`Device::invalidate`]): from then on, and until the end, the
//!    disk boots neither the old system nor a part of the new one.
//! 2. The image's first [`GUARD_BYTES`] (its *head*) are held in memory;
//!    the rest is written in place as it streams.
//! 3. Each chunk written is read back and compared with the bytes that
//!    were hashed ([`Device::read_back`]): the device holds what the
//!    digest covers, or the install fails naming the offset.
//! 4. Only once the whole layer verified against its digest are the
//!    rest's writes synced, the head written, synced, read back and
//!    compared ([`Device::commit`]). A transfer that fails, is cut short
//!    or carries other bytes leaves the head zeroed: the disk cannot boot.
//!
//! The image is written with direct I/O (`O_DIRECT`, as `dd oflag=direct`
//! does) wherever the device or filesystem supports it: no copy through
//! the page cache, and what is read back comes from the device, not from
//! the kernel's cache of what was just written. A filesystem without
//! direct I/O (tmpfs) gets buffered writes, and its read-back then sees
//! the page cache, which for such a file is all there is.
//!
//! The cost: [`GUARD_BYTES`] of memory for the head (besides the chunks
//! in flight, see [`layer`](super::layer)), 2 × [`GUARD_BYTES`] of zeroes
//! written and one extra sync before the image, one extra sync after it,
//! and reading the image once (alongside the writes); no staging copy, so no extra disk space. What a
//! failed install costs is the previous system: once the image started to
//! arrive, the disk boots nothing until a new request (a new generation)
//! installs a verified image. Failures before the first image byte arrives
//! (a bad reference, a manifest that does not verify, a registry that
//! refuses the blob) leave the device untouched.
//!
//! # What may be a root device
//!
//! A block device. A regular file only when allowed
//! ([`OciInstaller::allow_image_files`](super::OciInstaller::allow_image_files),
//! `bmaas-agent --allow-image-files`): for trials on image files, never
//! created under `/dev/` (a device that does not exist is an error, not a
//! file in the device directory) and cut to the image's length.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::Path;

use super::InstallError;
use super::aligned::{ALIGN, AlignedBuf, align_down, align_up};

/// The bytes at each end of the disk that decide whether it boots: zeroed
/// first, and the image's own written last.
pub const GUARD_BYTES: u64 = 1024 * 1024;

/// [`GUARD_BYTES`] as a length in memory.
const GUARD_LEN: usize = GUARD_BYTES as usize;

/// The root device, open for writing and reading back. Writes and
/// reads are positional, so one thread can write while another reads
/// back what was written before.
pub(super) struct Device<'a> {
    path: &'a Path,
    /// Buffered: zeroing the ends, and writing what is not aligned.
    file: File,
    /// Direct (`O_DIRECT`), where the device or filesystem supports it.
    direct: Option<File>,
    block: bool,
}

/// The image's first [`GUARD_BYTES`], held back until the image verified
/// (see the [module](self)).
pub(super) struct Head {
    buf: AlignedBuf,
    len: usize,
}

impl Head {
    /// An empty head.
    pub(super) fn new() -> Head {
        Head {
            buf: AlignedBuf::new(GUARD_LEN),
            len: 0,
        }
    }

    /// Keeps what of `bytes`, the image's bytes at `offset`, belongs to
    /// the head; how many of them that was (the rest goes to the device).
    pub(super) fn hold(&mut self, bytes: &[u8], offset: u64) -> usize {
        let Ok(at) = usize::try_from(offset) else {
            return 0;
        };
        if at >= GUARD_LEN {
            return 0;
        }
        let held = bytes.len().min(GUARD_LEN - at);
        self.buf.as_mut_slice()[at..at + held].copy_from_slice(&bytes[..held]);
        self.len = self.len.max(at + held);
        held
    }

    fn bytes(&self) -> &[u8] {
        &self.buf.as_slice()[..self.len]
    }
}

impl<'a> Device<'a> {
    /// Opens `path`: a block device, or a regular file when
    /// `allow_files` (created unless under `/dev/`). Writes nothing.
    pub(super) fn open(path: &'a Path, allow_files: bool) -> Result<Device<'a>, InstallError> {
        Device::open_with(path, allow_files, true)
    }

    /// [`open`](Self::open), trying direct I/O only when `try_direct`.
    fn open_with(
        path: &'a Path,
        allow_files: bool,
        try_direct: bool,
    ) -> Result<Device<'a>, InstallError> {
        let under_dev = path.starts_with("/dev");
        let error = |action: &'static str| {
            move |source| InstallError::Device {
                path: path.to_path_buf(),
                action,
                source,
            }
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(allow_files && !under_dev)
            .open(path)
            .map_err(error("open"))?;
        let file_type = file.metadata().map_err(error("stat"))?.file_type();
        let block = file_type.is_block_device();
        let problem = if block {
            None
        } else if file_type.is_file() && !allow_files {
            Some(
                "a regular file, not a block device (image files are written only by an \
                 agent started with --allow-image-files, for trials)",
            )
        } else if !file_type.is_file() {
            Some("not a block device")
        } else {
            None
        };
        if let Some(problem) = problem {
            return Err(InstallError::DeviceUnusable {
                path: path.to_path_buf(),
                problem: problem.to_string(),
            });
        }
        let direct = if !try_direct {
            None
        } else {
            match OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(libc::O_DIRECT)
                .open(path)
            {
                Ok(direct) => Some(direct),
                // The filesystem has no direct I/O: buffered it is.
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) && !block => None,
                Err(e) => return Err(error("open for direct I/O")(e)),
            }
        };
        Ok(Device {
            path,
            file,
            direct,
            block,
        })
    }

    /// The device's path, as the request named it.
    pub(super) fn path(&self) -> &Path {
        self.path
    }

    /// Whether it is a block device (not an image file).
    pub(super) fn is_block(&self) -> bool {
        self.block
    }

    /// An error of the device while doing `action`.
    pub(super) fn error(&self, action: &'static str, source: io::Error) -> InstallError {
        InstallError::Device {
            path: self.path.to_path_buf(),
            action,
            source,
        }
    }

    /// The size of a block device (None for a file).
    fn capacity(&self) -> Result<Option<u64>, InstallError> {
        if !self.block {
            return Ok(None);
        }
        let end = io::Seek::seek(&mut &self.file, io::SeekFrom::End(0))
            .map_err(|e| self.error("seek", e))?;
        Ok(Some(end))
    }

    /// The device's size: a block device's capacity, a file's length.
    pub(super) fn size(&self) -> Result<u64, InstallError> {
        match self.capacity()? {
            Some(capacity) => Ok(capacity),
            None => Ok(self
                .file
                .metadata()
                .map_err(|e| self.error("stat", e))?
                .len()),
        }
    }

    /// The device's logical block size: 512 for a file.
    pub(super) fn logical_block_size(&self) -> Result<u32, InstallError> {
        if !self.block {
            return Ok(512);
        }
        const BLKSSZGET: libc::Ioctl = libc::_IO(0x12, 104);
        let mut size: libc::c_int = 0;
        // SAFETY: BLKSSZGET writes one int through the pointer, which
        // points to `size`, alive for the call; the descriptor is open
        // for as long as `self.file` is.
        let rc = unsafe {
            libc::ioctl(
                std::os::fd::AsRawFd::as_raw_fd(&self.file),
                BLKSSZGET,
                &mut size as *mut libc::c_int,
            )
        };
        if rc != 0 {
            return Err(self.error("read the logical block size", io::Error::last_os_error()));
        }
        u32::try_from(size).map_err(|_| {
            self.error(
                "read the logical block size",
                io::Error::other(format!("the kernel gave {size}")),
            )
        })
    }

    /// The device, for writes outside the image stream (the partition
    /// table, the ESP).
    pub(super) fn file(&self) -> &File {
        &self.file
    }

    /// Syncs what was written to stable storage.
    pub(super) fn sync(&self) -> Result<(), InstallError> {
        self.file.sync_all().map_err(|e| self.error("fsync", e))
    }

    /// Refuses an image of `size` bytes that a block device cannot hold.
    pub(super) fn check_capacity(&self, size: u64) -> Result<(), InstallError> {
        match self.capacity()? {
            Some(capacity) if size > capacity => Err(InstallError::DeviceUnusable {
                path: self.path.to_path_buf(),
                problem: format!("{capacity} bytes are too small for an image of {size} bytes"),
            }),
            _ => Ok(()),
        }
    }

    fn zero(&self, at: u64, len: u64) -> Result<(), InstallError> {
        let zeroes = vec![0u8; usize::try_from(len).unwrap_or(usize::MAX)];
        self.file
            .write_all_at(&zeroes, at)
            .map_err(|e| self.error("invalidate", e))
    }

    /// Zeroes the first and (of a block device) the last [`GUARD_BYTES`],
    /// synced (see the [module](self)).
    pub(super) fn invalidate(&self) -> Result<(), InstallError> {
        let capacity = self.capacity()?;
        let head = capacity.map_or(GUARD_BYTES, |c| c.min(GUARD_BYTES));
        self.zero(0, head)?;
        if let Some(capacity) = capacity {
            let tail = capacity.min(GUARD_BYTES);
            self.zero(capacity - tail, tail)?;
        }
        self.file.sync_all().map_err(|e| self.error("fsync", e))
    }

    /// Writes `bytes`, the image's bytes at `offset` past its head:
    /// directly where offset and address are aligned, the unaligned rest
    /// (only ever the image's last bytes) buffered.
    pub(super) fn write_at(&self, bytes: &[u8], offset: u64) -> Result<(), InstallError> {
        let direct_len = match &self.direct {
            Some(direct) if aligned(bytes, offset) => {
                let len = align_down(bytes.len());
                direct
                    .write_all_at(&bytes[..len], offset)
                    .map_err(|e| self.error("write", e))?;
                len
            }
            _ => 0,
        };
        if direct_len < bytes.len() {
            self.file
                .write_all_at(&bytes[direct_len..], offset + direct_len as u64)
                .map_err(|e| self.error("write", e))?;
        }
        Ok(())
    }

    /// Reads back what [`write_at`](Self::write_at) wrote at `offset`
    /// into `scratch` (grown as needed) and compares it with `expected`.
    pub(super) fn read_back(
        &self,
        expected: &[u8],
        offset: u64,
        scratch: &mut AlignedBuf,
    ) -> Result<(), InstallError> {
        let direct = self.direct.as_ref().filter(|_| aligned(&[], offset));
        // Direct reads are of whole blocks: past the image's end, a block
        // device has more bytes and a file ends early.
        let want = if direct.is_some() {
            align_up(expected.len())
        } else {
            expected.len()
        };
        if scratch.as_slice().len() < want {
            *scratch = AlignedBuf::new(want);
        }
        let file = direct.unwrap_or(&self.file);
        let buf = &mut scratch.as_mut_slice()[..want];
        let mut got = 0;
        while got < expected.len() {
            match file.read_at(&mut buf[got..], offset + got as u64) {
                Ok(0) => break,
                Ok(read) => got += read,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(self.error("read back", e)),
            }
        }
        let read = &buf[..got.min(expected.len())];
        // Slice equality is a memcmp, several times faster than comparing
        // byte by byte; the first difference is looked for only on a
        // mismatch.
        if read == expected {
            return Ok(());
        }
        let differs = read.iter().zip(expected).position(|(a, b)| a != b);
        Err(InstallError::VerificationFailed {
            path: self.path.to_path_buf(),
            offset: offset + differs.unwrap_or(read.len()) as u64,
        })
    }

    /// The image, `length` bytes, verified and all but its head written
    /// and read back: syncs, writes the head, cuts a regular file to the
    /// image's length, syncs again and reads the head back. A head that
    /// does not read back is zeroed again.
    pub(super) fn commit(
        &self,
        head: &Head,
        length: u64,
        scratch: &mut AlignedBuf,
    ) -> Result<(), InstallError> {
        self.file.sync_data().map_err(|e| self.error("fsync", e))?;
        self.write_at(head.bytes(), 0)?;
        if !self.block {
            self.file
                .set_len(length)
                .map_err(|e| self.error("truncate", e))?;
        }
        self.file.sync_all().map_err(|e| self.error("fsync", e))?;
        if let Err(failure) = self.read_back(head.bytes(), 0, scratch) {
            self.zero(0, head.len as u64)?;
            self.file.sync_all().map_err(|e| self.error("fsync", e))?;
            return Err(failure);
        }
        Ok(())
    }
}

/// Whether `bytes` can be written at `offset` with direct I/O (its length
/// aside, which [`Device::write_at`] rounds down).
fn aligned(bytes: &[u8], offset: u64) -> bool {
    offset.is_multiple_of(ALIGN as u64)
        && (bytes.is_empty() || (bytes.as_ptr() as usize).is_multiple_of(ALIGN))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn image(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 + i / 4093) as u8).collect()
    }

    /// Writes `data` through a device on `path` in chunks of `chunk`
    /// bytes from aligned buffers, as the installer does, and commits.
    fn install(path: &Path, data: &[u8], chunk: usize, try_direct: bool) -> bool {
        let device = Device::open_with(path, true, try_direct).unwrap();
        device.invalidate().unwrap();
        let mut buf = AlignedBuf::new(chunk);
        let mut scratch = AlignedBuf::new(0);
        let mut head = Head::new();
        for (i, part) in data.chunks(chunk).enumerate() {
            let offset = (i * chunk) as u64;
            buf.as_mut_slice()[..part.len()].copy_from_slice(part);
            let bytes = &buf.as_slice()[..part.len()];
            let held = head.hold(bytes, offset);
            let rest = offset + held as u64;
            device.write_at(&bytes[held..], rest).unwrap();
            device
                .read_back(&bytes[held..], rest, &mut scratch)
                .unwrap();
        }
        device
            .commit(&head, data.len() as u64, &mut scratch)
            .unwrap();
        device.direct.is_some()
    }

    #[test]
    fn images_of_any_length_land_whole_direct_or_buffered() {
        let dir = tempfile::tempdir().unwrap();
        for len in [1000, GUARD_LEN, GUARD_LEN + 1, GUARD_LEN + 3 * 65536 + 517] {
            let path = dir.path().join(format!("disk-{len}"));
            // Longer than the image: cut to its length.
            std::fs::write(&path, vec![0xa5; len + 9000]).unwrap();
            let data = image(len);
            for try_direct in [true, false] {
                let direct = install(&path, &data, 65536, try_direct);
                assert_eq!(direct, try_direct, "ext4 and xfs have direct I/O");
                assert!(std::fs::read(&path).unwrap() == data, "len {len}");
            }
        }
    }

    /// tmpfs has direct I/O only since Linux 6.6: before, this is the
    /// buffered path.
    #[test]
    fn files_on_tmpfs_land_whole() {
        let shm = Path::new("/dev/shm");
        if !shm.is_dir() {
            return;
        }
        let dir = tempfile::tempdir_in(shm).unwrap();
        let path = dir.path().join("disk");
        std::fs::write(&path, b"").unwrap();
        let data = image(GUARD_LEN + 12345);
        install(&path, &data, 65536, true);
        assert!(std::fs::read(&path).unwrap() == data);
    }

    #[test]
    fn reading_back_names_the_first_byte_that_differs() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("disk");
        let data = image(3 * ALIGN + 100);
        std::fs::write(&path, &data).unwrap();
        let device = Device::open(&path, true).unwrap();
        let mut scratch = AlignedBuf::new(0);
        let mut expected = AlignedBuf::new(data.len());
        expected.as_mut_slice().copy_from_slice(&data);
        assert!(
            device
                .read_back(expected.as_slice(), 0, &mut scratch)
                .is_ok()
        );
        // Behind the device's back, as a failing disk would.
        let other = File::options().write(true).open(&path).unwrap();
        other.write_all_at(b"x", 2 * ALIGN as u64 + 5).unwrap();
        match device.read_back(expected.as_slice(), 0, &mut scratch) {
            Err(InstallError::VerificationFailed { offset, .. }) => {
                assert_eq!(offset, 2 * ALIGN as u64 + 5)
            }
            other => panic!("{other:?}"),
        }
        // Cut short: the first missing byte.
        other.set_len(ALIGN as u64 + 7).unwrap();
        match device.read_back(expected.as_slice(), 0, &mut scratch) {
            Err(InstallError::VerificationFailed { offset, .. }) => {
                assert_eq!(offset, ALIGN as u64 + 7)
            }
            other => panic!("{other:?}"),
        }
    }
}
