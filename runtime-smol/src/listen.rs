//! Listeners on smol: the local UNIX socket (the caller is this node) and
//! TCP with TLS 1.3 (the caller is whoever its client certificate says).
//! The accept loop, its limits and the connection limits are
//! [`metropolis_host::edge`]'s; this file supplies smol's sockets, TLS
//! accept and timer.

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures_rustls::TlsAcceptor;
use metropolis_core::identity::{Identity, NodeId};
use metropolis_core::service::Router;
use metropolis_host::edge::{EdgeLimits, SharedTimer, accept_until, with_timeout};
use metropolis_host::grpc::{ServeOptions, serve_connection};
use metropolis_host::peer::{Classify, Peer};
use metropolis_host::shutdown::Shutdown;
use smol::net::TcpListener;
use smol::net::unix::UnixListener;

use crate::rt::{FuturesIo, SmolExecutor, SmolTimer};
use crate::stream::DrainAware;

/// Binds the local UNIX socket at `path` with mode 0600 (from the moment
/// it exists), replacing a stale socket file left by a previous run.
pub fn bind_unix(path: &Path) -> io::Result<UnixListener> {
    UnixListener::try_from(metropolis_host::socket::bind_private(path)?)
}

/// smol's timer, as the edge and hyper take it.
pub fn timer() -> SharedTimer {
    Arc::new(SmolTimer)
}

/// Serves one accepted connection until it ends or drains after shutdown.
async fn serve<IO>(
    io: IO,
    peer: impl Into<Peer>,
    router: Router,
    ex: SmolExecutor,
    options: ServeOptions,
    shutdown: Shutdown,
) where
    IO: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    if let Err(e) = serve_connection(io, peer, router, ex, options, shutdown.wait()).await {
        tracing::debug!(error = %e, "connection ended with an error");
    }
}

/// Binds the TLS listener.
pub async fn bind_tcp(addr: SocketAddr) -> io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// Serves `router` on the UNIX socket; every caller is node `me`.
pub async fn serve_unix(
    listener: UnixListener,
    path: PathBuf,
    me: NodeId,
    router: Router,
    limits: EdgeLimits,
    executor: SmolExecutor,
    shutdown: Shutdown,
) {
    let timer = timer();
    let connections = accept_until(
        "local socket",
        || listener.accept(),
        &limits,
        &timer,
        |task| executor.spawn(task).detach(),
        &shutdown,
        |stream: smol::net::unix::UnixStream, _| {
            let io = FuturesIo::new(DrainAware::new(stream));
            let io = metropolis_host::h2_authority::RewriteAuthority::new(io);
            let identity = Identity::Node(me.clone());
            let ex = executor.clone();
            let options = ServeOptions::new(limits.clone(), timer.clone());
            Box::pin(serve(
                io,
                identity,
                router.clone(),
                ex,
                options,
                shutdown.clone(),
            ))
        },
    )
    .await;
    let _ = std::fs::remove_file(&path);
    // Open connections finish their calls (streams end with their status).
    connections.wait().await;
}

/// Serves `router` over TLS; each caller's identity comes from its client
/// certificate, classified by `classifier`.
pub async fn serve_tls(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    classifier: Arc<dyn Classify>,
    router: Router,
    limits: EdgeLimits,
    executor: SmolExecutor,
    shutdown: Shutdown,
) {
    let acceptor = TlsAcceptor::from(tls);
    let timer = timer();
    let connections = accept_until(
        "TLS listener",
        || listener.accept(),
        &limits,
        &timer,
        |task| executor.spawn(task).detach(),
        &shutdown,
        |tcp: smol::net::TcpStream, peer_addr: SocketAddr| {
            let _ = tcp.set_nodelay(true);
            if let Err(e) = metropolis_host::socket::set_tcp_keepalive(&tcp, limits.tcp_keepalive) {
                tracing::debug!(error = %e, "cannot turn on TCP keepalive");
            }
            let (acceptor, router, classifier, shutdown, ex) = (
                acceptor.clone(),
                router.clone(),
                classifier.clone(),
                shutdown.clone(),
                executor.clone(),
            );
            let options = ServeOptions::new(limits.clone(), timer.clone());
            let (timer, handshake_timeout) = (timer.clone(), limits.handshake_timeout);
            Box::pin(async move {
                let handshake = acceptor.accept(DrainAware::new(tcp));
                let stream = match with_timeout(&timer, handshake_timeout, handshake).await {
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
                let peer = classifier.peer(stream.get_ref().1.peer_certificates());
                tracing::debug!(%peer_addr, identity = %peer.identity, "TLS connection");
                serve(FuturesIo::new(stream), peer, router, ex, options, shutdown).await;
            })
        },
    )
    .await;
    connections.wait().await;
}

/// Serves `router` over plain TCP (HTTP/2 without TLS); every caller is
/// unauthenticated, and its socket address reaches the services as
/// [`RemoteAddr`](metropolis_core::service::RemoteAddr) (for the debug
/// service's audit log). Only for the debug service, which is
/// unauthenticated by contract.
pub async fn serve_plain(
    listener: TcpListener,
    router: Router,
    limits: EdgeLimits,
    executor: SmolExecutor,
    shutdown: Shutdown,
) {
    let timer = timer();
    let connections = accept_until(
        "debug listener",
        || listener.accept(),
        &limits,
        &timer,
        |task| executor.spawn(task).detach(),
        &shutdown,
        |tcp: smol::net::TcpStream, peer: SocketAddr| {
            let _ = tcp.set_nodelay(true);
            if let Err(e) = metropolis_host::socket::set_tcp_keepalive(&tcp, limits.tcp_keepalive) {
                tracing::debug!(error = %e, "cannot turn on TCP keepalive");
            }
            tracing::debug!(%peer, "debug connection");
            let io = FuturesIo::new(DrainAware::new(tcp));
            let ex = executor.clone();
            let caller = Peer::from(Identity::Unauthenticated).with_addr(peer);
            let options = ServeOptions::new(limits.clone(), timer.clone());
            Box::pin(serve(
                io,
                caller,
                router.clone(),
                ex,
                options,
                shutdown.clone(),
            ))
        },
    )
    .await;
    connections.wait().await;
}
