//! Kernel tracing sessions over tracefs, for `NodeDebugService.Trace`.
//!
//! - [`TraceSpec`] / [`InstanceName`]: validation of a request before
//!   anything is written ([`ValidationError`], InvalidArgument).
//! - [`Target`] and [`TraceBuffers`]: which buffer a session traces into,
//!   and the registry keeping one session per buffer.
//! - [`TraceSession`]: the sans-IO lifecycle machine (tracefs operations
//!   in order, `TraceEvent`s, the teardown that always runs).
//! - [`Tracefs`] / [`TracePipe`]: the port the host implements
//!   (`metropolis_node::tracefs::HostTracefs` for the kernel's tracefs).
//! - [`run_session`]: runs a session against the port as a stream of
//!   events; what the service calls.
//! - [`LineSplitter`]: `trace_pipe`'s bytes as lines (partial lines kept
//!   up to [`MAX_LINE`], invalid UTF-8 replaced).
//! - [`TraceError`]: every failure, with its gRPC code.
//!
//! For the service:
//!
//! ```no_run
//! use std::sync::Arc;
//!
//! use metropolis_core::trace::{Target, TraceBuffers, TraceStream, Tracefs, run_session};
//! use metropolis_proto::prelude::debug;
//!
//! fn start_trace(
//!     port: Arc<dyn Tracefs>,
//!     buffers: &TraceBuffers,
//!     request: &debug::TraceRequest,
//! ) -> Result<TraceStream, tonic::Status> {
//!     // Or Target::Instance(buffers.fresh_instance_name()) for a buffer of
//!     // the session's own.
//!     let target = Target::Global;
//!     // A TraceError converts into the status the RPC ends with.
//!     Ok(run_session(port, buffers, target, request)?)
//! }
//! ```

mod action;
mod buffers;
mod error;
mod lines;
mod port;
mod run;
mod session;
mod validate;

pub use action::{Action, StepFailure};
pub use buffers::{
    BufferClaim, INSTANCE_PREFIX, Released, Target, TraceBuffers, remove_stale_instances,
};
pub use error::TraceError;
pub use lines::{LineSplitter, MAX_LINE};
pub use port::{FailureKind, TracePipe, Tracefs, TracefsFailure, WriteMode};
pub use run::{TraceStream, run_session};
pub use session::{State, TraceSession};
pub use validate::{
    Field, InstanceName, MAX_MODULE_LEN, MAX_NAME_LEN, MAX_PATTERN_LEN, MAX_PATTERNS, Problem,
    TraceSpec, ValidationError,
};
