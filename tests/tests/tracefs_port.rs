//! Trace sessions against the real tracefs at /sys/kernel/tracing (root
//! needed; CI mounts it). The tests share the global buffer, so they run
//! one at a time under `SERIAL`.
//!
//! They rely on this kernel's behaviour: `nop` and `blk` tracers in the
//! global buffer, `function` refused (kernel lockdown), instances
//! supported. A missing tracefs fails them loudly rather than skipping.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::executor::block_on;
use futures::future::{Either, select};
use metropolis_core::trace::{InstanceName, Target, TraceBuffers, TraceError, Tracefs};
use metropolis_node::tracefs::{DEFAULT_ROOT, HostTracefs};
use metropolis_proto::prelude::debug;
use metropolis_service::debug::{TraceStream, run_session};
use metropolis_service::status::debug::trace_code;

static SERIAL: Mutex<()> = Mutex::new(());
const WAIT: Duration = Duration::from_secs(5);

/// Takes the global buffer for one test; fails loudly without tracefs.
fn serial() -> MutexGuard<'static, ()> {
    let guard = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    assert!(
        Path::new(DEFAULT_ROOT).join("tracing_on").exists(),
        "tracefs is not mounted at {DEFAULT_ROOT}; these tests need it (and root)"
    );
    guard
}

fn port() -> Arc<dyn Tracefs> {
    Arc::new(HostTracefs::default())
}

fn request(tracer: &str, filters: &[&str]) -> debug::TraceRequest {
    debug::TraceRequest {
        tracer: tracer.into(),
        function_filter: filters.iter().map(|s| s.to_string()).collect(),
        graph_function_filter: Vec::new(),
    }
}

fn path(rel: &str) -> PathBuf {
    Path::new(DEFAULT_ROOT).join(rel)
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(path(rel))
        .unwrap_or_else(|e| panic!("reading {rel}: {e}"))
        .trim()
        .to_owned()
}

fn set(rel: &str, value: &str) {
    std::fs::write(path(rel), value).unwrap_or_else(|e| panic!("writing {rel}: {e}"));
}

/// A marker no earlier run wrote.
fn marker() -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    format!(
        "metropolis-trace-test-{}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    )
}

/// The next stream item, or `Err` after `timeout`.
fn next_within(
    stream: &mut TraceStream,
    timeout: Duration,
) -> Result<Option<Result<debug::TraceEvent, tonic::Status>>, ()> {
    let (tx, rx) = futures::channel::oneshot::channel::<()>();
    std::thread::spawn(move || {
        std::thread::sleep(timeout);
        let _ = tx.send(());
    });
    match block_on(select(stream.next(), rx)) {
        Either::Left((item, _)) => Ok(item),
        Either::Right(_) => Err(()),
    }
}

/// Reads events until one contains `marker`; returns the lines before it.
/// Panics after [`WAIT`] or if the stream ends.
fn await_marker(stream: &mut TraceStream, marker: &str) -> Vec<String> {
    let deadline = Instant::now() + WAIT;
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match next_within(stream, left) {
            Ok(Some(Ok(event))) if event.raw_line.contains(marker) => return seen,
            Ok(Some(Ok(event))) => seen.push(event.raw_line),
            Ok(other) => panic!("stream ended waiting for {marker}: {other:?}"),
            Err(()) => panic!("no event with {marker} within {WAIT:?}; saw {seen:?}"),
        }
    }
}

/// Polls `check` for up to a second (teardown is synchronous in drop, so
/// this only guards against a slow machine).
fn eventually(what: &str, check: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(1);
    while !check() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn assert_restored() {
    eventually("global buffer restored to nop, tracing off", || {
        read("current_tracer") == "nop" && read("tracing_on") == "0"
    });
}

#[test]
fn nop_on_the_global_buffer_streams_trace_marker_lines() {
    let _serial = serial();
    let buffers = TraceBuffers::new();
    let mut stream = run_session(port(), &buffers, Target::Global, &request("nop", &[]))
        .expect("a nop session starts");
    assert_eq!(read("tracing_on"), "1");
    let m = marker();
    set("trace_marker", &m);
    await_marker(&mut stream, &m);
    drop(stream);
    assert_restored();
}

#[test]
fn a_second_global_session_is_refused() {
    let _serial = serial();
    let buffers = TraceBuffers::new();
    let first =
        run_session(port(), &buffers, Target::Global, &request("nop", &[])).expect("first session");
    let err = run_session(port(), &buffers, Target::Global, &request("blk", &[]))
        .expect_err("second session on the global buffer");
    assert_eq!(trace_code(&err), tonic::Code::FailedPrecondition);
    assert!(
        err.to_string().contains("a trace is already in progress"),
        "{err}"
    );
    assert_eq!(read("current_tracer"), "nop", "the refused session wrote");
    drop(first);
    let third = run_session(port(), &buffers, Target::Global, &request("nop", &[]))
        .expect("the buffer is free again after the first session ended");
    drop(third);
    assert_restored();
}

#[test]
fn a_refused_tracer_is_invalid_argument_and_restores() {
    let _serial = serial();
    let buffers = TraceBuffers::new();
    for tracer in ["function", "no_such_tracer"] {
        // Start dirty: a tracer set and tracing on.
        set("current_tracer", "blk");
        set("tracing_on", "1");
        let err = run_session(port(), &buffers, Target::Global, &request(tracer, &[]))
            .expect_err("the kernel refuses this tracer");
        assert_eq!(trace_code(&err), tonic::Code::InvalidArgument, "{err}");
        assert!(matches!(err, TraceError::TracerRefused { .. }), "{err:?}");
        assert!(err.to_string().contains(&format!("{tracer:?}")), "{err}");
        assert_eq!(read("current_tracer"), "nop");
        assert_eq!(read("tracing_on"), "0");
        assert!(!buffers.is_claimed(&Target::Global));
    }
}

#[test]
fn dropping_the_stream_mid_session_restores_tracefs() {
    let _serial = serial();
    let buffers = TraceBuffers::new();
    set("current_tracer", "nop");
    let mut stream = run_session(port(), &buffers, Target::Global, &request("blk", &[]))
        .expect("a blk session starts");
    assert_eq!(read("current_tracer"), "blk");
    assert_eq!(read("tracing_on"), "1");
    let m = marker();
    set("trace_marker", &m);
    await_marker(&mut stream, &m);
    drop(stream); // the client cancelled
    assert_restored();
    assert!(!buffers.is_claimed(&Target::Global));
}

#[test]
fn invalid_names_are_refused_and_nothing_is_written() {
    let _serial = serial();
    let buffers = TraceBuffers::new();
    set("current_tracer", "blk");
    set("tracing_on", "1");
    let bad = ["../x", "a b", "x\ny", "", "a/b", "nul\0"];
    for value in bad {
        for req in [
            request(value, &[]),
            request("nop", &["vfs_read", value]),
            debug::TraceRequest {
                graph_function_filter: vec![value.into()],
                ..request("nop", &[])
            },
        ] {
            let err =
                run_session(port(), &buffers, Target::Global, &req).expect_err("invalid request");
            assert_eq!(
                trace_code(&err),
                tonic::Code::InvalidArgument,
                "{value:?}: {err}"
            );
        }
        assert!(InstanceName::new(value).is_err(), "instance name {value:?}");
    }
    assert_eq!(read("current_tracer"), "blk", "an invalid request wrote");
    assert_eq!(read("tracing_on"), "1", "an invalid request wrote");
    set("current_tracer", "nop");
    set("tracing_on", "0");

    // The same against a directory of plain files standing in for
    // tracefs: nothing changes, and a valid request does write there (so
    // the check could see a write).
    let dir = tempfile::tempdir().expect("temp dir");
    for (f, v) in [
        ("tracing_on", "1"),
        ("current_tracer", "blk"),
        ("trace", "old"),
        ("set_ftrace_filter", "old"),
        ("trace_pipe", ""),
    ] {
        std::fs::write(dir.path().join(f), v).expect("fake tracefs file");
    }
    let fake: Arc<dyn Tracefs> = Arc::new(HostTracefs::new(dir.path()));
    let snapshot = || {
        let mut files: Vec<(String, String)> = std::fs::read_dir(dir.path())
            .expect("list fake tracefs")
            .map(|e| {
                let e = e.expect("dir entry");
                let content = std::fs::read_to_string(e.path()).expect("read fake file");
                (e.file_name().to_string_lossy().into_owned(), content)
            })
            .collect();
        files.sort();
        files
    };
    let before = snapshot();
    for value in bad {
        let err = run_session(fake.clone(), &buffers, Target::Global, &request(value, &[]))
            .expect_err("invalid request");
        assert_eq!(trace_code(&err), tonic::Code::InvalidArgument);
    }
    assert_eq!(snapshot(), before);
    // A valid one starts (trace_pipe is a plain file: it ends at once).
    let mut stream = run_session(fake, &buffers, Target::Global, &request("nop", &["f*"]))
        .expect("valid request on the fake root");
    match next_within(&mut stream, WAIT) {
        Ok(Some(Err(status))) => assert_eq!(status.code(), tonic::Code::Unavailable),
        other => panic!("expected the pipe's end as an error, got {other:?}"),
    }
    assert_ne!(snapshot(), before);
    let file = |f: &str| std::fs::read_to_string(dir.path().join(f)).expect("read fake file");
    assert_eq!(file("tracing_on"), "0");
    assert_eq!(file("current_tracer"), "nop");
    assert_eq!(file("set_ftrace_filter"), "");
}

#[test]
fn sessions_in_separate_instances_run_side_by_side() {
    let _serial = serial();
    let buffers = TraceBuffers::new();
    let names: Vec<InstanceName> = ["a", "b"]
        .iter()
        .map(|s| {
            InstanceName::new(&format!("metropolis-test-{}-{s}", std::process::id()))
                .expect("instance name")
        })
        .collect();
    let mut streams: Vec<TraceStream> = names
        .iter()
        .map(|n| {
            run_session(
                port(),
                &buffers,
                Target::Instance(n.clone()),
                &request("nop", &[]),
            )
            .expect("instance session starts")
        })
        .collect();
    let markers: Vec<String> = names.iter().map(|_| marker()).collect();
    for (n, m) in names.iter().zip(&markers) {
        assert_eq!(read(&format!("instances/{n}/tracing_on")), "1");
        set(&format!("instances/{n}/trace_marker"), m);
    }
    for (i, stream) in streams.iter_mut().enumerate() {
        let before = await_marker(stream, &markers[i]);
        let other = &markers[1 - i];
        assert!(
            before.iter().all(|l| !l.contains(other.as_str())),
            "instance {i} saw the other's marker: {before:?}"
        );
    }
    drop(streams);
    for n in &names {
        assert!(
            !path(&format!("instances/{n}")).exists(),
            "instance {n} not removed"
        );
        assert!(!buffers.is_claimed(&Target::Instance(n.clone())));
    }
}

#[test]
fn an_existing_instance_is_left_alone() {
    let _serial = serial();
    let buffers = TraceBuffers::new();
    let name = InstanceName::new(&format!("metropolis-test-{}-exists", std::process::id()))
        .expect("instance name");
    let dir = path(&format!("instances/{name}"));
    std::fs::create_dir(&dir).expect("create instance");
    let err = run_session(
        port(),
        &buffers,
        Target::Instance(name.clone()),
        &request("nop", &[]),
    )
    .expect_err("existing instance");
    assert_eq!(trace_code(&err), tonic::Code::FailedPrecondition);
    assert!(matches!(err, TraceError::InstanceExists { .. }), "{err:?}");
    assert!(
        dir.exists(),
        "the session removed an instance it did not create"
    );
    std::fs::remove_dir(&dir).expect("remove instance");
}

#[test]
fn a_missing_tracefs_is_a_clear_error() {
    let dir = tempfile::tempdir().expect("temp dir");
    let root = dir.path().join("not-mounted");
    let missing: Arc<dyn Tracefs> = Arc::new(HostTracefs::new(&root));
    let buffers = TraceBuffers::new();
    let instance = Target::Instance(InstanceName::new("x").expect("instance name"));
    for target in [Target::Global, instance] {
        let err = run_session(missing.clone(), &buffers, target, &request("nop", &[]))
            .expect_err("no tracefs");
        assert_eq!(trace_code(&err), tonic::Code::FailedPrecondition, "{err}");
        assert!(matches!(err, TraceError::TracefsMissing { .. }), "{err:?}");
        let msg = err.to_string();
        assert!(
            msg.contains("tracefs is not available") && msg.contains("not-mounted"),
            "{msg}"
        );
    }
    assert!(!root.exists());
}
