//! `metropolisd` with a bug planted, for the fault campaign to show that
//! its checks catch one (`metropolis-chaos --daemon-bin`, docs/chaos.md).
//! Built only with this package's `canary` feature, which turns on
//! `metropolis-core/canary`; never a build that ships. Build it into a
//! target directory of its own so the daemon under test is untouched:
//!
//! ```sh
//! cargo build -p metropolis-tests --features system,canary \
//!     --bin metropolisd-canary --target-dir target/canary
//! METROPOLIS_CANARY=skip-read-your-writes target/canary/debug/metropolisd-canary ...
//! ```
//!
//! The canary named by `METROPOLIS_CANARY` (a name of
//! `metropolis_core::canary::Canary`, e.g. `drop-fence`) is planted on
//! every thread of the daemon's runtime: core plants per thread, so each
//! worker plants it as its idle housekeeping (within 10 ms of starting,
//! and again whenever it idles). Everything else is `metropolisd`.

use std::process::ExitCode;
use std::sync::OnceLock;
use std::time::Duration;

use metropolis_core::canary::{self, Canary};
use metropolis_node::daemon::{RuntimeKind, init_logging};
use metropolis_transport::runtime::{Housekeeping, SharedRuntime};

#[global_allocator]
static ALLOCATOR: metropolisd::allocator::MiMalloc = metropolisd::allocator::MiMalloc;

/// The canary this process plants.
static PLANTED: OnceLock<Canary> = OnceLock::new();

/// Each worker's idle housekeeping: plant the canary on this thread, and
/// return idle memory as the daemon's own housekeeping does.
fn plant_and_release() {
    canary::plant(PLANTED.get().copied().unwrap_or_default());
    metropolisd::allocator::release_idle_memory();
}

fn main() -> ExitCode {
    metropolisd::allocator::configure();
    let name = std::env::var("METROPOLIS_CANARY").unwrap_or_default();
    let Some(planted) = Canary::from_name(&name).filter(|c| *c != Canary::None) else {
        let names: Vec<&str> = Canary::ALL.iter().map(|c| c.name()).collect();
        eprintln!(
            "metropolisd-canary: set METROPOLIS_CANARY to the bug to plant, one of: {}",
            names.join(", ")
        );
        return ExitCode::from(2);
    };
    let _ = PLANTED.set(planted);
    canary::plant(planted);
    let mut config = match metropolis_node::settings::parse(std::env::args_os()) {
        Ok(config) => config,
        Err(e) => e.exit(),
    };
    config.logs = Some(init_logging(
        &config.log,
        config.log_format,
        config.log_tree_config(),
    ));
    eprintln!("metropolisd-canary: planted bug {}", planted.name());
    let housekeeping = Some(Housekeeping {
        every: Duration::from_millis(10),
        run: plant_and_release,
    });
    let (kind, election) = (config.runtime, metropolisd::election());
    let run = move |runtime: SharedRuntime| {
        metropolis_node::serving::run(runtime, kind, config, election)
    };
    let started = match kind {
        RuntimeKind::Tokio => metropolis_runtime_tokio::threads::block_on(housekeeping, |rt| {
            run(std::sync::Arc::new(rt))
        }),
        RuntimeKind::Smol => {
            metropolis_runtime_smol::threads::block_on(housekeeping, |rt| run(rt.shared()))
        }
    };
    match started {
        Ok(Ok(())) => ExitCode::SUCCESS,
        Ok(Err(e)) => {
            eprintln!("metropolisd-canary: {e}");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("metropolisd-canary: cannot start the {kind} runtime: {e}");
            ExitCode::FAILURE
        }
    }
}
