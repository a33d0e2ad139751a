//! Reading `trace_pipe` on a dedicated thread, delivered as a stream of
//! lines through a bounded `futures` channel.
//!
//! A read of `trace_pipe` blocks in the kernel until there is data, and a
//! blocked read cannot be interrupted from another thread portably. So the
//! file is opened with `O_NONBLOCK` and the thread waits in `poll(2)` on
//! two descriptors: the pipe, and the read end of a private wake-up pipe.
//! [`HostPipe::close`] drops the wake-up pipe's write end, which makes its
//! read end report `POLLHUP` at once; the thread returns, closing
//! `trace_pipe`, and `close` joins it. A close therefore takes about one
//! system call, not a timeout.
//!
//! The `poll` also has a timeout ([`POLL_INTERVAL`]) after which the thread
//! reads anyway: the kernel may delay `trace_pipe`'s poll wake-up until the
//! buffer is `buffer_percent` full, so a quiet trace still reaches the
//! client within that interval.
//!
//! Backpressure: once [`QUEUE_LINES`] lines wait in the channel, the thread
//! stops reading and the kernel keeps the data in its ring buffer (which,
//! if the client stays slow, overwrites the oldest events; that is the
//! kernel's own trade-off). Lines are split at `\n`; a partial line at the
//! end of a read is kept until its newline arrives (or until it exceeds
//! [`MAX_LINE`], then it is delivered as is). Invalid UTF-8 is replaced
//! (`TraceEvent.raw_line` is a string).

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::fd::OwnedFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::thread::JoinHandle;
use std::time::Duration;

use futures::channel::mpsc;
use futures::{Stream, StreamExt};
use metropolis_core::trace::{FailureKind, TracePipe, TracefsFailure};
// The splitter is core's (pure); re-exported where it was.
pub use metropolis_core::trace::{LineSplitter, MAX_LINE};
use rustix::event::{PollFd, PollFlags, Timespec};

/// How long the reader waits in `poll` before reading anyway.
pub const POLL_INTERVAL: Duration = Duration::from_millis(100);

/// Lines queued towards the consumer before the reader pauses.
pub const QUEUE_LINES: usize = 1024;

/// How long the reader waits before retrying a full queue.
const FULL_RETRY: Duration = Duration::from_millis(10);

/// One item for the consumer.
type Item = Result<String, TracefsFailure>;

/// Why [`HostPipe::open`] failed.
#[derive(Debug)]
pub enum OpenError {
    /// Opening the file failed.
    Open(io::Error),
    /// Creating the wake-up pipe or the thread failed.
    Setup(io::Error),
}

/// An open `trace_pipe` read by its own thread; a [`TracePipe`].
#[derive(Debug)]
pub struct HostPipe {
    rx: mpsc::Receiver<Item>,
    /// Dropping it wakes the reader up for good.
    wake: Option<OwnedFd>,
    thread: Option<JoinHandle<()>>,
}

impl HostPipe {
    /// Opens `path` (non-blocking) and starts its reader thread.
    pub fn open(path: &Path) -> Result<HostPipe, OpenError> {
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32)
            .open(path)
            .map_err(OpenError::Open)?;
        let (wake_rx, wake_tx) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
            .map_err(|e| OpenError::Setup(e.into()))?;
        let (tx, rx) = mpsc::channel(QUEUE_LINES);
        let reader = Reader {
            file,
            wake: wake_rx,
            tx,
            path: path.to_owned(),
            splitter: LineSplitter::new(),
            out: VecDeque::new(),
            ended: false,
        };
        let thread = std::thread::Builder::new()
            .name("trace-pipe".into())
            .spawn(move || reader.run())
            .map_err(OpenError::Setup)?;
        Ok(HostPipe {
            rx,
            wake: Some(wake_tx),
            thread: Some(thread),
        })
    }
}

impl Stream for HostPipe {
    type Item = Item;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Item>> {
        self.rx.poll_next_unpin(cx)
    }
}

impl TracePipe for HostPipe {
    fn close(&mut self) -> Result<(), TracefsFailure> {
        self.wake = None;
        self.rx.close();
        match self.thread.take().map(JoinHandle::join) {
            Some(Err(_)) => Err(TracefsFailure::new(
                FailureKind::Other,
                "the trace_pipe reader thread panicked",
            )),
            _ => Ok(()),
        }
    }
}

impl Drop for HostPipe {
    fn drop(&mut self) {
        // A panic of the reader was already reported by its thread.
        let _ = self.close();
    }
}

/// The reader thread's state.
struct Reader {
    file: File,
    wake: OwnedFd,
    tx: mpsc::Sender<Item>,
    path: PathBuf,
    splitter: LineSplitter,
    /// Items read but not yet accepted by the channel.
    out: VecDeque<Item>,
    /// Whether reading is over (an error or end of file was queued).
    ended: bool,
}

/// What a wait in `poll` ended with.
enum Woken {
    /// Closed: stop now.
    Stop,
    /// Data, or the timeout: try to read.
    Read,
}

impl Reader {
    fn run(mut self) {
        loop {
            // The consumer closed or dropped the receiver: a second way to
            // stop, at the latest one poll interval later.
            if self.tx.is_closed() || !self.flush() {
                return;
            }
            if !self.out.is_empty() {
                // Channel full: wait for room (or close) without reading.
                if let Woken::Stop = self.wait(false, FULL_RETRY) {
                    return;
                }
                continue;
            }
            if self.ended {
                return; // Everything delivered, the error last.
            }
            if let Woken::Stop = self.wait(true, POLL_INTERVAL) {
                return;
            }
            self.read_available();
        }
    }

    /// Moves queued items into the channel until it is full. False when the
    /// receiver is gone.
    fn flush(&mut self) -> bool {
        while let Some(item) = self.out.pop_front() {
            match self.tx.try_send(item) {
                Ok(()) => {}
                Err(e) if e.is_full() => {
                    self.out.push_front(e.into_inner());
                    return true;
                }
                Err(_) => return false,
            }
        }
        true
    }

    /// Waits until the wake-up pipe is closed, `trace_pipe` is readable
    /// (if `for_data`), or `timeout` passed.
    fn wait(&self, for_data: bool, timeout: Duration) -> Woken {
        let timeout = Timespec::try_from(timeout).unwrap_or(Timespec {
            tv_sec: 1,
            tv_nsec: 0,
        });
        let data_flags = if for_data {
            PollFlags::IN
        } else {
            PollFlags::empty()
        };
        let mut fds = [
            PollFd::new(&self.wake, PollFlags::IN),
            PollFd::new(&self.file, data_flags),
        ];
        match rustix::event::poll(&mut fds, Some(&timeout)) {
            Ok(_) if !fds[0].revents().is_empty() => Woken::Stop,
            Ok(_) | Err(rustix::io::Errno::INTR) => Woken::Read,
            // poll itself failing (ENOMEM) is not worth ending the
            // session for: the next round retries after the timeout.
            Err(_) => {
                std::thread::sleep(POLL_INTERVAL);
                Woken::Read
            }
        }
    }

    /// Reads until the kernel has nothing more (`EAGAIN`) or the queue is
    /// full, splitting into lines.
    fn read_available(&mut self) {
        let mut buf = [0u8; 16 * 1024];
        while self.out.len() < QUEUE_LINES {
            match self.file.read(&mut buf) {
                Ok(0) => return self.end("end of file"),
                Ok(n) => {
                    let out = &mut self.out;
                    self.splitter
                        .push(&buf[..n], |line| out.push_back(Ok(line)));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return self.end(&e.to_string()),
            }
        }
    }

    /// Queues the partial line and a final error; reading is over.
    fn end(&mut self, why: &str) {
        if let Some(line) = self.splitter.finish() {
            self.out.push_back(Ok(line));
        }
        self.out.push_back(Err(TracefsFailure::new(
            FailureKind::Other,
            format!("{}: {why}", self.path.display()),
        )));
        self.ended = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A FIFO stands in for trace_pipe: lines split across writes arrive
    /// whole, the end of the writer becomes an error after the partial
    /// line, and close returns promptly while the reader waits in poll.
    #[test]
    fn reader_thread_delivers_lines_and_stops_on_close() {
        use std::io::Write;
        let dir = tempfile::tempdir().expect("temp dir");
        let fifo = dir.path().join("trace_pipe");
        rustix::fs::mkfifoat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
        )
        .expect("mkfifo");
        // A read-write open of a FIFO does not block and counts as a
        // writer, so the reader does not see an end of file before data.
        let fifo_writer = || {
            OpenOptions::new()
                .read(true)
                .write(true)
                .open(&fifo)
                .expect("open fifo writer")
        };
        let mut writer = fifo_writer();
        let mut pipe = HostPipe::open(&fifo).expect("open fifo");
        writer.write_all(b"one\ntw").expect("write");
        std::thread::sleep(Duration::from_millis(50));
        writer.write_all(b"o\nthr").expect("write");
        std::thread::sleep(Duration::from_millis(50));
        drop(writer);
        let items: Vec<Item> = futures::executor::block_on(pipe.by_ref().take(4).collect());
        assert_eq!(items[0].as_deref(), Ok("one"));
        assert_eq!(items[1].as_deref(), Ok("two"));
        assert_eq!(items[2].as_deref(), Ok("thr"));
        assert!(items[3].is_err(), "{:?}", items[3]);
        pipe.close().expect("close");

        let writer = fifo_writer();
        let mut idle = HostPipe::open(&fifo).expect("reopen fifo");
        std::thread::sleep(Duration::from_millis(10));
        let started = std::time::Instant::now();
        idle.close().expect("close");
        // Without the wake-up the join would wait out the poll timeout
        // (about 90 ms from here).
        assert!(
            started.elapsed() < Duration::from_millis(50),
            "close waited {:?}",
            started.elapsed()
        );
        drop(writer);
    }
}
