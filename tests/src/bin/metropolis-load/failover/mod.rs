//! `failover`: how long writes stop when the curator leader fails, on 3
//! curators over 3 etcd members (the fault campaign's cluster,
//! `metropolis_tests::campaign`), against etcd's own recovery from losing
//! its leader in the same run.
//!
//! Each round waits until every client is served, finds the leader,
//! injects one fault and reads from the clients' record the time from
//! the fault to the first acknowledged call issued after it, and the
//! calls that failed in between ([`traffic::recovery`]); then undoes the
//! fault and waits for the cluster to be whole again. The faults: SIGKILL
//! of the leader; SIGSTOP of the leader for two leases; the leader's
//! connections to every etcd member dropped (nftables) for two leases;
//! SIGTERM of the leader (a graceful stop, which revokes its lease); and
//! SIGKILL of etcd's leader, where direct puts to etcd are the peer.
//! Before the faults, etcd's request rate while the cluster is idle (no
//! client at all) says what the curators' lease costs.

mod etcd_peer;
mod traffic;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use metropolis_tests::campaign::cluster::{self, Cluster, N, Programs};
use metropolis_tests::campaign::enroll::Owner;
use metropolis_tests::campaign::nft::{Direction, Firewall};
use metropolis_tests::campaign::{cleanup, clock};

use crate::daemon::Target;
use crate::util::{self, Result, percentile};
use traffic::{Recovery, Stream, Traffic};

/// The faults, in the order of the report.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Fault {
    /// SIGKILL of the curator leader (restarted after the round).
    Kill,
    /// SIGSTOP of the curator leader for two lease TTLs, then SIGCONT.
    Stop,
    /// The curator leader's connections to etcd dropped both ways for
    /// two lease TTLs (nftables), then healed.
    Cut,
    /// SIGTERM of the curator leader (a graceful stop; restarted after).
    Term,
    /// SIGKILL of etcd's leader (restarted after the round).
    EtcdKill,
}

impl Fault {
    fn name(self) -> &'static str {
        match self {
            Fault::Kill => "SIGKILL leader",
            Fault::Stop => "SIGSTOP leader (2 leases)",
            Fault::Cut => "leader cut from etcd (2 leases)",
            Fault::Term => "SIGTERM leader (graceful)",
            Fault::EtcdKill => "SIGKILL etcd leader",
        }
    }
}

/// Options of the failover scenario.
#[derive(clap::Args, Debug)]
pub struct FailoverArgs {
    /// Rounds of each fault.
    #[arg(long, default_value_t = 20)]
    pub rounds: usize,
    /// The curators' `--lease-ttl`, in seconds.
    #[arg(long, default_value_t = 5)]
    pub lease_ttl: u64,
    /// Status writers on each runtime (tokio and smol), one node each.
    #[arg(long, default_value_t = 2)]
    pub writers: usize,
    /// Heartbeating agents (with `bmaas-agent`'s client configuration).
    #[arg(long, default_value_t = 2)]
    pub agents: usize,
    /// The faults to inject, comma-separated, each for --rounds rounds.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_values_t = [Fault::Kill, Fault::Stop, Fault::Cut, Fault::Term, Fault::EtcdKill]
    )]
    pub faults: Vec<Fault>,
    /// Seconds over which etcd's request rate is read while nothing but
    /// the curators talks to it (0: skip).
    #[arg(long, default_value_t = 20)]
    pub idle_seconds: u64,
    /// Measure only the idle request rate, then stop.
    #[arg(long)]
    pub idle_only: bool,
    /// The etcd binary.
    #[arg(long, default_value = "etcd", value_name = "PATH")]
    pub etcd_bin: PathBuf,
}

/// How long after a fault the clients may take before the round is given
/// up as not recovered.
fn give_up_after(ttl: Duration) -> Duration {
    ttl * 3 + Duration::from_secs(20)
}

/// Runs the scenario (needs root: the cluster's processes run under
/// their own group IDs and the cut is an nftables rule).
pub async fn run(args: FailoverArgs, target: &Target, work: &Path) -> Result<()> {
    let programs = preflight(&args, target)?;
    let ttl = programs.ttl;
    cleanup::install_panic_hook();
    let signals = tokio::spawn(cleanup::on_signals());
    if Firewall::delete_stale()? {
        println!(
            "deleted a stale nftables table inet {}",
            metropolis_tests::campaign::nft::TABLE
        );
    }
    let mut initiators: Vec<_> = (0..N).map(cluster::etcd_initiator).collect();
    initiators.extend((0..N).map(cluster::curator_initiator));
    let firewall = Firewall::create(&initiators)?;
    let result = scenario(&args, programs, &firewall, work).await;
    for line in cleanup::undo_all() {
        eprintln!("metropolis-load: cleanup: {line}");
    }
    drop(firewall);
    signals.abort();
    let table = result?;
    print_report(&args, ttl, &table);
    Ok(())
}

/// Every recovery of one fault kind and stream.
type Table = Vec<(Fault, Stream, Vec<Recovery>)>;

async fn scenario(
    args: &FailoverArgs,
    programs: Programs,
    firewall: &Firewall,
    work: &Path,
) -> Result<Table> {
    let ttl = programs.ttl;
    let token = "metropolis-load-failover";
    println!(
        "starting 3 etcd members and 3 curators (lease TTL {} s) under {}",
        ttl.as_secs(),
        work.display()
    );
    let mut cluster = Cluster::start(work, programs, token).await?;
    if args.idle_seconds > 0 {
        let idle = Duration::from_secs(args.idle_seconds);
        let rate = etcd_peer::idle_requests_per_second(idle).await?;
        util::print_table(
            &format!("etcd while idle ({} s, no clients)", args.idle_seconds),
            &[
                util::row("etcd requests/s, all curators", format!("{rate:.2}")),
                util::row(
                    "etcd requests/s per curator",
                    format!("{:.2}", rate / N as f64),
                ),
                util::row("lease TTL (s)", ttl.as_secs()),
            ],
        );
        println!(
            "RESULT failover-idle ttl_s={} etcd_rps_per_curator={:.3}",
            ttl.as_secs(),
            rate / N as f64
        );
    }
    if args.idle_only {
        cluster.stop();
        return Ok(Vec::new());
    }
    let owner = Owner::connect(&cluster.owner_dir()).await?;
    let mut tokio_nodes = Vec::new();
    let mut smol_nodes = Vec::new();
    for _ in 0..args.writers {
        tokio_nodes.push(owner.add_node().await?);
        smol_nodes.push(owner.add_node().await?);
    }
    let mut agents = Vec::new();
    for a in 0..args.agents {
        agents.push(
            owner
                .add_agent(&format!("5c1e7a2b-0000-4000-8000-{a:012}"))
                .await?,
        );
    }
    let traffic = Traffic::start(tokio_nodes, smol_nodes, agents)?;
    let etcd_puts = etcd_peer::Puts::start(&cluster.etcd_urls(), traffic.record.clone()).await?;
    let mut table: Table = Vec::new();
    for &fault in &args.faults {
        let mut by_stream: Vec<Vec<Recovery>> = vec![Vec::new(); Stream::ALL.len()];
        for round in 0..args.rounds {
            settle(&traffic, &mut cluster).await?;
            let recoveries = one_round(fault, &mut cluster, firewall, &traffic, ttl, token).await?;
            let line: Vec<String> = recoveries
                .iter()
                .map(|(s, r)| format!("{} {}", s.name(), show(r.after)))
                .collect();
            println!(
                "  {} round {}: {}",
                fault.name(),
                round + 1,
                line.join(", ")
            );
            for (stream, r) in recoveries {
                if let Some(k) = Stream::ALL.iter().position(|s| *s == stream) {
                    by_stream[k].push(r);
                }
            }
        }
        for (k, rs) in by_stream.into_iter().enumerate() {
            if !rs.is_empty() {
                table.push((fault, Stream::ALL[k], rs));
            }
        }
    }
    etcd_puts.stop().await;
    traffic.stop().await;
    for problem in cluster.stop() {
        eprintln!("metropolis-load: {problem}");
    }
    if !cluster.unexpected_exits.is_empty() {
        return Err(format!(
            "processes exited unasked: {}",
            cluster.unexpected_exits.join("; ")
        )
        .into());
    }
    Ok(table)
}

/// Waits until every stream has had a call issued now or later
/// acknowledged (60 s at most).
async fn settle(traffic: &Traffic, cluster: &mut Cluster) -> Result<()> {
    let from = Instant::now();
    let deadline = from + Duration::from_secs(60);
    loop {
        cluster.poll_exits();
        let ops = traffic.record.since(from);
        let waiting: Vec<&str> = Stream::ALL
            .iter()
            .filter(|&&s| traffic::recovery(&ops, s, from).after.is_none())
            .map(|s| s.name())
            .collect();
        if waiting.is_empty() {
            traffic.record.forget(from);
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "not served within 60 s of a round's start: {}",
                waiting.join(", ")
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Injects `fault`, waits for every stream to recover (or gives up),
/// undoes the fault; each stream's recovery.
async fn one_round(
    fault: Fault,
    cluster: &mut Cluster,
    firewall: &Firewall,
    traffic: &Traffic,
    ttl: Duration,
    token: &str,
) -> Result<Vec<(Stream, Recovery)>> {
    let limit = Duration::from_secs(10);
    let victim = match fault {
        Fault::EtcdKill => etcd_peer::leader().await?,
        _ => cluster
            .leader(limit)
            .await
            .ok_or("no curator leader before the fault")?,
    };
    let hold = ttl * 2;
    // The fault's time: a kill or SIGTERM is sent now; a pause and a cut
    // count from when `kill -STOP` and `nft` have returned (a call issued
    // while they run may still be served).
    let mut at = Instant::now();
    match fault {
        Fault::Kill => cluster.kill_curator(victim),
        Fault::Stop => cluster.pause(true, victim, true),
        Fault::Cut => firewall.cut(
            cluster::curator_initiator(victim),
            cluster::ETCD_NET,
            Direction::Both,
        )?,
        Fault::Term => {
            if cluster.terminate_curator(victim, limit).await.is_none() {
                return Err(
                    format!("curator-{victim} did not exit within {limit:?} of SIGTERM").into(),
                );
            }
        }
        Fault::EtcdKill => cluster.kill_etcd(victim),
    }
    if matches!(fault, Fault::Stop | Fault::Cut) {
        at = Instant::now();
    }
    let streams = Stream::ALL;
    // Until every stream recovered (and, for a held fault, the hold
    // passed), or the round is given up.
    let give_up = at + give_up_after(ttl);
    let recoveries = loop {
        cluster.poll_exits();
        let ops = traffic.record.since(at);
        let now = Instant::now();
        let rs: Vec<(Stream, Recovery)> = streams
            .iter()
            .map(|&s| (s, traffic::recovery(&ops, s, at)))
            .collect();
        let all = rs.iter().all(|(_, r)| r.after.is_some());
        let held = !matches!(fault, Fault::Stop | Fault::Cut) || now >= at + hold;
        if (all && held) || now > give_up {
            break rs;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    match fault {
        Fault::Kill | Fault::Term => cluster.restart_curator(victim).await?,
        Fault::Stop => cluster.pause(true, victim, false),
        Fault::Cut => firewall.heal()?,
        Fault::EtcdKill => cluster.restart_etcd(victim, token).await?,
    }
    Ok(recoveries)
}

fn show(d: Option<Duration>) -> String {
    d.map_or("not recovered".into(), |d| {
        format!("{:.2} s", d.as_secs_f64())
    })
}

fn print_report(args: &FailoverArgs, ttl: Duration, table: &Table) {
    println!();
    println!(
        "time from the fault to the first acknowledged call issued after it ({} rounds each, lease TTL {} s)",
        args.rounds,
        ttl.as_secs()
    );
    println!(
        "{:<34} {:<22} {:>8} {:>8} {:>8} {:>13} {:>14}",
        "fault", "clients", "p50 s", "p99 s", "max s", "unrecovered", "failed calls"
    );
    for (fault, stream, rs) in table {
        let mut ms: Vec<u64> = rs
            .iter()
            .filter_map(|r| r.after)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .collect();
        ms.sort_unstable();
        let unrecovered = rs.len() - ms.len();
        let failed: u64 = rs.iter().map(|r| r.failed).sum();
        let s = |v: u64| format!("{:.2}", v as f64 / 1000.0);
        println!(
            "{:<34} {:<22} {:>8} {:>8} {:>8} {:>13} {:>14}",
            fault.name(),
            stream.name(),
            s(percentile(&ms, 50.0)),
            s(percentile(&ms, 99.0)),
            s(ms.last().copied().unwrap_or(0)),
            unrecovered,
            failed
        );
        println!(
            "RESULT failover fault={fault:?} clients={stream:?} ttl_s={} rounds={} p50_ms={} p99_ms={} max_ms={} unrecovered={unrecovered} failed={failed}",
            ttl.as_secs(),
            rs.len(),
            percentile(&ms, 50.0),
            percentile(&ms, 99.0),
            ms.last().copied().unwrap_or(0)
        );
    }
}

/// What the scenario needs, checked before anything is started.
fn preflight(args: &FailoverArgs, target: &Target) -> Result<Programs> {
    let mut missing = Vec::new();
    if args.lease_ttl == 0 || (args.rounds == 0 && !args.idle_only) {
        missing.push("--lease-ttl and --rounds must be at least 1".to_string());
    }
    let uid = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(str::to_string))
        });
    if uid.as_deref() != Some("0") {
        missing
            .push("root: processes under their own group IDs, nftables rules, tmpfs mounts".into());
    }
    let runs = |program: &Path, arg: &str| {
        std::process::Command::new(program)
            .arg(arg)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if !runs(Path::new("nft"), "--version") {
        missing.push("nft: install nftables".into());
    }
    if !runs(&args.etcd_bin, "--version") {
        missing.push(format!(
            "etcd ({}): install etcd-server or pass --etcd-bin",
            args.etcd_bin.display()
        ));
    }
    let faketime = clock::find_library();
    if faketime.is_none() {
        missing.push("libfaketime: install faketime".into());
    }
    let help = std::process::Command::new(&target.bin)
        .arg("--help")
        .output();
    if !help.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("--etcd")) {
        missing.push(format!(
            "{} has no --etcd: build it with `cargo build --release -p metropolis-tests --features system --bins`",
            target.bin.display()
        ));
    }
    match faketime {
        Some(faketime) if missing.is_empty() => Ok(Programs {
            daemon: target.bin.clone(),
            daemon_env: Vec::new(),
            etcd: args.etcd_bin.clone(),
            faketime,
            ttl: Duration::from_secs(args.lease_ttl),
        }),
        _ => Err(format!(
            "cannot run the failover scenario; missing:\n  - {}",
            missing.join("\n  - ")
        )
        .into()),
    }
}
