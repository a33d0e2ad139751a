//! Deterministic simulation of the Metropolis control plane over core's
//! sans-IO machines.
//!
//! One `u64` seed drives a whole run ([`run`]): N curator instances
//! ([`curator`]: leadership, forwarding, watch cache and streams) over
//! the store model as etcd ([`store_node`]: leases, compaction), M watch
//! clients and node writers ([`clients`]), K provisioning agents against
//! the machine records ([`agents`]), and trace sessions on an in-memory
//! tracefs ([`trace`]), talking over a simulated network ([`net`]) with
//! the seed's own mix of faults ([`faults`]). Safety invariants are
//! checked as events happen ([`invariants`]), liveness after the faults
//! stop ([`world`]). Every event is folded into a trace hash ([`hash`])
//! for the determinism check. Planted bugs ([`canary`]) check the checks.
//!
//! Simulated code uses no threads, no wall clock, and iterates only
//! ordered collections.

#![forbid(unsafe_code)]

pub mod agents;
pub mod call;
pub mod canary;
pub mod clients;
pub mod commit_check;
pub mod ctx;
pub mod curator;
pub mod faults;
pub mod hash;
pub mod invariants;
pub mod linearizable;
pub mod links;
pub mod model_store;
pub mod msg;
pub mod net;
pub mod rng;
pub mod runtime;
pub mod store_faults;
pub mod store_node;
pub mod trace;
pub mod upstream;
pub mod world;

pub use canary::Canary;
pub use faults::FaultMix;

use net::Time;

/// What one run produced.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// The seed.
    pub seed: u64,
    /// The planted bug, if any.
    pub canary: Canary,
    /// The fault mix the seed chose.
    pub mix: FaultMix,
    /// The hash of every event, in order.
    pub hash: u64,
    /// Events processed.
    pub events: u64,
    /// Simulated time covered, microseconds.
    pub simulated: Time,
    /// The first violation (time, description), if any.
    pub violation: Option<(Time, String)>,
    /// How long after the faults stopped the system converged.
    pub converged_after: Option<Time>,
    /// Counters of what happened.
    pub summary: String,
}

impl Outcome {
    /// Whether every invariant held and the system converged.
    pub fn passed(&self) -> bool {
        self.violation.is_none()
    }

    /// The command that replays this run exactly.
    pub fn replay_command(&self) -> String {
        let canary = if self.canary == Canary::None {
            String::new()
        } else {
            format!(" --canary {}", self.canary)
        };
        format!(
            "cargo run --release -p metropolis-sim -- --seed {}{canary}",
            self.seed
        )
    }

    /// A one-line failure report: seed, replay command, violation.
    pub fn failure_report(&self) -> String {
        match &self.violation {
            None => format!("seed={} passed", self.seed),
            Some((at, what)) => format!(
                "seed={} FAILED at {:.3} s: {what}\n  replay: {}\n  mix: {}",
                self.seed,
                *at as f64 / 1e6,
                self.replay_command(),
                self.mix
            ),
        }
    }
}

/// Runs the simulation of `seed` (with `canary` planted).
pub fn run(seed: u64, canary: Canary) -> Outcome {
    let mut world = world::World::new(seed, canary);
    world.run();
    Outcome {
        seed,
        canary,
        mix: world.mix.clone(),
        hash: world.hash.value(),
        events: world.events,
        simulated: world.now,
        violation: world.checks.violations.first().cloned(),
        converged_after: world.converged_after,
        summary: world.summary(),
    }
}
