//! What a `HeartbeatRequest` must hold before anything of it is recorded.

use std::fmt;

use metropolis_proto::prelude::agent;

use super::{MachineId, MachineIdError};

/// Why a heartbeat is refused before anything of it is recorded.
/// Displays naming the field.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum HeartbeatError {
    /// `machine_id` is not a UUID in a form the reference accepts.
    MachineId(MachineIdError),
    /// `installation_report` carries neither success nor error, but is not
    /// empty (it names a generation).
    ReportWithoutResult,
}

impl fmt::Display for HeartbeatError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HeartbeatError::MachineId(e) => e.fmt(f),
            HeartbeatError::ReportWithoutResult => f.write_str(
                "installation_report.result: must be success or error; a report with \
                 neither is refused and nothing of this heartbeat was recorded (send no \
                 installation_report while there is nothing to report)",
            ),
        }
    }
}

impl std::error::Error for HeartbeatError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            HeartbeatError::MachineId(e) => Some(e),
            HeartbeatError::ReportWithoutResult => None,
        }
    }
}

/// Checks `heartbeat` and returns its machine ID in canonical form: the
/// key its record is looked up and stored under.
///
/// An installation report that encodes to zero bytes (generation 0, no
/// result) is no report: the reference skips it, and so does
/// [`MachineRecord::handle_heartbeat`](super::MachineRecord::handle_heartbeat).
/// Only a report naming a generation without a result is refused.
pub fn check_heartbeat(heartbeat: &agent::HeartbeatRequest) -> Result<MachineId, HeartbeatError> {
    let id = MachineId::parse(&heartbeat.machine_id).map_err(HeartbeatError::MachineId)?;
    match &heartbeat.installation_report {
        Some(report) if report.result.is_none() && !is_empty(report) => {
            Err(HeartbeatError::ReportWithoutResult)
        }
        _ => Ok(id),
    }
}

/// Whether `message` encodes to zero bytes: the reference stores no report
/// whose encoding is empty (`cloud/bmaas/server/agent_callback_service.go`
/// at `4cc3d4d2`, lines 99 and 109).
pub(super) fn is_empty(message: &impl prost::Message) -> bool {
    message.encoded_len() == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent::os_installation_report::{Result as ProtoResult, Success};

    fn heartbeat(id: &str, result: Option<Option<ProtoResult>>) -> agent::HeartbeatRequest {
        agent::HeartbeatRequest {
            machine_id: id.into(),
            hardware_report: None,
            installation_report: result.map(|result| agent::OsInstallationReport {
                generation: 1,
                result,
            }),
        }
    }

    #[test]
    fn the_machine_id_comes_back_canonical() {
        let hb = heartbeat("{0F8FAD5B-D9CB-469F-A165-70867728950E}", None);
        assert_eq!(
            check_heartbeat(&hb).map(|id| id.to_string()),
            Ok("0f8fad5b-d9cb-469f-a165-70867728950e".into())
        );
        let hb = heartbeat("nope", None);
        assert!(matches!(
            check_heartbeat(&hb),
            Err(HeartbeatError::MachineId(_))
        ));
    }

    #[test]
    fn a_report_needs_a_result() {
        let id = "0f8fad5b-d9cb-469f-a165-70867728950e";
        let ok = heartbeat(id, Some(Some(ProtoResult::Success(Success {}))));
        assert!(check_heartbeat(&ok).is_ok());
        let mut empty = heartbeat(id, Some(None));
        if let Some(report) = empty.installation_report.as_mut() {
            report.generation = 0;
        }
        assert!(
            check_heartbeat(&empty).is_ok(),
            "zero bytes on the wire: no report, skipped as the reference does"
        );
        let empty = heartbeat(id, Some(None));
        let e = check_heartbeat(&empty).expect_err("no result");
        assert_eq!(e, HeartbeatError::ReportWithoutResult);
        assert!(
            e.to_string().starts_with("installation_report.result: "),
            "{e}"
        );
    }
}
