//! `metropolis-chaos`: a fault campaign on real processes. Each schedule
//! starts 3 etcd members and 3 curators (`metropolisd` elected over etcd)
//! on loopback addresses of their own, runs a workload through the client
//! (writers, watchers, agents), injects a seeded schedule of faults
//! (kills, pauses, network cuts, clock jumps, a full disk), heals, and
//! checks the recorded history (`checks.rs`). See docs/chaos.md.

mod checks;
mod faults;
mod history;
mod preflight;
mod report;
mod schedule;
mod workload;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use metropolis_tests::campaign::{cleanup, cluster};

use crate::cluster::{Cluster, N, Programs};
use crate::faults::Injector;
use crate::faults::nft::Firewall;
use crate::history::{Clock, Micros, NodeState, Seen};
use crate::report::{FaultWindow, Totals};
use crate::schedule::Schedule;
use crate::workload::Workload;

/// What "served again within the lease TTL plus a bound" allows beyond
/// the TTL: a new leader's first snapshot and the clients' backoff and
/// reconnects.
pub const RECOVERY_BOUND: Duration = Duration::from_secs(5);

const ABOUT: &str = "A fault campaign on real processes: 3 etcd members and 3 curators \
(metropolisd elected over etcd), faults from seeded schedules, every history checked.";

const LONG_ABOUT: &str = "A fault campaign on real processes: each schedule starts 3 etcd \
members (127.0.10.1-3, ports 2379/2380) and 3 curators (127.0.20.1-3, ports 7835/7836; \
metropolisd elected over etcd, lease TTL --lease-ttl), runs a workload through the client \
(one UpdateNodeStatus writer per node, NodesInCluster and NodeInCluster watchers, agents \
heartbeating, probes reading fresh Watch backlogs), injects a seeded schedule of faults for \
--seconds, heals, and checks the history: per node linearizable updates and no acknowledged \
update lost; each watcher synced once, never going back, ending at the store's state; every \
client served again within the lease TTL plus 5 s after healing; no process exiting unasked.

NEEDS: root; etcd (Debian etcd-server); nft (nftables); libfaketime (faketime); mount, \
umount, mountpoint, kill; metropolisd-under-test built with the etcd feature next to this \
program (`cargo build -p metropolis-tests --features system --bins`) or --daemon-bin. \
Checked before anything is changed; what is missing is named and nothing is touched.

CHANGES ON THE MACHINE, and undoes at the end, on an error, on a panic and on \
Ctrl-C/SIGTERM/SIGHUP: an nftables table `inet metropolis_chaos` (a stale one from an \
interrupted run is deleted at start); a 32 MiB tmpfs per curator under the work directory; \
the processes it starts (each under its own group ID 64010-64022, which the rules tell \
apart); a work directory under --work-dir or the temporary directory.

REPLAY: schedule k of a run uses seed SEED+k and prints it; a failing schedule prints the \
exact command that replays it (`--seed S --schedules 1` with the same options). A seed \
gives the same faults at the same times; the processes' timing is the machine's.";

/// The campaign's options.
#[derive(Parser, Debug, Clone)]
#[command(name = "metropolis-chaos", about = ABOUT, long_about = LONG_ABOUT)]
pub struct Cli {
    /// How many schedules to run (seeds SEED, SEED+1, ...).
    #[arg(long, default_value_t = 1)]
    pub schedules: u64,
    /// The first schedule's seed. Default: from the clock (printed).
    #[arg(long)]
    pub seed: Option<u64>,
    /// The length of each schedule's fault phase, in seconds.
    #[arg(long, default_value_t = 20)]
    pub seconds: u64,
    /// How many nodes write their status (one writer each).
    #[arg(long, default_value_t = 3)]
    pub nodes: usize,
    /// The curators' lease TTL in seconds (their --lease-ttl).
    #[arg(long, default_value_t = 2)]
    pub lease_ttl: u64,
    /// The daemon to run. Default: metropolisd-under-test next to this
    /// program.
    #[arg(long, value_name = "PATH")]
    pub daemon_bin: Option<PathBuf>,
    /// Plant this bug: sets METROPOLIS_CANARY for the daemon, which must
    /// be a canary build (metropolisd-canary, see docs/chaos.md).
    #[arg(long, value_name = "NAME")]
    pub canary: Option<String>,
    /// The etcd binary. Default: `etcd` on the PATH.
    #[arg(long, value_name = "PATH", default_value = "etcd")]
    pub etcd_bin: PathBuf,
    /// Where each schedule's work directory is made. Default: the
    /// temporary directory.
    #[arg(long, value_name = "DIR")]
    pub work_dir: Option<PathBuf>,
    /// Keep the work directories (logs of every process) and print them.
    #[arg(long)]
    pub keep: bool,
    /// Stop after this many failing schedules (0: run them all).
    #[arg(long, default_value_t = 0)]
    pub max_failures: u64,
    /// Succeed only if a violation is found (for a planted bug); stops
    /// at the first failing schedule.
    #[arg(long)]
    pub expect_violations: bool,
}

impl Cli {
    /// The command that replays schedule `seed` alone.
    fn replay(&self, seed: u64) -> String {
        let exe = std::env::current_exe()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|_| "metropolis-chaos".into());
        let mut cmd = format!(
            "{exe} --seed {seed} --schedules 1 --seconds {} --nodes {} --lease-ttl {}",
            self.seconds, self.nodes, self.lease_ttl
        );
        if let Some(d) = &self.daemon_bin {
            cmd.push_str(&format!(" --daemon-bin {}", d.display()));
        }
        if let Some(c) = &self.canary {
            cmd.push_str(&format!(" --canary {c}"));
        }
        if self.etcd_bin.as_os_str() != "etcd" {
            cmd.push_str(&format!(" --etcd-bin {}", self.etcd_bin.display()));
        }
        cmd.push_str(" --keep");
        cmd
    }
}

/// One schedule's outcome.
struct Outcome {
    violations: Vec<checks::Violation>,
}

async fn run_schedule(
    cli: &Cli,
    programs: &Programs,
    own_gid: u32,
    seed: u64,
    totals: &mut Totals,
) -> Result<Outcome, String> {
    let ttl = Duration::from_secs(cli.lease_ttl);
    let schedule = Schedule::generate(seed, Duration::from_secs(cli.seconds), ttl);
    let base = cli.work_dir.clone().unwrap_or_else(std::env::temp_dir);
    let work = tempfile::Builder::new()
        .prefix(&format!("metropolis-chaos-{seed}-"))
        .tempdir_in(&base)
        .map_err(|e| format!("creating a work directory under {}: {e}", base.display()))?
        .keep();
    cleanup::set_work_dir((!cli.keep).then_some(work.as_path()));
    let mut initiators: Vec<_> = (0..N).map(cluster::etcd_initiator).collect();
    initiators.extend((0..N).map(cluster::curator_initiator));
    let clients = cluster::client_initiator(own_gid);
    initiators.push(clients);
    let firewall = Firewall::create(&initiators)?;
    let token = format!("chaos-{seed}");
    println!(
        "schedule seed {seed}: {} faults over {} s",
        schedule.steps.len(),
        cli.seconds
    );
    let mut cluster = Cluster::start(&work, programs.clone(), &token).await?;
    let clock = Clock::start();
    let mut workload = Workload::start(&cluster.owner_dir(), cli.nodes, clock, seed).await?;
    let mut violations = Vec::new();
    sleep_watching(&mut cluster, Duration::from_secs(1)).await;

    // The fault phase.
    let phase_start = clock.now();
    let mut windows = Vec::new();
    {
        let mut injector = Injector {
            cluster: &mut cluster,
            firewall: &firewall,
            clients,
            token: token.clone(),
        };
        for step in &schedule.steps {
            let at = phase_start + micros(step.at);
            let now = clock.now();
            if at > now {
                sleep_watching(injector.cluster, Duration::from_micros(at - now)).await;
            }
            let start = clock.now();
            let applied = injector.apply(&step.fault).await?;
            println!(
                "  {:>6.1} s  {}: {} for {:.1} s",
                (start - phase_start) as f64 / 1e6,
                step.fault,
                applied.hit,
                step.lasts.as_secs_f64()
            );
            sleep_watching(injector.cluster, step.lasts).await;
            if let Err(e) = injector.revert(&applied).await {
                violations.push(checks::Violation {
                    check: "no unexpected exit",
                    detail: format!("undoing `{}`: {e}", step.fault),
                });
            }
            windows.push(FaultWindow {
                kind: step.fault.kind(),
                start,
                end: clock.now(),
            });
        }
        let end = phase_start + micros(schedule.length);
        let now = clock.now();
        if end > now {
            sleep_watching(injector.cluster, Duration::from_micros(end - now)).await;
        }
        // Healing.
        if let Err(e) = injector.heal().await {
            violations.push(checks::Violation {
                check: "no unexpected exit",
                detail: format!("healing: {e}"),
            });
        }
    }
    let healed = clock.now();
    let bound = micros(ttl + RECOVERY_BOUND);
    // Until every writer and agent was served again, or the bound passed.
    loop {
        cluster.poll_exits();
        let served = checks::recovery(&workload.recorder.lock(), healed, u64::MAX / 4).is_empty();
        if served || clock.now() > healed + bound {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let span_end = clock.now();
    workload.stop_writes().await;

    // The final read: a fresh backlog through each instance.
    let ids = workload.recorder.lock().nodes.clone();
    let mut store: Option<std::collections::BTreeMap<String, NodeState>> = None;
    let read_until = clock.now() + bound;
    for via in 0..N {
        loop {
            let kind = metropolis_proto::prelude::curator::watch_request::Kind::NodesInCluster(
                Default::default(),
            );
            let got = workload::probe::backlog(
                &workload.owner,
                via,
                kind,
                &ids,
                clock,
                &workload.recorder,
                Duration::ZERO,
            )
            .await;
            match got {
                Ok(view) => {
                    match &store {
                        None => store = Some(view),
                        Some(s) if *s != view => violations.push(checks::Violation {
                            check: "final view is the store's",
                            detail: format!(
                                "the final backlogs through curator-0 and curator-{via} differ"
                            ),
                        }),
                        Some(_) => {}
                    }
                    break;
                }
                Err(e) if clock.now() > read_until => {
                    violations.push(checks::Violation {
                        check: "served again after healing",
                        detail: format!("the final read through curator-{via}: {e}"),
                    });
                    break;
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }
    let store = store.unwrap_or_default();
    // Watchers converge on the store's view.
    let converge_until = clock.now() + bound;
    loop {
        let relevant = |w: &workload::Watcher| {
            let view = w.current();
            match w.snapshot().kind {
                history::WatchKind::Nodes => view == store,
                history::WatchKind::Node(k) => {
                    view.iter().all(|(id, s)| store.get(id) == Some(s))
                        && ids.get(k).is_none_or(|id| view.contains_key(id))
                }
            }
        };
        if workload.watchers.iter().all(relevant) || clock.now() > converge_until {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    workload.stop();
    cluster.poll_exits();

    // The checks.
    let history = std::mem::take(&mut *workload.recorder.lock());
    let by_index: std::collections::BTreeMap<usize, i64> = store
        .values()
        .filter_map(|s| match s {
            NodeState::Ours { node, seq, .. } => Some((*node, *seq)),
            NodeState::Other(_) => None,
        })
        .collect();
    violations.extend(checks::registers(&history, &by_index));
    let (mut events, mut reconnects) = (0u64, 0u64);
    for w in &workload.watchers {
        let log = w.snapshot();
        events += log.events.len() as u64;
        reconnects += log
            .events
            .iter()
            .filter(|(_, s)| matches!(s, Seen::Reconnecting(_)))
            .count() as u64;
        violations.extend(checks::watcher(&log, &w.current(), &store, &ids, &history));
    }
    violations.extend(checks::recovery(&history, healed, bound));
    violations.extend(checks::exits(&cluster.unexpected_exits));
    totals.add(
        seed,
        &history,
        &windows,
        (phase_start, span_end),
        (events, reconnects),
    );
    drop(workload);
    for problem in cluster.stop() {
        eprintln!("metropolis-chaos: {problem}");
    }
    drop(cluster);
    firewall.delete()?;
    if cli.keep {
        println!("  kept {}", work.display());
    } else {
        let _ = std::fs::remove_dir_all(&work);
    }
    cleanup::set_work_dir(None);
    Ok(Outcome { violations })
}

fn micros(d: Duration) -> Micros {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// Sleeps for `d`, noting processes that exit meanwhile.
async fn sleep_watching(cluster: &mut Cluster, d: Duration) {
    let until = tokio::time::Instant::now() + d;
    while tokio::time::Instant::now() < until {
        cluster.poll_exits();
        tokio::time::sleep_until(
            until.min(tokio::time::Instant::now() + Duration::from_millis(100)),
        )
        .await;
    }
}

async fn campaign(cli: Cli) -> Result<bool, String> {
    let ready = preflight::check(&cli)?;
    tokio::spawn(cleanup::on_signals());
    if Firewall::delete_stale()? {
        println!(
            "deleted the nftables table inet {} left by an interrupted run",
            faults::nft::TABLE
        );
    }
    let first = cli.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() % 1_000_000)
            .unwrap_or(0)
    });
    println!(
        "metropolis-chaos: {} schedule(s) from seed {first}, {} s of faults each, lease TTL {} s, \
         daemon {}",
        cli.schedules,
        cli.seconds,
        cli.lease_ttl,
        ready.programs.daemon.display()
    );
    let mut totals = Totals::default();
    let mut failures = 0u64;
    for k in 0..cli.schedules {
        let seed = first.wrapping_add(k);
        let outcome = run_schedule(&cli, &ready.programs, ready.own_gid, seed, &mut totals).await;
        let outcome = match outcome {
            Ok(o) => o,
            Err(e) => {
                for line in cleanup::undo_all() {
                    eprintln!("metropolis-chaos: cleanup: {line}");
                }
                return Err(format!(
                    "schedule seed {seed} could not run: {e}\nreplay: {}",
                    cli.replay(seed)
                ));
            }
        };
        if outcome.violations.is_empty() {
            println!("  seed {seed}: every check passed");
            continue;
        }
        failures += 1;
        totals.violations += outcome.violations.len() as u64;
        totals.failed_seeds.push(seed);
        println!("  seed {seed}: {} violation(s)", outcome.violations.len());
        for v in &outcome.violations {
            println!("    [{}] {}", v.check, v.detail.replace('\n', "\n      "));
        }
        println!("  replay: {}", cli.replay(seed));
        if cli.expect_violations || (cli.max_failures > 0 && failures >= cli.max_failures) {
            break;
        }
    }
    totals.print();
    Ok(if cli.expect_violations {
        totals.violations > 0
    } else {
        totals.violations == 0
    })
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    cleanup::install_panic_hook();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("metropolis-chaos: cannot start the tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let expect = cli.expect_violations;
    let result = runtime.block_on(campaign(cli));
    for line in cleanup::undo_all() {
        eprintln!("metropolis-chaos: cleanup: {line}");
    }
    runtime.shutdown_timeout(Duration::from_secs(2));
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            if expect {
                eprintln!("metropolis-chaos: the planted bug was not caught");
            }
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("metropolis-chaos: {e}");
            ExitCode::from(2)
        }
    }
}
