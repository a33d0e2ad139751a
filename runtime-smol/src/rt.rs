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

/// async-io's timers as hyper's (and the edge's) timer.
#[derive(Clone, Copy, Debug, Default)]
pub struct SmolTimer;

/// One sleep of [`SmolTimer`].
struct SmolSleep(async_io::Timer);

impl Future for SmolSleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        Pin::new(&mut self.0).poll(cx).map(|_| ())
    }
}

impl hyper::rt::Sleep for SmolSleep {}

impl hyper::rt::Timer for SmolTimer {
    fn sleep(&self, duration: std::time::Duration) -> Pin<Box<dyn hyper::rt::Sleep>> {
        Box::pin(SmolSleep(async_io::Timer::after(duration)))
    }

    fn sleep_until(&self, deadline: std::time::Instant) -> Pin<Box<dyn hyper::rt::Sleep>> {
        Box::pin(SmolSleep(async_io::Timer::at(deadline)))
    }
}
