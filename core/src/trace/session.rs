//! The trace session machine: the tracefs operations of one session, in
//! order, including the teardown that always runs.

use std::collections::VecDeque;

use metropolis_proto::prelude::debug;

use super::action::{Action, StepFailure};
use super::buffers::Target;
use super::error::TraceError;
use super::port::{FailureKind, TracefsFailure, WriteMode};
use super::validate::{Field, TraceSpec};

/// Where a session is in its lifecycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// Setting up the buffer; actions to perform.
    Starting,
    /// Tracing: feed `trace_pipe` lines, drain events, until cancel or a
    /// pipe error.
    Running,
    /// Restoring tracefs; actions to perform.
    TearingDown,
    /// Done; see [`TraceSession::error`] and
    /// [`TraceSession::teardown_failures`].
    Finished,
}

/// One step of the lifecycle; each maps to one [`Action`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    Mkdir,
    TracingOff,
    ClearBuffer,
    SetTracer,
    /// Index into the function filter; `0` with an empty filter is the
    /// clearing write.
    SetFilter(usize),
    SetGraph(usize),
    OpenPipe,
    TracingOn,
    // Teardown.
    DownTracingOff,
    DownClosePipe,
    DownTracerNop,
    DownFilterReset,
    DownGraphReset,
    DownRmdir,
}

/// Pattern `i` of a filter, or the clearing empty write of one with no
/// patterns.
fn pattern_or_clear(patterns: &[String], i: usize) -> &str {
    patterns.get(i).map_or("", String::as_str)
}

/// The lifecycle of one trace session on one buffer, as a sans-IO machine:
/// it says which tracefs operations to perform, in which order, and turns
/// `trace_pipe` lines into `TraceEvent`s. It performs no I/O itself.
///
/// # Lifecycle
///
/// Start, stopping at the first failure:
/// 1. `mkdir instances/<name>` (instance targets only);
/// 2. `tracing_on` ← `0` (a buffer found on, as the global one is after
///    boot, records nothing of the setup);
/// 3. `trace` ← truncated: empties the ring buffer, so the stream starts
///    with this session's events, not what was recorded before;
/// 4. `current_tracer` ← the tracer (a refusal is
///    [`TraceError::TracerRefused`], naming it);
/// 5. `set_ftrace_filter`: the patterns, the first with a truncating open
///    (which empties the filter) and the rest appended; with no patterns,
///    one truncating empty write clears it, meaning every function. If that
///    clearing write finds the file missing (no dynamic ftrace) or not
///    permitted (kernel lockdown: function tracing is impossible anyway),
///    the session goes on and the file counts as untouched;
/// 6. `set_graph_function`: the same (a graph filter someone left, e.g.
///    a teardown whose reset failed, would otherwise silently narrow a
///    later `function_graph` trace). With patterns, a missing file is
///    [`TraceError::FileMissing`] naming it; the clearing write tolerates
///    a missing file (a kernel without the graph tracer) or a refusal as
///    step 5 does;
/// 7. open `trace_pipe` (before tracing starts, so nothing is missed);
/// 8. `tracing_on` ← `1`: [`State::Running`].
///
/// Teardown, entered on any start failure, [`TraceSession::handle_cancel`]
/// or [`TraceSession::handle_pipe_error`], and run to the end even when a
/// step fails (failures are collected in
/// [`TraceSession::teardown_failures`]):
/// 1. `tracing_on` ← `0`: stop recording first;
/// 2. close `trace_pipe` (if opened): the kernel refuses the next two
///    steps with `EBUSY` while a reader is open;
/// 3. `current_tracer` ← `nop`;
/// 4. `set_ftrace_filter` reset by a truncating empty write, if step 5
///    touched it;
/// 5. `set_graph_function` likewise, if step 6 touched it;
/// 6. `rmdir instances/<name>`, if step 1 created it.
///
/// Steps 1 and 3 run whatever the start reached, so a buffer left tracing
/// or with a tracer by someone before the session ends up off and `nop`.
/// Nothing is done to an instance the session did not create (its `mkdir`
/// failed, e.g. it existed). Once an operation reports
/// [`FailureKind::TracefsMissing`] (tracefs gone), only the pipe is still
/// closed: every other step would fail the same way.
///
/// # Driving contract
///
/// The owner holds the machine and a tracefs (see [`super::Tracefs`]):
/// 1. Loop: take [`TraceSession::poll_action`]; perform it; report its
///    result with [`TraceSession::handle_action_result`]. Exactly one
///    action is outstanding at a time: `poll_action` returns `None` until
///    the result is reported. When it returns `None` with nothing
///    outstanding, look at [`TraceSession::state`].
/// 2. [`State::Running`]: feed each `trace_pipe` line to
///    [`TraceSession::handle_pipe_line`] and send what
///    [`TraceSession::poll_event`] yields (one event per line; the queue is
///    not bounded, so drain it after each line). A read error or end of
///    file goes to [`TraceSession::handle_pipe_error`]; the client going
///    away or a server shutdown to [`TraceSession::handle_cancel`]. Both
///    start the teardown: go back to step 1.
/// 3. [`State::Finished`]: [`TraceSession::error`] says why (for the
///    client), [`TraceSession::teardown_failures`] what could not be
///    restored (for the log). Nothing more happens.
///
/// `handle_cancel` may come at any time, also while an action is
/// outstanding (its result is still awaited; the teardown follows).
///
/// Same inputs, same outputs: the machine has no clock or randomness.
#[derive(Debug)]
pub struct TraceSession {
    spec: TraceSpec,
    target: Target,
    state: State,
    /// Next start step, while [`State::Starting`].
    next: Option<Step>,
    teardown: VecDeque<Step>,
    /// The step whose action was handed out and whose result is awaited.
    outstanding: Option<Step>,
    events: VecDeque<debug::TraceEvent>,
    error: Option<TraceError>,
    cancel_requested: bool,
    teardown_failures: Vec<StepFailure>,
    instance_created: bool,
    pipe_open: bool,
    filter_touched: bool,
    graph_touched: bool,
    tracefs_gone: bool,
}

impl TraceSession {
    /// A session tracing `spec` into `target`, about to start. The caller
    /// has claimed `target` (see [`super::TraceBuffers`]).
    pub fn new(spec: TraceSpec, target: Target) -> TraceSession {
        let first = match target {
            Target::Global => Step::TracingOff,
            Target::Instance(_) => Step::Mkdir,
        };
        TraceSession {
            spec,
            target,
            state: State::Starting,
            next: Some(first),
            teardown: VecDeque::new(),
            outstanding: None,
            events: VecDeque::new(),
            error: None,
            cancel_requested: false,
            teardown_failures: Vec::new(),
            instance_created: false,
            pipe_open: false,
            filter_touched: false,
            graph_touched: false,
            tracefs_gone: false,
        }
    }

    /// Validates `request` and makes a session, or returns the validation
    /// error (nothing to perform then).
    pub fn from_request(
        request: &debug::TraceRequest,
        target: Target,
    ) -> Result<TraceSession, TraceError> {
        Ok(TraceSession::new(TraceSpec::from_request(request)?, target))
    }

    /// The validated request.
    pub fn spec(&self) -> &TraceSpec {
        &self.spec
    }

    /// The buffer traced into.
    pub fn target(&self) -> &Target {
        &self.target
    }

    /// Where the session is.
    pub fn state(&self) -> State {
        self.state
    }

    /// Whether the session is [`State::Finished`].
    pub fn is_finished(&self) -> bool {
        self.state == State::Finished
    }

    /// Why the session failed or ended: the first start failure, or the
    /// pipe error. `None` while it runs, and at the end when it was
    /// cancelled by its owner.
    pub fn error(&self) -> Option<&TraceError> {
        self.error.as_ref()
    }

    /// The teardown operations that failed, in order.
    pub fn teardown_failures(&self) -> &[StepFailure] {
        &self.teardown_failures
    }

    /// The next operation to perform, if any (see the driving contract).
    pub fn poll_action(&mut self) -> Option<Action> {
        if self.outstanding.is_some() {
            return None;
        }
        let step = match self.state {
            State::Starting => self.next.take()?,
            State::TearingDown => self.teardown.pop_front()?,
            State::Running | State::Finished => return None,
        };
        self.outstanding = Some(step);
        // Counted as touched from the attempt on: a write can fail after
        // the truncating open already emptied the filter.
        match step {
            Step::SetFilter(_) => self.filter_touched = true,
            Step::SetGraph(_) => self.graph_touched = true,
            _ => {}
        }
        Some(self.action(step))
    }

    /// Reports the result of the action last returned by
    /// [`TraceSession::poll_action`]. Ignored if no action is outstanding.
    pub fn handle_action_result(&mut self, result: Result<(), TracefsFailure>) {
        let Some(step) = self.outstanding.take() else {
            debug_assert!(false, "handle_action_result without an outstanding action");
            return;
        };
        match self.state {
            State::Starting => self.start_result(step, result),
            State::TearingDown => self.teardown_result(step, result),
            State::Running | State::Finished => {}
        }
    }

    /// Feeds one `trace_pipe` line (its trailing newline, if still there,
    /// is dropped). Queues one event while [`State::Running`]; ignored
    /// otherwise.
    pub fn handle_pipe_line(&mut self, mut line: String) {
        if self.state != State::Running {
            return;
        }
        if line.ends_with('\n') {
            line.pop();
        }
        self.events.push_back(debug::TraceEvent { raw_line: line });
    }

    /// Reports that reading `trace_pipe` failed or hit its end: the
    /// session fails with [`TraceError::PipeFailed`] and tears down.
    /// Ignored unless [`State::Running`].
    pub fn handle_pipe_error(&mut self, failure: TracefsFailure) {
        if self.state == State::Running {
            self.error = Some(TraceError::PipeFailed { failure });
            self.enter_teardown();
        }
    }

    /// The client went away or the server shuts down: tear down. While
    /// starting with an action outstanding, the teardown follows its
    /// result. Ignored once tearing down or finished.
    pub fn handle_cancel(&mut self) {
        match self.state {
            State::Starting if self.outstanding.is_some() => self.cancel_requested = true,
            State::Starting | State::Running => self.enter_teardown(),
            State::TearingDown | State::Finished => {}
        }
    }

    /// The next event for the client.
    pub fn poll_event(&mut self) -> Option<debug::TraceEvent> {
        self.events.pop_front()
    }

    fn action(&self, step: Step) -> Action {
        let t = &self.target;
        let write = |name: &str, value: &str, mode| Action::Write {
            file: t.file(name),
            value: value.to_owned(),
            mode,
        };
        let dir = || {
            t.instance_dir()
                .expect("instance steps are only planned for instance targets")
        };
        let pattern_mode = |i: usize| {
            if i == 0 {
                WriteMode::Truncate
            } else {
                WriteMode::Append
            }
        };
        match step {
            Step::Mkdir => Action::Mkdir { dir: dir() },
            Step::TracingOff | Step::DownTracingOff => {
                write("tracing_on", "0", WriteMode::Truncate)
            }
            Step::ClearBuffer => write("trace", "", WriteMode::Truncate),
            Step::SetTracer => write("current_tracer", self.spec.tracer(), WriteMode::Truncate),
            Step::SetFilter(i) => write(
                "set_ftrace_filter",
                pattern_or_clear(self.spec.function_filter(), i),
                pattern_mode(i),
            ),
            Step::SetGraph(i) => write(
                "set_graph_function",
                pattern_or_clear(self.spec.graph_function_filter(), i),
                pattern_mode(i),
            ),
            Step::OpenPipe => Action::OpenPipe {
                file: t.file("trace_pipe"),
            },
            Step::TracingOn => write("tracing_on", "1", WriteMode::Truncate),
            Step::DownClosePipe => Action::ClosePipe,
            Step::DownTracerNop => write("current_tracer", "nop", WriteMode::Truncate),
            Step::DownFilterReset => write("set_ftrace_filter", "", WriteMode::Truncate),
            Step::DownGraphReset => write("set_graph_function", "", WriteMode::Truncate),
            Step::DownRmdir => Action::Rmdir { dir: dir() },
        }
    }

    /// The start step after `step` succeeded; `None` after the last.
    fn step_after(&self, step: Step) -> Option<Step> {
        let filters = self.spec.function_filter().len();
        let graphs = self.spec.graph_function_filter().len();
        Some(match step {
            Step::Mkdir => Step::TracingOff,
            Step::TracingOff => Step::ClearBuffer,
            Step::ClearBuffer => Step::SetTracer,
            Step::SetTracer => Step::SetFilter(0),
            Step::SetFilter(i) if i + 1 < filters => Step::SetFilter(i + 1),
            Step::SetFilter(_) => Step::SetGraph(0),
            Step::SetGraph(i) if i + 1 < graphs => Step::SetGraph(i + 1),
            Step::SetGraph(_) => Step::OpenPipe,
            Step::OpenPipe => Step::TracingOn,
            _ => return None,
        })
    }

    fn start_result(&mut self, step: Step, result: Result<(), TracefsFailure>) {
        match result {
            Ok(()) => match step {
                Step::Mkdir => self.instance_created = true,
                Step::OpenPipe => self.pipe_open = true,
                _ => {}
            },
            Err(failure) => {
                let opened = !matches!(
                    failure.kind,
                    FailureKind::NotFound | FailureKind::NotPermitted | FailureKind::TracefsMissing
                );
                match step {
                    // A first filter write that could not even open the
                    // file changed nothing.
                    Step::SetFilter(0) if !opened => self.filter_touched = false,
                    Step::SetGraph(0) if !opened => self.graph_touched = false,
                    _ => {}
                }
                // The clearing write of a filter given no patterns.
                let clearing = matches!(self.filter_of(step), Some((_, [], 0)));
                let tolerated = clearing
                    && matches!(
                        failure.kind,
                        FailureKind::NotFound | FailureKind::NotPermitted
                    );
                if !tolerated {
                    if failure.kind == FailureKind::TracefsMissing {
                        self.tracefs_gone = true;
                    }
                    self.error = Some(self.classify(step, failure));
                    self.enter_teardown();
                    return;
                }
            }
        }
        if self.cancel_requested {
            self.enter_teardown();
            return;
        }
        match self.step_after(step) {
            Some(next) => self.next = Some(next),
            None => self.state = State::Running,
        }
    }

    fn teardown_result(&mut self, step: Step, result: Result<(), TracefsFailure>) {
        match result {
            Ok(()) => match step {
                Step::DownClosePipe => self.pipe_open = false,
                Step::DownRmdir => self.instance_created = false,
                _ => {}
            },
            Err(failure) => {
                if failure.kind == FailureKind::TracefsMissing {
                    self.tracefs_gone = true;
                    self.teardown.retain(|s| *s == Step::DownClosePipe);
                }
                self.teardown_failures.push(StepFailure {
                    action: self.action(step),
                    failure,
                });
            }
        }
        self.finish_if_done();
    }

    fn enter_teardown(&mut self) {
        self.state = State::TearingDown;
        self.next = None;
        let ours = matches!(self.target, Target::Global) || self.instance_created;
        let alive = ours && !self.tracefs_gone;
        let plan = [
            (Step::DownTracingOff, alive),
            (Step::DownClosePipe, self.pipe_open),
            (Step::DownTracerNop, alive),
            (Step::DownFilterReset, alive && self.filter_touched),
            (Step::DownGraphReset, alive && self.graph_touched),
            (Step::DownRmdir, alive && self.instance_created),
        ];
        self.teardown = plan
            .into_iter()
            .filter_map(|(step, wanted)| wanted.then_some(step))
            .collect();
        self.finish_if_done();
    }

    fn finish_if_done(&mut self) {
        if self.state == State::TearingDown
            && self.teardown.is_empty()
            && self.outstanding.is_none()
        {
            self.state = State::Finished;
        }
    }

    /// A filter step's field, its filter's patterns, and the index it
    /// writes; `None` for the other steps.
    fn filter_of(&self, step: Step) -> Option<(Field, &[String], usize)> {
        match step {
            Step::SetFilter(i) => Some((Field::FunctionFilter(i), self.spec.function_filter(), i)),
            Step::SetGraph(i) => Some((
                Field::GraphFunctionFilter(i),
                self.spec.graph_function_filter(),
                i,
            )),
            _ => None,
        }
    }

    /// The error a failed start step means for the client.
    fn classify(&self, step: Step, failure: TracefsFailure) -> TraceError {
        // A pattern the kernel refused (not the clearing write of none).
        if failure.kind == FailureKind::Rejected
            && let Some((field, patterns, i)) = self.filter_of(step)
            && let Some(pattern) = patterns.get(i)
        {
            return TraceError::FilterRefused {
                field,
                pattern: pattern.clone(),
                failure,
            };
        }
        let file = match self.action(step) {
            Action::Mkdir { dir } | Action::Rmdir { dir } => dir,
            Action::Write { file, .. } | Action::OpenPipe { file } => file,
            Action::ClosePipe => self.target.file("trace_pipe"),
        };
        match (step, failure.kind) {
            (_, FailureKind::TracefsMissing) => TraceError::TracefsMissing { failure },
            (Step::Mkdir, FailureKind::Exists) => match &self.target {
                Target::Instance(instance) => TraceError::InstanceExists {
                    instance: instance.clone(),
                },
                Target::Global => TraceError::Io { file, failure },
            },
            (Step::SetTracer, FailureKind::Rejected) => TraceError::TracerRefused {
                tracer: self.spec.tracer().to_owned(),
                failure,
            },
            (_, FailureKind::NotFound) => TraceError::FileMissing { file, failure },
            (_, FailureKind::NotPermitted) => TraceError::NotPermitted { file, failure },
            (_, FailureKind::Busy) => TraceError::Busy { file, failure },
            _ => TraceError::Io { file, failure },
        }
    }
}
