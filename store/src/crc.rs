//! CRC-32C (Castagnoli), the checksum of WAL records and snapshots, from
//! the `crc32c` crate (the processor's `crc32` instruction where it has
//! SSE 4.2, tables elsewhere).
//!
//! The format depends on every detail of it: the reflected polynomial
//! `0x82F63B78`, all-ones initial value and final XOR, stored little
//! endian. The tests below pin it with the standard check values and
//! against its bitwise definition, and `wal.rs` pins whole headers and
//! batches, so a dependency update that changed any of it fails there
//! before it could write a WAL no earlier build reads.

/// A running CRC-32C over data fed in pieces.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Crc32c(u32);

impl Crc32c {
    /// A CRC over no data yet.
    pub(crate) fn new() -> Self {
        Crc32c(0)
    }

    /// Feeds `data`.
    pub(crate) fn update(self, data: &[u8]) -> Self {
        Crc32c(crc32c::crc32c_append(self.0, data))
    }

    /// The CRC of everything fed.
    pub(crate) fn finish(self) -> u32 {
        self.0
    }
}

/// The CRC-32C of `data`.
pub(crate) fn crc32c(data: &[u8]) -> u32 {
    crc32c::crc32c(data)
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
        // RFC 3720 B.4: 32 incrementing, and decrementing, bytes.
        let up: Vec<u8> = (0..32).collect();
        assert_eq!(crc32c(&up), 0x46DD_794E);
        let down: Vec<u8> = (0..32).rev().collect();
        assert_eq!(crc32c(&down), 0x113F_DB5C);
        // Feeding in pieces gives the same result.
        assert_eq!(
            Crc32c::new().update(b"1234").update(b"56789").finish(),
            0xE306_9283
        );
        assert_eq!(Crc32c::new().finish(), 0);
    }

    /// The definition, a bit at a time: the reflected Castagnoli
    /// polynomial, all-ones initial value and final XOR.
    fn bitwise(data: &[u8]) -> u32 {
        const POLY: u32 = 0x82F6_3B78;
        let mut crc = !0u32;
        for &byte in data {
            crc ^= u32::from(byte);
            for _ in 0..8 {
                crc = if crc & 1 == 1 {
                    (crc >> 1) ^ POLY
                } else {
                    crc >> 1
                };
            }
        }
        !crc
    }

    /// The crate matches the definition at every length from 0 to 299
    /// (every alignment and tail of its wide loops) and every split.
    #[test]
    fn matches_the_definition_at_every_length_and_split() {
        let data: Vec<u8> = (0..300u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        for len in 0..data.len() {
            let want = bitwise(&data[..len]);
            assert_eq!(crc32c(&data[..len]), want, "length {len}");
            for split in [0, 1, 7, 8, 9, len / 3, len / 2, len] {
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
