//! The overall deadline of one registry request.
//!
//! Socket timeouts bound each read and write, which stops a server that
//! goes silent, but not one that drips a few bytes at a time, each just
//! before the timeout: such a transfer would take forever and hold the
//! installation with it. So every request also has a deadline, counted
//! from its first connection: each read, write and connect gets at most
//! the time left, and once none is left the request fails with
//! [`DeadlinePassed`], which says so (and is told apart from a plain
//! timeout in the installation's report).

use std::fmt;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// Which limit a deadline is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limit {
    /// One request's (`--registry-deadline`).
    Request,
    /// The whole installation's (`--install-timeout`).
    Install,
}

/// When a request must be done by.
#[derive(Clone, Copy, Debug)]
pub struct Deadline {
    at: Instant,
    limit: Duration,
    kind: Limit,
}

/// The error of a request whose deadline passed (inside an
/// [`io::Error`] of kind `TimedOut`).
#[derive(Debug)]
pub struct DeadlinePassed {
    /// The deadline the request had.
    pub limit: Duration,
    /// Which it was.
    pub kind: Limit,
}

impl fmt::Display for DeadlinePassed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            Limit::Request => write!(
                f,
                "not done within the request deadline of {} (--registry-deadline): the registry sends too slowly",
                seconds(self.limit)
            ),
            Limit::Install => write!(
                f,
                "the installation did not end within its limit of {} (--install-timeout)",
                seconds(self.limit)
            ),
        }
    }
}

impl std::error::Error for DeadlinePassed {}

/// A duration as seconds, as an operator gives it (`2 s`, `0.5 s`).
pub fn seconds(duration: Duration) -> String {
    let secs = duration.as_secs_f64();
    if secs.fract() == 0.0 {
        format!("{secs:.0} s")
    } else {
        format!("{secs:.3} s")
    }
}

impl Deadline {
    /// The deadline `limit` from now.
    pub fn after(limit: Duration) -> Deadline {
        Deadline::of(Limit::Request, limit)
    }

    /// The deadline of `kind`, `limit` from now.
    pub fn of(kind: Limit, limit: Duration) -> Deadline {
        Deadline {
            at: Instant::now() + limit,
            limit,
            kind,
        }
    }

    /// The earlier of this deadline and `other`.
    pub fn earliest(self, other: Option<Deadline>) -> Deadline {
        match other {
            Some(other) if other.at < self.at => other,
            _ => self,
        }
    }

    /// The time left.
    pub fn left(&self) -> Duration {
        self.at.saturating_duration_since(Instant::now())
    }

    /// The error saying the deadline passed.
    pub fn passed(&self) -> io::Error {
        io::Error::new(
            io::ErrorKind::TimedOut,
            DeadlinePassed {
                limit: self.limit,
                kind: self.kind,
            },
        )
    }

    /// `timeout`, shortened to the time left (at least 1 ms: sockets have
    /// no zero timeout); the deadline's error once none is left.
    pub fn bound(&self, timeout: Duration) -> io::Result<Duration> {
        let left = self.left();
        if left.is_zero() {
            return Err(self.passed());
        }
        Ok(timeout.min(left).max(Duration::from_millis(1)))
    }

    /// `e`, or the deadline's error when `e` is a timeout and the deadline
    /// is what cut it short.
    pub fn explain(&self, e: io::Error) -> io::Error {
        let timeout = matches!(
            e.kind(),
            io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock
        );
        if timeout && Instant::now() >= self.at {
            self.passed()
        } else {
            e
        }
    }
}

/// A TCP stream whose every read and write is bounded by the I/O timeout
/// and by what is left of the request's deadline.
pub(crate) struct DeadlineSocket {
    tcp: TcpStream,
    io_timeout: Duration,
    deadline: Deadline,
    read_timeout: Option<Duration>,
    write_timeout: Option<Duration>,
}

impl DeadlineSocket {
    pub(crate) fn new(tcp: TcpStream, io_timeout: Duration, deadline: Deadline) -> Self {
        DeadlineSocket {
            tcp,
            io_timeout,
            deadline,
            read_timeout: None,
            write_timeout: None,
        }
    }
}

impl Read for DeadlineSocket {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let timeout = self.deadline.bound(self.io_timeout)?;
        if self.read_timeout != Some(timeout) {
            self.tcp.set_read_timeout(Some(timeout))?;
            self.read_timeout = Some(timeout);
        }
        self.tcp.read(buf).map_err(|e| self.deadline.explain(e))
    }
}

impl Write for DeadlineSocket {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let timeout = self.deadline.bound(self.io_timeout)?;
        if self.write_timeout != Some(timeout) {
            self.tcp.set_write_timeout(Some(timeout))?;
            self.write_timeout = Some(timeout);
        }
        self.tcp.write(buf).map_err(|e| self.deadline.explain(e))
    }

    fn flush(&mut self) -> io::Result<()> {
        self.tcp.flush()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_passed_deadline_says_so() {
        let deadline = Deadline::after(Duration::from_millis(20));
        assert!(deadline.bound(Duration::from_secs(60)).unwrap() <= Duration::from_millis(20));
        std::thread::sleep(Duration::from_millis(30));
        let e = deadline.bound(Duration::from_secs(60)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert!(e.get_ref().is_some_and(|e| e.is::<DeadlinePassed>()));
        assert!(e.to_string().contains("0.020 s"), "{e}");
        let plain = io::Error::from(io::ErrorKind::WouldBlock);
        assert!(
            deadline
                .explain(plain)
                .get_ref()
                .is_some_and(|e| e.is::<DeadlinePassed>())
        );
        let refused = io::Error::from(io::ErrorKind::ConnectionRefused);
        assert_eq!(
            deadline.explain(refused).kind(),
            io::ErrorKind::ConnectionRefused
        );
        assert_eq!(seconds(Duration::from_secs(2)), "2 s");
    }
}
