//! Ending the debug service's open-ended streams (a running Trace, a
//! followed GetLogs) when the node shuts down.
//!
//! Such streams never end by themselves, so a graceful HTTP/2 shutdown
//! would wait for them until its grace period runs out, and whatever the
//! runtime does with still-pending tasks at exit decides whether their
//! `Drop` (e.g. a trace session's teardown) runs at all. Closing them
//! explicitly makes the end deterministic on every runtime: the inner
//! stream is dropped at once (running its teardown), the client gets
//! Unavailable, then the response ends.

use std::future::Future as _;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use futures::Stream;
use futures::channel::oneshot;
use tonic::Status;

/// Hands out [`Closable`] wrappers and closes them all at once.
#[derive(Clone, Debug, Default)]
pub struct Closer {
    inner: Arc<Mutex<CloserState>>,
}

#[derive(Debug, Default)]
struct CloserState {
    closed: bool,
    open: Vec<oneshot::Sender<()>>,
}

impl Closer {
    fn lock(&self) -> std::sync::MutexGuard<'_, CloserState> {
        // Only a Vec push/drain happens under the lock; a poisoned lock
        // holds consistent state.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Wraps `stream` so that [`Closer::close_all`] ends it. Streams
    /// wrapped after the close end at once.
    pub fn wrap<S>(&self, stream: S) -> Closable<S> {
        let (tx, rx) = oneshot::channel();
        let mut state = self.lock();
        state.open.retain(|tx| !tx.is_canceled());
        if state.closed {
            drop(tx);
        } else {
            state.open.push(tx);
        }
        Closable {
            inner: Some(stream),
            closed: rx,
            reported: false,
        }
    }

    /// Ends every wrapped stream: each drops its inner stream and yields
    /// one Unavailable status.
    pub fn close_all(&self) {
        let open = {
            let mut state = self.lock();
            state.closed = true;
            std::mem::take(&mut state.open)
        };
        for tx in open {
            let _ = tx.send(());
        }
    }
}

/// A stream that [`Closer::close_all`] can end; see the module docs.
#[derive(Debug)]
pub struct Closable<S> {
    inner: Option<S>,
    closed: oneshot::Receiver<()>,
    reported: bool,
}

impl<S, T> Stream for Closable<S>
where
    S: Stream<Item = Result<T, Status>> + Unpin,
{
    type Item = Result<T, Status>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.inner.is_some() && Pin::new(&mut this.closed).poll(cx).is_ready() {
            // Closed (or the closer is gone, which only happens when the
            // service itself is dropped): end now.
            this.inner = None;
        }
        match &mut this.inner {
            Some(inner) => Pin::new(inner).poll_next(cx),
            None if !this.reported => {
                this.reported = true;
                Poll::Ready(Some(Err(Status::unavailable(
                    "the node is shutting down; the call can be retried",
                ))))
            }
            None => Poll::Ready(None),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use futures::StreamExt;

    #[test]
    fn close_all_drops_the_inner_stream_and_reports_unavailable() {
        let closer = Closer::default();
        let (tx, rx) = futures::channel::mpsc::unbounded::<Result<u32, Status>>();
        let mut s = closer.wrap(rx);
        tx.unbounded_send(Ok(1)).unwrap();
        assert_eq!(futures::executor::block_on(s.next()).unwrap().unwrap(), 1);
        closer.close_all();
        let e = futures::executor::block_on(s.next()).unwrap().unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unavailable);
        assert!(futures::executor::block_on(s.next()).is_none());
        // The inner stream was dropped: its sender sees the receiver gone.
        assert!(tx.unbounded_send(Ok(2)).is_err());
        // Streams wrapped after the close end at once.
        let (_tx2, rx2) = futures::channel::mpsc::unbounded::<Result<u32, Status>>();
        let mut late = closer.wrap(rx2);
        assert!(futures::executor::block_on(late.next()).unwrap().is_err());
    }
}
