//! Listeners on smol: the local UNIX socket (the caller is this node) and
//! TCP with TLS 1.3 (the caller is whoever its client certificate says).

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures_rustls::TlsAcceptor;
use metropolis_core::identity::{Identity, NodeId};
use metropolis_core::service::Router;
use metropolis_host::grpc::{ServeOptions, serve_connection};
use metropolis_host::peer::{Classify, Peer};
use metropolis_host::shutdown::Shutdown;
use metropolis_host::shutdown::TaskTracker;
use metropolis_host::socket::{prepare_socket_path, restrict_socket};
use smol::net::TcpListener;
use smol::net::unix::UnixListener;

use crate::rt::{FuturesIo, SmolExecutor};
use crate::stream::DrainAware;

/// Binds the local UNIX socket at `path` with mode 0600, replacing a stale
/// socket file left by a previous run.
pub fn bind_unix(path: &Path) -> io::Result<UnixListener> {
    prepare_socket_path(path)?;
    let listener = UnixListener::bind(path)?;
    restrict_socket(path)?;
    Ok(listener)
}

/// Serves one accepted connection until it ends or drains after shutdown.
async fn serve<IO>(
    io: IO,
    peer: impl Into<Peer>,
    router: Router,
    ex: SmolExecutor,
    shutdown: Shutdown,
) where
    IO: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let options = ServeOptions::default();
    if let Err(e) = serve_connection(io, peer, router, ex, options, shutdown.wait()).await {
        tracing::debug!(error = %e, "connection ended with an error");
    }
}

/// Binds the TLS listener.
pub async fn bind_tcp(addr: SocketAddr) -> io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// A connection's task, as [`accept_until`] runs it.
type ConnectionTask = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// Accepts connections with `accept` until `shutdown` fires, running
/// `handle` for each on its own task on `executor`; returns the tracker of
/// those tasks (wait on it to let open connections finish their calls).
/// `what` names the listener in logs.
async fn accept_until<S, P, F>(
    what: &str,
    mut accept: impl FnMut() -> F,
    executor: &SmolExecutor,
    shutdown: &Shutdown,
    handle: impl Fn(S, P) -> ConnectionTask,
) -> TaskTracker
where
    F: std::future::Future<Output = io::Result<(S, P)>>,
{
    let connections = TaskTracker::new();
    let accept_loop = async {
        loop {
            match accept().await {
                Ok((stream, peer)) => {
                    let token = connections.token();
                    let connection = handle(stream, peer);
                    executor
                        .spawn(async move {
                            let _token = token;
                            connection.await;
                        })
                        .detach();
                }
                Err(e) => tracing::warn!(error = %e, "accept on {what} failed"),
            }
        }
    };
    futures::select! {
        _ = accept_loop.fuse() => {}
        _ = shutdown.clone().wait().fuse() => {}
    }
    connections
}

/// Serves `router` on the UNIX socket; every caller is node `me`.
pub async fn serve_unix(
    listener: UnixListener,
    path: PathBuf,
    me: NodeId,
    router: Router,
    executor: SmolExecutor,
    shutdown: Shutdown,
) {
    let connections = accept_until(
        "local socket",
        || listener.accept(),
        &executor,
        &shutdown,
        |stream: smol::net::unix::UnixStream, _| {
            let io = FuturesIo::new(DrainAware::new(stream));
            let io = metropolis_host::h2_authority::RewriteAuthority::new(io);
            let identity = Identity::Node(me.clone());
            let ex = executor.clone();
            Box::pin(serve(io, identity, router.clone(), ex, shutdown.clone()))
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
    executor: SmolExecutor,
    shutdown: Shutdown,
) {
    let acceptor = TlsAcceptor::from(tls);
    let connections = accept_until(
        "TLS listener",
        || listener.accept(),
        &executor,
        &shutdown,
        |tcp: smol::net::TcpStream, peer_addr: SocketAddr| {
            let _ = tcp.set_nodelay(true);
            let (acceptor, router, classifier, shutdown, ex) = (
                acceptor.clone(),
                router.clone(),
                classifier.clone(),
                shutdown.clone(),
                executor.clone(),
            );
            Box::pin(async move {
                let handshake = acceptor.accept(DrainAware::new(tcp)).map(Some);
                let timeout = async {
                    async_io::Timer::after(Duration::from_secs(10)).await;
                    None
                };
                let stream = match smol::future::or(handshake, timeout).await {
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
                serve(FuturesIo::new(stream), peer, router, ex, shutdown).await;
            })
        },
    )
    .await;
    connections.wait().await;
}

/// Serves `router` over plain TCP (HTTP/2 without TLS); every caller is
/// unauthenticated. Only for the debug service, which is unauthenticated
/// by contract.
pub async fn serve_plain(
    listener: TcpListener,
    router: Router,
    executor: SmolExecutor,
    shutdown: Shutdown,
) {
    let connections = accept_until(
        "debug listener",
        || listener.accept(),
        &executor,
        &shutdown,
        |tcp: smol::net::TcpStream, peer: SocketAddr| {
            let _ = tcp.set_nodelay(true);
            tracing::debug!(%peer, "debug connection");
            let io = FuturesIo::new(DrainAware::new(tcp));
            let ex = executor.clone();
            let identity = Identity::Unauthenticated;
            Box::pin(serve(io, identity, router.clone(), ex, shutdown.clone()))
        },
    )
    .await;
    connections.wait().await;
}
