//! `grpc.health.v1.Health` through a [`Router`]: Check and Watch from the
//! monitor's conditions, unknown names, shutdown, and an elected instance
//! with no leader answering at once.

#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};
use std::task::Waker;
use std::time::Duration;

use bytes::Bytes;
use futures::FutureExt;
use futures::executor::block_on;
use metropolis_proto::prelude::debug::GetDebugKubeconfigRequest;
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};
use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
use tonic_reflection::pb::v1::{ServerReflectionRequest, ServerReflectionResponse};

use super::grpc::{Reply, call};
use crate::debug::{DebugService, LogHub};
use crate::elected::SharedLeadership;
use crate::forward::{Connector, Upstream};
use crate::{HealthMonitor, Readiness, Router};
use metropolis_core::leadership::{Action, ElectionKey, Leadership, LeadershipConfig, LeaseGrant};
use metropolis_core::logtree::LogTreeConfig;
use metropolis_core::ports::MonotonicClock;
use metropolis_core::time::Instant;

const DEBUG: &str = "metropolis.proto.api.NodeDebugService";
const CHECK: &str = "/grpc.health.v1.Health/Check";
const WATCH: &str = "/grpc.health.v1.Health/Watch";

/// A condition set by hand.
#[derive(Default)]
struct Flag(Mutex<(Option<String>, Vec<Waker>)>);

impl Flag {
    fn set(&self, why: Option<&str>) {
        let wakers = {
            let mut state = self.0.lock().unwrap();
            state.0 = why.map(str::to_owned);
            state.1.clone()
        };
        for waker in wakers {
            waker.wake();
        }
    }
}

impl Readiness for Flag {
    fn unready(&self) -> Option<String> {
        self.0.lock().unwrap().0.clone()
    }

    fn subscribe(&self, waker: Waker) {
        self.0.lock().unwrap().1.push(waker);
    }
}

fn debug_router() -> Router {
    let debug = DebugService::new(LogHub::new(LogTreeConfig::default()), None);
    Router::new().with_service(debug.server())
}

/// A router with the debug service, health following `flag`.
fn setup() -> (Router, HealthMonitor, Arc<Flag>) {
    let flag = Arc::new(Flag::default());
    let monitor = HealthMonitor::new().with_condition(flag.clone());
    (
        debug_router().with_health_and_reflection(&monitor),
        monitor,
        flag,
    )
}

fn ask(service: &str) -> [HealthCheckRequest; 1] {
    [HealthCheckRequest {
        service: service.into(),
    }]
}

/// The answer of Check for `service`, which must come at once.
fn check(router: &Router, service: &str) -> Result<ServingStatus, tonic::Status> {
    let response = router
        .call(call(CHECK, &ask(service)))
        .now_or_never()
        .expect("Check answers at once");
    let mut reply = Reply::new(response);
    let message: HealthCheckResponse = block_on(reply.message())?.expect("one message");
    Ok(message.status())
}

fn watch(router: &Router, service: &str) -> Reply {
    Reply::new(block_on(router.call(call(WATCH, &ask(service)))))
}

/// The next status sent, which must be ready (never waits: a broken
/// stream fails the test instead of hanging it).
fn next(reply: &mut Reply) -> ServingStatus {
    let message: HealthCheckResponse = (reply.message().now_or_never())
        .expect("a status is ready")
        .unwrap()
        .unwrap();
    message.status()
}

fn pending(reply: &mut Reply) -> bool {
    reply
        .message::<HealthCheckResponse>()
        .now_or_never()
        .is_none()
}

#[test]
fn check_is_serving_for_the_whole_server_and_each_service_while_conditions_hold() {
    let (router, _, _) = setup();
    for service in [
        "",
        DEBUG,
        "grpc.health.v1.Health",
        "grpc.reflection.v1.ServerReflection",
    ] {
        assert_eq!(
            check(&router, service).unwrap(),
            ServingStatus::Serving,
            "{service:?}"
        );
    }
}

#[test]
fn check_is_not_serving_while_a_condition_fails() {
    let (router, _, flag) = setup();
    flag.set(Some("the store failed"));
    assert_eq!(check(&router, "").unwrap(), ServingStatus::NotServing);
    assert_eq!(check(&router, DEBUG).unwrap(), ServingStatus::NotServing);
    // The services answered locally still answer.
    assert_eq!(
        check(&router, "grpc.health.v1.Health").unwrap(),
        ServingStatus::Serving
    );
    flag.set(None);
    assert_eq!(check(&router, "").unwrap(), ServingStatus::Serving);
}

#[test]
fn check_of_an_unknown_service_is_not_found_quoting_a_bounded_prefix() {
    let (router, _, _) = setup();
    let e = check(&router, "no.such.Service").unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    assert!(
        e.message().contains("\"no.such.Service\""),
        "{}",
        e.message()
    );
    let long = "x".repeat(10_000);
    let e = check(&router, &long).unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    assert!(e.message().len() < 300, "{} bytes", e.message().len());
}

#[test]
fn watch_sends_the_status_at_once_then_each_change() {
    let (router, _, flag) = setup();
    let mut reply = watch(&router, DEBUG);
    assert_eq!(next(&mut reply), ServingStatus::Serving);
    assert!(pending(&mut reply), "nothing changed");
    flag.set(Some("no curator leader is known"));
    assert_eq!(next(&mut reply), ServingStatus::NotServing);
    // A wake-up without a change of status sends nothing.
    flag.set(Some("still no leader"));
    assert!(pending(&mut reply));
    flag.set(None);
    assert_eq!(next(&mut reply), ServingStatus::Serving);
}

#[test]
fn watch_of_an_unknown_service_says_so_and_stays_open_until_shutdown() {
    let (router, monitor, flag) = setup();
    let mut reply = watch(&router, "no.such.Service");
    assert_eq!(next(&mut reply), ServingStatus::ServiceUnknown);
    flag.set(Some("failed"));
    assert!(pending(&mut reply), "still open, nothing new");
    monitor.shut_down();
    let e = (reply.message::<HealthCheckResponse>().now_or_never())
        .expect("the stream ends at once")
        .unwrap_err();
    assert_eq!(e.code(), Code::Unavailable);
}

#[test]
fn shutdown_ends_watches_and_checks_say_not_serving() {
    let (router, monitor, _) = setup();
    let mut reply = watch(&router, "");
    assert_eq!(next(&mut reply), ServingStatus::Serving);
    monitor.shut_down();
    let e = (reply.message::<HealthCheckResponse>().now_or_never())
        .expect("the stream ends at once")
        .unwrap_err();
    assert_eq!(e.code(), Code::Unavailable);
    assert_eq!(check(&router, "").unwrap(), ServingStatus::NotServing);
    assert_eq!(
        check(&router, "grpc.health.v1.Health").unwrap(),
        ServingStatus::NotServing
    );
}

struct Clock;

impl MonotonicClock for Clock {
    fn now(&self) -> Instant {
        Instant::from_offset(Duration::ZERO)
    }
}

struct NoLeader;

impl Connector for NoLeader {
    fn connect(&self, _: &str, _: &str) -> Arc<dyn Upstream> {
        unreachable!("these tests never follow a leader")
    }
}

#[test]
fn an_elected_instance_without_leader_answers_health_at_once_and_follows_the_election() {
    let config = LeadershipConfig::new("node-a", "10.0.0.1:7835");
    let machine = Leadership::new(config, Clock.now()).unwrap();
    let leadership = SharedLeadership::new(machine, Arc::new(Clock), Arc::new(NoLeader));
    let monitor = HealthMonitor::new().with_condition(Arc::new(leadership.clone()));
    let router = debug_router()
        .with_routing(Arc::new(leadership.clone()))
        .with_health_and_reflection(&monitor);

    // A routed call is held while no leader is known ...
    let held = call(
        "/metropolis.proto.api.NodeDebugService/GetDebugKubeconfig",
        &[GetDebugKubeconfigRequest::default()],
    );
    assert!(
        router.call(held).now_or_never().is_none(),
        "routed calls wait"
    );
    // ... health is not: it answers at once, and truthfully.
    assert_eq!(check(&router, "").unwrap(), ServingStatus::NotServing);
    assert_eq!(check(&router, DEBUG).unwrap(), ServingStatus::NotServing);
    let mut reply = watch(&router, "");
    assert_eq!(next(&mut reply), ServingStatus::NotServing);
    assert!(pending(&mut reply));
    // Reflection too.
    let list = [ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    }];
    let listing = router
        .call(call(
            "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
            &list,
        ))
        .now_or_never()
        .expect("reflection answers at once");
    let answer: ServerReflectionResponse =
        block_on(Reply::new(listing).message()).unwrap().unwrap();
    assert!(answer.message_response.is_some());

    let campaign = std::iter::from_fn(|| leadership.poll_action())
        .find_map(|a| match a {
            Action::Campaign { campaign, .. } => Some(campaign),
            _ => None,
        })
        .unwrap();
    let key = ElectionKey {
        key: Bytes::from_static(b"election/a"),
        create_revision: 1,
    };
    leadership.input(|m, now| {
        let grant = LeaseGrant {
            campaign,
            lease: 7,
            ttl: Duration::from_secs(60),
            sent_at: now,
        };
        m.handle_lease_granted(now, grant);
        m.handle_campaign_won(now, campaign, key);
    });
    assert!(leadership.role().is_leader());
    assert_eq!(next(&mut reply), ServingStatus::Serving);
    assert_eq!(check(&router, "").unwrap(), ServingStatus::Serving);

    // Shutting down stops the leadership: health says so.
    leadership.input(|m, now| m.handle_shutdown(now));
    assert_eq!(next(&mut reply), ServingStatus::NotServing);
}
