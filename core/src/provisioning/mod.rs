//! Provisioning of bare-metal machines through `AgentCallback.Heartbeat`:
//! both ends, as pure state.
//!
//! - Server side: [`MachineRecord`], what the server keeps per machine
//!   (liveness, hardware report, the current installation request, the
//!   report history), with the transitions of a heartbeat and of an
//!   operator's request, and its versioned storage encoding.
//! - Agent side: [`AgentLoop`], a sans-IO machine deciding when the agent
//!   heartbeats, what each heartbeat carries, and when it installs. Its
//!   driving contract is documented on the type; the service layer's
//!   `service::agent_driver` drives it over ports.
//!
//! Together they make installation at-most-once per generation and
//! reporting at-least-once, with a first-result-wins server:
//! - the agent persists the generation it acts on before installing and
//!   never acts on it again, across restarts, so a request is not
//!   installed twice (no reinstall loop after a successful install);
//! - the agent re-sends a report until a heartbeat carrying it succeeds,
//!   and the server keeps a success once stored: a re-send after a lost
//!   acknowledgement never knocks a finished request out of its terminal
//!   state;
//! - the server answers with the current request only while that exact
//!   generation has no report, so an old finished request neither hides
//!   a new one nor satisfies it.

mod agent;
mod heartbeat;
mod machine_id;
mod report;
pub mod root_device;
mod server;

pub use agent::{
    Action, AgentConfig, AgentLoop, ConfigError, HeartbeatPlan, RebootAfter, offered_request,
};
pub use heartbeat::{HeartbeatError, check_heartbeat};
pub use machine_id::{MachineId, MachineIdError};
pub use report::{Report, ReportResult};
pub use root_device::{DEVICE_DIR, MAX_ROOT_DEVICE_BYTES, RootDeviceError, root_device_path};
pub use server::{
    HeartbeatOutcome, InstallationReport, InstallationRequest, MAX_ERROR_BYTES, MAX_REPORTS,
    MachineRecord, RecordError, ReportDisposition, RequestError, SCHEMA_VERSION,
};

#[cfg(test)]
mod tests;
