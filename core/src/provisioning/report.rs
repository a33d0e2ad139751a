//! The outcome of an installation, as the agent reports it and the server
//! stores it.

use metropolis_proto::prelude::agent;
use metropolis_proto::prelude::agent::os_installation_report::{
    Error, Result as ProtoResult, Success,
};

/// The result of acting on one installation request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReportResult {
    /// The request was fulfilled.
    Success,
    /// The request could not be fulfilled; a human-readable reason.
    Error(String),
}

impl ReportResult {
    /// The result carried by an `OSInstallationReport`'s `result` oneof;
    /// `None` for a report carrying neither success nor error, which is
    /// no report (see [`check_heartbeat`](super::check_heartbeat)).
    pub fn from_proto(result: Option<&ProtoResult>) -> Option<Self> {
        match result? {
            ProtoResult::Success(_) => Some(ReportResult::Success),
            ProtoResult::Error(e) => Some(ReportResult::Error(e.error.clone())),
        }
    }

    /// The `result` oneof of an `OSInstallationReport`.
    pub fn to_proto(&self) -> ProtoResult {
        match self {
            ReportResult::Success => ProtoResult::Success(Success {}),
            ReportResult::Error(error) => ProtoResult::Error(Error {
                error: error.clone(),
            }),
        }
    }

    /// Whether this is [`ReportResult::Success`].
    pub fn is_success(&self) -> bool {
        matches!(self, ReportResult::Success)
    }
}

impl From<Result<(), String>> for ReportResult {
    fn from(result: Result<(), String>) -> Self {
        match result {
            Ok(()) => ReportResult::Success,
            Err(error) => ReportResult::Error(error),
        }
    }
}

/// An installation report as the agent sends it: which request generation
/// it answers, and how it went.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    /// The `generation` of the `OSInstallationRequest` this report answers.
    pub generation: i64,
    /// How acting on that request went.
    pub result: ReportResult,
}

impl Report {
    /// The report as an `OSInstallationReport` message.
    pub fn to_proto(&self) -> agent::OsInstallationReport {
        agent::OsInstallationReport {
            generation: self.generation,
            result: Some(self.result.to_proto()),
        }
    }
}
