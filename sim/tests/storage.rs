//! The storage world (`metropolis_sim::storage`): the embedded store over
//! a simulated disk, power lost in the middle of its writes and its writes
//! and syncs failed; 300 seeds in every test run, and the determinism
//! check.

use metropolis_sim::World;
use metropolis_sim::campaign::{self, Options};

#[test]
fn seeds_0_to_299() {
    let c = campaign::run(World::Storage, 0..300, Options::default(), &|_| {});
    println!("seeds 0..300: fired {:?}", c.fired);
    if let Err(problems) = c.verdict() {
        panic!("{problems}");
    }
}

/// A store that acknowledges a failed write, one that opens over an
/// acknowledged batch the atlas damaged (reading it as a torn write), one
/// that takes a WAL it failed to read for a missing one, and one that
/// zeroes a torn tail on one read of it (so a misread byte erases an
/// acknowledged batch), are each caught within 1,000 seeds.
#[test]
fn the_stores_planted_bugs_are_caught() {
    for &planted in World::Storage.catches() {
        match campaign::first_catch(World::Storage, planted, 0..1000) {
            Some(caught) => println!(
                "{planted:?} caught at seed {}: {}",
                caught.seed, caught.message
            ),
            None => panic!("{planted:?} was not caught in 1,000 seeds"),
        }
    }
}

/// The same seed gives the same disk ops and the same recovered state at
/// every open; another seed another.
#[test]
fn the_same_seed_gives_the_same_trace() {
    let (a, b, c) = (
        World::Storage.run(3),
        World::Storage.run(3),
        World::Storage.run(4),
    );
    assert_eq!(a, b);
    assert_ne!(a.trace, c.trace);
}
