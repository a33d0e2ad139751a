//! The disk of a Metropolis install: its partition plan, GPT and ESP
//! (docs: the installation spec, sections 2 and 3).
//!
//! The pieces, in the order an installer uses them:
//!
//! 1. [`Layout::plan`]: the partitions for a disk of a given size and
//!    logical block size, before anything is written. A disk too small
//!    is refused ([`LayoutError::TooSmall`]) naming the partition that
//!    does not fit and the space there is.
//! 2. [`discard`] the device (its errors are the caller's to log and
//!    ignore).
//! 3. [`esp::format`]: FAT32 over the ESP, with its files.
//! 4. The system image into slot A ([`Layout::system_a`]), e.g. through a
//!    [`Window`]: the caller's.
//! 5. [`gpt::write`]: the backup GPT, sync, then the protective MBR and
//!    primary GPT, sync; the table is made last, so an install cut short
//!    leaves a disk without a valid table rather than one pointing at
//!    half-written partitions.
//!
//! After a whole-disk image (not a layout of ours) was written,
//! [`backup_gpt::move_backup_to_end`] moves its backup GPT to the end of a
//! larger device. After either, [`reread_partitions`] has the kernel read
//! the new table.
//!
//! What is the crates' and what is written here: the GPT headers, entries
//! and checksums, and the protective MBR record, are the `gpt` crate's,
//! but not its write order (see [`gpt`]); FAT32 is the `fatfs` crate's,
//! with the spec's parameters (see [`esp`]). The plan itself (sizes,
//! alignment, placement) is this module's: the `gpt` crate's own placement
//! (`add_partition`) picks the first free gap with an alignment of our
//! choosing, but cannot take our GUIDs or report which partition did not
//! fit.

pub mod backup_gpt;
pub mod esp;
pub mod gpt;
mod layout;
mod window;

use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileTypeExt;

pub use layout::{
    DATA_TYPE, ESP_TYPE, GPT_ENTRIES, GPT_ENTRY_SIZE, Layout, LayoutError, MIB, Partition,
    SYSTEM_A_TYPE, SYSTEM_B_TYPE,
};
pub use window::Window;

/// `BLKDISCARD` from linux/fs.h: `_IO(0x12, 119)`, its argument a pair of
/// `u64`s (offset, length in bytes).
const BLKDISCARD: libc::Ioctl = libc::_IO(0x12, 119);

/// Tells a block device that the bytes of `range` are no longer used
/// (`BLKDISCARD`), so that it may drop them: SSDs and thin volumes
/// reclaim the space, and old data is not left readable in partitions
/// left empty. What a discarded range reads back as depends on the device.
/// `range` should be aligned to the logical block size.
///
/// Anything other than a block device (an image file) gets an
/// `Unsupported` error. The caller logs and ignores every error: a
/// device that cannot discard is still written correctly.
pub fn discard(device: &File, range: Range<u64>) -> io::Result<()> {
    if !device.metadata()?.file_type().is_block_device() {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "discard: not a block device",
        ));
    }
    let span: [u64; 2] = [range.start, range.end.saturating_sub(range.start)];
    // SAFETY: BLKDISCARD reads two u64s from the pointer, which points to
    // `span`, alive and of that size for the call; the descriptor is
    // open for as long as `device` is borrowed.
    let rc = unsafe { libc::ioctl(device.as_raw_fd(), BLKDISCARD, span.as_ptr()) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `BLKRRPART` from linux/fs.h: `_IO(0x12, 95)`, without an argument.
const BLKRRPART: libc::Ioctl = libc::_IO(0x12, 95);

/// Asks the kernel to read the partition table of the block device
/// `device` again (`BLKRRPART`, what `blockdev --rereadpt` does), so that
/// the partitions just written show as devices (`/dev/sda1`) without a
/// reboot. The kernel refuses while a partition of the device is in use
/// (`EBUSY`), for a device that has no partitions of its own (a loop
/// device attached without `--partscan`: `EINVAL`) and to a caller
/// without `CAP_SYS_ADMIN` (`EACCES`); the table on the disk is written
/// either way, and read at the next boot.
///
/// Anything other than a block device gets an `Unsupported` error.
pub fn reread_partitions(device: &File) -> io::Result<()> {
    if !device.metadata()?.file_type().is_block_device() {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "re-reading partitions: not a block device",
        ));
    }
    // SAFETY: BLKRRPART takes no argument and touches no memory of ours;
    // the descriptor is open for as long as `device` is borrowed.
    let rc = unsafe { libc::ioctl(device.as_raw_fd(), BLKRRPART) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests;
