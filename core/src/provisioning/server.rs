//! The server side: what the AgentCallback server keeps per machine, and
//! the pure transitions a heartbeat or an operator's request make on it.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use metropolis_proto::prelude::agent;
use prost::Message;

use super::ReportResult;
use super::heartbeat::is_empty;

/// How many generations of installation reports a record keeps: the
/// reports of the 16 highest generations. The report of the current
/// request is always among them, since no report is stored for a
/// generation that was never issued.
pub const MAX_REPORTS: usize = 16;

/// The longest error message of a report that is stored, in bytes; a
/// longer one is cut at a character boundary and marked with `…`, so that
/// a record stays small enough for the store.
pub const MAX_ERROR_BYTES: usize = 4096;

/// The storage schema version [`MachineRecord::encode`] writes and
/// [`MachineRecord::decode`] reads.
pub const SCHEMA_VERSION: u32 = 1;

/// The installation request currently standing for a machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstallationRequest {
    /// The request's generation, unique per machine and increasing.
    pub generation: i64,
    /// The encoded `OSInstallationRequest`, generation included, exactly as
    /// it is returned to the agent.
    pub encoded: Bytes,
    /// Wall time it was submitted, in milliseconds since the Unix epoch
    /// (None in records written before it was kept).
    pub submitted_unix_ms: Option<i64>,
    /// Wall time a heartbeat's answer first carried it to the agent (None:
    /// not yet handed out).
    pub handed_out_unix_ms: Option<i64>,
}

/// An installation report received from the agent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstallationReport {
    /// The generation of the request it answers.
    pub generation: i64,
    /// How acting on that request went.
    pub result: ReportResult,
    /// Wall time when the server stored it, in milliseconds since the Unix
    /// epoch.
    pub received_unix_ms: i64,
}

/// What became of the installation report a heartbeat carried.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReportDisposition {
    /// The first report for its generation: stored.
    Stored,
    /// A success for a generation that had an error: the success replaced
    /// it (success wins).
    ReplacedError,
    /// Its generation already had a report that stays: a success is
    /// terminal, and of two errors the first is kept. Late and duplicate
    /// reports (a re-send after a lost acknowledgement) end here.
    Kept,
    /// Its generation was never issued for this machine (below 1, or not
    /// yet submitted): not stored, so it cannot satisfy a future request.
    NeverIssued,
    /// Its generation is older than the [`MAX_REPORTS`] generations the
    /// history keeps: not stored.
    BeyondHistory,
}

/// What the server answers to a heartbeat, and what it did with it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct HeartbeatOutcome {
    /// The encoded `OSInstallationRequest` for the response's
    /// `installation_request`: the stored bytes, exactly when the machine
    /// has a request and no report for that request's generation.
    pub response_request: Option<Bytes>,
    /// What became of the heartbeat's installation report, if it had one.
    pub report: Option<ReportDisposition>,
}

/// An operator's installation request that cannot be accepted.
///
/// The `Display` of every variant but [`Malformed`](Self::Malformed)
/// starts with the request field it is about (`type: …`,
/// `metropolis.root_device: …`).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RequestError {
    /// The bytes are not an encoded `OSInstallationRequest`.
    Malformed(prost::DecodeError),
    /// The request selects no installation flow (its `type` oneof is unset).
    MissingType,
    /// Its `metropolis.root_device` names no device (see
    /// [`root_device_path`](super::root_device_path)).
    RootDevice(super::RootDeviceError),
    /// The machine's generations are exhausted (`i64::MAX` was issued).
    GenerationExhausted,
}

impl fmt::Display for RequestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RequestError::Malformed(e) => {
                write!(f, "not an encoded OSInstallationRequest: {e}")
            }
            RequestError::MissingType => write!(
                f,
                "type: the request selects no installation flow (set `metropolis`)"
            ),
            RequestError::RootDevice(e) => write!(f, "metropolis.root_device: {e}"),
            RequestError::GenerationExhausted => write!(
                f,
                "generation: this machine's request generations are exhausted"
            ),
        }
    }
}

impl std::error::Error for RequestError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RequestError::Malformed(e) => Some(e),
            RequestError::RootDevice(e) => Some(e),
            _ => None,
        }
    }
}

/// A stored machine record that cannot be read.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RecordError {
    /// The bytes are not a machine record's encoding.
    Malformed(prost::DecodeError),
    /// The record was written with a schema this build does not read.
    SchemaVersion {
        /// The record's `schema_version` (0: absent).
        found: u32,
    },
    /// A field has a value no record of this schema can have.
    Field {
        /// The field, e.g. `reports[3].generation`.
        field: String,
        /// What is wrong with it.
        problem: String,
    },
}

impl fmt::Display for RecordError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RecordError::Malformed(e) => write!(f, "not an encoded machine record: {e}"),
            RecordError::SchemaVersion { found: 0 } => write!(
                f,
                "schema_version: absent (0); this build reads version {SCHEMA_VERSION}"
            ),
            RecordError::SchemaVersion { found } => write!(
                f,
                "schema_version: {found} is not supported; this build reads version \
                 {SCHEMA_VERSION}"
            ),
            RecordError::Field { field, problem } => write!(f, "{field}: {problem}"),
        }
    }
}

impl std::error::Error for RecordError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RecordError::Malformed(e) => Some(e),
            _ => None,
        }
    }
}

fn field_error(field: impl Into<String>, problem: impl Into<String>) -> RecordError {
    RecordError::Field {
        field: field.into(),
        problem: problem.into(),
    }
}

/// Everything the server keeps about one machine: plain data, plus the
/// pure transitions of `AgentCallback.Heartbeat` and of an operator's
/// installation request. The caller authenticates the agent (its key is
/// [`agent_public_key`](Self::agent_public_key)), reads the wall clock,
/// and stores the record ([`encode`](Self::encode) /
/// [`decode`](Self::decode)) atomically with the transition.
///
/// Rules (docs/spec/semantics.md, `AgentCallback.Heartbeat`):
/// - Each submitted request gets the next generation (the first is 1) and
///   replaces the previous request; its bytes are stored and returned
///   byte-for-byte, with the generation set.
/// - A heartbeat's hardware report is stored as received (last wins); its
///   installation report is stored per generation, where a success is
///   terminal (a late or duplicate report never changes it), a success
///   replaces an error, and of two errors the first stays.
/// - The request is returned exactly while no report (success **or**
///   error) exists for its generation: after an error the operator submits
///   a new request to retry. Reports of other generations are history and
///   never satisfy the current request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MachineRecord {
    /// The machine's ID (a UUID).
    pub machine_id: String,
    /// The Ed25519 public key of the machine's agent.
    pub agent_public_key: [u8; 32],
    /// Wall time of the last successful heartbeat, in milliseconds since
    /// the Unix epoch, as passed in by the caller.
    pub last_heartbeat_unix_ms: Option<i64>,
    /// The encoded `AgentHardwareReport` of the latest heartbeat that had
    /// one.
    pub hardware_report: Option<Bytes>,
    /// The current installation request.
    pub request: Option<InstallationRequest>,
    /// Installation reports by generation: the [`MAX_REPORTS`] highest
    /// generations reported.
    pub reports: BTreeMap<i64, InstallationReport>,
    /// The generation the next submitted request gets.
    next_generation: i64,
}

impl MachineRecord {
    /// A registered machine that has not been heard from and has no
    /// request.
    pub fn new(machine_id: impl Into<String>, agent_public_key: [u8; 32]) -> Self {
        MachineRecord {
            machine_id: machine_id.into(),
            agent_public_key,
            last_heartbeat_unix_ms: None,
            hardware_report: None,
            request: None,
            reports: BTreeMap::new(),
            next_generation: 1,
        }
    }

    /// The generation the next submitted request gets (1 for a machine
    /// that never had one).
    pub fn next_generation(&self) -> i64 {
        self.next_generation
    }

    /// Accepts the operator's encoded `OSInstallationRequest` as the
    /// machine's request, with the next generation, replacing the previous
    /// request.
    ///
    /// The request must decode and select an installation flow (`type`),
    /// and its root device must name a device under `/dev`
    /// ([`root_device_path`](super::root_device_path)).
    /// Any `generation` it carries is overridden. The stored bytes are the
    /// submitted bytes followed by the `generation` field: a parser takes
    /// the last value of a repeated scalar field, so the request reads with
    /// the new generation, and fields this build does not know are kept
    /// byte-for-byte.
    pub fn submit_request(
        &mut self,
        submitted: &[u8],
        now_unix_ms: i64,
    ) -> Result<InstallationRequest, RequestError> {
        let decoded =
            agent::OsInstallationRequest::decode(submitted).map_err(RequestError::Malformed)?;
        match &decoded.r#type {
            None => return Err(RequestError::MissingType),
            Some(agent::os_installation_request::Type::Metropolis(metropolis)) => {
                super::root_device_path(&metropolis.root_device)
                    .map_err(RequestError::RootDevice)?;
            }
        }
        let generation = self.next_generation;
        let next = generation
            .checked_add(1)
            .ok_or(RequestError::GenerationExhausted)?;
        let request = InstallationRequest {
            generation,
            encoded: with_generation(submitted, generation),
            submitted_unix_ms: Some(now_unix_ms),
            handed_out_unix_ms: None,
        };
        self.next_generation = next;
        self.request = Some(request.clone());
        Ok(request)
    }

    /// Applies one authenticated heartbeat received at `now_unix_ms` (wall
    /// time): records liveness, stores the hardware report and the
    /// installation report it carries, and says what to answer.
    ///
    /// The hardware report is stored re-encoded from the decoded message;
    /// fields this build does not know are not kept, and one that encodes
    /// to zero bytes leaves the stored report as it is (the reference skips
    /// it; so is an installation report of zero bytes). A heartbeat
    /// [`check_heartbeat`](super::check_heartbeat) refuses must not come
    /// here: its report without a result would be ignored, not refused.
    pub fn handle_heartbeat(
        &mut self,
        heartbeat: &agent::HeartbeatRequest,
        now_unix_ms: i64,
    ) -> HeartbeatOutcome {
        self.last_heartbeat_unix_ms = Some(now_unix_ms);
        // A report of zero bytes replaces nothing, as in the reference.
        if let Some(hardware) = heartbeat.hardware_report.as_ref().filter(|h| !is_empty(*h)) {
            self.hardware_report = Some(Bytes::from(hardware.encode_to_vec()));
        }
        let report = heartbeat.installation_report.as_ref().and_then(|report| {
            let result = ReportResult::from_proto(report.result.as_ref())?;
            Some(self.store_report(report.generation, result, now_unix_ms))
        });
        let pending = self.pending_request().is_some();
        let response_request = match &mut self.request {
            Some(request) if pending => {
                request.handed_out_unix_ms.get_or_insert(now_unix_ms);
                Some(request.encoded.clone())
            }
            _ => None,
        };
        HeartbeatOutcome {
            response_request,
            report,
        }
    }

    /// Stores one installation report by the rules of the type.
    fn store_report(
        &mut self,
        generation: i64,
        result: ReportResult,
        now_unix_ms: i64,
    ) -> ReportDisposition {
        if generation < 1 || generation >= self.next_generation {
            return ReportDisposition::NeverIssued;
        }
        let result = match result {
            ReportResult::Error(message) => ReportResult::Error(bounded(message)),
            success => success,
        };
        let report = InstallationReport {
            generation,
            result,
            received_unix_ms: now_unix_ms,
        };
        match self.reports.get_mut(&generation) {
            Some(existing) => {
                if !existing.result.is_success() && report.result.is_success() {
                    *existing = report;
                    ReportDisposition::ReplacedError
                } else {
                    ReportDisposition::Kept
                }
            }
            None => {
                self.reports.insert(generation, report);
                if self.prune_reports().contains(&generation) {
                    ReportDisposition::BeyondHistory
                } else {
                    ReportDisposition::Stored
                }
            }
        }
    }

    /// Drops the reports of the lowest generations beyond [`MAX_REPORTS`];
    /// returns the dropped generations.
    fn prune_reports(&mut self) -> Vec<i64> {
        let mut dropped = Vec::new();
        while self.reports.len() > MAX_REPORTS {
            match self.reports.pop_first() {
                Some((generation, _)) => dropped.push(generation),
                None => break,
            }
        }
        dropped
    }

    /// The generation of the current request, if any.
    pub fn current_generation(&self) -> Option<i64> {
        self.request.as_ref().map(|r| r.generation)
    }

    /// The current request if it is still to be returned to the agent:
    /// no report exists for its generation.
    pub fn pending_request(&self) -> Option<&InstallationRequest> {
        self.request
            .as_ref()
            .filter(|r| !self.reports.contains_key(&r.generation))
    }

    /// The report of the highest generation reported.
    pub fn latest_report(&self) -> Option<&InstallationReport> {
        self.reports.last_key_value().map(|(_, report)| report)
    }

    /// Whether the machine counts as lost at `now_unix_ms` (wall time): not
    /// heard from for longer than `lost_after`. A machine never heard from
    /// is lost; a heartbeat time in the future (the wall clock stepped
    /// back) is not.
    pub fn is_lost(&self, now_unix_ms: i64, lost_after: Duration) -> bool {
        let Some(last) = self.last_heartbeat_unix_ms else {
            return true;
        };
        let lost_after_ms = i64::try_from(lost_after.as_millis()).unwrap_or(i64::MAX);
        now_unix_ms.saturating_sub(last) > lost_after_ms
    }

    /// The record as a versioned protobuf (schema [`SCHEMA_VERSION`]), for
    /// the store.
    pub fn encode(&self) -> Vec<u8> {
        StoredMachineRecord {
            schema_version: SCHEMA_VERSION,
            machine_id: self.machine_id.clone(),
            agent_public_key: Bytes::copy_from_slice(&self.agent_public_key),
            last_heartbeat_unix_ms: self.last_heartbeat_unix_ms,
            hardware_report: self.hardware_report.clone(),
            request: self.request.as_ref().map(|r| StoredRequest {
                generation: r.generation,
                encoded: r.encoded.clone(),
                submitted_unix_ms: r.submitted_unix_ms,
                handed_out_unix_ms: r.handed_out_unix_ms,
            }),
            reports: self
                .reports
                .values()
                .map(|r| StoredReport {
                    generation: r.generation,
                    received_unix_ms: r.received_unix_ms,
                    result: Some(match &r.result {
                        ReportResult::Success => StoredResult::Success(StoredSuccess {}),
                        ReportResult::Error(e) => StoredResult::Error(e.clone()),
                    }),
                })
                .collect(),
            next_generation: self.next_generation,
        }
        .encode_to_vec()
    }

    /// Reads a record written by [`encode`](Self::encode), checking the
    /// schema version and the record's invariants. Reports beyond
    /// [`MAX_REPORTS`] are dropped (lowest generations first).
    pub fn decode(encoded: &[u8]) -> Result<Self, RecordError> {
        let stored = StoredMachineRecord::decode(encoded).map_err(RecordError::Malformed)?;
        if stored.schema_version != SCHEMA_VERSION {
            return Err(RecordError::SchemaVersion {
                found: stored.schema_version,
            });
        }
        let agent_public_key: [u8; 32] =
            stored.agent_public_key.as_ref().try_into().map_err(|_| {
                field_error(
                    "agent_public_key",
                    format!(
                        "must be 32 bytes (Ed25519), is {}",
                        stored.agent_public_key.len()
                    ),
                )
            })?;
        let next_generation = stored.next_generation;
        if next_generation < 1 {
            return Err(field_error(
                "next_generation",
                format!("must be at least 1, is {next_generation}"),
            ));
        }
        let issued = |g: i64| (1..next_generation).contains(&g);
        let request = match stored.request {
            None => None,
            Some(r) => {
                if !issued(r.generation) {
                    return Err(field_error(
                        "request.generation",
                        format!(
                            "{} was never issued (next_generation is {next_generation})",
                            r.generation
                        ),
                    ));
                }
                let decoded = agent::OsInstallationRequest::decode(r.encoded.as_ref())
                    .map_err(|e| field_error("request.encoded", e.to_string()))?;
                if decoded.generation != r.generation {
                    return Err(field_error(
                        "request.encoded",
                        format!(
                            "carries generation {}, the record says {}",
                            decoded.generation, r.generation
                        ),
                    ));
                }
                Some(InstallationRequest {
                    generation: r.generation,
                    encoded: r.encoded,
                    submitted_unix_ms: r.submitted_unix_ms,
                    handed_out_unix_ms: r.handed_out_unix_ms,
                })
            }
        };
        let mut reports = BTreeMap::new();
        for (i, r) in stored.reports.into_iter().enumerate() {
            if !issued(r.generation) {
                return Err(field_error(
                    format!("reports[{i}].generation"),
                    format!(
                        "{} was never issued (next_generation is {next_generation})",
                        r.generation
                    ),
                ));
            }
            let result = match r.result {
                Some(StoredResult::Success(_)) => ReportResult::Success,
                Some(StoredResult::Error(e)) => ReportResult::Error(e),
                None => {
                    return Err(field_error(
                        format!("reports[{i}].result"),
                        "neither success nor error",
                    ));
                }
            };
            let report = InstallationReport {
                generation: r.generation,
                result,
                received_unix_ms: r.received_unix_ms,
            };
            if reports.insert(r.generation, report).is_some() {
                return Err(field_error(
                    format!("reports[{i}].generation"),
                    format!("{} is reported twice", r.generation),
                ));
            }
        }
        let mut record = MachineRecord {
            machine_id: stored.machine_id,
            agent_public_key,
            last_heartbeat_unix_ms: stored.last_heartbeat_unix_ms,
            hardware_report: stored.hardware_report,
            request,
            reports,
            next_generation,
        };
        record.prune_reports();
        Ok(record)
    }
}

/// `submitted` followed by field 1 (`generation`, varint).
fn with_generation(submitted: &[u8], generation: i64) -> Bytes {
    let mut out = Vec::with_capacity(submitted.len() + 11);
    out.extend_from_slice(submitted);
    prost::encoding::int64::encode(1, &generation, &mut out);
    Bytes::from(out)
}

/// `message` cut to at most [`MAX_ERROR_BYTES`] at a character boundary.
fn bounded(mut message: String) -> String {
    const MARK: &str = "…";
    if message.len() <= MAX_ERROR_BYTES {
        return message;
    }
    let mut end = MAX_ERROR_BYTES - MARK.len();
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    message.truncate(end);
    message.push_str(MARK);
    message
}

/// Storage form of [`MachineRecord`], schema version 1.
#[derive(Clone, PartialEq, prost::Message)]
struct StoredMachineRecord {
    #[prost(uint32, tag = "1")]
    schema_version: u32,
    #[prost(string, tag = "2")]
    machine_id: String,
    #[prost(bytes = "bytes", tag = "3")]
    agent_public_key: Bytes,
    #[prost(int64, optional, tag = "4")]
    last_heartbeat_unix_ms: Option<i64>,
    #[prost(bytes = "bytes", optional, tag = "5")]
    hardware_report: Option<Bytes>,
    #[prost(message, optional, tag = "6")]
    request: Option<StoredRequest>,
    #[prost(message, repeated, tag = "7")]
    reports: Vec<StoredReport>,
    #[prost(int64, tag = "8")]
    next_generation: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
struct StoredRequest {
    #[prost(int64, tag = "1")]
    generation: i64,
    #[prost(bytes = "bytes", tag = "2")]
    encoded: Bytes,
    #[prost(int64, optional, tag = "3")]
    submitted_unix_ms: Option<i64>,
    #[prost(int64, optional, tag = "4")]
    handed_out_unix_ms: Option<i64>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct StoredReport {
    #[prost(int64, tag = "1")]
    generation: i64,
    #[prost(oneof = "StoredResult", tags = "2, 3")]
    result: Option<StoredResult>,
    #[prost(int64, tag = "4")]
    received_unix_ms: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
struct StoredSuccess {}

#[derive(Clone, PartialEq, prost::Oneof)]
enum StoredResult {
    #[prost(message, tag = "2")]
    Success(StoredSuccess),
    #[prost(string, tag = "3")]
    Error(String),
}

#[cfg(test)]
mod tests {
    use super::*;
    use metropolis_proto::prelude::agent::os_installation_report;
    use metropolis_proto::prelude::agent::os_installation_request::Type;

    const KEY: [u8; 32] = [7; 32];
    const ID: &str = "0f8fad5b-d9cb-469f-a165-70867728950e";

    fn request_bytes(root_device: &str) -> Vec<u8> {
        agent::OsInstallationRequest {
            generation: 0,
            r#type: Some(Type::Metropolis(agent::MetropolisInstallationRequest {
                root_device: root_device.to_string(),
                ..Default::default()
            })),
        }
        .encode_to_vec()
    }

    fn heartbeat(report: Option<(i64, Option<&str>)>) -> agent::HeartbeatRequest {
        agent::HeartbeatRequest {
            machine_id: ID.to_string(),
            hardware_report: None,
            installation_report: report.map(|(generation, error)| agent::OsInstallationReport {
                generation,
                result: Some(match error {
                    None => {
                        os_installation_report::Result::Success(os_installation_report::Success {})
                    }
                    Some(e) => {
                        os_installation_report::Result::Error(os_installation_report::Error {
                            error: e.to_string(),
                        })
                    }
                }),
            }),
        }
    }

    #[test]
    fn a_request_remembers_when_it_was_submitted_and_first_handed_out() {
        let mut record = MachineRecord::new(ID, KEY);
        record
            .submit_request(&request_bytes("a"), 1_000)
            .expect("valid");
        let request = |r: &MachineRecord| r.request.clone().expect("a request");
        assert_eq!(request(&record).submitted_unix_ms, Some(1_000));
        assert_eq!(request(&record).handed_out_unix_ms, None);
        assert!(
            record
                .handle_heartbeat(&heartbeat(None), 2_000)
                .response_request
                .is_some()
        );
        assert!(
            record
                .handle_heartbeat(&heartbeat(None), 3_000)
                .response_request
                .is_some()
        );
        // The first answer that carried it, kept across encoding.
        let record = MachineRecord::decode(&record.encode()).expect("decodes");
        assert_eq!(request(&record).handed_out_unix_ms, Some(2_000));
        let mut record = record;
        // Reported: no longer handed out, the time stays.
        record.handle_heartbeat(&heartbeat(Some((1, None))), 4_000);
        assert_eq!(request(&record).handed_out_unix_ms, Some(2_000));
        // A new request starts afresh.
        record
            .submit_request(&request_bytes("b"), 5_000)
            .expect("valid");
        assert_eq!(request(&record).submitted_unix_ms, Some(5_000));
        assert_eq!(request(&record).handed_out_unix_ms, None);
    }

    #[test]
    fn generation_is_appended_and_unknown_fields_survive() {
        let mut record = MachineRecord::new(ID, KEY);
        let mut submitted = request_bytes("/dev/sda");
        // A field this build does not know: number 99, varint 7.
        let unknown = [0x98, 0x06, 0x07];
        submitted.extend_from_slice(&unknown);
        // A generation the operator set is overridden.
        prost::encoding::int64::encode(1, &42, &mut submitted);

        let first = record
            .submit_request(&submitted, 1_000)
            .expect("valid request");
        assert_eq!(first.generation, 1);
        assert!(first.encoded.starts_with(&submitted));
        let decoded =
            agent::OsInstallationRequest::decode(first.encoded.as_ref()).expect("decodes");
        assert_eq!(decoded.generation, 1);
        match decoded.r#type {
            Some(Type::Metropolis(m)) => assert_eq!(m.root_device, "/dev/sda"),
            None => panic!("type lost"),
        }
        // Byte-for-byte: the submitted bytes, unknown field included, then
        // field 1 = 1.
        assert_eq!(&first.encoded[..submitted.len()], &submitted[..]);
        assert_eq!(&first.encoded[submitted.len()..], &[0x08, 0x01]);
        assert!(first.encoded.windows(unknown.len()).any(|w| w == unknown));

        let second = record
            .submit_request(&submitted, 1_000)
            .expect("valid request");
        assert_eq!(second.generation, 2);
        let decoded =
            agent::OsInstallationRequest::decode(second.encoded.as_ref()).expect("decodes");
        assert_eq!(decoded.generation, 2);
        assert_eq!(record.current_generation(), Some(2));
        assert_eq!(record.next_generation(), 3);
        assert_eq!(
            record.request.as_ref().map(|r| &r.encoded),
            Some(&second.encoded)
        );
    }

    #[test]
    fn invalid_requests_are_refused_naming_the_field() {
        let mut record = MachineRecord::new(ID, KEY);
        let no_type = agent::OsInstallationRequest::default().encode_to_vec();
        let err = record.submit_request(&no_type, 1_000).expect_err("no type");
        assert_eq!(err, RequestError::MissingType);
        assert!(err.to_string().starts_with("type:"), "{err}");
        let err = record
            .submit_request(&[0xff, 0xff], 1_000)
            .expect_err("garbage");
        assert!(matches!(err, RequestError::Malformed(_)), "{err}");
        for root in [
            "",
            "/etc/shadow",
            "../../etc/passwd",
            "/tmp/disk.img",
            "/dev/../etc",
        ] {
            let err = record
                .submit_request(&request_bytes(root), 1_000)
                .expect_err("not a device");
            assert!(
                matches!(err, RequestError::RootDevice(_)),
                "{root:?}: {err}"
            );
            assert!(
                err.to_string().starts_with("metropolis.root_device: "),
                "{err}"
            );
        }
        assert_eq!(record.next_generation(), 1);
        assert_eq!(record.request, None);
    }

    #[test]
    fn request_is_returned_until_any_report_for_its_generation() {
        let mut record = MachineRecord::new(ID, KEY);
        assert_eq!(
            record
                .handle_heartbeat(&heartbeat(None), 5)
                .response_request,
            None
        );
        let r1 = record
            .submit_request(&request_bytes("a"), 1_000)
            .expect("valid");
        let out = record.handle_heartbeat(&heartbeat(None), 10);
        assert_eq!(out.response_request, Some(r1.encoded.clone()));
        assert_eq!(record.last_heartbeat_unix_ms, Some(10));

        // An error satisfies the request: the operator must resubmit.
        let out = record.handle_heartbeat(&heartbeat(Some((1, Some("disk on fire")))), 20);
        assert_eq!(out.report, Some(ReportDisposition::Stored));
        assert_eq!(out.response_request, None);

        // A new request is returned although an old report exists.
        let r2 = record
            .submit_request(&request_bytes("b"), 1_000)
            .expect("valid");
        let out = record.handle_heartbeat(&heartbeat(None), 30);
        assert_eq!(out.response_request, Some(r2.encoded.clone()));
        // A late report of the old generation does not satisfy it.
        let out = record.handle_heartbeat(&heartbeat(Some((1, None))), 40);
        assert_eq!(out.report, Some(ReportDisposition::ReplacedError));
        assert_eq!(out.response_request, Some(r2.encoded.clone()));

        let out = record.handle_heartbeat(&heartbeat(Some((2, None))), 50);
        assert_eq!(out.report, Some(ReportDisposition::Stored));
        assert_eq!(out.response_request, None);
        assert_eq!(record.latest_report().map(|r| r.generation), Some(2));
    }

    #[test]
    fn success_is_terminal_and_duplicates_are_kept_once() {
        let mut record = MachineRecord::new(ID, KEY);
        record
            .submit_request(&request_bytes("a"), 1_000)
            .expect("valid");
        let out = record.handle_heartbeat(&heartbeat(Some((1, None))), 10);
        assert_eq!(out.report, Some(ReportDisposition::Stored));
        // The acknowledgement got lost: the agent re-sends.
        let out = record.handle_heartbeat(&heartbeat(Some((1, None))), 20);
        assert_eq!(out.report, Some(ReportDisposition::Kept));
        let out = record.handle_heartbeat(&heartbeat(Some((1, Some("late error")))), 30);
        assert_eq!(out.report, Some(ReportDisposition::Kept));
        let report = &record.reports[&1];
        assert_eq!(report.result, ReportResult::Success);
        assert_eq!(report.received_unix_ms, 10);
        assert_eq!(out.response_request, None);

        // Of two errors, the first stays.
        record
            .submit_request(&request_bytes("b"), 1_000)
            .expect("valid");
        record.handle_heartbeat(&heartbeat(Some((2, Some("first")))), 40);
        record.handle_heartbeat(&heartbeat(Some((2, Some("second")))), 50);
        assert_eq!(
            record.reports[&2].result,
            ReportResult::Error("first".into())
        );
    }

    #[test]
    fn reports_for_unissued_generations_are_not_stored() {
        let mut record = MachineRecord::new(ID, KEY);
        record
            .submit_request(&request_bytes("a"), 1_000)
            .expect("valid");
        for generation in [0, -1, 2, i64::MAX] {
            let out = record.handle_heartbeat(&heartbeat(Some((generation, None))), 10);
            assert_eq!(out.report, Some(ReportDisposition::NeverIssued));
        }
        assert!(record.reports.is_empty());
        // Otherwise the next request would be born satisfied.
        let r2 = record
            .submit_request(&request_bytes("b"), 1_000)
            .expect("valid");
        let out = record.handle_heartbeat(&heartbeat(None), 20);
        assert_eq!(out.response_request, Some(r2.encoded));
    }

    #[test]
    fn a_report_without_result_is_no_report() {
        let mut record = MachineRecord::new(ID, KEY);
        record
            .submit_request(&request_bytes("a"), 1_000)
            .expect("valid");
        let mut hb = heartbeat(Some((1, None)));
        if let Some(r) = hb.installation_report.as_mut() {
            r.result = None;
        }
        // The service refuses such a heartbeat first (`check_heartbeat`);
        // here it neither satisfies the request nor stores anything.
        assert!(super::super::check_heartbeat(&hb).is_err());
        let out = record.handle_heartbeat(&hb, 10);
        assert_eq!(out.report, None);
        assert!(record.reports.is_empty());
        assert!(out.response_request.is_some());
    }

    #[test]
    fn history_is_bounded_and_keeps_the_current_generation() {
        let mut record = MachineRecord::new(ID, KEY);
        for g in 1..=40 {
            record
                .submit_request(&request_bytes("a"), 1_000)
                .expect("valid");
            record.handle_heartbeat(&heartbeat(Some((g, Some("x")))), g);
        }
        assert_eq!(record.reports.len(), MAX_REPORTS);
        assert_eq!(
            record.reports.keys().next(),
            Some(&(40 - MAX_REPORTS as i64 + 1))
        );
        assert!(record.reports.contains_key(&40));
        let out = record.handle_heartbeat(&heartbeat(Some((3, None))), 100);
        assert_eq!(out.report, Some(ReportDisposition::BeyondHistory));
        assert_eq!(record.reports.len(), MAX_REPORTS);
    }

    #[test]
    fn long_errors_are_bounded() {
        let mut record = MachineRecord::new(ID, KEY);
        record
            .submit_request(&request_bytes("a"), 1_000)
            .expect("valid");
        let long = "é".repeat(MAX_ERROR_BYTES);
        record.handle_heartbeat(&heartbeat(Some((1, Some(&long)))), 10);
        match &record.reports[&1].result {
            ReportResult::Error(e) => {
                assert!(e.len() <= MAX_ERROR_BYTES);
                assert!(e.ends_with('…'));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn hardware_report_last_wins() {
        let mut record = MachineRecord::new(ID, KEY);
        for warning in ["first", "second"] {
            let mut hb = heartbeat(None);
            hb.hardware_report = Some(agent::AgentHardwareReport {
                report: None,
                warning: vec![warning.to_string()],
            });
            record.handle_heartbeat(&hb, 10);
        }
        record.handle_heartbeat(&heartbeat(None), 20);
        let stored = record.hardware_report.as_ref().expect("stored");
        let decoded = agent::AgentHardwareReport::decode(stored.as_ref()).expect("decodes");
        assert_eq!(decoded.warning, vec!["second".to_string()]);
    }

    #[test]
    fn a_zero_byte_hardware_report_keeps_the_stored_one() {
        let mut record = MachineRecord::new(ID, KEY);
        let mut hb = heartbeat(None);
        hb.hardware_report = Some(agent::AgentHardwareReport::default());
        record.handle_heartbeat(&hb, 10);
        assert_eq!(record.hardware_report, None, "nothing stored for nothing");
        hb.hardware_report = Some(agent::AgentHardwareReport {
            report: None,
            warning: vec!["kept".to_string()],
        });
        record.handle_heartbeat(&hb, 20);
        let kept = record.hardware_report.clone();
        hb.hardware_report = Some(agent::AgentHardwareReport::default());
        record.handle_heartbeat(&hb, 30);
        assert_eq!(record.hardware_report, kept, "an empty report replaced it");
        assert_eq!(record.last_heartbeat_unix_ms, Some(30), "still a heartbeat");
    }

    #[test]
    fn a_zero_byte_installation_report_is_no_report() {
        let mut record = MachineRecord::new(ID, KEY);
        let r = record
            .submit_request(&request_bytes("a"), 1_000)
            .expect("valid");
        let mut hb = heartbeat(None);
        hb.installation_report = Some(agent::OsInstallationReport::default());
        assert!(super::super::check_heartbeat(&hb).is_ok());
        let out = record.handle_heartbeat(&hb, 10);
        assert_eq!(out.report, None);
        assert!(record.reports.is_empty());
        assert_eq!(out.response_request, Some(r.encoded));
    }

    #[test]
    fn lost_machines() {
        let mut record = MachineRecord::new(ID, KEY);
        let minute = Duration::from_secs(60);
        assert!(record.is_lost(0, minute));
        record.handle_heartbeat(&heartbeat(None), 1_000);
        assert!(!record.is_lost(1_000, minute));
        assert!(!record.is_lost(61_000, minute));
        assert!(record.is_lost(61_001, minute));
        assert!(!record.is_lost(0, minute));
        assert!(!record.is_lost(i64::MAX, Duration::MAX));
    }

    #[test]
    fn storage_round_trip() {
        let mut record = MachineRecord::new(ID, KEY);
        assert_eq!(MachineRecord::decode(&record.encode()), Ok(record.clone()));
        let mut hb = heartbeat(None);
        hb.hardware_report = Some(agent::AgentHardwareReport {
            report: None,
            warning: vec!["no DMI".to_string()],
        });
        record.handle_heartbeat(&hb, 10);
        record
            .submit_request(&request_bytes("a"), 1_000)
            .expect("valid");
        record.handle_heartbeat(&heartbeat(Some((1, Some("bad")))), 20);
        record
            .submit_request(&request_bytes("b"), 1_000)
            .expect("valid");
        record.handle_heartbeat(&heartbeat(Some((2, None))), 30);
        record
            .submit_request(&request_bytes("c"), 1_000)
            .expect("valid");
        let decoded = MachineRecord::decode(&record.encode()).expect("decodes");
        assert_eq!(decoded, record);
        assert_eq!(decoded.next_generation(), 4);
    }

    #[test]
    fn storage_errors_name_the_field() {
        let record = MachineRecord::new(ID, KEY);
        let mut stored = StoredMachineRecord::decode(record.encode().as_slice()).expect("decodes");
        assert_eq!(stored.schema_version, SCHEMA_VERSION);

        let check = |stored: &StoredMachineRecord, field: &str| {
            let err = MachineRecord::decode(&stored.encode_to_vec()).expect_err("invalid");
            assert!(
                err.to_string().starts_with(field),
                "{err} does not name {field}"
            );
        };
        stored.schema_version = 2;
        check(&stored, "schema_version");
        stored.schema_version = 0;
        check(&stored, "schema_version");
        stored.schema_version = SCHEMA_VERSION;
        stored.agent_public_key = Bytes::from_static(b"short");
        check(&stored, "agent_public_key");
        stored.agent_public_key = Bytes::copy_from_slice(&KEY);
        stored.request = Some(StoredRequest {
            generation: 1,
            encoded: Bytes::new(),
            ..Default::default()
        });
        check(&stored, "request.generation");
        stored.next_generation = 2;
        check(&stored, "request.encoded");
        stored.request = None;
        stored.reports = vec![StoredReport {
            generation: 1,
            result: None,
            received_unix_ms: 0,
        }];
        check(&stored, "reports[0].result");
        stored.reports[0].generation = 5;
        check(&stored, "reports[0].generation");
        assert!(matches!(
            MachineRecord::decode(&[0xff]),
            Err(RecordError::Malformed(_))
        ));
    }
}
