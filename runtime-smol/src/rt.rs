//! smol implementations of the core ports and hyper's runtime traits.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use metropolis_core::ports::Spawner;
use smol::{Executor, Task};

pub use smol_hyper::rt::FuturesIo;

/// Spawns tasks on an embedder's `smol::Executor`, or on smol's global
/// executor. Serves as the core [`Spawner`] and as hyper's executor.
#[derive(Clone, Debug, Default)]
pub struct SmolExecutor {
    executor: Option<Arc<Executor<'static>>>,
}

impl SmolExecutor {
    /// Tasks go to smol's global executor (`smol::spawn`).
    pub fn global() -> Self {
        SmolExecutor { executor: None }
    }

    /// Tasks go to `executor`, which the embedder drives.
    pub fn on(executor: Arc<Executor<'static>>) -> Self {
        SmolExecutor {
            executor: Some(executor),
        }
    }

    /// Spawns `future`, returning its task handle.
    pub fn spawn<F>(&self, future: F) -> Task<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        match &self.executor {
            Some(ex) => ex.spawn(future),
            None => smol::spawn(future),
        }
    }
}

impl<F> hyper::rt::Executor<F> for SmolExecutor
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn execute(&self, future: F) {
        self.spawn(future).detach();
    }
}

impl Spawner for SmolExecutor {
    fn spawn(&self, task: Pin<Box<dyn Future<Output = ()> + Send + 'static>>) {
        SmolExecutor::spawn(self, task).detach();
    }
}
