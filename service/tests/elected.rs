//! [`SharedLeadership`] and [`FencedStore`] driven by hand: routes, waits,
//! cancellations on role changes, and fenced writes against the store
//! model.

#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::FutureExt;
use futures::executor::block_on;
use futures::future::BoxFuture;
use http::{Request, Response};
use http_body_util::BodyExt;
use metropolis_core::identity::Identity;
use metropolis_core::leadership::{
    Action, CampaignId, ElectionKey, Leadership, LeadershipConfig, LeadershipError, LeaseGrant,
    Role,
};
use metropolis_core::ports::{KvStore, MonotonicClock};
use metropolis_core::store::{CmpOp, Compare, CompareTarget, KeyRange, Op, OpResult, Txn};
use metropolis_core::time::Instant;
use metropolis_proto::prelude::storage::LeaderElectionValue;
use metropolis_service::elected::{FencedStore, SharedLeadership};
use metropolis_service::forward::{
    Connector, Destination, ForwardError, Routed, Routing, Upstream,
};
use metropolis_service::{GroupCommit, GroupCommitOptions, GrpcService, Router};
use metropolis_testkit::clock::ManualClock;
use metropolis_testkit::exec::Tasks;
use metropolis_testkit::store::MemKv;
use prost::Message;
use tonic::body::Body;

/// Where proptest keeps this file's failing cases: next to it
/// (`<file>.proptest-regressions`; the default looks for a `src/` that an
/// integration test is not in).
fn regressions() -> proptest::test_runner::FileFailurePersistence {
    proptest::test_runner::FileFailurePersistence::WithSource("proptest-regressions")
}

fn put(key: &str, value: &str) -> Txn {
    Txn {
        success: vec![Op::Put {
            key: Bytes::from(key.to_owned()),
            value: Bytes::from(value.to_owned()),
            lease: 0,
        }],
        ..Default::default()
    }
}

/// Counts connections; every upstream answers Unimplemented.
#[derive(Default)]
struct Connections(AtomicUsize);

struct Nowhere;

impl Upstream for Nowhere {
    fn send(&self, _: Request<Body>) -> BoxFuture<'static, Result<Response<Body>, ForwardError>> {
        Box::pin(futures::future::ready(Ok(tonic::Status::unimplemented(
            "the leader",
        )
        .into_http())))
    }
}

impl Connector for Connections {
    fn connect(&self, _: &str, _: &str) -> Arc<dyn Upstream> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Arc::new(Nowhere)
    }
}

struct Setup {
    shared: SharedLeadership,
    clock: ManualClock,
    connections: Arc<Connections>,
    model: MemKv,
    campaign: CampaignId,
}

const TTL: Duration = Duration::from_secs(10);

fn setup() -> Setup {
    let clock = ManualClock::new();
    let connections = Arc::new(Connections::default());
    let config = LeadershipConfig {
        lease_ttl: TTL,
        max_wait: Duration::from_secs(5),
        ..LeadershipConfig::new("node-a", "10.0.0.1:7835")
    };
    let machine = Leadership::new(config, clock.now()).unwrap();
    let shared = SharedLeadership::new(machine, Arc::new(clock.clone()), connections.clone());
    let campaign = std::iter::from_fn(|| shared.poll_action())
        .find_map(|a| match a {
            Action::Campaign { campaign, .. } => Some(campaign),
            _ => None,
        })
        .unwrap();
    Setup {
        shared,
        clock,
        connections,
        model: MemKv::new(),
        campaign,
    }
}

impl Setup {
    /// Wins the election with a key written to the model now.
    fn win(&self) -> ElectionKey {
        let rev = self.model.put("election/a", "node-a");
        let key = ElectionKey {
            key: Bytes::from_static(b"election/a"),
            create_revision: rev,
        };
        let campaign = self.campaign;
        self.shared.input(|m, now| {
            m.handle_lease_granted(
                now,
                LeaseGrant {
                    campaign,
                    lease: 7,
                    ttl: TTL,
                    sent_at: now,
                },
            );
            m.handle_campaign_won(now, campaign, key.clone());
        });
        assert!(self.shared.role().is_leader());
        key
    }

    fn observe(&self, node: &str, rev: i64) {
        let value = LeaderElectionValue {
            node_id: node.into(),
            ttl: 10,
            curator_address: format!("{node}:7835"),
            schema_version: 1,
        }
        .encode_to_vec();
        let key = ElectionKey {
            key: Bytes::from(format!("election/{node}")),
            create_revision: rev,
        };
        self.shared
            .input(|m, now| m.handle_leader_observed(now, key, &value));
    }

    fn store(&self) -> FencedStore {
        FencedStore::new(Arc::new(self.model.clone()), self.shared.clone())
    }
}

#[test]
fn a_leader_serves_and_its_writes_commit() {
    let s = setup();
    s.win();
    let routed = block_on(s.shared.route(None)).unwrap();
    // Served in the term of the leader role: the epoch it began.
    let term = s.shared.epoch().get();
    assert!(
        matches!(routed.destination, Destination::Serve(t) if t.0 == term && term > 0),
        "{:?} in epoch {term}",
        routed.destination
    );
    let r = block_on(s.store().txn(put("nodes/x", "1"))).unwrap();
    assert!(r.succeeded);
    assert_eq!(s.model.get("nodes/x").unwrap(), "1");
    // A transaction's own failed compare answers as the store's would:
    // the fence's read is not among the results.
    let txn = Txn {
        compares: vec![Compare {
            key: Bytes::from_static(b"nodes/x"),
            op: CmpOp::Equal,
            target: CompareTarget::Version(9),
        }],
        failure: vec![Op::Range(KeyRange::Key(Bytes::from_static(b"nodes/x")))],
        ..Default::default()
    };
    let r = block_on(s.store().txn(txn)).unwrap();
    assert!(!r.succeeded);
    assert_eq!(r.results.len(), 1);
    assert!(matches!(&r.results[0], OpResult::Range(kvs) if kvs.len() == 1));
    drop(routed);
    assert_eq!(s.shared.input(|m, _| m.in_flight()), 0, "calls finish");
}

#[test]
fn a_deposed_leaders_write_does_not_commit_and_it_steps_down() {
    let s = setup();
    s.win();
    let routed = block_on(s.shared.route(None)).unwrap();
    // Someone else's session deleted our key (our lease ran out in etcd).
    s.model.delete("election/a");
    let e = block_on(s.store().txn(put("nodes/x", "stale"))).unwrap_err();
    assert!(e.to_string().contains("lost leadership"), "{e}");
    assert_eq!(s.model.get("nodes/x"), None, "nothing committed");
    assert_eq!(s.shared.role(), Role::Campaigning);
    // The call in flight is ended.
    let error = block_on(routed.cancelled);
    assert_eq!(error, LeadershipError::BackendSwitched);
    // A new campaign was started for the election port.
    assert!(
        std::iter::from_fn(|| s.shared.poll_action()).any(|a| matches!(a, Action::Campaign { .. }))
    );
}

/// A read is confirmed like a write: a leader whose key is gone (it has
/// not noticed) refuses the read, Unavailable, and steps down; one that
/// still leads passes. An invalid Watch is refused before the
/// confirmation.
#[test]
fn a_deposed_leader_confirms_no_read_and_steps_down() {
    use metropolis_service::{CuratorService, WatchCache, WatchCacheOptions};
    let s = setup();
    s.win();
    let tasks = Tasks::new();
    let cache = WatchCache::new(
        Arc::new(s.model.clone()),
        Arc::new(tasks.clone()),
        WatchCacheOptions::default(),
    );
    let curator = CuratorService::new(
        Arc::new(s.store()),
        cache,
        None,
        Arc::new(metropolis_testkit::clock::ManualClock::new()),
    );
    block_on(curator.confirm_leadership()).unwrap();
    assert!(matches!(s.shared.role(), Role::Leader(_)));
    s.model.delete("election/a");
    // Through the router, as the daemon serves Watch: a request that is
    // not valid is refused before anything is read for it (the deposed
    // leader does not learn it yet)...
    let router = Router::new()
        .with_service(curator.curator_server())
        .with_routing(Arc::new(s.shared.clone()));
    let watch = |request: metropolis_proto::prelude::curator::WatchRequest| {
        let mut framed = vec![0u8];
        let message = request.encode_to_vec();
        framed.extend_from_slice(&u32::try_from(message.len()).unwrap().to_be_bytes());
        framed.extend_from_slice(&message);
        let mut call = Request::builder()
            .uri("http://metropolis/metropolis.node.core.curator.proto.api.Curator/Watch")
            .header("content-type", "application/grpc")
            .body(Body::new(http_body_util::Full::new(Bytes::from(framed))))
            .unwrap();
        call.extensions_mut().insert(Identity::Owner);
        let response = block_on(router.call(call));
        tonic::Status::from_header_map(response.headers()).expect("a trailers-only status")
    };
    let invalid = watch(Default::default());
    assert_eq!(invalid.code(), tonic::Code::Unimplemented, "{invalid:?}");
    assert!(matches!(s.shared.role(), Role::Leader(_)));
    // ...and a valid one confirms the leadership, which is lost.
    use metropolis_proto::prelude::curator::watch_request::{Kind, NodesInCluster};
    let refused = watch(metropolis_proto::prelude::curator::WatchRequest {
        kind: Some(Kind::NodesInCluster(NodesInCluster {})),
    });
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    assert!(refused.message().contains("lost leadership"), "{refused:?}");
    assert_eq!(s.shared.role(), Role::Campaigning);
}

#[test]
fn a_deposed_leaders_grouped_writes_commit_nothing_and_it_steps_down() {
    let s = setup();
    s.win();
    let tasks = Tasks::new();
    let grouped: Arc<dyn KvStore> = Arc::new(GroupCommit::new(
        Arc::new(s.model.clone()),
        &tasks,
        GroupCommitOptions::default(),
    ));
    let store = FencedStore::new(grouped, s.shared.clone());
    // Leading, three writes of different keys leave as one transaction.
    let mut writes: Vec<_> = ["nodes/a", "nodes/b", "nodes/c"]
        .iter()
        .map(|k| store.txn(put(k, "1")))
        .collect();
    let before = s.model.revision();
    tasks.run(3);
    for w in &mut writes {
        assert!(block_on(w).unwrap().succeeded);
    }
    assert_eq!(s.model.revision(), before + 1, "one revision for the three");
    // Deposed: a group of writes fails its fence, each member learns it.
    s.model.delete("election/a");
    let mut writes: Vec<_> = ["nodes/a", "nodes/b", "nodes/c"]
        .iter()
        .map(|k| store.txn(put(k, "stale")))
        .collect();
    tasks.run(3);
    for w in &mut writes {
        let e = block_on(w).unwrap_err();
        assert!(e.to_string().contains("lost leadership"), "{e}");
    }
    for k in ["nodes/a", "nodes/b", "nodes/c"] {
        assert_eq!(s.model.get(k).unwrap(), "1", "nothing committed");
    }
    assert_eq!(s.shared.role(), Role::Campaigning);
}

#[test]
fn a_non_leader_never_writes() {
    let s = setup();
    let e = block_on(s.store().txn(put("nodes/x", "1"))).unwrap_err();
    assert!(e.to_string().contains("backend switched"), "{e}");
    s.observe("node-b", 1);
    let e = block_on(s.store().txn(put("nodes/x", "1"))).unwrap_err();
    assert!(e.to_string().contains("backend switched"), "{e}");
    assert_eq!(s.model.get("nodes/x"), None);
    assert_eq!(s.shared.input(|m, _| m.in_flight()), 0);
}

#[test]
fn calls_wait_for_a_leader_and_follow_it() {
    let s = setup();
    let mut waiting = s.shared.route(None);
    assert!((&mut waiting).now_or_never().is_none(), "no leader yet");
    assert_eq!(s.shared.input(|m, _| m.waiting()), 1);
    s.observe("node-b", 3);
    let routed = block_on(waiting).unwrap();
    assert!(matches!(routed.destination, Destination::Forward(_)));
    // Later calls reuse the connection to the same leader.
    let again = block_on(s.shared.route(None)).unwrap();
    assert!(matches!(again.destination, Destination::Forward(_)));
    assert_eq!(s.connections.0.load(Ordering::SeqCst), 1);
    // A newer leader: calls to the old one are cancelled, new calls get a
    // new connection.
    s.observe("node-c", 4);
    assert_eq!(block_on(routed.cancelled), LeadershipError::BackendSwitched);
    assert_eq!(block_on(again.cancelled), LeadershipError::BackendSwitched);
    let third = block_on(s.shared.route(None)).unwrap();
    assert!(matches!(third.destination, Destination::Forward(_)));
    assert_eq!(s.connections.0.load(Ordering::SeqCst), 2);
}

#[test]
fn a_wait_ends_at_the_deadline_and_a_given_up_wait_is_forgotten() {
    let s = setup();
    let mut waiting = s.shared.route(Some(Duration::from_secs(1)));
    assert!((&mut waiting).now_or_never().is_none());
    assert_eq!(
        s.shared.poll_timeout(),
        Some(Instant::from_offset(Duration::from_secs(1)))
    );
    s.clock.advance(Duration::from_secs(1));
    s.shared.input(|m, now| m.handle_timeout(now));
    assert_eq!(block_on(waiting).unwrap_err(), LeadershipError::NoLeader);
    // A caller that goes away while waiting leaves nothing behind.
    let mut gone = s.shared.route(None);
    assert!((&mut gone).now_or_never().is_none());
    drop(gone);
    assert_eq!(s.shared.input(|m, _| m.waiting()), 0);
}

#[test]
fn the_port_is_woken_by_inputs_and_observers_see_role_changes() {
    let s = setup();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    s.shared
        .on_role_change(move |epoch, role| log.lock().unwrap().push((epoch.get(), role.clone())));
    block_on(s.shared.changed());
    assert!(s.shared.changed().now_or_never().is_none());
    let _waiting = s.shared.route(None);
    assert!(
        s.shared.changed().now_or_never().is_some(),
        "a new wait moves the timer"
    );
    s.win();
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 1);
    assert!(seen[0].1.is_leader());
}

/// A service whose responses stream forever.
#[derive(Clone)]
struct Endless;

impl tonic::server::NamedService for Endless {
    const NAME: &'static str = "metropolis.node.core.curator.proto.api.Curator";
}

impl GrpcService for Endless {
    fn call(&self, _: Request<Body>) -> BoxFuture<'static, Response<Body>> {
        let stream = futures::stream::repeat_with(|| {
            Ok::<_, tonic::Status>(http_body::Frame::data(Bytes::from_static(b"x")))
        });
        let body = Body::new(http_body_util::StreamBody::new(stream));
        Box::pin(futures::future::ready(Response::new(body)))
    }
}

#[test]
fn a_served_stream_ends_unavailable_when_leadership_ends() {
    let s = setup();
    s.win();
    let router = Router::new()
        .with_service(Endless)
        .with_routing(Arc::new(s.shared.clone()));
    let mut request = Request::builder()
        .uri(format!(
            "http://metropolis/{}/Watch",
            Endless::NAME_FOR_TESTS
        ))
        .body(Body::empty())
        .unwrap();
    request.extensions_mut().insert(Identity::Owner);
    let response = block_on(router.call(request));
    let mut body = response.into_body();
    for _ in 0..3 {
        let frame = block_on(body.frame()).unwrap().unwrap();
        assert!(frame.is_data());
    }
    assert_eq!(s.shared.input(|m, _| m.in_flight()), 1);
    // The lease runs out.
    s.clock.advance(TTL);
    s.shared.input(|m, now| m.handle_timeout(now));
    let frame = block_on(body.frame()).unwrap().unwrap();
    let status = tonic::Status::from_header_map(frame.trailers_ref().unwrap()).unwrap();
    assert_eq!(status.code(), tonic::Code::Unavailable);
    assert!(status.message().contains("backend switched"), "{status:?}");
    assert!(block_on(body.frame()).is_none());
    assert_eq!(s.shared.input(|m, _| m.in_flight()), 0);
}

impl Endless {
    const NAME_FOR_TESTS: &'static str = <Endless as tonic::server::NamedService>::NAME;
}

mod random {
    //! Random interleavings of calls and election inputs against the
    //! shared machine: every call gets exactly one route, a routed call is
    //! cancelled exactly when its role ends while it runs, and nothing is
    //! left behind once every call is gone.

    use proptest::prelude::*;

    use super::*;

    #[derive(Clone, Debug)]
    enum Step {
        /// A call arrives, with a timeout in ms (None: none).
        Call(Option<u64>),
        /// The i-th oldest live call goes away.
        Drop(usize),
        /// Time passes (ms), then the timer input.
        Advance(u64),
        /// This instance wins with a fresh key.
        Win,
        /// Another instance is observed leading (newer key).
        ObserveOther,
        /// The current lease is lost.
        LoseLease,
        /// A write through the fenced store.
        Write,
        /// The election key is deleted behind our back.
        DeleteKey,
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            4 => prop::option::of(0u64..3000).prop_map(Step::Call),
            3 => (0usize..8).prop_map(Step::Drop),
            2 => (0u64..4000).prop_map(Step::Advance),
            1 => Just(Step::Win),
            1 => Just(Step::ObserveOther),
            1 => Just(Step::LoseLease),
            2 => Just(Step::Write),
            1 => Just(Step::DeleteKey),
        ]
    }

    /// A call as the test holds it.
    enum Live {
        Waiting(BoxFuture<'static, Result<Routed, LeadershipError>>),
        Routed {
            routed: Routed,
            /// The epoch it was routed in.
            epoch: u64,
        },
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: 300,
            failure_persistence: Some(Box::new(regressions())),
            ..ProptestConfig::default()
        })]

        #[test]
        fn calls_end_once_and_leave_nothing_behind(steps in prop::collection::vec(step(), 1..60)) {
            let s = setup();
            let mut live: Vec<Live> = Vec::new();
            let mut campaign = s.campaign;
            let mut revision = 100;
            for step in steps {
                match step {
                    Step::Call(ms) => {
                        live.push(Live::Waiting(s.shared.route(ms.map(Duration::from_millis))));
                    }
                    Step::Drop(i) => {
                        if !live.is_empty() {
                            let i = i % live.len();
                            live.remove(i);
                        }
                    }
                    Step::Advance(ms) => {
                        s.clock.advance(Duration::from_millis(ms));
                        s.shared.input(|m, now| m.handle_timeout(now));
                    }
                    Step::Win => {
                        // Only the current campaign's win counts.
                        let rev = s.model.put("election/a", "node-a");
                        let key = ElectionKey { key: Bytes::from_static(b"election/a"), create_revision: rev };
                        s.shared.input(|m, now| {
                            m.handle_lease_granted(now, LeaseGrant { campaign, lease: 7, ttl: TTL, sent_at: now });
                            m.handle_campaign_won(now, campaign, key);
                        });
                    }
                    Step::ObserveOther => {
                        revision += 1000;
                        s.observe("node-b", revision);
                    }
                    Step::LoseLease => {
                        s.shared.input(|m, now| m.handle_lease_lost(now, campaign));
                    }
                    Step::Write => {
                        let leading = s.shared.role().is_leader();
                        let result = block_on(s.store().txn(put("nodes/x", "v")));
                        // A write commits only while leading.
                        if result.is_ok() {
                            prop_assert!(leading, "a write committed while not leading");
                        }
                    }
                    Step::DeleteKey => s.model.delete("election/a"),
                }
                // Follow the machine's campaigns.
                while let Some(action) = s.shared.poll_action() {
                    if let Action::Campaign { campaign: c, .. } = action {
                        campaign = c;
                    }
                }
                // Settle: waiting calls that got a route become routed.
                let epoch = s.shared.epoch().get();
                let mut next = Vec::new();
                for call in live.drain(..) {
                    match call {
                        Live::Waiting(mut f) => match (&mut f).now_or_never() {
                            None => next.push(Live::Waiting(f)),
                            Some(Ok(routed)) => next.push(Live::Routed { routed, epoch }),
                            // Rejected: its one outcome.
                            Some(Err(e)) => prop_assert!(matches!(
                                e,
                                LeadershipError::NoLeader | LeadershipError::ShuttingDown
                            )),
                        },
                        Live::Routed { mut routed, epoch: e } => {
                            match (&mut routed.cancelled).now_or_never() {
                                // Cancelled exactly when its role ended.
                                Some(_) => prop_assert!(e != epoch, "cancelled within its role"),
                                None => {
                                    prop_assert!(e == epoch, "not cancelled after its role ended");
                                    next.push(Live::Routed { routed, epoch: e });
                                }
                            }
                        }
                    }
                }
                live = next;
                let (waiting, in_flight) = s.shared.input(|m, _| (m.waiting(), m.in_flight()));
                let held_waiting = live.iter().filter(|c| matches!(c, Live::Waiting(_))).count();
                let held_routed = live.len() - held_waiting;
                prop_assert_eq!(waiting, held_waiting);
                prop_assert_eq!(in_flight, held_routed);
            }
            drop(live);
            let (waiting, in_flight) = s.shared.input(|m, _| (m.waiting(), m.in_flight()));
            prop_assert_eq!((waiting, in_flight), (0, 0));
            prop_assert_eq!(s.shared.open_calls(), 0, "call bookkeeping leaked");
        }
    }
}
