//! The cluster world (`metropolis_sim::cluster`): 1,000 seeds in every
//! test run, in four tests that run side by side; the determinism check;
//! and every bug planted in the production code caught.

#![allow(clippy::unwrap_used)]

/// The campaign binary's allocator, here too: the seeds are most of the
/// test run.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::ops::Range;
use std::time::Instant;

use metropolis_sim::campaign::{self, Options};
use metropolis_sim::{Canary, World};

/// Runs `seeds` with nothing planted: none may fail, every kind of fault
/// must fire. Prints the figures.
fn seeds(range: Range<u64>) {
    let started = Instant::now();
    let c = campaign::run(World::Cluster, range.clone(), Options::default(), &|_| {});
    let wall = started.elapsed().as_secs_f64();
    println!(
        "seeds {range:?} in {wall:.1} s: {:.0}x simulated time, {:.0} task polls/s; fired: {:?}",
        c.simulated.as_secs_f64() / wall,
        c.polls as f64 / wall,
        c.fired
    );
    if let Err(problems) = c.verdict() {
        panic!("{problems}");
    }
    assert_eq!(c.seeds, range.end - range.start);
}

#[test]
fn seeds_0_to_249() {
    seeds(0..250);
}

#[test]
fn seeds_250_to_499() {
    seeds(250..500);
}

#[test]
fn seeds_500_to_749() {
    seeds(500..750);
}

#[test]
fn seeds_750_to_999() {
    seeds(750..1000);
}

/// The seed alone decides the run: the same seed twice gives the same
/// trace and the same number of task polls, another seed another trace.
#[test]
fn the_same_seed_gives_the_same_trace() {
    let (a, b, c) = (
        World::Cluster.run(5),
        World::Cluster.run(5),
        World::Cluster.run(6),
    );
    assert_eq!(a, b);
    assert_ne!(a.trace, c.trace);
}

/// Each bug planted in the production code (`metropolis_core::canary`)
/// that this world exercises is caught within 1,000 seeds; the seed that
/// catches it is printed, with what broke.
#[test]
fn every_planted_bug_is_caught() {
    for &planted in World::Cluster.catches() {
        let caught = campaign::first_catch(World::Cluster, planted, 0..1000)
            .unwrap_or_else(|| panic!("{planted:?} was not caught in 1,000 seeds"));
        assert!(
            caught
                .replay
                .contains(&format!("--canary {}", planted.name()))
        );
        println!(
            "{planted:?} caught at seed {}: {}",
            caught.seed, caught.message
        );
    }
    // Nothing stays planted on the thread after a campaign.
    assert!(metropolis_core::canary::planted(Canary::None));
}
