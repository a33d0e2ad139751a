//! The embedded world (`metropolis_sim::embedded`): a curator over the
//! embedded store on a simulated disk, its writer a task on the curator's
//! clock, crashed and restarted mid-commit; 200 seeds in every test run,
//! the store's planted bugs caught, and the determinism check.

use metropolis_sim::World;
use metropolis_sim::campaign::{self, Options};

#[test]
fn seeds_0_to_199() {
    let c = campaign::run(World::Embedded, 0..200, Options::default(), &|_| {});
    println!("seeds 0..200: fired {:?}", c.fired);
    if let Err(problems) = c.verdict() {
        panic!("{problems}");
    }
}

/// A store that acknowledges a failed write, one whose watches deliver
/// what is not durable yet, and one that opens over an acknowledged batch
/// the atlas damaged, are each caught within 1,000 seeds.
#[test]
fn the_stores_planted_bugs_are_caught() {
    for &planted in World::Embedded.catches() {
        match campaign::first_catch(World::Embedded, planted, 0..1000) {
            Some(caught) => println!(
                "{planted:?} caught at seed {}: {}",
                caught.seed, caught.message
            ),
            None => panic!("{planted:?} was not caught in 1,000 seeds"),
        }
    }
}

/// The same seed gives the same calls, answers and recovered records;
/// another seed others.
#[test]
fn the_same_seed_gives_the_same_trace() {
    let (a, b, c) = (
        World::Embedded.run(5),
        World::Embedded.run(5),
        World::Embedded.run(6),
    );
    assert_eq!(a, b);
    assert_ne!(a.trace, c.trace);
}
