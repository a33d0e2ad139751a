//! Starting the writeback of a large staged file while it is written, so
//! that the fsync of the commit finds little left to write, without the
//! writer ever waiting for the disk on a window it just wrote.
//!
//! Each time another [`WINDOW`] bytes have been written, their writeback
//! is started (`sync_file_range(SYNC_FILE_RANGE_WRITE)`, which queues the
//! pages and returns), and the writer waits only for the window before
//! that one, which has had a whole window's worth of writing to complete.
//! So at most two windows of a file are dirty or under writeback at once
//! because of it, and the disk works while the next window arrives.
//!
//! This is not durability: `sync_file_range` writes no metadata and does
//! not flush the device's cache. The commit still fsyncs every blob before
//! it becomes visible.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

/// Bytes written between two starts of writeback.
pub(crate) const WINDOW: u64 = 32 * 1024 * 1024;

/// Where a file's writeback stands.
#[derive(Debug, Default)]
pub(crate) struct Writeback {
    /// Bytes whose writeback was started.
    started: u64,
    /// Bytes whose writeback was waited for.
    waited: u64,
}

/// A range of a file: offset and length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Range(pub(crate) u64, pub(crate) u64);

/// What to do after a write: start the writeback of one range, then wait
/// for another (each possibly empty).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Plan {
    pub(crate) start: Option<Range>,
    pub(crate) wait: Option<Range>,
}

impl Writeback {
    /// The file is now `written` bytes long: what to start and wait for.
    pub(crate) fn plan(&mut self, written: u64) -> Plan {
        if written < self.started + WINDOW {
            return Plan {
                start: None,
                wait: None,
            };
        }
        let start = Range(self.started, written - self.started);
        let wait =
            (self.started > self.waited).then(|| Range(self.waited, self.started - self.waited));
        self.waited = self.started;
        self.started = written;
        Plan {
            start: Some(start),
            wait,
        }
    }

    /// [`plan`](Self::plan), carried out on `file`.
    pub(crate) fn after_write(&mut self, file: &File, written: u64) -> io::Result<()> {
        let plan = self.plan(written);
        if let Some(Range(offset, len)) = plan.start {
            sync_file_range(file, offset, len, libc::SYNC_FILE_RANGE_WRITE)?;
        }
        if let Some(Range(offset, len)) = plan.wait {
            sync_file_range(
                file,
                offset,
                len,
                libc::SYNC_FILE_RANGE_WAIT_BEFORE
                    | libc::SYNC_FILE_RANGE_WRITE
                    | libc::SYNC_FILE_RANGE_WAIT_AFTER,
            )?;
        }
        Ok(())
    }
}

fn sync_file_range(file: &File, offset: u64, len: u64, flags: libc::c_uint) -> io::Result<()> {
    let (Ok(offset), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "file range past i64::MAX",
        ));
    };
    // SAFETY: the descriptor is `file`'s, open for the whole call;
    // sync_file_range reads no memory of this process.
    let rc = unsafe { libc::sync_file_range(file.as_raw_fd(), offset, len, flags) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: u64 = WINDOW;

    #[test]
    fn nothing_before_a_whole_window() {
        let mut wb = Writeback::default();
        assert_eq!(wb.plan(W - 1).start, None);
        assert_eq!(wb.plan(W - 1).wait, None);
    }

    #[test]
    fn starts_each_window_and_waits_only_for_the_one_before() {
        let mut wb = Writeback::default();
        let first = wb.plan(W + 10);
        assert_eq!(first.start, Some(Range(0, W + 10)));
        assert_eq!(
            first.wait, None,
            "the window just started is not waited for"
        );
        assert_eq!(wb.plan(2 * W).start, None, "less than a window since");
        let second = wb.plan(2 * W + 10);
        assert_eq!(second.start, Some(Range(W + 10, W)));
        assert_eq!(second.wait, Some(Range(0, W + 10)));
        let third = wb.plan(4 * W);
        assert_eq!(third.start, Some(Range(2 * W + 10, 2 * W - 10)));
        assert_eq!(third.wait, Some(Range(W + 10, W)));
    }

    #[test]
    fn a_real_file_takes_the_calls() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("f");
        let mut file = File::create(&path).expect("create");
        let chunk = vec![7u8; 1 << 20];
        let mut wb = Writeback::default();
        let mut written = 0u64;
        for _ in 0..(3 * W / chunk.len() as u64) {
            io::Write::write_all(&mut file, &chunk).expect("write");
            written += chunk.len() as u64;
            wb.after_write(&file, written).expect("sync_file_range");
        }
        assert_eq!((wb.started, wb.waited), (3 * W, 2 * W));
        assert_eq!(std::fs::metadata(&path).expect("stat").len(), 3 * W);
    }
}
