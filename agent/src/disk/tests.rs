use std::cell::RefCell;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;

use uuid::Uuid;

use super::gpt::{Device, Tables, write_to};
use super::*;

const GIB: u64 = 1 << 30;

/// The smallest 512-byte-block disk: 1 MiB before the ESP, 384 + 2 ×
/// 4096 MiB, 1 MiB of data, the backup array and header (33 blocks).
const SMALLEST_512: u64 = (1 + 384 + 8192 + 1) * MIB + 33 * 512;

fn guids() -> (Uuid, [Uuid; 4]) {
    let n = |i: u128| Uuid::from_u128(0x01234567_89AB_CDEF_0123_456789ABCD00 + i);
    (n(0xEF), [n(1), n(2), n(3), n(4)])
}

fn plan(bytes: u64, block: u32) -> Result<Layout, LayoutError> {
    let (disk, parts) = guids();
    Layout::plan_with_guids(bytes, block, disk, parts)
}

fn spans(layout: &Layout) -> Vec<(u32, &'static str, u64, u64)> {
    layout
        .partitions()
        .iter()
        .map(|p| (p.number, p.name, p.first_lba, p.last_lba))
        .collect()
}

#[test]
fn the_reference_placement_with_512_byte_blocks() {
    let layout = plan(16 * GIB, 512).expect("fits");
    assert_eq!(
        spans(&layout),
        [
            (1, "ESP", 2048, 788_479),
            (2, "METROPOLIS-SYSTEM-A", 788_480, 9_177_087),
            (3, "METROPOLIS-SYSTEM-B", 9_177_088, 17_565_695),
            // 16 GiB = 33554432 blocks; the backup array starts at
            // 33554399; the data partition ends on a whole MiB.
            (4, "METROPOLIS-NODE-DATA", 17_565_696, 33_552_383),
        ]
    );
    assert_eq!(layout.esp().offset, MIB);
    assert_eq!(layout.esp().length, 384 * MIB);
    assert_eq!(layout.esp().type_guid, ESP_TYPE);
    assert_eq!(layout.system_a().type_guid, SYSTEM_A_TYPE);
    assert_eq!(layout.system_b().type_guid, SYSTEM_B_TYPE);
    assert_eq!(layout.data().type_guid, DATA_TYPE);
    assert_eq!(layout.data().length % MIB, 0);
    assert_eq!(
        (layout.first_usable_lba(), layout.last_usable_lba()),
        (34, 33_554_398)
    );
    assert_eq!(layout.disk_guid(), guids().0);
    assert_eq!(layout.system_b().unique_guid, guids().1[2]);
}

#[test]
fn the_placement_with_4096_byte_blocks() {
    let layout = plan(16 * GIB, 4096).expect("fits");
    assert_eq!(
        spans(&layout),
        [
            (1, "ESP", 256, 98_559),
            (2, "METROPOLIS-SYSTEM-A", 98_560, 1_147_135),
            (3, "METROPOLIS-SYSTEM-B", 1_147_136, 2_195_711),
            // 4194304 blocks; the 4-block backup array starts at 4194299.
            (4, "METROPOLIS-NODE-DATA", 2_195_712, 4_194_047),
        ]
    );
    assert_eq!(
        (layout.first_usable_lba(), layout.last_usable_lba()),
        (6, 4_194_298)
    );
    for p in layout.partitions() {
        assert_eq!(p.offset % MIB, 0, "{} aligned", p.name);
    }
}

#[test]
fn the_smallest_disk_fits_and_one_mib_less_is_refused() {
    let layout = plan(SMALLEST_512, 512).expect("the smallest disk fits");
    assert_eq!(layout.data().length, MIB);
    assert_eq!(
        plan(SMALLEST_512 - MIB, 512),
        Err(LayoutError::TooSmall {
            partition: "METROPOLIS-NODE-DATA",
            needed: MIB,
            available: 0,
            minimum: SMALLEST_512,
        })
    );
    // Just short of a whole MiB for the data partition.
    let short = plan(SMALLEST_512 - 512, 512).expect_err("refused");
    assert_eq!(
        short,
        LayoutError::TooSmall {
            partition: "METROPOLIS-NODE-DATA",
            needed: MIB,
            available: MIB - 512,
            minimum: SMALLEST_512,
        }
    );
    assert!(
        short.to_string().contains("METROPOLIS-NODE-DATA"),
        "{short}"
    );
}

#[test]
fn a_small_disk_names_the_first_partition_that_does_not_fit() {
    let e = plan(4 * GIB, 512).expect_err("refused");
    // 4 GiB = 8388608 blocks; slot A starts at 788480, the backup array
    // at 8388575.
    assert_eq!(
        e,
        LayoutError::TooSmall {
            partition: "METROPOLIS-SYSTEM-A",
            needed: 4096 * MIB,
            available: (8_388_575 - 788_480) * 512,
            minimum: SMALLEST_512,
        }
    );
    let text = e.to_string();
    assert!(
        text.contains("METROPOLIS-SYSTEM-A") && text.contains("4096 MiB"),
        "{text}"
    );
    // The whole layout's minimum, not only the partition's.
    assert!(
        text.ends_with(
            "the whole layout (ESP, system slots A and B, data) needs a disk of at least \
             8994701824 bytes (8579 MiB)"
        ),
        "{text}"
    );
    assert!(matches!(
        plan(100 * MIB, 512),
        Err(LayoutError::TooSmall {
            partition: "ESP",
            ..
        })
    ));
    assert!(matches!(
        plan(0, 4096),
        Err(LayoutError::TooSmall {
            partition: "ESP",
            available: 0,
            ..
        })
    ));
}

#[test]
fn the_minimum_is_the_smallest_disk_that_fits() {
    for block in [512u32, 4096] {
        let minimum = Layout::minimum_bytes(block);
        let b = u64::from(block);
        assert!(plan(minimum, block).is_ok(), "{block}");
        let e = plan(minimum - b, block).expect_err("one block less");
        assert!(
            matches!(e, LayoutError::TooSmall { minimum: m, .. } if m == minimum),
            "{e:?}"
        );
        // A disk too small for the ESP names the whole layout's minimum too.
        let e = plan(100 * MIB, block).expect_err("refused");
        assert!(
            matches!(e, LayoutError::TooSmall { partition: "ESP", minimum: m, .. } if m == minimum),
            "{e:?}"
        );
    }
    assert_eq!(Layout::minimum_bytes(512), SMALLEST_512);
    // docs/provisioning.md quotes this refusal of an 8578 MiB file.
    assert_eq!(
        plan(8578 * MIB, 512).expect_err("refused").to_string(),
        "disk too small: partition METROPOLIS-NODE-DATA needs 1048576 bytes (1 MiB), only \
         1031680 bytes (0 MiB) are left for it; the whole layout (ESP, system slots A and B, \
         data) needs a disk of at least 8994701824 bytes (8579 MiB)"
    );
    assert_eq!(Layout::minimum_bytes(4096), 8578 * MIB + 5 * 4096);
}

#[test]
fn other_block_sizes_are_refused() {
    for block in [0, 1, 520, 1024, 2048, 8192] {
        assert_eq!(
            plan(16 * GIB, block),
            Err(LayoutError::UnsupportedBlockSize(block))
        );
    }
}

#[test]
fn random_guids_differ() {
    let a = Layout::plan(16 * GIB, 512).expect("fits");
    let b = Layout::plan(16 * GIB, 512).expect("fits");
    assert_ne!(a.disk_guid(), b.disk_guid());
    let mut all: Vec<Uuid> = a.partitions().iter().map(|p| p.unique_guid).collect();
    all.push(a.disk_guid());
    all.sort();
    all.dedup();
    assert_eq!(all.len(), 5);
}

fn le_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn le_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

#[test]
fn the_tables_hold_the_layout() {
    let layout = plan(16 * GIB, 512).expect("fits");
    let tables = Tables::build(&layout).expect("tables");
    let head = &tables.head;
    assert_eq!(head.len(), 34 * 512);
    // Protective MBR: one record, type 0xEE, from LBA 1 over the disk.
    assert_eq!(&head[510..512], &[0x55, 0xAA]);
    let record = &head[446..462];
    assert_eq!(record[4], 0xEE);
    assert_eq!(le_u32(record, 8), 1);
    assert_eq!(u64::from(le_u32(record, 12)), layout.total_blocks() - 1);
    assert!(
        head[462..510].iter().all(|&b| b == 0),
        "other records empty"
    );
    // Primary header.
    let header = &head[512..1024];
    assert_eq!(&header[..8], b"EFI PART");
    assert_eq!(le_u64(header, 24), 1);
    assert_eq!(le_u64(header, 32), layout.total_blocks() - 1);
    assert_eq!(le_u64(header, 40), 34);
    assert_eq!(le_u64(header, 48), layout.last_usable_lba());
    assert_eq!(&header[56..72], &layout.disk_guid().to_bytes_le());
    assert_eq!(le_u64(header, 72), 2);
    assert_eq!((le_u32(header, 80), le_u32(header, 84)), (128, 128));
    // The ESP's entry: type C12A7328-F81F-11D2-BA4B-00A0C93EC93B,
    // mixed-endian on disk.
    let esp = &head[1024..1152];
    assert_eq!(
        &esp[..16],
        &[
            0x28, 0x73, 0x2A, 0xC1, 0x1F, 0xF8, 0xD2, 0x11, 0xBA, 0x4B, 0x00, 0xA0, 0xC9, 0x3E,
            0xC9, 0x3B
        ]
    );
    // Unique GUID 01234567-89AB-CDEF-0123-456789ABCD01.
    assert_eq!(
        &esp[16..32],
        &[
            0x67, 0x45, 0x23, 0x01, 0xAB, 0x89, 0xEF, 0xCD, 0x01, 0x23, 0x45, 0x67, 0x89, 0xAB,
            0xCD, 0x01
        ]
    );
    assert_eq!(
        (le_u64(esp, 32), le_u64(esp, 40), le_u64(esp, 48)),
        (2048, 788_479, 0)
    );
    let name: Vec<u8> = "ESP".encode_utf16().flat_map(u16::to_le_bytes).collect();
    assert_eq!(&esp[56..62], &name[..]);
    assert!(esp[62..].iter().all(|&b| b == 0));
    assert!(
        head[1024 + 4 * 128..].iter().all(|&b| b == 0),
        "entries 5.. empty"
    );
    // Backup: the same array, then the header at the last LBA.
    let tail = &tables.tail;
    assert_eq!(tables.tail_offset, (layout.total_blocks() - 33) * 512);
    assert_eq!(&tail[..32 * 512], &head[1024..]);
    let backup = &tail[32 * 512..];
    assert_eq!(&backup[..8], b"EFI PART");
    assert_eq!(le_u64(backup, 24), layout.total_blocks() - 1);
    assert_eq!(le_u64(backup, 32), 1);
    assert_eq!(le_u64(backup, 72), layout.total_blocks() - 33);
    assert_eq!(le_u32(backup, 88), le_u32(header, 88), "same array CRC");
}

#[test]
fn the_protective_record_is_capped_at_32_bits() {
    let layout = plan(4 << 40, 512).expect("4 TiB fits");
    let tables = Tables::build(&layout).expect("tables");
    assert_eq!(le_u32(&tables.head[446..462], 12), u32::MAX - 1);
    let layout = plan(16 * GIB, 4096).expect("fits");
    let tables = Tables::build(&layout).expect("tables");
    assert_eq!(tables.head.len(), 6 * 4096);
    assert_eq!(&tables.head[4096..4104], b"EFI PART");
    assert_eq!(
        u64::from(le_u32(&tables.head[446..462], 12)),
        (16 * GIB / 4096) - 1
    );
}

/// Records what is done to it, in order.
#[derive(Default)]
struct Recorder(RefCell<Vec<(String, u64, usize)>>);

impl Device for Recorder {
    fn write_region(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.0
            .borrow_mut()
            .push(("write".into(), offset, buf.len()));
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        self.0.borrow_mut().push(("sync".into(), 0, 0));
        Ok(())
    }
}

#[test]
fn the_backup_is_written_and_synced_before_the_primary() {
    let layout = plan(16 * GIB, 512).expect("fits");
    let device = Recorder::default();
    write_to(&device, &layout).expect("written");
    let end = layout.total_blocks() * 512;
    assert_eq!(
        device.0.into_inner(),
        [
            ("write".to_string(), end - 33 * 512, 33 * 512),
            ("sync".to_string(), 0, 0),
            ("write".to_string(), 0, 34 * 512),
            ("sync".to_string(), 0, 0),
        ]
    );
}

/// A sparse file of `bytes` with a marker block just before and after
/// `range`.
fn marked_file(bytes: u64, range: (u64, u64)) -> std::fs::File {
    let file = tempfile::tempfile().expect("temporary file");
    file.set_len(bytes).expect("set_len");
    file.write_all_at(&[0xA5; 512], range.0 - 512)
        .expect("mark");
    file.write_all_at(&[0x5A; 512], range.1).expect("mark");
    file
}

fn assert_marks(file: &std::fs::File, range: (u64, u64)) {
    let mut block = [0u8; 512];
    file.read_exact_at(&mut block, range.0 - 512).expect("read");
    assert_eq!(block, [0xA5; 512], "before the range");
    file.read_exact_at(&mut block, range.1).expect("read");
    assert_eq!(block, [0x5A; 512], "after the range");
}

#[test]
fn a_window_stays_within_its_range() {
    let file = marked_file(8192, (1024, 3072));
    let mut window = Window::new(&file, 1024, 2048);
    assert_eq!(window.len(), 2048);
    window.seek(SeekFrom::Start(2000)).expect("seek");
    let e = window.write_all(&[1; 100]).expect_err("past the end");
    assert_eq!(e.kind(), io::ErrorKind::WriteZero);
    assert_eq!(window.stream_position().expect("position"), 2048);
    assert_eq!(window.seek(SeekFrom::End(-48)).expect("seek"), 2000);
    let mut back = Vec::new();
    window.read_to_end(&mut back).expect("read");
    assert_eq!(back, [1; 48]);
    assert!(window.seek(SeekFrom::Current(-5000)).is_err());
    assert_marks(&file, (1024, 3072));
}

#[test]
fn the_esp_is_formatted_within_its_partition() {
    let layout = plan(SMALLEST_512, 512).expect("fits");
    let esp = layout.esp();
    let range = (esp.offset, esp.offset + esp.length);
    let file = marked_file(range.1 + MIB, range);
    let files: [(&str, &[u8]); 3] = [
        ("EFI/BOOT/BOOTx64.EFI", b"loader"),
        ("EFI/metropolis/boot-a.efi", &[7; 5000]),
        ("metropolis/parameters.pb", b""),
    ];
    esp::format_bytes(&file, &layout, &files).expect("formatted");
    assert_marks(&file, range);
    let fs = fatfs::FileSystem::new(Window::partition(&file, esp), fatfs::FsOptions::new())
        .expect("mounts");
    assert_eq!(fs.fat_type(), fatfs::FatType::Fat32);
    assert_eq!(fs.volume_label(), "MNGN_BOOT");
    assert_eq!(fs.cluster_size(), 512);
    for dir in ["EFI", "EFI/BOOT", "EFI/metropolis", "metropolis"] {
        let names: Vec<String> = fs
            .root_dir()
            .open_dir(dir)
            .expect("directory exists")
            .iter()
            .take(2)
            .map(|e| e.expect("entry").short_file_name())
            .collect();
        assert_eq!(names, [".", ".."], "{dir} starts with its dot entries");
    }
    for (path, contents) in files {
        let mut read = Vec::new();
        let mut file = fs.root_dir().open_file(path).expect("file exists");
        file.read_to_end(&mut read).expect("read");
        assert_eq!(read, contents, "{path}");
    }
}

#[test]
fn bad_esp_paths_are_refused_before_anything_is_written() {
    let layout = plan(SMALLEST_512, 512).expect("fits");
    let file = tempfile::tempfile().expect("temporary file");
    for path in ["", "/EFI/x", "EFI//x", "EFI/../x", "EFI/", "./x", "EFI\\x"] {
        let e = esp::format_bytes(&file, &layout, &[(path, b"x")]).expect_err(path);
        assert!(matches!(e, esp::EspError::BadPath(_)), "{path}: {e}");
    }
    assert_eq!(file.metadata().expect("metadata").len(), 0, "untouched");
}

#[test]
fn fat_times_are_utc_dates() {
    let t = esp::dos_time(1_709_210_096); // 2024-02-29T12:34:56Z
    assert_eq!((t.date.year, t.date.month, t.date.day), (2024, 2, 29));
    assert_eq!((t.time.hour, t.time.min, t.time.sec), (12, 34, 56));
    let t = esp::dos_time(0);
    assert_eq!((t.date.year, t.date.month, t.date.day), (1980, 1, 1));
    let t = esp::dos_time(u64::MAX);
    assert_eq!((t.date.year, t.date.month, t.date.day), (2107, 12, 31));
    let t = esp::dos_time(951_782_400); // 2000-02-29T00:00:00Z
    assert_eq!((t.date.year, t.date.month, t.date.day), (2000, 2, 29));
}

#[test]
fn discard_refuses_what_is_not_a_block_device() {
    let file = tempfile::tempfile().expect("temporary file");
    let e = discard(&file, 0..4096).expect_err("a regular file");
    assert_eq!(e.kind(), io::ErrorKind::Unsupported);
}
