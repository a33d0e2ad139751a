//! The etcd port against a real etcd (Debian package `etcd-server`; each
//! test starts its own on free loopback ports): transaction semantics equal
//! to the embedded store's, watches, compaction, leases, the election and
//! its fence, etcd going away, and use from smol.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use bytes::Bytes;
use futures::{Stream, StreamExt};
use metropolis_core::leadership::{ElectionKey, FenceCheck};
use metropolis_core::ports::{KvStore, WatchBatch};
use metropolis_core::store::{
    CmpOp, Compare, CompareTarget, EventKind, KeyRange, KeyValue, Op, OpResult, Revision,
    StoreError, Txn, TxnResponse,
};
use metropolis_etcd::{EtcdConfig, EtcdStore, Observation};
use metropolis_proto::prelude::storage::LeaderElectionValue;
use metropolis_store::{EmbeddedStore, StoreOptions};
use metropolis_tests::etcd::Etcd;
use prost::Message;

fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

fn put(key: &str, value: &str) -> Op {
    Op::Put {
        key: b(key),
        value: b(value),
        lease: 0,
    }
}

fn ops(success: Vec<Op>) -> Txn {
    Txn {
        success,
        ..Txn::default()
    }
}

/// Awaits `f` for at most `secs` seconds.
async fn within<T>(secs: u64, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(secs), f)
        .await
        .expect("timed out")
}

/// The next item of a stream, within 10 s.
async fn next<S: Stream + Unpin>(stream: &mut S) -> Option<S::Item> {
    within(10, stream.next()).await
}

/// Connects to `etcd`, retrying while it elects itself.
async fn connect(etcd: &Etcd) -> EtcdStore {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        match EtcdStore::connect(etcd.config()).await {
            Ok(store) => match store.revision().await {
                Ok(_) => return store,
                Err(e) if std::time::Instant::now() > deadline => panic!("{e}"),
                Err(_) => {}
            },
            Err(e) if std::time::Instant::now() > deadline => panic!("{e}"),
            Err(_) => {}
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

// ---------------------------------------------------------------------
// Conformance: the same transactions against the embedded store and etcd.

/// A small deterministic generator (no RNG crate needed).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())]
    }
}

const KEYS: [&str; 8] = [
    "c/a", "c/b", "c/b/1", "c/b/2", "c/c", "c/d/x", "c/d/y", "c/e",
];
const PREFIXES: [&str; 5] = ["c/", "c/b", "c/d/", "c/zz", ""];
const VALUES: [&str; 4] = ["", "v0", "v1", "v2"];

fn range_of(rng: &mut Lcg) -> KeyRange {
    if rng.below(2) == 0 {
        KeyRange::Key(b(rng.pick(&KEYS)))
    } else {
        KeyRange::Prefix(b(rng.pick(&PREFIXES)))
    }
}

/// A branch etcd accepts: no key put twice, no key both put and deleted
/// (etcd 3.4 refuses those; the store model does not).
fn branch(rng: &mut Lcg) -> Vec<Op> {
    let mut out: Vec<Op> = Vec::new();
    let mut puts: Vec<Bytes> = Vec::new();
    let mut deletes: Vec<KeyRange> = Vec::new();
    for _ in 0..rng.below(4) {
        match rng.below(3) {
            0 => out.push(Op::Range(range_of(rng))),
            1 => {
                let key = b(rng.pick(&KEYS));
                if puts.contains(&key) || deletes.iter().any(|d| d.contains(&key)) {
                    continue;
                }
                puts.push(key.clone());
                out.push(Op::Put {
                    key,
                    value: b(rng.pick(&VALUES)),
                    lease: 0,
                });
            }
            _ => {
                let range = range_of(rng);
                if puts.iter().any(|k| range.contains(k)) {
                    continue;
                }
                deletes.push(range.clone());
                out.push(Op::Delete(range));
            }
        }
    }
    out
}

fn random_txn(rng: &mut Lcg, revision: Revision) -> Txn {
    let mut compares = Vec::new();
    for _ in 0..rng.below(3) {
        let op = rng.pick(&[CmpOp::Equal, CmpOp::NotEqual, CmpOp::Less, CmpOp::Greater]);
        let near = |rng: &mut Lcg| {
            if rng.below(3) == 0 {
                0
            } else {
                rng.below(revision as usize + 2) as i64
            }
        };
        let target = match rng.below(4) {
            0 => CompareTarget::Value(b(rng.pick(&VALUES))),
            1 => CompareTarget::CreateRevision(near(rng)),
            2 => CompareTarget::ModRevision(near(rng)),
            _ => CompareTarget::Version(rng.below(4) as i64),
        };
        compares.push(Compare {
            key: b(rng.pick(&KEYS)),
            op,
            target,
        });
    }
    Txn {
        compares,
        success: branch(rng),
        failure: branch(rng),
    }
}

/// Hand-picked cases, each with what it checks.
fn fixed_cases() -> Vec<(&'static str, Txn)> {
    let cmp = |key: &str, op, target| Compare {
        key: b(key),
        op,
        target,
    };
    vec![
        ("put a new key", ops(vec![put("f/a", "1")])),
        (
            "put again: previous value returned",
            ops(vec![put("f/a", "2")]),
        ),
        (
            "put-if-absent on an existing key fails and reads it",
            Txn {
                compares: vec![cmp("f/a", CmpOp::Equal, CompareTarget::CreateRevision(0))],
                success: vec![put("f/a", "3")],
                failure: vec![Op::Range(KeyRange::Key(b("f/a")))],
            },
        ),
        (
            "value compare on a missing key is false, whatever the operator",
            Txn {
                compares: vec![cmp(
                    "f/missing",
                    CmpOp::NotEqual,
                    CompareTarget::Value(b("x")),
                )],
                success: vec![put("f/wrong", "1")],
                failure: vec![put("f/b", "1")],
            },
        ),
        (
            "revisions and version of a missing key are 0",
            Txn {
                compares: vec![
                    cmp("f/missing", CmpOp::Equal, CompareTarget::ModRevision(0)),
                    cmp("f/missing", CmpOp::Equal, CompareTarget::Version(0)),
                    cmp("f/missing", CmpOp::Less, CompareTarget::CreateRevision(1)),
                ],
                success: vec![put("f/c", "1")],
                failure: vec![],
            },
        ),
        (
            "version and mod revision compares",
            Txn {
                compares: vec![
                    cmp("f/a", CmpOp::Equal, CompareTarget::Version(2)),
                    cmp("f/a", CmpOp::Greater, CompareTarget::ModRevision(2)),
                    cmp("f/a", CmpOp::Less, CompareTarget::Value(b("3"))),
                ],
                success: vec![put("f/a/x", "1"), put("f/a/y", "2")],
                failure: vec![],
            },
        ),
        (
            "a range sees the puts before it in the same transaction",
            ops(vec![put("f/d", "1"), Op::Range(KeyRange::Prefix(b("f/")))]),
        ),
        (
            "read-only: the revision does not move",
            ops(vec![Op::Range(KeyRange::Prefix(b("f/a")))]),
        ),
        (
            "deleting a missing key: no new revision",
            ops(vec![Op::Delete(KeyRange::Key(b("f/none")))]),
        ),
        (
            "a prefix delete returns every deleted key in order",
            ops(vec![Op::Delete(KeyRange::Prefix(b("f/a")))]),
        ),
        (
            "the empty prefix is every key",
            ops(vec![Op::Range(KeyRange::Prefix(Bytes::new()))]),
        ),
        (
            "several writes, one revision",
            ops(vec![
                put("f/e", "1"),
                Op::Delete(KeyRange::Key(b("f/b"))),
                put("f/f", "1"),
            ]),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactions_match_the_embedded_store() {
    let etcd_server = Etcd::start();
    let etcd = connect(&etcd_server).await;
    let dir = tempfile::tempdir().unwrap();
    let embedded = EmbeddedStore::open(dir.path(), StoreOptions::default()).unwrap();
    let mut cases: Vec<(String, Txn)> = fixed_cases()
        .into_iter()
        .map(|(what, txn)| (what.to_string(), txn))
        .collect();
    let mut rng = Lcg(0x5eed);
    let mut checked = 0;
    let mut succeeded = 0;
    let mut revision = 1;
    for i in 0..400 {
        if i >= cases.len() {
            cases.push((
                format!("random transaction {i}"),
                random_txn(&mut rng, revision),
            ));
        }
        let (what, txn) = &cases[i];
        let want = KvStore::txn(&embedded, txn.clone()).await;
        let got = KvStore::txn(&etcd, txn.clone()).await;
        assert_eq!(got, want, "{what}: {txn:?}");
        if let Ok(r) = &want {
            revision = r.revision;
            succeeded += usize::from(r.succeeded);
        }
        checked += 1;
    }
    // Both branches were exercised, and the history moved.
    assert!(
        succeeded > 50 && succeeded < checked - 50,
        "{succeeded}/{checked}"
    );
    assert!(revision > 150, "{revision}");

    // A put attached to a lease that does not exist: the same error, and
    // nothing changes.
    let txn = ops(vec![
        put("f/ok", "1"),
        Op::Put {
            key: b("f/leased"),
            value: b("1"),
            lease: 0x1234,
        },
    ]);
    assert_eq!(
        KvStore::txn(&etcd, txn.clone()).await,
        Err(StoreError::LeaseNotFound(0x1234))
    );
    assert_eq!(
        KvStore::txn(&embedded, txn).await,
        Err(StoreError::LeaseNotFound(0x1234))
    );

    // Reads for update and the final state agree too.
    for range in [
        KeyRange::Prefix(Bytes::new()),
        KeyRange::Prefix(b("c/b")),
        KeyRange::Key(b("c/a")),
    ] {
        assert_eq!(
            etcd.read_for_update(range.clone()).await,
            embedded.read_for_update(range).await
        );
    }
    assert_eq!(etcd.revision().await.unwrap(), revision);

    // And so does the whole history, as watches from the first write
    // replay it: every event, its revision and its previous value.
    let mut histories = vec![];
    for store in [&etcd as &dyn KvStore, &embedded as &dyn KvStore] {
        let mut watch = store.watch(KeyRange::Prefix(Bytes::new()), 2);
        let mut events = vec![];
        while events
            .last()
            .is_none_or(|e: &metropolis_core::store::Event| e.kv.mod_revision < revision)
        {
            events.extend(next(&mut watch).await.unwrap().unwrap().events);
        }
        histories.push(events);
    }
    assert!(histories[0].len() > 200, "{}", histories[0].len());
    assert_eq!(histories[0], histories[1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_branch_etcd_refuses_is_refused_with_etcds_reason() {
    // The documented difference: the store model accepts a key put twice
    // in one branch, etcd 3.4 does not. It refuses it before applying
    // anything.
    let etcd_server = Etcd::start();
    let etcd = connect(&etcd_server).await;
    let err = etcd
        .run_txn(ops(vec![put("k", "1"), put("k", "2")]))
        .await
        .unwrap_err();
    match err {
        StoreError::Refused(m) => {
            assert!(m.contains("duplicate key"), "{m}");
            assert!(m.contains(&etcd_server.url()), "{m}");
        }
        other => panic!("{other:?}"),
    }
}

/// The leader's group commit against an etcd that takes fewer operations
/// per transaction than the daemon's `--etcd-max-txn-ops`: the groups it
/// refuses are sent again one by one, and every update commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_larger_than_etcds_max_txn_ops_still_commit() {
    use metropolis_service::{GroupCommit, GroupCommitOptions};
    let etcd_server = Etcd::start_with(
        1,
        metropolis_tests::etcd::EtcdOptions {
            args: vec!["--max-txn-ops=2".into()],
            ..Default::default()
        },
    );
    let etcd: std::sync::Arc<dyn KvStore> = std::sync::Arc::new(connect(&etcd_server).await);
    let options = GroupCommitOptions {
        in_flight: 1,
        ..GroupCommitOptions::default()
    };
    let grouped = GroupCommit::new(
        etcd.clone(),
        &*metropolis_runtime_tokio::rt::TokioRuntime::shared(),
        options,
    );
    // More than fit one at a time: all but the first wait and leave as
    // groups of more than 2 writes, which etcd refuses.
    let writes: Vec<_> = (0..20)
        .map(|i| grouped.txn(ops(vec![put(&format!("g/{i}"), "v")])))
        .collect();
    let answers = within(20, futures::future::join_all(writes)).await;
    for (i, a) in answers.into_iter().enumerate() {
        assert!(a.unwrap_or_else(|e| panic!("write {i}: {e}")).succeeded);
    }
    let read = etcd
        .txn(ops(vec![Op::Range(KeyRange::Prefix(b("g/")))]))
        .await
        .unwrap();
    match &read.results[..] {
        [OpResult::Range(kvs)] => assert_eq!(kvs.len(), 20),
        other => panic!("{other:?}"),
    }
}

// ---------------------------------------------------------------------
// Watches.

/// Collects the events of `stream` until one of revision `last` arrived;
/// returns them as (kind, key, revision, previous value) and the batches'
/// sizes.
async fn collect_until(
    stream: &mut (impl Stream<Item = Result<WatchBatch, StoreError>> + Unpin),
    last: Revision,
) -> (Vec<(EventKind, Bytes, Revision, Option<Bytes>)>, Vec<usize>) {
    let mut events = Vec::new();
    let mut sizes = Vec::new();
    while events
        .last()
        .is_none_or(|e: &(_, _, Revision, _)| e.2 < last)
    {
        let batch = next(stream)
            .await
            .expect("stream ended")
            .expect("watch error");
        let top = batch.events.last().unwrap().kv.mod_revision;
        assert!(batch.revision >= top, "{} < {top}", batch.revision);
        sizes.push(batch.events.len());
        events.extend(batch.events.into_iter().map(|e| {
            (
                e.kind,
                e.kv.key,
                e.kv.mod_revision,
                e.prev_kv.map(|p| p.value),
            )
        }));
    }
    (events, sizes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_from_a_revision_delivers_every_change_in_order() {
    let etcd_server = Etcd::start();
    let store = connect(&etcd_server).await;
    let mut live = KvStore::watch(&store, KeyRange::Prefix(b("a/")), 0);
    // "From now" is from when etcd creates the watch, which the port does
    // in the background: write a marker until the live watch sees one, so
    // that it exists before the writes under test (without this the first
    // of them could reach etcd first, and the test failed once that way).
    let marker = loop {
        let revision = store
            .run_txn(ops(vec![put("a/0", "marker")]))
            .await
            .unwrap()
            .revision;
        let seen = tokio::time::timeout(Duration::from_millis(200), live.next()).await;
        if let Ok(Some(batch)) = seen {
            let top = batch.unwrap().events.last().unwrap().kv.mod_revision;
            if top < revision {
                collect_until(&mut live, revision).await;
            }
            break revision;
        }
    };
    let r1 = store
        .run_txn(ops(vec![put("a/1", "x")]))
        .await
        .unwrap()
        .revision;
    let r2 = store
        .run_txn(ops(vec![put("a/2", "y")]))
        .await
        .unwrap()
        .revision;
    store.run_txn(ops(vec![put("b/1", "other")])).await.unwrap();
    let r3 = store
        .run_txn(ops(vec![Op::Delete(KeyRange::Key(b("a/1")))]))
        .await
        .unwrap()
        .revision;
    // Two events in one revision.
    let r4 = store
        .run_txn(ops(vec![
            put("a/3", "z"),
            Op::Delete(KeyRange::Key(b("a/2"))),
        ]))
        .await
        .unwrap()
        .revision;
    let expected = vec![
        (EventKind::Put, b("a/1"), r1, None),
        (EventKind::Put, b("a/2"), r2, None),
        (EventKind::Delete, b("a/1"), r3, Some(b("x"))),
        (EventKind::Put, b("a/3"), r4, None),
        (EventKind::Delete, b("a/2"), r4, Some(b("y"))),
    ];
    // From the first write's revision, and from the one after it.
    let mut from_start = KvStore::watch(&store, KeyRange::Prefix(b("a/")), r1);
    let (events, sizes) = collect_until(&mut from_start, r4).await;
    assert_eq!(events, expected);
    assert!(sizes.iter().sum::<usize>() == 5 && *sizes.last().unwrap() >= 2);
    let mut from_second = KvStore::watch(&store, KeyRange::Prefix(b("a/")), r2);
    assert_eq!(collect_until(&mut from_second, r4).await.0, expected[1..]);
    // The live watch (opened before the writes, from "now") saw them all.
    assert!(marker < r1);
    assert_eq!(collect_until(&mut live, r4).await.0, expected);
    // A tombstone carries the deleted key and its revision only.
    let mut one = KvStore::watch(&store, KeyRange::Key(b("a/1")), r3);
    let batch = next(&mut one).await.unwrap().unwrap();
    let tombstone = &batch.events[0];
    assert_eq!(
        tombstone.kv,
        KeyValue {
            key: b("a/1"),
            value: Bytes::new(),
            create_revision: 0,
            mod_revision: r3,
            version: 0,
            lease: 0,
        }
    );
    assert_eq!(tombstone.prev_kv.as_ref().unwrap().mod_revision, r1);
    // A watch from a future revision gets nothing below it.
    let mut future = KvStore::watch(&store, KeyRange::Prefix(b("a/")), r4 + 2);
    let r5 = store
        .run_txn(ops(vec![put("a/4", "1")]))
        .await
        .unwrap()
        .revision;
    let r6 = store
        .run_txn(ops(vec![put("a/5", "1")]))
        .await
        .unwrap()
        .revision;
    assert_eq!(r6, r4 + 2);
    let (events, _) = collect_until(&mut future, r6).await;
    assert_eq!(events, vec![(EventKind::Put, b("a/5"), r6, None)]);
    // And live watches keep going.
    assert_eq!(collect_until(&mut live, r5).await.0.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_revisions_arrive_whole() {
    // A revision with one 1.2 MB value, then one with two of 700 kB: a
    // catching-up watch gets them in one etcd response of 2.6 MB, which
    // etcd splits into fragments (of at most its request limit, 1.5 MiB,
    // plus 512 KiB for gRPC), here in the middle of the second revision.
    // They are joined before delivery.
    const FIRST: usize = 1_200_000;
    const SECOND: usize = 700_000;
    let etcd_server = Etcd::start();
    let store = connect(&etcd_server).await;
    let big = |n: usize| Bytes::from(vec![b'x'; n]);
    let r1 = store
        .run_txn(ops(vec![Op::Put {
            key: b("big/1"),
            value: big(FIRST),
            lease: 0,
        }]))
        .await
        .unwrap()
        .revision;
    let two = (0..2)
        .map(|i| Op::Put {
            key: b(&format!("big/2/{i}")),
            value: big(SECOND),
            lease: 0,
        })
        .collect();
    let r2 = store.run_txn(ops(two)).await.unwrap().revision;
    let mut w = KvStore::watch(&store, KeyRange::Prefix(b("big/")), r1);
    let mut got = vec![];
    while got.len() < 3 {
        let batch = next(&mut w).await.unwrap().unwrap();
        got.extend(
            batch
                .events
                .iter()
                .map(|e| (e.kv.mod_revision, e.kv.key.clone(), e.kv.value.len())),
        );
    }
    assert_eq!(
        got,
        vec![
            (r1, b("big/1"), FIRST),
            (r2, b("big/2/0"), SECOND),
            (r2, b("big/2/1"), SECOND),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_from_a_compacted_revision_is_compacted() {
    let etcd_server = Etcd::start();
    let store = connect(&etcd_server).await;
    let mut revisions = vec![];
    for i in 0..10 {
        let r = store
            .run_txn(ops(vec![put(&format!("k/{}", i % 3), &i.to_string())]))
            .await
            .unwrap();
        revisions.push(r.revision);
    }
    // Compacted with a watch open and caught up: it goes on.
    let mut open = KvStore::watch(&store, KeyRange::Prefix(b("k/")), revisions[0]);
    collect_until(&mut open, revisions[9]).await;
    let at = revisions[5];
    store.compact(at).await.unwrap();
    for start in [revisions[0], at - 1, at] {
        let mut w = KvStore::watch(&store, KeyRange::Prefix(b("k/")), start);
        match next(&mut w).await {
            Some(Err(StoreError::Compacted { compact_revision })) => {
                assert_eq!(compact_revision, at, "from {start}");
            }
            other => panic!("from {start}: {other:?}"),
        }
        assert!(
            next(&mut w).await.is_none(),
            "the stream ends after the error"
        );
    }
    // The first revision after the compaction is available.
    let mut w = KvStore::watch(&store, KeyRange::Prefix(b("k/")), at + 1);
    let (events, _) = collect_until(&mut w, revisions[9]).await;
    assert_eq!(events.first().unwrap().2, at + 1);
    assert_eq!(events.len(), 4);
    let r = store.run_txn(ops(vec![put("k/new", "1")])).await.unwrap();
    assert_eq!(collect_until(&mut open, r.revision).await.0.len(), 1);
    // Compacting again at or below is refused as compacted.
    assert!(matches!(
        store.compact(at).await,
        Err(StoreError::Compacted { .. })
    ));
    assert!(matches!(
        store.compact(r.revision + 10).await,
        Err(StoreError::FutureRevision { requested, current }) if requested == r.revision + 10 && current == r.revision
    ));
}

// ---------------------------------------------------------------------
// Leases.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_lease_deletes_its_keys() {
    let etcd_server = Etcd::start();
    let store = connect(&etcd_server).await;
    let lease = store.lease_grant(Duration::from_secs(1)).await.unwrap();
    assert_eq!(lease.ttl, Duration::from_secs(1));
    let r = store
        .run_txn(ops(vec![Op::Put {
            key: b("l/k"),
            value: b("v"),
            lease: lease.id,
        }]))
        .await
        .unwrap();
    let info = store.lease_time_to_live(lease.id).await.unwrap();
    assert_eq!(info.keys, vec![b("l/k")]);
    let mut w = KvStore::watch(&store, KeyRange::Prefix(b("l/")), r.revision + 1);
    let batch = next(&mut w).await.unwrap().unwrap();
    assert_eq!(batch.events.len(), 1);
    assert_eq!(batch.events[0].kind, EventKind::Delete);
    assert_eq!(batch.events[0].prev_kv.as_ref().unwrap().lease, lease.id);
    assert!(lease.sent_at.elapsed() >= Duration::from_secs(1));
    assert_eq!(
        store.lease_time_to_live(lease.id).await,
        Err(StoreError::LeaseNotFound(lease.id))
    );
    let reuse = ops(vec![Op::Put {
        key: b("l/k"),
        value: b("v"),
        lease: lease.id,
    }]);
    assert_eq!(
        store.run_txn(reuse).await,
        Err(StoreError::LeaseNotFound(lease.id))
    );
    assert_eq!(
        store.lease_revoke(lease.id).await,
        Err(StoreError::LeaseNotFound(lease.id))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_renews_until_dropped_and_reports_a_revoked_lease() {
    let etcd_server = Etcd::start();
    let store = connect(&etcd_server).await;
    let lease = store.lease_grant(Duration::from_secs(1)).await.unwrap();
    store
        .run_txn(ops(vec![Op::Put {
            key: b("l/kept"),
            value: b("v"),
            lease: lease.id,
        }]))
        .await
        .unwrap();
    let mut keep = store.lease_keep_alive(&lease);
    assert_eq!(keep.id(), lease.id);
    // Three TTLs later the key is still there, renewed all along.
    let until = std::time::Instant::now() + Duration::from_secs(3);
    let mut renewals = 0;
    let mut last_sent = lease.sent_at;
    while std::time::Instant::now() < until {
        let r = next(&mut keep).await.unwrap().unwrap();
        assert_eq!((r.id, r.ttl), (lease.id, Duration::from_secs(1)));
        assert!(r.sent_at > last_sent);
        last_sent = r.sent_at;
        renewals += 1;
    }
    assert!(renewals >= 5, "{renewals} renewals in 3 s");
    let (kvs, _) = store.range(KeyRange::Key(b("l/kept"))).await.unwrap();
    assert_eq!(kvs.len(), 1);
    // Dropped: the lease runs out.
    drop(keep);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !store
        .range(KeyRange::Key(b("l/kept")))
        .await
        .unwrap()
        .0
        .is_empty()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the key outlived its lease"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A revoked lease ends its keep-alive with LeaseNotFound.
    let lease = store.lease_grant(Duration::from_secs(5)).await.unwrap();
    let mut keep = store.lease_keep_alive(&lease);
    next(&mut keep).await.unwrap().unwrap();
    store.lease_revoke(lease.id).await.unwrap();
    let end = loop {
        match next(&mut keep).await.unwrap() {
            Ok(_) => continue,
            Err(e) => break e,
        }
    };
    assert_eq!(end, StoreError::LeaseNotFound(lease.id));
    assert!(next(&mut keep).await.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_rides_out_a_short_outage_and_reports_a_long_one() {
    let mut etcd_server = Etcd::start();
    let url = etcd_server.url();
    let store = connect(&etcd_server).await;
    let lease = store.lease_grant(Duration::from_secs(4)).await.unwrap();
    let mut keep = store.lease_keep_alive(&lease);
    next(&mut keep).await.unwrap().unwrap();
    // Down for less than the TTL: renewals resume, no error.
    etcd_server.restart();
    let back = std::time::Instant::now();
    loop {
        let r = next(&mut keep).await.unwrap().expect("the lease survives");
        if r.sent_at > back {
            break;
        }
    }
    assert_eq!(
        store.lease_time_to_live(lease.id).await.unwrap().id,
        lease.id
    );
    // Down for longer: the keep-alive ends once the TTL has run out.
    etcd_server.kill();
    let down = std::time::Instant::now();
    let err = loop {
        match within(15, keep.next()).await.unwrap() {
            Ok(_) => continue,
            Err(e) => break e,
        }
    };
    assert_unavailable_naming(&err, &url);
    assert!(err.to_string().contains("TTL ran out"), "{err}");
    let waited = down.elapsed();
    assert!(
        waited <= Duration::from_secs(6),
        "reported after {waited:?}"
    );
    assert!(next(&mut keep).await.is_none());
}

// ---------------------------------------------------------------------
// The election and its fence.

fn election_value(node: &str, address: &str) -> Bytes {
    LeaderElectionValue {
        node_id: node.into(),
        ttl: 1,
        curator_address: address.into(),
        schema_version: 1,
    }
    .encode_to_vec()
    .into()
}

fn decode(value: &Bytes) -> LeaderElectionValue {
    LeaderElectionValue::decode(value.as_ref()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_contenders_campaign_observe_and_resign() {
    let etcd_server = Etcd::start();
    // Two nodes, each with its own connection, and an observer.
    let node_a = connect(&etcd_server).await;
    let node_b = connect(&etcd_server).await;
    let observer = connect(&etcd_server).await;
    let election_a = node_a.election("/curator/leader");
    let election_b = node_b.election(b("/curator/leader/"));
    assert_eq!(election_a.prefix(), &b("/curator/leader/"));
    let mut observed = observer.election("/curator/leader").observe();

    let lease_a = node_a.lease_grant(Duration::from_secs(5)).await.unwrap();
    let _keep_a = node_a.lease_keep_alive(&lease_a);
    let key_a = within(
        5,
        election_a.campaign(lease_a.id, election_value("a", "10.0.0.1:7835")),
    )
    .await
    .unwrap();
    assert_eq!(key_a.key, election_a.candidate_key(lease_a.id));
    match next(&mut observed).await.unwrap().unwrap() {
        Observation::Leader(l) => {
            assert_eq!(l.key, key_a);
            let v = decode(&l.value);
            assert_eq!(
                (v.node_id.as_str(), v.curator_address.as_str()),
                ("a", "10.0.0.1:7835")
            );
        }
        other => panic!("{other:?}"),
    }

    // B waits behind A.
    let lease_b = node_b.lease_grant(Duration::from_secs(5)).await.unwrap();
    let _keep_b = node_b.lease_keep_alive(&lease_b);
    let mut campaign_b = election_b.campaign(lease_b.id, election_value("b", "10.0.0.2:7835"));
    assert!(
        tokio::time::timeout(Duration::from_millis(500), &mut campaign_b)
            .await
            .is_err(),
        "B must not win while A leads"
    );
    let (leader, _) = election_b.leader().await.unwrap();
    assert_eq!(leader.unwrap().key, key_a);

    // Campaigning again with the same lease keeps A's key (and revision)
    // and updates its value.
    let again = election_a
        .campaign(lease_a.id, election_value("a", "10.0.0.1:7999"))
        .await
        .unwrap();
    assert_eq!(again, key_a);
    match next(&mut observed).await.unwrap().unwrap() {
        Observation::Leader(l) => assert_eq!(decode(&l.value).curator_address, "10.0.0.1:7999"),
        other => panic!("{other:?}"),
    }

    // A resigns: B leads, and the observer sees A gone, then B.
    assert!(election_a.resign(&key_a).await.unwrap());
    assert!(
        !election_a.resign(&key_a).await.unwrap(),
        "already resigned"
    );
    let key_b = within(5, campaign_b).await.unwrap();
    assert!(key_b.create_revision > key_a.create_revision);
    assert_eq!(
        next(&mut observed).await.unwrap().unwrap(),
        Observation::Gone(key_a.clone())
    );
    match next(&mut observed).await.unwrap().unwrap() {
        Observation::Leader(l) => {
            assert_eq!(l.key, key_b);
            assert_eq!(decode(&l.value).node_id, "b");
        }
        other => panic!("{other:?}"),
    }

    // B's lease is revoked: no leader.
    node_b.lease_revoke(lease_b.id).await.unwrap();
    assert_eq!(
        next(&mut observed).await.unwrap().unwrap(),
        Observation::Gone(key_b)
    );
    assert_eq!(election_a.leader().await.unwrap().0, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_campaign_whose_lease_ends_fails() {
    let etcd_server = Etcd::start();
    let store = connect(&etcd_server).await;
    let election = store.election("e");
    let first = store.lease_grant(Duration::from_secs(30)).await.unwrap();
    election.campaign(first.id, b("first")).await.unwrap();
    // Waiting behind `first` with a lease nobody keeps alive.
    let second = store.lease_grant(Duration::from_secs(1)).await.unwrap();
    let result = within(10, election.campaign(second.id, b("second"))).await;
    assert_eq!(result, Err(StoreError::LeaseNotFound(second.id)));
    // And with a lease that is gone already.
    assert_eq!(
        election.campaign(second.id, b("again")).await,
        Err(StoreError::LeaseNotFound(second.id))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_writes_fail_once_the_leaders_key_is_gone() {
    let etcd_server = Etcd::start();
    let node_a = connect(&etcd_server).await;
    let node_b = connect(&etcd_server).await;
    let election_a = node_a.election("/curator/leader");
    let election_b = node_b.election("/curator/leader");

    // A leads with a lease it stops renewing (a paused leader).
    let lease_a = node_a.lease_grant(Duration::from_secs(1)).await.unwrap();
    let key_a = election_a
        .campaign(lease_a.id, election_value("a", "a:1"))
        .await
        .unwrap();
    let write = |value: &str| ops(vec![put("/nodes/n1", value)]);
    let held = election_a
        .fenced_txn(&key_a, write("from a"))
        .await
        .unwrap();
    assert_eq!(held.fence, FenceCheck::Held);
    assert!(held.response.succeeded);
    // A failed compare of the transaction's own is not a lost fence, and
    // its results are the transaction's own.
    let mut own = write("never");
    own.compares.push(Compare {
        key: b("/nodes/n1"),
        op: CmpOp::Equal,
        target: CompareTarget::Value(b("something else")),
    });
    own.failure.push(Op::Range(KeyRange::Key(b("/nodes/n1"))));
    let refused = election_a.fenced_txn(&key_a, own).await.unwrap();
    assert_eq!(refused.fence, FenceCheck::Held);
    assert!(!refused.response.succeeded);
    assert!(
        matches!(&refused.response.results[..], [OpResult::Range(kvs)] if kvs[0].value == b("from a"))
    );

    // B campaigns with a live lease; A's lease expires; B leads.
    let lease_b = node_b.lease_grant(Duration::from_secs(10)).await.unwrap();
    let _keep_b = node_b.lease_keep_alive(&lease_b);
    let key_b = within(
        10,
        election_b.campaign(lease_b.id, election_value("b", "b:1")),
    )
    .await
    .unwrap();
    // A, unaware, writes on: nothing commits.
    let before = node_a.revision().await.unwrap();
    let lost = election_a.fenced_txn(&key_a, write("stale")).await.unwrap();
    assert_eq!(lost.fence, FenceCheck::Lost);
    assert!(!lost.response.succeeded);
    assert_eq!(node_a.revision().await.unwrap(), before);
    let (kvs, _) = node_b.range(KeyRange::Key(b("/nodes/n1"))).await.unwrap();
    assert_eq!(kvs[0].value, b("from a"));
    // A re-created key under A's name does not revive A's fence.
    let stale_key = ElectionKey {
        key: key_b.key.clone(),
        create_revision: key_a.create_revision,
    };
    let lost = election_b
        .fenced_txn(&stale_key, write("stale"))
        .await
        .unwrap();
    assert_eq!(lost.fence, FenceCheck::Lost);
    // B's fence holds.
    let ok = election_b
        .fenced_txn(&key_b, write("from b"))
        .await
        .unwrap();
    assert_eq!((ok.fence, ok.response.succeeded), (FenceCheck::Held, true));
    // The guard has the shape of the core Fence: its compare and the read.
    let guarded = metropolis_etcd::fence(&key_b, Txn::default());
    assert_eq!(guarded.compares.len(), 1);
    assert_eq!(
        guarded.failure,
        vec![Op::Range(KeyRange::Key(key_b.key.clone()))]
    );
    let _: &TxnResponse = &ok.response;
}

// ---------------------------------------------------------------------
// etcd going away, and coming back.

fn assert_unavailable_naming(err: &StoreError, url: &str) {
    match err {
        StoreError::Unavailable(m) => assert!(m.contains(url), "{m}"),
        other => panic!("expected Unavailable naming {url}, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_down_is_unavailable_naming_the_endpoint_and_recovers() {
    let mut etcd_server = Etcd::start();
    let url = etcd_server.url();
    let store = connect(&etcd_server).await;
    let r = store.run_txn(ops(vec![put("d/k", "1")])).await.unwrap();
    let mut watch = KvStore::watch(&store, KeyRange::Prefix(b("d/")), r.revision);
    assert_eq!(next(&mut watch).await.unwrap().unwrap().events.len(), 1);

    etcd_server.kill();
    // The open watch tries to resume for a while, then ends, saying where
    // to resume.
    let err = within(10, next(&mut watch)).await.unwrap().unwrap_err();
    assert_unavailable_naming(&err, &url);
    assert!(
        err.to_string()
            .contains(&format!("from revision {}", r.revision + 1)),
        "{err}"
    );
    assert!(next(&mut watch).await.is_none());
    // Requests fail within the request timeout.
    let started = std::time::Instant::now();
    let err = within(10, store.run_txn(ops(vec![put("d/k", "2")])))
        .await
        .unwrap_err();
    assert_unavailable_naming(&err, &url);
    assert!(started.elapsed() < Duration::from_secs(4));
    let err = within(10, store.lease_grant(Duration::from_secs(5)))
        .await
        .unwrap_err();
    assert_unavailable_naming(&err, &url);
    let err = within(
        10,
        KvStore::watch(&store, KeyRange::Prefix(b("d/")), 0).next(),
    )
    .await
    .unwrap()
    .unwrap_err();
    assert_unavailable_naming(&err, &url);
    // Connecting fails, naming it.
    let err = within(10, EtcdStore::connect(etcd_server.config()))
        .await
        .unwrap_err();
    assert_unavailable_naming(&err, &url);

    // Back: the same store serves again, with the data.
    etcd_server.restart();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let r2 = loop {
        match store.run_txn(ops(vec![put("d/k", "3")])).await {
            Ok(r) => break r,
            Err(e) => assert!(std::time::Instant::now() < deadline, "{e}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        r2.results,
        vec![OpResult::Put(Some(KeyValue {
            key: b("d/k"),
            value: b("1"),
            create_revision: r.revision,
            mod_revision: r.revision,
            version: 1,
            lease: 0,
        }))]
    );
    let mut resumed = KvStore::watch(&store, KeyRange::Prefix(b("d/")), r.revision + 1);
    let (events, _) = collect_until(&mut resumed, r2.revision).await;
    assert_eq!(
        events,
        vec![(EventKind::Put, b("d/k"), r2.revision, Some(b("1")))]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_resumes_across_a_restart_without_missing_a_change() {
    let mut etcd_server = Etcd::start();
    let store = connect(&etcd_server).await;
    let r = store.run_txn(ops(vec![put("r/a", "1")])).await.unwrap();
    let mut watch = KvStore::watch(&store, KeyRange::Prefix(b("r/")), r.revision);
    assert_eq!(next(&mut watch).await.unwrap().unwrap().events.len(), 1);
    etcd_server.restart();
    // Written once etcd is back, through a second client: the open watch
    // delivers these, in order, with no error in between.
    let writer = connect(&etcd_server).await;
    let mut last = 0;
    for value in ["2", "3"] {
        last = writer
            .run_txn(ops(vec![put("r/a", value)]))
            .await
            .unwrap()
            .revision;
    }
    let deleted = writer
        .run_txn(ops(vec![Op::Delete(KeyRange::Key(b("r/a")))]))
        .await
        .unwrap();
    let (events, _) = collect_until(&mut watch, deleted.revision).await;
    assert_eq!(
        events,
        vec![
            (EventKind::Put, b("r/a"), last - 1, Some(b("1"))),
            (EventKind::Put, b("r/a"), last, Some(b("2"))),
            (EventKind::Delete, b("r/a"), deleted.revision, Some(b("3"))),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connecting_to_nothing_names_the_endpoint() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let mut config = EtcdConfig::new([url.clone()]);
    config.request_timeout = Duration::from_secs(1);
    let err = within(10, EtcdStore::connect(config)).await.unwrap_err();
    assert_unavailable_naming(&err, &url);
    let err = within(
        10,
        EtcdStore::connect(EtcdConfig::new(Vec::<String>::new())),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, StoreError::Unavailable(m) if m.contains("no etcd endpoint")));
}

// ---------------------------------------------------------------------
// From smol: the store on a runtime of its own.

/// Threads of this process named `etcd-client` (dedicated runtimes).
fn etcd_client_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter(|task| {
            let comm = task.as_ref().unwrap().path().join("comm");
            std::fs::read_to_string(comm).is_ok_and(|name| name.trim() == "etcd-client")
        })
        .count()
}

#[test]
fn usable_from_smol_on_a_dedicated_runtime() {
    let etcd_server = Etcd::start();
    let config = etcd_server.config();
    smol::block_on(async {
        // Outside tokio, `connect` says what to use instead.
        let err = EtcdStore::connect(config.clone()).await.unwrap_err();
        assert!(err.to_string().contains("connect_dedicated"), "{err}");

        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        let store = loop {
            match EtcdStore::connect_dedicated(config.clone()).await {
                Ok(store) => break store,
                Err(e) => assert!(std::time::Instant::now() < deadline, "{e}"),
            }
            smol::Timer::after(Duration::from_millis(100)).await;
        };
        let writer = EtcdStore::connect_dedicated(config.clone()).await.unwrap();
        assert_eq!(etcd_client_threads(), 2, "one runtime thread per store");
        let store: std::sync::Arc<dyn KvStore> = std::sync::Arc::new(store);
        let mut watch = store.watch(KeyRange::Prefix(b("s/")), 0);
        let r = store.txn(ops(vec![put("s/1", "smol")])).await.unwrap();
        let batch = watch.next().await.unwrap().unwrap();
        assert_eq!(batch.events[0].kv.mod_revision, r.revision);
        assert_eq!(
            store
                .read_for_update(KeyRange::Key(b("s/1")))
                .await
                .unwrap()[0]
                .value,
            b("smol")
        );
        // The watch keeps its store's runtime running after the store is
        // dropped; the runtime stops once the watch is dropped too.
        drop(store);
        let r = writer.run_txn(ops(vec![put("s/2", "x")])).await.unwrap();
        let batch = watch.next().await.unwrap().unwrap();
        assert_eq!(batch.events[0].kv.mod_revision, r.revision);
        drop(watch);
        drop(writer);
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while etcd_client_threads() > 0 {
            assert!(std::time::Instant::now() < deadline, "runtime threads left");
            smol::Timer::after(Duration::from_millis(20)).await;
        }
    });
}
