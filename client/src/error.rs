//! Why a client could not be made, why a call failed, why a view ended:
//! typed, with messages for people (what failed, where, what to do).
//! Library errors are rendered with their `Display` and their sources,
//! never as `Debug` dumps; a gRPC status as its code's name and message.

use std::fmt;
use std::time::Duration;

use crate::misconfiguration::Misconfiguration;

/// Why [`Client::new`](crate::Client::new) refused a configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClientError {
    /// `endpoints` was empty.
    NoEndpoints,
    /// An endpoint is neither `host:port` nor `unix:PATH`.
    BadEndpoint {
        /// The endpoint as given.
        endpoint: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A TCP endpoint was given without a TLS configuration (curators
    /// serve gRPC over mutual TLS only).
    NoTls {
        /// The endpoint.
        endpoint: String,
    },
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientError::NoEndpoints => {
                f.write_str("no endpoints: give at least one curator as host:port or unix:PATH")
            }
            ClientError::BadEndpoint { endpoint, reason } => write!(
                f,
                "endpoint {endpoint:?}: {reason} (expected host:port or unix:PATH)"
            ),
            ClientError::NoTls { endpoint } => write!(
                f,
                "endpoint {endpoint} is reached over TCP, which needs a TLS configuration \
                 (ClientConfig::tls, e.g. from metropolis_pki::client_config)"
            ),
        }
    }
}

impl std::error::Error for ClientError {}

/// Why one attempt of a call (or one opening of a watch) failed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum AttemptError {
    /// No connection could be made to the endpoint (refused, unreachable,
    /// TLS handshake failed): the request was not sent.
    Connect {
        /// The endpoint.
        endpoint: String,
        /// Why, as the connector said.
        reason: String,
    },
    /// The connection broke (or was found broken) during the call.
    Broken {
        /// The endpoint.
        endpoint: String,
        /// Why, as the HTTP/2 layer said.
        reason: String,
        /// Whether the request may have reached the server (false: it
        /// certainly did not).
        sent: bool,
    },
    /// The attempt took longer than its share of the deadline (the
    /// client's `call_timeout`, or the time left).
    TimedOut {
        /// The endpoint.
        endpoint: String,
        /// How long it was given.
        after: Duration,
    },
    /// The server answered with a gRPC status.
    Status {
        /// The endpoint.
        endpoint: String,
        /// The status code.
        code: tonic::Code,
        /// The status message.
        message: String,
    },
    /// The connection showed a configuration no retry can fix (a server
    /// certificate that never verifies, a port that does not speak TLS):
    /// the request was not served.
    Misconfigured {
        /// The endpoint.
        endpoint: String,
        /// What is wrong.
        problem: Misconfiguration,
        /// What the TLS (or HTTP/2) layer said.
        reason: String,
    },
}

impl AttemptError {
    /// The endpoint the attempt went to.
    pub fn endpoint(&self) -> &str {
        match self {
            AttemptError::Connect { endpoint, .. }
            | AttemptError::Broken { endpoint, .. }
            | AttemptError::TimedOut { endpoint, .. }
            | AttemptError::Status { endpoint, .. }
            | AttemptError::Misconfigured { endpoint, .. } => endpoint,
        }
    }

    /// The gRPC code this failure counts as: the server's, else
    /// Unavailable (a connection failure, as gRPC clients report it) or
    /// DeadlineExceeded (a timeout); a misconfiguration's
    /// ([`Misconfiguration::code`]).
    pub fn code(&self) -> tonic::Code {
        match self {
            AttemptError::Status { code, .. } => *code,
            AttemptError::Misconfigured { problem, .. } => problem.code(),
            AttemptError::TimedOut { .. } => tonic::Code::DeadlineExceeded,
            AttemptError::Connect { .. } | AttemptError::Broken { .. } => tonic::Code::Unavailable,
        }
    }
}

impl fmt::Display for AttemptError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AttemptError::Connect { endpoint, reason } => write!(f, "{endpoint}: {reason}"),
            AttemptError::Broken {
                endpoint,
                reason,
                sent,
            } => {
                let when = if *sent {
                    "during the call"
                } else {
                    "before the request was sent"
                };
                write!(f, "{endpoint}: connection broken {when}: {reason}")
            }
            AttemptError::TimedOut { endpoint, after } => write!(
                f,
                "{endpoint}: no answer within {:.1} s",
                after.as_secs_f64()
            ),
            AttemptError::Status {
                endpoint,
                code,
                message,
            } => write!(f, "{endpoint}: {}: {message}", code_name(*code)),
            AttemptError::Misconfigured {
                endpoint,
                problem,
                reason,
            } => misconfigured(f, endpoint, *problem, reason),
        }
    }
}

impl std::error::Error for AttemptError {}

/// How a misconfiguration reads: where, what to change, what the library
/// said.
fn misconfigured(
    f: &mut fmt::Formatter<'_>,
    endpoint: &str,
    problem: Misconfiguration,
    reason: &str,
) -> fmt::Result {
    write!(f, "{endpoint}: {problem} ({reason})")
}

/// Why a unary call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CallError {
    /// A curator refused the call with a status that retrying cannot
    /// change (InvalidArgument, PermissionDenied, Unauthenticated, ...).
    Rejected {
        /// The endpoint that answered.
        endpoint: String,
        /// The status code.
        code: tonic::Code,
        /// The status message.
        message: String,
    },
    /// An attempt of a call that must not be sent twice failed after its
    /// request may have reached a curator (it timed out, or its
    /// connection broke once the request was sent): it may have been
    /// applied, or may be yet (a curator that was paused holds it until
    /// it runs again). Not retried: a late copy of this request could
    /// land after a later call's.
    OutcomeUnknown {
        /// What became of the attempt.
        attempt: AttemptError,
    },
    /// Every endpoint showed a configuration no retry can fix (see
    /// [`Misconfiguration`]): the call ended at once instead of being
    /// retried until its deadline. The last endpoint tried is named.
    Misconfigured {
        /// The endpoint.
        endpoint: String,
        /// What is wrong.
        problem: Misconfiguration,
        /// What the TLS (or HTTP/2) layer said.
        reason: String,
    },
    /// No attempt succeeded within the deadline; every failure was one
    /// worth retrying. `last` is the last of them.
    DeadlineExceeded {
        /// The caller's deadline.
        deadline: Duration,
        /// How many attempts were made.
        attempts: u32,
        /// The last attempt's failure, if one was made.
        last: Option<AttemptError>,
    },
}

impl CallError {
    /// The gRPC code the failure counts as: a rejection's own code; for an
    /// exhausted deadline, the last attempt's (Unavailable when it could
    /// not connect), DeadlineExceeded when no attempt was made.
    pub fn code(&self) -> tonic::Code {
        match self {
            CallError::Rejected { code, .. } => *code,
            CallError::Misconfigured { problem, .. } => problem.code(),
            CallError::OutcomeUnknown { attempt } => attempt.code(),
            CallError::DeadlineExceeded {
                last: Some(last), ..
            } => last.code(),
            CallError::DeadlineExceeded { last: None, .. } => tonic::Code::DeadlineExceeded,
        }
    }
}

impl fmt::Display for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CallError::Rejected {
                endpoint,
                code,
                message,
            } => write!(f, "{endpoint}: {}: {message}", code_name(*code)),
            CallError::Misconfigured {
                endpoint,
                problem,
                reason,
            } => misconfigured(f, endpoint, *problem, reason),
            CallError::OutcomeUnknown { attempt } => write!(
                f,
                "{attempt}; the call may or may not have been applied (not retried: a late \
                 copy could land after a later call)"
            ),
            CallError::DeadlineExceeded {
                deadline,
                attempts,
                last,
            } => {
                write!(
                    f,
                    "no curator served the call within {:.1} s ({attempts} attempt(s))",
                    deadline.as_secs_f64()
                )?;
                match last {
                    Some(last) => write!(f, "; last: {last}"),
                    None => Ok(()),
                }
            }
        }
    }
}

impl std::error::Error for CallError {}

/// Why a [`NodeView`](crate::NodeView) ended. A view ends only for a
/// reason reconnecting cannot fix; every other failure makes it reconnect.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ViewError {
    /// A curator refused the watch (PermissionDenied, Unauthenticated,
    /// InvalidArgument, Unimplemented, ...): the credential or the request
    /// must change.
    Rejected {
        /// The endpoint that answered.
        endpoint: String,
        /// The status code.
        code: tonic::Code,
        /// The status message.
        message: String,
    },
}

impl ViewError {
    /// The status code of the refusal.
    pub fn code(&self) -> tonic::Code {
        match self {
            ViewError::Rejected { code, .. } => *code,
        }
    }
}

impl fmt::Display for ViewError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ViewError::Rejected {
                endpoint,
                code,
                message,
            } => write!(f, "{endpoint}: {}: {message}", code_name(*code)),
        }
    }
}

impl std::error::Error for ViewError {}

/// The name of a gRPC code as the gRPC documentation spells it
/// (`Unavailable`, `PermissionDenied`).
pub fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code;
    match code {
        Code::Ok => "Ok",
        Code::Cancelled => "Cancelled",
        Code::Unknown => "Unknown",
        Code::InvalidArgument => "InvalidArgument",
        Code::DeadlineExceeded => "DeadlineExceeded",
        Code::NotFound => "NotFound",
        Code::AlreadyExists => "AlreadyExists",
        Code::PermissionDenied => "PermissionDenied",
        Code::ResourceExhausted => "ResourceExhausted",
        Code::FailedPrecondition => "FailedPrecondition",
        Code::Aborted => "Aborted",
        Code::OutOfRange => "OutOfRange",
        Code::Unimplemented => "Unimplemented",
        Code::Internal => "Internal",
        Code::Unavailable => "Unavailable",
        Code::DataLoss => "DataLoss",
        Code::Unauthenticated => "Unauthenticated",
    }
}

/// `error` and its sources, each by its `Display`, joined with `: `
/// (a source whose text its parent already shows is left out).
pub(crate) fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(s) = source {
        let part = s.to_string();
        if !part.is_empty() && !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = s.source();
    }
    // rustls ends some messages with a link to its manual.
    if let Some(link) = text.find(": https://") {
        text.truncate(link);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_code_and_the_endpoint() {
        let e = CallError::DeadlineExceeded {
            deadline: Duration::from_secs(6),
            attempts: 3,
            last: Some(AttemptError::Status {
                endpoint: "127.0.0.1:1".into(),
                code: tonic::Code::Unavailable,
                message: "no curator leader".into(),
            }),
        };
        assert_eq!(
            e.to_string(),
            "no curator served the call within 6.0 s (3 attempt(s)); \
             last: 127.0.0.1:1: Unavailable: no curator leader"
        );
        assert_eq!(e.code(), tonic::Code::Unavailable);
        let e = AttemptError::Broken {
            endpoint: "unix:/s".into(),
            reason: "connection closed".into(),
            sent: false,
        };
        assert_eq!(
            e.to_string(),
            "unix:/s: connection broken before the request was sent: connection closed"
        );
        assert_eq!(e.code(), tonic::Code::Unavailable);
    }

    #[test]
    fn misconfigurations_say_what_to_change_and_what_tls_said() {
        let e = CallError::Misconfigured {
            endpoint: "10.0.0.1:7836".into(),
            problem: Misconfiguration::UntrustedServer,
            reason: "invalid peer certificate: BadSignature".into(),
        };
        let text = e.to_string();
        assert!(
            text.starts_with("10.0.0.1:7836: the server's certificate is not signed by the CA")
                && text.ends_with("(invalid peer certificate: BadSignature)"),
            "{text}"
        );
        assert_eq!(e.code(), tonic::Code::Unauthenticated);
        let e = AttemptError::Misconfigured {
            endpoint: "h:7837".into(),
            problem: Misconfiguration::NotTls,
            reason: "received corrupt message of type InvalidContentType".into(),
        };
        assert!(e.to_string().contains("--debug-listen"), "{e}");
        assert_eq!(e.code(), tonic::Code::Unavailable);
    }

    #[test]
    fn chains_skip_repeated_sources() {
        let inner = std::io::Error::other("reset by peer");
        let outer = std::io::Error::other(inner);
        assert_eq!(chain(&outer), "reset by peer");
        let tls = std::io::Error::other(
            "peer closed connection without sending TLS close_notify: https://docs.rs/rustls/x",
        );
        assert_eq!(
            chain(&tls),
            "peer closed connection without sending TLS close_notify"
        );
    }
}
