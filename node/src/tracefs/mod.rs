//! The kernel's tracefs as a [`Tracefs`] port for
//! `metropolis_core::trace::run_session`.
//!
//! Control-file writes are plain blocking file operations on the caller's
//! thread (they are in-kernel and quick; see [`Tracefs`]). Reading
//! `trace_pipe`, which blocks in the kernel, happens on a dedicated thread
//! per session (see [`pipe`]), so nothing here needs an async runtime.
//!
//! # How operating-system errors map onto [`FailureKind`]
//!
//! | where | errno | kind | the session then reports (gRPC) |
//! | --- | --- | --- | --- |
//! | any open, mkdir, rmdir | `ENOENT`, and the root has no `tracing_on` | `TracefsMissing` | FailedPrecondition "tracefs is not available ..." |
//! | any open, mkdir, rmdir | `ENOENT` | `NotFound` | FailedPrecondition naming the file |
//! | any open, mkdir, rmdir | `EACCES`, `EPERM`, `EROFS` | `NotPermitted` | FailedPrecondition (read-only / lockdown) |
//! | mkdir | `EEXIST` | `Exists` | FailedPrecondition (instance exists) |
//! | write (after a successful open) | `EINVAL`, `EPERM`, `ENODEV` | `Rejected` | InvalidArgument naming the tracer or pattern |
//! | any | `EBUSY` | `Busy` | FailedPrecondition |
//! | any | anything else | `Other` | Unavailable |
//!
//! `EPERM` on a *write* is a refusal of the value, not of the file: under
//! kernel lockdown, for instance, `current_tracer` opens fine but writing
//! `function` fails with `EPERM` (and `set_ftrace_filter` cannot even be
//! opened: `EPERM` on open, `NotPermitted`).
//!
//! A missing or read-only tracefs is thus a FailedPrecondition: it needs an
//! operator (mount tracefs, change the node's configuration) and retrying
//! the call as is cannot succeed, which is what FailedPrecondition means;
//! Unavailable is kept for failures that may be transient.

pub mod pipe;

use std::fs::OpenOptions;
use std::io::{self, Write};
use std::path::{Component, Path, PathBuf};

use metropolis_core::trace::{FailureKind, TracePipe, Tracefs, TracefsFailure, WriteMode};

/// Where tracefs is mounted unless configured otherwise.
pub const DEFAULT_ROOT: &str = "/sys/kernel/tracing";

/// The kernel's tracefs at a root directory.
#[derive(Clone, Debug)]
pub struct HostTracefs {
    root: PathBuf,
}

impl Default for HostTracefs {
    /// Tracefs at [`DEFAULT_ROOT`].
    fn default() -> HostTracefs {
        HostTracefs::new(DEFAULT_ROOT)
    }
}

impl HostTracefs {
    /// Tracefs mounted at `root`. Nothing is checked here: a node without
    /// tracefs still starts, and each trace call reports the missing mount
    /// ([`FailureKind::TracefsMissing`]).
    pub fn new(root: impl Into<PathBuf>) -> HostTracefs {
        HostTracefs { root: root.into() }
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `rel` under the root. The session machine only produces validated
    /// relative paths; anything else is refused rather than followed.
    fn path(&self, rel: &str) -> Result<PathBuf, TracefsFailure> {
        let rel_path = Path::new(rel);
        if rel.is_empty()
            || !rel_path
                .components()
                .all(|c| matches!(c, Component::Normal(_)))
        {
            return Err(TracefsFailure::new(
                FailureKind::Other,
                format!("refusing tracefs path {rel:?}: not a plain relative path"),
            ));
        }
        Ok(self.root.join(rel_path))
    }

    /// Maps an error opening, creating or removing `path`.
    fn open_failure(&self, path: &Path, err: &io::Error) -> TracefsFailure {
        let kind = match err.kind() {
            io::ErrorKind::NotFound if !self.root.join("tracing_on").exists() => {
                return TracefsFailure::new(
                    FailureKind::TracefsMissing,
                    format!(
                        "no tracefs at {} ({}: {err})",
                        self.root.display(),
                        path.display()
                    ),
                );
            }
            io::ErrorKind::NotFound => FailureKind::NotFound,
            io::ErrorKind::PermissionDenied | io::ErrorKind::ReadOnlyFilesystem => {
                FailureKind::NotPermitted
            }
            io::ErrorKind::AlreadyExists => FailureKind::Exists,
            io::ErrorKind::ResourceBusy => FailureKind::Busy,
            _ => FailureKind::Other,
        };
        TracefsFailure::new(kind, format!("{}: {err}", path.display()))
    }
}

/// Maps an error writing to an open control file.
fn write_failure(path: &Path, err: &io::Error) -> TracefsFailure {
    let kind = match err.kind() {
        io::ErrorKind::InvalidInput | io::ErrorKind::PermissionDenied => FailureKind::Rejected,
        _ if err.raw_os_error() == Some(rustix::io::Errno::NODEV.raw_os_error()) => {
            FailureKind::Rejected
        }
        io::ErrorKind::ResourceBusy => FailureKind::Busy,
        _ => FailureKind::Other,
    };
    TracefsFailure::new(kind, format!("{}: {err}", path.display()))
}

impl Tracefs for HostTracefs {
    fn mkdir(&self, dir: &str) -> Result<(), TracefsFailure> {
        let path = self.path(dir)?;
        std::fs::create_dir(&path).map_err(|e| self.open_failure(&path, &e))
    }

    fn rmdir(&self, dir: &str) -> Result<(), TracefsFailure> {
        let path = self.path(dir)?;
        std::fs::remove_dir(&path).map_err(|e| self.open_failure(&path, &e))
    }

    /// Opens without `O_CREAT` (a control file that does not exist is
    /// reported, never created), with `O_TRUNC` or `O_APPEND` per `mode`,
    /// and writes `value` in a single `write(2)`: the kernel parses each
    /// write on its own, so a value must not be split. The file is closed
    /// on return; for `set_ftrace_filter` that is when the kernel commits
    /// the new filter.
    fn write(&self, file: &str, value: &str, mode: WriteMode) -> Result<(), TracefsFailure> {
        let path = self.path(file)?;
        let mut options = OpenOptions::new();
        match mode {
            WriteMode::Truncate => options.write(true).truncate(true),
            WriteMode::Append => options.append(true),
        };
        let mut f = options
            .open(&path)
            .map_err(|e| self.open_failure(&path, &e))?;
        if value.is_empty() {
            return Ok(());
        }
        loop {
            match f.write(value.as_bytes()) {
                Ok(n) if n == value.len() => return Ok(()),
                Ok(n) => {
                    return Err(TracefsFailure::new(
                        FailureKind::Other,
                        format!(
                            "{}: short write ({n} of {} bytes)",
                            path.display(),
                            value.len()
                        ),
                    ));
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(write_failure(&path, &e)),
            }
        }
    }

    /// Reads `instances/`: the names of its directories (an entry whose
    /// name is not UTF-8 is no instance of ours and is skipped).
    fn instances(&self) -> Result<Vec<String>, TracefsFailure> {
        let path = self.path("instances")?;
        let dir = std::fs::read_dir(&path).map_err(|e| self.open_failure(&path, &e))?;
        Ok(dir
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .filter_map(|e| e.file_name().into_string().ok())
            .collect())
    }

    fn open_pipe(&self, file: &str) -> Result<Box<dyn TracePipe>, TracefsFailure> {
        let path = self.path(file)?;
        let pipe = pipe::HostPipe::open(&path).map_err(|e| match e {
            pipe::OpenError::Open(err) => self.open_failure(&path, &err),
            pipe::OpenError::Setup(err) => TracefsFailure::new(
                FailureKind::Other,
                format!("{}: starting the reader: {err}", path.display()),
            ),
        })?;
        Ok(Box::new(pipe))
    }
}
