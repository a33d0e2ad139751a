//! Client connections to a curator: over the local UNIX socket or over
//! mutual TLS, as a [`Channel`] for the tonic-generated clients.

use std::path::Path;
use std::sync::Arc;

use metropolis_host::connect::server_name;
use metropolis_host::grpc::Channel;
use tokio::net::{TcpStream, UnixStream};
use tokio_rustls::TlsConnector;

use crate::rt::{TokioExecutor, TokioIo};

pub use metropolis_host::connect::ConnectError;

/// Connects over the local UNIX socket at `path`.
pub async fn unix(path: &Path) -> Result<Channel, ConnectError> {
    let target = path.display().to_string();
    let stream = UnixStream::connect(path)
        .await
        .map_err(|source| ConnectError::Io {
            target: target.clone(),
            source,
        })?;
    Channel::handshake(TokioIo::new(stream), TokioExecutor::new())
        .await
        .map_err(|source| ConnectError::Http2 { target, source })
}

/// Connects over TLS to `addr` (`host:port`) with `config` (see
/// `metropolis_host::pki::client_config`).
pub async fn tls(addr: &str, config: Arc<rustls::ClientConfig>) -> Result<Channel, ConnectError> {
    let stream = tls_stream(addr, config).await?;
    handshake(addr, stream).await
}

/// The TLS connection under [`tls`]: handshake done, no HTTP/2 yet.
pub async fn tls_stream(
    addr: &str,
    config: Arc<rustls::ClientConfig>,
) -> Result<tokio_rustls::client::TlsStream<TcpStream>, ConnectError> {
    let io_err = |source| ConnectError::Io {
        target: addr.to_string(),
        source,
    };
    let tcp = TcpStream::connect(addr).await.map_err(io_err)?;
    let _ = tcp.set_nodelay(true);
    let name = server_name(addr)?;
    TlsConnector::from(config)
        .connect(name, tcp)
        .await
        .map_err(io_err)
}

/// The HTTP/2 handshake over an established TLS connection.
async fn handshake(
    addr: &str,
    stream: tokio_rustls::client::TlsStream<TcpStream>,
) -> Result<Channel, ConnectError> {
    Channel::handshake(TokioIo::new(stream), TokioExecutor::new())
        .await
        .map_err(|source| ConnectError::Http2 {
            target: addr.to_string(),
            source,
        })
}

/// Connects over plain TCP (HTTP/2 without TLS) to `addr` (`host:port`):
/// for the debug service, which has no TLS.
pub async fn plain(addr: &str) -> Result<Channel, ConnectError> {
    let tcp = TcpStream::connect(addr)
        .await
        .map_err(|source| ConnectError::Io {
            target: addr.to_string(),
            source,
        })?;
    let _ = tcp.set_nodelay(true);
    Channel::handshake(TokioIo::new(tcp), TokioExecutor::new())
        .await
        .map_err(|source| ConnectError::Http2 {
            target: addr.to_string(),
            source,
        })
}

/// Dials curator addresses over mutual TLS on the current tokio runtime:
/// how a follower reaches the leader.
#[derive(Clone, Copy, Debug, Default)]
pub struct TokioDialer;

impl metropolis_host::cluster::Dialer for TokioDialer {
    fn dial(
        &self,
        node_id: String,
        address: String,
        config: Arc<rustls::ClientConfig>,
    ) -> futures::future::BoxFuture<'static, Result<Channel, ConnectError>> {
        Box::pin(async move {
            let stream = tls_stream(&address, config).await?;
            metropolis_host::connect::check_leader(
                &address,
                stream.get_ref().1.peer_certificates(),
                &node_id,
            )?;
            handshake(&address, stream).await
        })
    }
}
