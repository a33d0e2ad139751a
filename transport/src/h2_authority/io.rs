//! The connection IO that puts a [`Rewriter`] between a client and hyper.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use hyper::rt::{Read, ReadBuf, ReadBufCursor, Write};

use super::rewrite::Rewriter;

/// IO of a local-socket connection whose reads go through a [`Rewriter`]:
/// hyper reads the client's bytes with every refused `:authority` made
/// `localhost`. Writes pass through untouched.
///
/// Reads land in hyper's buffer directly; bytes the rewriter holds back
/// (frame heads split across reads, header blocks) are copied once more.
#[derive(Debug)]
pub(crate) struct RewriteAuthority<T> {
    inner: T,
    rewriter: Rewriter,
    eof: bool,
}

impl<T> RewriteAuthority<T> {
    /// Wraps the IO of a connection that has not been read from yet.
    pub fn new(inner: T) -> Self {
        RewriteAuthority {
            inner,
            rewriter: Rewriter::new(),
            eof: false,
        }
    }

    /// Whether a header block was re-encoded on this connection.
    #[cfg(test)]
    pub fn has_rewritten(&self) -> bool {
        self.rewriter.has_rewritten()
    }
}

impl<T: Read + Unpin> Read for RewriteAuthority<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        mut buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            let pending = this.rewriter.pending();
            if !pending.is_empty() {
                let n = pending.len().min(buf.remaining());
                buf.put_slice(&pending[..n]);
                this.rewriter.consume(n);
                return Poll::Ready(Ok(()));
            }
            if this.eof || buf.remaining() == 0 {
                return Poll::Ready(Ok(()));
            }
            // SAFETY: `ReadBuf::uninit` only lets the inner IO initialize
            // bytes of the unfilled region; `advance` below covers only
            // bytes it reported filled.
            let (read, passed) = unsafe {
                let mut inner_buf = ReadBuf::uninit(buf.as_mut());
                ready!(Pin::new(&mut this.inner).poll_read(cx, inner_buf.unfilled()))?;
                let filled = inner_buf.filled();
                if filled.is_empty() {
                    (0, 0)
                } else {
                    (filled.len(), this.rewriter.scan(filled))
                }
            };
            if read == 0 {
                this.eof = true;
                this.rewriter.finish();
                continue;
            }
            // SAFETY: the first `passed` bytes were filled by the read.
            unsafe { buf.advance(passed) };
            if passed > 0 {
                // Output held back behind them follows at the next read.
                return Poll::Ready(Ok(()));
            }
            // Everything read was taken in: serve what came out, or read
            // on (returning nothing would read as end of stream).
        }
    }
}

impl<T: Write + Unpin> Write for RewriteAuthority<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::collections::VecDeque;
    use std::mem::MaybeUninit;

    /// A reader that hands out fixed chunks, then end of stream.
    struct Chunks(VecDeque<Vec<u8>>);

    impl Read for Chunks {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            mut buf: ReadBufCursor<'_>,
        ) -> Poll<io::Result<()>> {
            if let Some(mut chunk) = self.0.pop_front() {
                let n = chunk.len().min(buf.remaining());
                buf.put_slice(&chunk[..n]);
                if n < chunk.len() {
                    self.0.push_front(chunk.split_off(n));
                }
            }
            Poll::Ready(Ok(()))
        }
    }

    /// Reads `io` to its end with reads of at most `size` bytes.
    fn read_all(io: &mut RewriteAuthority<Chunks>, size: usize) -> Vec<u8> {
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        let mut out = Vec::new();
        loop {
            let mut storage = vec![MaybeUninit::uninit(); size];
            let mut buf = ReadBuf::uninit(&mut storage);
            match Pin::new(&mut *io).poll_read(&mut cx, buf.unfilled()) {
                Poll::Ready(Ok(())) if buf.filled().is_empty() => return out,
                Poll::Ready(Ok(())) => out.extend_from_slice(buf.filled()),
                other => panic!("unexpected {other:?}"),
            }
        }
    }

    /// Through the IO, in reads of every size, the output is the
    /// rewriter's: the passed prefix, then what it held back, in order.
    #[test]
    fn reads_carry_the_rewritten_stream_in_order() {
        let (input, want) = super::super::test_support::sample_stream();
        for chunk in [1, 2, 7, 9, 10, 64, 4096] {
            for read in [1, 3, 9, 100, 16384] {
                let chunks = input.chunks(chunk).map(<[u8]>::to_vec).collect();
                let mut io = RewriteAuthority::new(Chunks(chunks));
                assert_eq!(
                    read_all(&mut io, read),
                    want,
                    "chunks {chunk}, reads {read}"
                );
                assert!(io.has_rewritten());
            }
        }
    }
}
