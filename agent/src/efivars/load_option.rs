//! `EFI_LOAD_OPTION`, the contents of a `Boot####` variable, and the
//! device path nodes a Metropolis entry uses (UEFI specification, "Load
//! Options" and "Device Path Protocol"). Hand-written: no maintained crate
//! encodes these without pulling in a whole firmware-side UEFI stack, and
//! the format is a few fixed fields.

use std::fmt;

use uuid::Uuid;

use crate::disk::Layout;

/// `LOAD_OPTION_ACTIVE`: the firmware may boot the entry.
pub const LOAD_OPTION_ACTIVE: u32 = 0x1;

/// The end-of-device-path node (type 0x7F, subtype 0xFF: end of the
/// entire path, length 4).
pub const END_NODE: [u8; 4] = [0x7F, 0xFF, 0x04, 0x00];

/// The loader's path on the ESP, as firmware spells it.
pub const BOOT_LOADER_PATH: &str = "\\EFI\\BOOT\\BOOTx64.EFI";

/// The most bytes a device path list may have (its length is a `u16`).
pub const MAX_DEVICE_PATH: usize = u16::MAX as usize;

const MEDIA_DEVICE_PATH: u8 = 0x04;
const HARD_DRIVE: u8 = 0x01;
const FILE_PATH: u8 = 0x04;
const HARD_DRIVE_LENGTH: u16 = 42;
const GPT_FORMAT: u8 = 0x02;
const GUID_SIGNATURE: u8 = 0x02;

/// A decoded `EFI_LOAD_OPTION`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadOption {
    /// Its attributes (`LOAD_OPTION_ACTIVE`, ...).
    pub attributes: u32,
    /// Its description, without the terminating NUL.
    pub description: String,
    /// Its device path list, end node included.
    pub device_path: Vec<u8>,
    /// What follows the device path (passed to the loaded image).
    pub optional_data: Vec<u8>,
}

impl LoadOption {
    /// The option's bytes: attributes (u32), device path length (u16),
    /// the description in UTF-16LE with a NUL, the device path, the
    /// optional data; all little-endian.
    ///
    /// # Panics
    ///
    /// If the device path is over [`MAX_DEVICE_PATH`] bytes (no real one
    /// comes near).
    pub fn encode(&self) -> Vec<u8> {
        let path_len = u16::try_from(self.device_path.len())
            .expect("a device path list of at most 65535 bytes");
        let mut out = Vec::with_capacity(
            8 + self.description.len() * 2 + self.device_path.len() + self.optional_data.len(),
        );
        out.extend_from_slice(&self.attributes.to_le_bytes());
        out.extend_from_slice(&path_len.to_le_bytes());
        push_ucs2z(&mut out, &self.description);
        out.extend_from_slice(&self.device_path);
        out.extend_from_slice(&self.optional_data);
        out
    }
}

/// Why bytes are not an `EFI_LOAD_OPTION` this code accepts.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DecodeError {
    /// Fewer than the 6 bytes of attributes and path length.
    TooShort(usize),
    /// The description has no NUL before the end.
    UnterminatedDescription,
    /// The description is not valid UTF-16.
    BadDescription,
    /// The device path list is longer than the bytes left.
    PathPastEnd {
        /// Its declared length.
        declared: usize,
        /// Bytes left after the description.
        left: usize,
    },
    /// A device path node is shorter than its 4-byte header or runs past
    /// the end of the list.
    BadNode {
        /// Its offset in the device path list.
        offset: usize,
    },
    /// The list does not end with the end-of-entire-path node.
    NoEndNode,
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::TooShort(n) => write!(f, "load option of {n} bytes is too short"),
            DecodeError::UnterminatedDescription => {
                write!(f, "load option description has no terminating NUL")
            }
            DecodeError::BadDescription => write!(f, "load option description is not UTF-16"),
            DecodeError::PathPastEnd { declared, left } => write!(
                f,
                "device path of {declared} bytes declared, only {left} bytes left"
            ),
            DecodeError::BadNode { offset } => {
                write!(f, "device path node at byte {offset} has a bad length")
            }
            DecodeError::NoEndNode => write!(f, "device path does not end with an end node"),
        }
    }
}

impl std::error::Error for DecodeError {}

/// The `EFI_LOAD_OPTION` of an active entry named `description` booting
/// `device_path`, without optional data. `description` must not contain
/// NUL (it would end the description for the firmware).
///
/// # Panics
///
/// If `device_path` is over [`MAX_DEVICE_PATH`] bytes.
pub fn encode_load_option(description: &str, device_path: &[u8]) -> Vec<u8> {
    LoadOption {
        attributes: LOAD_OPTION_ACTIVE,
        description: description.to_string(),
        device_path: device_path.to_vec(),
        optional_data: Vec::new(),
    }
    .encode()
}

/// Decodes an `EFI_LOAD_OPTION` (a `Boot####` variable without its
/// 4-byte attributes prefix). The device path list must be a sequence of
/// well-formed nodes ending with [`END_NODE`]. Reads only within `bytes`;
/// every input gives a value or an error.
pub fn decode_load_option(bytes: &[u8]) -> Result<LoadOption, DecodeError> {
    let [a0, a1, a2, a3, l0, l1, rest @ ..] = bytes else {
        return Err(DecodeError::TooShort(bytes.len()));
    };
    let attributes = u32::from_le_bytes([*a0, *a1, *a2, *a3]);
    let declared = usize::from(u16::from_le_bytes([*l0, *l1]));
    let mut units = Vec::new();
    let mut at = 0;
    loop {
        let Some(pair) = rest.get(at..at + 2) else {
            return Err(DecodeError::UnterminatedDescription);
        };
        at += 2;
        match u16::from_le_bytes([pair[0], pair[1]]) {
            0 => break,
            unit => units.push(unit),
        }
    }
    let description = String::from_utf16(&units).map_err(|_| DecodeError::BadDescription)?;
    let rest = &rest[at..];
    if declared > rest.len() {
        return Err(DecodeError::PathPastEnd {
            declared,
            left: rest.len(),
        });
    }
    let (device_path, optional_data) = rest.split_at(declared);
    check_device_path(device_path)?;
    Ok(LoadOption {
        attributes,
        description,
        device_path: device_path.to_vec(),
        optional_data: optional_data.to_vec(),
    })
}

/// Checks that `path` is a list of nodes, each at least its 4-byte
/// header long and within the list, the last being [`END_NODE`].
fn check_device_path(path: &[u8]) -> Result<(), DecodeError> {
    let mut offset = 0;
    while offset < path.len() {
        let Some(&[kind, subtype, l0, l1]) = path.get(offset..offset + 4) else {
            return Err(DecodeError::BadNode { offset });
        };
        let length = usize::from(u16::from_le_bytes([l0, l1]));
        if length < 4 || length > path.len() - offset {
            return Err(DecodeError::BadNode { offset });
        }
        if [kind, subtype] == [END_NODE[0], END_NODE[1]] {
            return if offset + length == path.len() {
                Ok(())
            } else {
                Err(DecodeError::NoEndNode)
            };
        }
        offset += length;
    }
    Err(DecodeError::NoEndNode)
}

/// A hard-drive media device path node (type 4, subtype 1, 42 bytes) for
/// GPT partition `partition_number` starting at `first_lba`, `blocks`
/// long, with unique GUID `partition_guid` (stored mixed-endian, as in
/// the GPT: the first three fields little-endian).
pub fn hard_drive_device_path(
    partition_number: u32,
    first_lba: u64,
    blocks: u64,
    partition_guid: Uuid,
) -> Vec<u8> {
    let mut node = Vec::with_capacity(usize::from(HARD_DRIVE_LENGTH));
    node.extend_from_slice(&[MEDIA_DEVICE_PATH, HARD_DRIVE]);
    node.extend_from_slice(&HARD_DRIVE_LENGTH.to_le_bytes());
    node.extend_from_slice(&partition_number.to_le_bytes());
    node.extend_from_slice(&first_lba.to_le_bytes());
    node.extend_from_slice(&blocks.to_le_bytes());
    node.extend_from_slice(&partition_guid.to_bytes_le());
    node.extend_from_slice(&[GPT_FORMAT, GUID_SIGNATURE]);
    node
}

/// A file-path media device path node (type 4, subtype 4): `path` in
/// UTF-16LE with a NUL, backslashes between names.
///
/// # Panics
///
/// If the node would be over 65535 bytes.
pub fn file_path_node(path: &str) -> Vec<u8> {
    let mut name = Vec::new();
    push_ucs2z(&mut name, path);
    let length = u16::try_from(4 + name.len()).expect("a file path node of at most 65535 bytes");
    let mut node = vec![MEDIA_DEVICE_PATH, FILE_PATH];
    node.extend_from_slice(&length.to_le_bytes());
    node.extend_from_slice(&name);
    node
}

/// The device path of the loader on `layout`'s ESP: the ESP's hard-drive
/// node, the file-path node of [`BOOT_LOADER_PATH`], the end node.
pub fn esp_boot_path(layout: &Layout) -> Vec<u8> {
    let esp = layout.esp();
    let mut path = hard_drive_device_path(esp.number, esp.first_lba, esp.blocks(), esp.unique_guid);
    path.extend_from_slice(&file_path_node(BOOT_LOADER_PATH));
    path.extend_from_slice(&END_NODE);
    path
}

/// Appends `text` in UTF-16LE and a NUL.
fn push_ucs2z(out: &mut Vec<u8>, text: &str) {
    for unit in text.encode_utf16().chain([0]) {
        out.extend_from_slice(&unit.to_le_bytes());
    }
}
