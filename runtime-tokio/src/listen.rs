//! Listeners: the local UNIX socket (the caller is this node) and TCP with
//! TLS 1.3 (the caller is whoever its client certificate says).

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use metropolis_core::identity::{Identity, NodeId};
use metropolis_core::service::Router;
use metropolis_host::grpc::{ServeOptions, serve_connection};
use metropolis_host::peer::Classify;
use metropolis_host::socket::{prepare_socket_path, restrict_socket};
use tokio::net::{TcpListener, UnixListener};
use tokio_rustls::TlsAcceptor;

use crate::rt::{TokioExecutor, TokioIo};

use metropolis_host::shutdown::TaskTracker;
pub use metropolis_host::shutdown::{Shutdown, ShutdownTrigger, shutdown_pair};

/// Binds the local UNIX socket at `path` with mode 0600, replacing a stale
/// socket file left by a previous run.
pub fn bind_unix(path: &Path) -> io::Result<UnixListener> {
    prepare_socket_path(path)?;
    let listener = UnixListener::bind(path)?;
    restrict_socket(path)?;
    Ok(listener)
}

/// Serves `router` on the UNIX socket; every caller is node `me`.
pub async fn serve_unix(
    listener: UnixListener,
    path: PathBuf,
    me: NodeId,
    router: Router,
    shutdown: Shutdown,
) {
    let stop = shutdown.clone();
    let connections = TaskTracker::new();
    let accept = async {
        loop {
            let (stream, _) = match listener.accept().await {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "accept on local socket failed");
                    continue;
                }
            };
            let (router, identity, shutdown) =
                (router.clone(), Identity::Node(me.clone()), shutdown.clone());
            let token = connections.token();
            tokio::spawn(async move {
                let _token = token;
                let io = TokioIo::new(stream);
                serve(io, identity, router, shutdown).await;
            });
        }
    };
    tokio::select! {
        _ = accept => {}
        _ = stop.wait() => {}
    }
    let _ = std::fs::remove_file(&path);
    // Open connections finish their calls (streams end with their status).
    connections.wait().await;
}

/// Serves one accepted connection until it ends or drains after shutdown.
async fn serve<IO>(io: IO, identity: Identity, router: Router, shutdown: Shutdown)
where
    IO: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let done = shutdown.wait();
    let options = ServeOptions::default();
    if let Err(e) =
        serve_connection(io, identity, router, TokioExecutor::new(), options, done).await
    {
        tracing::debug!(error = %e, "connection ended with an error");
    }
}

/// Binds the TLS listener.
pub async fn bind_tcp(addr: SocketAddr) -> io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// Serves `router` over TLS; each caller's identity comes from its client
/// certificate, classified by `classifier` (no certificate, or one not
/// chained to the cluster CA: unauthenticated).
pub async fn serve_tls(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    classifier: Arc<dyn Classify>,
    router: Router,
    shutdown: Shutdown,
) {
    let acceptor = TlsAcceptor::from(tls);
    let stop = shutdown.clone();
    let connections = TaskTracker::new();
    let accept = async {
        loop {
            let (tcp, peer) = match listener.accept().await {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "accept on TLS listener failed");
                    continue;
                }
            };
            let _ = tcp.set_nodelay(true);
            let (acceptor, router, classifier, shutdown) = (
                acceptor.clone(),
                router.clone(),
                classifier.clone(),
                shutdown.clone(),
            );
            let token = connections.token();
            tokio::spawn(async move {
                let _token = token;
                let handshake =
                    tokio::time::timeout(std::time::Duration::from_secs(10), acceptor.accept(tcp));
                let stream = match handshake.await {
                    Ok(Ok(s)) => s,
                    Ok(Err(e)) => {
                        tracing::debug!(%peer, error = %e, "TLS handshake failed");
                        return;
                    }
                    Err(_) => {
                        tracing::debug!(%peer, "TLS handshake timed out");
                        return;
                    }
                };
                let identity = classifier.classify(stream.get_ref().1.peer_certificates());
                tracing::debug!(%peer, %identity, "TLS connection");
                let io = TokioIo::new(stream);
                serve(io, identity, router, shutdown).await;
            });
        }
    };
    tokio::select! {
        _ = accept => {}
        _ = stop.wait() => {}
    }
    connections.wait().await;
}

/// Serves `router` over plain TCP (HTTP/2 without TLS); every caller is
/// unauthenticated. Only for the debug service, which is unauthenticated
/// by contract.
pub async fn serve_plain(listener: TcpListener, router: Router, shutdown: Shutdown) {
    let stop = shutdown.clone();
    let connections = TaskTracker::new();
    let accept = async {
        loop {
            let (tcp, peer) = match listener.accept().await {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "accept on debug listener failed");
                    continue;
                }
            };
            let _ = tcp.set_nodelay(true);
            tracing::debug!(%peer, "debug connection");
            let (router, shutdown) = (router.clone(), shutdown.clone());
            let token = connections.token();
            tokio::spawn(async move {
                let _token = token;
                serve(
                    TokioIo::new(tcp),
                    Identity::Unauthenticated,
                    router,
                    shutdown,
                )
                .await;
            });
        }
    };
    tokio::select! {
        _ = accept => {}
        _ = stop.wait() => {}
    }
    connections.wait().await;
}
