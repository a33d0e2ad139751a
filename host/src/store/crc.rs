//! CRC-32C (Castagnoli), the checksum of WAL records and snapshots.
//!
//! Table-driven, one byte at a time: fast enough for the store's fsync-bound
//! write path, and small enough to check by eye.

/// The reflected Castagnoli polynomial.
const POLY: u32 = 0x82F6_3B78;

/// The lookup table: the CRC of every byte value.
const TABLE: [u32; 256] = {
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = i as u32;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ POLY
            } else {
                crc >> 1
            };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
};

/// A running CRC-32C over data fed in pieces.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Crc32c(u32);

impl Crc32c {
    /// A CRC over no data yet.
    pub(crate) fn new() -> Self {
        Crc32c(!0)
    }

    /// Feeds `data`.
    pub(crate) fn update(mut self, data: &[u8]) -> Self {
        for &byte in data {
            self.0 = TABLE[((self.0 ^ u32::from(byte)) & 0xff) as usize] ^ (self.0 >> 8);
        }
        self
    }

    /// The CRC of everything fed.
    pub(crate) fn finish(self) -> u32 {
        !self.0
    }
}

/// The CRC-32C of `data`.
pub(crate) fn crc32c(data: &[u8]) -> u32 {
    Crc32c::new().update(data).finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_answers() {
        // The check value of CRC-32C (RFC 3720, and every CRC catalogue).
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c(b""), 0);
        // RFC 3720 B.4: 32 bytes of zeros, and of 0xff.
        assert_eq!(crc32c(&[0u8; 32]), 0x8A91_36AA);
        assert_eq!(crc32c(&[0xffu8; 32]), 0x62A8_AB43);
        // Feeding in pieces gives the same result.
        assert_eq!(
            Crc32c::new().update(b"1234").update(b"56789").finish(),
            0xE306_9283
        );
    }
}
