//! What the operator reads in the agent's log while an image installs:
//! the image, then per payload the bytes written, the rate and the time
//! left, at most every [`ProgressLog::EVERY`] and always at the start and
//! the end; and each step of laying out the disk.

use std::time::{Duration, Instant};

use crate::install::Progress;

/// Turns the installer's [`Progress`] reports into log lines.
#[derive(Debug)]
pub struct ProgressLog {
    last_line: Option<Instant>,
    /// The payload being written and when it began.
    writing: Option<(String, Instant)>,
}

impl Default for ProgressLog {
    fn default() -> Self {
        Self::new()
    }
}

fn mib_per_s(bytes: u64, elapsed: Duration) -> f64 {
    bytes as f64 / (1024.0 * 1024.0) / elapsed.as_secs_f64().max(1e-3)
}

fn eta(done: u64, total: u64, elapsed: Duration) -> String {
    if done == 0 {
        return "unknown".into();
    }
    if done >= total {
        return "0s".into();
    }
    let left = elapsed.as_secs_f64() * (total - done) as f64 / done as f64;
    match left.round() as u64 {
        s @ 0..120 => format!("{s}s"),
        s => format!("{}m{:02}s", s / 60, s % 60),
    }
}

impl ProgressLog {
    /// The longest gap between two lines of a stage.
    pub const EVERY: Duration = Duration::from_secs(2);

    /// A log that has written nothing yet.
    pub fn new() -> ProgressLog {
        ProgressLog {
            last_line: None,
            writing: None,
        }
    }

    /// The line to log for `progress` reported at `now`, if one is due.
    pub fn line(&mut self, progress: &Progress, now: Instant) -> Option<String> {
        let (payload, done, total) = match progress {
            Progress::Writing {
                payload,
                written,
                total,
            } => (payload, *written, *total),
            _ => {
                self.last_line = Some(now);
                return Some(progress.to_string());
            }
        };
        let start = match &self.writing {
            Some((current, start)) if current == payload => *start,
            _ => {
                self.writing = Some((payload.clone(), now));
                now
            }
        };
        let ended = done >= total;
        let due = self
            .last_line
            .is_none_or(|t| now.duration_since(t) >= Self::EVERY);
        if !ended && !due {
            return None;
        }
        self.last_line = Some(now);
        let elapsed = now.duration_since(start);
        // The rate of the payload's verified bytes (uncompressed).
        Some(format!(
            "{progress}, {:.1} MiB/s, ETA {}",
            mib_per_s(done, elapsed),
            eta(done, total, elapsed)
        ))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const MIB: u64 = 1024 * 1024;

    fn writing(written: u64, size: u64) -> Progress {
        Progress::Writing {
            payload: "system".into(),
            written,
            total: size,
        }
    }

    #[test]
    fn lines_carry_rate_and_time_left_and_are_spaced() {
        let mut log = ProgressLog::new();
        let t0 = Instant::now();
        let image = Progress::Image {
            kind: crate::install::ImageKind::Metropolis,
            payloads: vec![("system".into(), 1024 * MIB, false)],
        };
        assert!(log.line(&image, t0).is_some());
        // The first report of a payload starts its clock.
        assert!(log.line(&writing(0, 1024 * MIB), t0).is_none());
        // Too soon after the last line.
        assert_eq!(log.line(&writing(64 * MIB, 1024 * MIB), t0), None);
        let t1 = t0 + Duration::from_secs(4);
        let line = log.line(&writing(256 * MIB, 1024 * MIB), t1).unwrap();
        // 256 MiB in the 4 s since writing started: 64 MiB/s, 768 MiB left.
        assert!(line.contains("64.0 MiB/s, ETA 12s"), "{line}");
        // The end of a payload is always logged.
        let t2 = t1 + Duration::from_millis(100);
        let line = log.line(&writing(1024 * MIB, 1024 * MIB), t2).unwrap();
        assert!(line.contains("ETA 0s"), "{line}");
        let step = Progress::Step {
            done: "partition table written",
        };
        let line = log.line(&step, t2).unwrap();
        assert_eq!(line, "partition table written");
    }

    #[test]
    fn long_waits_read_in_minutes() {
        assert_eq!(eta(1, 100, Duration::from_secs(10)), "16m30s");
        assert_eq!(eta(0, 100, Duration::from_secs(10)), "unknown");
    }
}
