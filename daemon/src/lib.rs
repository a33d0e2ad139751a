//! `metropolisd`, the Metropolis node daemon, assembled: flags parsed into
//! [`Config`], the runtime chosen at start (`--runtime tokio|smol`), the
//! etcd election when built with the `etcd` feature, the allocator the
//! binary installs ([`allocator`]), and [`serving::run`] on that runtime.
//!
//! Everything the node does is in `metropolis-node` (and below it
//! `metropolis-core`); this crate only decides what runs where.

#[cfg(feature = "mimalloc")]
pub mod allocator;

use metropolis_node::cluster::StartElection;
use metropolis_node::daemon::{Config, DaemonError, LogFormat, RuntimeKind, init_logging};
use metropolis_node::exit::{self, Exit};
use metropolis_node::serving;
use metropolis_transport::runtime::{Housekeeping, SharedRuntime};

/// The election starter of this build: etcd with the `etcd` feature,
/// none without (then `--etcd` is refused at start).
pub fn election() -> Option<StartElection> {
    #[cfg(feature = "etcd")]
    {
        Some(metropolis_etcd::etcd_election())
    }
    #[cfg(not(feature = "etcd"))]
    {
        None
    }
}

/// What idle threads run to return freed memory, and how often: set when
/// the binary allocates with mimalloc (it called
/// [`allocator::configure`]). tokio workers run it when they park
/// (rate-limited) and are nudged that often; smol's executor threads run
/// it that often.
fn idle_release() -> Option<Housekeeping> {
    #[cfg(feature = "mimalloc")]
    if allocator::is_configured() {
        return Some(Housekeeping {
            every: allocator::RELEASE_INTERVAL,
            run: allocator::release_idle_memory,
        });
    }
    None
}

/// Runs the daemon configured by `config` on the runtime it names, until
/// SIGTERM/SIGINT or a fatal store error.
pub fn run(config: Config) -> Result<(), DaemonError> {
    let (kind, idle, election) = (config.runtime, idle_release(), election());
    let run = move |runtime: SharedRuntime| serving::run(runtime, kind, config, election);
    let started = match kind {
        RuntimeKind::Tokio => {
            metropolis_runtime_tokio::threads::block_on(idle, |rt| run(std::sync::Arc::new(rt)))
        }
        RuntimeKind::Smol => {
            metropolis_runtime_smol::threads::block_on(idle, |rt| run(rt.shared()))
        }
    };
    started.map_err(|e| DaemonError::from(format!("cannot start the {kind} runtime: {e}")))?
}

/// Entry point of the `metropolisd` binary: parses flags, sets up logging,
/// runs the daemon; on failure reports the error once, in the log format
/// asked for, and exits with its status (docs/operations.md, "Exit
/// status": 2 a usage error naming the flag, 3 unavailable, 4 permission
/// denied, 1 any other). `metropolisd man DIR` writes its man page.
pub fn main() -> std::process::ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let program = metropolis_node::settings::DAEMON;
    if let Some(written) = metropolis_node::settings::man::<Config>(&args, program) {
        return match written {
            Ok(page) => {
                println!("man page written to {}", page.display());
                Exit::Done.code()
            }
            Err(e) => {
                exit::report(program.name, LogFormat::Text, &e);
                Exit::Failure.code()
            }
        };
    }
    let mut config = match metropolis_node::settings::parse(args.iter().cloned()) {
        Ok(config) => config,
        Err(e) => {
            let env = format!("{}LOG_FORMAT", program.env_prefix);
            return exit::settings_error(program.name, e, &args, &env);
        }
    };
    let format = config.log_format;
    config.logs = Some(init_logging(
        &config.log,
        config.log_format,
        config.log_tree_config(),
    ));
    match run(config) {
        Ok(()) => Exit::Done.code(),
        Err(e) => {
            exit::report(program.name, format, &e.to_string());
            exit::status_of(e.as_ref()).code()
        }
    }
}
