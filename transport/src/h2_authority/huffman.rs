//! The Huffman code of HPACK string literals (RFC 7541, section 5.2 and
//! Appendix B).
//!
//! The code is canonical: within one code length, codes ascend with the
//! symbol, and each length's first code follows the last code of the
//! length before (shifted). So the 257 code lengths define it, and the
//! codes and the decoding tables are computed from them at compile time.
//!
//! Decoding looks at a 32-bit window of the input: for each length `L`,
//! the codes of length `L` aligned to the window's top bit form one
//! contiguous range, and a window whose top `L` bits are below the end of
//! that range (and not matched at a shorter length) holds a code of length
//! `L`. Common characters have 5 to 8 bit codes, so a symbol costs one to
//! four comparisons.

/// The end-of-string symbol; its code must never appear in a string.
const EOS: usize = 256;

/// The longest code, in bits.
const MAX_LEN: usize = 30;

/// The shortest code, in bits.
const MIN_LEN: usize = 5;

/// The code length in bits of each symbol: bytes 0 to 255, then EOS
/// (RFC 7541, Appendix B).
#[rustfmt::skip]
const LENGTHS: [u8; 257] = [
    // 0 to 31: control bytes.
    13, 23, 28, 28, 28, 28, 28, 28, 28, 24, 30, 28, 28, 30, 28, 28,
    28, 28, 28, 28, 28, 28, 30, 28, 28, 28, 28, 28, 28, 28, 28, 28,
    // ' ' to '/'.
    6, 10, 10, 12, 13, 6, 8, 11, 10, 10, 8, 11, 8, 6, 6, 6,
    // '0' to '?'.
    5, 5, 5, 6, 6, 6, 6, 6, 6, 6, 7, 8, 15, 6, 12, 10,
    // '@' to 'O'.
    13, 6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7,
    // 'P' to '_'.
    7, 7, 7, 7, 7, 7, 7, 7, 8, 7, 8, 13, 19, 13, 14, 6,
    // '`' to 'o'.
    15, 5, 6, 5, 6, 5, 6, 6, 6, 5, 7, 7, 6, 6, 6, 5,
    // 'p' to 127.
    6, 7, 6, 5, 5, 6, 7, 7, 7, 7, 7, 15, 11, 14, 13, 28,
    // 128 to 255.
    20, 22, 20, 20, 22, 22, 22, 23, 22, 23, 23, 23, 23, 23, 24, 23,
    24, 24, 22, 23, 24, 23, 23, 23, 23, 21, 22, 23, 22, 23, 23, 24,
    22, 21, 20, 22, 22, 23, 23, 21, 23, 22, 22, 24, 21, 22, 23, 23,
    21, 21, 22, 21, 23, 22, 23, 23, 20, 22, 22, 22, 23, 22, 22, 23,
    26, 26, 20, 19, 22, 23, 22, 25, 26, 26, 26, 27, 27, 26, 24, 25,
    19, 21, 26, 27, 27, 26, 27, 24, 21, 21, 26, 26, 28, 27, 27, 27,
    20, 24, 20, 21, 22, 21, 21, 23, 22, 22, 25, 25, 24, 24, 26, 23,
    26, 27, 26, 26, 27, 27, 27, 27, 27, 28, 27, 27, 27, 27, 27, 26,
    // EOS.
    30,
];

/// The canonical code computed from [`LENGTHS`].
struct Code {
    /// Each symbol's code, in its low `LENGTHS[symbol]` bits (for the
    /// tests' encoder; decoding needs only the tables below).
    #[cfg_attr(not(test), allow(dead_code))]
    codes: [u32; 257],
    /// The first code of each length.
    first: [u32; MAX_LEN + 1],
    /// How many codes each length has.
    count: [u32; MAX_LEN + 1],
    /// Where each length's symbols start in `sorted`.
    offset: [u32; MAX_LEN + 1],
    /// The symbols ordered by code length, then by value (= by code).
    sorted: [u16; 257],
}

/// Builds the canonical code of [`LENGTHS`].
const fn build() -> Code {
    let mut count = [0u32; MAX_LEN + 1];
    let mut s = 0;
    while s < 257 {
        count[LENGTHS[s] as usize] += 1;
        s += 1;
    }
    let mut first = [0u32; MAX_LEN + 1];
    let mut offset = [0u32; MAX_LEN + 1];
    let mut code = 0u32;
    let mut index = 0u32;
    let mut len = 1;
    while len <= MAX_LEN {
        code = (code + count[len - 1]) << 1;
        first[len] = code;
        index += count[len - 1];
        offset[len] = index;
        len += 1;
    }
    let mut codes = [0u32; 257];
    let mut sorted = [0u16; 257];
    let mut next = first;
    let mut placed = offset;
    let mut s = 0;
    while s < 257 {
        let len = LENGTHS[s] as usize;
        codes[s] = next[len];
        next[len] += 1;
        sorted[placed[len] as usize] = s as u16;
        placed[len] += 1;
        s += 1;
    }
    Code {
        codes,
        first,
        count,
        offset,
        sorted,
    }
}

/// The HPACK Huffman code.
static CODE: Code = build();

/// Why a Huffman-coded string does not decode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HuffmanError {
    /// The string contains the EOS symbol.
    Eos,
    /// The string ends in padding longer than 7 bits, padding that is not
    /// all ones, or a truncated code.
    Padding,
}

/// Decodes the Huffman-coded `src`, appending the bytes to `dst`.
pub fn decode(src: &[u8], dst: &mut Vec<u8>) -> Result<(), HuffmanError> {
    dst.reserve(src.len() + src.len() / 2);
    // The next `bits` input bits, in the low bits of `acc`.
    let mut acc: u64 = 0;
    let mut bits: u32 = 0;
    let mut pos = 0;
    loop {
        while bits <= 56 && pos < src.len() {
            acc = (acc << 8) | u64::from(src[pos]);
            bits += 8;
            pos += 1;
        }
        if bits == 0 {
            return Ok(());
        }
        // The next 32 bits, top-aligned; past the end, ones (as EOS).
        let window = if bits >= 32 {
            (acc >> (bits - 32)) as u32
        } else {
            ((acc << (32 - bits)) as u32) | ((1u32 << (32 - bits)) - 1)
        };
        let mut len = MIN_LEN;
        let symbol = loop {
            let top = window >> (32 - len);
            if top < CODE.first[len] + CODE.count[len] {
                let at = CODE.offset[len] + (top - CODE.first[len]);
                break CODE.sorted[at as usize] as usize;
            }
            len += 1;
        };
        if len as u32 > bits {
            // Only the last bits remain: padding, at most 7 ones.
            let ones = (1u64 << bits) - 1;
            return if bits <= 7 && acc & ones == ones {
                Ok(())
            } else {
                Err(HuffmanError::Padding)
            };
        }
        if symbol == EOS {
            return Err(HuffmanError::Eos);
        }
        dst.push(symbol as u8);
        bits -= len as u32;
        acc &= (1u64 << bits) - 1;
    }
}

/// Huffman-codes `src`, appending to `dst` (the tests' client encoder).
#[cfg(test)]
pub fn encode(src: &[u8], dst: &mut Vec<u8>) {
    let mut acc: u64 = 0;
    let mut bits = 0;
    for &byte in src {
        let len = u32::from(LENGTHS[byte as usize]);
        acc = (acc << len) | u64::from(CODE.codes[byte as usize]);
        bits += len;
        while bits >= 8 {
            bits -= 8;
            dst.push((acc >> bits) as u8);
        }
        acc &= (1u64 << bits) - 1;
    }
    if bits > 0 {
        let pad = 8 - bits;
        dst.push(((acc << pad) | ((1 << pad) - 1)) as u8);
    }
}

/// The length of `src` Huffman-coded, in bytes.
#[cfg(test)]
pub fn encoded_len(src: &[u8]) -> usize {
    let bits: usize = src.iter().map(|&b| LENGTHS[b as usize] as usize).sum();
    bits.div_ceil(8)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        let digits: Vec<u8> = s.bytes().filter(|b| b.is_ascii_hexdigit()).collect();
        digits
            .chunks(2)
            .map(|p| u8::from_str_radix(std::str::from_utf8(p).unwrap(), 16).unwrap())
            .collect()
    }

    fn decoded(src: &[u8]) -> Result<Vec<u8>, HuffmanError> {
        let mut out = Vec::new();
        decode(src, &mut out).map(|()| out)
    }

    /// The code is complete (Kraft's sum is exactly one) and matches the
    /// codes RFC 7541 Appendix B lists, sampled across every length.
    #[test]
    fn canonical_code_matches_the_rfc() {
        let kraft: u64 = LENGTHS
            .iter()
            .map(|&l| 1u64 << (MAX_LEN - l as usize))
            .sum();
        assert_eq!(kraft, 1 << MAX_LEN);
        let listed: [(usize, u32, u8); 20] = [
            (0, 0x1ff8, 13),
            (1, 0x7fffd8, 23),
            (9, 0xffffea, 24),
            (10, 0x3ffffffc, 30),
            (22, 0x3ffffffe, 30),
            (b' ' as usize, 0x14, 6),
            (b'$' as usize, 0x1ff9, 13),
            (b'0' as usize, 0x0, 5),
            (b':' as usize, 0x5c, 7),
            (b'<' as usize, 0x7ffc, 15),
            (b'\\' as usize, 0x7fff0, 19),
            (b'z' as usize, 0x7b, 7),
            (127, 0xffffffc, 28),
            (128, 0xfffe6, 20),
            (199, 0x1ffffec, 25),
            (203, 0x7ffffde, 27),
            (220, 0xffffffd, 28),
            (249, 0xffffffe, 28),
            (255, 0x3ffffee, 26),
            (EOS, 0x3fffffff, 30),
        ];
        for (symbol, code, len) in listed {
            assert_eq!(
                (CODE.codes[symbol], LENGTHS[symbol]),
                (code, len),
                "{symbol}"
            );
        }
    }

    /// The Huffman-coded strings of RFC 7541 Appendix C.4 and C.6.
    #[test]
    fn rfc_examples_decode() {
        let cases = [
            ("f1e3 c2e5 f23a 6ba0 ab90 f4ff", "www.example.com"),
            ("a8eb 1064 9cbf", "no-cache"),
            ("25a8 49e9 5ba9 7d7f", "custom-key"),
            ("25a8 49e9 5bb8 e8b4 bf", "custom-value"),
            ("6402", "302"),
            ("aec3 771a 4b", "private"),
            (
                "d07a be94 1054 d444 a820 0595 040b 8166 e082 a62d 1bff",
                "Mon, 21 Oct 2013 20:13:21 GMT",
            ),
            (
                "9d29 ad17 1863 c78f 0b97 c8e9 ae82 ae43 d3",
                "https://www.example.com",
            ),
            ("640e ff", "307"),
            ("9bd9 ab", "gzip"),
            (
                "94e7 821d d7f2 e6c7 b335 dfdf cd5b 3960 d5af 2708 7f36 72c1 \
                 ab27 0fb5 291f 9587 3160 65c0 03ed 4ee5 b106 3d50 07",
                "foo=ASDJKHQKBZXOQWEOPIUAXQWEOIU; max-age=3600; version=1",
            ),
        ];
        for (coded, plain) in cases {
            assert_eq!(decoded(&hex(coded)).unwrap(), plain.as_bytes(), "{plain}");
            let mut again = Vec::new();
            encode(plain.as_bytes(), &mut again);
            assert_eq!(again, hex(coded), "{plain}");
        }
    }

    /// Every byte value round-trips, alone and in one long string.
    #[test]
    fn every_symbol_round_trips() {
        let all: Vec<u8> = (0..=255).collect();
        for b in &all {
            let mut coded = Vec::new();
            encode(&[*b], &mut coded);
            assert_eq!(coded.len(), encoded_len(&[*b]));
            assert_eq!(decoded(&coded).unwrap(), [*b]);
        }
        let mut coded = Vec::new();
        encode(&all, &mut coded);
        assert_eq!(decoded(&coded).unwrap(), all);
    }

    #[test]
    fn bad_padding_and_eos_are_refused() {
        // '0' is 00000; padding of 3 ones is fine, zeros are not.
        assert_eq!(decoded(&[0b0000_0111]).unwrap(), b"0");
        assert_eq!(decoded(&[0b0000_0110]), Err(HuffmanError::Padding));
        // A whole byte of padding (8 ones) is too long.
        assert_eq!(decoded(&[0b0000_0111, 0xff]), Err(HuffmanError::Padding));
        // A truncated code: the first 8 of the 13 bits of byte 0.
        assert_eq!(decoded(&[0xff]), Err(HuffmanError::Padding));
        // EOS (30 ones) inside a string.
        assert_eq!(decoded(&[0xff, 0xff, 0xff, 0xfc]), Err(HuffmanError::Eos));
        assert_eq!(decoded(&[]).unwrap(), b"");
    }
}
