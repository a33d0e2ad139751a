//! When the writer holds a batch open for more records (group commit with
//! an adaptive delay).
//!
//! Every sync of the WAL costs the same whatever it carries: on this
//! project's virtual disk about 35 µs of CPU (the kernel's writeback and
//! the virtio notification) and 80 to 130 µs of wall time, measured with a
//! write-and-`fdatasync` loop (20 µs and about 60 µs with the `O_DIRECT`
//! writes the WAL now uses, `wal.rs`). Without a delay, a batch holds what arrived
//! during the previous sync: under load on two cores that was 2 to 3
//! records, so the syncs alone cost 12 to 18 µs of CPU per update, as much
//! as the rest of the daemon's work on it. Holding the batch open a little
//! while records are arriving quickly turns that into a few µs.
//!
//! The delay is only taken when it pays: when the recent arrival rate
//! promises at least [`MIN_EXPECTED`] more records within the delay. A
//! lone client waiting for each answer before sending the next never
//! waits (its next record cannot arrive before its answer), and neither
//! does a store at rest. A batch that reaches the target size is written
//! at once.

use std::time::Duration;

use metropolis_core::time::Instant;

/// The delay is taken only if at least this many more records are
/// expected to arrive within it.
const MIN_EXPECTED: u64 = 2;

/// Weight of the newest sample in the moving average of arrival intervals,
/// as a shift: 1/4.
const EWMA_SHIFT: u32 = 2;

/// The writer's group-commit policy: see the [module documentation](self).
#[derive(Debug)]
pub(super) struct CommitPolicy {
    /// The longest a record waits for company before its batch is written.
    delay: Duration,
    /// Batch size at which the batch is written without waiting longer.
    target: usize,
    /// Moving average of the time between record arrivals, in ns.
    interval_ns: u64,
    /// When the writer last took a batch.
    last_take: Option<Instant>,
}

impl CommitPolicy {
    /// A policy holding batches open for at most `delay` (zero: never) or
    /// until they hold `target` records.
    pub(super) fn new(delay: Duration, target: usize) -> CommitPolicy {
        CommitPolicy {
            delay,
            target: target.max(1),
            interval_ns: u64::MAX,
            last_take: None,
        }
    }

    /// Until when to hold a batch of `queued` records, the first of which
    /// was queued at `first`; `None`: write it now.
    pub(super) fn hold_until(&self, queued: usize, first: Instant) -> Option<Instant> {
        if self.delay.is_zero() || queued >= self.target {
            return None;
        }
        let delay_ns = u64::try_from(self.delay.as_nanos()).unwrap_or(u64::MAX);
        let expected = delay_ns / self.interval_ns.max(1);
        (expected >= MIN_EXPECTED).then(|| first + self.delay)
    }

    /// Records that the writer took a batch of `records` at `now`: every
    /// record that arrived since the previous take is in it, which gives
    /// the arrival rate over that interval.
    pub(super) fn taken(&mut self, records: usize, now: Instant) {
        if let Some(last) = self.last_take.replace(now) {
            let elapsed =
                u64::try_from(now.saturating_duration_since(last).as_nanos()).unwrap_or(u64::MAX);
            let sample = elapsed / u64::try_from(records.max(1)).unwrap_or(u64::MAX);
            self.interval_ns = if self.interval_ns == u64::MAX {
                sample
            } else {
                self.interval_ns - (self.interval_ns >> EWMA_SHIFT) + (sample >> EWMA_SHIFT)
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DELAY: Duration = Duration::from_micros(200);

    /// A policy that saw batches of `records` every `every`, `n` times.
    fn after(records: usize, every: Duration, n: u32) -> (CommitPolicy, Instant) {
        let mut p = CommitPolicy::new(DELAY, 32);
        let mut t = Instant::ZERO;
        for _ in 0..n {
            p.taken(records, t);
            t = t + every;
        }
        (p, t)
    }

    #[test]
    fn a_fresh_or_idle_store_writes_at_once() {
        let p = CommitPolicy::new(DELAY, 32);
        assert_eq!(p.hold_until(1, Instant::ZERO), None);
        // One record per millisecond: fewer than two expected in 200 µs.
        let (p, t) = after(1, Duration::from_millis(1), 20);
        assert_eq!(p.hold_until(1, t), None);
    }

    #[test]
    fn a_lone_closed_loop_client_never_waits() {
        // One record per 150 µs round trip: about 1.3 expected in 200 µs.
        let (p, t) = after(1, Duration::from_micros(150), 50);
        assert_eq!(p.hold_until(1, t), None);
    }

    #[test]
    fn records_arriving_quickly_are_held_until_the_delay_or_the_target() {
        // 3 records per 100 µs: 6 expected in 200 µs.
        let (p, t) = after(3, Duration::from_micros(100), 50);
        assert_eq!(p.hold_until(3, t), Some(t + DELAY));
        assert_eq!(p.hold_until(31, t), Some(t + DELAY));
        assert_eq!(p.hold_until(32, t), None, "the target is reached");
    }

    #[test]
    fn the_rate_follows_the_load_down() {
        let (mut p, mut t) = after(3, Duration::from_micros(100), 50);
        assert!(p.hold_until(1, t).is_some());
        for _ in 0..20 {
            p.taken(1, t);
            t = t + Duration::from_millis(2);
        }
        assert_eq!(p.hold_until(1, t), None);
    }

    #[test]
    fn a_zero_delay_never_holds() {
        let mut p = CommitPolicy::new(Duration::ZERO, 32);
        let mut t = Instant::ZERO;
        for _ in 0..50 {
            p.taken(10, t);
            t = t + Duration::from_micros(10);
        }
        assert_eq!(p.hold_until(1, t), None);
    }
}
