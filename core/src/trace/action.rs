//! The tracefs operations a session asks its owner to perform.

use std::fmt;

use super::port::{TracefsFailure, WriteMode};

/// A tracefs operation the owner must perform, then report with
/// [`super::TraceSession::handle_action_result`]. Paths are relative to the
/// tracefs root.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Create the instance directory `dir` (`instances/<name>`).
    Mkdir {
        /// The directory.
        dir: String,
    },
    /// Open `file` for writing in `mode`, write `value` in one write (no
    /// write if it is empty), close it.
    Write {
        /// The control file, e.g. `current_tracer` or
        /// `instances/x/set_ftrace_filter`.
        file: String,
        /// The value, without newline.
        value: String,
        /// Truncating or appending open.
        mode: WriteMode,
    },
    /// Open `file` (the buffer's `trace_pipe`) for reading and start
    /// feeding its lines to [`super::TraceSession::handle_pipe_line`].
    OpenPipe {
        /// The pipe.
        file: String,
    },
    /// Close the pipe opened by [`Action::OpenPipe`] and report once the
    /// file is closed (the kernel refuses a tracer change or `rmdir` while
    /// it is open). Stop feeding lines.
    ClosePipe,
    /// Remove the instance directory `dir`.
    Rmdir {
        /// The directory.
        dir: String,
    },
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Action::Mkdir { dir } => write!(f, "mkdir {dir}"),
            Action::Write { file, value, mode } => {
                let how = match mode {
                    WriteMode::Truncate => "write",
                    WriteMode::Append => "append",
                };
                write!(f, "{how} {value:?} to {file}")
            }
            Action::OpenPipe { file } => write!(f, "open {file}"),
            Action::ClosePipe => f.write_str("close trace_pipe"),
            Action::Rmdir { dir } => write!(f, "rmdir {dir}"),
        }
    }
}

/// A teardown operation that failed. Teardown goes on after it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepFailure {
    /// The operation.
    pub action: Action,
    /// How it failed.
    pub failure: TracefsFailure,
}

impl fmt::Display for StepFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.action, self.failure)
    }
}
