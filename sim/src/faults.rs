//! The fault mix of one run, drawn from its seed ("swarm" testing: each
//! fault is switched on or off per seed, and the enabled ones get their
//! own rate), so that different seeds stress different combinations.

use std::fmt;

use crate::rng::Rng;

/// Sizes and fault rates of one run. Rates are per second of simulated
/// time unless said otherwise; probabilities are per message or per
/// operation.
#[derive(Clone, Debug, PartialEq)]
pub struct FaultMix {
    /// Curator instances.
    pub curators: usize,
    /// Watch clients (NodesInCluster streams).
    pub watchers: usize,
    /// Provisioning agents (one machine each).
    pub agents: usize,
    /// Clients writing node records (UpdateNodeStatus and node add/remove).
    pub writers: usize,
    /// Simulated seconds of the fault phase (then faults stop and the
    /// healing phase starts).
    pub chaos_secs: u64,
    /// Base one-way latency range, milliseconds.
    pub latency_ms: (u64, u64),
    /// Probability a unary message is dropped; a dropped stream message
    /// breaks its stream (the connection resets).
    pub drop: f64,
    /// Probability a unary message is delivered twice.
    pub dup: f64,
    /// Probability a message is held back by up to `stall_ms` more
    /// (reordering it with later ones; streams stay FIFO).
    pub reorder: f64,
    /// The longest extra delay of a held-back message, milliseconds.
    pub stall_ms: u64,
    /// Partitions started per second.
    pub partitions: f64,
    /// Whether partitions may be one-way (asymmetric).
    pub asymmetric: bool,
    /// Process crashes (curators and agents) per second.
    pub crashes: f64,
    /// Process pauses (longer than the lease TTL at times) per second.
    pub pauses: f64,
    /// Forward clock jumps of a process's local clock per second.
    pub clock_jumps: f64,
    /// Store compactions per second.
    pub compactions: f64,
    /// Operator deletions of the leader's election key per second.
    pub key_deletes: f64,
    /// Probability a tracefs operation fails.
    pub tracefs_fail: f64,
    /// Probability an install fails.
    pub install_fail: f64,
}

impl FaultMix {
    /// Draws a mix: each fault is enabled with probability 1/2, and an
    /// enabled one gets a rate from its range.
    pub fn draw(rng: &mut Rng) -> FaultMix {
        let on = |rng: &mut Rng, lo: f64, hi: f64| {
            if rng.chance(0.5) {
                lo + (hi - lo) * rng.unit()
            } else {
                0.0
            }
        };
        let lo = rng.range(1, 10);
        let hi = lo + rng.range(0, 30);
        FaultMix {
            curators: rng.range(2, 5) as usize,
            watchers: rng.range(1, 3) as usize,
            agents: rng.range(1, 3) as usize,
            writers: rng.range(1, 2) as usize,
            chaos_secs: rng.range(10, 30),
            latency_ms: (lo, hi),
            drop: on(rng, 0.005, 0.15),
            dup: on(rng, 0.005, 0.1),
            reorder: on(rng, 0.01, 0.2),
            stall_ms: rng.range(50, 4_000),
            partitions: on(rng, 0.05, 0.4),
            asymmetric: rng.chance(0.5),
            crashes: on(rng, 0.02, 0.2),
            pauses: on(rng, 0.02, 0.2),
            clock_jumps: on(rng, 0.02, 0.2),
            compactions: on(rng, 0.1, 2.0),
            key_deletes: on(rng, 0.02, 0.15),
            tracefs_fail: on(rng, 0.01, 0.2),
            install_fail: on(rng, 0.05, 0.5),
        }
    }

    /// The mix with every fault off (the healing phase): latency stays.
    pub fn healed(&self) -> FaultMix {
        FaultMix {
            drop: 0.0,
            dup: 0.0,
            reorder: 0.0,
            partitions: 0.0,
            crashes: 0.0,
            pauses: 0.0,
            clock_jumps: 0.0,
            compactions: 0.0,
            key_deletes: 0.0,
            tracefs_fail: 0.0,
            install_fail: 0.0,
            ..self.clone()
        }
    }
}

impl fmt::Display for FaultMix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "curators={} watchers={} agents={} writers={} chaos={}s latency={}-{}ms \
             drop={:.3} dup={:.3} reorder={:.3}(<={}ms) partitions={:.2}/s{} crashes={:.2}/s \
             pauses={:.2}/s clock_jumps={:.2}/s compactions={:.2}/s key_deletes={:.2}/s \
             tracefs_fail={:.2} install_fail={:.2}",
            self.curators,
            self.watchers,
            self.agents,
            self.writers,
            self.chaos_secs,
            self.latency_ms.0,
            self.latency_ms.1,
            self.drop,
            self.dup,
            self.reorder,
            self.stall_ms,
            self.partitions,
            if self.asymmetric { "(asym)" } else { "" },
            self.crashes,
            self.pauses,
            self.clock_jumps,
            self.compactions,
            self.key_deletes,
            self.tracefs_fail,
            self.install_fail,
        )
    }
}
