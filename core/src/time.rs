//! Time as the machines see it: a monotonic instant passed in by the
//! caller. Machines never read a clock; runtimes convert their clock's
//! readings (or a simulator its virtual time) into [`Instant`].

use std::ops::{Add, Sub};
use std::time::Duration;

/// The buckets of every latency histogram the project exports (the
/// service layer's and the embedded store's), in seconds: 100 µs to about
/// 100 s, doubling (finer than Prometheus's default at the low end, where
/// embedded commits and local calls are). Computed as prometheus-client's
/// `exponential_buckets(0.0001, 2.0, 21)` computes them, so the `le`
/// labels are the same to the last digit.
pub fn latency_buckets() -> impl Iterator<Item = f64> {
    (0..21u8).map(|i| 0.0001 * 2f64.powf(f64::from(i)))
}

/// A point on a monotonic timeline, as an offset from an arbitrary origin
/// chosen by the driver (process start, simulation start).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Instant(Duration);

impl Instant {
    /// The origin of the timeline.
    pub const ZERO: Instant = Instant(Duration::ZERO);

    /// The instant `offset` after the origin.
    pub const fn from_offset(offset: Duration) -> Self {
        Instant(offset)
    }

    /// The offset of this instant from the origin.
    pub const fn offset(self) -> Duration {
        self.0
    }

    /// Time elapsed from `earlier` to `self`, zero if `earlier` is later.
    pub fn saturating_duration_since(self, earlier: Instant) -> Duration {
        self.0.saturating_sub(earlier.0)
    }
}

impl Add<Duration> for Instant {
    type Output = Instant;
    fn add(self, rhs: Duration) -> Instant {
        Instant(self.0.saturating_add(rhs))
    }
}

impl Sub<Instant> for Instant {
    type Output = Duration;
    fn sub(self, rhs: Instant) -> Duration {
        self.saturating_duration_since(rhs)
    }
}
