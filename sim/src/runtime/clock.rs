//! Each simulated node's clocks: a monotonic clock that starts at its own
//! offset and runs at its own rate (drift, in parts per million), and a
//! wall clock on top of it that can jump, backwards too.
//!
//! Global (simulated) time is microseconds since the run began; it is
//! what the executor's timers are ordered by. A node sees only its own
//! clocks.

use std::time::Duration;

/// One node's clocks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NodeClock {
    /// The node's monotonic reading at global time zero, µs.
    pub offset_us: u64,
    /// How much faster (positive) or slower than global time the node's
    /// clock runs, in parts per million (at most ±100,000).
    pub drift_ppm: i64,
    /// The wall clock minus the monotonic clock, ms (changed by jumps).
    pub wall_minus_monotonic_ms: i64,
}

impl NodeClock {
    /// A clock drawn from `rng`: an offset of up to 1,000 s and a drift
    /// of up to ±`max_drift_ppm`; the wall clock on the monotonic one.
    pub fn seeded(rng: &mut crate::rng::Rng, max_drift_ppm: u64) -> NodeClock {
        NodeClock {
            offset_us: rng.below(1_000_000_000),
            drift_ppm: i64::try_from(rng.range(0, 2 * max_drift_ppm)).unwrap_or(0)
                - i64::try_from(max_drift_ppm).unwrap_or(0),
            wall_minus_monotonic_ms: 0,
        }
    }

    /// The node's monotonic reading at global time `global_us`, µs.
    pub fn local_us(&self, global_us: u64) -> u64 {
        let drift = i128::from(global_us) * i128::from(self.drift_ppm) / 1_000_000;
        let local = i128::from(self.offset_us) + i128::from(global_us) + drift;
        u64::try_from(local.max(0)).unwrap_or(u64::MAX)
    }

    /// The earliest global time at which the node's monotonic clock reads
    /// `local_us` or later.
    pub fn global_us(&self, local_us: u64) -> u64 {
        if local_us <= self.local_us(0) {
            return 0;
        }
        // The inverse of `local_us`, then corrected for rounding: the
        // clock is monotonic, so a few steps settle it.
        let rate = 1_000_000 + i128::from(self.drift_ppm);
        let since = i128::from(local_us) - i128::from(self.offset_us);
        let mut global =
            u64::try_from((since * 1_000_000 / rate.max(1)).max(0)).unwrap_or(u64::MAX);
        while global > 0 && self.local_us(global - 1) >= local_us {
            global -= 1;
        }
        while self.local_us(global) < local_us {
            global += 1;
        }
        global
    }

    /// The node's wall clock at global time `global_us`, ms since the
    /// Unix epoch given the simulation's epoch `epoch_ms`.
    pub fn wall_ms(&self, epoch_ms: i64, global_us: u64) -> i64 {
        let monotonic_ms = i64::try_from(self.local_us(global_us) / 1000).unwrap_or(i64::MAX);
        epoch_ms
            .saturating_add(monotonic_ms)
            .saturating_add(self.wall_minus_monotonic_ms)
    }
}

/// `d` in whole microseconds.
pub fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn global_time_is_the_inverse_of_local_time() {
        for drift_ppm in [-100_000, -37, 0, 1, 250, 100_000] {
            let clock = NodeClock {
                offset_us: 5_000_123,
                drift_ppm,
                wall_minus_monotonic_ms: 0,
            };
            for local in [5_000_123, 5_000_124, 6_000_000, 9_999_999_999] {
                let global = clock.global_us(local);
                assert!(clock.local_us(global) >= local, "{drift_ppm} {local}");
                assert!(global == 0 || clock.local_us(global - 1) < local);
            }
            assert_eq!(clock.global_us(0), 0);
        }
    }

    #[test]
    fn a_fast_clock_reaches_its_deadlines_early() {
        let fast = NodeClock {
            drift_ppm: 1000,
            ..NodeClock::default()
        };
        // One local second is 999,001 µs of global time.
        assert_eq!(fast.global_us(1_000_000), 999_001);
        assert_eq!(fast.wall_ms(1_000, 2_000_000), 1_000 + 2_002);
    }
}
