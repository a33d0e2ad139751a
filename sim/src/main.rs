//! `metropolis-sim`: runs seeds of the deterministic simulation.
//!
//! ```text
//! cargo run --release -p metropolis-sim -- --seeds 100000
//! cargo run --release -p metropolis-sim -- --seed 42 --verbose
//! cargo run --release -p metropolis-sim -- --seeds 1000 --canary skip-fence
//! ```

#![forbid(unsafe_code)]

use std::process::ExitCode;
use std::time::Instant as WallClock;

use clap::Parser;
use metropolis_sim::{Canary, Outcome, run};

/// Deterministic simulation of the Metropolis control plane.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Run this many seeds, starting at --from.
    #[arg(long, default_value_t = 100)]
    seeds: u64,
    /// First seed of --seeds.
    #[arg(long, default_value_t = 0)]
    from: u64,
    /// Run exactly this seed (replaces --seeds/--from).
    #[arg(long)]
    seed: Option<u64>,
    /// Plant a known bug: none, skip-fence, drop-tombstone,
    /// forget-generation, skip-teardown.
    #[arg(long, default_value = "none")]
    canary: Canary,
    /// Print every run's fault mix, counters and hash.
    #[arg(long)]
    verbose: bool,
    /// Worker threads running seeds side by side (each run is
    /// single-threaded and deterministic).
    #[arg(long, default_value_t = 1)]
    jobs: usize,
    /// Stop after this many failures (0: never).
    #[arg(long, default_value_t = 10)]
    max_failures: usize,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let seeds: Vec<u64> = match args.seed {
        Some(s) => vec![s],
        None => (args.from..args.from.saturating_add(args.seeds)).collect(),
    };
    let started = WallClock::now();
    let outcomes = run_all(
        &seeds,
        args.canary,
        args.jobs.max(1),
        args.verbose,
        args.max_failures,
    );
    let wall = started.elapsed();
    let events: u64 = outcomes.iter().map(|o| o.events).sum();
    let simulated: u64 = outcomes.iter().map(|o| o.simulated).sum();
    let failures: Vec<&Outcome> = outcomes.iter().filter(|o| !o.passed()).collect();
    let converged: Vec<u64> = outcomes.iter().filter_map(|o| o.converged_after).collect();
    let worst = converged.iter().max().copied().unwrap_or(0);
    println!("seeds run:             {}", outcomes.len());
    println!("failures:              {}", failures.len());
    for f in &failures {
        println!("  {}", f.failure_report());
    }
    println!(
        "simulated time:        {:.1} s ({:.1} h)",
        simulated as f64 / 1e6,
        simulated as f64 / 3.6e9
    );
    println!("simulated events:      {events}");
    println!("wall time:             {:.1} s", wall.as_secs_f64());
    println!(
        "events per second:     {:.0}",
        events as f64 / wall.as_secs_f64().max(1e-9)
    );
    println!(
        "simulated/wall:        {:.0}x",
        simulated as f64 / 1e6 / wall.as_secs_f64().max(1e-9)
    );
    println!(
        "slowest convergence:   {:.2} s after faults stopped",
        worst as f64 / 1e6
    );
    if failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn report(o: &Outcome, verbose: bool) {
    if verbose {
        println!(
            "seed={} {} hash={:016x} events={} simulated={:.1}s converged_after={:?}\n  mix: {}\n  {}",
            o.seed,
            if o.passed() { "ok" } else { "FAILED" },
            o.hash,
            o.events,
            o.simulated as f64 / 1e6,
            o.converged_after.map(|t| t as f64 / 1e6),
            o.mix,
            o.summary
        );
    }
    if !o.passed() {
        println!("{}", o.failure_report());
    }
}

fn run_all(
    seeds: &[u64],
    canary: Canary,
    jobs: usize,
    verbose: bool,
    max_failures: usize,
) -> Vec<Outcome> {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let next = AtomicUsize::new(0);
    let failures = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let results: Mutex<Vec<Outcome>> = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..jobs {
            scope.spawn(|| {
                loop {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&seed) = seeds.get(i) else { break };
                    let o = run(seed, canary);
                    let mut results = results.lock().unwrap_or_else(|p| p.into_inner());
                    report(&o, verbose);
                    if !o.passed() {
                        let n = failures.fetch_add(1, Ordering::Relaxed) + 1;
                        if max_failures > 0 && n >= max_failures {
                            stop.store(true, Ordering::Relaxed);
                        }
                    }
                    results.push(o);
                }
            });
        }
    });
    let mut results = results.into_inner().unwrap_or_else(|p| p.into_inner());
    results.sort_by_key(|o| o.seed);
    results
}
