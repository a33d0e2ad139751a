//! A runtime-neutral shutdown signal: one trigger, any number of waiters.

use std::sync::{Arc, Mutex};

use futures::FutureExt;
use futures::channel::oneshot;
use futures::future::Shared;

/// Resolves once shutdown is triggered (or the trigger is dropped). Clone
/// it into every listener and connection.
#[derive(Clone)]
pub struct Shutdown(Shared<oneshot::Receiver<()>>);

/// The sending side of [`Shutdown`].
#[derive(Clone)]
pub struct ShutdownTrigger(Arc<Mutex<Option<oneshot::Sender<()>>>>);

/// A new shutdown signal, not yet triggered.
pub fn shutdown_pair() -> (ShutdownTrigger, Shutdown) {
    let (tx, rx) = oneshot::channel();
    (
        ShutdownTrigger(Arc::new(Mutex::new(Some(tx)))),
        Shutdown(rx.shared()),
    )
}

impl ShutdownTrigger {
    /// Tells every holder of the [`Shutdown`] to stop. Idempotent.
    pub fn trigger(&self) {
        let sender = self.0.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(tx) = sender {
            let _ = tx.send(());
        }
    }
}

impl Shutdown {
    /// Resolves once shutdown was triggered.
    pub async fn wait(self) {
        let _ = self.0.await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_waiter_wakes() {
        let (trigger, shutdown) = shutdown_pair();
        let a = shutdown.clone();
        assert!(a.clone().wait().now_or_never().is_none());
        trigger.trigger();
        trigger.trigger();
        assert!(a.wait().now_or_never().is_some());
        assert!(shutdown.wait().now_or_never().is_some());
    }
}

/// Tracks tasks (connections) so that a listener can wait, after it stops
/// accepting, until every connection it spawned has finished draining.
/// Each task holds a [`TaskToken`]; [`TaskTracker::wait`] resolves when all
/// tokens are dropped.
pub struct TaskTracker {
    token: Option<TaskToken>,
    done: futures::channel::mpsc::Receiver<()>,
}

/// Held by a tracked task for as long as it runs.
#[derive(Clone)]
pub struct TaskToken(#[allow(dead_code)] futures::channel::mpsc::Sender<()>);

impl Default for TaskTracker {
    fn default() -> Self {
        Self::new()
    }
}

impl TaskTracker {
    /// A tracker with no task.
    pub fn new() -> Self {
        let (tx, rx) = futures::channel::mpsc::channel(0);
        TaskTracker {
            token: Some(TaskToken(tx)),
            done: rx,
        }
    }

    /// A token for one more task.
    pub fn token(&self) -> TaskToken {
        self.token
            .clone()
            .expect("the tracker holds its token until wait() consumes it")
    }

    /// Resolves once every token handed out has been dropped.
    pub async fn wait(mut self) {
        use futures::StreamExt;
        drop(self.token.take());
        while self.done.next().await.is_some() {}
    }
}

#[cfg(test)]
mod tracker_tests {
    use super::*;

    #[test]
    fn waits_for_every_token() {
        let tracker = TaskTracker::new();
        let a = tracker.token();
        let b = a.clone();
        let mut wait = Box::pin(tracker.wait());
        assert!((&mut wait).now_or_never().is_none());
        drop(a);
        assert!((&mut wait).now_or_never().is_none());
        drop(b);
        assert!(wait.now_or_never().is_some());
    }
}
