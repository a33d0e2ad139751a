//! The simulator in CI: thousands of seeds, the determinism check, the
//! planted bugs, and the liveness bound.

use metropolis_sim::world::LIVENESS_BOUND_SECS;
use metropolis_sim::{Canary, Outcome, run};

/// Seeds per test function; the harness runs the functions in parallel.
const SHARD: u64 = 500;

fn run_shard(shard: u64) {
    let mut failures = Vec::new();
    for seed in shard * SHARD..(shard + 1) * SHARD {
        let o = run(seed, Canary::None);
        if !o.passed() {
            failures.push(o.failure_report());
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {SHARD} seeds failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn seeds_0_to_499() {
    run_shard(0);
}

#[test]
fn seeds_500_to_999() {
    run_shard(1);
}

#[test]
fn seeds_1000_to_1499() {
    run_shard(2);
}

#[test]
fn seeds_1500_to_1999() {
    run_shard(3);
}

/// A sample of seeds, each run twice: the event traces hash equal.
#[test]
fn runs_are_deterministic() {
    for seed in (0..40u64).map(|i| i * 7_919 + 3) {
        let (a, b) = (run(seed, Canary::None), run(seed, Canary::None));
        assert_eq!(
            (a.hash, a.events, a.simulated),
            (b.hash, b.events, b.simulated),
            "seed={seed} ran differently twice: {}",
            a.replay_command()
        );
    }
    // Different seeds do differ.
    assert_ne!(run(1, Canary::None).hash, run(2, Canary::None).hash);
}

/// Every passing run converged within the stated bound after the faults
/// stopped: one leader, every watcher's view equal to the store, every
/// agent's latest request answered, every call and trace session ended.
#[test]
fn liveness_after_healing_within_bound() {
    let outcomes: Vec<Outcome> = (10_000..10_100).map(|s| run(s, Canary::None)).collect();
    for o in &outcomes {
        assert!(o.passed(), "{}", o.failure_report());
        let after = o.converged_after.expect("a passing run converged");
        assert!(
            after <= LIVENESS_BOUND_SECS * 1_000_000,
            "seed={} converged {after} us after healing",
            o.seed
        );
    }
}

fn caught(canary: Canary) -> (u64, String) {
    for seed in 0..1_000u64 {
        let o = run(seed, canary);
        if let Some((_, what)) = &o.violation {
            return (seed, what.clone());
        }
    }
    panic!("canary {canary} not caught within 1,000 seeds");
}

#[test]
fn canary_skip_fence_is_caught() {
    let (seed, what) = caught(Canary::SkipFence);
    eprintln!("skip-fence caught at seed {seed}: {what}");
}

#[test]
fn canary_drop_tombstone_is_caught() {
    let (seed, what) = caught(Canary::DropTombstone);
    eprintln!("drop-tombstone caught at seed {seed}: {what}");
}

#[test]
fn canary_forget_generation_is_caught() {
    let (seed, what) = caught(Canary::ForgetGeneration);
    eprintln!("forget-generation caught at seed {seed}: {what}");
}

#[test]
fn canary_skip_teardown_is_caught() {
    let (seed, what) = caught(Canary::SkipTeardown);
    eprintln!("skip-teardown caught at seed {seed}: {what}");
}
