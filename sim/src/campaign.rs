//! Running seeds: one ([`World::run`]) or many on worker threads
//! ([`run`]), with a bug planted in the production code or none, and what
//! they did summed ([`Campaign`]).
//!
//! A world's checks panic on a broken invariant; a campaign catches the
//! panic per seed and keeps its message as the seed's [`Failure`], which
//! names the command that replays it.

use std::fmt;
use std::ops::Range;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::str::FromStr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use metropolis_core::canary::{self, Canary};

/// A simulated world a seed runs in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum World {
    /// Curators, the store, writers, watchers and provisioning
    /// ([`crate::cluster`]).
    Cluster,
    /// Trace sessions through the debug service ([`crate::traces`]).
    Traces,
    /// The embedded store over a simulated disk, crashed mid-write
    /// ([`crate::storage`]).
    Storage,
    /// A curator over the embedded store on a simulated disk, crashed
    /// and restarted mid-commit ([`crate::embedded`]).
    Embedded,
}

impl World {
    /// Every world.
    pub const ALL: [World; 4] = [
        World::Cluster,
        World::Traces,
        World::Storage,
        World::Embedded,
    ];

    /// The world's name on a command line.
    pub fn name(self) -> &'static str {
        match self {
            World::Cluster => "cluster",
            World::Traces => "traces",
            World::Storage => "storage",
            World::Embedded => "embedded",
        }
    }

    /// The planted bugs this world's checks are meant to catch (each
    /// within 1,000 seeds, which the tests hold).
    pub fn catches(self) -> &'static [Canary] {
        match self {
            World::Cluster => &[
                Canary::DropFence,
                Canary::SkipCacheFailure,
                Canary::DropTombstones,
                Canary::SkipReadYourWrites,
                Canary::ForwardForwarded,
                Canary::AcceptUnregisteredAgentKey,
                Canary::ForgetLastActed,
                Canary::RebootBeforeDelivered,
            ],
            World::Traces => &[Canary::SkipTeardown],
            World::Storage => &[
                Canary::AckFailedWrite,
                Canary::DamageReadAsTorn,
                Canary::ReadErrorAsMissing,
                Canary::RepairOnOneRead,
            ],
            World::Embedded => &[
                Canary::AckFailedWrite,
                Canary::WatchPastDurable,
                Canary::DamageReadAsTorn,
            ],
        }
    }

    /// Runs `seed` with whatever canary this thread has planted; panics on
    /// a broken invariant.
    pub fn run(self, seed: u64) -> Outcome {
        match self {
            World::Cluster => crate::cluster::run(seed),
            World::Traces => crate::traces::run(seed),
            World::Storage => crate::storage::run(seed),
            World::Embedded => crate::embedded::run(seed),
        }
    }

    /// The command that replays `seed` of this world with `canary`
    /// planted (and the cluster's events printed as they happen).
    pub fn replay_command(self, seed: u64, canary: Canary) -> String {
        let mut command = format!(
            "cargo run --release -p metropolis-sim -- --world {} --seed {seed}",
            self.name()
        );
        if canary != Canary::None {
            command.push_str(&format!(" --canary {}", canary.name()));
        }
        if self == World::Cluster {
            command.push_str(" --log");
        }
        command
    }
}

impl fmt::Display for World {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for World {
    type Err = String;

    fn from_str(s: &str) -> Result<World, String> {
        World::ALL
            .into_iter()
            .find(|w| w.name() == s)
            .ok_or_else(|| "expected `cluster`, `traces`, `storage` or `embedded`".to_string())
    }
}

/// What one seed did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// The seed.
    pub seed: u64,
    /// Every recorded call, answer and backlog, folded: equal for equal
    /// seeds (the determinism check).
    pub trace: u64,
    /// The run's events: tasks the runtime polled (disk ops in the
    /// storage world, which has no simulated runtime).
    pub polls: u64,
    /// Simulated time the run covered.
    pub simulated: Duration,
    /// How often each kind of fault (or other happening a campaign must
    /// see) occurred, by name; the same names in the same order for every
    /// seed of a world.
    pub fired: Vec<(&'static str, u64)>,
}

/// A seed whose checks failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// The seed.
    pub seed: u64,
    /// What broke (the check's panic message).
    pub message: String,
    /// The command that replays the seed.
    pub replay: String,
}

/// How to run a campaign.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// The bug planted on every worker (`Canary::None`: none).
    pub canary: Canary,
    /// Worker threads, each running one seed at a time (at least 1).
    pub jobs: usize,
    /// Stop taking new seeds after this many failures (0: never).
    pub max_failures: usize,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            canary: Canary::None,
            jobs: 1,
            max_failures: 0,
        }
    }
}

/// What a campaign did.
#[derive(Clone, Debug, Default)]
pub struct Campaign {
    /// Seeds that ran to their end (passed or failed).
    pub seeds: u64,
    /// The failed seeds, by seed.
    pub failures: Vec<Failure>,
    /// Task polls, over the seeds that passed.
    pub polls: u64,
    /// Simulated time, over the seeds that passed.
    pub simulated: Duration,
    /// [`Outcome::fired`] summed over the seeds that passed.
    pub fired: Vec<(&'static str, u64)>,
}

impl Campaign {
    /// `Ok` if no seed failed and every kind fired; else what went wrong,
    /// each failure with the command that replays it.
    pub fn verdict(&self) -> Result<(), String> {
        let mut problems: Vec<String> = self
            .failures
            .iter()
            .map(|f| {
                format!(
                    "seed {} failed: {}\n  replay: {}",
                    f.seed, f.message, f.replay
                )
            })
            .collect();
        let never = self.never_fired();
        if !never.is_empty() {
            problems.push(format!("never fired: {}", never.join(", ")));
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("\n"))
        }
    }

    /// The kinds that never fired.
    pub fn never_fired(&self) -> Vec<&'static str> {
        self.fired
            .iter()
            .filter(|(_, n)| *n == 0)
            .map(|(name, _)| *name)
            .collect()
    }

    fn add(&mut self, outcome: &Outcome) {
        self.polls += outcome.polls;
        self.simulated += outcome.simulated;
        if self.fired.is_empty() {
            self.fired = outcome.fired.iter().map(|&(name, _)| (name, 0)).collect();
        }
        for ((name, total), (theirs, n)) in self.fired.iter_mut().zip(&outcome.fired) {
            debug_assert_eq!(name, theirs);
            *total += n;
        }
    }
}

/// Runs the seeds of `seeds` in `world` on `options.jobs` threads, calling
/// `each` with every seed's result as it ends (in the order they end).
pub fn run(
    world: World,
    seeds: Range<u64>,
    options: Options,
    each: &(dyn Fn(&Result<Outcome, Failure>) + Sync),
) -> Campaign {
    let next = AtomicU64::new(seeds.start);
    let failed = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let campaign = Mutex::new(Campaign::default());
    std::thread::scope(|scope| {
        for _ in 0..options.jobs.max(1) {
            scope.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    let seed = next.fetch_add(1, Ordering::Relaxed);
                    if seed >= seeds.end {
                        break;
                    }
                    let result = run_one(world, seed, options.canary);
                    each(&result);
                    let mut campaign = campaign.lock().unwrap_or_else(|p| p.into_inner());
                    campaign.seeds += 1;
                    match result {
                        Ok(outcome) => campaign.add(&outcome),
                        Err(failure) => {
                            campaign.failures.push(failure);
                            let n = failed.fetch_add(1, Ordering::Relaxed) + 1;
                            if options.max_failures > 0 && n >= options.max_failures as u64 {
                                stop.store(true, Ordering::Relaxed);
                            }
                        }
                    }
                }
            });
        }
    });
    let mut campaign = campaign.into_inner().unwrap_or_else(|p| p.into_inner());
    campaign.failures.sort_by_key(|f| f.seed);
    campaign
}

/// The first seed of `seeds` whose checks catch `canary` planted in
/// `world` (one worker, stopping there); `None` if none does.
pub fn first_catch(world: World, canary: Canary, seeds: Range<u64>) -> Option<Failure> {
    let options = Options {
        canary,
        jobs: 1,
        max_failures: 1,
    };
    run(world, seeds, options, &|_| {})
        .failures
        .into_iter()
        .next()
}

/// Runs `seed` with `canary` planted on this thread (removed after).
fn run_one(world: World, seed: u64, canary: Canary) -> Result<Outcome, Failure> {
    canary::plant(canary);
    let result = catch_unwind(AssertUnwindSafe(|| world.run(seed)));
    canary::plant(Canary::None);
    result.map_err(|panic| {
        let message = panic
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| panic.downcast_ref::<&str>().copied())
            .unwrap_or("a check panicked");
        Failure {
            seed,
            message: bounded(message),
            replay: world.replay_command(seed, canary),
        }
    })
}

/// The most of a check's message a [`Failure`] keeps (a check may dump a
/// whole history; the replay shows the rest).
const MESSAGE_LIMIT: usize = 4096;

fn bounded(message: &str) -> String {
    match message.char_indices().nth(MESSAGE_LIMIT) {
        Some((at, _)) => format!("{}... ({} more bytes)", &message[..at], message.len() - at),
        None => message.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_message_is_cut_on_a_character_boundary() {
        assert_eq!(bounded("short"), "short");
        let long = "é".repeat(MESSAGE_LIMIT + 10);
        let cut = bounded(&long);
        assert!(cut.starts_with(&"é".repeat(MESSAGE_LIMIT)));
        assert!(
            cut.ends_with("... (20 more bytes)"),
            "{}",
            &cut[cut.len() - 30..]
        );
    }

    #[test]
    fn a_campaign_sums_by_kind_and_names_what_never_fired() {
        let outcome = |seed, a, b| Outcome {
            seed,
            trace: 0,
            polls: 10,
            simulated: Duration::from_secs(1),
            fired: vec![("a", a), ("b", b)],
        };
        let mut c = Campaign::default();
        c.add(&outcome(1, 2, 0));
        c.add(&outcome(2, 3, 0));
        assert_eq!(c.fired, vec![("a", 5), ("b", 0)]);
        assert_eq!((c.polls, c.simulated), (20, Duration::from_secs(2)));
        assert_eq!(c.never_fired(), vec!["b"]);
        assert_eq!(c.verdict(), Err("never fired: b".to_string()));
        c.add(&outcome(3, 0, 1));
        assert_eq!(c.verdict(), Ok(()));
    }

    #[test]
    fn names_parse_back_and_every_canary_has_its_world() {
        for world in World::ALL {
            assert_eq!(world.name().parse::<World>(), Ok(world));
        }
        assert!("nope".parse::<World>().is_err());
        for canary in Canary::ALL {
            assert_eq!(Canary::from_name(canary.name()), Some(canary));
            let mut worlds = World::ALL.iter().filter(|w| w.catches().contains(&canary));
            assert!(worlds.next().is_some(), "{canary:?} has no world");
        }
    }
}
