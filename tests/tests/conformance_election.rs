//! Conformance with the reference: re-expresses, over gRPC against real
//! `metropolisd` instances elected over a real etcd, the test cases of
//! Monogon's `metropolis/node/core/curator/listener_test.go` (at
//! `2d91aa32^`: TestListenerSwitch) and
//! `metropolis/node/core/curator/curator_test.go`
//! (TestLeaderElectionStatus): a call in flight when its instance's role
//! changes ends Unavailable ("curator backend switched, request can be
//! retried") and the new leader serves; one leader, the others following
//! it; a leader cut off from etcd is replaced by another with a new
//! election key.
//!
//! Needs `etcd` (Debian `etcd-server`): the `system` feature.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use futures::StreamExt;
use metropolis_etcd::EtcdStore;
use metropolis_node::cluster::DEFAULT_ELECTION_PREFIX;
use metropolis_proto::prelude::{common, curator, storage::LeaderElectionValue};
use metropolis_service::elected::election::Leader;
use metropolis_tests::cluster::{Curators, LEASE_TTL_S, share_ca, start_elected};
use metropolis_tests::etcd::Etcd;
use metropolis_tests::{Daemon, RuntimeKind, curator, watch_nodes};
use prost::Message;
use tonic::Code;

const TTL: Duration = Duration::from_secs(LEASE_TTL_S);
const SWITCHED: &str = "curator backend switched, request can be retried";
const MIXED: [RuntimeKind; 3] = [RuntimeKind::Tokio, RuntimeKind::Smol, RuntimeKind::Tokio];

/// `d`'s own node updates its status over `d`'s local socket.
async fn update_own(d: &Daemon, addr: &str) -> Result<(), tonic::Status> {
    let req = curator::UpdateNodeStatusRequest {
        node_id: d.node_id().to_string(),
        status: Some(common::NodeStatus {
            external_address: addr.into(),
            ..Default::default()
        }),
    };
    let mut client = curator(d.unix().await);
    let call = client.update_node_status(req);
    match tokio::time::timeout(Duration::from_secs(20), call).await {
        Ok(result) => result.map(|_| ()),
        Err(_) => panic!("an update over {} hung", d.addr),
    }
}

/// [`update_own`] retried while it fails Unavailable (no leader known
/// yet), for up to `limit`; panics on any other failure.
async fn served(d: &Daemon, addr: &str, limit: Duration) {
    let start = Instant::now();
    loop {
        match update_own(d, addr).await {
            Ok(()) => return,
            Err(e) => {
                assert_eq!(e.code(), Code::Unavailable, "{e:?}");
                assert!(
                    start.elapsed() < limit,
                    "not served within {limit:?}: {e:?}"
                );
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Reads `s` up to its last backlogged event.
async fn through_backlog(s: &mut tonic::Streaming<curator::WatchEvent>) {
    let last = curator::watch_event::Progress::LastBacklogged as i32;
    let read = async {
        while let Some(ev) = s.next().await {
            if ev.unwrap().progress == last {
                return;
            }
        }
        panic!("the watch ended before its backlog");
    };
    tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .expect("no backlog within 10 s");
}

/// Reads `s` until it fails, within `limit`; its status.
async fn ended(s: &mut tonic::Streaming<curator::WatchEvent>, limit: Duration) -> tonic::Status {
    let read = async {
        loop {
            match s.next().await {
                Some(Ok(_)) => continue,
                Some(Err(status)) => return status,
                None => panic!("the stream ended without a status"),
            }
        }
    };
    tokio::time::timeout(limit, read)
        .await
        .unwrap_or_else(|_| panic!("the stream still open after {limit:?}"))
}

fn assert_switched(status: &tonic::Status, what: &str) {
    assert_eq!(status.code(), Code::Unavailable, "{what}: {status:?}");
    assert!(
        status.message().contains(SWITCHED),
        "{what}: {:?} should say {SWITCHED:?}",
        status.message()
    );
}

/// The election's current leader and its value, read from `store`,
/// once there is one that is not `not` (within `limit`).
async fn leader_other_than(
    store: &EtcdStore,
    not: Option<&Leader>,
    limit: Duration,
) -> (Leader, LeaderElectionValue) {
    let election = store.election(DEFAULT_ELECTION_PREFIX);
    let start = Instant::now();
    loop {
        if let Ok((Some(leader), _)) = election.leader().await
            && not.is_none_or(|n| n.key != leader.key)
        {
            let value = LeaderElectionValue::decode(leader.value.clone()).unwrap();
            return (leader, value);
        }
        assert!(start.elapsed() < limit, "no (new) leader within {limit:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn index_of(daemons: &[Daemon], value: &LeaderElectionValue) -> usize {
    let i = daemons
        .iter()
        .position(|d| d.addr == value.curator_address)
        .unwrap_or_else(|| panic!("the leader {value:?} is none of the instances"));
    assert_eq!(daemons[i].node_id().as_str(), value.node_id, "{value:?}");
    i
}

/// TestListenerSwitch (listener_test.go at 2d91aa32^), and the role change
/// of TestLeaderElectionStatus: calls in flight when their instance's role
/// changes end Unavailable ("curator backend switched, request can be
/// retried"): a Watch and a unary call forwarded by a follower whose
/// leader went silent (SIGSTOP, its lease left to expire), and a Watch the
/// old leader served itself, once it runs again and finds its leadership
/// gone. The new leader serves, and so do both other instances, the old
/// leader now following it.
///
/// Identities: every call is an instance's own node over that instance's
/// local socket (forwarded to the leader on that node's behalf by
/// followers).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_listener_switch_in_flight_calls_end_unavailable_and_new_leader_serves() {
    let etcd = Etcd::start();
    let dir = tempfile::tempdir().unwrap();
    let c = Curators::start(dir.path(), &etcd.urls(), &MIXED, &[]);
    let l = c.leader(&etcd, Duration::from_secs(10)).await;
    let f = c.followers(l);
    let (old, via) = (&c.daemons[l], &c.daemons[f[0]]);
    served(via, "192.0.2.1", Duration::from_secs(10)).await;

    let mut forwarded = watch_nodes(via.unix().await).await;
    through_backlog(&mut forwarded).await;
    let mut on_leader = watch_nodes(old.unix().await).await;
    through_backlog(&mut on_leader).await;

    old.signal("STOP");
    let stopped = Instant::now();
    // A unary call in flight: the follower forwards it to the silent leader.
    let pending = {
        let id = via.node_id().to_string();
        let channel = via.unix().await;
        tokio::spawn(async move {
            curator(channel)
                .update_node_status(curator::UpdateNodeStatusRequest {
                    node_id: id,
                    status: Some(common::NodeStatus {
                        external_address: "192.0.2.2".into(),
                        ..Default::default()
                    }),
                })
                .await
        })
    };

    let limit = TTL + Duration::from_secs(15);
    let status = ended(&mut forwarded, limit).await;
    assert_switched(&status, "the watch through the follower");
    let result = tokio::time::timeout(limit, pending)
        .await
        .expect("the forwarded update still pending")
        .unwrap();
    assert_switched(&result.unwrap_err(), "the update through the follower");
    println!(
        "in-flight calls ended {:?} after SIGSTOP: {status:?}",
        stopped.elapsed()
    );
    assert!(
        stopped.elapsed() >= Duration::from_millis(500),
        "ended {:?} after the leader stopped: before any role change",
        stopped.elapsed()
    );

    // Another instance leads, and it and the remaining one serve.
    let new = loop {
        let i = c.leader(&etcd, limit).await;
        if i != l {
            break i;
        }
        assert!(stopped.elapsed() < limit, "the stopped leader still named");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    for &i in &f {
        served(&c.daemons[i], "192.0.2.3", Duration::from_secs(10)).await;
    }
    let mut on_new = watch_nodes(c.daemons[new].unix().await).await;
    through_backlog(&mut on_new).await;

    // The old leader runs again: its own stream ends, and it follows.
    old.signal("CONT");
    let status = ended(&mut on_leader, Duration::from_secs(15)).await;
    assert_switched(&status, "the watch the old leader served");
    served(old, "192.0.2.4", Duration::from_secs(15)).await;
    assert_eq!(c.leader(&etcd, Duration::from_secs(1)).await, new);
}

/// TestLeaderElectionStatus (curator_test.go): three instances, each
/// reaching etcd through its own member of a three-member etcd. One leads
/// (the election names its node and address), the other two follow it
/// (serve by forwarding to it). The leader's etcd member goes away (the
/// reference partitions it off): another instance leads under a new
/// election key and revision, the third follows it, and the cut-off
/// instance is neither (its calls fail Unavailable). With its member back,
/// it follows the new leader.
///
/// Identities: every call is an instance's own node over that instance's
/// local socket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_leader_election_status_one_leader_followers_then_cut_off_leader_replaced() {
    let mut etcd = Etcd::start_cluster(3);
    let dir = tempfile::tempdir().unwrap();
    let extra: Vec<String> = ["--leader-wait", "2", "--etcd-request-timeout", "1"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let data = |i: usize| dir.path().join(format!("curator-{i}"));
    let mut daemons = Vec::new();
    for (i, runtime) in MIXED.into_iter().enumerate() {
        if i > 0 {
            share_ca(&data(0), &data(i));
        }
        let d = start_elected(&data(i), runtime, &etcd.member_url(i), &extra);
        daemons.push(d);
    }
    let store = EtcdStore::connect(etcd.config()).await.unwrap();
    let (first, value) = leader_other_than(&store, None, Duration::from_secs(10)).await;
    let l = index_of(&daemons, &value);
    for (i, d) in daemons.iter().enumerate() {
        served(d, "192.0.2.10", Duration::from_secs(10)).await;
        if i != l {
            follows(d, &value, Duration::from_secs(5)).await;
        }
    }

    // The leader's etcd member goes away.
    etcd.kill_member(l);
    let cut = Instant::now();
    let mut rest = etcd.config();
    rest.endpoints = (0..3)
        .filter(|&i| i != l)
        .map(|i| etcd.member_url(i))
        .collect();
    let rest = EtcdStore::connect(rest).await.unwrap();
    let limit = TTL + Duration::from_secs(15);
    let (second, value) = leader_other_than(&rest, Some(&first), limit).await;
    let new = index_of(&daemons, &value);
    assert_ne!(new, l, "the cut-off instance still leads");
    assert_ne!(first.key.key, second.key.key, "the election key changed");
    assert_ne!(
        first.key.create_revision, second.key.create_revision,
        "the election revision changed"
    );
    println!("new leader {:?} after the cut", cut.elapsed());
    for (i, d) in daemons.iter().enumerate() {
        if i != l && i != new {
            served(d, "192.0.2.11", Duration::from_secs(10)).await;
            follows(d, &value, Duration::from_secs(5)).await;
        }
    }
    served(&daemons[new], "192.0.2.12", Duration::from_secs(10)).await;
    let e = update_own(&daemons[l], "192.0.2.13").await.unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "the cut-off instance: {e:?}");

    // Its member back, the old leader follows the new one.
    etcd.restart_member(l);
    served(&daemons[l], "192.0.2.14", Duration::from_secs(20)).await;
    follows(&daemons[l], &value, Duration::from_secs(5)).await;
    let (now, _) = leader_other_than(&rest, None, Duration::from_secs(1)).await;
    assert_eq!(now.key, second.key, "leadership stayed with the new leader");
}

/// Waits until `d` says it forwards to the leader of `value` (its log:
/// "forwarding calls to the curator leader", with the leader's node ID).
async fn follows(d: &Daemon, value: &LeaderElectionValue, limit: Duration) {
    let start = Instant::now();
    let says = |log: &str| {
        log.lines().any(|line| {
            line.contains("forwarding calls to the curator leader") && line.contains(&value.node_id)
        })
    };
    while !says(&d.log()) {
        assert!(
            start.elapsed() < limit,
            "{} does not follow {}:\n{}",
            d.addr,
            value.node_id,
            d.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
