//! Why a trace session failed.
//!
//! | error | what happened |
//! | --- | --- |
//! | [`TraceError::Invalid`] | the request itself is bad |
//! | [`TraceError::TracerRefused`] | the kernel refused the tracer the client named |
//! | [`TraceError::FilterRefused`] | the kernel refused a pattern (matches no function) |
//! | [`TraceError::AlreadyInProgress`] | the buffer is in use; retrying immediately will not help |
//! | [`TraceError::TracefsMissing`] | tracefs is not mounted: an operator must mount it |
//! | [`TraceError::NotPermitted`] | read-only tracefs, no permission or kernel lockdown: the node's configuration, not the caller's identity |
//! | [`TraceError::FileMissing`] | the kernel lacks the feature (e.g. no `set_graph_function`) |
//! | [`TraceError::InstanceExists`] | a directory of that name is left in tracefs |
//! | [`TraceError::Busy`] | another program reads the buffer's `trace_pipe` |
//! | [`TraceError::Io`] | an unexpected I/O failure, possibly transient |
//! | [`TraceError::PipeFailed`] | reading `trace_pipe` failed mid-stream |
//!
//! Which status each becomes is the service layer's to say
//! (`metropolis_service::status::debug::trace_code`).

use std::fmt;

use super::buffers::Target;
use super::port::TracefsFailure;
use super::validate::{Field, InstanceName, ValidationError};

/// Why a trace session could not start, or ended other than by the
/// caller's cancel (see the module docs for the table).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TraceError {
    /// A request field (or the instance name) failed validation; nothing
    /// was written.
    Invalid(ValidationError),
    /// Another session of this process holds the buffer.
    AlreadyInProgress {
        /// The buffer.
        target: Target,
    },
    /// Writing the tracer to `current_tracer` was refused by the kernel
    /// (not built in, or forbidden, e.g. `function` under lockdown).
    TracerRefused {
        /// The tracer requested.
        tracer: String,
        /// The host's report.
        failure: TracefsFailure,
    },
    /// The kernel refused a filter pattern (typically: it matches no
    /// traceable function).
    FilterRefused {
        /// Which pattern.
        field: Field,
        /// The pattern.
        pattern: String,
        /// The host's report.
        failure: TracefsFailure,
    },
    /// There is no tracefs at the configured root.
    TracefsMissing {
        /// The host's report (names the root).
        failure: TracefsFailure,
    },
    /// A tracefs file could not be opened for writing or a directory not
    /// created: read-only tracefs, no permission, kernel lockdown.
    NotPermitted {
        /// The file, relative to the tracefs root.
        file: String,
        /// The host's report.
        failure: TracefsFailure,
    },
    /// A tracefs file the request needs does not exist: the kernel lacks
    /// the feature.
    FileMissing {
        /// The file, relative to the tracefs root.
        file: String,
        /// The host's report.
        failure: TracefsFailure,
    },
    /// The instance directory exists already (left by a crashed session
    /// or used by another program); it is left alone.
    InstanceExists {
        /// The instance.
        instance: InstanceName,
    },
    /// The kernel reported the buffer busy (another program has its
    /// `trace_pipe` open).
    Busy {
        /// The file, relative to the tracefs root.
        file: String,
        /// The host's report.
        failure: TracefsFailure,
    },
    /// Any other failure of a tracefs operation.
    Io {
        /// The file or directory, relative to the tracefs root.
        file: String,
        /// The host's report.
        failure: TracefsFailure,
    },
    /// Reading `trace_pipe` failed while the session ran.
    PipeFailed {
        /// The host's report.
        failure: TracefsFailure,
    },
}

impl From<ValidationError> for TraceError {
    fn from(e: ValidationError) -> TraceError {
        TraceError::Invalid(e)
    }
}

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TraceError::Invalid(e) => write!(f, "{e}"),
            TraceError::AlreadyInProgress { target } => {
                write!(f, "a trace is already in progress on {target}")
            }
            TraceError::TracerRefused { tracer, failure } => write!(
                f,
                "tracer: the kernel refused tracer {tracer:?} (not available or not permitted \
                 on this kernel; see available_tracers): {failure}"
            ),
            TraceError::FilterRefused {
                field,
                pattern,
                failure,
            } => write!(
                f,
                "{field}: the kernel refused pattern {pattern:?} (does it match a traceable \
                 function?): {failure}"
            ),
            TraceError::TracefsMissing { failure } => write!(
                f,
                "tracefs is not available ({failure}); mount it with \
                 `mount -t tracefs nodev /sys/kernel/tracing` or configure its mount point"
            ),
            TraceError::NotPermitted { file, failure } => write!(
                f,
                "tracefs {file}: not permitted (read-only tracefs, missing privileges or \
                 kernel lockdown): {failure}"
            ),
            TraceError::FileMissing { file, failure } => {
                if file.ends_with("set_graph_function") {
                    write!(
                        f,
                        "graph_function_filter: this kernel has no tracefs {file} (function \
                         graph tracer or dynamic ftrace not built in): {failure}"
                    )
                } else {
                    write!(
                        f,
                        "tracefs {file} does not exist (the kernel lacks the feature): {failure}"
                    )
                }
            }
            TraceError::InstanceExists { instance } => write!(
                f,
                "tracefs instance {instance:?} exists already (left over or used by another \
                 program); it was left untouched"
            ),
            TraceError::Busy { file, failure } => write!(
                f,
                "tracefs {file} is busy (another program is reading this buffer's trace_pipe?): \
                 {failure}"
            ),
            TraceError::Io { file, failure } => write!(f, "tracefs {file}: {failure}"),
            TraceError::PipeFailed { failure } => write!(f, "reading trace_pipe failed: {failure}"),
        }
    }
}

impl std::error::Error for TraceError {}
