//! The process's monotonic clock as the machines see it.

use metropolis_core::ports::MonotonicClock;
use metropolis_core::time::Instant;

/// Monotonic time as offsets from a fixed origin (the moment it was
/// created): converts between [`std::time::Instant`] and the machines'
/// [`Instant`]. Copies share the origin, so everything fed to one machine
/// must come from copies of one `ProcessClock`.
#[derive(Clone, Copy, Debug)]
pub struct ProcessClock {
    origin: std::time::Instant,
}

impl ProcessClock {
    /// A clock whose origin is now.
    pub fn new() -> ProcessClock {
        ProcessClock {
            origin: std::time::Instant::now(),
        }
    }

    /// `t` on the machines' timeline (the origin if `t` is earlier).
    pub fn at(&self, t: std::time::Instant) -> Instant {
        Instant::from_offset(t.saturating_duration_since(self.origin))
    }

    /// The [`std::time::Instant`] of `t`, to sleep until it.
    pub fn instant(&self, t: Instant) -> std::time::Instant {
        self.origin + t.offset()
    }
}

impl Default for ProcessClock {
    fn default() -> Self {
        ProcessClock::new()
    }
}

impl MonotonicClock for ProcessClock {
    fn now(&self) -> Instant {
        self.at(std::time::Instant::now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_never_goes_back() {
        let clock = ProcessClock::new();
        let a = clock.now();
        let t = std::time::Instant::now();
        let b = clock.at(t);
        assert!(b >= a);
        assert_eq!(clock.at(clock.instant(b)), b);
        let before = clock.origin.checked_sub(std::time::Duration::from_secs(1));
        if let Some(before) = before {
            assert_eq!(clock.at(before), Instant::ZERO);
        }
    }
}
