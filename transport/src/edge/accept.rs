//! What an accept loop does when `accept` fails: back off, warn at a
//! bounded rate, keep serving what is already open.
//!
//! At the file-descriptor limit (EMFILE, ENFILE) or out of kernel memory
//! (ENOBUFS, ENOMEM) every accept fails at once until a connection closes;
//! retrying at once spins a core and floods the log. [`AcceptErrors`]
//! answers each failure with a pause that doubles from
//! [`FIRST_PAUSE`] to [`MAX_PAUSE`] and falls back after a success, and
//! lets one warning through per [`WARN_EVERY`], counting the ones it held
//! back. It is a plain state machine: time is passed in.

use std::io;
use std::time::{Duration, Instant};

/// The pause after the first failure in a row.
pub const FIRST_PAUSE: Duration = Duration::from_millis(5);

/// The longest pause between two attempts.
pub const MAX_PAUSE: Duration = Duration::from_secs(1);

/// At most one warning per this interval.
pub const WARN_EVERY: Duration = Duration::from_secs(10);

/// The failures of one accept loop.
#[derive(Debug, Default)]
pub struct AcceptErrors {
    pause: Option<Duration>,
    last_warning: Option<Instant>,
    held_back: u64,
}

/// What to do after a failed accept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AfterFailure {
    /// How long to wait before accepting again.
    pub pause: Duration,
    /// Log a warning now; it stands for this many earlier failures that
    /// were not logged (0: none).
    pub warn: Option<u64>,
}

impl AcceptErrors {
    /// No failure yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// An accept succeeded: the next failure starts from the first pause.
    pub fn succeeded(&mut self) {
        self.pause = None;
    }

    /// An accept failed with `error` at `now`.
    pub fn failed(&mut self, error: &io::Error, now: Instant) -> AfterFailure {
        let pause = if is_transient(error) {
            // The peer gave up before we accepted: nothing is exhausted.
            Duration::ZERO
        } else {
            let next = match self.pause {
                None => FIRST_PAUSE,
                Some(p) => (p * 2).min(MAX_PAUSE),
            };
            self.pause = Some(next);
            next
        };
        let due = self
            .last_warning
            .is_none_or(|last| now.saturating_duration_since(last) >= WARN_EVERY);
        let warn = if due {
            self.last_warning = Some(now);
            Some(std::mem::take(&mut self.held_back))
        } else {
            self.held_back += 1;
            None
        };
        AfterFailure { pause, warn }
    }
}

/// A failure of one connection only (it was reset before we accepted it).
fn is_transient(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn emfile() -> io::Error {
        io::Error::from_raw_os_error(libc::EMFILE)
    }

    #[test]
    fn pauses_double_up_to_the_maximum_and_reset_after_a_success() {
        let mut errors = AcceptErrors::new();
        let t = Instant::now();
        let pauses: Vec<_> = (0..12).map(|_| errors.failed(&emfile(), t).pause).collect();
        assert_eq!(pauses[0], FIRST_PAUSE);
        assert_eq!(pauses[1], FIRST_PAUSE * 2);
        assert_eq!(*pauses.last().unwrap(), MAX_PAUSE);
        assert!(pauses.windows(2).all(|w| w[0] <= w[1]));
        errors.succeeded();
        assert_eq!(errors.failed(&emfile(), t).pause, FIRST_PAUSE);
    }

    #[test]
    fn one_warning_per_interval_counting_the_rest() {
        let mut errors = AcceptErrors::new();
        let t = Instant::now();
        assert_eq!(errors.failed(&emfile(), t).warn, Some(0));
        for i in 1..100 {
            let at = t + Duration::from_millis(i);
            assert_eq!(errors.failed(&emfile(), at).warn, None);
        }
        let later = t + WARN_EVERY;
        assert_eq!(errors.failed(&emfile(), later).warn, Some(99));
        assert_eq!(errors.failed(&emfile(), later).warn, None);
    }

    #[test]
    fn an_aborted_connection_is_retried_at_once() {
        let mut errors = AcceptErrors::new();
        let aborted = io::Error::from(io::ErrorKind::ConnectionAborted);
        assert_eq!(
            errors.failed(&aborted, Instant::now()).pause,
            Duration::ZERO
        );
    }
}
