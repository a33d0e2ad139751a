//! Client connections to a curator on smol: over the local UNIX socket or
//! over mutual TLS, as a [`Channel`] for the tonic-generated clients.

use std::path::Path;
use std::sync::Arc;

use futures_rustls::TlsConnector;
use metropolis_host::grpc::Channel;
use rustls::pki_types::ServerName;
use smol::net::TcpStream;
use smol::net::unix::UnixStream;

use crate::rt::{FuturesIo, SmolExecutor};

/// Why a connection could not be made.
#[derive(Debug)]
#[non_exhaustive]
pub enum ConnectError {
    /// The socket or TCP connection, or the TLS handshake, failed.
    Io {
        /// What was being connected to.
        target: String,
        /// The error.
        source: std::io::Error,
    },
    /// The HTTP/2 handshake failed.
    Http2 {
        /// What was being connected to.
        target: String,
        /// The error.
        source: hyper::Error,
    },
}

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConnectError::Io { target, source } => {
                write!(f, "cannot connect to {target}: {source}")
            }
            ConnectError::Http2 { target, source } => {
                write!(f, "HTTP/2 handshake with {target} failed: {source}")
            }
        }
    }
}

impl std::error::Error for ConnectError {}

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
    let io_err = |source| ConnectError::Io {
        target: addr.to_string(),
        source,
    };
    let tcp = TcpStream::connect(addr).await.map_err(io_err)?;
    let _ = tcp.set_nodelay(true);
    let host = addr
        .rsplit_once(':')
        .map(|(h, _)| h)
        .unwrap_or(addr)
        .trim_start_matches('[')
        .trim_end_matches(']');
    let name = ServerName::try_from(host.to_string())
        .map_err(|e| io_err(std::io::Error::new(std::io::ErrorKind::InvalidInput, e)))?;
    let stream = TlsConnector::from(config)
        .connect(name, tcp)
        .await
        .map_err(io_err)?;
    Channel::handshake(FuturesIo::new(stream), executor)
        .await
        .map_err(|source| ConnectError::Http2 {
            target: addr.to_string(),
            source,
        })
}
