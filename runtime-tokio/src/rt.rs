//! tokio implementations of the core ports and hyper's runtime traits.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use metropolis_core::ports::Spawner;

pub use hyper_util::rt::{TokioExecutor, TokioIo};

/// Spawns service-layer tasks on the current tokio runtime.
#[derive(Clone, Debug)]
pub struct TokioSpawner {
    handle: tokio::runtime::Handle,
}

impl TokioSpawner {
    /// A spawner on the runtime of the calling task.
    ///
    /// Panics outside a tokio runtime (a programming error).
    pub fn current() -> Self {
        TokioSpawner {
            handle: tokio::runtime::Handle::current(),
        }
    }
}

impl Spawner for TokioSpawner {
    fn spawn(&self, task: Pin<Box<dyn Future<Output = ()> + Send + 'static>>) {
        self.handle.spawn(task);
    }
}

/// Runs forever on a tokio runtime whose workers do something in their
/// park hook (the daemon: return freed memory, rate-limited per thread):
/// every `every` it spawns two empty tasks per worker, which wakes parked
/// workers (a second task queued behind the first is offered to an idle
/// worker), so each passes its park hook again. Without it, a worker that
/// went to sleep right after a burst, within its hook's rate limit, kept
/// the burst's memory.
pub async fn nudge_workers(every: Duration) {
    let workers = tokio::runtime::Handle::current().metrics().num_workers();
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        for _ in 0..2 * workers {
            tokio::spawn(async {});
        }
    }
}
