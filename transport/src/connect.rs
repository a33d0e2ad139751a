//! Client connections to a curator, on any [`Runtime`](crate::runtime::Runtime):
//! over the local UNIX socket, over mutual TLS, or over plain TCP (the
//! debug service), each as a [`Channel`] for the tonic-generated clients;
//! and the [`Dialer`] a follower reaches its leader
//! with.

use std::path::Path;
use std::sync::Arc;

use futures::future::BoxFuture;
use rustls::pki_types::ServerName;

use crate::grpc::Channel;
use crate::runtime::{Executor, Io, SharedRuntime, Socket, Tls};

/// Connects over the local UNIX socket at `path`.
pub async fn unix(runtime: &SharedRuntime, path: &Path) -> Result<Channel, ConnectError> {
    let target = path.display().to_string();
    let socket = runtime
        .connect_unix(path.to_path_buf())
        .await
        .map_err(|source| ConnectError::Io {
            target: target.clone(),
            source,
        })?;
    handshake(runtime, &target, socket.into_io()).await
}

/// Connects over TLS to `addr` (`host:port`) with `config` (see
/// `pki::client_config`).
pub async fn tls(
    runtime: &SharedRuntime,
    addr: &str,
    config: Arc<rustls::ClientConfig>,
) -> Result<Channel, ConnectError> {
    let stream = tls_stream(runtime, addr, config).await?;
    handshake(runtime, addr, stream.io).await
}

/// Connects over plain TCP (HTTP/2 without TLS) to `addr` (`host:port`):
/// for the debug service, which has no TLS.
pub async fn plain(runtime: &SharedRuntime, addr: &str) -> Result<Channel, ConnectError> {
    let socket = tcp(runtime, addr).await?;
    handshake(runtime, addr, socket.into_io()).await
}

/// The TLS connection under [`tls`]: handshake done, no HTTP/2 yet.
pub async fn tls_stream(
    runtime: &SharedRuntime,
    addr: &str,
    config: Arc<rustls::ClientConfig>,
) -> Result<Tls, ConnectError> {
    let socket = tcp(runtime, addr).await?;
    let name = server_name(addr)?;
    socket
        .tls_connect(config, name)
        .await
        .map_err(|source| ConnectError::Io {
            target: addr.to_string(),
            source,
        })
}

/// A TCP connection to `addr` with Nagle's delay off.
async fn tcp(runtime: &SharedRuntime, addr: &str) -> Result<Box<dyn Socket>, ConnectError> {
    let socket = runtime
        .connect_tcp(addr.to_string())
        .await
        .map_err(|source| ConnectError::Io {
            target: addr.to_string(),
            source,
        })?;
    let _ = socket2::SockRef::from(&socket.fd()).set_tcp_nodelay(true);
    Ok(socket)
}

/// The HTTP/2 handshake over an established connection.
async fn handshake(runtime: &SharedRuntime, target: &str, io: Io) -> Result<Channel, ConnectError> {
    Channel::handshake(io, Executor(runtime.clone()))
        .await
        .map_err(|source| ConnectError::Http2 {
            target: target.to_string(),
            source,
        })
}

/// Opens mutual-TLS connections to curator addresses on a runtime.
pub trait Dialer: Send + Sync + 'static {
    /// Connects to the leader `node_id` at `address` (`host:port`) with
    /// `config`, refusing a server whose certificate is not that curator
    /// instance's ([`check_leader`]).
    fn dial(
        &self,
        node_id: String,
        address: String,
        config: Arc<rustls::ClientConfig>,
    ) -> BoxFuture<'static, Result<Channel, ConnectError>>;
}

/// Dials curator addresses over mutual TLS on a runtime, refusing a server
/// that is not the elected curator instance: how a follower reaches the
/// leader.
#[derive(Clone)]
pub struct RuntimeDialer(pub SharedRuntime);

impl crate::connect::Dialer for RuntimeDialer {
    fn dial(
        &self,
        node_id: String,
        address: String,
        config: Arc<rustls::ClientConfig>,
    ) -> BoxFuture<'static, Result<Channel, ConnectError>> {
        let runtime = self.0.clone();
        Box::pin(async move {
            let stream = tls_stream(&runtime, &address, config).await?;
            check_leader(&address, stream.peer_certificates.as_deref(), &node_id)?;
            handshake(&runtime, &address, stream.io).await
        })
    }
}

/// Why a connection to a curator could not be made.
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
    /// The server is not who it had to be (a leader whose certificate is
    /// not the elected curator instance's).
    Peer {
        /// What was being connected to.
        target: String,
        /// What is wrong with its certificate.
        reason: String,
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
            ConnectError::Peer { target, reason } => write!(f, "{target}: {reason}"),
        }
    }
}

impl std::error::Error for ConnectError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ConnectError::Io { source, .. } => Some(source),
            ConnectError::Http2 { source, .. } => Some(source),
            ConnectError::Peer { .. } => None,
        }
    }
}

/// The TLS server name for `addr` (`host:port`, `[v6]:port`). The cluster's
/// client configuration accepts a certificate issued to another name (see
/// `pki::client_config`), so this only needs to be well-formed.
pub fn server_name(addr: &str) -> Result<ServerName<'static>, ConnectError> {
    let host = addr
        .rsplit_once(':')
        .map(|(h, _)| h)
        .unwrap_or(addr)
        .trim_start_matches('[')
        .trim_end_matches(']');
    ServerName::try_from(host.to_string()).map_err(|e| ConnectError::Io {
        target: addr.to_string(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidInput, e),
    })
}

/// Checks that a server reached at `target` as the leader presented the
/// certificate of curator instance `node_id` (`chain`, end entity first,
/// already verified against the cluster CA by the TLS client): a node
/// certificate of that ID carrying the curator mark. Calls are forwarded
/// on their callers' behalf, so they must not reach any other holder of a
/// cluster certificate the election value might name.
pub fn check_leader(
    target: &str,
    chain: Option<&[rustls::pki_types::CertificateDer<'_>]>,
    node_id: &str,
) -> Result<(), ConnectError> {
    let refuse = |reason: String| {
        Err(ConnectError::Peer {
            target: target.to_string(),
            reason,
        })
    };
    let Some(leaf) = chain.and_then(|c| c.first()) else {
        return refuse("presented no certificate".into());
    };
    match metropolis_core::identity::identity_from_certificate(leaf) {
        Ok(metropolis_core::identity::Identity::Node(id)) if id.as_str() == node_id => {}
        Ok(other) => {
            return refuse(format!(
                "its certificate is {other}'s, not the elected leader {node_id}'s"
            ));
        }
        Err(e) => return refuse(format!("unreadable certificate: {e}")),
    }
    if !metropolis_core::identity::is_curator_certificate(leaf) {
        return refuse(format!(
            "the certificate of {node_id} does not mark a curator instance"
        ));
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn only_the_elected_curator_instance_passes() {
        let ca = metropolis_pki::ClusterCa::generate().unwrap();
        let (curator, curator_id) = ca.issue_curator_node(&[]).unwrap();
        let (node, node_id) = ca.issue_node(&[]).unwrap();
        let chain = |c: &metropolis_pki::Credentials| vec![c.cert_der().unwrap()];
        assert!(check_leader("l:1", Some(&chain(&curator)), curator_id.as_str()).is_ok());
        // Another instance than the one elected.
        let e = check_leader("l:1", Some(&chain(&curator)), node_id.as_str()).unwrap_err();
        assert!(e.to_string().contains("not the elected leader"), "{e}");
        // The right ID but no curator mark.
        let e = check_leader("l:1", Some(&chain(&node)), node_id.as_str()).unwrap_err();
        assert!(e.to_string().contains("does not mark a curator"), "{e}");
        assert!(check_leader("l:1", None, curator_id.as_str()).is_err());
    }

    #[test]
    fn names_from_addresses() {
        assert!(matches!(
            server_name("127.0.0.1:7835"),
            Ok(ServerName::IpAddress(_))
        ));
        assert!(matches!(
            server_name("[::1]:7835"),
            Ok(ServerName::IpAddress(_))
        ));
        assert!(matches!(
            server_name("node1.example:7835"),
            Ok(ServerName::DnsName(_))
        ));
        assert!(server_name("bad name:1").is_err());
    }
}
