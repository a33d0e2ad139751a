//! An accepted socket that remembers when it was read dry.
//!
//! async-io's own `poll_read` tries the socket first and waits for
//! readiness only after a read fails with `WouldBlock`, so every wait for
//! more bytes costs a failed `recvfrom`. Serving heartbeats on smol, the
//! daemon made 3.7 `recvfrom` calls per request against tokio's 1.0
//! (`perf stat -e 'syscalls:sys_enter_*'` of the daemon during
//! `metropolis-load heartbeat --daemon-runtime smol`). tokio avoids them by
//! taking a read shorter than its buffer as proof that the socket is
//! empty, and waiting for the next readiness event before reading again.
//! [`DrainAware`] does the same on async-io.
//!
//! No readiness is lost: async-io registers interest in level-triggered
//! one-shot mode, so bytes that arrive between the short read and the
//! registration make the event fire at once.

use std::io::{self, IoSlice, Read, Write};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use async_io::Async;
use futures::io::{AsyncRead, AsyncWrite};

/// A socket read like tokio reads one; see the [module](self).
#[derive(Debug)]
pub struct DrainAware<T> {
    inner: Arc<Async<T>>,
    /// The last read came back short or would have blocked: wait for
    /// readiness before the next.
    drained: bool,
}

impl<T> DrainAware<T> {
    /// Wraps a registered socket (`smol::net::TcpStream` and
    /// `UnixStream` convert into `Arc<Async<_>>`).
    pub fn new(inner: impl Into<Arc<Async<T>>>) -> Self {
        DrainAware {
            inner: inner.into(),
            drained: false,
        }
    }

    /// The socket.
    pub fn get_ref(&self) -> &T {
        self.inner.get_ref()
    }
}

impl<T: std::os::fd::AsFd> std::os::fd::AsFd for DrainAware<T> {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.inner.get_ref().as_fd()
    }
}

impl<T> AsyncRead for DrainAware<T>
where
    for<'a> &'a T: Read,
{
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        loop {
            if this.drained {
                ready!(this.inner.poll_readable(cx))?;
                this.drained = false;
            }
            match this.inner.get_ref().read(buf) {
                Ok(n) => {
                    this.drained = n < buf.len();
                    return Poll::Ready(Ok(n));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => this.drained = true,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

/// A socket whose writing half can be shut down: what closing the stream
/// does, as `smol::net::TcpStream` and `UnixStream` do (async-io's own
/// `poll_close` only flushes, so the peer would see the end of the stream
/// only when the socket is dropped).
pub trait ShutdownWrite {
    /// Shuts down the writing half.
    fn shutdown_write(&self) -> io::Result<()>;
}

impl ShutdownWrite for std::net::TcpStream {
    fn shutdown_write(&self) -> io::Result<()> {
        self.shutdown(std::net::Shutdown::Write)
    }
}

impl ShutdownWrite for std::os::unix::net::UnixStream {
    fn shutdown_write(&self) -> io::Result<()> {
        self.shutdown(std::net::Shutdown::Write)
    }
}

impl<T: ShutdownWrite> AsyncWrite for DrainAware<T>
where
    for<'a> &'a T: Write,
{
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut &*self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut &*self.inner).poll_write_vectored(cx, bufs)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut &*self.inner).poll_flush(cx)
    }

    fn poll_close(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(self.inner.get_ref().shutdown_write())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::{AsyncReadExt, AsyncWriteExt};
    use std::os::unix::net::UnixStream;

    fn pair() -> (DrainAware<UnixStream>, DrainAware<UnixStream>) {
        let (a, b) = UnixStream::pair().expect("a socket pair");
        let wrap =
            |s| DrainAware::new(Arc::new(Async::new(s).expect("registers with the reactor")));
        (wrap(a), wrap(b))
    }

    #[test]
    fn bytes_sent_after_a_short_read_still_arrive() {
        smol::block_on(async {
            let (mut a, mut b) = pair();
            a.write_all(b"one").await.expect("writes");
            let mut buf = [0u8; 64];
            let n = b.read(&mut buf).await.expect("reads");
            assert_eq!(&buf[..n], b"one");
            assert!(b.drained, "a short read marks the socket drained");
            // Written after the short read, before the reader waits: the
            // level-triggered registration must still report it.
            a.write_all(b"two").await.expect("writes");
            let n = b.read(&mut buf).await.expect("reads");
            assert_eq!(&buf[..n], b"two");
        });
    }

    #[test]
    fn a_full_read_reads_again_without_waiting() {
        smol::block_on(async {
            let (mut a, mut b) = pair();
            a.write_all(&[7u8; 100]).await.expect("writes");
            let mut buf = [0u8; 60];
            b.read_exact(&mut buf).await.expect("reads the first 60");
            assert!(!b.drained, "a full buffer says nothing about the socket");
            let n = b.read(&mut buf).await.expect("reads the rest");
            assert_eq!(n, 40);
        });
    }

    #[test]
    fn closing_shuts_the_writing_half_down() {
        smol::block_on(async {
            let (mut a, mut b) = pair();
            a.write_all(b"last").await.expect("writes");
            a.close().await.expect("closes");
            // `a` is still alive: the peer sees the end from the shutdown.
            let mut got = Vec::new();
            b.read_to_end(&mut got).await.expect("reads to the end");
            assert_eq!(got, b"last");
            drop(a);
        });
    }

    #[test]
    fn end_of_stream_reads_as_zero() {
        smol::block_on(async {
            let (a, mut b) = pair();
            drop(a);
            let mut buf = [0u8; 8];
            assert_eq!(b.read(&mut buf).await.expect("reads"), 0);
            assert_eq!(b.read(&mut buf).await.expect("reads again"), 0);
        });
    }
}
