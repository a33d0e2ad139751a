//! Trace over gRPC against a real daemon and the kernel's real tracefs
//! (mounted at /sys/kernel/tracing; `.ci/run` mounts it): markers written
//! to `trace_marker` arrive as events, one session per buffer, a tracer the
//! kernel refuses, client cancel and daemon shutdown restore tracefs,
//! invalid names write nothing, and per-session instances run
//! concurrently.
//!
//! All tests share the kernel's tracing state, so they take one lock.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::time::{Duration, Instant};

use futures::StreamExt;
use metropolis_proto::prelude::debug;
use metropolis_tests::{Daemon, RuntimeKind, against_both_runtimes};

const TRACEFS: &str = "/sys/kernel/tracing";

static KERNEL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn read(file: &str) -> String {
    std::fs::read_to_string(Path::new(TRACEFS).join(file))
        .unwrap_or_else(|e| panic!("{TRACEFS}/{file}: {e} (is tracefs mounted?)"))
        .trim()
        .to_string()
}

fn write(file: &str, value: &str) {
    std::fs::write(Path::new(TRACEFS).join(file), value)
        .unwrap_or_else(|e| panic!("{TRACEFS}/{file}: {e}"));
}

/// Waits until tracefs is restored: tracer nop, tracing off.
async fn restored(prefix: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let tracer = read(&format!("{prefix}current_tracer"));
        let on = read(&format!("{prefix}tracing_on"));
        if tracer == "nop" && on == "0" {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "tracefs not restored: current_tracer={tracer} tracing_on={on}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn nop() -> debug::TraceRequest {
    debug::TraceRequest {
        tracer: "nop".into(),
        ..Default::default()
    }
}

/// Reads events until one contains `marker`.
async fn expect_marker(
    stream: &mut tonic::Streaming<debug::TraceEvent>,
    marker: &str,
) -> Vec<String> {
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let event = tokio::time::timeout(left, stream.next())
            .await
            .unwrap_or_else(|_| panic!("no event with {marker:?}; saw {seen:?}"))
            .unwrap()
            .unwrap();
        if event.raw_line.contains(marker) {
            return seen;
        }
        seen.push(event.raw_line);
    }
}

async fn nop_trace_streams_markers_and_one_session_per_buffer(runtime: RuntimeKind) {
    let _kernel = KERNEL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start_debug(&dir.path().join("data"), runtime, &[]);
    let mut client = d.debug_client().await;
    let mut stream = client.trace(nop()).await.unwrap().into_inner();
    assert_eq!(read("tracing_on"), "1");
    let marker = format!("metropolis-marker-{runtime}-{}", std::process::id());
    write("trace_marker", &marker);
    expect_marker(&mut stream, &marker).await;

    // A second session on the global buffer while the first runs: it
    // waits a while for the first to end, then fails.
    let asked = Instant::now();
    let e = d.debug_client().await.trace(nop()).await.unwrap_err();
    assert!(
        asked.elapsed() >= Duration::from_secs(2),
        "{:?}",
        asked.elapsed()
    );
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    assert!(
        e.message().contains("already in progress") && e.message().contains("waited 2s"),
        "{}",
        e.message()
    );
    // The first one still streams.
    write("trace_marker", &format!("{marker}-again"));
    expect_marker(&mut stream, &format!("{marker}-again")).await;

    // Client cancel, and a new session at once (Ctrl-C in `metroctl
    // trace`, then again): the call reaches the daemon before it has seen
    // the cancel; it waits for the old session's teardown and starts.
    drop(stream);
    let mut stream = client
        .trace(nop())
        .await
        .unwrap_or_else(|e| panic!("a session right after a cancel: {e:?}"))
        .into_inner();
    let marker = format!("{marker}-next");
    write("trace_marker", &marker);
    expect_marker(&mut stream, &marker).await;
    // Client cancel: the daemon restores tracefs.
    drop(stream);
    restored("").await;
}

async fn refused_tracer_and_invalid_names(runtime: RuntimeKind) {
    let _kernel = KERNEL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start_debug(&dir.path().join("data"), runtime, &[]);
    let mut client = d.debug_client().await;
    // `function` is listed by this kernel but refused on write (the
    // machine's documented behaviour); an unknown tracer is refused
    // everywhere.
    for tracer in ["function", "no_such_tracer"] {
        let e = client
            .trace(debug::TraceRequest {
                tracer: tracer.into(),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{tracer}: {e:?}");
        assert!(e.message().contains(tracer), "{}", e.message());
        restored("").await;
    }

    // Invalid names: InvalidArgument naming the field, and nothing
    // written (tracing_on is left as the test set it).
    write("tracing_on", "1");
    let cases = [
        debug::TraceRequest {
            tracer: "../nop".into(),
            ..Default::default()
        },
        debug::TraceRequest {
            tracer: "a b".into(),
            ..Default::default()
        },
        debug::TraceRequest {
            tracer: "nop".into(),
            function_filter: vec!["ok*".into(), "x\ny".into()],
            ..Default::default()
        },
        debug::TraceRequest {
            tracer: "nop".into(),
            graph_function_filter: vec!["a/b".into()],
            ..Default::default()
        },
        // A set_ftrace_filter command that would outlive the session.
        debug::TraceRequest {
            tracer: "nop".into(),
            function_filter: vec!["vfs_read:traceoff".into()],
            ..Default::default()
        },
        debug::TraceRequest {
            tracer: "x".repeat(4096),
            ..Default::default()
        },
    ];
    for request in cases {
        let e = client.trace(request.clone()).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{request:?}: {e:?}");
        assert_eq!(read("tracing_on"), "1", "{request:?} wrote to tracefs");
    }
    write("tracing_on", "0");
}

async fn daemon_shutdown_restores_tracefs(runtime: RuntimeKind) {
    let _kernel = KERNEL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let mut d = Daemon::start_debug(&dir.path().join("data"), runtime, &[]);
    let mut client = d.debug_client().await;
    let mut stream = client.trace(nop()).await.unwrap().into_inner();
    let marker = format!("metropolis-shutdown-{runtime}");
    write("trace_marker", &marker);
    expect_marker(&mut stream, &marker).await;
    assert_eq!(read("tracing_on"), "1");
    let status = tokio::task::spawn_blocking(move || d.terminate())
        .await
        .unwrap();
    assert!(status.success(), "{status}");
    restored("").await;
}

async fn instances_run_concurrently(runtime: RuntimeKind) {
    let _kernel = KERNEL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start_debug(&dir.path().join("data"), runtime, &["--trace-instances"]);
    let instances = Path::new(TRACEFS).join("instances");
    let before: Vec<_> = std::fs::read_dir(&instances)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    let mut a = d
        .debug_client()
        .await
        .trace(nop())
        .await
        .unwrap()
        .into_inner();
    let mut b = d
        .debug_client()
        .await
        .trace(nop())
        .await
        .unwrap()
        .into_inner();
    let mut new: Vec<_> = std::fs::read_dir(&instances)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| !before.contains(n))
        .map(|n| n.to_string_lossy().to_string())
        .collect();
    new.sort();
    assert_eq!(new.len(), 2, "two instances: {new:?}");
    // The global buffer is not used: a marker there reaches neither
    // (global tracing on just for this write; a disabled buffer refuses
    // markers with EBADF).
    write("tracing_on", "1");
    write("trace_marker", "metropolis-global-marker");
    write("tracing_on", "0");
    // Each instance's marker reaches its own session only. Sessions were
    // created in order, but which stream got which instance is learnt from
    // the markers themselves.
    for name in &new {
        write(
            &format!("instances/{name}/trace_marker"),
            &format!("marker-{name}"),
        );
    }
    let seen_a = expect_marker_any(&mut a, &new).await;
    let seen_b = expect_marker_any(&mut b, &new).await;
    assert_ne!(seen_a, seen_b, "each session sees its own instance");
    drop(a);
    drop(b);
    let deadline = Instant::now() + Duration::from_secs(10);
    for name in &new {
        while instances.join(name).exists() {
            assert!(Instant::now() < deadline, "instance {name} not removed");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Reads events until one carries the marker of one of `names`; returns
/// that name. Fails on the global marker.
async fn expect_marker_any(
    stream: &mut tonic::Streaming<debug::TraceEvent>,
    names: &[String],
) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let event = tokio::time::timeout(left, stream.next())
            .await
            .expect("an instance marker arrives")
            .unwrap()
            .unwrap();
        assert!(
            !event.raw_line.contains("metropolis-global-marker"),
            "an instance session saw the global buffer: {}",
            event.raw_line
        );
        if let Some(name) = names
            .iter()
            .find(|n| event.raw_line.contains(&format!("marker-{n}")))
        {
            return name.clone();
        }
    }
}

against_both_runtimes!(
    nop_trace_streams_markers_and_one_session_per_buffer,
    refused_tracer_and_invalid_names,
    daemon_shutdown_restores_tracefs,
    instances_run_concurrently,
);

/// A tracefs root that does not exist: FailedPrecondition saying so.
#[tokio::test]
async fn missing_tracefs_is_failed_precondition() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-tracefs");
    let d = Daemon::start_debug(
        &dir.path().join("data"),
        RuntimeKind::Tokio,
        &["--tracefs", missing.to_str().unwrap()],
    );
    let e = d.debug_client().await.trace(nop()).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("no-tracefs"), "{}", e.message());
}
