//! smol as the node's [`Runtime`]: tasks on a `smol::Executor` (an
//! embedder's, or smol's global one), async-io's timers and sockets,
//! futures-rustls, async-signal.

use std::future::Future;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;

use futures::StreamExt;
use futures::future::BoxFuture;
use futures::io::{AsyncRead, AsyncWrite};
use metropolis_core::ports::Spawner;
use metropolis_transport::edge::SharedTimer;
use metropolis_transport::runtime::{Accepted, Io, Listener, Runtime, SharedRuntime, Socket, Tls};
use rustls::pki_types::ServerName;
use smol::net::unix::{UnixListener, UnixStream};
use smol::net::{TcpListener, TcpStream};
use smol::{Executor, Task};
use smol_hyper::rt::FuturesIo;

use crate::stream::DrainAware;

/// The node's runtime on smol: tasks go to an embedder's `smol::Executor`
/// or to smol's global executor.
#[derive(Clone, Debug, Default)]
pub struct SmolRuntime {
    executor: Option<Arc<Executor<'static>>>,
}

impl SmolRuntime {
    /// Tasks go to smol's global executor (`smol::spawn`).
    pub fn global() -> Self {
        SmolRuntime { executor: None }
    }

    /// Tasks go to `executor`, which the embedder drives.
    pub fn on(executor: Arc<Executor<'static>>) -> Self {
        SmolRuntime {
            executor: Some(executor),
        }
    }

    /// This runtime, shared.
    pub fn shared(&self) -> SharedRuntime {
        Arc::new(self.clone())
    }

    /// Spawns `future`, returning its task handle.
    pub fn spawn<F>(&self, future: F) -> Task<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        match &self.executor {
            Some(ex) => ex.spawn(future),
            None => smol::spawn(future),
        }
    }
}

impl Spawner for SmolRuntime {
    fn spawn(&self, task: Pin<Box<dyn Future<Output = ()> + Send + 'static>>) {
        SmolRuntime::spawn(self, task).detach();
    }
}

impl Runtime for SmolRuntime {
    fn timer(&self) -> SharedTimer {
        Arc::new(SmolTimer)
    }

    fn tcp_listener(&self, listener: std::net::TcpListener) -> io::Result<Box<dyn Listener>> {
        Ok(Box::new(Tcp(TcpListener::try_from(listener)?)))
    }

    fn unix_listener(
        &self,
        listener: std::os::unix::net::UnixListener,
    ) -> io::Result<Box<dyn Listener>> {
        Ok(Box::new(Unix(UnixListener::try_from(listener)?)))
    }

    fn connect_tcp(&self, addr: String) -> BoxFuture<'static, io::Result<Box<dyn Socket>>> {
        Box::pin(async move {
            let stream = TcpStream::connect(addr).await?;
            Ok(Box::new(SmolSocket(stream)) as Box<dyn Socket>)
        })
    }

    fn connect_unix(&self, path: PathBuf) -> BoxFuture<'static, io::Result<Box<dyn Socket>>> {
        Box::pin(async move {
            let stream = UnixStream::connect(path).await?;
            Ok(Box::new(SmolSocket(stream)) as Box<dyn Socket>)
        })
    }

    fn termination(&self) -> io::Result<BoxFuture<'static, ()>> {
        let mut signals =
            async_signal::Signals::new([async_signal::Signal::Term, async_signal::Signal::Int])?;
        Ok(Box::pin(async move {
            let _ = signals.next().await;
        }))
    }
}

/// A TCP listener on async-io.
struct Tcp(TcpListener);

/// A UNIX socket listener on async-io.
struct Unix(UnixListener);

impl Listener for Tcp {
    fn accept(&self) -> BoxFuture<'_, io::Result<Accepted>> {
        Box::pin(async move {
            let (stream, addr) = self.0.accept().await?;
            let socket = SmolSocket(DrainAware::<std::net::TcpStream>::new(stream));
            Ok((Box::new(socket) as Box<dyn Socket>, Some(addr)))
        })
    }
}

impl Listener for Unix {
    fn accept(&self) -> BoxFuture<'_, io::Result<Accepted>> {
        Box::pin(async move {
            let (stream, _) = self.0.accept().await?;
            let socket = SmolSocket(DrainAware::<std::os::unix::net::UnixStream>::new(stream));
            Ok((Box::new(socket) as Box<dyn Socket>, None))
        })
    }
}

/// A socket on async-io: accepted ones are read through [`DrainAware`]
/// (no failed read before each wait for readiness), dialled ones as
/// async-io reads.
struct SmolSocket<S>(S);

impl<S> Socket for SmolSocket<S>
where
    S: AsyncRead + AsyncWrite + AsFd + Send + Unpin + 'static,
{
    fn fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }

    fn into_io(self: Box<Self>) -> Io {
        Io::new(FuturesIo::new(self.0))
    }

    fn tls_accept(
        self: Box<Self>,
        config: Arc<rustls::ServerConfig>,
    ) -> BoxFuture<'static, io::Result<Tls>> {
        Box::pin(tls_accept(self.0, config))
    }

    fn tls_connect(
        self: Box<Self>,
        config: Arc<rustls::ClientConfig>,
        name: ServerName<'static>,
    ) -> BoxFuture<'static, io::Result<Tls>> {
        Box::pin(tls_connect(self.0, config, name))
    }
}

async fn tls_accept<S>(stream: S, config: Arc<rustls::ServerConfig>) -> io::Result<Tls>
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let stream = futures_rustls::TlsAcceptor::from(config)
        .accept(stream)
        .await?;
    let peer_certificates = stream.get_ref().1.peer_certificates().map(<[_]>::to_vec);
    Ok(Tls {
        io: Io::new(FuturesIo::new(stream)),
        peer_certificates,
    })
}

async fn tls_connect<S>(
    stream: S,
    config: Arc<rustls::ClientConfig>,
    name: ServerName<'static>,
) -> io::Result<Tls>
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let stream = futures_rustls::TlsConnector::from(config)
        .connect(name, stream)
        .await?;
    let peer_certificates = stream.get_ref().1.peer_certificates().map(<[_]>::to_vec);
    Ok(Tls {
        io: Io::new(FuturesIo::new(stream)),
        peer_certificates,
    })
}

/// async-io's timers as hyper's (and the edge's) timer.
#[derive(Clone, Copy, Debug, Default)]
pub struct SmolTimer;

/// One sleep of [`SmolTimer`].
struct SmolSleep(async_io::Timer);

impl Future for SmolSleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        Pin::new(&mut self.0).poll(cx).map(|_| ())
    }
}

impl hyper::rt::Sleep for SmolSleep {}

impl hyper::rt::Timer for SmolTimer {
    fn sleep(&self, duration: std::time::Duration) -> Pin<Box<dyn hyper::rt::Sleep>> {
        Box::pin(SmolSleep(async_io::Timer::after(duration)))
    }

    fn sleep_until(&self, deadline: std::time::Instant) -> Pin<Box<dyn hyper::rt::Sleep>> {
        Box::pin(SmolSleep(async_io::Timer::at(deadline)))
    }
}
