//! Kernel tracing sessions over tracefs, for `NodeDebugService.Trace`.
//!
//! - [`TraceSpec`] / [`InstanceName`]: validation of a request before
//!   anything is written ([`ValidationError`]).
//! - [`Target`] and [`TraceBuffers`]: which buffer a session traces into,
//!   and the registry keeping one session per buffer.
//! - [`TraceSession`]: the sans-IO lifecycle machine (tracefs operations
//!   in order, `TraceEvent`s, the teardown that always runs).
//! - [`Tracefs`] / [`TracePipe`]: the port the host implements
//!   (`metropolis_node::tracefs::HostTracefs` for the kernel's tracefs).
//! - [`LineSplitter`]: `trace_pipe`'s bytes as lines (partial lines kept
//!   up to [`MAX_LINE`], invalid UTF-8 replaced).
//! - [`TraceError`]: every failure, saying what happened.
//!
//! The service layer runs a session against the port as a stream of
//! events (`metropolis_service::debug::run_session`) and decides which
//! status each error becomes (`metropolis_service::status::debug`).

mod action;
mod buffers;
mod error;
mod lines;
mod port;
mod session;
mod validate;

pub use action::{Action, StepFailure};
pub use buffers::{
    BufferClaim, INSTANCE_PREFIX, Released, Target, TraceBuffers, remove_stale_instances,
};
pub use error::TraceError;
pub use lines::{LineSplitter, MAX_LINE};
pub use port::{FailureKind, TracePipe, Tracefs, TracefsFailure, WriteMode};
pub use session::{State, TraceSession};
pub use validate::{
    Field, InstanceName, MAX_MODULE_LEN, MAX_NAME_LEN, MAX_PATTERN_LEN, MAX_PATTERNS, Problem,
    TraceSpec, ValidationError,
};
