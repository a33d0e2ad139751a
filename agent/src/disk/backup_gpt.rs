//! Moving a whole-disk image's backup GPT to the end of the device it was
//! written to.
//!
//! An image made for a disk of N blocks keeps its backup GPT header in
//! block N - 1, the partition entries before it. Written onto a larger
//! device, that backup sits in the middle of the device: `sfdisk --verify`
//! reports "The backup GPT table is not on the end of the device", and a
//! firmware that falls back to the backup (because the primary broke)
//! looks for it in the device's last block and finds nothing.
//!
//! [`move_backup_to_end`] does what `sgdisk -e` does (and what Ironic
//! runs after writing a whole-disk image):
//!
//! - the backup partition entries go to the blocks just before the
//!   device's last block, the backup header into the last block;
//! - the last usable LBA of both headers grows to the block before the
//!   backup entries, so the space past the image can be partitioned, or
//!   its last partition grown (`growpart`), later;
//! - a protective MBR (one `0xEE` record from LBA 1 covering the image)
//!   is made to cover the device (the UEFI rule: the whole disk, at most
//!   2^32 - 1 blocks); a hybrid MBR is left as it is;
//! - the primary header's `AlternateLBA` and both headers' CRCs follow.
//!
//! The partition entries themselves do not change (their CRC neither).
//! Order: the new backup entries and header are written and synced first,
//! then the MBR and the primary header, synced. A crash in between leaves
//! the image's own primary and backup, both valid; after it, a broken
//! primary is backed by the new backup at the device's end. The image's
//! old backup header stays where the image put it, as `sgdisk -e` leaves
//! it: unreferenced bytes in free space.
//!
//! Only a GPT found at LBA 1 for the device's logical block size is
//! moved; an image without one (or made for another block size) is left
//! as it is, and so is one whose primary header or entries do not match
//! their CRCs ([`BackupGpt::Left`] says why).

use std::fmt;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// The GPT header signature, `EFI PART`.
const SIGNATURE: &[u8; 8] = b"EFI PART";

/// The bytes of a revision 1.0 header that its CRC covers at least.
const MIN_HEADER_SIZE: usize = 92;

/// The largest partition entry array this reads (128 entries of 128
/// bytes is 16 KiB; anything near this bound is not a real table).
const MAX_ARRAY_BYTES: u64 = 16 << 20;

/// What [`move_backup_to_end`] found and did.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BackupGpt {
    /// No GPT header at LBA 1: nothing to move.
    NoGpt,
    /// The backup header already is in the device's last block.
    AtEnd,
    /// The backup was moved.
    Moved {
        /// The block the image had its backup header in.
        from_lba: u64,
        /// The device's last block, where it is now.
        to_lba: u64,
        /// The last usable LBA of both headers now.
        last_usable_lba: u64,
    },
    /// The image has a GPT this does not move, and why (e.g. its header
    /// does not match its CRC).
    Left(String),
}

impl fmt::Display for BackupGpt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BackupGpt::NoGpt => f.write_str("the image has no GPT at LBA 1"),
            BackupGpt::AtEnd => f.write_str("the image's backup GPT is at the device's end"),
            BackupGpt::Moved {
                from_lba,
                to_lba,
                last_usable_lba,
            } => write!(
                f,
                "backup GPT moved from LBA {from_lba} to the device's last LBA {to_lba}; \
                 partitions may now grow up to LBA {last_usable_lba}"
            ),
            BackupGpt::Left(why) => write!(f, "backup GPT left where the image has it: {why}"),
        }
    }
}

/// The fields of a GPT header this reads or rewrites, with the header's
/// block as it is on the disk.
struct Header {
    block: Vec<u8>,
    size: usize,
}

impl Header {
    fn u32_at(&self, at: usize) -> u32 {
        let mut b = [0; 4];
        b.copy_from_slice(&self.block[at..at + 4]);
        u32::from_le_bytes(b)
    }

    fn u64_at(&self, at: usize) -> u64 {
        let mut b = [0; 8];
        b.copy_from_slice(&self.block[at..at + 8]);
        u64::from_le_bytes(b)
    }

    fn set_u64(&mut self, at: usize, value: u64) {
        self.block[at..at + 8].copy_from_slice(&value.to_le_bytes());
    }

    fn my_lba(&self) -> u64 {
        self.u64_at(24)
    }
    fn alternate_lba(&self) -> u64 {
        self.u64_at(32)
    }
    fn last_usable_lba(&self) -> u64 {
        self.u64_at(48)
    }
    fn entries_lba(&self) -> u64 {
        self.u64_at(72)
    }
    fn array_bytes(&self) -> u64 {
        u64::from(self.u32_at(80)) * u64::from(self.u32_at(84))
    }

    /// The CRC the header's first `size` bytes have with its CRC field
    /// zeroed.
    fn crc(&self) -> u32 {
        let mut bytes = self.block[..self.size].to_vec();
        bytes[16..20].fill(0);
        crc32(&bytes)
    }

    fn seal(&mut self) {
        let crc = self.crc();
        self.block[16..20].copy_from_slice(&crc.to_le_bytes());
    }

    /// The header in `block`, checked; `Ok(None)` without a signature.
    fn parse(block: Vec<u8>) -> Result<Option<Header>, String> {
        if &block[..8] != SIGNATURE {
            return Ok(None);
        }
        let size = u32::from_le_bytes([block[12], block[13], block[14], block[15]]) as usize;
        if !(MIN_HEADER_SIZE..=block.len()).contains(&size) {
            return Err(format!("its primary header claims {size} bytes"));
        }
        let header = Header { block, size };
        if header.crc() != header.u32_at(16) {
            return Err("its primary header does not match its CRC".to_string());
        }
        if header.my_lba() != 1 {
            return Err(format!(
                "its primary header says it is at LBA {}",
                header.my_lba()
            ));
        }
        let entry_size = header.u32_at(84);
        if entry_size < 128 || !entry_size.is_multiple_of(128) || header.u32_at(80) == 0 {
            return Err(format!(
                "its partition entries ({} of {entry_size} bytes) are not a GPT's",
                header.u32_at(80)
            ));
        }
        if header.array_bytes() > MAX_ARRAY_BYTES {
            return Err(format!(
                "its partition entry array has {} bytes",
                header.array_bytes()
            ));
        }
        Ok(Some(header))
    }
}

/// Moves the backup GPT of the image on `device` (`device_bytes` long,
/// blocks of `block_size` bytes) to the device's end, as described in
/// the [module](self). Errors are the device's (reading, writing,
/// syncing); an image whose GPT cannot be moved is [`BackupGpt::Left`].
pub fn move_backup_to_end(
    device: &File,
    block_size: u32,
    device_bytes: u64,
) -> io::Result<BackupGpt> {
    let block = u64::from(block_size);
    let total = device_bytes / block;
    if block < MIN_HEADER_SIZE as u64 || total < 3 {
        return Ok(BackupGpt::NoGpt);
    }
    let last_lba = total - 1;
    let read = |lba: u64, len: u64| -> io::Result<Vec<u8>> {
        let mut buf = vec![0; len as usize];
        device.read_exact_at(&mut buf, lba * block)?;
        Ok(buf)
    };
    let mut primary = match Header::parse(read(1, block)?) {
        Ok(Some(header)) => header,
        Ok(None) => return Ok(BackupGpt::NoGpt),
        Err(why) => return Ok(BackupGpt::Left(why)),
    };
    let from_lba = primary.alternate_lba();
    if from_lba == last_lba {
        return Ok(BackupGpt::AtEnd);
    }
    let array_bytes = primary.array_bytes();
    let array_blocks = array_bytes.div_ceil(block);
    let entries_lba = primary.entries_lba();
    let usable_end = primary.last_usable_lba();
    if from_lba > last_lba {
        return Ok(BackupGpt::Left(format!(
            "its backup header is at LBA {from_lba}, past the device's last LBA {last_lba}"
        )));
    }
    if entries_lba < 2
        || entries_lba + array_blocks > last_lba
        || usable_end >= from_lba.saturating_sub(array_blocks)
    {
        return Ok(BackupGpt::Left(format!(
            "its primary header's placement (entries at LBA {entries_lba}, last usable LBA \
             {usable_end}, backup at LBA {from_lba}) is not a GPT's"
        )));
    }
    let entries = read(entries_lba, array_bytes)?;
    if crc32(&entries) != primary.u32_at(88) {
        return Ok(BackupGpt::Left(
            "its partition entries do not match their CRC".to_string(),
        ));
    }

    let new_entries_lba = last_lba - array_blocks;
    let last_usable_lba = new_entries_lba - 1;
    primary.set_u64(32, last_lba);
    primary.set_u64(48, last_usable_lba);
    primary.seal();
    let mut backup = Header {
        block: primary.block.clone(),
        size: primary.size,
    };
    backup.set_u64(24, last_lba);
    backup.set_u64(32, 1);
    backup.set_u64(72, new_entries_lba);
    backup.seal();

    let mut tail = vec![0; ((array_blocks + 1) * block) as usize];
    tail[..entries.len()].copy_from_slice(&entries);
    tail[(array_blocks * block) as usize..].copy_from_slice(&backup.block);
    device.write_all_at(&tail, new_entries_lba * block)?;
    device.sync_data()?;

    let mut mbr = read(0, block)?;
    let old_total = from_lba + 1;
    if protective_mbr_resized(&mut mbr, old_total, total) {
        device.write_all_at(&mbr, 0)?;
    }
    device.write_all_at(&primary.block, block)?;
    device.sync_data()?;
    Ok(BackupGpt::Moved {
        from_lba,
        to_lba: last_lba,
        last_usable_lba,
    })
}

/// The 32-bit size of a protective `0xEE` record covering a disk of
/// `blocks` blocks.
fn protective_size(blocks: u64) -> u32 {
    u32::try_from(blocks - 1).unwrap_or(u32::MAX)
}

/// Makes the protective MBR in `mbr` (LBA 0) cover a disk of `total`
/// blocks, when it is one covering the image's `old_total` blocks: one
/// `0xEE` record starting at LBA 1, the other three empty. Whether it
/// changed `mbr`.
fn protective_mbr_resized(mbr: &mut [u8], old_total: u64, total: u64) -> bool {
    if mbr.len() < 512 || mbr[510..512] != [0x55, 0xaa] {
        return false;
    }
    let record = |i: usize| 446 + 16 * i;
    let first = record(0);
    let starts_at_1 = mbr[first + 8..first + 12] == 1u32.to_le_bytes();
    let others_empty = (1..4).all(|i| mbr[record(i)..record(i) + 16].iter().all(|b| *b == 0));
    let size = u32::from_le_bytes([
        mbr[first + 12],
        mbr[first + 13],
        mbr[first + 14],
        mbr[first + 15],
    ]);
    if mbr[first + 4] != 0xee || !starts_at_1 || !others_empty || size != protective_size(old_total)
    {
        return false;
    }
    let new = protective_size(total);
    mbr[first + 12..first + 16].copy_from_slice(&new.to_le_bytes());
    mbr[first + 5..first + 8].copy_from_slice(&chs(u64::from(new)));
    true
}

/// The CHS address of `lba` as an MBR record holds it (255 heads, 63
/// sectors a track), `FF FF FF` past what CHS can address (8 GiB).
fn chs(lba: u64) -> [u8; 3] {
    let cylinder = lba / (255 * 63);
    if cylinder > 1023 {
        return [0xff, 0xff, 0xff];
    }
    let head = (lba / 63) % 255;
    let sector = lba % 63 + 1;
    [
        head as u8,
        (sector as u8) | ((cylinder >> 2) as u8 & 0xc0),
        cylinder as u8,
    ]
}

/// CRC-32 (IEEE 802.3, reflected polynomial `0xEDB88320`), the checksum
/// of GPT headers and partition entry arrays.
fn crc32(bytes: &[u8]) -> u32 {
    const TABLE: [u32; 256] = {
        let mut table = [0u32; 256];
        let mut i = 0;
        while i < 256 {
            let mut c = i as u32;
            let mut k = 0;
            while k < 8 {
                c = if c & 1 != 0 {
                    0xedb8_8320 ^ (c >> 1)
                } else {
                    c >> 1
                };
                k += 1;
            }
            table[i] = c;
            i += 1;
        }
        table
    };
    let mut crc = u32::MAX;
    for b in bytes {
        crc = TABLE[((crc ^ u32::from(*b)) & 0xff) as usize] ^ (crc >> 8);
    }
    !crc
}

#[cfg(test)]
mod tests;
