//! AgentCallback and MachineManagement: the statuses of their machines'
//! errors (machine IDs, heartbeats, installation requests, stored machine
//! records) and of a heartbeat whose caller is not a registered agent.
//!
//! | error | code | why |
//! | --- | --- | --- |
//! | [`MachineIdError`] | InvalidArgument | the request's `machine_id` is not a machine ID |
//! | [`HeartbeatError`] | InvalidArgument | the heartbeat is refused before anything of it is recorded; the same heartbeat is refused again |
//! | [`RequestError`] | InvalidArgument | the operator's installation request (or a field of it) is what is wrong |
//! | [`RecordError`] | Internal | the store holds a machine record this build cannot read: no request can fix it |
//! | [`not_an_agent`], [`unknown_agent`] | Unauthenticated | the caller presented no agent certificate, or one whose key is not registered for the machine |
//!
//! A heartbeat's code is what the agent acts on: `bmaas-agent` stops on
//! InvalidArgument, which no retry changes, and retries the rest.

use metropolis_core::provisioning::{HeartbeatError, MachineIdError, RecordError, RequestError};
use tonic::Status;

/// A `machine_id` that is not a machine ID: InvalidArgument (the message
/// names the field).
pub fn machine_id(e: &MachineIdError) -> Status {
    Status::invalid_argument(e.to_string())
}

/// A heartbeat `check_heartbeat` refused: InvalidArgument (the message
/// names the field).
pub fn heartbeat(e: &HeartbeatError) -> Status {
    Status::invalid_argument(e.to_string())
}

/// An installation request `submit_request` refused: InvalidArgument,
/// naming the request's field: `request: …` when it is no request at
/// all, `request.<field>: …` otherwise.
pub fn installation_request(e: &RequestError) -> Status {
    match e {
        // Not a request at all: the field is `request`.
        RequestError::Malformed(_) => Status::invalid_argument(format!("request: {e}")),
        // A field of the request: `request.<field>: …`.
        _ => Status::invalid_argument(format!("request.{e}")),
    }
}

/// The machine record stored at `key` that this build cannot read:
/// Internal, naming the key.
pub fn machine_record(key: &[u8], e: &RecordError) -> Status {
    Status::internal(format!(
        "machine record at {}: {e}",
        String::from_utf8_lossy(key)
    ))
}

/// A heartbeat from a caller without an agent certificate:
/// Unauthenticated.
pub fn not_an_agent() -> Status {
    Status::unauthenticated(
        "agents present a self-signed client certificate with their Ed25519 agent key",
    )
}

/// A heartbeat whose machine is not registered, or registered with
/// another agent key: Unauthenticated, alike for both (the caller learns
/// nothing of which machines exist).
pub fn unknown_agent() -> Status {
    Status::unauthenticated("machine id or public key unknown")
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use metropolis_core::provisioning::MachineId;
    use tonic::Code;

    #[test]
    fn request_errors_name_the_field_of_the_request() {
        let not_protobuf = <prost_types::Timestamp as prost::Message>::decode(&b"\xff"[..]);
        let malformed = RequestError::Malformed(not_protobuf.unwrap_err());
        let status = installation_request(&malformed);
        assert_eq!(status.code(), Code::InvalidArgument);
        assert_eq!(status.message(), format!("request: {malformed}"));
        let status = installation_request(&RequestError::MissingType);
        assert_eq!(status.code(), Code::InvalidArgument);
        assert_eq!(
            status.message(),
            "request.type: the request selects no installation flow (set `metropolis`)"
        );
    }

    #[test]
    fn a_bad_machine_id_or_heartbeat_is_invalid_argument_with_its_message() {
        let e = MachineId::parse("not-a-uuid").unwrap_err();
        let status = machine_id(&e);
        assert_eq!(status.code(), Code::InvalidArgument);
        assert_eq!(status.message(), e.to_string());
        let status = heartbeat(&HeartbeatError::ReportWithoutResult);
        assert_eq!(status.code(), Code::InvalidArgument);
        assert_eq!(
            status.message(),
            HeartbeatError::ReportWithoutResult.to_string()
        );
    }

    #[test]
    fn an_unreadable_record_is_internal_naming_its_key() {
        let e = RecordError::SchemaVersion { found: 0 };
        let status = machine_record(b"/machines/m-1", &e);
        assert_eq!(status.code(), Code::Internal);
        assert_eq!(
            status.message(),
            format!("machine record at /machines/m-1: {e}")
        );
    }

    #[test]
    fn callers_that_are_no_registered_agent_are_unauthenticated() {
        assert_eq!(not_an_agent().code(), Code::Unauthenticated);
        assert_eq!(unknown_agent().code(), Code::Unauthenticated);
        assert_eq!(
            unknown_agent().message(),
            "machine id or public key unknown"
        );
    }
}
