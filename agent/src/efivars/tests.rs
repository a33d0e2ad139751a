use std::path::Path;

use proptest::prelude::*;
use uuid::Uuid;

use super::*;

/// A 16 GiB disk of 512-byte blocks whose ESP has the unique GUID
/// 01234567-89AB-CDEF-0123-456789ABCD01.
fn layout() -> Layout {
    let n = |i: u128| Uuid::from_u128(0x01234567_89AB_CDEF_0123_456789ABCD00 + i);
    Layout::plan_with_guids(16 << 30, 512, n(0xEF), [n(1), n(2), n(3), n(4)]).expect("fits")
}

/// The Metropolis entry of [`layout`], derived by hand from the UEFI
/// specification's EFI_LOAD_OPTION and media device path nodes.
#[rustfmt::skip]
const GOLDEN: [u8; 122] = [
    // Attributes: LOAD_OPTION_ACTIVE.
    0x01, 0x00, 0x00, 0x00,
    // FilePathListLength: 42 + 48 + 4 = 94.
    0x5E, 0x00,
    // Description "Metropolis" in UTF-16LE, then NUL.
    b'M', 0, b'e', 0, b't', 0, b'r', 0, b'o', 0, b'p', 0, b'o', 0, b'l', 0, b'i', 0, b's', 0,
    0x00, 0x00,
    // Hard drive node: type 4 (media), subtype 1, length 42.
    0x04, 0x01, 0x2A, 0x00,
    // Partition number 1.
    0x01, 0x00, 0x00, 0x00,
    // Partition start: LBA 2048.
    0x00, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    // Partition size: 786432 blocks (384 MiB).
    0x00, 0x00, 0x0C, 0x00, 0x00, 0x00, 0x00, 0x00,
    // Signature: 01234567-89AB-CDEF-0123-456789ABCD01, first three fields
    // little-endian.
    0x67, 0x45, 0x23, 0x01, 0xAB, 0x89, 0xEF, 0xCD,
    0x01, 0x23, 0x45, 0x67, 0x89, 0xAB, 0xCD, 0x01,
    // Partition format 2 (GPT), signature type 2 (GUID).
    0x02, 0x02,
    // File path node: type 4, subtype 4, length 4 + 22 × 2 = 48.
    0x04, 0x04, 0x30, 0x00,
    // "\EFI\BOOT\BOOTx64.EFI" in UTF-16LE, then NUL.
    b'\\', 0, b'E', 0, b'F', 0, b'I', 0, b'\\', 0, b'B', 0, b'O', 0, b'O', 0, b'T', 0,
    b'\\', 0, b'B', 0, b'O', 0, b'O', 0, b'T', 0, b'x', 0, b'6', 0, b'4', 0, b'.', 0,
    b'E', 0, b'F', 0, b'I', 0, 0x00, 0x00,
    // End of the entire device path.
    0x7F, 0xFF, 0x04, 0x00,
];

#[test]
fn the_metropolis_entry_is_the_golden_bytes() {
    let layout = layout();
    assert_eq!(
        layout.esp().unique_guid.to_string(),
        "01234567-89ab-cdef-0123-456789abcd01"
    );
    let option = encode_load_option(DESCRIPTION, &esp_boot_path(&layout));
    assert_eq!(option, GOLDEN);
    let decoded = decode_load_option(&GOLDEN).expect("decodes");
    assert_eq!(decoded.attributes, LOAD_OPTION_ACTIVE);
    assert_eq!(decoded.description, "Metropolis");
    assert_eq!(decoded.device_path, &GOLDEN[28..]);
    assert!(decoded.optional_data.is_empty());
}

#[test]
fn a_hard_drive_node_stores_the_guid_mixed_endian() {
    let guid = Uuid::parse_str("c12a7328-f81f-11d2-ba4b-00a0c93ec93b").expect("guid");
    let node = hard_drive_device_path(3, 0x0102_0304, 5, guid);
    assert_eq!(node.len(), 42);
    assert_eq!(
        &node[24..40],
        &[
            0x28, 0x73, 0x2A, 0xC1, 0x1F, 0xF8, 0xD2, 0x11, 0xBA, 0x4B, 0x00, 0xA0, 0xC9, 0x3E,
            0xC9, 0x3B
        ]
    );
    assert_eq!(&node[4..8], &[3, 0, 0, 0]);
    assert_eq!(&node[8..16], &[4, 3, 2, 1, 0, 0, 0, 0]);
}

#[test]
fn malformed_options_are_refused() {
    assert_eq!(
        decode_load_option(&GOLDEN[..5]),
        Err(DecodeError::TooShort(5))
    );
    assert_eq!(
        decode_load_option(&GOLDEN[..20]),
        Err(DecodeError::UnterminatedDescription)
    );
    assert_eq!(
        decode_load_option(&GOLDEN[..121]),
        Err(DecodeError::PathPastEnd {
            declared: 94,
            left: 93
        })
    );
    let mut no_end = GOLDEN;
    no_end[118] = 0x04;
    assert_eq!(decode_load_option(&no_end), Err(DecodeError::NoEndNode));
    let mut zero_node = GOLDEN;
    zero_node[30] = 0x00; // the hard drive node's length: 0
    assert_eq!(
        decode_load_option(&zero_node),
        Err(DecodeError::BadNode { offset: 0 })
    );
    let mut lone_surrogate = GOLDEN;
    lone_surrogate[6..8].copy_from_slice(&0xD800u16.to_le_bytes());
    assert_eq!(
        decode_load_option(&lone_surrogate),
        Err(DecodeError::BadDescription)
    );
}

fn device_path() -> impl Strategy<Value = Vec<u8>> {
    let node = (
        0u8..0x7F,
        any::<u8>(),
        proptest::collection::vec(any::<u8>(), 0..40),
    );
    proptest::collection::vec(node, 0..4).prop_map(|nodes| {
        let mut path = Vec::new();
        for (kind, subtype, body) in nodes {
            path.extend_from_slice(&[kind, subtype]);
            path.extend_from_slice(&(4 + body.len() as u16).to_le_bytes());
            path.extend_from_slice(&body);
        }
        path.extend_from_slice(&END_NODE);
        path
    })
}

proptest! {
    #[test]
    fn decode_inverts_encode(description in "[^\u{0}]{0,40}", path in device_path()) {
        let decoded = decode_load_option(&encode_load_option(&description, &path));
        prop_assert_eq!(
            decoded,
            Ok(LoadOption {
                attributes: LOAD_OPTION_ACTIVE,
                description,
                device_path: path,
                optional_data: Vec::new(),
            })
        );
    }

    #[test]
    fn whatever_decodes_encodes_back_to_the_same_bytes(
        bytes in proptest::collection::vec(any::<u8>(), 0..200),
    ) {
        if let Ok(option) = decode_load_option(&bytes) {
            prop_assert_eq!(option.encode(), bytes);
        }
    }
}

fn variable(dir: &Path, name: &str) -> std::path::PathBuf {
    dir.join(format!("{name}-{GLOBAL_VARIABLE_GUID}"))
}

#[test]
fn the_entry_takes_the_lowest_free_number_and_the_boot_order() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, contents) in [
        ("Boot0000", &b"\x07\0\0\0old0"[..]),
        ("Boot0001", b"\x07\0\0\0old1"),
        ("Boot0003", b"\x07\0\0\0old3"),
        ("Boot0002-not-this-guid", b""),
        ("BootOrder", b"\x07\0\0\0\x03\0\x00\0\x01\0"),
    ] {
        let path = if name.contains('-') {
            dir.path().join(name)
        } else {
            variable(dir.path(), name)
        };
        std::fs::write(path, contents).expect("write");
    }
    let layout = layout();
    assert_eq!(add_boot_entry(dir.path(), &layout).expect("added"), 2);
    let mut expected = vec![7, 0, 0, 0];
    expected.extend_from_slice(&GOLDEN);
    assert_eq!(
        std::fs::read(variable(dir.path(), "Boot0002")).expect("read"),
        expected
    );
    assert_eq!(
        std::fs::read(variable(dir.path(), "BootOrder")).expect("read"),
        [7, 0, 0, 0, 2, 0],
        "replaced by just the new entry"
    );
    assert_eq!(
        std::fs::read(variable(dir.path(), "Boot0003")).expect("read"),
        b"\x07\0\0\0old3",
        "existing entries kept"
    );
    assert_eq!(add_boot_entry(dir.path(), &layout).expect("added"), 4);
    assert_eq!(
        std::fs::read(variable(dir.path(), "BootOrder")).expect("read"),
        [7, 0, 0, 0, 4, 0]
    );
}

#[test]
fn numbers_are_uppercase_hex_and_boot_order_is_created() {
    let dir = tempfile::tempdir().expect("tempdir");
    for number in 0..0xAB {
        std::fs::write(variable(dir.path(), &format!("Boot{number:04X}")), b"").expect("write");
    }
    assert_eq!(add_boot_entry(dir.path(), &layout()).expect("added"), 0xAB);
    assert!(variable(dir.path(), "Boot00AB").exists());
    assert_eq!(
        std::fs::read(variable(dir.path(), "BootOrder")).expect("read"),
        [7, 0, 0, 0, 0xAB, 0]
    );
}

#[test]
fn entries_in_lowercase_hex_are_taken_too() {
    let dir = tempfile::tempdir().expect("tempdir");
    for number in 0..10 {
        std::fs::write(variable(dir.path(), &format!("Boot{number:04X}")), b"").expect("write");
    }
    // Written by another tool: the same entries in the firmware's eyes.
    std::fs::write(variable(dir.path(), "Boot000a"), b"\x07\0\0\0a").expect("write");
    std::fs::write(
        dir.path()
            .join(format!("Boot000b-{}", GLOBAL_VARIABLE_GUID.to_uppercase())),
        b"\x07\0\0\0b",
    )
    .expect("write");
    assert_eq!(add_boot_entry(dir.path(), &layout()).expect("added"), 0xC);
    assert!(variable(dir.path(), "Boot000C").exists());
    assert_eq!(
        std::fs::read(variable(dir.path(), "Boot000a")).expect("read"),
        b"\x07\0\0\0a",
        "kept"
    );
}

#[test]
fn a_boot_order_that_cannot_be_written_takes_the_new_entry_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(variable(dir.path(), "Boot0000"), b"\x07\0\0\0old0").expect("write");
    // A directory where BootOrder's file would be: opening it for writing
    // fails (EISDIR).
    std::fs::create_dir(variable(dir.path(), "BootOrder")).expect("mkdir");
    let e = add_boot_entry(dir.path(), &layout()).expect_err("BootOrder unwritable");
    assert!(e.to_string().contains("BootOrder"), "{e}");
    assert!(
        !variable(dir.path(), "Boot0001").exists(),
        "the new entry is deleted again"
    );
    assert_eq!(
        std::fs::read(variable(dir.path(), "Boot0000")).expect("read"),
        b"\x07\0\0\0old0",
        "existing entries kept"
    );
}

#[test]
fn a_missing_directory_is_an_error_naming_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let absent = dir.path().join("absent");
    let e = add_boot_entry(&absent, &layout()).expect_err("no efivarfs");
    let expected = format!("listing the EFI variables in {}", absent.display());
    assert!(e.to_string().contains(&expected), "{e}");
}

#[test]
fn efi_boot_is_the_firmware_directory() {
    let dir = tempfile::tempdir().expect("tempdir");
    assert!(efi_booted(dir.path()));
    assert!(!efi_booted(&dir.path().join("efi")));
}

/// The reference's own golden `EFI_LOAD_OPTION` (Monogon's
/// `osbase/efivarfs/boot_test.go`: "Example", partition 1 from LBA 5 for
/// 8 blocks, the X.500 namespace UUID as its GUID, `\test\a.efi`): the
/// same bytes come out of this encoder.
#[test]
fn the_reference_golden_option_encodes_alike() {
    let reference = "010000004a004500780061006d0070006c006500000004012a00010000000\
                     500000000000000080000000000000014b8a76bad9dd11180b400c04fd430\
                     c8020204041c005c0074006500730074005c0061002e00650066006900000\
                     07fff0400";
    let expected: Vec<u8> = (0..reference.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&reference[i..i + 2], 16).expect("hex"))
        .collect();
    let x500 = Uuid::parse_str("6ba7b814-9dad-11d1-80b4-00c04fd430c8").expect("uuid");
    let mut path = hard_drive_device_path(1, 5, 8, x500);
    path.extend_from_slice(&file_path_node("\\test\\a.efi"));
    path.extend_from_slice(&END_NODE);
    let encoded = encode_load_option("Example", &path);
    assert_eq!(encoded, expected);
    let decoded = decode_load_option(&encoded).expect("decodes");
    assert_eq!(decoded.description, "Example");
    assert_eq!(decoded.device_path, path);
}
