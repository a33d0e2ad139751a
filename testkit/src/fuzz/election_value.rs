//! `leader_election_value`: the `LeaderElectionValue` bytes a curator
//! reads back from the store, the way the elected driver reads them:
//! candidates written into the store model ([`MemKv`]) under an election
//! prefix, followed by [`Election::observe`], every observation fed to a
//! [`Leadership`] machine that decodes the leader's value and decides
//! whether it can forward to it.
//!
//! Input: this instance's node ID (a one-byte-length string; empty means
//! `node-a`), then operations until the input ends, each an operation
//! byte: `% 4` is 0: put candidate `election/{k}` (`k` the next byte
//! `% 4`) with a `u16`-length-prefixed value (a new key gets the next
//! create revision, an existing one keeps its own); 1: delete candidate
//! `k`; 2: compact the store; 3: break the store's watches (the
//! observation ends and is started again, as the driver does).
//!
//! Checked after every operation (the leader is the candidate with the
//! lowest create revision): the machine follows the leader exactly when
//! its value decodes, has a curator address and names another node than
//! this one, with exactly the decoded value; otherwise it campaigns. A
//! new request is forwarded to the decoded node ID and address, or waits;
//! a request that waited is forwarded once a usable leader appears. Every
//! value that decodes re-encodes to at most its own length and decodes
//! to the same value. Nothing panics, the observation never fails but
//! where the watches were broken.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};
use metropolis_core::leadership::{Event, Leadership, LeadershipConfig, RequestId, Role, Route};
use metropolis_core::store::StoreError;
use metropolis_core::time::Instant;
use metropolis_proto::prelude::storage::LeaderElectionValue;
use metropolis_service::elected::election::{Election, Observation};
use prost::Message;

use super::input::Input;
use crate::store::MemKv;

/// The election's prefix in the store.
pub const PREFIX: &str = "election/";

/// The address this instance campaigns with.
const OWN_ADDRESS: &str = "10.0.0.1:7835";

type Observations = BoxStream<'static, Result<Observation, StoreError>>;

/// What the machine must do with `value`: follow the value it decodes to,
/// if that has an address and is another node's.
fn usable(own: &str, value: &[u8]) -> Option<LeaderElectionValue> {
    let decoded = LeaderElectionValue::decode(value).ok()?;
    let again = decoded.encode_to_vec();
    assert!(
        again.len() <= value.len(),
        "{} bytes re-encode to {}",
        value.len(),
        again.len()
    );
    assert_eq!(
        LeaderElectionValue::decode(again.as_slice()).ok().as_ref(),
        Some(&decoded),
        "a decoded value does not survive re-encoding"
    );
    (!decoded.curator_address.is_empty() && decoded.node_id != own).then_some(decoded)
}

/// Feeds every observation ready now to the machine; false if the stream
/// failed (or ended).
fn observe(machine: &mut Leadership, now: Instant, observations: &mut Observations) -> bool {
    loop {
        match observations.next().now_or_never() {
            None => return true,
            Some(Some(Ok(Observation::Leader(leader)))) => {
                machine.handle_leader_observed(now, leader.key, &leader.value)
            }
            Some(Some(Ok(Observation::Gone(key)))) => machine.handle_leader_deleted(now, &key),
            Some(Some(Err(_)) | None) => return false,
        }
    }
}

/// The routes the machine gave since last asked, by request.
fn routes(machine: &mut Leadership) -> BTreeMap<RequestId, Route> {
    let mut routes = BTreeMap::new();
    while let Some(event) = machine.poll_event() {
        if let Event::Routed { request, route } = event {
            routes.insert(request, route);
        }
    }
    routes
}

fn forward(value: &LeaderElectionValue) -> Route {
    Route::Forward {
        node_id: value.node_id.clone(),
        address: value.curator_address.clone(),
    }
}

/// Runs one input.
pub fn run(data: &[u8]) {
    let mut input = Input::new(data);
    let mut own = input.short_string();
    if own.is_empty() {
        own = "node-a".to_string();
    }
    let now = Instant::from_offset(std::time::Duration::ZERO);
    let Ok(mut machine) = Leadership::new(LeadershipConfig::new(own.clone(), OWN_ADDRESS), now)
    else {
        panic!("a valid configuration was refused");
    };
    while machine.poll_action().is_some() {}
    let kv = MemKv::new();
    let election = Election::new(Arc::new(kv.clone()), PREFIX);
    let mut observations = election.observe();
    // The first poll reads the (empty) candidates and starts the watch.
    assert!(
        observe(&mut machine, now, &mut observations),
        "observing failed"
    );
    // Candidate index -> (create revision, value).
    let mut candidates: BTreeMap<u8, (i64, Vec<u8>)> = BTreeMap::new();
    let mut waiter: Option<RequestId> = None;
    while !input.is_empty() {
        let op = input.u8();
        match op % 4 {
            0 => {
                let k = input.u8() % 4;
                let value = input.lp().to_vec();
                let revision = kv.put(format!("{PREFIX}{k}"), &value);
                let entry = candidates.entry(k).or_insert((revision, Vec::new()));
                entry.1 = value;
            }
            1 => {
                let k = input.u8() % 4;
                kv.delete(format!("{PREFIX}{k}"));
                candidates.remove(&k);
            }
            2 => kv.compact(),
            _ => {
                kv.break_watches();
                assert!(
                    !observe(&mut machine, now, &mut observations),
                    "the observation outlived its broken watch"
                );
                observations = election.observe();
            }
        }
        assert!(
            observe(&mut machine, now, &mut observations),
            "the observation failed on a sound store"
        );
        let leader = candidates.values().min_by_key(|(revision, _)| *revision);
        let expected = leader.and_then(|(_, value)| usable(&own, value));
        match (&expected, machine.role()) {
            (Some(value), Role::Follower(f)) => assert_eq!(&f.leader, value, "follows another"),
            (None, Role::Campaigning) => {}
            (expected, role) => panic!("role {role:?}, expected to follow {expected:?}"),
        }
        let mut routed = routes(&mut machine);
        if let (Some(w), Some(value)) = (waiter, &expected) {
            assert_eq!(
                routed.remove(&w),
                Some(forward(value)),
                "the waiting request was not forwarded"
            );
            machine.handle_request_finished(now, w);
            waiter = None;
        }
        let probe = machine.handle_request(now, None);
        let route = routes(&mut machine).remove(&probe);
        match (&expected, route) {
            (Some(value), Some(route)) => assert_eq!(route, forward(value), "probe misrouted"),
            (None, Some(Route::Wait { .. })) => {}
            (_, route) => panic!("probe routed {route:?}, expected to follow {expected:?}"),
        }
        if expected.is_some() || waiter.is_some() {
            machine.handle_request_finished(now, probe);
        } else {
            waiter = Some(probe);
        }
    }
}
