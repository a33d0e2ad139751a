//! Scenarios of the [`Leadership`] machine, and its fence against the
//! store model. Random event orders are in `proptests`.

#![allow(clippy::unwrap_used)]

mod checker;
mod cluster;
mod proptests;

use std::time::Duration;

use bytes::Bytes;
use metropolis_proto::prelude::storage::LeaderElectionValue;
use prost::Message;

use super::*;
use crate::store::{KeyRange, MemStore, Op, Txn};
use crate::time::Instant;

fn at(ms: u64) -> Instant {
    Instant::from_offset(Duration::from_millis(ms))
}

fn config() -> LeadershipConfig {
    LeadershipConfig {
        lease_ttl: Duration::from_secs(10),
        max_wait: Duration::from_secs(5),
        ..LeadershipConfig::new("node-a", "10.0.0.1:7835")
    }
}

fn key(name: &str, rev: i64) -> ElectionKey {
    ElectionKey {
        key: Bytes::from(format!("election/{name}")),
        create_revision: rev,
    }
}

fn value(node: &str, address: &str) -> Vec<u8> {
    LeaderElectionValue {
        node_id: node.into(),
        ttl: 10,
        curator_address: address.into(),
        schema_version: 1,
    }
    .encode_to_vec()
}

fn actions(m: &mut Leadership) -> Vec<Action> {
    std::iter::from_fn(|| m.poll_action()).collect()
}

fn events(m: &mut Leadership) -> Vec<Event> {
    let events = std::iter::from_fn(|| m.poll_event()).collect();
    m.assert_invariants();
    events
}

fn campaign_of(actions: &[Action]) -> CampaignId {
    actions
        .iter()
        .rev()
        .find_map(|a| match a {
            Action::Campaign { campaign, .. } => Some(*campaign),
            _ => None,
        })
        .unwrap()
}

/// A machine that won campaign 1 at revision `rev` with lease 7 (granted
/// at 0, so alive until 10 s).
fn leader(rev: i64) -> Leadership {
    let mut m = Leadership::new(config(), at(0)).unwrap();
    let c = campaign_of(&actions(&mut m));
    m.handle_lease_granted(at(0), grant(c, 7, 0));
    m.handle_campaign_won(at(0), c, key("a", rev));
    events(&mut m);
    m
}

fn grant(campaign: CampaignId, lease: i64, sent_ms: u64) -> LeaseGrant {
    LeaseGrant {
        campaign,
        lease,
        ttl: Duration::from_secs(10),
        sent_at: at(sent_ms),
    }
}

fn cancelled(request: RequestId, error: LeadershipError) -> Event {
    Event::Cancelled { request, error }
}

fn routed(request: RequestId, route: Route) -> Event {
    Event::Routed { request, route }
}

#[test]
fn errors_are_unavailable_with_the_contract_messages() {
    let cases = [
        (
            LeadershipError::BackendSwitched,
            "curator backend switched, request can be retried",
        ),
        (LeadershipError::NoLeader, "no curator leader"),
        (LeadershipError::LostLeadership, "lost leadership"),
        (
            LeadershipError::ShuttingDown,
            "curator shutting down, request can be retried",
        ),
    ];
    for (error, message) in cases {
        assert_eq!(error.to_string(), message);
    }
}

#[test]
fn config_is_validated() {
    assert!(config().validate().is_ok());
    let bad = [
        LeadershipConfig::new("", "a:1"),
        LeadershipConfig::new("n", ""),
        LeadershipConfig {
            lease_ttl: Duration::from_millis(1500),
            ..config()
        },
        LeadershipConfig {
            lease_ttl: Duration::ZERO,
            ..config()
        },
    ];
    for c in bad {
        assert!(Leadership::new(c, at(0)).is_err());
    }
    let v = config().election_value();
    assert_eq!(
        (
            v.node_id.as_str(),
            v.ttl,
            v.curator_address.as_str(),
            v.schema_version
        ),
        ("node-a", 10, "10.0.0.1:7835", ELECTION_VALUE_SCHEMA_VERSION)
    );
}

#[test]
fn campaign_then_win_routes_waiting_requests_to_serve() {
    let mut m = Leadership::new(config(), at(0)).unwrap();
    let a = actions(&mut m);
    let c = campaign_of(&a);
    assert_eq!(
        a,
        vec![Action::Campaign {
            campaign: c,
            ttl: Duration::from_secs(10),
            value: config().election_value().encode_to_vec().into(),
        }]
    );
    assert_eq!(m.role(), &Role::Campaigning);

    let r1 = m.handle_request(at(100), None);
    let r2 = m.handle_request(at(200), Some(at(1_000)));
    assert_eq!(
        events(&mut m),
        vec![
            routed(r1, Route::Wait { until: at(5_100) }),
            routed(r2, Route::Wait { until: at(1_000) }),
        ]
    );
    assert_eq!(m.poll_timeout(), Some(at(1_000)));

    m.handle_lease_granted(at(300), grant(c, 7, 250));
    m.handle_campaign_won(at(400), c, key("a", 42));
    let role = Role::Leader(LeaderRole {
        key: key("a", 42),
        lease: 7,
    });
    assert_eq!(
        events(&mut m),
        vec![
            Event::RoleChanged {
                epoch: Epoch(2),
                role: role.clone()
            },
            routed(r1, Route::Serve),
            routed(r2, Route::Serve),
        ]
    );
    assert_eq!(m.role(), &role);
    // Only the lease is timed now.
    assert_eq!(m.poll_timeout(), Some(at(10_250)));
    let fence = m.write_fence(at(500), r1).unwrap();
    assert_eq!(fence.key(), Some(&key("a", 42)));
    let r3 = m.handle_request(at(600), None);
    assert_eq!(events(&mut m), vec![routed(r3, Route::Serve)]);
    m.handle_request_finished(at(700), r3);
    assert_eq!(
        m.write_fence(at(700), r3),
        Err(LeadershipError::BackendSwitched)
    );
    assert_eq!(m.in_flight(), 2);
}

#[test]
fn wait_ends_at_the_deadline_or_the_cap() {
    let mut m = Leadership::new(config(), at(0)).unwrap();
    let _ = actions(&mut m);
    let capped = m.handle_request(at(0), Some(at(60_000)));
    let short = m.handle_request(at(0), Some(at(2_000)));
    let past = m.handle_request(at(0), Some(at(0)));
    assert_eq!(
        events(&mut m)[2],
        routed(past, Route::Reject(LeadershipError::NoLeader))
    );
    m.handle_timeout(at(1_999));
    assert_eq!(events(&mut m), vec![]);
    m.handle_timeout(at(2_000));
    assert_eq!(
        events(&mut m),
        vec![routed(short, Route::Reject(LeadershipError::NoLeader))]
    );
    assert_eq!(m.poll_timeout(), Some(at(5_000)));
    // Any later input runs the due timer first.
    let late = m.handle_request(at(5_000), None);
    assert_eq!(
        events(&mut m),
        vec![
            routed(capped, Route::Reject(LeadershipError::NoLeader)),
            routed(late, Route::Wait { until: at(10_000) }),
        ]
    );

    let mut never = Leadership::new(
        LeadershipConfig {
            max_wait: Duration::ZERO,
            ..config()
        },
        at(0),
    )
    .unwrap();
    let r = never.handle_request(at(0), None);
    assert_eq!(
        events(&mut never),
        vec![routed(r, Route::Reject(LeadershipError::NoLeader))]
    );
}

#[test]
fn follower_forwards_and_cancels_when_its_leader_goes() {
    let mut m = Leadership::new(config(), at(0)).unwrap();
    let _ = actions(&mut m);
    let waiting = m.handle_request(at(0), None);
    m.handle_leader_observed(at(10), key("b", 5), &value("node-b", "10.0.0.2:7835"));
    let forward = Route::Forward {
        node_id: "node-b".into(),
        address: "10.0.0.2:7835".into(),
    };
    let ev = events(&mut m);
    assert!(
        matches!(&ev[1], Event::RoleChanged { role: Role::Follower(f), .. } if f.key == key("b", 5))
    );
    assert_eq!(ev[2], routed(waiting, forward.clone()));
    let r = m.handle_request(at(20), None);
    assert_eq!(events(&mut m)[0], routed(r, forward));
    // A follower never writes.
    assert_eq!(
        m.write_fence(at(20), r),
        Err(LeadershipError::BackendSwitched)
    );

    // An older key is stale; the same key again changes nothing.
    m.handle_leader_observed(at(30), key("c", 4), &value("node-c", "10.0.0.3:7835"));
    m.handle_leader_observed(at(30), key("b", 5), &value("node-b", "10.0.0.2:7835"));
    m.handle_leader_deleted(at(30), &key("c", 4));
    assert_eq!(events(&mut m), vec![]);

    m.handle_leader_deleted(at(40), &key("b", 5));
    assert_eq!(
        events(&mut m),
        vec![
            cancelled(waiting, LeadershipError::BackendSwitched),
            cancelled(r, LeadershipError::BackendSwitched),
            Event::RoleChanged {
                epoch: Epoch(3),
                role: Role::Campaigning
            },
        ]
    );
    // The deleted key does not come back.
    m.handle_leader_observed(at(50), key("b", 5), &value("node-b", "10.0.0.2:7835"));
    assert_eq!(m.role(), &Role::Campaigning);
    // The election port keeps the campaign: no action.
    assert_eq!(actions(&mut m), vec![]);
}

#[test]
fn a_new_leader_cancels_requests_forwarded_to_the_old_one() {
    let mut m = Leadership::new(config(), at(0)).unwrap();
    m.handle_leader_observed(at(0), key("b", 5), &value("node-b", "b:1"));
    let r = m.handle_request(at(0), None);
    events(&mut m);
    m.handle_leader_observed(at(1), key("c", 9), &value("node-c", "c:1"));
    let ev = events(&mut m);
    assert_eq!(ev[0], cancelled(r, LeadershipError::BackendSwitched));
    assert!(
        matches!(&ev[1], Event::RoleChanged { role: Role::Follower(f), .. } if f.leader.node_id == "node-c")
    );
}

#[test]
fn a_new_address_for_the_same_leader_is_a_new_role() {
    let mut m = Leadership::new(config(), at(0)).unwrap();
    m.handle_leader_observed(at(0), key("b", 5), &value("node-b", "b:1"));
    let r = m.handle_request(at(0), None);
    events(&mut m);
    m.handle_leader_observed(at(1), key("b", 5), &value("node-b", "b:2"));
    let r2 = m.handle_request(at(1), None);
    let ev = events(&mut m);
    assert_eq!(ev[0], cancelled(r, LeadershipError::BackendSwitched));
    assert_eq!(
        ev[2],
        routed(
            r2,
            Route::Forward {
                node_id: "node-b".into(),
                address: "b:2".into()
            }
        )
    );
}

#[test]
fn unusable_or_own_values_are_not_forwarded_to() {
    for v in [
        b"\xff\xff".to_vec(),
        value("node-b", ""),
        // An older key of this very node (say, from before a restart).
        value("node-a", "10.0.0.1:7835"),
    ] {
        let mut m = Leadership::new(config(), at(0)).unwrap();
        let r = m.handle_request(at(0), None);
        m.handle_leader_observed(at(0), key("x", 3), &v);
        assert_eq!(m.role(), &Role::Campaigning);
        assert_eq!(
            events(&mut m),
            vec![routed(r, Route::Wait { until: at(5_000) })]
        );
    }
}

#[test]
fn own_key_observed_before_the_win_arrives() {
    let mut m = Leadership::new(config(), at(0)).unwrap();
    let c = campaign_of(&actions(&mut m));
    m.handle_lease_granted(at(0), grant(c, 7, 0));
    m.handle_leader_observed(at(1), key("a", 8), &value("node-a", "10.0.0.1:7835"));
    assert_eq!(m.role(), &Role::Campaigning);
    m.handle_campaign_won(at(2), c, key("a", 8));
    assert!(m.role().is_leader());
}

#[test]
fn stale_campaign_reports_are_ignored() {
    let mut m = leader(42);
    // Campaign 99 does not exist; campaign 1's lease is 7, not 8.
    m.handle_lease_lost(at(1), CampaignId(99));
    m.handle_lease_granted(at(1), grant(CampaignId(1), 8, 9_000));
    m.handle_campaign_won(at(1), CampaignId(99), key("z", 50));
    assert_eq!(events(&mut m), vec![]);
    assert_eq!(actions(&mut m), vec![]);
    assert!(m.role().is_leader());
    // An older leader observed after the win is stale too.
    m.handle_leader_observed(at(1), key("old", 40), &value("node-b", "b:1"));
    assert!(m.role().is_leader());
}

#[test]
fn a_win_without_a_lease_or_behind_a_newer_leader_restarts_the_campaign() {
    let mut m = Leadership::new(config(), at(0)).unwrap();
    let c = campaign_of(&actions(&mut m));
    m.handle_campaign_won(at(0), c, key("a", 3));
    let a = actions(&mut m);
    assert_eq!(
        a[0],
        Action::Abandon {
            campaign: c,
            lease: None
        }
    );
    let c2 = campaign_of(&a);
    assert_ne!(c, c2);
    assert_eq!(m.role(), &Role::Campaigning);

    m.handle_lease_granted(at(0), grant(c2, 11, 0));
    m.handle_leader_observed(at(0), key("b", 20), &value("node-b", "b:1"));
    m.handle_campaign_won(at(0), c2, key("a", 12));
    assert_eq!(
        actions(&mut m)[0],
        Action::Abandon {
            campaign: c2,
            lease: Some(11)
        }
    );
    assert!(matches!(m.role(), Role::Follower(_)));
}

#[test]
fn leader_steps_down_when_its_lease_runs_out() {
    let mut m = leader(42);
    let r = m.handle_request(at(1_000), None);
    // Renewal sent at 4 s: alive until 14 s. A renewal of an older send
    // does not shorten it.
    m.handle_lease_granted(at(4_100), grant(CampaignId(1), 7, 4_000));
    m.handle_lease_granted(at(4_200), grant(CampaignId(1), 7, 1_000));
    assert_eq!(m.poll_timeout(), Some(at(14_000)));
    m.handle_timeout(at(13_999));
    assert!(m.role().is_leader());
    events(&mut m);
    // Not even a write at the expiry instant gets a fence.
    assert_eq!(
        m.write_fence(at(14_000), r),
        Err(LeadershipError::BackendSwitched)
    );
    assert_eq!(
        events(&mut m),
        vec![
            cancelled(r, LeadershipError::BackendSwitched),
            Event::RoleChanged {
                epoch: Epoch(3),
                role: Role::Campaigning
            },
        ]
    );
    let a = actions(&mut m);
    assert_eq!(
        a[0],
        Action::Abandon {
            campaign: CampaignId(1),
            lease: Some(7)
        }
    );
    assert_eq!(campaign_of(&a), CampaignId(2));
    // Its own key, still observed before the revocation lands, is not a
    // leader to follow.
    m.handle_leader_observed(at(14_001), key("a", 42), &value("node-a", "10.0.0.1:7835"));
    assert_eq!(m.role(), &Role::Campaigning);
}

#[test]
fn lease_lost_and_key_deleted_end_the_leadership() {
    let mut m = leader(42);
    m.handle_lease_lost(at(5), CampaignId(1));
    assert_eq!(m.role(), &Role::Campaigning);
    assert_eq!(campaign_of(&actions(&mut m)), CampaignId(2));

    let mut m = leader(42);
    m.handle_leader_deleted(at(5), &key("a", 42));
    assert_eq!(m.role(), &Role::Campaigning);
    assert_eq!(campaign_of(&actions(&mut m)), CampaignId(2));

    let mut m = leader(42);
    m.handle_leader_observed(at(5), key("b", 50), &value("node-b", "b:1"));
    assert!(matches!(m.role(), Role::Follower(_)));
    assert_eq!(campaign_of(&actions(&mut m)), CampaignId(2));
}

#[test]
fn failed_fence_cancels_with_lost_leadership() {
    let mut m = leader(42);
    let r1 = m.handle_request(at(1), None);
    let r2 = m.handle_request(at(1), None);
    events(&mut m);
    m.handle_fence_failed(at(2), r2);
    assert_eq!(
        events(&mut m),
        vec![
            cancelled(r1, LeadershipError::BackendSwitched),
            cancelled(r2, LeadershipError::LostLeadership),
            Event::RoleChanged {
                epoch: Epoch(3),
                role: Role::Campaigning
            },
        ]
    );
    assert_eq!(campaign_of(&actions(&mut m)), CampaignId(2));
    // A second report of the same (ended) leadership is ignored.
    m.handle_fence_failed(at(3), r1);
    assert_eq!(events(&mut m), vec![]);
    assert_eq!(
        m.write_fence(at(3), r1),
        Err(LeadershipError::BackendSwitched)
    );
}

#[test]
fn shutdown_ends_everything_and_revokes_the_lease() {
    let mut m = leader(42);
    let r = m.handle_request(at(1), None);
    events(&mut m);
    m.handle_shutdown(at(2));
    assert_eq!(
        events(&mut m),
        vec![
            cancelled(r, LeadershipError::ShuttingDown),
            Event::RoleChanged {
                epoch: Epoch(3),
                role: Role::Stopped
            },
        ]
    );
    assert_eq!(
        actions(&mut m),
        vec![Action::Abandon {
            campaign: CampaignId(1),
            lease: Some(7)
        }]
    );
    let late = m.handle_request(at(3), None);
    m.handle_leader_observed(at(3), key("b", 50), &value("node-b", "b:1"));
    m.handle_shutdown(at(4));
    assert_eq!(
        events(&mut m),
        vec![routed(late, Route::Reject(LeadershipError::ShuttingDown))]
    );
    assert_eq!(m.poll_timeout(), None);

    let mut waiting = Leadership::new(config(), at(0)).unwrap();
    let w = waiting.handle_request(at(0), None);
    events(&mut waiting);
    waiting.handle_shutdown(at(1));
    assert_eq!(
        events(&mut waiting)[0],
        routed(w, Route::Reject(LeadershipError::ShuttingDown))
    );
}

#[test]
fn embedded_is_always_leader_and_unfenced() {
    let mut m = Leadership::embedded(at(0));
    assert_eq!(m.role(), &Role::Sole);
    assert_eq!(actions(&mut m), vec![]);
    let r = m.handle_request(at(0), None);
    m.handle_leader_observed(at(0), key("b", 5), &value("node-b", "b:1"));
    m.handle_lease_lost(at(0), CampaignId(1));
    m.handle_fence_failed(at(0), r);
    assert_eq!(events(&mut m), vec![routed(r, Route::Serve)]);
    let fence = m.write_fence(at(1), r).unwrap();
    assert_eq!((fence.key(), fence.compare()), (None, None));
    let txn = Txn {
        success: vec![Op::Range(KeyRange::Prefix(Bytes::new()))],
        ..Default::default()
    };
    assert_eq!(fence.guard(txn.clone()), txn);
    assert_eq!(m.poll_timeout(), None);
    m.handle_shutdown(at(2));
    assert_eq!(m.role(), &Role::Stopped);
}

/// The fence against the store model: a write commits while the election
/// key exists with the won revision, and not once the lease that holds it
/// is gone, even if the key is recreated; a failed compare of the
/// transaction's own is told apart from a failed fence.
#[test]
fn fence_against_the_store() {
    let mut store = MemStore::new();
    let lease = store
        .lease_grant(0, Duration::from_secs(10), at(0))
        .unwrap();
    let election = Bytes::from_static(b"election/a");
    let put = |key: &'static str, lease| Op::Put {
        key: Bytes::from_static(key.as_bytes()),
        value: Bytes::from_static(b"v"),
        lease,
    };
    let response = store
        .txn(&Txn {
            success: vec![Op::Put {
                key: election.clone(),
                value: Bytes::new(),
                lease,
            }],
            ..Default::default()
        })
        .unwrap();
    let won = ElectionKey {
        key: election.clone(),
        create_revision: response.revision,
    };
    let fence = Fence::election(won.clone());
    assert_eq!(fence.key(), Some(&won));

    let write = Txn {
        success: vec![put("nodes/1", 0)],
        failure: vec![Op::Range(KeyRange::Key(Bytes::from_static(b"nodes/1")))],
        ..Default::default()
    };
    let guarded = fence.guard(write.clone());
    assert_eq!(guarded.compares.len(), 1);
    let response = store.txn(&guarded).unwrap();
    assert!(response.succeeded);
    assert_eq!(fence.check(&response), FenceCheck::Held);

    // The transaction's own compare fails: the fence still held.
    let mut own = write.clone();
    own.compares.push(crate::store::Compare {
        key: Bytes::from_static(b"nodes/1"),
        op: crate::store::CmpOp::Equal,
        target: crate::store::CompareTarget::Version(99),
    });
    let response = store.txn(&fence.guard(own)).unwrap();
    assert!(!response.succeeded);
    assert_eq!(response.results.len(), 2, "own failure result kept first");
    assert_eq!(fence.check(&response), FenceCheck::Held);

    // The lease ends; a new campaign recreates the key at a later revision.
    store.lease_revoke(lease).unwrap();
    let before = store.revision();
    let response = store.txn(&fence.guard(write.clone())).unwrap();
    assert!(!response.succeeded);
    assert_eq!(store.revision(), before, "nothing committed");
    assert_eq!(fence.check(&response), FenceCheck::Lost);
    store
        .txn(&Txn {
            success: vec![put("election/a", 0)],
            ..Default::default()
        })
        .unwrap();
    let response = store.txn(&fence.guard(write)).unwrap();
    assert!(!response.succeeded);
    assert_eq!(fence.check(&response), FenceCheck::Lost);

    // A response that does not carry the election key read is not trusted.
    let truncated = crate::store::TxnResponse {
        succeeded: false,
        revision: 1,
        results: vec![],
    };
    assert_eq!(fence.check(&truncated), FenceCheck::Lost);
}

#[test]
fn same_inputs_same_outputs() {
    let run = || {
        let mut m = leader(42);
        let a = m.handle_request(at(1), None);
        m.handle_leader_observed(at(2), key("b", 50), &value("node-b", "b:1"));
        let b = m.handle_request(at(3), Some(at(4)));
        m.handle_leader_deleted(at(4), &key("b", 50));
        let c = m.handle_request(at(5), Some(at(6)));
        m.handle_timeout(at(7));
        m.handle_request_finished(at(8), a);
        (a, b, c, actions(&mut m), events(&mut m))
    };
    assert_eq!(run(), run());
}

#[test]
fn an_unreachable_leader_holds_requests_until_the_next_leader() {
    let mut m = Leadership::new(config(), at(0)).unwrap();
    let _ = actions(&mut m);
    m.handle_leader_observed(at(0), key("b", 5), &value("node-b", "b:1"));
    let failed = m.handle_request(at(10), None);
    events(&mut m);
    assert!(!m.leader_unreachable());
    m.handle_forward_failed(at(20), failed);
    assert!(m.leader_unreachable());
    // Held: new requests wait (deadline or the maximum wait), none is
    // forwarded to the leader that could not be reached.
    let held = m.handle_request(at(30), Some(at(4_000)));
    assert_eq!(
        events(&mut m),
        vec![routed(held, Route::Wait { until: at(4_000) })]
    );
    assert_eq!(m.poll_timeout(), Some(at(4_000)));
    // The next leader: the held request goes to it at once.
    m.handle_leader_observed(at(2_000), key("c", 9), &value("node-c", "c:1"));
    let ev = events(&mut m);
    assert_eq!(ev[0], cancelled(failed, LeadershipError::BackendSwitched));
    assert!(
        matches!(&ev[1], Event::RoleChanged { role: Role::Follower(f), .. } if f.leader.node_id == "node-c")
    );
    assert_eq!(
        ev[2],
        routed(
            held,
            Route::Forward {
                node_id: "node-c".into(),
                address: "c:1".into()
            }
        )
    );
    assert!(!m.leader_unreachable());
    // A report about a request of the ended role changes nothing.
    m.handle_forward_failed(at(2_100), failed);
    assert!(!m.leader_unreachable());
    let r = m.handle_request(at(2_200), None);
    assert!(
        matches!(&events(&mut m)[0], Event::Routed { request, route: Route::Forward { .. } } if *request == r)
    );
}

#[test]
fn a_hold_ends_after_a_lease_ttl_and_forwards_to_the_same_leader() {
    let config = LeadershipConfig {
        max_wait: Duration::from_secs(30),
        ..config()
    };
    let mut m = Leadership::new(config, at(0)).unwrap();
    let _ = actions(&mut m);
    m.handle_leader_observed(at(0), key("b", 5), &value("node-b", "b:1"));
    let to_b = Route::Forward {
        node_id: "node-b".into(),
        address: "b:1".into(),
    };
    let failed = m.handle_request(at(0), None);
    events(&mut m);
    m.handle_forward_failed(at(1_000), failed);
    // A request arriving during the hold waits; a report about it (it
    // was never forwarded) does not extend the hold.
    let also = m.handle_request(at(1_500), None);
    assert_eq!(
        events(&mut m),
        vec![routed(also, Route::Wait { until: at(31_500) })]
    );
    m.handle_forward_failed(at(2_000), also);
    // The hold lasts the lease TTL (10 s) from the failure.
    assert_eq!(m.poll_timeout(), Some(at(11_000)));
    m.handle_timeout(at(11_000));
    assert_eq!(events(&mut m), vec![routed(also, to_b.clone())]);
    assert!(!m.leader_unreachable());
    let r = m.handle_request(at(11_100), None);
    assert_eq!(events(&mut m), vec![routed(r, to_b)]);
    assert_eq!(m.poll_timeout(), None);
}
