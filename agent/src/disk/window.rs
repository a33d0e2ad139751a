//! A byte range of a file or block device as a `Read + Write + Seek`
//! stream of its own, for code that formats or fills one partition.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;

use super::layout::Partition;

/// `length` bytes of a device from `offset`, seen as a stream starting at
/// 0. Reads stop at its end; writes past its end are short (and
/// `write_all` fails with `WriteZero`): nothing outside the range is ever
/// read or written. I/O is positional (`pread`/`pwrite`), so the device's
/// own file position is neither used nor moved.
#[derive(Debug)]
pub struct Window<'a> {
    device: &'a File,
    offset: u64,
    length: u64,
    pos: u64,
}

impl<'a> Window<'a> {
    /// The range `offset .. offset + length` of `device`.
    pub fn new(device: &'a File, offset: u64, length: u64) -> Window<'a> {
        Window {
            device,
            offset,
            length,
            pos: 0,
        }
    }

    /// The bytes of `partition` on `device`.
    pub fn partition(device: &'a File, partition: &Partition) -> Window<'a> {
        Window::new(device, partition.offset, partition.length)
    }

    /// The window's length in bytes.
    pub fn len(&self) -> u64 {
        self.length
    }

    /// Whether the window is empty.
    pub fn is_empty(&self) -> bool {
        self.length == 0
    }

    /// Bytes from the current position to the end (at most `want`).
    fn room(&self, want: usize) -> usize {
        let left = self.length.saturating_sub(self.pos);
        usize::try_from(left).map_or(want, |left| left.min(want))
    }
}

impl Read for Window<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.room(buf.len());
        if n == 0 {
            return Ok(0);
        }
        let read = self.device.read_at(&mut buf[..n], self.offset + self.pos)?;
        self.pos += read as u64;
        Ok(read)
    }
}

impl Write for Window<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.room(buf.len());
        if n == 0 {
            return Ok(0);
        }
        let written = self.device.write_at(&buf[..n], self.offset + self.pos)?;
        self.pos += written as u64;
        Ok(written)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Seek for Window<'_> {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let pos = match to {
            SeekFrom::Start(n) => Some(n),
            SeekFrom::End(d) => self.length.checked_add_signed(d),
            SeekFrom::Current(d) => self.pos.checked_add_signed(d),
        };
        self.pos = pos.ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "seek before the window's start",
            )
        })?;
        Ok(self.pos)
    }
}
