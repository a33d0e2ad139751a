//! What follows the partition table's write, on a block device: a
//! whole-disk image's backup GPT moved to the device's end
//! ([`backup_gpt`]), then the kernel asked to read the new table
//! ([`disk::reread_partitions`]).
//!
//! An image file has neither: it is cut to the image's length, so its
//! backup GPT is where it ends, and the kernel keeps no table of a file.

use super::device::Device;
use super::{InstallError, Progress};
use crate::disk::{self, backup_gpt};

/// Moves the backup GPT of the whole-disk image just written onto
/// `device` to its end, when it has one elsewhere, reporting what was
/// done; an image whose GPT cannot be moved is reported and left as it
/// is (it boots from its primary). A device that fails the move's reads
/// or writes fails the install.
pub(super) fn move_image_backup(
    device: &Device,
    progress: &mut dyn FnMut(&Progress),
) -> Result<(), InstallError> {
    if !device.is_block() {
        return Ok(());
    }
    let block = device.logical_block_size()?;
    let size = device.size()?;
    let outcome = backup_gpt::move_backup_to_end(device.file(), block, size)
        .map_err(|e| device.error("move the backup GPT to the device's end", e))?;
    match outcome {
        backup_gpt::BackupGpt::Moved { .. } | backup_gpt::BackupGpt::Left(_) => {
            progress(&Progress::Notice {
                text: outcome.to_string(),
            });
        }
        _ => {}
    }
    Ok(())
}

/// Asks the kernel to read `device`'s partition table again
/// (`BLKRRPART`); when it refuses, says so (the install stands: the
/// table is on the disk, and read at the next boot).
pub(super) fn reread(device: &Device, progress: &mut dyn FnMut(&Progress)) {
    if !device.is_block() {
        return;
    }
    let text = match disk::reread_partitions(device.file()) {
        Ok(()) => format!(
            "the kernel re-read the partition table of {}",
            device.path().display()
        ),
        Err(e) => format!(
            "the kernel refused to re-read the partition table of {} ({e}); the table is on \
             the disk and is read at the next boot (`blockdev --rereadpt {}` once nothing \
             holds the device)",
            device.path().display(),
            device.path().display()
        ),
    };
    progress(&Progress::Notice { text });
}
