//! What the operator reads in the agent's log while an image installs:
//! the image, then per payload the bytes written, the rate and the time
//! left, at most every [`ProgressLog::EVERY`] and always at the start and
//! the end; and each step of laying out the disk. Sizes read in the unit
//! that fits them ([`size`]: 512 KiB, not 0.5 MiB); a rate is given only
//! once a payload has been written for [`ProgressLog::RATE_AFTER`], never
//! over no time.

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

const KIB: f64 = 1024.0;
const MIB: f64 = 1024.0 * 1024.0;
const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// `bytes` for people: bytes under 1 KiB, KiB under 1 MiB, MiB under
/// 1 GiB, else GiB (`512 B`, `64.0 KiB`, `12.5 MiB`, `1.50 GiB`).
pub fn size(bytes: u64) -> String {
    let b = bytes as f64;
    if b < KIB {
        format!("{bytes} B")
    } else if b < MIB {
        format!("{:.1} KiB", b / KIB)
    } else if b < GIB {
        format!("{:.1} MiB", b / MIB)
    } else {
        format!("{:.2} GiB", b / GIB)
    }
}

/// The rate of `bytes` written over `elapsed` (`12.5 MiB/s`), or `None`
/// when too little time has passed for it to mean anything.
fn rate(bytes: u64, elapsed: Duration) -> Option<String> {
    if elapsed < ProgressLog::RATE_AFTER {
        return None;
    }
    let per_s = (bytes as f64 / elapsed.as_secs_f64()).round() as u64;
    Some(format!("{}/s", size(per_s)))
}

/// What `progress` says, sizes in the unit that fits them.
fn describe(progress: &Progress) -> String {
    match progress {
        Progress::Image { kind, payloads } => {
            let mut text = format!("image verified: {kind}");
            for (i, (name, bytes, compressed)) in payloads.iter().enumerate() {
                let sep = if i == 0 { "; " } else { ", " };
                let zstd = if *compressed { " (zstd)" } else { "" };
                text.push_str(&format!("{sep}{name} {}{zstd}", size(*bytes)));
            }
            text
        }
        Progress::Writing {
            payload,
            written,
            total,
        } => format!(
            "{payload}: verified, written and read back {} of {}",
            size(*written),
            size(*total)
        ),
        other => other.to_string(),
    }
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

    /// How long a payload must have been written before its rate is
    /// given (a rate over less time is noise, over none a division by
    /// zero).
    pub const RATE_AFTER: Duration = Duration::from_millis(500);

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
                return Some(describe(progress));
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
        let text = describe(progress);
        // The rate of the payload's verified bytes (uncompressed), and
        // the time left at that rate.
        Some(match rate(done, elapsed) {
            Some(rate) => format!("{text}, {rate}, ETA {}", eta(done, total, elapsed)),
            None => text,
        })
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
        assert_eq!(
            line,
            "system: verified, written and read back 256.0 MiB of 1.00 GiB, 64.0 MiB/s, ETA 12s"
        );
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
    fn small_sizes_read_in_kib_and_rates_need_time() {
        assert_eq!(size(0), "0 B");
        assert_eq!(size(1023), "1023 B");
        assert_eq!(size(512 * 1024), "512.0 KiB");
        assert_eq!(size(MIB - 1), "1024.0 KiB");
        assert_eq!(size(MIB), "1.0 MiB");
        assert_eq!(size(3 * 1024 * MIB / 2), "1.50 GiB");
        let image = Progress::Image {
            kind: crate::install::ImageKind::Metropolis,
            payloads: vec![("kernel.efi".into(), 300 * 1024, false)],
        };
        let mut log = ProgressLog::new();
        let t0 = Instant::now();
        let line = log.line(&image, t0).unwrap();
        assert!(line.ends_with("; kernel.efi 300.0 KiB"), "{line}");
        // A small payload written at once: no rate over no time.
        let small = Progress::Writing {
            payload: "kernel.efi".into(),
            written: 300 * 1024,
            total: 300 * 1024,
        };
        let line = log.line(&small, t0).unwrap();
        assert_eq!(
            line,
            "kernel.efi: verified, written and read back 300.0 KiB of 300.0 KiB"
        );
        assert_eq!(rate(300 * 1024, Duration::ZERO), None);
        assert_eq!(rate(300 * 1024, Duration::from_millis(499)), None);
        assert_eq!(
            rate(300 * 1024, Duration::from_secs(1)).as_deref(),
            Some("300.0 KiB/s")
        );
        for line in [
            line,
            log.line(&writing(MIB, 2 * MIB), t0).unwrap_or_default(),
        ] {
            assert!(!line.contains("Some(") && !line.contains("inf"), "{line}");
        }
    }

    #[test]
    fn long_waits_read_in_minutes() {
        assert_eq!(eta(1, 100, Duration::from_secs(10)), "16m30s");
        assert_eq!(eta(0, 100, Duration::from_secs(10)), "unknown");
    }
}
