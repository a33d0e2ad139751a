//! Curator and NodeManagement: the statuses of their machines' errors
//! (node IDs, status updates, stored node records, node certificates).
//!
//! | error | code | why |
//! | --- | --- | --- |
//! | [`NodeIdError`] | InvalidArgument | a field of the request names no node |
//! | [`StatusError`] | InvalidArgument | the submitted status breaks a rule the caller can fix |
//! | [`RecordError`] | Internal | the store holds a node record this build cannot read: no request can fix it |
//! | [`CertIssueError`] | Internal | the request was valid; the cluster CA failed |

use metropolis_core::curator::{RecordError, StatusError};
use metropolis_core::identity::NodeIdError;
use metropolis_core::ports::CertIssueError;
use tonic::Status;

/// A node ID in the request's `field` (`node_id`,
/// `node_in_cluster.node_id`) that is not one: InvalidArgument naming the
/// field.
pub fn node_id(field: &str, e: &NodeIdError) -> Status {
    Status::invalid_argument(format!("{field}: {e}"))
}

/// An `UpdateNodeStatus` whose status `validate_status` refused:
/// InvalidArgument (the message names the field and the rule).
pub fn status_update(e: &StatusError) -> Status {
    Status::invalid_argument(e.to_string())
}

/// A stored node record this build cannot read: Internal.
pub fn node_record(e: &RecordError) -> Status {
    Status::internal(e.to_string())
}

/// A node certificate the cluster CA did not issue: Internal (the
/// request was valid; the CA failed).
pub fn cert_issue(e: &CertIssueError) -> Status {
    match e {
        CertIssueError::Signing(why) => Status::internal(why.clone()),
        e => Status::internal(e.to_string()),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use metropolis_core::identity::NodeId;
    use tonic::Code;

    #[test]
    fn a_malformed_node_id_is_invalid_argument_naming_the_field() {
        let e = NodeId::parse("metropolis-xyz").unwrap_err();
        let status = node_id("node_in_cluster.node_id", &e);
        assert_eq!(status.code(), Code::InvalidArgument);
        assert_eq!(status.message(), format!("node_in_cluster.node_id: {e}"));
    }

    #[test]
    fn a_refused_status_is_invalid_argument_and_an_unreadable_record_internal() {
        let status = status_update(&StatusError::Missing);
        assert_eq!(status.code(), Code::InvalidArgument);
        assert_eq!(status.message(), "status: must be set");
        let e = RecordError::UnknownSchema {
            key: "/nodes/metropolis-00".into(),
            version: 9,
        };
        let status = node_record(&e);
        assert_eq!(status.code(), Code::Internal);
        assert_eq!(status.message(), e.to_string());
    }

    #[test]
    fn a_failed_issue_is_internal_with_the_issuers_reason() {
        let status = cert_issue(&CertIssueError::Signing("no key".into()));
        assert_eq!(status.code(), Code::Internal);
        assert_eq!(status.message(), "no key");
    }
}
