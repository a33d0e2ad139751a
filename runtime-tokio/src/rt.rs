//! tokio implementations of the core ports and hyper's runtime traits.

use std::future::Future;
use std::pin::Pin;

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
