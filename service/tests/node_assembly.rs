//! `service::node::assemble`, the wiring the daemon serves: which services
//! each router carries with and without a leadership, and the node's
//! one-time registration.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use futures::executor::block_on;
use http::Request;
use metropolis_core::identity::{Identity, NodeId};
use metropolis_core::leadership::{Leadership, LeadershipConfig};
use metropolis_core::ports::MonotonicClock;
use metropolis_service::elected::SharedLeadership;
use metropolis_service::node::{NodeOptions, NodePorts, NodeServiceSet, assemble};
use metropolis_service::{Readiness, Router};
use metropolis_testkit::clock::ManualClock;
use metropolis_testkit::exec::Tasks;
use metropolis_testkit::forward::Unreachable;
use metropolis_testkit::store::MemKv;
use tonic::body::Body;

const WATCH: &str = "/metropolis.node.core.curator.proto.api.Curator/Watch";
const HEARTBEAT: &str = "/cloud.bmaas.server.api.AgentCallback/Heartbeat";

struct Ready;

impl Readiness for Ready {
    fn unready(&self) -> Option<String> {
        None
    }

    fn subscribe(&self, _: std::task::Waker) {}
}

fn node_id() -> (NodeId, [u8; 32]) {
    let key = [7u8; 32];
    (NodeId::from_public_key(&key), key)
}

fn build(kv: &MemKv, leadership: Option<SharedLeadership>) -> NodeServiceSet {
    let (id, key) = node_id();
    let ports = NodePorts {
        store: Arc::new(kv.clone()),
        leadership,
        spawner: Arc::new(Tasks::new()),
        issuer: None,
        wall_clock: Arc::new(ManualClock::new()),
        readiness: Arc::new(Ready),
        backup: None,
        metrics: None,
    };
    block_on(assemble(ports, NodeOptions::default(), &id, &key)).unwrap()
}

/// The gRPC status code `router` answers a call to `path` with at once
/// (as the caller its service expects: an agent for AgentCallback, the
/// owner otherwise), or `None` if it did not answer at once.
fn code(router: &Router, path: &str) -> Option<tonic::Code> {
    let identity = if path == HEARTBEAT {
        Identity::Agent([1u8; 32])
    } else {
        Identity::Owner
    };
    let mut request = Request::builder()
        .uri(format!("http://metropolis{path}"))
        .header("content-type", "application/grpc")
        .body(Body::empty())
        .unwrap();
    request.extensions_mut().insert(identity);
    let mut call = router.call(request);
    let response = match metropolis_testkit::exec::poll_once(&mut call) {
        std::task::Poll::Ready(response) => response,
        std::task::Poll::Pending => return None,
    };
    let status = response
        .headers()
        .get("grpc-status")
        .map(|v| v.to_str().unwrap().parse::<i32>().unwrap())
        .unwrap_or(0);
    Some(tonic::Code::from(status))
}

#[test]
fn a_node_registers_once() {
    let kv = MemKv::new();
    assert!(build(&kv, None).registered);
    assert!(!build(&kv, None).registered);
}

#[test]
fn the_sole_instance_serves_agents_on_their_own_listener_only() {
    let kv = MemKv::new();
    let node = build(&kv, None);
    assert_eq!(
        code(&node.router, HEARTBEAT),
        Some(tonic::Code::Unimplemented)
    );
    assert_eq!(
        code(&node.agent_router, WATCH),
        Some(tonic::Code::Unimplemented)
    );
    assert_ne!(
        code(&node.agent_router, HEARTBEAT),
        Some(tonic::Code::Unimplemented)
    );
}

#[test]
fn an_elected_instance_takes_forwarded_heartbeats_on_the_curator_listener_and_routes_both() {
    let kv = MemKv::new();
    let clock = ManualClock::new();
    let config = LeadershipConfig {
        lease_ttl: Duration::from_secs(10),
        max_wait: Duration::from_secs(5),
        ..LeadershipConfig::new("node-a", "10.0.0.1:7835")
    };
    let machine = Leadership::new(config, clock.now()).unwrap();
    let shared = SharedLeadership::new(machine, Arc::new(clock), Arc::new(Unreachable));
    let node = build(&kv, Some(shared.clone()));
    // No leader is known yet: both routers hold the calls for one (a
    // router without the leadership would answer at once).
    assert_eq!(code(&node.router, HEARTBEAT), None);
    assert_eq!(code(&node.agent_router, HEARTBEAT), None);
    assert_eq!(code(&node.router, WATCH), None);
    assert_eq!(shared.open_calls(), 0, "dropped calls leave nothing behind");
}
