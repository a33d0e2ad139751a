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
//! 3. Only once the whole layer verified against its digest are the
//!    rest's writes synced, the head written and the device synced again
//!    ([`Device::commit`]). A transfer that fails, is cut short or
//!    carries other bytes leaves the head zeroed: the disk cannot boot.
//! 4. The device is read back and its digest compared with the image's;
//!    a mismatch zeroes the head again ([`Device::verify`]).
//!
//! The cost: [`GUARD_BYTES`] of memory for the head, 2 × [`GUARD_BYTES`]
//! of zeroes written and one extra sync before the image, one extra sync
//! after it; no staging copy, so no extra disk space and no second pass
//! over the image. What a failed install costs is the previous system:
//! once the image started to arrive, the disk boots nothing until a new
//! request (a new generation) installs a verified image. Failures before
//! the first image byte arrives (a bad reference, a manifest that does not
//! verify, a registry that refuses the blob) leave the device untouched.
//!
//! # What may be a root device
//!
//! A block device. A regular file only when allowed
//! ([`OciInstaller::allow_image_files`](super::OciInstaller::allow_image_files),
//! `bmaas-agent --allow-image-files`): for trials on image files, never
//! created under `/dev/` (a device that does not exist is an error, not a
//! file in the device directory) and cut to the image's length.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileTypeExt;
use std::path::Path;

use super::digest::{Digest, Hasher};
use super::{InstallError, PROGRESS_STEP_BYTES, Progress};

/// The bytes at each end of the disk that decide whether it boots: zeroed
/// first, and the image's own written last.
pub const GUARD_BYTES: u64 = 1024 * 1024;

/// The size of the read-back buffer.
const READ_BUFFER_BYTES: usize = 1024 * 1024;

/// The root device, open for writing and reading back.
pub(super) struct Device<'a> {
    path: &'a Path,
    file: File,
    block: bool,
    /// The image's first bytes, held back until the image verified.
    head: Vec<u8>,
    /// Image bytes received by [`write`](Self::write).
    written: u64,
}

impl<'a> Device<'a> {
    /// Opens `path`: a block device, or a regular file when
    /// `allow_files` (created unless under `/dev/`). Writes nothing.
    pub(super) fn open(path: &'a Path, allow_files: bool) -> Result<Device<'a>, InstallError> {
        let under_dev = path.starts_with("/dev");
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(allow_files && !under_dev)
            .open(path)
            .map_err(|source| InstallError::Device {
                path: path.to_path_buf(),
                action: "open",
                source,
            })?;
        let file_type = file
            .metadata()
            .map_err(|source| InstallError::Device {
                path: path.to_path_buf(),
                action: "stat",
                source,
            })?
            .file_type();
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
        Ok(Device {
            path,
            file,
            block,
            head: Vec::new(),
            written: 0,
        })
    }

    fn error(&self, action: &'static str, source: io::Error) -> InstallError {
        InstallError::Device {
            path: self.path.to_path_buf(),
            action,
            source,
        }
    }

    /// The size of a block device (None for a file).
    fn capacity(&mut self) -> Result<Option<u64>, InstallError> {
        if !self.block {
            return Ok(None);
        }
        let end = self
            .file
            .seek(SeekFrom::End(0))
            .map_err(|e| self.error("seek", e))?;
        Ok(Some(end))
    }

    /// Refuses an image of `size` bytes that a block device cannot hold.
    pub(super) fn check_capacity(&mut self, size: u64) -> Result<(), InstallError> {
        match self.capacity()? {
            Some(capacity) if size > capacity => Err(InstallError::DeviceUnusable {
                path: self.path.to_path_buf(),
                problem: format!("{capacity} bytes are too small for an image of {size} bytes"),
            }),
            _ => Ok(()),
        }
    }

    fn zero(&mut self, at: u64, len: u64) -> Result<(), InstallError> {
        self.file
            .seek(SeekFrom::Start(at))
            .map_err(|e| self.error("seek", e))?;
        let zeroes = vec![0u8; usize::try_from(len).unwrap_or(usize::MAX)];
        self.file
            .write_all(&zeroes)
            .map_err(|e| self.error("invalidate", e))
    }

    /// Zeroes the first and (of a block device) the last [`GUARD_BYTES`],
    /// synced, and places the device for the image's bytes after its head
    /// (see the [module](self)).
    pub(super) fn invalidate(&mut self) -> Result<(), InstallError> {
        let capacity = self.capacity()?;
        let head = capacity.map_or(GUARD_BYTES, |c| c.min(GUARD_BYTES));
        self.zero(0, head)?;
        if let Some(capacity) = capacity {
            let tail = capacity.min(GUARD_BYTES);
            self.zero(capacity - tail, tail)?;
        }
        self.file.sync_all().map_err(|e| self.error("fsync", e))?;
        self.file
            .seek(SeekFrom::Start(head))
            .map_err(|e| self.error("seek", e))?;
        Ok(())
    }

    /// Writes the image's next bytes: the first [`GUARD_BYTES`] are held
    /// back, the rest written in place.
    pub(super) fn write(&mut self, mut bytes: &[u8]) -> Result<(), InstallError> {
        if self.written < GUARD_BYTES {
            let room = usize::try_from(GUARD_BYTES - self.written).unwrap_or(usize::MAX);
            let held = bytes.len().min(room);
            self.head.extend_from_slice(&bytes[..held]);
            self.written += held as u64;
            bytes = &bytes[held..];
        }
        if bytes.is_empty() {
            return Ok(());
        }
        self.file
            .write_all(bytes)
            .map_err(|e| self.error("write", e))?;
        self.written += bytes.len() as u64;
        Ok(())
    }

    /// The image verified: syncs what was written, then writes the head,
    /// cuts a regular file to the image's length and syncs again.
    pub(super) fn commit(&mut self) -> Result<(), InstallError> {
        self.file.sync_data().map_err(|e| self.error("fsync", e))?;
        self.file
            .seek(SeekFrom::Start(0))
            .map_err(|e| self.error("seek", e))?;
        let head = std::mem::take(&mut self.head);
        self.file
            .write_all(&head)
            .map_err(|e| self.error("write", e))?;
        if !self.block {
            self.file
                .set_len(self.written)
                .map_err(|e| self.error("truncate", e))?;
        }
        self.file.sync_all().map_err(|e| self.error("fsync", e))
    }

    /// Reads the image back and compares its digest with `expected`; on a
    /// mismatch the head is zeroed again, so the device does not boot.
    pub(super) fn verify(
        &mut self,
        expected: Digest,
        progress: &mut dyn FnMut(&Progress),
    ) -> Result<(), InstallError> {
        let failure = match self.read_back(progress) {
            Ok(actual) if actual == expected => return Ok(()),
            Ok(actual) => InstallError::VerificationFailed {
                path: self.path.to_path_buf(),
                written: expected.to_string(),
                read_back: actual.to_string(),
            },
            Err(e) => e,
        };
        let head = self.written.min(GUARD_BYTES);
        self.zero(0, head)?;
        self.file.sync_all().map_err(|e| self.error("fsync", e))?;
        Err(failure)
    }

    fn read_back(&mut self, progress: &mut dyn FnMut(&Progress)) -> Result<Digest, InstallError> {
        let length = self.written;
        self.file
            .seek(SeekFrom::Start(0))
            .map_err(|e| self.error("seek", e))?;
        let mut hasher = Hasher::default();
        let mut buf = vec![0u8; READ_BUFFER_BYTES];
        let mut next_report = PROGRESS_STEP_BYTES;
        while hasher.len() < length {
            let want = usize::try_from(length - hasher.len())
                .unwrap_or(usize::MAX)
                .min(buf.len());
            let read = match self.file.read(&mut buf[..want]) {
                Ok(0) => {
                    return Err(self.error(
                        "read back",
                        io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            format!("ended after {} of {length} bytes", hasher.len()),
                        ),
                    ));
                }
                Ok(read) => read,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(self.error("read back", e)),
            };
            hasher.update(&buf[..read]);
            if hasher.len() >= next_report {
                next_report = hasher.len() + PROGRESS_STEP_BYTES;
                progress(&Progress::Verifying {
                    verified: hasher.len(),
                    total: length,
                });
            }
        }
        progress(&Progress::Verifying {
            verified: length,
            total: length,
        });
        Ok(hasher.finish())
    }
}
