//! Why a registry request failed.

use std::fmt;
use std::io;

use serde::Deserialize;

use crate::deadline::DeadlinePassed;
use crate::http::{HttpError, MAX_REDIRECTS, Response, bounded};

/// Why a request to a registry (or its token server) failed. Every
/// variant names what it is about (the registry, the URL) and the
/// problem; what a server sent is quoted only as a bounded prefix.
#[derive(Debug)]
#[non_exhaustive]
pub enum RegistryError {
    /// An `https` URL, and the client has no TLS configuration to trust
    /// it with.
    NoTls {
        /// The URL.
        url: String,
    },
    /// No connection could be made to the registry (or to the host a
    /// redirect pointed to).
    Unreachable {
        /// The registry, as `host[:port]`.
        registry: String,
        /// The connection error.
        source: io::Error,
    },
    /// An `https` registry answered the TLS handshake in plain HTTP: it
    /// speaks `http`.
    PlainHttp {
        /// The registry, as `host[:port]`.
        registry: String,
    },
    /// The TLS handshake with the registry failed.
    Tls {
        /// The registry, as `host[:port]`.
        registry: String,
        /// The handshake error.
        source: io::Error,
    },
    /// Sending a request or receiving a response failed, including a
    /// response that ended early or timed out.
    Transfer {
        /// The URL being fetched.
        url: String,
        /// The error.
        source: io::Error,
    },
    /// The registry's response is not valid HTTP/1.1 as understood here,
    /// or a redirect cannot be followed.
    Protocol {
        /// The URL being fetched.
        url: String,
        /// What is wrong.
        problem: String,
    },
    /// The registry answered with an unexpected status.
    Status {
        /// The URL that answered.
        url: String,
        /// The status code.
        status: u16,
        /// The reason phrase.
        reason: String,
        /// The registry's error codes and messages, when its body carried
        /// an OCI error document.
        detail: Option<String>,
    },
    /// The registry asks for a login the client cannot give, or refused
    /// the one it gave (`401`, answered as `auth.rs` says).
    Unauthorized {
        /// The registry, as `host[:port]`.
        registry: String,
        /// What went wrong, e.g. no login for the registry in the
        /// credentials file.
        problem: String,
    },
}

impl RegistryError {
    /// The error for an unexpected status, with the registry's error
    /// codes when its body is an OCI error document (the first few, each
    /// code and message cut, as is the reason phrase: the registry wrote
    /// them).
    pub fn status(mut response: Response) -> RegistryError {
        let detail = response
            .read_body(64 * 1024)
            .ok()
            .flatten()
            .and_then(|body| serde_json::from_slice::<ErrorDocument>(&body).ok())
            .map(|document| {
                document
                    .errors
                    .iter()
                    .map(|e| match (&e.code, &e.message) {
                        (Some(code), Some(message)) => {
                            format!("{}: {}", bounded(code), bounded(message))
                        }
                        (Some(text), None) | (None, Some(text)) => bounded(text),
                        (None, None) => "unspecified error".to_string(),
                    })
                    .take(MAX_ERRORS_LISTED)
                    .collect::<Vec<_>>()
                    .join("; ")
            })
            .filter(|detail| !detail.is_empty());
        RegistryError::Status {
            url: response.url.to_string(),
            status: response.status,
            reason: bounded(&response.reason),
            detail,
        }
    }

    /// Whether the same request may succeed when made again: the
    /// connection could not be made or broke.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            RegistryError::Unreachable { .. } | RegistryError::Transfer { .. }
        )
    }

    /// Whether the same request may succeed when made again: the
    /// connection could not be made or broke, or the registry answered
    /// with a status for a passing condition (429, 503, ...).
    pub fn is_retryable(&self) -> bool {
        match self {
            RegistryError::Status { status, .. } => crate::retry::retryable_status(*status),
            e => e.is_transient(),
        }
    }
}

/// How many entries of a registry's error document an error quotes.
const MAX_ERRORS_LISTED: usize = 4;

/// The error document of the OCI distribution API.
#[derive(Deserialize)]
struct ErrorDocument {
    errors: Vec<ErrorEntry>,
}

#[derive(Deserialize)]
struct ErrorEntry {
    code: Option<String>,
    message: Option<String>,
}

impl From<HttpError> for RegistryError {
    fn from(e: HttpError) -> RegistryError {
        match e {
            HttpError::Connect { authority, source } => RegistryError::Unreachable {
                registry: authority,
                source,
            },
            HttpError::Tls { authority, source } => RegistryError::Tls {
                registry: authority,
                source,
            },
            HttpError::PlainHttp { authority } => RegistryError::PlainHttp {
                registry: authority,
            },
            HttpError::TlsUnavailable { url } => RegistryError::NoTls { url },
            HttpError::Io { url, source } => RegistryError::Transfer { url, source },
            HttpError::Protocol { url, problem } => RegistryError::Protocol { url, problem },
            HttpError::TooManyRedirects { url } => RegistryError::Protocol {
                url,
                problem: format!("more than {MAX_REDIRECTS} redirects"),
            },
        }
    }
}

/// An I/O error as a short reason: a deadline that passed says which
/// and how long it was, network conditions by name ("connection
/// refused", "timed out"), anything else as the operating system says it.
pub fn reason(e: &io::Error) -> String {
    if let Some(passed) = e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<DeadlinePassed>())
    {
        return passed.to_string();
    }
    match e.kind() {
        io::ErrorKind::ConnectionRefused => "connection refused".to_string(),
        io::ErrorKind::ConnectionReset => "connection reset".to_string(),
        io::ErrorKind::ConnectionAborted => "connection aborted".to_string(),
        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => "timed out".to_string(),
        _ => e.to_string(),
    }
}

impl fmt::Display for RegistryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use RegistryError::*;
        match self {
            NoTls { url } => write!(f, "unsupported: {url}: https without a TLS configuration"),
            Unreachable { registry, source } => {
                write!(f, "registry {registry} unreachable: {}", reason(source))
            }
            PlainHttp { registry } => write!(
                f,
                "registry {registry} answered the TLS handshake in plain HTTP: this registry \
                 speaks plain HTTP, not https"
            ),
            Tls { registry, source } => {
                write!(f, "TLS handshake with registry {registry} failed: {source}")
            }
            Transfer { url, source } => write!(f, "{url}: transfer failed: {}", reason(source)),
            Protocol { url, problem } => write!(f, "bad response from {url}: {problem}"),
            Status {
                url,
                status,
                reason,
                detail,
            } => {
                write!(f, "{url}: the registry answered {status}")?;
                if !reason.is_empty() {
                    write!(f, " {reason}")?;
                }
                if let Some(detail) = detail {
                    write!(f, " ({detail})")?;
                }
                Ok(())
            }
            Unauthorized { registry, problem } => {
                write!(f, "registry {registry} refused access: {problem}")
            }
        }
    }
}

impl std::error::Error for RegistryError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RegistryError::Unreachable { source, .. }
            | RegistryError::Tls { source, .. }
            | RegistryError::Transfer { source, .. } => Some(source),
            _ => None,
        }
    }
}
