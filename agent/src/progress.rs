//! What the operator reads in the agent's log while an image installs:
//! the bytes written, the rate and the time left, at most every
//! [`ProgressLog::EVERY`] and always at the start and the end; then the
//! verification's outcome.

use std::time::{Duration, Instant};

use crate::install::Progress;

/// Turns the installer's [`Progress`] reports into log lines.
#[derive(Debug)]
pub struct ProgressLog {
    last_line: Option<Instant>,
    /// When the layer began to arrive.
    writing_start: Option<Instant>,
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
            writing_start: None,
        }
    }

    /// The line to log for `progress` reported at `now`, if one is due.
    pub fn line(&mut self, progress: &Progress, now: Instant) -> Option<String> {
        let (done, total) = match progress {
            Progress::Manifest { .. } => {
                // The layer starts to arrive right after the manifest.
                self.last_line = Some(now);
                self.writing_start = Some(now);
                return Some(progress.to_string());
            }
            Progress::Writing {
                received,
                layer_size,
                ..
            } => (*received, *layer_size),
            // Reading back runs alongside writing: this is its outcome,
            // reported once.
            Progress::Verifying { .. } => return Some(progress.to_string()),
        };
        let start = *self.writing_start.get_or_insert(now);
        let ended = done >= total;
        let due = self
            .last_line
            .is_none_or(|t| now.duration_since(t) >= Self::EVERY);
        if !ended && !due {
            return None;
        }
        self.last_line = Some(now);
        let elapsed = now.duration_since(start);
        // The rate of the layer's bytes received (compressed or not).
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

    fn writing(received: u64, size: u64) -> Progress {
        Progress::Writing {
            written: received,
            total: Some(size),
            received,
            layer_size: size,
        }
    }

    #[test]
    fn lines_carry_rate_and_time_left_and_are_spaced() {
        let mut log = ProgressLog::new();
        let t0 = Instant::now();
        let manifest = Progress::Manifest {
            layer: "sha256:ab".into(),
            size: 1024 * MIB,
            compressed: false,
        };
        assert!(log.line(&manifest, t0).is_some());
        // Too soon after the last line.
        assert_eq!(log.line(&writing(64 * MIB, 1024 * MIB), t0), None);
        let t1 = t0 + Duration::from_secs(4);
        let line = log.line(&writing(256 * MIB, 1024 * MIB), t1).unwrap();
        // 256 MiB in the 4 s since writing started: 64 MiB/s, 768 MiB left.
        assert!(line.contains("64.0 MiB/s, ETA 12s"), "{line}");
        // The end of a stage is always logged.
        let t2 = t1 + Duration::from_millis(100);
        let line = log.line(&writing(1024 * MIB, 1024 * MIB), t2).unwrap();
        assert!(line.contains("ETA 0s"), "{line}");
        let verifying = Progress::Verifying {
            verified: 1024 * MIB,
            total: 1024 * MIB,
        };
        let line = log.line(&verifying, t2).unwrap();
        assert!(!line.contains("MiB/s"), "{line}");
    }

    #[test]
    fn long_waits_read_in_minutes() {
        assert_eq!(eta(1, 100, Duration::from_secs(10)), "16m30s");
        assert_eq!(eta(0, 100, Duration::from_secs(10)), "unknown");
    }
}
