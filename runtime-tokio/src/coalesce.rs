//! Coalescing an HTTP/2 connection's writes under load.
//!
//! tokio runs a task woken by the task it is running next (its "LIFO
//! slot"). When a batch of calls completes at once (the store's writer
//! acknowledges a group commit: a dozen `UpdateNodeStatus` calls of one
//! connection), each call's task hands its response to h2 and wakes the
//! connection task, which then runs at once and writes that one response:
//! one TLS record and one `writev` per response. Measured with
//! `metropolis-load update-tls` (`perf stat` of the daemon): 0.76 `writev`
//! per call on tokio against 0.11 on smol, whose executor runs woken
//! tasks in order and so lets the connection write a dozen responses at
//! a time.
//!
//! [`YieldBeforeWrite`] gives tokio the same order: the first write after
//! a completed flush yields once (the task is woken again at the back of
//! the run queue, behind the other calls that completed with it), so that
//! h2 encodes every response queued meanwhile into that write. An idle
//! connection pays one extra poll of its task per write.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A byte stream whose writer yields to the runtime once before the first
/// write of each flush round: see the [module documentation](self).
#[derive(Debug)]
pub struct YieldBeforeWrite<T> {
    inner: T,
    /// Whether this flush round has yielded already.
    yielded: bool,
}

impl<T> YieldBeforeWrite<T> {
    /// Wraps `inner`.
    pub fn new(inner: T) -> Self {
        YieldBeforeWrite {
            inner,
            yielded: false,
        }
    }

    /// The wrapped stream.
    pub fn get_ref(&self) -> &T {
        &self.inner
    }

    /// Yields once per flush round: `Pending` with the task woken again
    /// (tokio puts a task that woke itself at the back of its queue).
    fn yield_once(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if self.yielded {
            return Poll::Ready(());
        }
        self.yielded = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for YieldBeforeWrite<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for YieldBeforeWrite<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        std::task::ready!(this.yield_once(cx));
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        std::task::ready!(this.yield_once(cx));
        Pin::new(&mut this.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let flushed = std::task::ready!(Pin::new(&mut this.inner).poll_flush(cx));
        this.yielded = false;
        Poll::Ready(flushed)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// A waker counting its wake-ups.
    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn the_first_write_of_each_flush_round_yields_once() {
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = std::task::Waker::from(count.clone());
        let mut cx = Context::from_waker(&waker);
        let mut io = YieldBeforeWrite::new(Vec::<u8>::new());
        let mut io = Pin::new(&mut io);

        assert!(io.as_mut().poll_write(&mut cx, b"ab").is_pending());
        assert_eq!(count.0.load(Ordering::Relaxed), 1, "woken to run again");
        assert!(matches!(
            io.as_mut().poll_write(&mut cx, b"ab"),
            Poll::Ready(Ok(2))
        ));
        assert!(matches!(
            io.as_mut().poll_write(&mut cx, b"cd"),
            Poll::Ready(Ok(2))
        ));
        assert!(matches!(
            io.as_mut().poll_flush(&mut cx),
            Poll::Ready(Ok(()))
        ));
        assert_eq!(io.get_ref().as_slice(), b"abcd");

        // A new round yields again, vectored writes included.
        let slices = [io::IoSlice::new(b"e")];
        assert!(
            io.as_mut()
                .poll_write_vectored(&mut cx, &slices)
                .is_pending()
        );
        assert!(matches!(
            io.as_mut().poll_write_vectored(&mut cx, &slices),
            Poll::Ready(Ok(1))
        ));
        assert_eq!(count.0.load(Ordering::Relaxed), 2);
    }

    #[tokio::test]
    async fn bytes_and_shutdown_pass_through() {
        let (a, mut b) = tokio::io::duplex(64);
        let mut a = YieldBeforeWrite::new(a);
        a.write_all(b"hello").await.unwrap();
        a.flush().await.unwrap();
        a.write_all(b" world").await.unwrap();
        a.shutdown().await.unwrap();
        let mut got = String::new();
        b.read_to_string(&mut got).await.unwrap();
        assert_eq!(got, "hello world");
        b.write_all(b"back").await.unwrap();
        drop(b);
        let mut back = String::new();
        a.read_to_string(&mut back).await.unwrap();
        assert_eq!(back, "back");
    }
}
