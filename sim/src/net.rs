//! The simulated network: seeded latency, drops, duplicates, reordering
//! and (symmetric or one-way) partitions. Deliveries are events of the
//! world's queue, ordered by (time, sequence).

use std::collections::{BTreeMap, BTreeSet};

use crate::faults::FaultMix;
use crate::msg::{Addr, Msg, StreamId};
use crate::rng::Rng;

/// Microseconds of simulated (global) time.
pub type Time = u64;

/// What becomes of one message sent.
#[derive(Debug, PartialEq, Eq)]
pub enum Fate {
    /// Delivered at these instants (two for a duplicate).
    Deliver(Vec<Time>),
    /// Lost (a unary message).
    Lost,
    /// Lost, and its stream's connection breaks.
    Break(StreamId),
}

/// The network's fault state.
#[derive(Debug)]
pub struct Net {
    mix: FaultMix,
    /// Directed links that deliver nothing: (from, to).
    blocked: BTreeSet<(Addr, Addr)>,
    /// Per stream, the latest delivery instant scheduled (FIFO).
    stream_last: BTreeMap<StreamId, Time>,
    /// Messages delivered, dropped, duplicated (for the report).
    pub stats: [u64; 3],
}

impl Net {
    /// A network with `mix`'s rates and no partition.
    pub fn new(mix: FaultMix) -> Net {
        Net {
            mix,
            blocked: BTreeSet::new(),
            stream_last: BTreeMap::new(),
            stats: [0; 3],
        }
    }

    /// Changes the fault rates (the healing phase turns them off).
    pub fn set_mix(&mut self, mix: FaultMix) {
        self.mix = mix;
    }

    /// Blocks the link `from -> to`.
    pub fn block(&mut self, from: Addr, to: Addr) {
        self.blocked.insert((from, to));
    }

    /// Heals every partition.
    pub fn heal(&mut self) {
        self.blocked.clear();
    }

    /// Whether `from -> to` is blocked.
    pub fn is_blocked(&self, from: Addr, to: Addr) -> bool {
        self.blocked.contains(&(from, to))
    }

    fn latency(&self, rng: &mut Rng) -> Time {
        let (lo, hi) = self.mix.latency_ms;
        let mut us = rng.range(lo * 1_000, hi * 1_000);
        if rng.chance(self.mix.reorder) {
            us += rng.range(0, self.mix.stall_ms * 1_000);
        }
        us
    }

    /// Decides the fate of `msg` sent at `now` from `from` to `to`.
    pub fn send(&mut self, rng: &mut Rng, now: Time, from: Addr, to: Addr, msg: &Msg) -> Fate {
        let blocked = self.blocked.contains(&(from, to));
        match msg.stream() {
            Some(stream) => {
                if matches!(msg, Msg::Reset { .. }) {
                    return Fate::Deliver(vec![now + self.latency(rng)]);
                }
                if blocked || rng.chance(self.mix.drop) {
                    self.stats[1] += 1;
                    self.stream_last.remove(&stream);
                    return Fate::Break(stream);
                }
                let at = now + self.latency(rng);
                let last = self.stream_last.entry(stream).or_insert(0);
                let at = at.max(*last);
                *last = at;
                self.stats[0] += 1;
                Fate::Deliver(vec![at])
            }
            None => {
                if blocked || rng.chance(self.mix.drop) {
                    self.stats[1] += 1;
                    return Fate::Lost;
                }
                let mut at = vec![now + self.latency(rng)];
                if rng.chance(self.mix.dup) {
                    self.stats[2] += 1;
                    at.push(now + self.latency(rng));
                }
                self.stats[0] += 1;
                Fate::Deliver(at)
            }
        }
    }

    /// Forgets a closed stream.
    pub fn forget_stream(&mut self, stream: StreamId) {
        self.stream_last.remove(&stream);
    }
}
