//! The one seam between the node and an async runtime.
//!
//! Everything that serves or dials (the listeners in
//! [`listen`](crate::listen), the connectors in
//! [`connect`](crate::connect), and above this crate the node's start and
//! run loop, `metropolis_node::serving`) is written once against
//! [`Runtime`]. A runtime crate implements it in one small file: spawning
//! a task, its timer, registering a bound socket, connecting, TLS over its
//! own IO traits, and the termination signals. Nothing else in the node
//! names a runtime.
//!
//! The IO crossing this seam is boxed ([`Io`]): one indirect call per read
//! or write of a connection, next to a TLS record and a system call.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::os::fd::BorrowedFd;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use metropolis_core::ports::{MonotonicClock, Spawner, Timer};
use metropolis_core::time::Instant;
use rustls::pki_types::{CertificateDer, ServerName};

use crate::edge::SharedTimer;

/// An async runtime as the node uses it. Implemented by
/// `metropolis-runtime-tokio` and `metropolis-runtime-smol`; also the core
/// [`Spawner`] port of the service layer.
pub trait Runtime: Spawner + Send + Sync + 'static {
    /// The runtime's timer (the edge's deadlines and hyper's keepalive).
    fn timer(&self) -> SharedTimer;

    /// Takes a bound, listening, non-blocking TCP socket into the runtime.
    fn tcp_listener(&self, listener: std::net::TcpListener) -> io::Result<Box<dyn Listener>>;

    /// Takes a bound, listening, non-blocking UNIX socket into the runtime.
    fn unix_listener(
        &self,
        listener: std::os::unix::net::UnixListener,
    ) -> io::Result<Box<dyn Listener>>;

    /// Opens a TCP connection to `addr` (`host:port`, resolved by the
    /// runtime).
    fn connect_tcp(&self, addr: String) -> BoxFuture<'static, io::Result<Box<dyn Socket>>>;

    /// Connects to the UNIX socket at `path`.
    fn connect_unix(&self, path: PathBuf) -> BoxFuture<'static, io::Result<Box<dyn Socket>>>;

    /// Resolves on the first SIGTERM or SIGINT after this call (the
    /// handlers are installed before it returns).
    fn termination(&self) -> io::Result<BoxFuture<'static, ()>>;
}

/// A runtime shared by the tasks of a node.
pub type SharedRuntime = Arc<dyn Runtime>;

/// The host's monotonic clock and a runtime's timer as the service layer's
/// [`MonotonicClock`] and [`Timer`] ports: instants are offsets from the
/// moment it was made (clones share it), sleeps run on the runtime's
/// timer.
#[derive(Clone)]
pub struct RuntimeTime {
    origin: std::time::Instant,
    timer: SharedTimer,
}

impl RuntimeTime {
    /// Time on `runtime`'s timer, from now.
    pub fn new(runtime: &dyn Runtime) -> RuntimeTime {
        RuntimeTime {
            origin: std::time::Instant::now(),
            timer: runtime.timer(),
        }
    }
}

impl MonotonicClock for RuntimeTime {
    fn now(&self) -> Instant {
        Instant::from_offset(self.origin.elapsed())
    }
}

impl Timer for RuntimeTime {
    fn sleep_until(&self, deadline: Instant) -> BoxFuture<'static, ()> {
        Box::pin(self.timer.sleep_until(self.origin + deadline.offset()))
    }
}

/// An accepted connection and, for TCP, the peer's address.
pub type Accepted = (Box<dyn Socket>, Option<SocketAddr>);

/// A listening socket registered with a runtime.
pub trait Listener: Send + Sync {
    /// The next accepted connection.
    fn accept(&self) -> BoxFuture<'_, io::Result<Accepted>>;
}

/// A connected socket, accepted or dialled, before it carries HTTP/2.
///
/// A runtime may tune how it serves accepted sockets (how reads wait for
/// readiness, how writes are batched); the node only picks plain or TLS.
pub trait Socket: Send {
    /// The socket's descriptor (socket options: `TCP_NODELAY`, keepalive).
    fn fd(&self) -> BorrowedFd<'_>;

    /// The socket itself as HTTP/2's transport.
    fn into_io(self: Box<Self>) -> Io;

    /// The server side of a TLS handshake over the socket.
    fn tls_accept(
        self: Box<Self>,
        config: Arc<rustls::ServerConfig>,
    ) -> BoxFuture<'static, io::Result<Tls>>;

    /// The client side of a TLS handshake over the socket, expecting `name`.
    fn tls_connect(
        self: Box<Self>,
        config: Arc<rustls::ClientConfig>,
        name: ServerName<'static>,
    ) -> BoxFuture<'static, io::Result<Tls>>;
}

/// A finished TLS handshake.
pub struct Tls {
    /// The encrypted stream as HTTP/2's transport.
    pub io: Io,
    /// The certificate chain the peer presented, leaf first.
    pub peer_certificates: Option<Vec<CertificateDer<'static>>>,
}

/// What hyper reads and writes: a connection's byte stream, boxed.
pub struct Io(Pin<Box<dyn HyperIo>>);

/// hyper's IO traits together (object-safe).
pub trait HyperIo: hyper::rt::Read + hyper::rt::Write + Send {}

impl<T: hyper::rt::Read + hyper::rt::Write + Send> HyperIo for T {}

impl Io {
    /// Boxes `io`.
    pub fn new(io: impl HyperIo + 'static) -> Self {
        Io(Box::pin(io))
    }
}

impl hyper::rt::Read for Io {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        self.0.as_mut().poll_read(cx, buf)
    }
}

impl hyper::rt::Write for Io {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.0.as_mut().poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.0.as_mut().poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.0.as_mut().poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.0.as_mut().poll_write_vectored(cx, bufs)
    }
}

/// A [`Runtime`] as hyper's executor (HTTP/2 stream and connection tasks).
#[derive(Clone)]
pub struct Executor(pub SharedRuntime);

impl<F> hyper::rt::Executor<F> for Executor
where
    F: Future<Output = ()> + Send + 'static,
{
    fn execute(&self, future: F) {
        self.0.spawn(Box::pin(future));
    }
}

/// Runs `future` on `runtime` and returns a future that resolves once it
/// finished (or was dropped with the runtime).
pub fn spawn_joinable(
    runtime: &dyn Runtime,
    future: impl Future<Output = ()> + Send + 'static,
) -> impl Future<Output = ()> + Send + 'static {
    let (done, finished) = futures::channel::oneshot::channel::<()>();
    runtime.spawn(Box::pin(async move {
        future.await;
        let _ = done.send(());
    }));
    async move {
        let _ = finished.await;
    }
}

/// Work each thread of a runtime does periodically besides running tasks,
/// on that thread (the daemon: returning the memory its allocator kept).
#[derive(Clone, Copy, Debug)]
pub struct Housekeeping {
    /// The period.
    pub every: std::time::Duration,
    /// What to run.
    pub run: fn(),
}
