//! A deterministic, single-threaded way to drive futures: a queue of
//! spawned tasks that implements the service layer's [`Spawner`] port and
//! runs on demand ([`Tasks`]), [`block_on`] over it, and polling with a
//! no-op waker ([`poll_once`], [`poll_next`]). No threads, no clock: time,
//! where a test needs it, is a [`ManualClock`](crate::clock::ManualClock)
//! the test moves.
//!
//! Every task is polled at every round, woken or not: everything a test
//! drives is in memory, so a task that returns Pending is waiting for the
//! test's next input, and which tasks run does not depend on wakers.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use futures::Stream;
use metropolis_core::ports::Spawner;

/// A boxed background task, as the [`Spawner`] port hands it over.
pub type Task = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// Polls `future` once, with a no-op waker.
pub fn poll_once<F: Future + Unpin + ?Sized>(future: &mut F) -> Poll<F::Output> {
    let mut cx = Context::from_waker(Waker::noop());
    Pin::new(future).poll(&mut cx)
}

/// Polls `stream` for its next item once, with a no-op waker.
pub fn poll_next<S: Stream + Unpin + ?Sized>(stream: &mut S) -> Poll<Option<S::Item>> {
    let mut cx = Context::from_waker(Waker::noop());
    Pin::new(stream).poll_next(&mut cx)
}

/// The background tasks spawned through the [`Spawner`] port, polled
/// whenever the test calls [`run`](Self::run), in the order they were
/// spawned. Clones share the queue.
#[derive(Clone, Default)]
pub struct Tasks {
    queue: Arc<Mutex<Vec<Task>>>,
}

impl Tasks {
    /// An empty queue.
    pub fn new() -> Tasks {
        Tasks::default()
    }

    /// Polls every task `rounds` times (tasks spawned meanwhile too, from
    /// the next round on) and drops those that finished.
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

    /// How many tasks have not finished.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether every task has finished.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Task>> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Spawner for Tasks {
    fn spawn(&self, task: Task) {
        self.lock().push(task);
    }
}

/// Runs `future` to completion, running `tasks` for a round between
/// polls; panics if it is still pending after `limit` polls (everything
/// is in memory, so a future that does not finish is stuck).
pub fn block_on<F: Future>(future: F, tasks: &Tasks, limit: usize) -> F::Output {
    let mut future = std::pin::pin!(future);
    let mut cx = Context::from_waker(Waker::noop());
    for _ in 0..limit {
        if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return out;
        }
        tasks.run(1);
    }
    panic!("a future did not complete after {limit} polls with every task run");
}
