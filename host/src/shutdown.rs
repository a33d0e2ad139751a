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
