//! A clock moved by hand: [`ManualClock`], both the [`MonotonicClock`]
//! and the [`WallClock`] port, standing still until the test advances it.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use metropolis_core::ports::{MonotonicClock, WallClock};
use metropolis_core::time::Instant;

struct State {
    /// Time advanced since the clock was made.
    elapsed: Duration,
    /// The wall-clock time when it was made, ms since the Unix epoch.
    unix_ms_at_start: i64,
}

/// A clock that moves only when told ([`advance`](Self::advance)); clones
/// share the time. As a [`MonotonicClock`] it starts at
/// [`Instant::ZERO`]; as a [`WallClock`] at the Unix time it was made
/// with ([`at_unix_ms`](Self::at_unix_ms); the epoch for
/// [`new`](Self::new)), and both move together.
#[derive(Clone)]
pub struct ManualClock {
    state: Arc<Mutex<State>>,
}

impl Default for ManualClock {
    fn default() -> Self {
        ManualClock::new()
    }
}

impl ManualClock {
    /// A clock at [`Instant::ZERO`] and the Unix epoch.
    pub fn new() -> ManualClock {
        ManualClock::at_unix_ms(0)
    }

    /// A clock at [`Instant::ZERO`] and `unix_ms` ms after the Unix epoch.
    pub fn at_unix_ms(unix_ms: i64) -> ManualClock {
        ManualClock {
            state: Arc::new(Mutex::new(State {
                elapsed: Duration::ZERO,
                unix_ms_at_start: unix_ms,
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Moves the clock `by` forward.
    pub fn advance(&self, by: Duration) {
        self.lock().elapsed += by;
    }

    /// The time advanced since the clock was made.
    pub fn elapsed(&self) -> Duration {
        self.lock().elapsed
    }
}

impl MonotonicClock for ManualClock {
    fn now(&self) -> Instant {
        Instant::from_offset(self.elapsed())
    }
}

impl WallClock for ManualClock {
    fn now_unix_ms(&self) -> i64 {
        let s = self.lock();
        let elapsed = i64::try_from(s.elapsed.as_millis()).unwrap_or(i64::MAX);
        s.unix_ms_at_start.saturating_add(elapsed)
    }
}
