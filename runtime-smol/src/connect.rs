//! Client connections to a curator on smol: over the local UNIX socket or
//! over mutual TLS, as a [`Channel`] for the tonic-generated clients.

use std::path::Path;
use std::sync::Arc;

use futures_rustls::TlsConnector;
use metropolis_host::connect::server_name;
use metropolis_host::grpc::Channel;
use smol::net::TcpStream;
use smol::net::unix::UnixStream;

use crate::rt::{FuturesIo, SmolExecutor};

pub use metropolis_host::connect::ConnectError;

/// Connects over the local UNIX socket at `path`; the connection's driver
/// runs on `executor`.
pub async fn unix(path: &Path, executor: SmolExecutor) -> Result<Channel, ConnectError> {
    let target = path.display().to_string();
    let stream = UnixStream::connect(path)
        .await
        .map_err(|source| ConnectError::Io {
            target: target.clone(),
            source,
        })?;
    Channel::handshake(FuturesIo::new(stream), executor)
        .await
        .map_err(|source| ConnectError::Http2 { target, source })
}

/// Connects over TLS to `addr` (`host:port`) with `config` (see
/// `metropolis_host::pki::client_config`).
pub async fn tls(
    addr: &str,
    config: Arc<rustls::ClientConfig>,
    executor: SmolExecutor,
) -> Result<Channel, ConnectError> {
    let stream = tls_stream(addr, config).await?;
    handshake(addr, stream, executor).await
}

/// The TLS connection under [`tls`].
async fn tls_stream(
    addr: &str,
    config: Arc<rustls::ClientConfig>,
) -> Result<futures_rustls::client::TlsStream<TcpStream>, ConnectError> {
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
    stream: futures_rustls::client::TlsStream<TcpStream>,
    executor: SmolExecutor,
) -> Result<Channel, ConnectError> {
    Channel::handshake(FuturesIo::new(stream), executor)
        .await
        .map_err(|source| ConnectError::Http2 {
            target: addr.to_string(),
            source,
        })
}

/// Connects over plain TCP (HTTP/2 without TLS) to `addr` (`host:port`):
/// for the debug service, which has no TLS. The connection's driver runs
/// on `executor`.
pub async fn plain(addr: &str, executor: SmolExecutor) -> Result<Channel, ConnectError> {
    let tcp = TcpStream::connect(addr)
        .await
        .map_err(|source| ConnectError::Io {
            target: addr.to_string(),
            source,
        })?;
    let _ = tcp.set_nodelay(true);
    Channel::handshake(FuturesIo::new(tcp), executor)
        .await
        .map_err(|source| ConnectError::Http2 {
            target: addr.to_string(),
            source,
        })
}

/// Dials curator addresses over mutual TLS on smol, the connections
/// driven by an executor: how a follower reaches the leader.
#[derive(Clone)]
pub struct SmolDialer(pub SmolExecutor);

impl metropolis_host::cluster::Dialer for SmolDialer {
    fn dial(
        &self,
        node_id: String,
        address: String,
        config: Arc<rustls::ClientConfig>,
    ) -> futures::future::BoxFuture<'static, Result<Channel, ConnectError>> {
        let executor = self.0.clone();
        Box::pin(async move {
            let stream = tls_stream(&address, config).await?;
            metropolis_host::connect::check_leader(
                &address,
                stream.get_ref().1.peer_certificates(),
                &node_id,
            )?;
            handshake(&address, stream, executor).await
        })
    }
}
