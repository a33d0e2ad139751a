//! The traces world (`metropolis_sim::traces`): 200 seeds in every test
//! run, the determinism check, and the planted teardown bug caught.

use metropolis_sim::World;
use metropolis_sim::campaign::{self, Options};

#[test]
fn seeds_0_to_199() {
    let c = campaign::run(World::Traces, 0..200, Options::default(), &|_| {});
    println!("seeds 0..200: fired {:?}", c.fired);
    if let Err(problems) = c.verdict() {
        panic!("{problems}");
    }
}

/// The same seed gives the same trace; another seed another.
#[test]
fn the_same_seed_gives_the_same_trace() {
    let (a, b, c) = (
        World::Traces.run(7),
        World::Traces.run(7),
        World::Traces.run(8),
    );
    assert_eq!(a, b);
    assert_ne!(a.trace, c.trace);
}

/// A cancelled session that skips its teardown is caught within 1,000
/// seeds.
#[test]
fn a_skipped_teardown_is_caught() {
    for &planted in World::Traces.catches() {
        match campaign::first_catch(World::Traces, planted, 0..1000) {
            Some(caught) => println!(
                "{planted:?} caught at seed {}: {}",
                caught.seed, caught.message
            ),
            None => panic!("{planted:?} was not caught in 1,000 seeds"),
        }
    }
}
