//! Watch streams over the durable part of the model's history.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::Stream;
use futures::stream::BoxStream;
use metropolis_core::ports::WatchBatch;
use metropolis_core::store::{KeyRange, Revision, StoreError, WatchId};

use super::Shared;

/// A watch of the model, polled up to the durable revision. Woken through
/// its stored waker when the durable revision moves, history is compacted,
/// or the store fails or closes.
pub(super) struct WatchStream {
    shared: Arc<Shared>,
    /// `None` once the stream has ended.
    id: Option<WatchId>,
}

impl WatchStream {
    /// Starts a watch; a stream that yields the error and ends if the
    /// watch cannot start.
    pub(super) fn start(
        shared: Arc<Shared>,
        range: KeyRange,
        start_revision: Revision,
    ) -> BoxStream<'static, Result<WatchBatch, StoreError>> {
        let started = {
            let mut state = shared.lock();
            state
                .check_open()
                .and_then(|()| state.mem.watch(range, start_revision))
        };
        match started {
            Ok(id) => Box::pin(WatchStream {
                shared,
                id: Some(id),
            }),
            Err(e) => Box::pin(futures::stream::once(futures::future::ready(Err(e)))),
        }
    }
}

impl Stream for WatchStream {
    type Item = Result<WatchBatch, StoreError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        let Some(id) = this.id else {
            return Poll::Ready(None);
        };
        let mut state = this.shared.lock();
        let durable = if canary_planted!(WatchPastDurable) {
            state.mem.revision()
        } else {
            state.durable_revision
        };
        match state.mem.poll_watch_up_to(id, durable) {
            Some(Ok(batch)) => Poll::Ready(Some(Ok(batch))),
            Some(Err(e)) => {
                // The model removed the watch.
                state.wakers.remove(&id);
                this.id = None;
                Poll::Ready(Some(Err(e)))
            }
            None => {
                if let Err(e) = state.check_open() {
                    state.mem.cancel_watch(id);
                    state.wakers.remove(&id);
                    this.id = None;
                    return Poll::Ready(Some(Err(e)));
                }
                state.wakers.insert(id, cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

impl Drop for WatchStream {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            let mut state = self.shared.lock();
            state.mem.cancel_watch(id);
            state.wakers.remove(&id);
        }
    }
}
