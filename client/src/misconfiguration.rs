//! Failures no retry can fix, told apart from network blips: a server
//! certificate that can never verify, a credential the server refuses, a
//! port that does not speak TLS. One attempt finds them; the call ends at
//! once with what to change ([`CallError::Misconfigured`]) instead of
//! being retried until its deadline.
//!
//! [`CallError::Misconfigured`]: crate::CallError::Misconfigured

use std::fmt;

/// What one attempt found wrong with the client's or the server's
/// configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Misconfiguration {
    /// The server's certificate does not chain to the CA this client
    /// trusts (unknown issuer, bad signature): the CA certificate given is
    /// another cluster's, or the endpoint is another cluster's curator.
    UntrustedServer,
    /// The server's certificate is the cluster's, but not a curator
    /// instance's: the endpoint is an ordinary node (or poses as a
    /// curator).
    NotACurator,
    /// A certificate is expired or not valid yet: a clock is wrong, here
    /// or on the server.
    CertificateTime,
    /// The server refused this client's certificate during the handshake.
    CredentialRefused,
    /// The endpoint does not speak TLS: a plain HTTP/2 port (the debug
    /// service's, metropolisd --debug-listen) or another protocol.
    NotTls,
}

impl Misconfiguration {
    /// What it means and what to change, for people.
    pub fn advice(self) -> &'static str {
        match self {
            Misconfiguration::UntrustedServer => {
                "the server's certificate is not signed by the CA this client trusts: give the CA \
                 certificate of the cluster the endpoint serves (metropolisd writes it to \
                 <data-dir>/pki/ca.pem), or an endpoint of this CA's cluster"
            }
            Misconfiguration::NotACurator => {
                "the server is a member of the cluster but not a curator: give the endpoint of a \
                 curator"
            }
            Misconfiguration::CertificateTime => {
                "a certificate is expired or not valid yet: check the clock of this machine and \
                 of the server"
            }
            Misconfiguration::CredentialRefused => {
                "the server refused this client's certificate: the credential is not one of the \
                 server's cluster"
            }
            Misconfiguration::NotTls => {
                "the endpoint does not speak TLS: it is not a curator's TLS port (the debug port, \
                 metropolisd --debug-listen, is plain HTTP/2); the Curator is on metropolisd \
                 --listen (default port 7835), AgentCallback on --agent-listen (default port \
                 7836)"
            }
        }
    }

    /// The gRPC code it counts as: Unauthenticated for a certificate
    /// either side refuses, Unavailable for a port that is not a
    /// curator's (as gRPC clients report a failed connection).
    pub fn code(self) -> tonic::Code {
        match self {
            Misconfiguration::NotTls => tonic::Code::Unavailable,
            _ => tonic::Code::Unauthenticated,
        }
    }
}

impl fmt::Display for Misconfiguration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.advice())
    }
}

/// What a failed connection's `error` (a TLS handshake's, found among its
/// sources) shows to be misconfigured, if anything: `None` for what may
/// pass (refused, reset, timed out).
pub(crate) fn of_connect_error(
    error: &(dyn std::error::Error + 'static),
) -> Option<Misconfiguration> {
    use rustls::{AlertDescription as Alert, CertificateError as Cert, Error as Tls};
    match tls_error(error)? {
        Tls::InvalidMessage(_) => Some(Misconfiguration::NotTls),
        Tls::InvalidCertificate(
            Cert::Expired
            | Cert::ExpiredContext { .. }
            | Cert::NotValidYet
            | Cert::NotValidYetContext { .. },
        ) => Some(Misconfiguration::CertificateTime),
        Tls::InvalidCertificate(Cert::Other(other))
            if other
                .to_string()
                .contains(metropolis_core::identity::CURATOR_URI) =>
        {
            Some(Misconfiguration::NotACurator)
        }
        // Revocation and name checks do not apply to cluster
        // certificates: what is left never verifies with this CA.
        Tls::InvalidCertificate(_) => Some(Misconfiguration::UntrustedServer),
        Tls::AlertReceived(
            Alert::BadCertificate
            | Alert::UnknownCA
            | Alert::CertificateUnknown
            | Alert::CertificateRequired
            | Alert::UnsupportedCertificate
            | Alert::AccessDenied,
        ) => Some(Misconfiguration::CredentialRefused),
        _ => None,
    }
}

/// The TLS error among `error` and its sources (directly, or inside an
/// I/O error as TLS streams report it).
fn tls_error<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    let mut next = Some(error);
    while let Some(e) = next {
        if let Some(tls) = e.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        // An I/O error's `source` skips the error it wraps: look at that
        // one itself.
        next = match e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            Some(inner) => Some(inner as &(dyn std::error::Error + 'static)),
            None => e.source(),
        };
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::{CertificateError, Error as Tls};

    fn io(e: Tls) -> std::io::Error {
        std::io::Error::new(std::io::ErrorKind::InvalidData, e)
    }

    #[test]
    fn certificates_that_never_verify_are_permanent() {
        for cert in [
            CertificateError::BadSignature,
            CertificateError::UnknownIssuer,
        ] {
            let e = io(Tls::InvalidCertificate(cert));
            assert_eq!(
                of_connect_error(&e),
                Some(Misconfiguration::UntrustedServer)
            );
        }
        let e = io(Tls::InvalidCertificate(CertificateError::Expired));
        assert_eq!(
            of_connect_error(&e),
            Some(Misconfiguration::CertificateTime)
        );
        let not_tls = io(Tls::InvalidMessage(
            rustls::InvalidMessage::InvalidContentType,
        ));
        assert_eq!(of_connect_error(&not_tls), Some(Misconfiguration::NotTls));
        let refused = Tls::AlertReceived(rustls::AlertDescription::UnknownCA);
        assert_eq!(
            of_connect_error(&refused),
            Some(Misconfiguration::CredentialRefused)
        );
        // Wrapped once more, as a connector's error with the I/O error as
        // its source.
        let outer =
            std::io::Error::other(io(Tls::InvalidCertificate(CertificateError::UnknownIssuer)));
        assert_eq!(
            of_connect_error(&outer),
            Some(Misconfiguration::UntrustedServer)
        );
    }

    #[test]
    fn blips_are_not() {
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert_eq!(of_connect_error(&refused), None);
        let closed = io(Tls::AlertReceived(rustls::AlertDescription::CloseNotify));
        assert_eq!(of_connect_error(&closed), None);
        let eof = io(Tls::General("unexpected end".into()));
        assert_eq!(of_connect_error(&eof), None);
    }
}
