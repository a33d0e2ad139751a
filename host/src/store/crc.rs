//! CRC-32C (Castagnoli), the checksum of WAL records and snapshots.
//!
//! Table-driven, eight bytes at a time ("slicing-by-8": eight 256-entry
//! tables, 8 KiB), the tail byte by byte. Every WAL record is checksummed
//! on the write path of each transaction; one byte at a time cost about
//! three times as much. Safe code only, no CPU-specific instruction.

/// The reflected Castagnoli polynomial.
const POLY: u32 = 0x82F6_3B78;

/// The lookup tables: `TABLES[0]` is the CRC of every byte value;
/// `TABLES[k][b]` is the CRC of byte `b` followed by `k` zero bytes.
const TABLES: [[u32; 256]; 8] = {
    let mut tables = [[0u32; 256]; 8];
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
        tables[0][i] = crc;
        i += 1;
    }
    let mut k = 1;
    while k < 8 {
        let mut i = 0;
        while i < 256 {
            let prev = tables[k - 1][i];
            tables[k][i] = tables[0][(prev & 0xff) as usize] ^ (prev >> 8);
            i += 1;
        }
        k += 1;
    }
    tables
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
        let t = &TABLES;
        let mut chunks = data.chunks_exact(8);
        for c in &mut chunks {
            let lo = self.0 ^ u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            self.0 = t[7][(lo & 0xff) as usize]
                ^ t[6][((lo >> 8) & 0xff) as usize]
                ^ t[5][((lo >> 16) & 0xff) as usize]
                ^ t[4][(lo >> 24) as usize]
                ^ t[3][c[4] as usize]
                ^ t[2][c[5] as usize]
                ^ t[1][c[6] as usize]
                ^ t[0][c[7] as usize];
        }
        for &byte in chunks.remainder() {
            self.0 = t[0][((self.0 ^ u32::from(byte)) & 0xff) as usize] ^ (self.0 >> 8);
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

    /// The bytewise definition, to check the sliced one against.
    fn bytewise(data: &[u8]) -> u32 {
        let mut crc = !0u32;
        for &byte in data {
            crc = TABLES[0][((crc ^ u32::from(byte)) & 0xff) as usize] ^ (crc >> 8);
        }
        !crc
    }

    #[test]
    fn sliced_matches_bytewise_at_every_length_and_split() {
        let data: Vec<u8> = (0..300u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        for len in 0..data.len() {
            let want = bytewise(&data[..len]);
            assert_eq!(crc32c(&data[..len]), want, "length {len}");
            for split in [0, 1, 7, 8, 9, len / 2, len] {
                let split = split.min(len);
                let pieces = Crc32c::new()
                    .update(&data[..split])
                    .update(&data[split..len])
                    .finish();
                assert_eq!(pieces, want, "length {len} split at {split}");
            }
        }
    }
}
