#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::io::Cursor;
use std::os::unix::fs::FileExt;

use ::gpt::disk::LogicalBlockSize;
use ::gpt::partition::Partition as GptPartition;
use ::gpt::partition_types::{OperatingSystem, Type};

use super::*;

const MIB: u64 = 1 << 20;

fn lb(block: u32) -> LogicalBlockSize {
    LogicalBlockSize::try_from(u64::from(block)).unwrap_or(LogicalBlockSize::Lb512)
}

/// An image of `bytes` with a protective MBR and a GPT of two
/// partitions, made by the `gpt` crate, and its partitions.
fn image(bytes: u64, block: u32) -> (Vec<u8>, BTreeMap<u32, GptPartition>) {
    let b = u64::from(block);
    let mut disk = ::gpt::GptConfig::new()
        .writable(true)
        .logical_block_size(lb(block))
        .create_from_device(Cursor::new(vec![0x5au8; bytes as usize]), None)
        .unwrap();
    let linux = Type {
        guid: uuid::Uuid::from_u128(0x0FC63DAF_8483_4772_8E79_3D69D8477DE4),
        os: OperatingSystem::None,
    };
    let part = |first: u64, last: u64, name: &str| GptPartition {
        part_type_guid: linux.clone(),
        part_guid: uuid::Uuid::new_v4(),
        first_lba: first,
        last_lba: last,
        flags: 0,
        name: name.to_string(),
    };
    let partitions = BTreeMap::from([
        (1, part(MIB / b, 2 * MIB / b - 1, "one")),
        (2, part(2 * MIB / b, 4 * MIB / b - 1, "two")),
    ]);
    disk.update_partitions(partitions.clone()).unwrap();
    let mut device = disk.write().unwrap();
    let blocks = bytes / b;
    ::gpt::mbr::ProtectiveMBR::with_lb_size((blocks - 1) as u32)
        .overwrite_lba0(&mut device)
        .unwrap();
    (device.into_inner(), partitions)
}

/// A sparse file of `device` bytes with `image` at its start.
fn device_with(dir: &tempfile::TempDir, image: &[u8], device: u64) -> File {
    let file = File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(dir.path().join("device"))
        .unwrap();
    file.set_len(device).unwrap();
    file.write_all_at(image, 0).unwrap();
    file
}

fn read_all(file: &File) -> Vec<u8> {
    let mut buf = vec![0; file.metadata().unwrap().len() as usize];
    file.read_exact_at(&mut buf, 0).unwrap();
    buf
}

/// Both headers as the `gpt` crate reads them, requiring both valid (the
/// backup where the device ends), and the partitions.
fn both_valid(
    file: &File,
    block: u32,
) -> Result<(u64, u64, u64, BTreeMap<u32, GptPartition>), String> {
    let disk = ::gpt::GptConfig::new()
        .only_valid_headers(true)
        .logical_block_size(lb(block))
        .open_from_device(file)
        .map_err(|e| e.to_string())?;
    let primary = disk.primary_header().map_err(|e| e.to_string())?;
    let backup = disk.backup_header().map_err(|e| e.to_string())?;
    assert_eq!(backup.last_usable, primary.last_usable);
    Ok((
        primary.backup_lba,
        primary.last_usable,
        backup.part_start,
        disk.partitions().clone(),
    ))
}

fn pmbr_size(bytes: &[u8]) -> u32 {
    u32::from_le_bytes([bytes[458], bytes[459], bytes[460], bytes[461]])
}

#[test]
fn crc32_is_the_ieee_one() {
    assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
    assert_eq!(crc32(b""), 0);
}

#[test]
fn the_backup_of_a_smaller_image_moves_to_the_device_s_end() {
    for block in [512u32, 4096] {
        let b = u64::from(block);
        let dir = tempfile::tempdir().unwrap();
        let (img, partitions) = image(8 * MIB, block);
        let file = device_with(&dir, &img, 24 * MIB);
        assert!(
            both_valid(&file, block).is_err(),
            "{block}: the backup is not at the end before"
        );
        let before = read_all(&file);

        let last = 24 * MIB / b - 1;
        let array_blocks = 128 * 128 / b;
        let moved = move_backup_to_end(&file, block, 24 * MIB).unwrap();
        assert_eq!(
            moved,
            BackupGpt::Moved {
                from_lba: 8 * MIB / b - 1,
                to_lba: last,
                last_usable_lba: last - array_blocks - 1,
            },
            "{block}"
        );
        let (backup_lba, last_usable, backup_entries, found) = both_valid(&file, block).unwrap();
        assert_eq!(backup_lba, last);
        assert_eq!(last_usable, last - array_blocks - 1, "partitions may grow");
        assert_eq!(backup_entries, last - array_blocks);
        let spans = |parts: &BTreeMap<u32, GptPartition>| -> Vec<_> {
            parts
                .iter()
                .filter(|(_, p)| p.is_used())
                .map(|(n, p)| {
                    (
                        *n,
                        p.part_type_guid.guid,
                        p.part_guid,
                        p.first_lba,
                        p.last_lba,
                    )
                })
                .collect()
        };
        assert_eq!(
            spans(&found),
            spans(&partitions),
            "{block}: the partitions as they were"
        );

        let after = read_all(&file);
        assert_eq!(
            pmbr_size(&after),
            (24 * MIB / b - 1) as u32,
            "the MBR covers the device"
        );
        // Nothing but LBA 0, LBA 1 and the new tail changed.
        let tail = (last - array_blocks) * b;
        let changed: Vec<u64> = (0..24 * MIB / b)
            .filter(|lba| {
                let r = (lba * b) as usize..((lba + 1) * b) as usize;
                before[r.clone()] != after[r]
            })
            .filter(|lba| *lba > 1 && lba * b < tail)
            .collect();
        assert!(changed.is_empty(), "{block}: blocks {changed:?} changed");

        assert_eq!(
            move_backup_to_end(&file, block, 24 * MIB).unwrap(),
            BackupGpt::AtEnd
        );
    }
}

#[test]
fn an_image_the_device_s_size_is_left_as_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let (img, _) = image(8 * MIB, 512);
    let file = device_with(&dir, &img, 8 * MIB);
    assert_eq!(
        move_backup_to_end(&file, 512, 8 * MIB).unwrap(),
        BackupGpt::AtEnd
    );
    assert!(read_all(&file) == img);
}

#[test]
fn images_without_a_usable_gpt_are_left_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let (img, _) = image(8 * MIB, 512);

    // No GPT at all; or one made for 512-byte blocks on a 4096 one.
    let plain = vec![0x11u8; 4 * MIB as usize];
    let file = device_with(&dir, &plain, 16 * MIB);
    assert_eq!(
        move_backup_to_end(&file, 512, 16 * MIB).unwrap(),
        BackupGpt::NoGpt
    );
    let file = device_with(&dir, &img, 16 * MIB);
    assert_eq!(
        move_backup_to_end(&file, 4096, 16 * MIB).unwrap(),
        BackupGpt::NoGpt
    );

    // A primary header that does not match its CRC.
    let mut bad = img.clone();
    bad[512 + 40] ^= 1;
    let file = device_with(&dir, &bad, 16 * MIB);
    let before = read_all(&file);
    let left = move_backup_to_end(&file, 512, 16 * MIB).unwrap();
    assert!(
        matches!(&left, BackupGpt::Left(why) if why.contains("CRC")),
        "{left}"
    );
    assert!(read_all(&file) == before, "nothing written");

    // Entries that do not match theirs.
    let mut bad = img.clone();
    bad[1024 + 56] ^= 1;
    let file = device_with(&dir, &bad, 16 * MIB);
    let left = move_backup_to_end(&file, 512, 16 * MIB).unwrap();
    assert!(
        matches!(&left, BackupGpt::Left(why) if why.contains("entries do not match")),
        "{left}"
    );
    assert!(
        read_all(&file) == {
            let mut b = bad.clone();
            b.resize(16 * MIB as usize, 0);
            b
        }
    );
}

#[test]
fn a_hybrid_mbr_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let (mut img, _) = image(8 * MIB, 512);
    // A second record (a FAT partition over the first GPT partition).
    img[462..478].copy_from_slice(&[0, 0, 0, 0, 0x0c, 0, 0, 0, 0, 8, 0, 0, 0, 8, 0, 0]);
    let file = device_with(&dir, &img, 16 * MIB);
    assert!(matches!(
        move_backup_to_end(&file, 512, 16 * MIB).unwrap(),
        BackupGpt::Moved { .. }
    ));
    assert!(read_all(&file)[..512] == img[..512], "the MBR as it was");
    assert!(both_valid(&file, 512).is_ok());
}

#[test]
fn chs_addresses() {
    assert_eq!(chs(0), [0, 1, 0]);
    assert_eq!(chs(63), [1, 1, 0]);
    assert_eq!(chs(255 * 63), [0, 1, 1]);
    assert_eq!(chs(1023 * 255 * 63 + 254 * 63 + 62), [254, 63 | 0xc0, 0xff]);
    assert_eq!(chs(1024 * 255 * 63), [0xff, 0xff, 0xff]);
}
