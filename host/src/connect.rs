//! What both runtimes' client connectors share: the error type and the TLS
//! server name derived from an address.

use rustls::pki_types::ServerName;

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

impl std::error::Error for ConnectError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ConnectError::Io { source, .. } => Some(source),
            ConnectError::Http2 { source, .. } => Some(source),
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

#[cfg(test)]
mod tests {
    use super::*;

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
