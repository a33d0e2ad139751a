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

/// A trace that found its buffer taken (and, with `waited`, still taken
/// after waiting that long for it): FailedPrecondition, since retrying at
/// once will not help. With `shared_buffer` (the node gives sessions no
/// instances of their own), the message says how to run several at once.
pub fn trace_in_progress(
    e: &TraceError,
    waited: Option<std::time::Duration>,
    shared_buffer: bool,
) -> Status {
    let hint = if shared_buffer {
        "; sessions share the global trace buffer, one at a time: start the \
         node with --trace-instances to run several at once"
    } else {
        ""
    };
    Status::failed_precondition(match waited {
        Some(bound) => format!("{e} (waited {bound:?} for it to end){hint}"),
        None => format!("{e}{hint}"),
    })
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

/// The status a failed `LoadImage` ends with: the driver's, except that
/// an image whose name is taken says which node flag lets a second load
/// replace it.
pub fn image_load(status: Status) -> Status {
    match status.code() {
        Code::AlreadyExists => Status::already_exists(format!(
            "{}; start the node with --image-replace-tags to replace it",
            status.message()
        )),
        _ => status,
    }
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use metropolis_core::trace::Target;

    use super::*;

    #[test]
    fn a_taken_buffer_is_a_failed_precondition_with_its_wait_and_hint() {
        let e = TraceError::AlreadyInProgress {
            target: Target::Global,
        };
        let shared = trace_in_progress(&e, Some(Duration::from_secs(2)), true);
        assert_eq!(shared.code(), Code::FailedPrecondition);
        assert_eq!(
            shared.message(),
            format!(
                "{e} (waited 2s for it to end); sessions share the global trace buffer, one \
                 at a time: start the node with --trace-instances to run several at once"
            )
        );
        let own = trace_in_progress(&e, None, false);
        assert_eq!(own.message(), e.to_string());
        assert_eq!(trace_code(&e), Code::FailedPrecondition);
    }

    #[test]
    fn a_taken_image_name_names_the_flag_and_other_failures_pass_through() {
        let taken = image_load(image_store(&ImageStoreError::AlreadyExists("a:1".into())));
        assert_eq!(taken.code(), Code::AlreadyExists);
        assert!(
            taken
                .message()
                .ends_with("; start the node with --image-replace-tags to replace it"),
            "{}",
            taken.message()
        );
        let other = image_load(Status::unavailable("disk full"));
        assert_eq!(
            (other.code(), other.message()),
            (Code::Unavailable, "disk full")
        );
    }

    #[test]
    fn kubeconfig_refusals_keep_their_codes() {
        let cases = [
            (
                KubeconfigError::NotConfigured("x".into()),
                Code::FailedPrecondition,
            ),
            (KubeconfigError::Invalid("x".into()), Code::InvalidArgument),
            (KubeconfigError::Failed("x".into()), Code::Internal),
        ];
        for (e, code) in cases {
            assert_eq!(kubeconfig(e).code(), code);
        }
    }
}
