//! Properties of the trace session machine (`metropolis_core::trace`),
//! driven against the fake tracefs with failures injected at every step
//! and cancels at any point, plus the validation rules, the `run_session`
//! driver and the status codes its errors become (`status::debug`).

use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use futures::StreamExt;
use metropolis_proto::prelude::debug;
use proptest::prelude::*;

use metropolis_core::trace::{
    Action, FailureKind, Field, InstanceName, MAX_MODULE_LEN, MAX_NAME_LEN, MAX_PATTERN_LEN,
    MAX_PATTERNS, Problem, State, StepFailure, Target, TraceBuffers, TraceError, TraceSession,
    TraceSpec, TracefsFailure, ValidationError, remove_stale_instances,
};
use metropolis_service::debug::{TraceStream, run_session};
use metropolis_service::status::debug::trace_code;
use metropolis_testkit::fuzz::trace::expected_code;
use metropolis_testkit::tracefs::{FakeBuffer, FakePort, FakeTracefs};

/// Where proptest keeps this file's failing cases: next to it
/// (`<file>.proptest-regressions`; the default looks for a `src/` that an
/// integration test is not in).
fn regressions() -> proptest::test_runner::FileFailurePersistence {
    proptest::test_runner::FileFailurePersistence::WithSource("proptest-regressions")
}

fn request(tracer: &str, filters: &[&str], graphs: &[&str]) -> debug::TraceRequest {
    debug::TraceRequest {
        tracer: tracer.into(),
        function_filter: filters.iter().map(|s| s.to_string()).collect(),
        graph_function_filter: graphs.iter().map(|s| s.to_string()).collect(),
    }
}

fn instance(name: &str) -> Target {
    Target::Instance(InstanceName::new(name).expect("test instance name"))
}

/// One generated run.
#[derive(Clone, Debug)]
struct Scenario {
    tracer: &'static str,
    filters: Vec<&'static str>,
    graphs: Vec<&'static str>,
    instance: bool,
    instance_exists: bool,
    has_graph: bool,
    filter_locked: bool,
    dirty: bool,
    fail_at: Option<(usize, FailureKind)>,
    cancel_at: Option<usize>,
    lines: Vec<String>,
    pipe_error: bool,
}

fn arb_kind() -> impl Strategy<Value = FailureKind> {
    prop_oneof![
        Just(FailureKind::TracefsMissing),
        Just(FailureKind::NotFound),
        Just(FailureKind::NotPermitted),
        Just(FailureKind::Rejected),
        Just(FailureKind::Busy),
        Just(FailureKind::Exists),
        Just(FailureKind::Other),
    ]
}

fn arb_scenario() -> impl Strategy<Value = Scenario> {
    // Mostly accepted values, so that many runs reach the running state.
    let names = prop_oneof![
        6 => prop::sample::select(vec!["nop", "blk", "function_graph"]),
        1 => Just("function"),
        1 => Just("bogus"),
    ];
    let filter = prop_oneof![
        8 => prop::sample::select(vec!["vfs_*", "do_sys_open", "*", "!x*", "*:mod:ext4"]),
        1 => Just("nomatch_fn"),
    ];
    let graph = prop_oneof![4 => Just("schedule"), 1 => Just("nomatch_g")];
    (
        (
            names,
            prop::collection::vec(filter, 0..3),
            prop::collection::vec(graph, 0..3),
            any::<bool>(),
            prop::bool::weighted(0.1),
        ),
        (any::<bool>(), prop::bool::weighted(0.3), any::<bool>()),
        (
            prop::option::weighted(0.8, (0usize..16, arb_kind())),
            prop::option::weighted(0.5, 0usize..16),
            prop::collection::vec("[a-z ]{0,12}", 0..4),
            any::<bool>(),
        ),
    )
        .prop_map(
            |(
                (tracer, filters, graphs, instance, instance_exists),
                (has_graph, filter_locked, dirty),
                (fail_at, cancel_at, lines, pipe_error),
            )| Scenario {
                tracer,
                filters,
                graphs,
                instance,
                instance_exists,
                has_graph,
                filter_locked,
                dirty,
                fail_at,
                cancel_at,
                lines,
                pipe_error,
            },
        )
}

impl Scenario {
    fn target(&self) -> Target {
        if self.instance {
            instance("t1")
        } else {
            Target::Global
        }
    }

    fn initial_fs(&self) -> FakeTracefs {
        let mut fs = FakeTracefs::new();
        fs.has_graph = self.has_graph;
        fs.filter_locked = self.filter_locked;
        fs.fail_at = self.fail_at;
        if self.dirty {
            fs.global = FakeBuffer {
                tracing_on: true,
                tracer: "blk".into(),
                filter: vec!["old".into()],
                graph: vec!["oldg".into()],
                pipe_open: false,
            };
        }
        if self.instance_exists {
            fs.instances.insert("t1".into(), fs.global.clone());
        }
        fs
    }
}

/// What a run produced.
#[derive(Debug, PartialEq)]
struct Record {
    /// Each action with the state it was handed out in and its result.
    log: Vec<(State, Action, Result<(), TracefsFailure>)>,
    events: Vec<String>,
    error: Option<TraceError>,
    teardown_failures: Vec<StepFailure>,
    reached_running: bool,
    fs: FakeTracefs,
}

fn run(sc: &Scenario) -> Record {
    let req = request(sc.tracer, &sc.filters, &sc.graphs);
    let mut s = TraceSession::from_request(&req, sc.target()).expect("valid generated request");
    let mut fs = sc.initial_fs();
    let mut log = Vec::new();
    let mut events = Vec::new();
    let mut reached_running = false;
    for _ in 0..1000 {
        if let Some(action) = s.poll_action() {
            assert_eq!(
                s.poll_action(),
                None,
                "a second action while one is outstanding"
            );
            let state = s.state();
            let result = fs.apply(&action);
            if sc.cancel_at == Some(log.len()) {
                s.handle_cancel();
            }
            s.handle_action_result(result.clone());
            log.push((state, action, result));
            continue;
        }
        match s.state() {
            State::Running => {
                reached_running = true;
                for line in &sc.lines {
                    s.handle_pipe_line(format!("{line}\n"));
                    while let Some(e) = s.poll_event() {
                        events.push(e.raw_line);
                    }
                }
                if sc.pipe_error {
                    s.handle_pipe_error(TracefsFailure::new(FailureKind::Other, "eof"));
                } else {
                    s.handle_cancel();
                }
                assert_ne!(s.state(), State::Running);
            }
            State::Finished => {
                assert_eq!(s.poll_action(), None);
                return Record {
                    log,
                    events,
                    error: s.error().cloned(),
                    teardown_failures: s.teardown_failures().to_vec(),
                    reached_running,
                    fs,
                };
            }
            state => panic!("machine stalled in {state:?} with no action"),
        }
    }
    panic!("teardown did not complete within 1000 steps");
}

fn is_write(a: &Action, name: &str, v: &str) -> bool {
    matches!(a, Action::Write { file, value, .. } if file.ends_with(name) && value == v)
}

/// Checks every property of one finished run.
fn check(sc: &Scenario, r: &Record) -> Result<(), TestCaseError> {
    let start: Vec<_> = r
        .log
        .iter()
        .filter(|(s, ..)| *s == State::Starting)
        .collect();
    let down: Vec<_> = r
        .log
        .iter()
        .filter(|(s, ..)| *s == State::TearingDown)
        .collect();

    // Teardown failures are exactly the failed teardown operations.
    let failed_down: Vec<StepFailure> = down
        .iter()
        .filter_map(|(_, a, res)| {
            res.clone().err().map(|failure| StepFailure {
                action: a.clone(),
                failure,
            })
        })
        .collect();
    prop_assert_eq!(&r.teardown_failures, &failed_down);
    let down_failed = |pred: &dyn Fn(&Action) -> bool| failed_down.iter().any(|f| pred(&f.action));

    // Events: one per line, in order, only once running.
    if r.reached_running {
        prop_assert_eq!(&r.events, &sc.lines);
    } else {
        prop_assert!(r.events.is_empty());
    }

    // The start error is the first failed start action (unless tolerated).
    // The clearing writes (no patterns) tolerate a missing or locked file.
    let tolerated = |a: &Action, f: &TracefsFailure| {
        (sc.filters.is_empty() && is_write(a, "set_ftrace_filter", "")
            || sc.graphs.is_empty() && is_write(a, "set_graph_function", ""))
            && matches!(f.kind, FailureKind::NotFound | FailureKind::NotPermitted)
    };
    let first_failure = start.iter().find_map(|(_, a, res)| match res {
        Err(f) if !tolerated(a, f) => Some((a, f)),
        _ => None,
    });
    match (first_failure, &r.error) {
        (Some((a, f)), Some(e)) => {
            prop_assert_eq!(trace_code(e), expected_code(a, f), "{} for {}", e, a);
            if is_write(a, "current_tracer", sc.tracer) && f.kind == FailureKind::Rejected {
                prop_assert!(e.to_string().contains(sc.tracer));
            }
            prop_assert!(!r.reached_running);
        }
        (Some(_), None) => prop_assert!(false, "start failed but no error"),
        (None, Some(TraceError::PipeFailed { .. })) => {
            prop_assert!(r.reached_running && sc.pipe_error)
        }
        (None, Some(e)) => prop_assert!(false, "unexpected error {}", e),
        (None, None) => prop_assert!(!(r.reached_running && sc.pipe_error)),
    }

    // A cancel stops the start: no start operation after it.
    if let Some(k) = sc.cancel_at {
        prop_assert!(
            r.log
                .iter()
                .skip(k + 1)
                .all(|(s, ..)| *s != State::Starting)
        );
    }

    // An opened pipe is always closed, even with tracefs gone.
    let opened = r
        .log
        .iter()
        .any(|(_, a, res)| matches!(a, Action::OpenPipe { .. }) && res.is_ok());
    prop_assert_eq!(opened, down.iter().any(|(_, a, _)| *a == Action::ClosePipe));

    // After tracefs vanished, only the pipe is closed.
    if let Some(gone) = r
        .log
        .iter()
        .position(|(_, _, res)| matches!(res, Err(f) if f.kind == FailureKind::TracefsMissing))
    {
        prop_assert!(
            r.log[gone + 1..]
                .iter()
                .all(|(_, a, _)| *a == Action::ClosePipe)
        );
        return Ok(());
    }

    let mkdir_ok = r
        .log
        .iter()
        .any(|(_, a, res)| matches!(a, Action::Mkdir { .. }) && res.is_ok());
    if sc.instance && !mkdir_ok {
        // Not our instance: nothing but the failed mkdir.
        prop_assert_eq!(r.log.len(), 1);
        prop_assert_eq!(sc.instance_exists, r.fs.instances.contains_key("t1"));
        return Ok(());
    }

    // The teardown has the required steps, in a kernel-acceptable order.
    let pos = |pred: &dyn Fn(&Action) -> bool| down.iter().position(|(_, a, _)| pred(a));
    let off = pos(&|a| is_write(a, "tracing_on", "0"));
    let nop = pos(&|a| is_write(a, "current_tracer", "nop"));
    let close = pos(&|a| *a == Action::ClosePipe);
    let rmdir = pos(&|a| matches!(a, Action::Rmdir { .. }));
    prop_assert!(
        off.is_some() && nop.is_some(),
        "teardown lacks tracing off or nop"
    );
    prop_assert_eq!(opened, close.is_some());
    prop_assert_eq!(mkdir_ok, rmdir.is_some());
    if let Some(c) = close {
        prop_assert!(nop > Some(c) && rmdir.is_none_or(|r| r > c));
    }
    prop_assert_eq!(rmdir.is_none_or(|r| r == down.len() - 1), true);

    // The end state: every successful teardown step's effect holds.
    let wrote_ok = |name: &str| {
        start.iter().any(|(_, a, res)| {
            res.is_ok() && matches!(a, Action::Write { file, .. } if file.ends_with(name))
        })
    };
    let initial = sc.initial_fs();
    let (buffer, initial_buffer) = if sc.instance {
        let removed = !r.fs.instances.contains_key("t1");
        prop_assert_eq!(
            removed,
            !down_failed(&|a| matches!(a, Action::Rmdir { .. }))
        );
        if removed {
            return Ok(());
        }
        (&r.fs.instances["t1"], FakeBuffer::fresh())
    } else {
        (&r.fs.global, initial.global.clone())
    };
    let close_failed = down_failed(&|a| *a == Action::ClosePipe);
    prop_assert!(!buffer.pipe_open || close_failed);
    prop_assert!(!buffer.tracing_on || down_failed(&|a| is_write(a, "tracing_on", "0")));
    prop_assert!(buffer.tracer == "nop" || down_failed(&|a| is_write(a, "current_tracer", "nop")));
    for (name, now, before) in [
        ("set_ftrace_filter", &buffer.filter, &initial_buffer.filter),
        ("set_graph_function", &buffer.graph, &initial_buffer.graph),
    ] {
        let reset_failed = down_failed(&|a| is_write(a, name, ""));
        if wrote_ok(name) {
            prop_assert!(
                now.is_empty() || reset_failed,
                "{} not reset: {:?}",
                name,
                now
            );
        } else {
            prop_assert!(now.is_empty() || now == before || reset_failed);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 2000,
        failure_persistence: Some(Box::new(regressions())),
        ..ProptestConfig::default()
    })]

    /// Whatever fails and whenever the owner cancels, the teardown runs to
    /// the end and leaves the buffer restored where its steps succeeded.
    #[test]
    fn teardown_always_restores(sc in arb_scenario()) {
        let r = run(&sc);
        check(&sc, &r)?;
    }

    /// Same inputs, same operations, events and outcome.
    #[test]
    fn deterministic(sc in arb_scenario()) {
        prop_assert_eq!(run(&sc), run(&sc));
    }
}

/// Without failures, the exact operation sequence of a full session.
#[test]
fn full_lifecycle_in_an_instance() {
    let sc = Scenario {
        tracer: "function_graph",
        filters: vec!["vfs_*", "do_sys_open"],
        graphs: vec!["schedule"],
        instance: true,
        instance_exists: false,
        has_graph: true,
        filter_locked: false,
        dirty: false,
        fail_at: None,
        cancel_at: None,
        lines: vec!["a".into()],
        pipe_error: false,
    };
    let r = run(&sc);
    let ops: Vec<String> = r.log.iter().map(|(_, a, _)| a.to_string()).collect();
    assert_eq!(
        ops,
        [
            "mkdir instances/t1",
            "write \"0\" to instances/t1/tracing_on",
            "write \"\" to instances/t1/trace",
            "write \"function_graph\" to instances/t1/current_tracer",
            "write \"vfs_*\" to instances/t1/set_ftrace_filter",
            "append \"do_sys_open\" to instances/t1/set_ftrace_filter",
            "write \"schedule\" to instances/t1/set_graph_function",
            "open instances/t1/trace_pipe",
            "write \"1\" to instances/t1/tracing_on",
            "write \"0\" to instances/t1/tracing_on",
            "close trace_pipe",
            "write \"nop\" to instances/t1/current_tracer",
            "write \"\" to instances/t1/set_ftrace_filter",
            "write \"\" to instances/t1/set_graph_function",
            "rmdir instances/t1",
        ]
    );
    assert_eq!(r.events, ["a"]);
    assert!(r.error.is_none() && r.teardown_failures.is_empty());
    assert!(r.fs.instances.is_empty());
}

// ---- validation ----

/// A character each name/pattern must refuse, with the expected problem.
fn arb_bad_char() -> impl Strategy<Value = (char, Problem)> {
    prop::sample::select(vec![
        ('/', Problem::PathSeparator),
        ('\n', Problem::Newline),
        ('\r', Problem::Newline),
        ('\0', Problem::Nul),
        (' ', Problem::Whitespace),
        ('\t', Problem::Whitespace),
        ('\u{7}', Problem::ControlCharacter),
        ('é', Problem::NonAscii),
    ])
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 512,
        failure_persistence: Some(Box::new(regressions())),
        ..ProptestConfig::default()
    })]

    /// A bad character anywhere in any field is refused with that field
    /// and problem, and nothing is written nor claimed.
    #[test]
    fn invalid_values_write_nothing(
        good in "[A-Za-z0-9_-]{1,20}",
        (bad, problem) in arb_bad_char(),
        at in 0usize..21,
        which in 0usize..3,
        index in 0usize..3,
    ) {
        let at = at.min(good.len());
        let bad_value = format!("{}{}{}", &good[..at], bad, &good[at..]);
        let mut req = request(&good, &[], &[]);
        let field = match which {
            0 => { req.tracer = bad_value.clone(); Field::Tracer }
            1 => {
                req.function_filter = vec![good.clone(); index];
                req.function_filter.push(bad_value.clone());
                Field::FunctionFilter(index)
            }
            _ => {
                req.graph_function_filter = vec![good.clone(); index];
                req.graph_function_filter.push(bad_value.clone());
                Field::GraphFunctionFilter(index)
            }
        };
        let expected = ValidationError { field, problem, value: bad_value };
        prop_assert_eq!(TraceSpec::from_request(&req), Err(expected.clone()));
        let prefix = format!("{field}: ");
        prop_assert!(expected.to_string().starts_with(&prefix));

        let port = FakePort::new(FakeTracefs::new());
        let buffers = TraceBuffers::new();
        let err = run_session(Arc::new(port.clone()), &buffers, Target::Global, &req)
            .expect_err("invalid request");
        prop_assert_eq!(trace_code(&err), tonic::Code::InvalidArgument);
        prop_assert!(port.fs().log.is_empty());
        prop_assert!(!buffers.is_claimed(&Target::Global));
    }

    /// Well-formed names and patterns are accepted.
    #[test]
    fn valid_values_accepted(
        tracer in "[A-Za-z0-9_-]{1,128}",
        filters in prop::collection::vec("[A-Za-z0-9_.*?!\\[\\]$-]{1,512}", 0..4),
    ) {
        let req = debug::TraceRequest {
            tracer,
            function_filter: filters.clone(),
            graph_function_filter: filters,
        };
        prop_assert!(TraceSpec::from_request(&req).is_ok());
    }
}

#[test]
fn validation_limits_and_messages() {
    let long = "a".repeat(MAX_NAME_LEN + 1);
    let e = TraceSpec::from_request(&request(&long, &[], &[])).expect_err("must be refused");
    assert_eq!(e.problem, Problem::TooLong { len: 129, max: 128 });
    let e = TraceSpec::from_request(&request("", &[], &[])).expect_err("must be refused");
    assert_eq!(e.to_string(), "tracer: is empty");
    let e = TraceSpec::from_request(&request("nop", &["a", "b", "x\ny"], &[]))
        .expect_err("must be refused");
    assert_eq!(
        e.to_string(),
        "function_filter[2]: contains a newline (got \"x\\ny\")"
    );
    // Commands that outlive the session are refused; ftrace's module
    // form is accepted (as the reference), with a module name.
    for (pattern, problem) in [
        ("f:traceoff", Problem::FilterCommand),
        ("f:snapshot:1", Problem::FilterCommand),
        ("f:mod", Problem::FilterCommand),
        (":mod:ext4", Problem::ModuleFunctions),
        ("!:mod:ext4", Problem::ModuleFunctions),
        ("*:mod:", Problem::ModuleName),
        ("*:mod:!", Problem::ModuleName),
        ("*:mod:ext4:traceoff", Problem::ModuleName),
        ("*:mod:ext.4", Problem::ModuleName),
    ] {
        let e =
            TraceSpec::from_request(&request("nop", &[pattern], &[])).expect_err("must be refused");
        assert_eq!(e.problem, problem, "{pattern}");
        assert!(e.to_string().starts_with("function_filter[0]: "), "{e}");
    }
    let long_module = format!("*:mod:{}", "m".repeat(MAX_MODULE_LEN + 1));
    let e = TraceSpec::from_request(&request("nop", &[], &[&long_module]))
        .expect_err("must be refused");
    assert_eq!(e.problem, Problem::ModuleName);
    for pattern in [
        "*:mod:ext4",
        "vfs_*:mod:ext4",
        "!write*:mod:ext4",
        "*:mod:!ext4",
        "*write*:mod:*snd*",
        "f:mod:nf_conntrack-ipv4",
    ] {
        let spec = TraceSpec::from_request(&request("nop", &[pattern], &[pattern]));
        assert!(spec.is_ok(), "{pattern}: {spec:?}");
    }
    let max_module = format!("*:mod:{}", "m".repeat(MAX_MODULE_LEN));
    assert!(TraceSpec::from_request(&request("nop", &[&max_module], &[])).is_ok());
    let many = vec!["f"; MAX_PATTERNS + 1];
    let e = TraceSpec::from_request(&request("nop", &[], &many)).expect_err("must be refused");
    assert_eq!(e.field, Field::GraphFunctionFilters);
    assert!(TraceSpec::from_request(&request("nop", &[&"f".repeat(MAX_PATTERN_LEN)], &[])).is_ok());
    for name in ["..", ".", "../x", "a.b", "a b", ""] {
        assert!(InstanceName::new(name).is_err(), "{name:?} accepted");
    }
}

// ---- run_session ----

fn poll_stream(s: &mut TraceStream) -> Poll<Option<Result<debug::TraceEvent, tonic::Status>>> {
    s.poll_next_unpin(&mut Context::from_waker(Waker::noop()))
}

fn restored(b: &FakeBuffer) -> bool {
    !b.tracing_on && b.tracer == "nop" && b.filter.is_empty() && !b.pipe_open
}

#[test]
fn stream_delivers_lines_and_drop_tears_down() {
    let port = FakePort::new(FakeTracefs::new());
    let buffers = TraceBuffers::new();
    let req = request("blk", &["vfs_*"], &[]);
    let mut stream = run_session(Arc::new(port.clone()), &buffers, Target::Global, &req)
        .expect("session starts");
    assert_eq!(port.fs().global.tracer, "blk");
    assert!(port.fs().global.tracing_on);
    assert!(poll_stream(&mut stream).is_pending());
    port.send(0, Ok("line one".into()));
    port.send(0, Ok("line two\n".into()));
    for want in ["line one", "line two"] {
        match poll_stream(&mut stream) {
            Poll::Ready(Some(Ok(e))) => assert_eq!(e.raw_line, want),
            other => panic!("expected {want:?}, got {other:?}"),
        }
    }
    // A second session on the same buffer is refused; another buffer works.
    let err = run_session(Arc::new(port.clone()), &buffers, Target::Global, &req)
        .expect_err("must be refused");
    assert_eq!(trace_code(&err), tonic::Code::FailedPrecondition);
    assert!(err.to_string().contains("a trace is already in progress"));
    let other = run_session(Arc::new(port.clone()), &buffers, instance("i2"), &req)
        .expect("an instance session runs alongside");
    assert!(buffers.is_claimed(&Target::Global));
    drop(stream);
    assert!(!buffers.is_claimed(&Target::Global));
    assert!(restored(&port.fs().global), "{:?}", port.fs().global);
    drop(other);
    assert!(port.fs().instances.is_empty());
    assert!(!buffers.is_claimed(&instance("i2")));
}

#[test]
fn refused_tracer_is_invalid_argument_and_restores() {
    let mut fs = FakeTracefs::new();
    fs.global.tracer = "blk".into();
    let port = FakePort::new(fs);
    let buffers = TraceBuffers::new();
    let err = run_session(
        Arc::new(port.clone()),
        &buffers,
        Target::Global,
        &request("function", &[], &[]),
    )
    .expect_err("must be refused");
    assert_eq!(trace_code(&err), tonic::Code::InvalidArgument);
    assert!(err.to_string().contains("\"function\""), "{err}");
    assert!(restored(&port.fs().global));
    assert!(!buffers.is_claimed(&Target::Global));
}

#[test]
fn pipe_error_ends_stream_with_status_naming_teardown_failures() {
    let port = FakePort::new(FakeTracefs::new());
    let buffers = TraceBuffers::new();
    let mut stream = run_session(
        Arc::new(port.clone()),
        &buffers,
        Target::Global,
        &request("nop", &[], &[]),
    )
    .expect("session starts");
    // Make the teardown's nop write fail: it is the 3rd operation from now
    // (tracing off, close, nop).
    let next = port.fs().log.len();
    port.fs().fail_at = Some((next + 2, FailureKind::Other));
    port.send(0, Err(TracefsFailure::new(FailureKind::Other, "EIO")));
    match poll_stream(&mut stream) {
        Poll::Ready(Some(Err(status))) => {
            assert_eq!(status.code(), tonic::Code::Unavailable);
            assert!(status.message().contains("EIO"), "{}", status.message());
            assert!(
                status.message().contains("current_tracer"),
                "{}",
                status.message()
            );
        }
        other => panic!("expected an error, got {other:?}"),
    }
    assert!(matches!(poll_stream(&mut stream), Poll::Ready(None)));
    assert!(!buffers.is_claimed(&Target::Global));
    assert!(!port.fs().global.tracing_on);
}

/// A crash skips a session's teardown; the next run removes the
/// instances it left (ours by their prefix), leaves others' alone, and
/// one still read (its pipe open) too.
#[test]
fn stale_instances_of_a_previous_run_are_removed() {
    let mut fs = FakeTracefs::new();
    let mut busy = FakeBuffer::fresh();
    busy.pipe_open = true;
    for (name, buffer) in [
        ("metropolis-trace-0", FakeBuffer::dirty()),
        ("metropolis-trace-7", FakeBuffer::fresh()),
        ("metropolis-trace-9", busy),
        ("someone-else", FakeBuffer::fresh()),
    ] {
        fs.instances.insert(name.into(), buffer);
    }
    let port = FakePort::new(fs);
    assert_eq!(remove_stale_instances(&port), 2);
    let left: Vec<String> = port.fs().instances.keys().cloned().collect();
    assert_eq!(left, ["metropolis-trace-9", "someone-else"]);
    // Without tracefs there is nothing to look through.
    port.fs().gone = true;
    assert_eq!(remove_stale_instances(&port), 0);
}
