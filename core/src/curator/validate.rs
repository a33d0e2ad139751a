//! Validation of `UpdateNodeStatus` payloads.

use core::net::IpAddr;

use metropolis_proto::prelude::common::NodeStatus;
use prost::Message;

/// Largest encoded `NodeStatus` accepted, so that a node record (and thus
/// every Watch event) stays far below the 2 MiB event limit.
pub const MAX_STATUS_BYTES: usize = 16 * 1024;

/// What is wrong with a submitted status. Display names the field and the
/// rule.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StatusError {
    /// `status` was not set.
    Missing,
    /// `status.external_address` is not an IPv4 or IPv6 address.
    BadAddress(String),
    /// The encoded status is larger than
    /// [`MAX_STATUS_BYTES`](crate::curator::MAX_STATUS_BYTES).
    TooLarge(usize),
}

impl std::fmt::Display for StatusError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StatusError::Missing => write!(f, "status: must be set"),
            StatusError::BadAddress(a) => {
                write!(
                    f,
                    "status.external_address: {} is not an IPv4 or IPv6 address",
                    crate::quote::quoted(a)
                )
            }
            StatusError::TooLarge(n) => {
                write!(
                    f,
                    "status: {n} bytes encoded, at most {MAX_STATUS_BYTES} are accepted"
                )
            }
        }
    }
}

impl std::error::Error for StatusError {}

/// Checks a submitted status and returns it.
pub fn validate_status(status: Option<NodeStatus>) -> Result<NodeStatus, StatusError> {
    let status = status.ok_or(StatusError::Missing)?;
    if status.external_address.parse::<IpAddr>().is_err() {
        return Err(StatusError::BadAddress(status.external_address));
    }
    let len = status.encoded_len();
    if len > MAX_STATUS_BYTES {
        return Err(StatusError::TooLarge(len));
    }
    Ok(status)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(addr: &str) -> Option<NodeStatus> {
        Some(NodeStatus {
            external_address: addr.into(),
            ..Default::default()
        })
    }

    #[test]
    fn accepts_ipv4_and_ipv6() {
        assert!(validate_status(status("10.1.2.3")).is_ok());
        assert!(validate_status(status("fd00::1")).is_ok());
    }

    #[test]
    fn rejects_missing_hostnames_and_huge() {
        assert_eq!(validate_status(None), Err(StatusError::Missing));
        assert!(matches!(
            validate_status(status("node1.example")),
            Err(StatusError::BadAddress(_))
        ));
        assert!(matches!(
            validate_status(status("")),
            Err(StatusError::BadAddress(_))
        ));
        assert!(matches!(
            validate_status(status("10.0.0.1:80")),
            Err(StatusError::BadAddress(_))
        ));
        let mut big = status("10.0.0.1").expect("status");
        big.version = Some(metropolis_proto::version::spec::Version {
            git_information: Some(metropolis_proto::version::spec::version::GitInformation {
                commit_hash: "a".repeat(MAX_STATUS_BYTES),
                ..Default::default()
            }),
            ..Default::default()
        });
        assert!(matches!(
            validate_status(Some(big)),
            Err(StatusError::TooLarge(_))
        ));
        assert!(
            StatusError::BadAddress("x".into())
                .to_string()
                .contains("status.external_address")
        );
    }
}
