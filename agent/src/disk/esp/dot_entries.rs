//! A repair of what `fatfs` 0.3.6 gets wrong in new directories.
//!
//! `fatfs` writes every name with long-file-name (LFN) entries, the `.`
//! and `..` of a new directory included, so a new directory's first
//! cluster starts LFN(`.`), `.`, LFN(`..`), `..` (rafalh/rust-fatfs
//! issues #117 and pull request #100: fixed upstream, not in a release).
//! FAT requires `.` and `..` in the first two slots; `fsck.fat` reports
//! such a directory as damaged and would rename and drop its entries.
//!
//! [`repair`] walks the directory tree of a FAT32 volume written by
//! `fatfs` and rewrites each such start as `.`, `..` and two deleted
//! entries, touching nothing else. It reads the few FAT32 fields it needs
//! itself (boot sector, FAT chains, 32-byte directory entries), bounded
//! by the volume's size, and leaves any layout it does not recognise
//! alone.

use std::collections::BTreeSet;
use std::io;
use std::os::unix::fs::FileExt;

use super::super::layout::Partition;

const ENTRY: usize = 32;
const ATTR_LFN: u8 = 0x0F;
const ATTR_DIRECTORY: u8 = 0x10;
const DELETED: u8 = 0xE5;
const DOT: &[u8; 11] = b".          ";
const DOTDOT: &[u8; 11] = b"..         ";

/// The FAT32 geometry read from the boot sector.
struct Volume<'a> {
    device: &'a std::fs::File,
    base: u64,
    cluster_bytes: u64,
    fat_offset: u64,
    data_offset: u64,
    clusters: u32,
    root: u32,
}

impl Volume<'_> {
    fn cluster_offset(&self, cluster: u32) -> u64 {
        self.base + self.data_offset + u64::from(cluster - 2) * self.cluster_bytes
    }

    fn is_data_cluster(&self, cluster: u32) -> bool {
        (2..self.clusters + 2).contains(&cluster)
    }

    /// The cluster after `cluster` in its chain, if any.
    fn next(&self, cluster: u32) -> io::Result<Option<u32>> {
        let mut entry = [0u8; 4];
        let at = self.base + self.fat_offset + u64::from(cluster) * 4;
        self.device.read_exact_at(&mut entry, at)?;
        let next = u32::from_le_bytes(entry) & 0x0FFF_FFFF;
        Ok(self.is_data_cluster(next).then_some(next))
    }

    fn read_cluster(&self, cluster: u32) -> io::Result<Vec<u8>> {
        let mut bytes = vec![0u8; self.cluster_bytes as usize];
        self.device
            .read_exact_at(&mut bytes, self.cluster_offset(cluster))?;
        Ok(bytes)
    }
}

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Moves `.` and `..` to the first two slots of every directory of the
/// FAT32 volume in `esp` on `device` whose first cluster starts with the
/// `fatfs` 0.3.6 pattern.
pub(crate) fn repair(device: &std::fs::File, esp: &Partition) -> io::Result<()> {
    let mut boot = [0u8; 512];
    device.read_exact_at(&mut boot, esp.offset)?;
    let sector = u64::from(le16(&boot, 11));
    let per_cluster = u64::from(boot[13]);
    let reserved = u64::from(le16(&boot, 14));
    let fats = u64::from(boot[16]);
    let per_fat = u64::from(le32(&boot, 36));
    let total = match le16(&boot, 19) {
        0 => u64::from(le32(&boot, 32)),
        small => u64::from(small),
    };
    let data_sectors = reserved + fats * per_fat;
    if sector == 0 || per_cluster == 0 || total <= data_sectors {
        return Err(io::Error::other("not the FAT32 boot sector just written"));
    }
    let volume = Volume {
        device,
        base: esp.offset,
        cluster_bytes: sector * per_cluster,
        fat_offset: reserved * sector,
        data_offset: data_sectors * sector,
        clusters: ((total - data_sectors) / per_cluster) as u32,
        root: le32(&boot, 44),
    };
    let mut seen = BTreeSet::new();
    let mut directories = vec![volume.root];
    while let Some(first) = directories.pop() {
        if !volume.is_data_cluster(first) || !seen.insert(first) {
            continue;
        }
        let mut cluster = Some(first);
        let mut slot = 0usize;
        // A chain can be no longer than the volume.
        let mut budget = volume.clusters;
        while let (Some(current), Some(left)) = (cluster, budget.checked_sub(1)) {
            budget = left;
            let mut bytes = volume.read_cluster(current)?;
            if current != volume.root && slot == 0 && fix_dots(&mut bytes, volume.root) {
                device.write_all_at(&bytes[..4 * ENTRY], volume.cluster_offset(current))?;
            }
            let mut ended = false;
            for entry in bytes.chunks_exact(ENTRY) {
                slot += 1;
                match entry[0] {
                    0 => {
                        ended = true;
                        break;
                    }
                    DELETED | b'.' => {}
                    _ if entry[11] == ATTR_LFN => {}
                    _ if entry[11] & ATTR_DIRECTORY != 0 => {
                        let high = u32::from(le16(entry, 20)) << 16;
                        directories.push(high | u32::from(le16(entry, 26)));
                    }
                    _ => {}
                }
            }
            if ended {
                break;
            }
            cluster = volume.next(current)?;
        }
    }
    Ok(())
}

/// Rewrites `cluster`'s first four entries from LFN(`.`), `.`,
/// LFN(`..`), `..` to `.`, `..`, deleted, deleted; whether it did. A `..`
/// naming the root directory (`fatfs` writes its cluster) is given
/// cluster 0, as FAT requires.
fn fix_dots(cluster: &mut [u8], root: u32) -> bool {
    if cluster.len() < 4 * ENTRY {
        return false;
    }
    let entry = |i: usize| &cluster[i * ENTRY..(i + 1) * ENTRY];
    let matches = entry(0)[11] == ATTR_LFN
        && entry(1)[..11] == DOT[..]
        && entry(2)[11] == ATTR_LFN
        && entry(3)[..11] == DOTDOT[..];
    if !matches {
        return false;
    }
    let (dot, dotdot) = (entry(1).to_vec(), entry(3).to_vec());
    let (lfn_dot, lfn_dotdot) = (entry(0).to_vec(), entry(2).to_vec());
    cluster[..ENTRY].copy_from_slice(&dot);
    cluster[ENTRY..2 * ENTRY].copy_from_slice(&dotdot);
    cluster[2 * ENTRY..3 * ENTRY].copy_from_slice(&lfn_dot);
    cluster[3 * ENTRY..4 * ENTRY].copy_from_slice(&lfn_dotdot);
    cluster[2 * ENTRY] = DELETED;
    cluster[3 * ENTRY] = DELETED;
    let parent = &mut cluster[ENTRY..2 * ENTRY];
    let parent_cluster = (u32::from(le16(parent, 20)) << 16) | u32::from(le16(parent, 26));
    if parent_cluster == root {
        parent[20..22].fill(0);
        parent[26..28].fill(0);
    }
    true
}
