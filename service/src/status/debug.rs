//! `NodeDebugService`: the statuses of its machines' errors (trace
//! sessions, log queries, image imports, kubeconfigs).

use metropolis_archive::ArchiveError;
use metropolis_core::logtree::QueryError;
use metropolis_core::ports::KubeconfigError;
use metropolis_core::trace::{StepFailure, TraceError};
use tonic::{Code, Status};

use crate::images::ImageStoreError;

/// The code of a trace session that did not start or ended on an error:
///
/// | error | code | why |
/// | --- | --- | --- |
/// | `Invalid`, `TracerRefused`, `FilterRefused` | InvalidArgument | the request (or the tracer or pattern it names) is what is wrong |
/// | `AlreadyInProgress` | FailedPrecondition | the buffer is in use; retrying immediately will not help |
/// | `TracefsMissing` | FailedPrecondition | an operator must mount tracefs |
/// | `NotPermitted` | FailedPrecondition | read-only tracefs, no permission or lockdown: the node's configuration, not the caller's identity (so not PermissionDenied) |
/// | `FileMissing`, `InstanceExists`, `Busy` | FailedPrecondition | the kernel lacks the feature, or tracefs holds what is in the way |
/// | `Io`, `PipeFailed` | Unavailable | tracefs failing, possibly transiently |
pub fn trace_code(e: &TraceError) -> Code {
    match e {
        TraceError::Invalid(_)
        | TraceError::TracerRefused { .. }
        | TraceError::FilterRefused { .. } => Code::InvalidArgument,
        TraceError::AlreadyInProgress { .. }
        | TraceError::TracefsMissing { .. }
        | TraceError::NotPermitted { .. }
        | TraceError::FileMissing { .. }
        | TraceError::InstanceExists { .. }
        | TraceError::Busy { .. } => Code::FailedPrecondition,
        TraceError::Io { .. } | TraceError::PipeFailed { .. } => Code::Unavailable,
        // A failure added later is the host's, like the two above.
        _ => Code::Unavailable,
    }
}

/// A trace error's status: [`trace_code`] and its message.
pub fn trace(e: &TraceError) -> Status {
    Status::new(trace_code(e), e.to_string())
}

/// The status ending a trace stream after `e`, naming the steps of the
/// teardown that failed too (tracefs may not be as it was).
pub fn trace_ended(e: &TraceError, teardown: &[StepFailure]) -> Status {
    if teardown.is_empty() {
        return trace(e);
    }
    let list: Vec<String> = teardown.iter().map(ToString::to_string).collect();
    Status::new(
        trace_code(e),
        format!("{e}; restoring tracefs also failed: {}", list.join("; ")),
    )
}

/// A log query refused: every [`QueryError`] is a field of the request
/// the caller can fix, InvalidArgument.
pub fn log_query(e: &QueryError) -> Status {
    Status::invalid_argument(e.to_string())
}

/// The code of a rejected archive: ResourceExhausted for a limit passed
/// (the archive's size, its number of members, one JSON document or all
/// of them together), InvalidArgument for anything else (a malformed or
/// inconsistent archive, and any kind of error the validator adds later).
pub fn archive_code(e: &ArchiveError) -> Code {
    match e {
        ArchiveError::ArchiveTooLarge { .. }
        | ArchiveError::TooManyMembers { .. }
        | ArchiveError::JsonTooLarge { .. }
        | ArchiveError::MetadataTooLarge { .. } => Code::ResourceExhausted,
        _ => Code::InvalidArgument,
    }
}

/// A rejected archive's status: [`archive_code`] and the validator's
/// reason.
pub fn archive(e: &ArchiveError) -> Status {
    Status::new(archive_code(e), e.to_string())
}

/// The code of an image store's refusal: AlreadyExists for a name taken
/// (and tags not replaced), Unavailable for a store that cannot take the
/// import now, InvalidArgument for an archive the store cannot hold.
pub fn image_store_code(e: &ImageStoreError) -> Code {
    match e {
        ImageStoreError::AlreadyExists(_) => Code::AlreadyExists,
        ImageStoreError::Unavailable(_) => Code::Unavailable,
        ImageStoreError::Invalid(_) => Code::InvalidArgument,
    }
}

/// An image store's refusal: [`image_store_code`] and its message.
pub fn image_store(e: &ImageStoreError) -> Status {
    Status::new(image_store_code(e), e.to_string())
}

/// A kubeconfig the issuer did not issue: FailedPrecondition on a node
/// without Kubernetes credentials, InvalidArgument for a request it
/// refuses, Internal for its own failure.
pub fn kubeconfig(e: KubeconfigError) -> Status {
    match e {
        KubeconfigError::NotConfigured(m) => Status::failed_precondition(m),
        KubeconfigError::Invalid(m) => Status::invalid_argument(m),
        KubeconfigError::Failed(m) => {
            Status::internal(format!("issuing the kubeconfig failed: {m}"))
        }
        e => Status::internal(format!("issuing the kubeconfig failed: {e}")),
    }
}
