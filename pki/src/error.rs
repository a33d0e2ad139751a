//! The error type of the PKI.

use std::fmt;
use std::io;
use std::path::PathBuf;

/// What went wrong in the PKI: a file, a certificate or key, a name, or the
/// TLS configuration. Every message names what it is about (a file path,
/// or which input) and what is wrong with it.
#[derive(Debug)]
#[non_exhaustive]
pub enum PkiError {
    /// Reading or writing a file failed.
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What was being done, e.g. `read`, `write`.
        action: &'static str,
        /// The operating system's error.
        source: io::Error,
    },
    /// A certificate, key or name is unusable: missing, garbled, or not
    /// what the cluster PKI issues.
    Invalid {
        /// Where it came from: a file path, or a label such as
        /// `certificate PEM` for in-memory input.
        origin: String,
        /// What is wrong with it.
        problem: String,
    },
    /// An extra subject alternative name is neither an IP address nor a DNS
    /// name.
    InvalidSan {
        /// The rejected name.
        san: String,
        /// Why it is not a DNS name.
        problem: String,
    },
    /// Generating a key or signing a certificate failed.
    Crypto {
        /// What was being done.
        action: &'static str,
        /// The certificate library's error.
        source: rcgen::Error,
    },
    /// rustls refused the TLS configuration.
    Tls {
        /// Which part of the configuration.
        action: &'static str,
        /// rustls's reason.
        problem: String,
    },
}

impl PkiError {
    pub(crate) fn invalid(origin: impl fmt::Display, problem: impl Into<String>) -> PkiError {
        PkiError::Invalid {
            origin: origin.to_string(),
            problem: problem.into(),
        }
    }

    pub(crate) fn io(
        path: impl Into<PathBuf>,
        action: &'static str,
    ) -> impl FnOnce(io::Error) -> PkiError {
        let path = path.into();
        move |source| PkiError::Io {
            path,
            action,
            source,
        }
    }

    pub(crate) fn crypto(action: &'static str) -> impl FnOnce(rcgen::Error) -> PkiError {
        move |source| PkiError::Crypto { action, source }
    }

    pub(crate) fn tls<E: fmt::Display>(action: &'static str) -> impl FnOnce(E) -> PkiError {
        move |e| PkiError::Tls {
            action,
            problem: e.to_string(),
        }
    }
}

impl fmt::Display for PkiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PkiError::Io {
                path,
                action,
                source,
            } => write!(f, "{}: cannot {action}: {source}", path.display()),
            PkiError::Invalid { origin, problem } => write!(f, "{origin}: {problem}"),
            PkiError::InvalidSan { san, problem } => write!(
                f,
                "extra subject alternative name {san:?} is neither an IP address nor a DNS name: {problem}"
            ),
            PkiError::Crypto { action, source } => write!(f, "cannot {action}: {source}"),
            PkiError::Tls { action, problem } => write!(f, "cannot build the {action}: {problem}"),
        }
    }
}

impl std::error::Error for PkiError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            PkiError::Io { source, .. } => Some(source),
            PkiError::Crypto { source, .. } => Some(source),
            PkiError::Invalid { .. } | PkiError::InvalidSan { .. } | PkiError::Tls { .. } => None,
        }
    }
}
