//! What a simulated process gets while it handles one event: the time
//! (global, and its own local clock), the run's generator, an outbox, a
//! way to ask for a wake-up, and the checks.

use std::time::Duration;

use metropolis_core::time::Instant;

use crate::canary::Canary;
use crate::invariants::Checks;
use crate::msg::{Addr, Msg};
use crate::net::Time;
use crate::rng::Rng;

/// The handling context of one event of one process.
pub struct Ctx<'a> {
    /// Global simulated time, microseconds.
    pub now: Time,
    /// This process's clock offset from global time (clock jumps move it
    /// forward; local time never goes back).
    pub offset: Time,
    /// This process.
    pub me: Addr,
    /// The run's generator.
    pub rng: &'a mut Rng,
    /// Messages to send: (from, to, message).
    pub out: &'a mut Vec<(Addr, Addr, Msg)>,
    /// Wake-ups asked for: (process, global time).
    pub wakes: &'a mut Vec<(Addr, Time)>,
    /// The checks.
    pub checks: &'a mut Checks,
    /// The run's ID counter (ops, calls, streams).
    pub ids: &'a mut u64,
    /// The planted bug, if any.
    pub canary: Canary,
    /// Whether the fault phase is over.
    pub healing: bool,
}

/// `micros` as a [`Duration`].
pub fn us(micros: u64) -> Duration {
    Duration::from_micros(micros)
}

impl Ctx<'_> {
    /// This process's local clock.
    pub fn local(&self) -> Instant {
        Instant::from_offset(us(self.now + self.offset))
    }

    /// Sends `msg` to `to`.
    pub fn send(&mut self, to: Addr, msg: Msg) {
        self.out.push((self.me, to, msg));
    }

    /// A fresh ID (unique within the run).
    pub fn fresh_id(&mut self) -> u64 {
        *self.ids += 1;
        *self.ids
    }

    /// Asks to be woken after `d`.
    pub fn wake_in(&mut self, d: Duration) {
        let at = self.now + d.as_micros() as u64;
        self.wakes.push((self.me, at));
    }

    /// Asks to be woken when the local clock reads `at` (or now, if it
    /// already does).
    pub fn wake_at_local(&mut self, at: Instant) {
        // Rounded up: machines compute instants to the nanosecond.
        let local = at.offset().as_nanos().div_ceil(1_000) as u64;
        let global = local.saturating_sub(self.offset).max(self.now);
        self.wakes.push((self.me, global));
    }
}
