//! Where the etcd client runs: a tokio runtime, reached from any executor.
//!
//! etcd-client (tonic, hyper) needs a tokio reactor and timers, so its
//! futures must be polled on a tokio runtime. Every operation of the etcd
//! port is therefore spawned as a task on [`Exec`]'s runtime, and its
//! result comes back through a `tokio::sync` channel, which any executor
//! can await (the channels need no runtime). Dropping the returned future
//! or stream closes the channel, and the task stops at its next await.

use std::future::Future;
use std::sync::Arc;

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};
use metropolis_core::store::StoreError;
use tokio::runtime::{Handle, Runtime};
use tokio::sync::{mpsc, oneshot};

/// A tokio runtime owned by the etcd port (the smol daemon's case): one
/// worker thread, shut down without waiting when the last user is gone.
#[derive(Debug)]
struct OwnedRuntime(Option<Runtime>);

impl Drop for OwnedRuntime {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            // Does not block, and is allowed from within another runtime.
            runtime.shutdown_background();
        }
    }
}

/// The runtime the etcd client's tasks run on.
#[derive(Clone, Debug)]
pub(super) struct Exec {
    handle: Handle,
    /// Keeps a dedicated runtime alive; `None` on the caller's runtime.
    /// Tasks never hold an `Exec`, so the runtime is never dropped by one
    /// of its own tasks.
    _owned: Option<Arc<OwnedRuntime>>,
}

impl Exec {
    /// The tokio runtime the caller runs on.
    pub(super) fn current() -> Result<Exec, StoreError> {
        let handle = Handle::try_current().map_err(|_| {
            StoreError::Unavailable(
                "the etcd store must be connected from within a tokio runtime \
                 (use EtcdStore::connect_dedicated from another executor)"
                    .into(),
            )
        })?;
        Ok(Exec {
            handle,
            _owned: None,
        })
    }

    /// A runtime of its own: one worker thread named `etcd-client`.
    pub(super) fn dedicated() -> Result<Exec, StoreError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("etcd-client")
            .enable_all()
            .build()
            .map_err(|e| {
                StoreError::Unavailable(format!(
                    "cannot start the tokio runtime of the etcd client: {e}"
                ))
            })?;
        Ok(Exec {
            handle: runtime.handle().clone(),
            _owned: Some(Arc::new(OwnedRuntime(Some(runtime)))),
        })
    }

    /// Runs `task` on the runtime; the returned future resolves with its
    /// output on any executor. Dropping the returned future cancels `task`.
    pub(super) fn run<T, F>(&self, task: F) -> BoxFuture<'static, Result<T, StoreError>>
    where
        T: Send + 'static,
        F: Future<Output = Result<T, StoreError>> + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        self.handle.spawn(until_closed(tx, task));
        // The future keeps a dedicated runtime running until it is done.
        let runtime = self.clone();
        async move {
            let _runtime = runtime;
            rx.await.unwrap_or_else(|_| {
                Err(StoreError::Unavailable(
                    "the etcd client's runtime stopped before answering".into(),
                ))
            })
        }
        .boxed()
    }

    /// The items a task sends to `rx`, as a stream any executor can read;
    /// it keeps a dedicated runtime running while it lives. Dropping it
    /// closes the channel (the task sees it and stops).
    pub(super) fn stream<T: Send + 'static>(&self, rx: mpsc::Receiver<T>) -> BoxStream<'static, T> {
        futures::stream::unfold((rx, self.clone()), |(mut rx, runtime)| async move {
            rx.recv().await.map(|item| (item, (rx, runtime)))
        })
        .boxed()
    }

    /// Spawns a background task on the runtime; the handle aborts it.
    pub(super) fn spawn<F>(&self, task: F) -> tokio::task::AbortHandle
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.handle.spawn(task).abort_handle()
    }
}

/// Runs `task` and sends its output, unless the receiver goes away first.
async fn until_closed<T, F>(mut tx: oneshot::Sender<Result<T, StoreError>>, task: F)
where
    F: Future<Output = Result<T, StoreError>>,
{
    let output = {
        let closed = tx.closed();
        tokio::pin!(task);
        tokio::select! {
            output = &mut task => Some(output),
            () = closed => None,
        }
    };
    if let Some(output) = output {
        let _ = tx.send(output);
    }
}
