//! An in-memory tracefs for tests, the fuzz harnesses and the simulator
//! ([`FakeTracefs`], and the [`Tracefs`] port over it, [`FakePort`]):
//! enough kernel behaviour to catch order mistakes (`EBUSY` for a tracer
//! change or `rmdir` with the pipe open, refused tracers reset to `nop`,
//! missing `set_graph_function`), plus failures injected at one operation
//! (`fail_at`) or from a schedule (`schedule`).

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use futures::channel::mpsc;
use futures::{Stream, StreamExt};
use metropolis_core::trace::{Action, FailureKind, TracePipe, Tracefs, TracefsFailure, WriteMode};

/// Every failure kind, for schedules.
pub const KINDS: [FailureKind; 7] = [
    FailureKind::TracefsMissing,
    FailureKind::NotFound,
    FailureKind::NotPermitted,
    FailureKind::Rejected,
    FailureKind::Busy,
    FailureKind::Exists,
    FailureKind::Other,
];

/// One buffer's control files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FakeBuffer {
    /// `tracing_on`.
    pub tracing_on: bool,
    /// `current_tracer`.
    pub tracer: String,
    /// `set_ftrace_filter`, one pattern per write.
    pub filter: Vec<String>,
    /// `set_graph_function`, one pattern per write.
    pub graph: Vec<String>,
    /// Whether a `trace_pipe` reader is open.
    pub pipe_open: bool,
}

impl FakeBuffer {
    /// A buffer as the kernel makes it: tracing on, `nop`, no filters.
    pub fn fresh() -> FakeBuffer {
        FakeBuffer {
            tracing_on: true,
            tracer: "nop".into(),
            filter: Vec::new(),
            graph: Vec::new(),
            pipe_open: false,
        }
    }

    /// A buffer someone else left tracing with a tracer and filters.
    pub fn dirty() -> FakeBuffer {
        FakeBuffer {
            tracing_on: true,
            tracer: "blk".into(),
            filter: vec!["old".into()],
            graph: vec!["oldg".into()],
            pipe_open: false,
        }
    }
}

/// One operation performed on the fake.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Op {
    /// The operation.
    pub action: Action,
    /// Its result.
    pub result: Result<(), TracefsFailure>,
    /// Whether the result is an injected failure (not the fake's own).
    pub injected: bool,
}

/// The fake tracefs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FakeTracefs {
    /// Tracers the kernel accepts.
    pub available: Vec<String>,
    /// Tracers that exist but are refused (like `function` under lockdown).
    pub forbidden: Vec<String>,
    /// Whether `set_graph_function` exists.
    pub has_graph: bool,
    /// Whether opening `set_ftrace_filter` is refused (lockdown).
    pub filter_locked: bool,
    /// The global buffer.
    pub global: FakeBuffer,
    /// The instances, by name.
    pub instances: BTreeMap<String, FakeBuffer>,
    /// Fail the operation with this 0-based index (counted over the whole
    /// log) with this kind (state unchanged); `TracefsMissing` also
    /// unmounts the fake for good.
    pub fail_at: Option<(usize, FailureKind)>,
    /// Failures to inject, one entry per operation from now on (`None`:
    /// no injection); operations past its end are not injected. Applied
    /// before `fail_at`.
    pub schedule: VecDeque<Option<FailureKind>>,
    /// Whether tracefs is gone (every operation but closing the pipe fails).
    pub gone: bool,
    /// Every operation and its result.
    pub log: Vec<Op>,
}

fn fail(kind: FailureKind, what: &str) -> TracefsFailure {
    TracefsFailure::new(kind, format!("fake: {what}: {kind:?}"))
}

impl Default for FakeTracefs {
    fn default() -> Self {
        Self::new()
    }
}

impl FakeTracefs {
    /// A tracefs as a kernel boots it: `nop`, `blk` and `function_graph`
    /// available, `function` forbidden, `set_graph_function` present.
    pub fn new() -> FakeTracefs {
        FakeTracefs {
            available: vec!["nop".into(), "blk".into(), "function_graph".into()],
            forbidden: vec!["function".into()],
            has_graph: true,
            filter_locked: false,
            global: FakeBuffer::fresh(),
            instances: BTreeMap::new(),
            fail_at: None,
            schedule: VecDeque::new(),
            gone: false,
            log: Vec::new(),
        }
    }

    /// Marks every buffer's `trace_pipe` closed, as the kernel does when
    /// the reader's process exits or drops its descriptor (no operation
    /// of the program's: not logged, never injected).
    pub fn release_pipes(&mut self) {
        self.global.pipe_open = false;
        self.instances
            .values_mut()
            .for_each(|b| b.pipe_open = false);
    }

    /// Performs `action` (or fails it as injected), logging it.
    pub fn apply(&mut self, action: &Action) -> Result<(), TracefsFailure> {
        let index = self.log.len();
        let injected = self.schedule.pop_front().flatten().or(match self.fail_at {
            Some((at, kind)) if at == index => Some(kind),
            _ => None,
        });
        let result = match injected {
            Some(kind) => {
                if kind == FailureKind::TracefsMissing {
                    self.gone = true;
                }
                Err(fail(kind, "injected"))
            }
            None if self.gone && *action != Action::ClosePipe => {
                Err(fail(FailureKind::TracefsMissing, "unmounted"))
            }
            None => self.perform(action),
        };
        self.log.push(Op {
            action: action.clone(),
            result: result.clone(),
            injected: injected.is_some(),
        });
        result
    }

    /// The buffer a path's directory names, and the file name.
    fn split<'a>(&mut self, path: &'a str) -> Option<(&mut FakeBuffer, &'a str)> {
        match path.strip_prefix("instances/") {
            None => Some((&mut self.global, path)),
            Some(rest) => {
                let (name, file) = rest.split_once('/')?;
                Some((self.instances.get_mut(name)?, file))
            }
        }
    }

    fn perform(&mut self, action: &Action) -> Result<(), TracefsFailure> {
        match action {
            Action::Mkdir { dir } => {
                let Some(name) = dir.strip_prefix("instances/") else {
                    return Err(fail(FailureKind::NotPermitted, dir));
                };
                if self.instances.contains_key(name) {
                    return Err(fail(FailureKind::Exists, dir));
                }
                self.instances.insert(name.into(), FakeBuffer::fresh());
                Ok(())
            }
            Action::Rmdir { dir } => {
                let name = dir.strip_prefix("instances/").unwrap_or(dir);
                match self.instances.get(name) {
                    None => Err(fail(FailureKind::NotFound, dir)),
                    Some(b) if b.pipe_open => Err(fail(FailureKind::Busy, dir)),
                    Some(_) => {
                        self.instances.remove(name);
                        Ok(())
                    }
                }
            }
            Action::OpenPipe { file } => match self.split(file) {
                Some((b, "trace_pipe")) => {
                    b.pipe_open = true;
                    Ok(())
                }
                _ => Err(fail(FailureKind::NotFound, file)),
            },
            Action::ClosePipe => {
                self.global.pipe_open = false;
                self.instances
                    .values_mut()
                    .for_each(|b| b.pipe_open = false);
                Ok(())
            }
            Action::Write { file, value, mode } => self.write(file, value, *mode),
        }
    }

    fn write(&mut self, path: &str, value: &str, mode: WriteMode) -> Result<(), TracefsFailure> {
        let (available, forbidden) = (self.available.clone(), self.forbidden.clone());
        let (has_graph, filter_locked) = (self.has_graph, self.filter_locked);
        let Some((b, file)) = self.split(path) else {
            return Err(fail(FailureKind::NotFound, path));
        };
        match file {
            "tracing_on" => match value {
                "0" => b.tracing_on = false,
                "1" => b.tracing_on = true,
                _ => return Err(fail(FailureKind::Rejected, path)),
            },
            "trace" => {}
            "current_tracer" => {
                if b.pipe_open && b.tracer != value {
                    return Err(fail(FailureKind::Busy, path));
                }
                if forbidden.iter().any(|t| t == value) {
                    // The kernel switches to nop before the tracer's init
                    // fails.
                    b.tracer = "nop".into();
                    return Err(fail(FailureKind::Rejected, path));
                }
                if !available.iter().any(|t| t == value) {
                    return Err(fail(FailureKind::Rejected, path));
                }
                b.tracer = value.into();
            }
            "set_ftrace_filter" | "set_graph_function" => {
                let graph = file == "set_graph_function";
                if graph && !has_graph {
                    return Err(fail(FailureKind::NotFound, path));
                }
                if !graph && filter_locked {
                    return Err(fail(FailureKind::NotPermitted, path));
                }
                let list = if graph { &mut b.graph } else { &mut b.filter };
                if mode == WriteMode::Truncate {
                    list.clear();
                }
                if value.contains("nomatch") {
                    return Err(fail(FailureKind::Rejected, path));
                }
                if !value.is_empty() {
                    list.push(value.into());
                }
            }
            _ => return Err(fail(FailureKind::NotFound, path)),
        }
        Ok(())
    }
}

/// The sending end of a fake `trace_pipe`.
pub type PipeSender = mpsc::UnboundedSender<Result<String, TracefsFailure>>;

/// The fake as a [`Tracefs`] port; pipes read lines the test sends.
#[derive(Clone, Default)]
pub struct FakePort {
    /// The shared fake.
    pub fs: Arc<Mutex<FakeTracefs>>,
    /// Senders of the pipes opened so far, in order.
    pub pipes: Arc<Mutex<Vec<PipeSender>>>,
}

impl FakePort {
    /// A port over `fs`.
    pub fn new(fs: FakeTracefs) -> FakePort {
        FakePort {
            fs: Arc::new(Mutex::new(fs)),
            pipes: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// The fake, locked.
    pub fn fs(&self) -> MutexGuard<'_, FakeTracefs> {
        self.fs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The sender of the last pipe opened, if any.
    pub fn last_pipe(&self) -> Option<PipeSender> {
        self.pipes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .last()
            .cloned()
    }

    /// Forgets the pipe senders (so that a reader sees its pipe end).
    pub fn drop_pipes(&self) {
        self.pipes.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }

    /// Sends a line (or failure) into the `n`th opened pipe.
    pub fn send(&self, n: usize, item: Result<String, TracefsFailure>) {
        let pipes = self.pipes.lock().unwrap_or_else(|p| p.into_inner());
        pipes[n].unbounded_send(item).expect("pipe reader alive");
    }
}

impl Tracefs for FakePort {
    fn instances(&self) -> Result<Vec<String>, TracefsFailure> {
        let fs = self.fs();
        if fs.gone {
            return Err(fail(FailureKind::TracefsMissing, "unmounted"));
        }
        Ok(fs.instances.keys().cloned().collect())
    }

    fn mkdir(&self, dir: &str) -> Result<(), TracefsFailure> {
        self.fs().apply(&Action::Mkdir { dir: dir.into() })
    }

    fn rmdir(&self, dir: &str) -> Result<(), TracefsFailure> {
        self.fs().apply(&Action::Rmdir { dir: dir.into() })
    }

    fn write(&self, file: &str, value: &str, mode: WriteMode) -> Result<(), TracefsFailure> {
        self.fs().apply(&Action::Write {
            file: file.into(),
            value: value.into(),
            mode,
        })
    }

    fn open_pipe(&self, file: &str) -> Result<Box<dyn TracePipe>, TracefsFailure> {
        self.fs().apply(&Action::OpenPipe { file: file.into() })?;
        let (tx, rx) = mpsc::unbounded();
        self.pipes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(tx);
        Ok(Box::new(FakePipe {
            fs: self.fs.clone(),
            rx,
            closed: false,
        }))
    }
}

struct FakePipe {
    fs: Arc<Mutex<FakeTracefs>>,
    rx: mpsc::UnboundedReceiver<Result<String, TracefsFailure>>,
    /// Whether a `close` succeeded.
    closed: bool,
}

/// Dropping the reader releases its file whatever a failed `close` said,
/// as the kernel releases a descriptor on `close(2)` even when it reports
/// an error: the fake's pipes are no longer open (not logged: it is no
/// operation of the program's).
impl Drop for FakePipe {
    fn drop(&mut self) {
        if !self.closed {
            self.fs
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .release_pipes();
        }
    }
}

impl Stream for FakePipe {
    type Item = Result<String, TracefsFailure>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Self::Item>> {
        self.rx.poll_next_unpin(cx)
    }
}

impl TracePipe for FakePipe {
    fn close(&mut self) -> Result<(), TracefsFailure> {
        self.rx.close();
        let result = self
            .fs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .apply(&Action::ClosePipe);
        self.closed |= result.is_ok();
        result
    }
}
