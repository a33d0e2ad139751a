//! How `metroctl` fails: a message and an exit status that tells a script
//! what kind of failure it was (as etcdctl's do), rather than 1 for all.

use std::fmt;

/// The exit status of a kind of failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Exit {
    /// Any other failure: 1.
    Failure = 1,
    /// A bad command line or argument (clap's own errors too): 2.
    Usage = 2,
    /// No curator answered: nothing listens, a timeout, Unavailable: 3.
    Unavailable = 3,
    /// The credential is not allowed to do this (PermissionDenied,
    /// Unauthenticated): 4.
    Denied = 4,
    /// What was named does not exist (NotFound): 5.
    NotFound = 5,
}

/// The exit statuses, for `--help` (the table of docs/cli.md).
pub const EXIT_HELP: &str = "Exit status: 0 success, 1 any other failure, 2 a usage error (a bad \
     flag, value or file argument, named), 3 no curator answered (not running, unreachable, not \
     speaking TLS, --timeout, Unavailable), 4 permission denied (a credential refused, or one \
     of another cluster), 5 not found.";

/// A failure of one kind.
#[derive(Debug)]
pub struct Failed {
    /// The kind, and so the exit status.
    pub exit: Exit,
    /// What to print after `metroctl: `.
    pub message: String,
}

impl fmt::Display for Failed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Failed {}

/// A failure of kind `exit`.
pub fn failed(exit: Exit, message: impl Into<String>) -> super::CliError {
    Box::new(Failed {
        exit,
        message: message.into(),
    })
}

/// A usage error: a bad argument, named in `message`.
pub fn usage(message: impl Into<String>) -> super::CliError {
    failed(Exit::Usage, message)
}

/// The failure a gRPC status is, by its code.
pub fn status_error(s: tonic::Status) -> super::CliError {
    use tonic::Code;
    let exit = match s.code() {
        Code::Unavailable | Code::DeadlineExceeded => Exit::Unavailable,
        Code::PermissionDenied | Code::Unauthenticated => Exit::Denied,
        Code::NotFound => Exit::NotFound,
        Code::InvalidArgument => Exit::Usage,
        _ => Exit::Failure,
    };
    // A status made on this side from a library's error (the connection
    // broke) carries that error as its source, and its message may be a
    // dump of it: the innermost cause says it for people.
    let message = match std::error::Error::source(&s) {
        Some(_) => metropolis_core::cause::describe(&s),
        None => s.message().to_owned(),
    };
    failed(exit, format!("{:?}: {message}", s.code()))
}

/// What a failed connection to `endpoint` was: a credential of another
/// cluster (its CA does not sign the server's certificate, or the server
/// refuses the client's) is [`Exit::Denied`], a port that does not speak
/// TLS and anything else [`Exit::Unavailable`]; with a message that says
/// what to do. `error` is the connection's error (its sources are looked
/// at for a TLS error) and `text` its message.
pub fn connect_problem(
    endpoint: &str,
    error: Option<&(dyn std::error::Error + 'static)>,
    text: &str,
) -> (Exit, String) {
    let tls = error.and_then(tls_error);
    let not_tls = matches!(tls, Some(rustls::Error::InvalidMessage(_)))
        || text.contains("InvalidContentType")
        || text.contains("corrupt message");
    let bad_certificate = matches!(tls, Some(rustls::Error::InvalidCertificate(_)))
        || text.contains("invalid peer certificate");
    let refused = matches!(
        tls,
        Some(rustls::Error::AlertReceived(
            rustls::AlertDescription::BadCertificate
                | rustls::AlertDescription::UnknownCA
                | rustls::AlertDescription::CertificateUnknown
                | rustls::AlertDescription::AccessDenied
        ))
    );
    if not_tls {
        let why = format!(
            "{endpoint} does not speak TLS: is it the debug port (--debug-endpoint) or another \
             service? Give --endpoints the curator's TLS port, metropolisd --listen (7835 by \
             default) ({text})"
        );
        return (Exit::Unavailable, why);
    }
    if bad_certificate {
        let why = format!(
            "{endpoint}: the server's certificate is not signed by the CA of the credential \
             (ca.pem of --credentials): the credential is of another cluster, or {endpoint} is \
             another cluster's curator ({text})"
        );
        return (Exit::Denied, why);
    }
    if refused {
        let why = format!(
            "{endpoint} refused the credential (--credentials): it is not of this cluster \
             ({text})"
        );
        return (Exit::Denied, why);
    }
    (Exit::Unavailable, format!("{endpoint}: {text}"))
}

/// The TLS error in `error`'s chain of sources, if any.
fn tls_error<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    let mut next = Some(error);
    while let Some(e) = next {
        if let Some(tls) = e.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        if let Some(inner) = e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        {
            return Some(inner);
        }
        next = e.source();
    }
    None
}

/// The exit status of `error`: its kind if it is a [`Failed`], else 1.
pub fn exit_of(error: &(dyn std::error::Error + 'static)) -> Exit {
    error
        .downcast_ref::<Failed>()
        .map_or(Exit::Failure, |f| f.exit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_map_to_their_kinds() {
        let cases = [
            (tonic::Code::Unavailable, Exit::Unavailable),
            (tonic::Code::PermissionDenied, Exit::Denied),
            (tonic::Code::Unauthenticated, Exit::Denied),
            (tonic::Code::NotFound, Exit::NotFound),
            (tonic::Code::InvalidArgument, Exit::Usage),
            (tonic::Code::FailedPrecondition, Exit::Failure),
        ];
        for (code, exit) in cases {
            let e = status_error(tonic::Status::new(code, "why"));
            assert_eq!(exit_of(e.as_ref()), exit, "{code:?}");
            assert!(e.to_string().ends_with(": why"));
        }
        let plain: super::super::CliError = "plain".into();
        assert_eq!(exit_of(plain.as_ref()), Exit::Failure);
    }

    #[test]
    fn tls_failures_are_told_by_their_kind() {
        let io = |e: rustls::Error| std::io::Error::new(std::io::ErrorKind::InvalidData, e);
        let foreign = io(rustls::Error::InvalidCertificate(
            rustls::CertificateError::BadSignature,
        ));
        let (exit, why) = connect_problem("h:1", Some(&foreign), &foreign.to_string());
        assert_eq!(exit, Exit::Denied, "{why}");
        assert!(why.contains("another cluster"), "{why}");
        let plain = io(rustls::Error::InvalidMessage(
            rustls::InvalidMessage::InvalidContentType,
        ));
        let (exit, why) = connect_problem("h:1", Some(&plain), &plain.to_string());
        assert_eq!(exit, Exit::Unavailable, "{why}");
        assert!(why.contains("does not speak TLS"), "{why}");
        let (exit, _) = connect_problem("h:1", None, "invalid peer certificate: UnknownIssuer");
        assert_eq!(exit, Exit::Denied);
        let (exit, _) = connect_problem("h:1", None, "Connection refused (os error 111)");
        assert_eq!(exit, Exit::Unavailable);
    }

    #[test]
    fn a_local_library_error_is_told_by_its_cause() {
        #[derive(Debug)]
        struct Dumped(std::io::Error);
        impl std::fmt::Display for Dumped {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "Dumped({:?})", self.0)
            }
        }
        impl std::error::Error for Dumped {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let io = std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "peer closed connection");
        let status = tonic::Status::from_error(Box::new(Dumped(io)));
        let e = status_error(status).to_string();
        assert!(e.ends_with(": peer closed connection"), "{e}");
        assert!(!e.contains("Custom"), "{e}");
    }
}
