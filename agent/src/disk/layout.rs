//! The partition plan of a Metropolis disk, computed before anything is
//! written (docs: the installation spec, "The disk").

use std::fmt;

use uuid::Uuid;

/// Bytes in a MiB: the alignment of every partition start and the unit
/// of every size.
pub const MIB: u64 = 1 << 20;

/// Entries in each GPT partition array.
pub const GPT_ENTRIES: u64 = 128;

/// Bytes of each GPT partition entry.
pub const GPT_ENTRY_SIZE: u64 = 128;

/// The EFI system partition's type GUID.
pub const ESP_TYPE: Uuid = Uuid::from_u128(0xC12A7328_F81F_11D2_BA4B_00A0C93EC93B);

/// The type GUID of system slot A.
pub const SYSTEM_A_TYPE: Uuid = Uuid::from_u128(0xEE96054B_F6D0_4267_AAAA_724B2AFEA74C);

/// The type GUID of system slot B.
pub const SYSTEM_B_TYPE: Uuid = Uuid::from_u128(0xEE96054B_F6D0_4267_BBBB_724B2AFEA74C);

/// The type GUID of the node's data partition.
pub const DATA_TYPE: Uuid = Uuid::from_u128(0x9EEEC464_6885_414A_B278_4305C51F7966);

/// The partitions in disk order: name, type GUID, size in bytes (`None`:
/// the rest of the disk, rounded down to whole MiB).
const PARTITIONS: [(&str, Uuid, Option<u64>); 4] = [
    ("ESP", ESP_TYPE, Some(384 * MIB)),
    ("METROPOLIS-SYSTEM-A", SYSTEM_A_TYPE, Some(4096 * MIB)),
    ("METROPOLIS-SYSTEM-B", SYSTEM_B_TYPE, Some(4096 * MIB)),
    ("METROPOLIS-NODE-DATA", DATA_TYPE, None),
];

/// One planned partition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Partition {
    /// Its number, from 1, which is also its GPT entry's index + 1.
    pub number: u32,
    /// Its GPT name.
    pub name: &'static str,
    /// Its type GUID.
    pub type_guid: Uuid,
    /// Its unique GUID.
    pub unique_guid: Uuid,
    /// Its first logical block.
    pub first_lba: u64,
    /// Its last logical block (inclusive).
    pub last_lba: u64,
    /// The byte offset of its first block.
    pub offset: u64,
    /// Its length in bytes.
    pub length: u64,
}

impl Partition {
    /// Its length in logical blocks.
    pub fn blocks(&self) -> u64 {
        self.last_lba - self.first_lba + 1
    }
}

/// The layout of a whole disk: block size, GPT placement, partitions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    block_size: u32,
    total_blocks: u64,
    disk_guid: Uuid,
    partitions: [Partition; 4],
}

/// Why a disk cannot take the layout. Nothing has been written when
/// this is returned.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LayoutError {
    /// The logical block size is not one the GPT writer supports (512
    /// or 4096 bytes).
    UnsupportedBlockSize(u32),
    /// `partition` needs `needed` bytes, and only `available` are left
    /// for it.
    TooSmall {
        /// The name of the first partition that does not fit.
        partition: &'static str,
        /// Bytes it needs (for the data partition: 1 MiB, its least).
        needed: u64,
        /// Bytes left at its place, up to the backup partition array.
        available: u64,
        /// The smallest disk, in bytes, that takes the whole layout
        /// with this block size ([`Layout::minimum_bytes`]).
        minimum: u64,
    },
}

impl fmt::Display for LayoutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LayoutError::UnsupportedBlockSize(size) => write!(
                f,
                "logical block size {size} is not supported (only 512 and 4096 bytes)"
            ),
            LayoutError::TooSmall {
                partition,
                needed,
                available,
                minimum,
            } => write!(
                f,
                "disk too small: partition {partition} needs {needed} bytes \
                 ({} MiB), only {available} bytes ({} MiB) are left for it; the whole \
                 layout (ESP, system slots A and B, data) needs a disk of at least \
                 {minimum} bytes ({} MiB)",
                needed / MIB,
                available / MIB,
                minimum.div_ceil(MIB)
            ),
        }
    }
}

impl std::error::Error for LayoutError {}

impl Layout {
    /// Plans the layout of a disk of `device_bytes` bytes with logical
    /// blocks of `logical_block` bytes, with random disk and partition
    /// GUIDs.
    pub fn plan(device_bytes: u64, logical_block: u32) -> Result<Layout, LayoutError> {
        let partitions = [(); 4].map(|()| Uuid::new_v4());
        Layout::plan_with_guids(device_bytes, logical_block, Uuid::new_v4(), partitions)
    }

    /// [`Layout::plan`] with the given disk GUID and partition GUIDs (in
    /// partition order), for reproducible layouts.
    pub fn plan_with_guids(
        device_bytes: u64,
        logical_block: u32,
        disk_guid: Uuid,
        partition_guids: [Uuid; 4],
    ) -> Result<Layout, LayoutError> {
        if logical_block != 512 && logical_block != 4096 {
            return Err(LayoutError::UnsupportedBlockSize(logical_block));
        }
        let block = u64::from(logical_block);
        let total_blocks = device_bytes / block;
        let array_blocks = (GPT_ENTRIES * GPT_ENTRY_SIZE).div_ceil(block);
        // Before: protective MBR, primary header, primary array. After:
        // backup array, backup header. `end_usable` is the first block of
        // the backup array.
        let first_usable = 2 + array_blocks;
        let end_usable = total_blocks.saturating_sub(1 + array_blocks);
        let align = MIB.max(block) / block;
        let round_up = |lba: u64| lba.div_ceil(align) * align;

        let mut placed = [(0u64, 0u64); 4];
        let mut start = round_up(first_usable);
        for (place, (name, _, bytes)) in placed.iter_mut().zip(PARTITIONS) {
            let left = end_usable.saturating_sub(start);
            let (blocks, needed) = match bytes {
                Some(bytes) => (bytes / block, bytes),
                None => (left / (MIB / block) * (MIB / block), MIB),
            };
            if blocks == 0 || blocks > left {
                return Err(LayoutError::TooSmall {
                    partition: name,
                    needed,
                    available: left * block,
                    minimum: Layout::minimum_bytes(logical_block),
                });
            }
            *place = (start, blocks);
            start = round_up(start + blocks);
        }
        let partitions = std::array::from_fn(|index| {
            let (name, type_guid, _) = PARTITIONS[index];
            let (first_lba, blocks) = placed[index];
            Partition {
                number: index as u32 + 1,
                name,
                type_guid,
                unique_guid: partition_guids[index],
                first_lba,
                last_lba: first_lba + blocks - 1,
                offset: first_lba * block,
                length: blocks * block,
            }
        });
        Ok(Layout {
            block_size: logical_block,
            total_blocks,
            disk_guid,
            partitions,
        })
    }

    /// The smallest disk, in bytes, that takes the layout with logical
    /// blocks of `logical_block` bytes: the aligned start of the ESP, the
    /// ESP and both system slots, each starting on a whole MiB, 1 MiB of
    /// data, then the backup partition array and header. With 512-byte
    /// blocks that is 8578 MiB and 33 blocks (8 994 701 824 bytes), with
    /// 4096-byte blocks 8578 MiB and 5 blocks.
    pub fn minimum_bytes(logical_block: u32) -> u64 {
        let block = u64::from(logical_block.max(1));
        let array_blocks = (GPT_ENTRIES * GPT_ENTRY_SIZE).div_ceil(block);
        let align = MIB.max(block) / block;
        let round_up = |lba: u64| lba.div_ceil(align) * align;
        let mut end = round_up(2 + array_blocks);
        for (_, _, bytes) in PARTITIONS {
            end = round_up(end + bytes.unwrap_or(MIB).div_ceil(block));
        }
        (end + array_blocks + 1) * block
    }

    /// The logical block size in bytes.
    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    /// The disk's size in logical blocks (its last LBA + 1); bytes past
    /// the last whole block are not used.
    pub fn total_blocks(&self) -> u64 {
        self.total_blocks
    }

    /// The disk GUID of the GPT.
    pub fn disk_guid(&self) -> Uuid {
        self.disk_guid
    }

    /// The four partitions, in order: ESP, system A, system B, data.
    pub fn partitions(&self) -> &[Partition; 4] {
        &self.partitions
    }

    /// The EFI system partition (number 1).
    pub fn esp(&self) -> &Partition {
        &self.partitions[0]
    }

    /// System slot A (number 2), where the system image goes.
    pub fn system_a(&self) -> &Partition {
        &self.partitions[1]
    }

    /// System slot B (number 3), left empty.
    pub fn system_b(&self) -> &Partition {
        &self.partitions[2]
    }

    /// The node's data partition (number 4), left empty.
    pub fn data(&self) -> &Partition {
        &self.partitions[3]
    }

    /// Blocks of one GPT partition array.
    pub fn array_blocks(&self) -> u64 {
        (GPT_ENTRIES * GPT_ENTRY_SIZE).div_ceil(u64::from(self.block_size))
    }

    /// The first LBA partitions may use (after the primary array).
    pub fn first_usable_lba(&self) -> u64 {
        2 + self.array_blocks()
    }

    /// The last LBA partitions may use (before the backup array).
    pub fn last_usable_lba(&self) -> u64 {
        self.total_blocks - 2 - self.array_blocks()
    }
}
