//! Scale-out over a real etcd (Debian `etcd-server`, started here on
//! loopback ports): three curator instances on mixed runtimes, one of
//! them elected leader, the others forwarding; failover after SIGKILL;
//! a paused leader stepping down; compaction under open streams; etcd
//! member restarts and a whole-etcd outage.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use metropolis_core::curator::node_key;
use metropolis_core::identity::NodeId;
use metropolis_core::store::{KeyRange, Op, StoreError, Txn};
use metropolis_etcd::EtcdStore;
use metropolis_proto::metropolis::node::core::curator::proto::private::{
    AddMachineRequest, machine_management_client::MachineManagementClient,
};
use metropolis_proto::prelude::agent::{self, agent_callback_client::AgentCallbackClient};
use metropolis_proto::prelude::{common, curator, storage};
use metropolis_tests::cluster::{Curators, LEASE_TTL_S};
use metropolis_tests::etcd::Etcd;
use metropolis_tests::{
    AgentKey, Daemon, RuntimeKind, curator, status_seq, status_with, watch_nodes,
};
use metropolis_transport::grpc::Channel;
use prost::Message;
use tonic::Code;

const MACHINE: &str = "0f8fad5b-d9cb-469f-a165-70867728950e";
const TTL: Duration = Duration::from_secs(LEASE_TTL_S);
const MIXED: [RuntimeKind; 3] = [RuntimeKind::Tokio, RuntimeKind::Smol, RuntimeKind::Tokio];

/// A status at `address` carrying `seq` ([`status_with`]'s marker, read
/// back by [`status_seq`]; the curator overwrites the timestamp).
fn status(address: &str, seq: i64) -> common::NodeStatus {
    common::NodeStatus {
        external_address: address.into(),
        ..status_with(seq).unwrap()
    }
}

/// Updates the daemon's own node over its socket.
async fn update_own(
    channel: Channel,
    id: &NodeId,
    address: &str,
    seq: i64,
) -> Result<(), tonic::Status> {
    curator(channel)
        .update_node_status(curator::UpdateNodeStatusRequest {
            node_id: id.to_string(),
            status: Some(status(address, seq)),
        })
        .await
        .map(|_| ())
}

async fn update(d: &Daemon, address: &str, seq: i64) -> Result<(), tonic::Status> {
    update_own(d.unix().await, &d.node_id(), address, seq).await
}

/// What a watcher rebuilds: node ID to (address, seq).
#[derive(Default, Debug)]
struct View(BTreeMap<String, (String, i64)>);

impl View {
    fn apply(&mut self, event: &curator::WatchEvent) {
        for n in &event.nodes {
            let s = n.status.clone().unwrap_or_default();
            let seq = status_seq(n.status.as_ref()).unwrap_or(-1);
            self.0.insert(n.id.clone(), (s.external_address, seq));
        }
        for t in &event.node_tombstones {
            self.0.remove(&t.node_id);
        }
    }

    /// Reads events until `done(view)` holds (within 15 s); panics on a
    /// stream error or end.
    async fn until(
        &mut self,
        stream: &mut tonic::Streaming<curator::WatchEvent>,
        what: &str,
        done: impl Fn(&View) -> bool,
    ) {
        let deadline = Instant::now() + Duration::from_secs(15);
        while !done(self) {
            let left = deadline.saturating_duration_since(Instant::now());
            let event = tokio::time::timeout(left, stream.next())
                .await
                .unwrap_or_else(|_| panic!("{what}: not seen within 15 s; view {self:?}"));
            match event {
                Some(Ok(event)) => self.apply(&event),
                Some(Err(e)) => panic!("{what}: stream failed: {e:?}"),
                None => panic!("{what}: stream ended"),
            }
        }
    }

    fn seq(&self, id: &NodeId) -> i64 {
        self.0.get(&id.to_string()).map_or(-1, |(_, seq)| *seq)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followers_forward_calls_and_watches_to_the_leader() {
    let etcd = Etcd::start_cluster(3);
    let dir = tempfile::tempdir().unwrap();
    let c = Curators::start(dir.path(), &etcd.urls(), &MIXED, &[]);
    let l = c.leader(&etcd, Duration::from_secs(10)).await;
    let f = c.followers(l);
    let (f1, f2) = (&c.daemons[f[0]], &c.daemons[f[1]]);

    // A watch through one follower sees every instance registered...
    let mut stream = watch_nodes(f1.unix().await).await;
    let mut view = View::default();
    view.until(&mut stream, "three registered instances", |v| {
        v.0.len() == 3
    })
    .await;
    // ... and an update made through the other follower.
    update(f2, "192.0.2.2", 1).await.unwrap();
    view.until(&mut stream, "the update through the other follower", |v| {
        v.seq(&f2.node_id()) == 1
    })
    .await;
    // An owner call (AddNode) over a follower's TLS listener, and the
    // added node's own call through the other follower.
    let x_dir = dir.path().join("x");
    let x = f1.add_node(&x_dir).await;
    let as_x = f2.tls(&x_dir, "node").await;
    update_own(as_x, &x, "192.0.2.9", 7).await.unwrap();
    view.until(&mut stream, "the added node's update", |v| v.seq(&x) == 7)
        .await;
    // A machine added through one follower heartbeats through the other's
    // AgentCallback port (forwarded to the leader's curator port on the
    // agent's behalf).
    let key = AgentKey::new(f1);
    MachineManagementClient::with_origin(f1.owner().await, Channel::origin())
        .add_machine(AddMachineRequest {
            machine_id: MACHINE.into(),
            agent_public_key: key.public.to_vec().into(),
        })
        .await
        .unwrap();
    let mut agent = AgentCallbackClient::with_origin(
        f2.agent_channel(Some(&key.creds), &key.creds.ca_pem).await,
        Channel::origin(),
    );
    agent
        .heartbeat(agent::HeartbeatRequest {
            machine_id: MACHINE.into(),
            ..Default::default()
        })
        .await
        .unwrap();
    // The same heartbeat with another agent's key is refused by the leader.
    let stranger = AgentKey::new(f1);
    let e = AgentCallbackClient::with_origin(
        f2.agent_channel(Some(&stranger.creds), &stranger.creds.ca_pem)
            .await,
        Channel::origin(),
    )
    .heartbeat(agent::HeartbeatRequest {
        machine_id: MACHINE.into(),
        ..Default::default()
    })
    .await
    .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
    // The leader itself serves as well.
    update(&c.daemons[l], "192.0.2.1", 3).await.unwrap();
    view.until(&mut stream, "the leader's own update", |v| {
        v.seq(&c.daemons[l].node_id()) == 3
    })
    .await;
}

/// Keeps updating `d`'s own node with increasing sequence numbers until
/// `stop`; returns the last acknowledged one. Every failure must be
/// Unavailable (retryable).
fn writer(
    target: Target,
    stop: Arc<AtomicBool>,
    acked: Arc<AtomicI64>,
) -> tokio::task::JoinHandle<usize> {
    tokio::spawn(async move {
        let mut failures = 0;
        let mut seq = 1;
        while !stop.load(Ordering::SeqCst) {
            let result = match metropolis_transport::connect::unix(
                &metropolis_runtime_tokio::rt::TokioRuntime::shared(),
                &target.socket,
            )
            .await
            {
                Ok(channel) => update_own(channel, &target.id, "192.0.2.100", seq).await,
                Err(e) => Err(tonic::Status::unavailable(e.to_string())),
            };
            match result {
                Ok(()) => {
                    acked.store(seq, Ordering::SeqCst);
                    seq += 1;
                }
                Err(e) => {
                    assert_eq!(e.code(), Code::Unavailable, "a failed update: {e:?}");
                    failures += 1;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
        failures
    })
}

/// What a writer needs of a daemon (the daemon itself stays with the test).
#[derive(Clone)]
struct Target {
    socket: std::path::PathBuf,
    id: NodeId,
}

impl Target {
    fn of(d: &Daemon) -> Target {
        Target {
            socket: d.socket.clone(),
            id: d.node_id(),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_leader_is_replaced_and_nothing_acknowledged_is_lost() {
    let etcd = Etcd::start_cluster(3);
    let dir = tempfile::tempdir().unwrap();
    let mut c = Curators::start(dir.path(), &etcd.urls(), &MIXED, &[]);
    let l = c.leader(&etcd, Duration::from_secs(10)).await;
    let f = c.followers(l);

    let stop = Arc::new(AtomicBool::new(false));
    let mut writers = Vec::new();
    for &i in &f {
        let acked = Arc::new(AtomicI64::new(0));
        let task = writer(Target::of(&c.daemons[i]), stop.clone(), acked.clone());
        writers.push((c.daemons[i].node_id(), acked, task));
    }
    let mut stream = watch_nodes(c.daemons[f[0]].unix().await).await;
    let mut view = View::default();
    view.until(&mut stream, "writes flowing", |v| {
        writers.iter().all(|(id, _, _)| v.seq(id) > 5)
    })
    .await;

    c.daemons[l].kill();
    let killed = Instant::now();
    // The watch forwarded to the dead leader ends, retryably.
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match stream.next().await {
                Some(Ok(_)) => continue,
                Some(Err(e)) => return e,
                None => panic!("the stream ended without a status"),
            }
        }
    })
    .await
    .expect("the forwarded watch did not end");
    assert_eq!(ended.code(), Code::Unavailable, "{ended:?}");

    // A new leader serves within TTL + 2 s.
    let before = writers[0].1.load(Ordering::SeqCst);
    while writers[0].1.load(Ordering::SeqCst) == before {
        assert!(
            killed.elapsed() < TTL + Duration::from_secs(2),
            "no update served {:?} after the leader was killed",
            killed.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let took = killed.elapsed();
    let new = c.leader(&etcd, Duration::from_secs(5)).await;
    assert_ne!(new, l);
    println!("failover: the first update was served {took:?} after SIGKILL");

    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::SeqCst);
    let mut last = Vec::new();
    for (id, acked, task) in writers {
        let failures = task.await.unwrap();
        println!("writer {id}: {failures} retryable failures");
        last.push((id, acked.load(Ordering::SeqCst)));
    }
    // A watcher that reconnects converges on every acknowledged update.
    let mut again = watch_nodes(c.daemons[f[1]].unix().await).await;
    let mut view = View::default();
    view.until(&mut again, "every acknowledged update", |v| {
        last.iter().all(|(id, seq)| v.seq(id) >= *seq)
    })
    .await;
    for (id, seq) in &last {
        assert!(
            view.seq(id) <= seq + 1,
            "{id}: more than one past the last acknowledged"
        );
    }
    // The killed instance comes back as a follower.
    c.restart(l);
    update(&c.daemons[l], "192.0.2.1", 1).await.unwrap();
}

/// `op` retried while etcd answers Unavailable (it elects a new leader
/// after a member was killed), for up to 10 s.
async fn retried<T, F: std::future::Future<Output = Result<T, StoreError>>>(
    mut op: impl FnMut() -> F,
) -> T {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match op().await {
            Ok(v) => return v,
            Err(e) => assert!(Instant::now() < deadline, "{e}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The record of `id` as etcd holds it.
async fn record(store: &EtcdStore, id: &NodeId) -> Option<storage::NodeRecord> {
    let (kvs, _) = retried(|| store.range(KeyRange::Key(node_key(id)))).await;
    kvs.first()
        .map(|kv| storage::NodeRecord::decode(kv.value.clone()).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_leader_steps_down_and_writes_nothing() {
    let etcd = Etcd::start_cluster(3);
    let dir = tempfile::tempdir().unwrap();
    let c = Curators::start(dir.path(), &etcd.urls(), &MIXED, &[]);
    let l = c.leader(&etcd, Duration::from_secs(10)).await;
    let old = &c.daemons[l];
    let old_id = old.node_id();
    let store = EtcdStore::connect(etcd.config()).await.unwrap();
    update(old, "192.0.2.1", 1).await.unwrap();

    // Paused past its lease, with a write waiting in its socket.
    let channel = old.unix().await;
    old.signal("STOP");
    let paused = Instant::now();
    let id = old_id.clone();
    let stale = tokio::spawn(async move { update_own(channel, &id, "198.51.100.7", 2).await });
    let new = loop {
        let leader = c.leader(&etcd, Duration::from_secs(20)).await;
        if leader != l {
            break leader;
        }
        assert!(
            paused.elapsed() < TTL + Duration::from_secs(10),
            "nobody took over"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    update(&c.daemons[new], "192.0.2.50", 5).await.unwrap();
    old.signal("CONT");

    // The waiting write ends: served by the new leader after the old one
    // stepped down, or refused retryably; never anything else.
    let outcome = tokio::time::timeout(Duration::from_secs(20), stale)
        .await
        .expect("the stale write did not end")
        .unwrap();
    if let Err(e) = &outcome {
        assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    }
    // It stepped down: its last role is a follower's, and it led once.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let log = old.log();
        let roles: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("curator role changed"))
            .collect();
        let led = roles
            .iter()
            .filter(|l| l.contains("changed: leader"))
            .count();
        if roles
            .last()
            .is_some_and(|l| l.contains("changed: follower"))
        {
            assert_eq!(led, 1, "the paused instance led again:\n{log}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the paused leader did not step down:\n{log}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // In etcd: the old leader's election key is gone. Its record holds the
    // stale write if the call succeeded (through the new leader), and not
    // if the paused instance served it itself: its fence failed ("lost
    // leadership"). A call cancelled by a role change ("curator backend
    // switched") has no known outcome: it may have been forwarded, and
    // committed by the new leader, before the role changed again.
    assert_eq!(c.leader(&etcd, Duration::from_secs(1)).await, new);
    let stored = record(&store, &old_id).await.unwrap();
    let address = stored.status.unwrap_or_default().external_address;
    match &outcome {
        Ok(()) => assert_eq!(address, "198.51.100.7"),
        Err(e) if e.message().contains("lost leadership") => {
            assert_eq!(address, "192.0.2.1", "{e:?}")
        }
        Err(e) => assert!(
            ["192.0.2.1", "198.51.100.7"].contains(&address.as_str()),
            "{address:?} after {e:?}:\n{}",
            old.log()
        ),
    }
    // And it serves again, as a follower, through the new leader.
    update(old, "192.0.2.11", 3).await.unwrap();
    assert!(old.log().contains("forwarding calls to the curator leader"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_under_open_streams_loses_no_tombstone() {
    let mut etcd = Etcd::start_cluster(3);
    let dir = tempfile::tempdir().unwrap();
    // One instance that reaches etcd through member 0 only, with a lease
    // long enough to ride out that member's restart.
    let c = Curators::start(
        dir.path(),
        &etcd.member_url(0),
        &[RuntimeKind::Tokio],
        &["--lease-ttl", "30"],
    );
    let d = &c.daemons[0];
    let x = d.add_node(&dir.path().join("x")).await;
    let y = d.add_node(&dir.path().join("y")).await;
    let mut streams = Vec::new();
    for _ in 0..2 {
        let mut s = watch_nodes(d.unix().await).await;
        let mut view = View::default();
        view.until(&mut s, "the backlog", |v| v.0.len() == 3).await;
        streams.push((s, view));
    }
    // Member 0 goes away; meanwhile y is deleted, x changes, and etcd is
    // compacted past all of it.
    etcd.kill_member(0);
    let mut other = etcd.config();
    other.endpoints = vec![etcd.member_url(1), etcd.member_url(2)];
    let store = EtcdStore::connect(other).await.unwrap();
    let mut x_record = record(&store, &x).await.unwrap();
    x_record.status = Some(status("192.0.2.24", 24));
    let change = Txn {
        success: vec![
            Op::Delete(KeyRange::Key(node_key(&y))),
            Op::Put {
                key: node_key(&x),
                value: Bytes::from(x_record.encode_to_vec()),
                lease: 0,
            },
        ],
        ..Default::default()
    };
    // Repeating it is harmless: the same delete and put.
    retried(|| store.run_txn(change.clone())).await;
    let revision = retried(|| store.revision()).await;
    retried(|| store.compact(revision)).await;
    etcd.restart_member(0);
    // The streams converge with no error: the tombstone and the change.
    for (s, view) in &mut streams {
        view.until(s, "y's tombstone and x's change", |v| {
            !v.0.contains_key(&y.to_string()) && v.seq(&x) == 24
        })
        .await;
    }
    assert!(
        d.log().contains("re-reading a snapshot"),
        "the cache resynchronised:\n{}",
        d.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_member_restarts_and_outages() {
    let mut etcd = Etcd::start_cluster(3);
    let dir = tempfile::tempdir().unwrap();
    let c = Curators::start(
        dir.path(),
        &etcd.urls(),
        &[RuntimeKind::Tokio, RuntimeKind::Smol],
        &[
            "--leader-wait",
            "2",
            "--lease-ttl",
            "5",
            "--etcd-request-timeout",
            "1",
        ],
    );
    let l = c.leader(&etcd, Duration::from_secs(10)).await;
    let f = &c.daemons[c.followers(l)[0]];

    // One member restarts: service continues (an update may need a retry
    // while the client moves to another member).
    let mut seq = 0;
    let mut retries = 0;
    for round in 0..2 {
        if round == 0 {
            etcd.kill_member(1);
        } else {
            etcd.restart_member(1);
        }
        for _ in 0..10 {
            seq += 1;
            let mut attempts = 0;
            loop {
                match update(f, "192.0.2.3", seq).await {
                    Ok(()) => break,
                    Err(e) => {
                        assert_eq!(e.code(), Code::Unavailable, "{e:?}");
                        attempts += 1;
                        retries += 1;
                        assert!(attempts < 3, "update {seq} failed 3 times: {e:?}");
                    }
                }
            }
        }
    }
    println!("member restart: {retries} retried updates of {seq}");

    // The whole etcd down: calls fail Unavailable, naming etcd and its
    // endpoints (within the lease, with a 1 s etcd request timeout).
    etcd.kill();
    let e = update(&c.daemons[l], "192.0.2.4", 100).await.unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    assert!(
        e.message().contains(&format!("etcd at {}", etcd.urls())),
        "a clear message: {e:?}"
    );
    println!("with etcd down: {}", e.message());
    // Past the lease (5 s), no leader is known: calls wait --leader-wait,
    // then fail Unavailable.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let e = update(f, "192.0.2.4", 101).await.unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    assert!(e.message().contains("no curator leader"), "{e:?}");

    // Back: service recovers.
    etcd.restart();
    let back = Instant::now();
    loop {
        match update(f, "192.0.2.5", 200).await {
            Ok(()) => break,
            Err(e) => {
                assert_eq!(e.code(), Code::Unavailable, "{e:?}");
                assert!(
                    back.elapsed() < Duration::from_secs(30),
                    "no recovery: {e:?}"
                );
            }
        }
    }
    println!("recovered {:?} after etcd came back", back.elapsed());
}
