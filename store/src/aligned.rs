//! A byte buffer whose start is aligned to the file system block, as
//! `O_DIRECT` writes require of the memory they read from.

/// The block size the WAL aligns its writes to: offsets, lengths and
/// buffer addresses of every `O_DIRECT` write are multiples of it. 4 KiB
/// satisfies file systems on devices with 512-byte and 4 KiB logical
/// blocks.
pub(crate) const BLOCK: usize = 4096;

/// Rounds `n` up to a multiple of [`BLOCK`].
pub(crate) fn round_up(n: u64) -> u64 {
    n.div_ceil(BLOCK as u64) * BLOCK as u64
}

/// Rounds `n` down to a multiple of [`BLOCK`].
pub(crate) fn round_down(n: u64) -> u64 {
    n - n % BLOCK as u64
}

/// A zero-initialised buffer of a fixed capacity whose first byte is
/// [`BLOCK`]-aligned. Safe code: it over-allocates a `Vec` by one block and
/// starts at the first aligned address inside it.
pub(crate) struct AlignedBuf {
    raw: Vec<u8>,
    start: usize,
}

impl AlignedBuf {
    /// A zeroed buffer of `capacity` bytes (rounded up to whole blocks).
    pub(crate) fn zeroed(capacity: usize) -> AlignedBuf {
        let capacity = round_up(capacity as u64) as usize;
        let raw = vec![0u8; capacity + BLOCK];
        let misalign = raw.as_ptr() as usize % BLOCK;
        let start = (BLOCK - misalign) % BLOCK;
        AlignedBuf { raw, start }
    }

    /// Usable bytes.
    pub(crate) fn capacity(&self) -> usize {
        self.raw.len() - BLOCK
    }

    /// The aligned bytes.
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.raw[self.start..self.start + self.capacity()]
    }

    /// The aligned bytes, writable.
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        let capacity = self.capacity();
        &mut self.raw[self.start..self.start + capacity]
    }

    /// Makes room for at least `capacity` bytes, keeping the first `keep`.
    pub(crate) fn reserve(&mut self, capacity: usize, keep: usize) {
        if capacity <= self.capacity() {
            return;
        }
        let mut bigger = AlignedBuf::zeroed(capacity.max(2 * self.capacity()));
        bigger.bytes_mut()[..keep].copy_from_slice(&self.bytes()[..keep]);
        *self = bigger;
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AlignedBuf")
            .field("capacity", &self.capacity())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_zeroed_and_grows_keeping_a_prefix() {
        for capacity in [1, BLOCK - 1, BLOCK, 3 * BLOCK + 5] {
            let mut buf = AlignedBuf::zeroed(capacity);
            assert_eq!(buf.bytes().as_ptr() as usize % BLOCK, 0);
            assert!(buf.capacity() >= capacity && buf.capacity().is_multiple_of(BLOCK));
            assert!(buf.bytes().iter().all(|b| *b == 0));
            buf.bytes_mut()[..3].copy_from_slice(b"abc");
            buf.reserve(buf.capacity() * 3, 2);
            assert_eq!(buf.bytes().as_ptr() as usize % BLOCK, 0);
            assert_eq!(&buf.bytes()[..3], b"ab\0");
        }
        assert_eq!((round_up(0), round_up(1), round_up(4096)), (0, 4096, 4096));
        assert_eq!((round_down(4095), round_down(4097)), (0, 4096));
    }
}
