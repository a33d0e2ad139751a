//! A deterministic, single-threaded way to drive futures in a harness:
//! poll with a no-op waker, and a task list that implements the service
//! layer's [`Spawner`] port and is polled on demand. No threads, no clock.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use futures::Stream;
use metropolis_core::ports::Spawner;

/// A boxed background task.
type Task = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// Polls `stream` for its next item once, with a no-op waker.
pub fn poll_next<S: Stream + Unpin + ?Sized>(stream: &mut S) -> Poll<Option<S::Item>> {
    let mut cx = Context::from_waker(Waker::noop());
    Pin::new(stream).poll_next(&mut cx)
}

/// Background tasks spawned by the service layer, polled whenever the
/// harness calls [`Tasks::run`]. Everything in a harness is in memory, so
/// a task that returns Pending is waiting for the next input.
#[derive(Clone, Default)]
pub struct Tasks {
    queue: Arc<Mutex<Vec<Task>>>,
}

impl Tasks {
    /// An empty task list.
    pub fn new() -> Tasks {
        Tasks::default()
    }

    /// Polls every task `rounds` times (tasks spawned meanwhile too) and
    /// drops those that finished.
    pub fn run(&self, rounds: usize) {
        let mut cx = Context::from_waker(Waker::noop());
        for _ in 0..rounds {
            let mut tasks = std::mem::take(&mut *self.lock());
            tasks.retain_mut(|t| t.as_mut().poll(&mut cx).is_pending());
            let mut queue = self.lock();
            tasks.append(&mut queue);
            *queue = tasks;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Task>> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Spawner for Tasks {
    fn spawn(&self, task: Task) {
        self.lock().push(task);
    }
}

/// Runs `future` to completion, running `tasks` between polls; panics if
/// it is still pending after `limit` polls (everything here is in memory,
/// so a future that does not finish is stuck).
pub fn block_on<F: Future>(future: F, tasks: &Tasks, limit: usize) -> F::Output {
    let mut future = std::pin::pin!(future);
    let mut cx = Context::from_waker(Waker::noop());
    for _ in 0..limit {
        if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return out;
        }
        tasks.run(1);
    }
    panic!("a call did not complete after {limit} polls with every task run");
}
