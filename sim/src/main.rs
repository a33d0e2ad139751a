//! `metropolis-sim`: runs seeds of the deterministic simulation of the
//! shipped code.
//!
//! ```text
//! cargo run --release -p metropolis-sim -- --seeds 100000 --jobs 2
//! cargo run --release -p metropolis-sim -- --seed 42 --log
//! cargo run --release -p metropolis-sim -- --seeds 1000 --canary drop-fence
//! cargo run --release -p metropolis-sim -- --world traces --seeds 20000 --jobs 2
//! ```

#![forbid(unsafe_code)]

use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use clap::Parser;
use metropolis_sim::campaign::{self, Options};
use metropolis_sim::{Canary, Failure, Outcome, World, cluster};

/// A campaign allocates and frees for every call, frame and task: mimalloc
/// rather than glibc's malloc (which took 11 % of a campaign's time).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Campaigns of at least this many seeds fail if a kind of fault never
/// fired (fewer seeds may not draw every kind).
const EVERY_KIND_FROM: u64 = 100;

/// Runs seeds of the deterministic simulation: the shipped curator,
/// agent-callback and debug services on a simulated runtime, network and
/// store, under seeded faults, with every invariant checked per seed.
///
/// Prints the campaign's figures (simulated/wall time, task polls per
/// second, faults fired by kind) and, for each failing seed, what broke
/// and the one command that replays it. Exit status: 0 if every seed
/// passed (and, from 100 seeds on, every kind of fault fired), 1
/// otherwise, 2 on a usage error.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// The world to run: `cluster` (curators, store, writers, watchers,
    /// provisioning), `traces` (debug trace sessions), `storage` (the
    /// embedded store over a simulated disk, crashed mid-write; no
    /// simulated time, so its simulated/wall figure is 0) or `embedded`
    /// (a curator over the embedded store on that disk, serving node
    /// writers and a watcher, crashed and restarted mid-commit).
    #[arg(long, default_value = "cluster")]
    world: World,
    /// Run this many seeds, starting at --from.
    #[arg(long, default_value_t = 1000)]
    seeds: u64,
    /// First seed of --seeds.
    #[arg(long, default_value_t = 0)]
    from: u64,
    /// Run exactly this seed (replaces --seeds and --from).
    #[arg(long)]
    seed: Option<u64>,
    /// Plant a bug in the production code: drop-fence,
    /// skip-cache-failure, drop-tombstones, skip-read-your-writes,
    /// forward-forwarded, accept-unregistered-agent-key,
    /// forget-last-acted, reboot-before-delivered (cluster);
    /// skip-teardown (traces);
    /// ack-failed-write, damage-read-as-torn (storage, embedded);
    /// read-error-as-missing, repair-on-one-read (storage);
    /// watch-past-durable (embedded). A campaign with a canary passes only if some seed
    /// catches it.
    #[arg(long, default_value = "none", value_parser = parse_canary)]
    canary: Canary,
    /// Worker threads, each running one seed at a time (each seed is
    /// single-threaded and deterministic).
    #[arg(long, default_value_t = 1)]
    jobs: usize,
    /// Stop after this many failures (0: never).
    #[arg(long, default_value_t = 10)]
    max_failures: usize,
    /// Print every seed's trace hash, task polls and faults fired.
    #[arg(long)]
    verbose: bool,
    /// Print the cluster's events as they happen (role changes, writers'
    /// calls, watchers' backlogs) to stderr: for replaying one seed.
    #[arg(long)]
    log: bool,
}

fn parse_canary(name: &str) -> Result<Canary, String> {
    Canary::from_name(name).ok_or_else(|| {
        let names: Vec<&str> = Canary::ALL.iter().map(|c| c.name()).collect();
        format!("expected `none` or one of {}", names.join(", "))
    })
}

fn main() -> ExitCode {
    let args = Args::parse();
    if args.canary != Canary::None && !args.world.catches().contains(&args.canary) {
        eprintln!(
            "error: the {} world does not exercise --canary {}; it catches: {}",
            args.world,
            args.canary.name(),
            names(args.world.catches())
        );
        return ExitCode::from(2);
    }
    cluster::log_events(args.log);
    let seeds = match args.seed {
        Some(seed) => seed..seed.saturating_add(1),
        None => args.from..args.from.saturating_add(args.seeds),
    };
    let total = seeds.end - seeds.start;
    let done = AtomicU64::new(0);
    let started = Instant::now();
    let each = |result: &Result<Outcome, Failure>| {
        let n = done.fetch_add(1, Ordering::Relaxed) + 1;
        match result {
            Ok(outcome) if args.verbose => println!("{}", describe(outcome)),
            Ok(_) => {}
            Err(failure) => println!(
                "seed {} FAILED: {}\n  replay: {}",
                failure.seed, failure.message, failure.replay
            ),
        }
        if total >= 1000 && n.is_multiple_of(1000) {
            eprintln!(
                "{n}/{total} seeds, {:.0} s",
                started.elapsed().as_secs_f64()
            );
        }
    };
    let options = Options {
        canary: args.canary,
        jobs: args.jobs,
        // A planted bug needs catching once.
        max_failures: if args.canary == Canary::None {
            args.max_failures
        } else {
            1
        },
    };
    let result = campaign::run(args.world, seeds, options, &each);
    let wall = started.elapsed().as_secs_f64().max(1e-9);
    print_figures(&args, &result, wall);
    verdict(&args, &result)
}

fn names(canaries: &[Canary]) -> String {
    if canaries.is_empty() {
        return "none".to_string();
    }
    let names: Vec<&str> = canaries.iter().map(|c| c.name()).collect();
    names.join(", ")
}

fn describe(o: &Outcome) -> String {
    let fired: Vec<String> = o.fired.iter().map(|(k, n)| format!("{k}={n}")).collect();
    format!(
        "seed {} ok: trace {:016x}, {} task polls, {:.1} s simulated; {}",
        o.seed,
        o.trace,
        o.polls,
        o.simulated.as_secs_f64(),
        fired.join(" ")
    )
}

fn print_figures(args: &Args, c: &campaign::Campaign, wall: f64) {
    let simulated = c.simulated.as_secs_f64();
    println!("world:                 {}", args.world);
    println!("canary:                {}", args.canary.name());
    println!("seeds run:             {}", c.seeds);
    println!("failures:              {}", c.failures.len());
    for f in &c.failures {
        println!("  seed {}: {}", f.seed, first_line(&f.message));
        println!("    replay: {}", f.replay);
    }
    println!(
        "simulated time:        {simulated:.0} s ({:.1} h), of the seeds that passed",
        simulated / 3600.0
    );
    println!("wall time:             {wall:.1} s");
    println!("simulated/wall:        {:.0}x", simulated / wall);
    println!("task polls:            {}", c.polls);
    println!("task polls per second: {:.0}", c.polls as f64 / wall);
    println!("fired, by kind:");
    for (kind, n) in &c.fired {
        println!("  {kind:<34} {n}");
    }
}

fn first_line(message: &str) -> &str {
    let line = message.lines().next().unwrap_or("");
    match line.char_indices().nth(300) {
        Some((at, _)) => &line[..at],
        None => line,
    }
}

fn verdict(args: &Args, c: &campaign::Campaign) -> ExitCode {
    if args.canary != Canary::None {
        return match c.failures.first() {
            Some(f) => {
                println!("{} caught at seed {}", args.canary.name(), f.seed);
                ExitCode::SUCCESS
            }
            None => {
                println!("{} was NOT caught in {} seeds", args.canary.name(), c.seeds);
                ExitCode::FAILURE
            }
        };
    }
    let never = c.never_fired();
    if !never.is_empty() {
        println!("never fired:           {}", never.join(", "));
    }
    let every_kind_required = c.seeds >= EVERY_KIND_FROM;
    if c.failures.is_empty() && (never.is_empty() || !every_kind_required) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
