//! The tracefs port: what a trace session needs from the host, and the
//! failure type every tracefs operation reports back to the machine.
//!
//! Paths given to the port are relative to the tracefs root
//! (`current_tracer`, `instances/x/set_ftrace_filter`); the host decides
//! the root (default `/sys/kernel/tracing`).

use std::fmt;

use futures::Stream;

/// How a failed tracefs operation failed, as far as the session machine
/// cares. The host maps `errno`s onto these (see `metropolis_node::tracefs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FailureKind {
    /// There is no tracefs at the root at all (not mounted, wrong path).
    TracefsMissing,
    /// The file or directory does not exist, though tracefs does: this
    /// kernel lacks the feature (e.g. `set_graph_function`).
    NotFound,
    /// The file could not be opened or created: read-only mount, missing
    /// permission, kernel lockdown (`EROFS`, `EACCES`, `EPERM` on open).
    NotPermitted,
    /// The file was opened but the kernel refused the value written
    /// (`EINVAL`, `EPERM`, `ENODEV` on write): unknown or forbidden tracer,
    /// pattern matching no function.
    Rejected,
    /// The kernel refused because the file or buffer is in use (`EBUSY`):
    /// e.g. changing the tracer while a `trace_pipe` reader is open.
    Busy,
    /// The directory to create exists already (`EEXIST`).
    Exists,
    /// Anything else (`EIO`, `ENOMEM`, an end of file on `trace_pipe`).
    Other,
}

/// A failed tracefs operation: its kind and a human-readable detail from
/// the host (the path and the OS error).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TracefsFailure {
    /// What kind of failure it is.
    pub kind: FailureKind,
    /// Human-readable detail, e.g. `/sys/kernel/tracing/current_tracer:
    /// Invalid argument (os error 22)`.
    pub detail: String,
}

impl TracefsFailure {
    /// A failure of this kind with this detail.
    pub fn new(kind: FailureKind, detail: impl Into<String>) -> TracefsFailure {
        TracefsFailure {
            kind,
            detail: detail.into(),
        }
    }
}

impl fmt::Display for TracefsFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.detail)
    }
}

impl std::error::Error for TracefsFailure {}

/// How a control file is opened for a write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteMode {
    /// Opened with `O_TRUNC`. For `set_ftrace_filter` and
    /// `set_graph_function` the kernel empties the filter when the file is
    /// opened with `O_TRUNC`, so a truncating write of an empty value
    /// resets the filter; for the other files it is a plain write.
    Truncate,
    /// Opened without `O_TRUNC` (with `O_APPEND`): the value is added to
    /// the filter instead of replacing it.
    Append,
}

/// The reading side of an open `trace_pipe`: the kernel's output, one
/// item per line (without its newline), plus a way to close it.
///
/// The stream ends (or yields an error) only when reading failed; it is
/// never expected to end while the session runs.
pub trait TracePipe: Stream<Item = Result<String, TracefsFailure>> + Send + Unpin {
    /// Closes the pipe and returns once the file is closed: the kernel
    /// refuses to change the tracer (`EBUSY`) or remove the instance while
    /// a `trace_pipe` reader is open, so teardown must know it is gone.
    /// Must return promptly (it runs during teardown, possibly in a
    /// `Drop`). Idempotent.
    fn close(&mut self) -> Result<(), TracefsFailure>;
}

/// A tracefs: the kernel's, or a fake in tests.
///
/// The writes are synchronous: tracefs control files are in-kernel, no
/// disk is involved, and a session's teardown must be able to run from a
/// `Drop` (a cancelled gRPC stream), where nothing can be awaited. Most
/// writes take microseconds; switching to a function tracer patches every
/// traced call site and can take tens of milliseconds.
pub trait Tracefs: Send + Sync + 'static {
    /// Creates the directory `dir` (an instance: `instances/<name>`).
    fn mkdir(&self, dir: &str) -> Result<(), TracefsFailure>;

    /// Removes the directory `dir` (an instance: `instances/<name>`).
    fn rmdir(&self, dir: &str) -> Result<(), TracefsFailure>;

    /// Opens `file` for writing in `mode` and writes `value` in one
    /// `write` (none at all if `value` is empty), then closes it.
    fn write(&self, file: &str, value: &str, mode: WriteMode) -> Result<(), TracefsFailure>;

    /// Opens `file` (a `trace_pipe`) for reading. Errors opening it come
    /// back here; read errors come through the returned stream.
    fn open_pipe(&self, file: &str) -> Result<Box<dyn TracePipe>, TracefsFailure>;

    /// The names of the instances (the directories under `instances/`).
    fn instances(&self) -> Result<Vec<String>, TracefsFailure>;
}
