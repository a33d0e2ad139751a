//! The node's listeners, on any [`Runtime`](crate::runtime::Runtime): the local UNIX socket (the
//! caller is this node), TCP with TLS 1.3 (the caller is whoever its client
//! certificate says) and plain TCP for the debug service. The accept loop
//! and its limits are [`edge`](crate::edge)'s, each connection is served
//! by [`serve_connection`]; and the metrics endpoint ([`serve_scrapes`]).

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use metropolis_core::identity::{Identity, NodeId};
use metropolis_service::Router;

use crate::edge::{ConnectionTask, EdgeLimits, SharedTimer, accept_until, with_timeout};
use crate::grpc::{ServeOptions, serve_connection};
use crate::peer::{Classify, Peer, admit};
use crate::runtime::{Executor, Io, Listener, SharedRuntime, Socket};
use crate::shutdown::{Shutdown, TaskTracker};

/// Pending connections the kernel queues per TCP listener (tokio's
/// default), so a thousand agents connecting at once are not refused.
const TCP_BACKLOG: i32 = 1024;

/// Binds a TCP listener on `addr` and registers it with `runtime`;
/// returns it with the address it is bound to (useful with port 0).
pub fn bind_tcp(
    runtime: &SharedRuntime,
    addr: SocketAddr,
) -> io::Result<(Box<dyn Listener>, SocketAddr)> {
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )?;
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(TCP_BACKLOG)?;
    let listener = std::net::TcpListener::from(socket);
    let bound = listener.local_addr()?;
    Ok((runtime.tcp_listener(listener)?, bound))
}

/// Binds the local UNIX socket at `path` with mode 0600 (from the moment
/// it exists), replacing a stale socket file left by a previous run, and
/// registers it with `runtime`.
pub fn bind_unix(runtime: &SharedRuntime, path: &Path) -> io::Result<Box<dyn Listener>> {
    runtime.unix_listener(crate::socket::bind_private(path)?)
}

/// Serves `router` on the UNIX socket at `path` until `shutdown`; every
/// caller is node `me`. Removes the socket file when it stops accepting,
/// then lets open connections finish their calls.
pub async fn serve_unix(
    runtime: SharedRuntime,
    listener: Box<dyn Listener>,
    path: PathBuf,
    me: NodeId,
    router: Router,
    limits: EdgeLimits,
    shutdown: Shutdown,
) {
    let connections = accept(
        "local socket",
        &runtime,
        &*listener,
        &limits,
        &shutdown,
        |socket, _, with| {
            let io = crate::h2_authority::RewriteAuthority::new(socket.into_io());
            let me = Identity::Node(me.clone()).into();
            Box::pin(with.serve(Io::new(io), me, router.clone()))
        },
    )
    .await;
    let _ = std::fs::remove_file(&path);
    connections.wait().await;
}

/// Serves `router` over TLS until `shutdown`; each caller's identity comes
/// from its client certificate, classified by `classifier` (no
/// certificate, or one not chained to the cluster CA: unauthenticated).
pub async fn serve_tls(
    runtime: SharedRuntime,
    listener: Box<dyn Listener>,
    tls: Arc<rustls::ServerConfig>,
    classifier: Arc<dyn Classify>,
    router: Router,
    limits: EdgeLimits,
    shutdown: Shutdown,
) {
    let connections = accept(
        "TLS listener",
        &runtime,
        &*listener,
        &limits,
        &shutdown,
        |socket, peer_addr, with| {
            tune_tcp(&*socket, &limits);
            let handshake = socket.tls_accept(tls.clone());
            let (router, classifier) = (router.clone(), classifier.clone());
            let handshake_timeout = limits.handshake_timeout;
            Box::pin(async move {
                let peer_addr = Addr(peer_addr);
                let handshake = with_timeout(&with.timer, handshake_timeout, handshake);
                let stream = match handshake.await {
                    Some(Ok(s)) => s,
                    Some(Err(e)) => {
                        tracing::debug!(%peer_addr, error = %e, "TLS handshake failed");
                        return;
                    }
                    None => {
                        tracing::debug!(%peer_addr, "TLS handshake timed out");
                        return;
                    }
                };
                let peer = admit(&*classifier, stream.peer_certificates.as_deref());
                tracing::debug!(%peer_addr, identity = %peer.identity, "TLS connection");
                with.serve(stream.io, peer, router).await;
            })
        },
    )
    .await;
    connections.wait().await;
}

/// Serves `router` over plain TCP (HTTP/2 without TLS) until `shutdown`;
/// every caller is unauthenticated, and its socket address reaches the
/// services as [`RemoteAddr`](metropolis_service::RemoteAddr) (for
/// the debug service's audit log). Only for the debug service, which is
/// unauthenticated by contract.
pub async fn serve_plain(
    runtime: SharedRuntime,
    listener: Box<dyn Listener>,
    router: Router,
    limits: EdgeLimits,
    shutdown: Shutdown,
) {
    let connections = accept(
        "debug listener",
        &runtime,
        &*listener,
        &limits,
        &shutdown,
        |socket, peer_addr, with| {
            tune_tcp(&*socket, &limits);
            tracing::debug!(peer_addr = %Addr(peer_addr), "debug connection");
            let mut caller = Peer::from(Identity::Unauthenticated);
            if let Some(addr) = peer_addr {
                caller = caller.with_addr(addr);
            }
            Box::pin(with.serve(socket.into_io(), caller, router.clone()))
        },
    )
    .await;
    connections.wait().await;
}

/// Serves Prometheus scrapes (`GET /metrics`, plain HTTP/1.1, see
/// [`exposition`](crate::exposition)) until `shutdown`, each document
/// made by `render`. Every caller is served: bind it where only the
/// scrapers reach (the daemon's default is loopback).
pub async fn serve_scrapes(
    runtime: SharedRuntime,
    listener: Box<dyn Listener>,
    render: crate::exposition::Render,
    limits: EdgeLimits,
    shutdown: Shutdown,
) {
    let connections = accept(
        "metrics listener",
        &runtime,
        &*listener,
        &limits,
        &shutdown,
        |socket, _, with| {
            tune_tcp(&*socket, &limits);
            let serve = crate::exposition::serve_connection(
                socket.into_io(),
                render.clone(),
                with.timer.clone(),
                limits.handshake_timeout,
                with.shutdown.wait(),
            );
            Box::pin(serve)
        },
    )
    .await;
    connections.wait().await;
}

/// What serving one accepted connection needs besides its IO, its caller
/// and its router.
struct Serve {
    /// The runtime's timer (also for a TLS handshake's deadline).
    timer: SharedTimer,
    executor: Executor,
    options: ServeOptions,
    shutdown: Shutdown,
}

impl Serve {
    /// Serves the connection until it ends or drains after shutdown.
    async fn serve(self, io: Io, peer: Peer, router: Router) {
        let done = self.shutdown.wait();
        if let Err(e) = serve_connection(io, peer, router, self.executor, self.options, done).await
        {
            tracing::debug!(error = %e, "connection ended with an error");
        }
    }
}

/// Accepts on `listener` until `shutdown` with the edge's loop and limits
/// ([`accept_until`]), running `handle` for each connection on a task of
/// its own; returns the tracker of those tasks. `what` names the listener
/// in logs.
async fn accept(
    what: &str,
    runtime: &SharedRuntime,
    listener: &dyn Listener,
    limits: &EdgeLimits,
    shutdown: &Shutdown,
    handle: impl Fn(Box<dyn Socket>, Option<SocketAddr>, Serve) -> ConnectionTask,
) -> TaskTracker {
    let timer = runtime.timer();
    accept_until(
        what,
        || listener.accept(),
        limits,
        &timer,
        |task| runtime.spawn(task),
        shutdown,
        |socket, peer_addr| {
            let with = Serve {
                timer: timer.clone(),
                executor: Executor(runtime.clone()),
                options: ServeOptions::new(limits.clone(), timer.clone()),
                shutdown: shutdown.clone(),
            };
            handle(socket, peer_addr, with)
        },
    )
    .await
}

/// Every accepted TCP connection: no Nagle delay (responses are small and
/// latency-bound), and TCP keepalive as the limits say.
fn tune_tcp(socket: &dyn Socket, limits: &EdgeLimits) {
    let fd = socket.fd();
    let _ = socket2::SockRef::from(&fd).set_tcp_nodelay(true);
    if let Err(e) = crate::socket::set_tcp_keepalive(&fd, limits.tcp_keepalive) {
        tracing::debug!(error = %e, "cannot turn on TCP keepalive");
    }
}

/// A peer's address in a log line (`-` when the socket has none).
struct Addr(Option<SocketAddr>);

impl std::fmt::Display for Addr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(addr) => addr.fmt(f),
            None => f.write_str("-"),
        }
    }
}
