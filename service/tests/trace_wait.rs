//! A Trace call on a buffer another session holds waits, up to its bound,
//! for that session to end (`DebugPorts::trace_wait`): the service over
//! the fake tracefs, on a manual clock, its futures polled by hand.

#![allow(clippy::unwrap_used)]

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use metropolis_core::logtree::LogTreeConfig;
use metropolis_proto::prelude::debug;
use metropolis_proto::prelude::debug::node_debug_service_server::NodeDebugService;
use metropolis_service::debug::{DebugPorts, DebugService, LogHub, TRACE_WAIT, TraceWait};
use metropolis_testkit::clock::ManualClock;
use metropolis_testkit::leases::ManualTimer;
use metropolis_testkit::tracefs::{FakePort, FakeTracefs};
use tonic::Request;

type Call<'a> = Pin<
    Box<
        dyn Future<
                Output = Result<
                    tonic::Response<<DebugService as NodeDebugService>::TraceStream>,
                    tonic::Status,
                >,
            > + Send
            + 'a,
    >,
>;

fn service(port: &FakePort, wait: Option<TraceWait>) -> DebugService {
    DebugService::with_ports(DebugPorts {
        tracefs: Some(Arc::new(port.clone())),
        trace_wait: wait,
        ..DebugPorts::new(LogHub::new(LogTreeConfig::default()))
    })
}

fn trace(svc: &DebugService) -> Call<'_> {
    let request = debug::TraceRequest {
        tracer: "nop".into(),
        ..Default::default()
    };
    Box::pin(svc.trace(Request::new(request)))
}

fn poll<T>(f: &mut Pin<Box<dyn Future<Output = T> + Send + '_>>) -> Poll<T> {
    f.as_mut().poll(&mut Context::from_waker(Waker::noop()))
}

#[test]
fn a_call_waits_for_the_session_ending_and_fails_after_the_bound() {
    let port = FakePort::new(FakeTracefs::new());
    let clock = ManualClock::new();
    let wait = TraceWait::new(
        Arc::new(clock.clone()),
        Arc::new(ManualTimer(clock.clone())),
    );
    let svc = service(&port, Some(wait));

    let Poll::Ready(Ok(first)) = poll(&mut trace(&svc)) else {
        panic!("the first session did not start");
    };
    // The next call waits while the first holds the global buffer...
    let mut second = trace(&svc);
    assert!(poll(&mut second).is_pending());
    assert!(poll(&mut second).is_pending());
    // ...and starts once it ends (its teardown runs in the drop).
    drop(first);
    let Poll::Ready(Ok(second)) = poll(&mut second) else {
        panic!("the second session did not start once the first ended");
    };
    assert!(port.fs().global.tracing_on);

    // A session that runs on: the call fails once the bound has passed.
    let mut third = trace(&svc);
    assert!(poll(&mut third).is_pending());
    clock.advance(TRACE_WAIT - Duration::from_millis(1));
    assert!(poll(&mut third).is_pending());
    clock.advance(Duration::from_millis(1));
    let Poll::Ready(Err(status)) = poll(&mut third) else {
        panic!("the third call did not fail after the bound");
    };
    assert_eq!(status.code(), tonic::Code::FailedPrecondition);
    assert!(
        status.message().contains("a trace is already in progress")
            && status.message().contains("waited 2s")
            && status.message().contains("--trace-instances"),
        "{}",
        status.message()
    );
    drop(second);
    assert!(!port.fs().global.tracing_on);
}

#[test]
fn without_a_wait_a_call_is_refused_at_once() {
    let port = FakePort::new(FakeTracefs::new());
    let svc = service(&port, None);
    let Poll::Ready(Ok(_first)) = poll(&mut trace(&svc)) else {
        panic!("the first session did not start");
    };
    let Poll::Ready(Err(status)) = poll(&mut trace(&svc)) else {
        panic!("the second call was not refused at once");
    };
    assert_eq!(status.code(), tonic::Code::FailedPrecondition);
    assert!(!status.message().contains("waited"), "{}", status.message());
}
