//! Buffers whose start is aligned for direct I/O (`O_DIRECT`), without
//! `unsafe`: a vector a little longer than asked, used from its first
//! aligned byte.

/// The alignment of buffer addresses, file offsets and lengths of direct
/// writes and reads: a page, which covers every logical block size Linux
/// block devices have (512 or 4096 bytes) and the blocks of the
/// filesystems image files live on.
pub(super) const ALIGN: usize = 4096;

/// A zeroed buffer of a fixed length whose first byte is at an address
/// that is a multiple of [`ALIGN`].
pub(super) struct AlignedBuf {
    storage: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes.
    pub(super) fn new(len: usize) -> AlignedBuf {
        let storage = vec![0u8; len + ALIGN];
        // At run time `align_offset` of a byte pointer is exact (it may
        // only give up during constant evaluation), so `start < ALIGN`.
        let start = storage.as_ptr().align_offset(ALIGN).min(ALIGN);
        AlignedBuf {
            storage,
            start,
            len,
        }
    }

    /// The buffer's bytes.
    pub(super) fn as_slice(&self) -> &[u8] {
        &self.storage[self.start..self.start + self.len]
    }

    /// The buffer's bytes, writable.
    pub(super) fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.storage[self.start..self.start + self.len]
    }
}

/// `len` rounded down to a multiple of [`ALIGN`].
pub(super) fn align_down(len: usize) -> usize {
    len - len % ALIGN
}

/// `len` rounded up to a multiple of [`ALIGN`].
pub(super) fn align_up(len: usize) -> usize {
    len.div_ceil(ALIGN) * ALIGN
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_start_aligned_and_have_the_length_asked() {
        for len in [0, 1, ALIGN - 1, ALIGN, 3 * ALIGN + 17, 1 << 20] {
            let mut buf = AlignedBuf::new(len);
            assert_eq!(buf.as_slice().as_ptr() as usize % ALIGN, 0, "len {len}");
            assert_eq!(buf.as_mut_slice().len(), len);
            assert!(buf.as_slice().iter().all(|&b| b == 0));
        }
    }

    #[test]
    fn rounding() {
        assert_eq!(align_down(ALIGN + 5), ALIGN);
        assert_eq!(align_down(ALIGN - 1), 0);
        assert_eq!(align_up(ALIGN + 5), 2 * ALIGN);
        assert_eq!(align_up(2 * ALIGN), 2 * ALIGN);
        assert_eq!(align_up(0), 0);
    }
}
