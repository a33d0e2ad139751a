//! The byte format of structured fuzz inputs: a reader that never fails
//! (missing bytes read as zero), and the matching writer the seed
//! generator uses to build meaningful inputs byte for byte.

/// Reads structured values from fuzz bytes. Every read succeeds: past the
/// end, numbers are zero and byte strings are empty, so any input is a
/// valid (if short) scenario.
#[derive(Clone, Debug)]
pub struct Input<'a> {
    data: &'a [u8],
}

impl<'a> Input<'a> {
    /// A reader over `data`.
    pub fn new(data: &'a [u8]) -> Input<'a> {
        Input { data }
    }

    /// Whether every byte has been read.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// One byte (0 past the end).
    pub fn u8(&mut self) -> u8 {
        match self.data.split_first() {
            Some((b, rest)) => {
                self.data = rest;
                *b
            }
            None => 0,
        }
    }

    /// Whether the next byte is odd.
    pub fn bool(&mut self) -> bool {
        self.u8() & 1 == 1
    }

    /// A little-endian `u16`.
    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }

    /// A little-endian `u32`.
    pub fn u32(&mut self) -> u32 {
        u32::from(self.u16()) | (u32::from(self.u16()) << 16)
    }

    /// A little-endian `u64`.
    pub fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | (u64::from(self.u32()) << 32)
    }

    /// A value in `0..n` (`n` at least 1) from one byte, or two when `n`
    /// is above 256.
    pub fn below(&mut self, n: usize) -> usize {
        let n = n.max(1);
        if n <= 256 {
            usize::from(self.u8()) % n
        } else {
            usize::from(self.u16()) % n
        }
    }

    /// Up to `n` bytes (fewer at the end).
    pub fn bytes(&mut self, n: usize) -> &'a [u8] {
        let (head, rest) = self.data.split_at(n.min(self.data.len()));
        self.data = rest;
        head
    }

    /// A byte string prefixed with its `u16` length.
    pub fn lp(&mut self) -> &'a [u8] {
        let n = usize::from(self.u16());
        self.bytes(n)
    }

    /// A string prefixed with its one-byte length (invalid UTF-8 replaced).
    pub fn short_string(&mut self) -> String {
        let n = usize::from(self.u8());
        String::from_utf8_lossy(self.bytes(n)).into_owned()
    }

    /// Everything left.
    pub fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.data)
    }
}

/// Writes inputs in the format [`Input`] reads.
#[derive(Clone, Debug, Default)]
pub struct Writer {
    out: Vec<u8>,
}

impl Writer {
    /// An empty input.
    pub fn new() -> Writer {
        Writer::default()
    }

    /// One byte.
    pub fn u8(&mut self, v: u8) -> &mut Writer {
        self.out.push(v);
        self
    }

    /// A little-endian `u16`.
    pub fn u16(&mut self, v: u16) -> &mut Writer {
        self.out.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// A little-endian `u64`.
    pub fn u64(&mut self, v: u64) -> &mut Writer {
        self.out.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// Raw bytes.
    pub fn bytes(&mut self, v: &[u8]) -> &mut Writer {
        self.out.extend_from_slice(v);
        self
    }

    /// A byte string prefixed with its `u16` length (cut at 65535 bytes).
    pub fn lp(&mut self, v: &[u8]) -> &mut Writer {
        let v = &v[..v.len().min(usize::from(u16::MAX))];
        self.u16(u16::try_from(v.len()).unwrap_or(u16::MAX));
        self.bytes(v)
    }

    /// A string prefixed with its one-byte length (cut at 255 bytes).
    pub fn short_string(&mut self, v: &str) -> &mut Writer {
        let v = &v.as_bytes()[..v.len().min(255)];
        self.u8(u8::try_from(v.len()).unwrap_or(u8::MAX));
        self.bytes(v)
    }

    /// The input written so far.
    pub fn finish(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.out)
    }
}
