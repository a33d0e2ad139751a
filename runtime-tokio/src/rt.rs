//! tokio as the node's [`Runtime`]: tasks on a tokio runtime, its timer,
//! its sockets, tokio-rustls, its signal handling.

use std::future::Future;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;

use futures::future::BoxFuture;
use hyper_util::rt::TokioIo;
use metropolis_core::ports::Spawner;
use metropolis_transport::edge::SharedTimer;
use metropolis_transport::runtime::{Accepted, Io, Listener, Runtime, SharedRuntime, Socket, Tls};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};

use crate::coalesce::YieldBeforeWrite;

/// The node's runtime on a tokio runtime (multi-threaded or not).
#[derive(Clone, Debug)]
pub struct TokioRuntime {
    handle: tokio::runtime::Handle,
}

impl TokioRuntime {
    /// The runtime of the calling task.
    ///
    /// Panics outside a tokio runtime (a programming error).
    pub fn current() -> Self {
        TokioRuntime {
            handle: tokio::runtime::Handle::current(),
        }
    }

    /// [`current`](Self::current), shared.
    pub fn shared() -> SharedRuntime {
        Arc::new(Self::current())
    }
}

impl Spawner for TokioRuntime {
    fn spawn(&self, task: Pin<Box<dyn Future<Output = ()> + Send + 'static>>) {
        self.handle.spawn(task);
    }
}

impl Runtime for TokioRuntime {
    fn timer(&self) -> SharedTimer {
        Arc::new(hyper_util::rt::TokioTimer::new())
    }

    fn tcp_listener(&self, listener: std::net::TcpListener) -> io::Result<Box<dyn Listener>> {
        let _entered = self.handle.enter();
        Ok(Box::new(Tcp(TcpListener::from_std(listener)?)))
    }

    fn unix_listener(
        &self,
        listener: std::os::unix::net::UnixListener,
    ) -> io::Result<Box<dyn Listener>> {
        let _entered = self.handle.enter();
        Ok(Box::new(Unix(UnixListener::from_std(listener)?)))
    }

    fn connect_tcp(&self, addr: String) -> BoxFuture<'static, io::Result<Box<dyn Socket>>> {
        Box::pin(async move {
            let stream = TcpStream::connect(addr).await?;
            Ok(TokioSocket::dialled(stream))
        })
    }

    fn connect_unix(&self, path: PathBuf) -> BoxFuture<'static, io::Result<Box<dyn Socket>>> {
        Box::pin(async move {
            let stream = UnixStream::connect(path).await?;
            Ok(TokioSocket::dialled(stream))
        })
    }

    fn termination(&self) -> io::Result<BoxFuture<'static, ()>> {
        use tokio::signal::unix::{SignalKind, signal};
        let _entered = self.handle.enter();
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        Ok(Box::pin(async move {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }))
    }
}

/// A TCP listener on tokio.
struct Tcp(TcpListener);

/// A UNIX socket listener on tokio.
struct Unix(UnixListener);

impl Listener for Tcp {
    fn accept(&self) -> BoxFuture<'_, io::Result<Accepted>> {
        Box::pin(async move {
            let (stream, addr) = self.0.accept().await?;
            Ok((TokioSocket::accepted(stream), Some(addr)))
        })
    }
}

impl Listener for Unix {
    fn accept(&self) -> BoxFuture<'_, io::Result<Accepted>> {
        Box::pin(async move {
            let (stream, _) = self.0.accept().await?;
            Ok((TokioSocket::accepted(stream), None))
        })
    }
}

/// A tokio socket; an accepted one writes through [`YieldBeforeWrite`]
/// (its responses go out together when calls complete together).
struct TokioSocket<S> {
    stream: S,
    accepted: bool,
}

impl<S> TokioSocket<S>
where
    S: AsyncRead + AsyncWrite + AsFd + Send + Unpin + 'static,
{
    fn accepted(stream: S) -> Box<dyn Socket> {
        Box::new(TokioSocket {
            stream,
            accepted: true,
        })
    }

    fn dialled(stream: S) -> Box<dyn Socket> {
        Box::new(TokioSocket {
            stream,
            accepted: false,
        })
    }
}

/// `stream` as hyper's IO, coalescing writes when `accepted`.
fn io<T>(stream: T, accepted: bool) -> Io
where
    T: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    if accepted {
        Io::new(TokioIo::new(YieldBeforeWrite::new(stream)))
    } else {
        Io::new(TokioIo::new(stream))
    }
}

impl<S> Socket for TokioSocket<S>
where
    S: AsyncRead + AsyncWrite + AsFd + Send + Unpin + 'static,
{
    fn fd(&self) -> BorrowedFd<'_> {
        self.stream.as_fd()
    }

    fn into_io(self: Box<Self>) -> Io {
        io(self.stream, self.accepted)
    }

    fn tls_accept(
        self: Box<Self>,
        config: Arc<rustls::ServerConfig>,
    ) -> BoxFuture<'static, io::Result<Tls>> {
        let TokioSocket { stream, accepted } = *self;
        Box::pin(async move {
            let stream = tokio_rustls::TlsAcceptor::from(config)
                .accept(stream)
                .await?;
            let peer_certificates = stream.get_ref().1.peer_certificates().map(<[_]>::to_vec);
            Ok(Tls {
                io: io(stream, accepted),
                peer_certificates,
            })
        })
    }

    fn tls_connect(
        self: Box<Self>,
        config: Arc<rustls::ClientConfig>,
        name: ServerName<'static>,
    ) -> BoxFuture<'static, io::Result<Tls>> {
        let TokioSocket { stream, accepted } = *self;
        Box::pin(async move {
            let stream = tokio_rustls::TlsConnector::from(config)
                .connect(name, stream)
                .await?;
            let peer_certificates = stream.get_ref().1.peer_certificates().map(<[_]>::to_vec);
            Ok(Tls {
                io: io(stream, accepted),
                peer_certificates,
            })
        })
    }
}
