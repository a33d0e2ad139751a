//! `metropolis-load`: load scenarios against a real `metropolisd` process
//! (the `metropolisd-under-test` built beside this binary), printing
//! figures; nothing is asserted about them.
//!
//! - `fanout`: thousands of idle `Watch(NodesInCluster)` streams over the
//!   local socket, then a steady rate of `UpdateNodeStatus` over TLS;
//!   delivered node events per second, delivery latency, coalescing, and
//!   daemon memory per idle stream.
//! - `fanout-etcd`: the daemon elected over a real etcd; Watch streams
//!   through the curator against as many direct etcd watches of the node
//!   prefix, under the same updates: delivered events/s and etcd CPU
//!   (built with `--features system`: it needs the etcd port).
//! - `fanout-storm`: two curator instances over one etcd, the leader
//!   killed while thousands of Watch streams are open on it: time until
//!   every stream has its new backlog from the new leader, and that
//!   leader's peak memory (`--features system`).
//! - `update-etcd`: UpdateNodeStatus through a curator elected over etcd
//!   against the equivalent fenced transactions sent straight to etcd
//!   (`--features system`).
//! - `heartbeat-etcd`: the same for Heartbeat and the machine records
//!   (`--features system`).
//! - `update-tls`: closed-loop `UpdateNodeStatus` over mutual TLS against
//!   the daemon and against an echo server with the same TLS/gRPC stack,
//!   run as a separate process.
//! - `get-logs`: a large GetLogs backlog from an in-process debug service.
//! - `load-image`: LoadImage of a 1 GiB archive against the disk's speed,
//!   or into containerd against `ctr images import`.
//! - `install`: the agent's installer from a local registry onto a loop
//!   device, against `curl` of the same blob into `dd oflag=direct
//!   conv=fsync` (and that dd from a local file).
//! - `failover`: SIGKILL, SIGSTOP, a cut from etcd and SIGTERM of the
//!   curator leader of 3 curators over 3 etcd members, and SIGKILL of
//!   etcd's leader: the time until writes, heartbeats and direct etcd
//!   puts are acknowledged again (`--features system`).
//!
//! Traffic goes only to 127.0.0.1 and UNIX sockets; every loop is bounded.

use std::path::PathBuf;
use std::process::ExitCode;

/// The daemon's allocator, configured the same way, so that the echo
/// server (`serve-echo`, this binary) runs on the same stack as the daemon
/// it is compared with.
#[global_allocator]
static ALLOCATOR: metropolisd::allocator::MiMalloc = metropolisd::allocator::MiMalloc;

use clap::{Parser, Subcommand};

mod daemon;
mod echo;
#[cfg(feature = "system")]
mod failover;
mod fanout;
#[cfg(feature = "system")]
mod fanout_etcd;
#[cfg(feature = "system")]
mod fenced_direct;
mod get_logs;
mod heartbeat;
#[cfg(feature = "system")]
mod heartbeat_etcd;
mod install;
mod install_peer;
mod load_image;
mod rounds;
#[cfg(feature = "system")]
mod storm;
#[cfg(feature = "system")]
mod update_etcd;
mod update_tls;
mod util;

/// Load scenarios against a real metropolisd process.
#[derive(Parser, Debug)]
#[command(
    name = "metropolis-load",
    about = "Load scenarios against a real metropolisd process; prints figures",
    long_about = "Load scenarios against a real metropolisd process (metropolisd-under-test, \
        built next to this binary by `cargo build --release -p metropolis-tests --bins`), \
        started on a fresh temporary data directory. Each scenario prints an aligned table \
        and one machine-readable line starting with `RESULT`. Nothing is asserted about the \
        figures; the exit status is non-zero only when the run itself failed.\n\n\
        Traffic goes only to 127.0.0.1 and UNIX sockets. Build in release mode for \
        meaningful figures."
)]
struct Cli {
    /// The daemon binary. Default: metropolisd-under-test in the directory
    /// of this executable.
    #[arg(long, global = true, value_name = "PATH")]
    daemon_bin: Option<PathBuf>,
    /// The async runtime the daemon serves on (its `--runtime`).
    #[arg(long, global = true, value_enum, default_value_t = metropolis_tests::RuntimeKind::Tokio)]
    daemon_runtime: metropolis_tests::RuntimeKind,
    /// Directory under which the temporary data directory is created
    /// (removed afterwards). Default: the system temporary directory.
    #[arg(long, global = true, value_name = "DIR")]
    work_dir: Option<PathBuf>,
    /// Keep the temporary data directory (daemon store and log) and print
    /// its path.
    #[arg(long, global = true)]
    keep: bool,
    /// An extra flag for the daemon (repeatable), e.g.
    /// `--daemon-arg=--agent-lost-after=60`.
    #[arg(
        long = "daemon-arg",
        global = true,
        value_name = "FLAG",
        allow_hyphen_values = true
    )]
    daemon_args: Vec<String>,
    /// Worker threads of the client's tokio runtime. Default: one per CPU.
    #[arg(long, global = true, value_name = "N")]
    client_threads: Option<usize>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Many idle Watch(NodesInCluster) streams over the UNIX socket, then a
    /// fixed rate of UpdateNodeStatus over TLS: delivered events/s, latency
    /// from acknowledgement to arrival, coalescing, RSS per idle stream.
    Fanout(fanout::FanoutArgs),
    /// The daemon elected over a one-member etcd (started here; needs the
    /// etcd binary): Watch(NodesInCluster) streams through the curator,
    /// then as many direct etcd watches of the node prefix, each under the
    /// same closed-loop UpdateNodeStatus load: delivered events/s, etcd
    /// and daemon CPU, etcd's watcher count, and the ratios. Only in a
    /// build with `--features system`.
    #[cfg(feature = "system")]
    FanoutEtcd(fanout_etcd::FanoutEtcdArgs),
    /// A reconnect storm: two curator instances over a one-member etcd
    /// (started here); Watch streams open on the leader, one per
    /// connection, when it is killed; each reconnects to the other
    /// instance and reads its new backlog: time from the kill until every
    /// stream has it, and the new leader's peak RSS. Only in a build with
    /// `--features system`.
    #[cfg(feature = "system")]
    FanoutStorm(storm::StormArgs),
    /// UpdateNodeStatus through a curator elected over a one-member etcd
    /// (started here), against the equivalent fenced compare-and-swap
    /// transactions sent straight to that etcd by as many loops, in
    /// alternating windows: updates/s, p50/p99 and the ratio. Only in a
    /// build with `--features system`.
    #[cfg(feature = "system")]
    UpdateEtcd(update_etcd::UpdateEtcdArgs),
    /// Agents heartbeating through a curator elected over a one-member
    /// etcd (started here), against the equivalent fenced transactions on
    /// the machine records sent straight to that etcd, in alternating
    /// windows: heartbeats/s, p50/p99 and the ratio. Only in a build with
    /// `--features system`.
    #[cfg(feature = "system")]
    HeartbeatEtcd(heartbeat_etcd::HeartbeatEtcdArgs),
    /// Closed-loop UpdateNodeStatus over mutual TLS against the daemon, then
    /// against an echo server (same TLS and gRPC stack, separate process):
    /// requests/s, p50/p99, and the daemon/echo ratio.
    UpdateTls(update_tls::UpdateTlsArgs),
    /// Many agents heartbeating over mutual TLS (own key and connection
    /// each) against the AgentCallback port, then against an echo
    /// service on the same stack: heartbeats/s, p50/p99, and the ratio.
    Heartbeat(heartbeat::HeartbeatArgs),
    /// GetLogs of a large backlog (default 1,000,000 entries) from an
    /// in-process debug service on the --daemon-runtime listener:
    /// entries/s and MB/s over loopback.
    GetLogs(get_logs::GetLogsArgs),
    /// LoadImage of a large Docker archive (default 1 GiB) over loopback
    /// into the daemon's default image store, against writing the same
    /// bytes to the same disk (both fsynced); or, with `--against
    /// containerd`, into a containerd started here, against `ctr images
    /// import` of the same archive into it. Alternating rounds: MB/s, the
    /// ratio per round and its median.
    LoadImage(load_image::LoadImageArgs),
    /// The agent's installer putting a large OS image (default 1 GiB) from
    /// a local docker-registry onto a loop device (or a file) on the work
    /// directory's disk, against an operator's `curl` of the same blob from
    /// the same registry into `dd oflag=direct conv=fsync` onto the same
    /// target (`curl | zstd -d | dd` for zstd), and that dd from a local
    /// file, alternating: MB/s per round and the ratios' medians.
    Install(install::InstallArgs),
    /// Failover on 3 curators over 3 etcd members (started here, as the
    /// fault campaign's cluster; needs root, nftables, etcd, libfaketime):
    /// rounds of SIGKILL, SIGSTOP, a cut from etcd and SIGTERM of the
    /// curator leader, and SIGKILL of etcd's leader, under status writers
    /// on tokio and smol, heartbeating agents and direct etcd puts: the
    /// time from each fault to the first acknowledged call after it (p50,
    /// p99, max) and the calls that failed meanwhile; and etcd's request
    /// rate while idle. Only in a build with `--features system`.
    #[cfg(feature = "system")]
    Failover(failover::FailoverArgs),
    /// The echo server of update-tls (started by it).
    #[command(hide = true)]
    ServeEcho(echo::EchoArgs),
}

fn runtime(threads: Option<usize>) -> util::Result<tokio::runtime::Runtime> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = threads {
        builder.worker_threads(n.max(1));
    }
    builder
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the tokio runtime: {e}").into())
}

fn run(cli: Cli) -> util::Result<()> {
    if let Command::ServeEcho(args) = cli.command {
        return runtime(None)?.block_on(echo::serve(args));
    }
    let target = daemon::Target {
        bin: daemon::locate(cli.daemon_bin.as_deref())?,
        runtime: cli.daemon_runtime,
        extra: cli.daemon_args.clone(),
    };
    let mut builder = tempfile::Builder::new();
    let tmp = builder.prefix("metropolis-load-");
    let work = match &cli.work_dir {
        Some(dir) => tmp.tempdir_in(dir),
        None => tmp.tempdir(),
    }
    .map_err(|e| format!("creating a temporary directory: {e}"))?;
    let rt = runtime(cli.client_threads)?;
    let result = rt.block_on(async {
        match cli.command {
            Command::Fanout(args) => fanout::run(args, &target, work.path()).await,
            #[cfg(feature = "system")]
            Command::FanoutEtcd(args) => fanout_etcd::run(args, &target, work.path()).await,
            #[cfg(feature = "system")]
            Command::FanoutStorm(args) => storm::run(args, &target, work.path()).await,
            #[cfg(feature = "system")]
            Command::UpdateEtcd(args) => update_etcd::run(args, &target, work.path()).await,
            #[cfg(feature = "system")]
            Command::HeartbeatEtcd(args) => heartbeat_etcd::run(args, &target, work.path()).await,
            Command::UpdateTls(args) => update_tls::run(args, &target, work.path()).await,
            Command::Heartbeat(args) => heartbeat::run(args, &target, work.path()).await,
            Command::LoadImage(args) => load_image::run(args, &target, work.path()).await,
            Command::Install(args) => install::run(args, work.path()).await,
            #[cfg(feature = "system")]
            Command::Failover(args) => failover::run(args, &target, work.path()).await,
            Command::GetLogs(args) => get_logs::run(args, cli.daemon_runtime).await,
            Command::ServeEcho(_) => Ok(()),
        }
    });
    // Stream and connection tasks still parked on the runtime go with it.
    rt.shutdown_timeout(std::time::Duration::from_secs(2));
    if cli.keep {
        let path = work.keep();
        println!("kept {}", path.display());
    }
    result
}

fn main() -> ExitCode {
    metropolisd::allocator::configure();
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("metropolis-load: {e}");
            ExitCode::FAILURE
        }
    }
}
