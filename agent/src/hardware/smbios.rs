//! What the firmware's SMBIOS table (`/sys/firmware/dmi/tables/DMI`, the
//! structure table without its entry point) says of UEFI: the BIOS
//! Information structure (type 0) has, from SMBIOS 2.2 on, a
//! "Characteristics Extension Byte 2" at offset 0x13 whose bit 3 is
//! "UEFI Specification is supported" (DMTF DSP0134, 7.1.2.2). The
//! reference agent reads the same bit.

/// The structure type of BIOS Information.
const BIOS_INFORMATION: u8 = 0;

/// The structure type that ends the table.
const END_OF_TABLE: u8 = 127;

/// The offset of Characteristics Extension Byte 2 in BIOS Information.
const EXTENSION_BYTE_2: usize = 0x13;

/// Bit 3 of Extension Byte 2: UEFI is supported.
const UEFI_SUPPORTED: u8 = 1 << 3;

/// Whether the firmware supports UEFI, by the BIOS Information structure
/// of `table`: `None` when the table has none, or one too short (before
/// SMBIOS 2.2) to say.
pub(super) fn uefi_supported(table: &[u8]) -> Option<bool> {
    let mut at = 0;
    while at + 4 <= table.len() {
        let kind = table[at];
        let length = usize::from(table[at + 1]);
        if length < 4 || at + length > table.len() {
            return None;
        }
        if kind == BIOS_INFORMATION {
            return (length > EXTENSION_BYTE_2)
                .then(|| table[at + EXTENSION_BYTE_2] & UEFI_SUPPORTED != 0);
        }
        if kind == END_OF_TABLE {
            return None;
        }
        // The strings after the formatted area end with two NULs.
        let strings = &table[at + length..];
        let end = strings.windows(2).position(|w| w == [0, 0])?;
        at += length + end + 2;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A BIOS Information structure of SMBIOS 2.4 (length 0x18) with
    /// extension byte 2 `ext2`, and its strings.
    fn bios(ext2: u8) -> Vec<u8> {
        let mut s = vec![0u8; 0x18];
        s[1] = 0x18;
        s[0x13] = ext2;
        s.extend_from_slice(b"Vendor\0Version 1.0\0\0");
        s
    }

    fn system() -> Vec<u8> {
        let mut s = vec![1u8, 8, 1, 0, 1, 2, 0, 0];
        s.extend_from_slice(b"Maker\0Box\0\0");
        s
    }

    #[test]
    fn the_uefi_bit_of_bios_information() {
        let end = [127u8, 4, 0xff, 0xfe, 0, 0];
        assert_eq!(
            uefi_supported(&[bios(0x0c), end.to_vec()].concat()),
            Some(true)
        );
        assert_eq!(
            uefi_supported(&[bios(0x04), end.to_vec()].concat()),
            Some(false)
        );
        // Found after another structure.
        assert_eq!(
            uefi_supported(&[system(), bios(0x08), end.to_vec()].concat()),
            Some(true)
        );
        // A structure without strings ends with two NULs right away.
        let mut bare = vec![2u8, 4, 3, 0, 0, 0];
        bare.extend(bios(0));
        assert_eq!(uefi_supported(&bare), Some(false));
    }

    #[test]
    fn tables_that_do_not_say() {
        assert_eq!(uefi_supported(&[]), None);
        assert_eq!(
            uefi_supported(&[system(), vec![127, 4, 0, 0, 0, 0]].concat()),
            None
        );
        // SMBIOS 2.1: BIOS Information of 0x13 bytes, no extension byte 2.
        let mut old = bios(0x08);
        old[1] = 0x13;
        old.drain(0x13..0x18);
        assert_eq!(uefi_supported(&old), None);
        // Cut short, a length past the end, a length below the header's.
        assert_eq!(uefi_supported(&bios(0x08)[..10]), None);
        assert_eq!(uefi_supported(&[0, 0x40, 0, 0]), None);
        assert_eq!(uefi_supported(&[1, 2, 0, 0, 0, 0]), None);
        // Strings that never end.
        assert_eq!(uefi_supported(&[1, 4, 0, 0, b'x']), None);
    }
}
