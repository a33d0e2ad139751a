//! `trace_session`: the trace session lifecycle under arbitrary requests,
//! tracefs states, injected failures at any operation (several per run,
//! in the start and in the teardown), cancels (also while an operation is
//! outstanding), pipe lines, pipe errors and end of file. Drives either
//! the bare [`TraceSession`] machine or the service's [`run_session`]
//! stream, against the fake in [`crate::tracefs`].
//!
//! Input: `[flags]`, the encoded `TraceRequest` (u16-length-prefixed), the
//! failure schedule (u16-length-prefixed, one byte per tracefs operation
//! in order: `>= 0xF0` injects failure kind `(b & 15) % 7`; `0xE0..0xF0`
//! cancels while that operation is outstanding, machine mode only), then
//! the running script: per step `op % 6`: 0 a line plus newline, 1 a line
//! as is, 2 a pipe error, 3 cancel, 4 end of file on the pipe (service
//! mode), 5 a second session on the same buffer (service mode). Flags:
//! bit 0 instance target, 1 the instance exists, 2 no
//! `set_graph_function`, 3 `set_ftrace_filter` locked, 4 the global buffer
//! left dirty, 5 service mode.
//!
//! Checked: validation failures write nothing; the machine never has two
//! operations outstanding and always finishes; one event per line while
//! running; the error is the first failed start operation's (with the
//! code derived independently) or the pipe's; a cancel stops the start; an
//! opened pipe is closed exactly once; after tracefs vanished only the
//! pipe is closed; an instance the session did not create is not touched;
//! the teardown turns tracing off, closes the pipe before `nop` and
//! `rmdir`, removes the instance last; the fake never answers EBUSY unless
//! closing the pipe failed; at the end the buffer is restored (tracing
//! off, tracer `nop`, filters reset, instance removed) wherever the
//! teardown step for it succeeded; teardown failures are exactly the
//! failed teardown operations; the buffer's claim is released.

use std::sync::Arc;
use std::task::Poll;

use metropolis_core::trace::{
    Action, FailureKind, InstanceName, State, StepFailure, Target, TraceBuffers, TraceError,
    TraceSession, TraceSpec, TracefsFailure,
};
use metropolis_proto::prelude::debug;
use metropolis_service::debug::run_session;
use metropolis_service::status::debug::trace_code;
use prost::Message;

use super::input::Input;
use crate::exec::poll_next;
use crate::tracefs::{FakeBuffer, FakePort, FakeTracefs, KINDS, Op};

/// The instance name used for instance targets.
pub const INSTANCE: &str = "t1";

/// Which part of the lifecycle an operation belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Start,
    Down,
}

struct Scenario {
    request: debug::TraceRequest,
    instance: bool,
    instance_exists: bool,
    has_graph: bool,
    filter_locked: bool,
    dirty: bool,
    schedule: Vec<u8>,
}

impl Scenario {
    fn target(&self) -> Target {
        if self.instance {
            Target::Instance(InstanceName::new(INSTANCE).expect("valid instance name"))
        } else {
            Target::Global
        }
    }

    fn initial_fs(&self) -> FakeTracefs {
        let mut fs = FakeTracefs::new();
        fs.has_graph = self.has_graph;
        fs.filter_locked = self.filter_locked;
        if self.dirty {
            fs.global = FakeBuffer::dirty();
        }
        if self.instance_exists {
            fs.instances.insert(INSTANCE.into(), fs.global.clone());
        }
        fs.schedule = self
            .schedule
            .iter()
            .map(|&b| (b >= 0xF0).then(|| KINDS[usize::from(b & 15) % KINDS.len()]))
            .collect();
        fs
    }

    fn cancel_at(&self, op: usize) -> bool {
        self.schedule
            .get(op)
            .is_some_and(|b| (0xE0..0xF0).contains(b))
    }
}

/// What a run produced.
#[derive(Default)]
struct Record {
    ops: Vec<(Phase, Op)>,
    lines: Vec<String>,
    events: Vec<String>,
    /// The error's code; `Some` with the tracer when it names a tracer.
    error: Option<(tonic::Code, String)>,
    /// Machine mode only.
    teardown_failures: Option<Vec<StepFailure>>,
    reached_running: bool,
    pipe_error: bool,
    cancelled_at: Option<usize>,
    fs: FakeTracefs,
}

fn is_write(a: &Action, name: &str, v: &str) -> bool {
    matches!(a, Action::Write { file, value, .. } if file.ends_with(name) && value == v)
}

/// Whether a failed start operation is tolerated (the clearing write of an
/// empty function or graph filter finding the file missing or locked).
fn tolerated(sc: &Scenario, a: &Action, f: &TracefsFailure) -> bool {
    (sc.request.function_filter.is_empty() && is_write(a, "set_ftrace_filter", "")
        || sc.request.graph_function_filter.is_empty() && is_write(a, "set_graph_function", ""))
        && matches!(f.kind, FailureKind::NotFound | FailureKind::NotPermitted)
}

/// The code a failed start operation must give, derived independently of
/// the service layer's mapping (`metropolis_service::status::debug`): the
/// oracle of this harness and of the trace session's proptest
/// (`service/tests/trace.rs`).
pub fn expected_code(action: &Action, failure: &TracefsFailure) -> tonic::Code {
    use tonic::Code;
    match failure.kind {
        FailureKind::TracefsMissing
        | FailureKind::NotFound
        | FailureKind::NotPermitted
        | FailureKind::Busy => Code::FailedPrecondition,
        FailureKind::Exists if matches!(action, Action::Mkdir { .. }) => Code::FailedPrecondition,
        FailureKind::Rejected
            if matches!(action, Action::Write { file, value, .. }
                if !value.is_empty() && (file.ends_with("current_tracer")
                    || file.ends_with("set_ftrace_filter")
                    || file.ends_with("set_graph_function"))) =>
        {
            Code::InvalidArgument
        }
        _ => Code::Unavailable,
    }
}

/// Splits a log into start and teardown operations the way the lifecycle
/// defines them: the start ends after its first failure that is not
/// tolerated, or after tracing was switched on.
fn split(sc: &Scenario, log: &[Op]) -> Vec<(Phase, Op)> {
    let mut phase = Phase::Start;
    log.iter()
        .map(|op| {
            let this = phase;
            if phase == Phase::Start {
                let failed = matches!(&op.result, Err(f) if !tolerated(sc, &op.action, f));
                let on = op.result.is_ok() && is_write(&op.action, "tracing_on", "1");
                if failed || on {
                    phase = Phase::Down;
                }
            }
            (this, op.clone())
        })
        .collect()
}

fn expected_line(op: u8, line: &str) -> (String, String) {
    if op == 0 {
        (format!("{line}\n"), line.to_string())
    } else {
        let want = line.strip_suffix('\n').unwrap_or(line).to_string();
        (line.to_string(), want)
    }
}

fn run_machine(sc: &Scenario, script: &mut Input) -> Option<Record> {
    let mut s = match TraceSession::from_request(&sc.request, sc.target()) {
        Ok(s) => s,
        Err(e) => {
            assert!(matches!(e, TraceError::Invalid(_)), "{e}");
            assert_eq!(trace_code(&e), tonic::Code::InvalidArgument);
            return None;
        }
    };
    let mut fs = sc.initial_fs();
    let mut r = Record::default();
    for _ in 0..10_000 {
        if let Some(action) = s.poll_action() {
            assert_eq!(s.poll_action(), None, "two actions outstanding");
            let phase = match s.state() {
                State::Starting => Phase::Start,
                State::TearingDown => Phase::Down,
                other => panic!("an action in state {other:?}"),
            };
            let index = fs.log.len();
            let result = fs.apply(&action);
            if sc.cancel_at(index) {
                s.handle_cancel();
                r.cancelled_at.get_or_insert(index);
            }
            s.handle_action_result(result);
            let op = fs.log.last().expect("logged").clone();
            r.ops.push((phase, op));
            continue;
        }
        match s.state() {
            State::Running => {
                r.reached_running = true;
                let op = if script.is_empty() {
                    3
                } else {
                    script.u8() % 6
                };
                match op {
                    0 | 1 => {
                        let line = script.short_string();
                        let (sent, want) = expected_line(op, &line);
                        s.handle_pipe_line(sent);
                        r.lines.push(want);
                        while let Some(e) = s.poll_event() {
                            r.events.push(e.raw_line);
                        }
                    }
                    2 | 4 => {
                        s.handle_pipe_error(TracefsFailure::new(FailureKind::Other, "eof"));
                        r.pipe_error = true;
                    }
                    _ => s.handle_cancel(),
                }
            }
            State::Finished => {
                assert_eq!(s.poll_action(), None);
                // Late inputs are ignored.
                s.handle_pipe_line("late".into());
                s.handle_cancel();
                assert_eq!(s.poll_event(), None, "an event after the end");
                assert_eq!(s.state(), State::Finished);
                r.error = s.error().map(|e| (trace_code(e), e.to_string()));
                r.teardown_failures = Some(s.teardown_failures().to_vec());
                r.fs = fs;
                return Some(r);
            }
            state => panic!("machine stalled in {state:?} with no action"),
        }
    }
    panic!("the session did not finish within 10000 steps");
}

fn run_service(sc: &Scenario, script: &mut Input) -> Option<Record> {
    let port = FakePort::new(sc.initial_fs());
    let buffers = TraceBuffers::new();
    let target = sc.target();
    let mut r = Record::default();
    match run_session(
        Arc::new(port.clone()),
        &buffers,
        target.clone(),
        &sc.request,
    ) {
        Err(e) => {
            assert!(
                !buffers.is_claimed(&target),
                "claim kept after a failed start"
            );
            if let TraceError::Invalid(_) = e {
                assert!(port.fs().log.is_empty(), "a write for an invalid request");
                assert_eq!(trace_code(&e), tonic::Code::InvalidArgument);
                assert!(TraceSpec::from_request(&sc.request).is_err());
                return None;
            }
            r.error = Some((trace_code(&e), e.to_string()));
        }
        Ok(mut stream) => {
            assert!(buffers.is_claimed(&target), "running without a claim");
            r.reached_running = true;
            loop {
                let op = if script.is_empty() {
                    3
                } else {
                    script.u8() % 6
                };
                let pipe = port.last_pipe().expect("a running session has a pipe");
                match op {
                    0 | 1 => {
                        let line = script.short_string();
                        let (sent, want) = expected_line(op, &line);
                        pipe.unbounded_send(Ok(sent)).expect("pipe reader alive");
                        r.lines.push(want);
                        match poll_next(&mut stream) {
                            Poll::Ready(Some(Ok(e))) => r.events.push(e.raw_line),
                            other => panic!("a line gave {other:?}"),
                        }
                        assert!(poll_next(&mut stream).is_pending(), "more than one event");
                    }
                    2 | 4 => {
                        if op == 2 {
                            let failure = TracefsFailure::new(FailureKind::Other, "EIO");
                            pipe.unbounded_send(Err(failure))
                                .expect("pipe reader alive");
                        } else {
                            drop(pipe);
                            port.drop_pipes();
                        }
                        r.pipe_error = true;
                        let status = match poll_next(&mut stream) {
                            Poll::Ready(Some(Err(status))) => status,
                            other => panic!("a pipe failure gave {other:?}"),
                        };
                        assert!(matches!(poll_next(&mut stream), Poll::Ready(None)));
                        assert!(!buffers.is_claimed(&target), "claim kept after the end");
                        let down_failed = split(sc, &port.fs().log)
                            .iter()
                            .any(|(p, op)| *p == Phase::Down && op.result.is_err());
                        assert_eq!(
                            status.message().contains("restoring tracefs also failed"),
                            down_failed,
                            "{status}"
                        );
                        r.error = Some((status.code(), status.message().to_string()));
                        break;
                    }
                    5 => {
                        let before = port.fs().log.len();
                        let second = run_session(
                            Arc::new(port.clone()),
                            &buffers,
                            target.clone(),
                            &sc.request,
                        );
                        let e = second.expect_err("a second session on a claimed buffer");
                        assert!(matches!(e, TraceError::AlreadyInProgress { .. }), "{e}");
                        assert_eq!(trace_code(&e), tonic::Code::FailedPrecondition);
                        assert_eq!(port.fs().log.len(), before, "the second session wrote");
                    }
                    _ => {
                        drop(stream);
                        assert!(!buffers.is_claimed(&target), "claim kept after a cancel");
                        break;
                    }
                }
            }
        }
    }
    let fs = port.fs().clone();
    r.ops = split(sc, &fs.log);
    r.fs = fs;
    Some(r)
}

/// Checks every property of one finished run.
fn check(sc: &Scenario, r: &Record) {
    let start: Vec<&Op> = r
        .ops
        .iter()
        .filter(|(p, _)| *p == Phase::Start)
        .map(|(_, op)| op)
        .collect();
    let down: Vec<&Op> = r
        .ops
        .iter()
        .filter(|(p, _)| *p == Phase::Down)
        .map(|(_, op)| op)
        .collect();
    let failed_down: Vec<StepFailure> = down
        .iter()
        .filter_map(|op| {
            op.result.clone().err().map(|failure| StepFailure {
                action: op.action.clone(),
                failure,
            })
        })
        .collect();
    if let Some(tf) = &r.teardown_failures {
        assert_eq!(tf, &failed_down, "teardown failures");
    }
    let down_failed = |pred: &dyn Fn(&Action) -> bool| failed_down.iter().any(|f| pred(&f.action));

    if r.reached_running {
        assert_eq!(r.events, r.lines, "events");
    } else {
        assert!(r.events.is_empty(), "events without running");
    }

    // The error is the first failed start operation's, or the pipe's.
    let first_failure = start.iter().find_map(|op| match &op.result {
        Err(f) if !tolerated(sc, &op.action, f) => Some((&op.action, f)),
        _ => None,
    });
    match (first_failure, &r.error) {
        (Some((a, f)), Some((code, message))) => {
            assert_eq!(*code, expected_code(a, f), "{message} for {a}");
            if is_write(a, "current_tracer", &sc.request.tracer) && f.kind == FailureKind::Rejected
            {
                assert!(message.contains(&sc.request.tracer), "{message}");
            }
            assert!(!r.reached_running, "running after a failed start");
        }
        (Some((a, f)), None) => panic!("start failed at {a} ({f}) but no error"),
        (None, Some((code, message))) => {
            assert!(
                r.reached_running && r.pipe_error,
                "unexpected error {message}"
            );
            assert_eq!(*code, tonic::Code::Unavailable, "{message}");
        }
        (None, None) => assert!(!(r.reached_running && r.pipe_error), "pipe error lost"),
    }

    // A cancel stops the start.
    if let Some(k) = r.cancelled_at {
        assert!(
            r.ops.iter().skip(k + 1).all(|(p, _)| *p != Phase::Start),
            "a start operation after the cancel"
        );
    }

    // EBUSY only comes from the fake when a pipe is still open.
    let close_failed_before = |i: usize| {
        r.ops[..i]
            .iter()
            .any(|(_, op)| op.action == Action::ClosePipe && op.result.is_err())
    };
    for (i, (_, op)) in r.ops.iter().enumerate() {
        if let Err(f) = &op.result
            && !op.injected
            && f.kind == FailureKind::Busy
        {
            assert!(
                close_failed_before(i),
                "{} while the pipe was open",
                op.action
            );
        }
    }

    // An opened pipe is closed exactly once, even with tracefs gone.
    let opened = r
        .ops
        .iter()
        .any(|(_, op)| matches!(op.action, Action::OpenPipe { .. }) && op.result.is_ok());
    let closes = down
        .iter()
        .filter(|op| op.action == Action::ClosePipe)
        .count();
    assert_eq!(
        usize::from(opened),
        closes,
        "pipe opened {opened}, closed {closes} times"
    );

    // After tracefs vanished, only the pipe is closed.
    if let Some(gone) = r
        .ops
        .iter()
        .position(|(_, op)| matches!(&op.result, Err(f) if f.kind == FailureKind::TracefsMissing))
    {
        assert!(
            r.ops[gone + 1..]
                .iter()
                .all(|(_, op)| op.action == Action::ClosePipe),
            "operations after tracefs vanished"
        );
        return;
    }

    let mkdir_ok = r
        .ops
        .iter()
        .any(|(_, op)| matches!(op.action, Action::Mkdir { .. }) && op.result.is_ok());
    if sc.instance && !mkdir_ok {
        assert_eq!(r.ops.len(), 1, "operations on an instance not ours");
        assert_eq!(sc.instance_exists, r.fs.instances.contains_key(INSTANCE));
        return;
    }

    // The teardown has the required steps, in a kernel-acceptable order.
    let pos = |pred: &dyn Fn(&Action) -> bool| down.iter().position(|op| pred(&op.action));
    let off = pos(&|a| is_write(a, "tracing_on", "0"));
    let nop = pos(&|a| is_write(a, "current_tracer", "nop"));
    let close = pos(&|a| *a == Action::ClosePipe);
    let rmdir = pos(&|a| matches!(a, Action::Rmdir { .. }));
    assert!(
        off.is_some() && nop.is_some(),
        "teardown lacks tracing off or nop"
    );
    assert_eq!(
        mkdir_ok,
        rmdir.is_some(),
        "rmdir iff the instance was created"
    );
    if let Some(c) = close {
        assert!(
            nop > Some(c) && rmdir.is_none_or(|r| r > c),
            "pipe closed late"
        );
    }
    assert!(rmdir.is_none_or(|r| r == down.len() - 1), "rmdir not last");

    // The end state: every successful teardown step's effect holds.
    let wrote_ok = |name: &str| {
        start.iter().any(|op| {
            op.result.is_ok()
                && matches!(&op.action, Action::Write { file, .. } if file.ends_with(name))
        })
    };
    let initial = sc.initial_fs();
    let (buffer, initial_buffer) = if sc.instance {
        let removed = !r.fs.instances.contains_key(INSTANCE);
        assert_eq!(
            removed,
            !down_failed(&|a| matches!(a, Action::Rmdir { .. })),
            "instance removed iff rmdir succeeded"
        );
        if removed {
            return;
        }
        (&r.fs.instances[INSTANCE], FakeBuffer::fresh())
    } else {
        (&r.fs.global, initial.global.clone())
    };
    let close_failed = down_failed(&|a| *a == Action::ClosePipe);
    assert!(!buffer.pipe_open || close_failed, "pipe left open");
    assert!(
        !buffer.tracing_on || down_failed(&|a| is_write(a, "tracing_on", "0")),
        "tracing left on"
    );
    assert!(
        buffer.tracer == "nop" || down_failed(&|a| is_write(a, "current_tracer", "nop")),
        "tracer {} left",
        buffer.tracer
    );
    for (name, now, before) in [
        ("set_ftrace_filter", &buffer.filter, &initial_buffer.filter),
        ("set_graph_function", &buffer.graph, &initial_buffer.graph),
    ] {
        let reset_failed = down_failed(&|a| is_write(a, name, ""));
        if wrote_ok(name) {
            assert!(now.is_empty() || reset_failed, "{name} not reset: {now:?}");
        } else {
            assert!(
                now.is_empty() || now == before || reset_failed,
                "{name} changed: {now:?}"
            );
        }
    }
}

/// Runs one input; panics if a property fails.
pub fn run(data: &[u8]) {
    let mut input = Input::new(data);
    let flags = input.u8();
    let Ok(request) = debug::TraceRequest::decode(input.lp()) else {
        return;
    };
    let sc = Scenario {
        request,
        instance: flags & 1 != 0,
        instance_exists: flags & 2 != 0,
        has_graph: flags & 4 == 0,
        filter_locked: flags & 8 != 0,
        dirty: flags & 16 != 0,
        schedule: input.lp().to_vec(),
    };
    let record = if flags & 32 == 0 {
        run_machine(&sc, &mut input)
    } else {
        run_service(&sc, &mut input)
    };
    if let Some(r) = record {
        check(&sc, &r);
    }
}
