//! Unit tests of the store model: etcd corner cases.

#![allow(clippy::unwrap_used)]

mod proptests;

use std::time::Duration;

use bytes::Bytes;

use super::*;
use crate::time::Instant;

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

fn put_lease(key: &str, value: &str, lease: LeaseId) -> Op {
    Op::Put {
        key: b(key),
        value: b(value),
        lease,
    }
}

fn ops(ops: Vec<Op>) -> Txn {
    Txn {
        compares: vec![],
        success: ops,
        failure: vec![],
    }
}

fn at(secs: u64) -> Instant {
    Instant::from_offset(Duration::from_secs(secs))
}

fn events(store: &mut MemStore, id: WatchId) -> Vec<(EventKind, String, Revision)> {
    match store.poll_watch(id) {
        None => vec![],
        Some(Ok(batch)) => batch
            .events
            .iter()
            .map(|e| {
                (
                    e.kind,
                    String::from_utf8(e.kv.key.to_vec()).unwrap(),
                    e.kv.mod_revision,
                )
            })
            .collect(),
        Some(Err(e)) => panic!("unexpected error {e}"),
    }
}

#[test]
fn revisions_and_versions() {
    let mut s = MemStore::new();
    assert_eq!(s.revision(), 1);
    let r = s.txn(&ops(vec![put("a", "1"), put("b", "1")])).unwrap();
    assert_eq!(r.revision, 2);
    assert_eq!(r.results, vec![OpResult::Put(None), OpResult::Put(None)]);
    let r = s.txn(&ops(vec![put("a", "2")])).unwrap();
    assert_eq!(r.revision, 3);
    let a = s.get(b"a").unwrap().clone();
    assert_eq!((a.create_revision, a.mod_revision, a.version), (2, 3, 2));
    // Read-only and no-op transactions do not move the revision.
    let r = s.txn(&ops(vec![
        Op::Range(KeyRange::Prefix(b(""))),
        Op::Delete(KeyRange::Key(b("zz"))),
    ]));
    assert_eq!(r.unwrap().revision, 3);
    assert_eq!(s.revision(), 3);
    // Delete then recreate resets version and create revision.
    let r = s
        .txn(&ops(vec![Op::Delete(KeyRange::Key(b("a")))]))
        .unwrap();
    assert_eq!(r.revision, 4);
    assert!(matches!(&r.results[0], OpResult::Delete(d) if d.len() == 1 && d[0].version == 2));
    s.txn(&ops(vec![put("a", "3")])).unwrap();
    let a = s.get(b"a").unwrap();
    assert_eq!((a.create_revision, a.mod_revision, a.version), (5, 5, 1));
}

#[test]
fn compares_on_missing_keys() {
    let mut s = MemStore::new();
    let cmp = |target, op| Compare {
        key: b("missing"),
        op,
        target,
    };
    let holds = |s: &mut MemStore, c: Compare| {
        s.txn(&Txn {
            compares: vec![c],
            success: vec![],
            failure: vec![],
        })
        .unwrap()
        .succeeded
    };
    assert!(holds(
        &mut s,
        cmp(CompareTarget::CreateRevision(0), CmpOp::Equal)
    ));
    assert!(holds(
        &mut s,
        cmp(CompareTarget::ModRevision(0), CmpOp::Equal)
    ));
    assert!(holds(&mut s, cmp(CompareTarget::Version(0), CmpOp::Equal)));
    assert!(holds(&mut s, cmp(CompareTarget::Version(1), CmpOp::Less)));
    // A value compare on a missing key is false whatever the operator.
    for op in [CmpOp::Equal, CmpOp::NotEqual, CmpOp::Less, CmpOp::Greater] {
        assert!(!holds(&mut s, cmp(CompareTarget::Value(b("")), op)));
    }
}

#[test]
fn compare_and_swap_runs_one_branch() {
    let mut s = MemStore::new();
    s.txn(&ops(vec![put("k", "v1")])).unwrap();
    let cas = |expect: Revision| Txn {
        compares: vec![Compare {
            key: b("k"),
            op: CmpOp::Equal,
            target: CompareTarget::ModRevision(expect),
        }],
        success: vec![put("k", "v2")],
        failure: vec![Op::Range(KeyRange::Key(b("k")))],
    };
    let r = s.txn(&cas(1)).unwrap();
    assert!(!r.succeeded);
    assert_eq!(r.revision, 2);
    assert!(matches!(&r.results[0], OpResult::Range(kvs) if kvs[0].value == b("v1")));
    let r = s.txn(&cas(2)).unwrap();
    assert!(r.succeeded);
    assert_eq!(r.revision, 3);
}

#[test]
fn ranges_see_earlier_ops_of_the_txn_and_prefixes() {
    let mut s = MemStore::new();
    s.txn(&ops(vec![put("a", "1"), put("ab", "1"), put("b", "1")]))
        .unwrap();
    let r = s
        .txn(&ops(vec![
            put("aa", "2"),
            Op::Range(KeyRange::Prefix(b("a"))),
            Op::Delete(KeyRange::Prefix(b("a"))),
            Op::Range(KeyRange::Prefix(b(""))),
        ]))
        .unwrap();
    let keys = |kvs: &[KeyValue]| kvs.iter().map(|kv| kv.key.clone()).collect::<Vec<_>>();
    match &r.results[..] {
        [
            OpResult::Put(None),
            OpResult::Range(r1),
            OpResult::Delete(d),
            OpResult::Range(r2),
        ] => {
            assert_eq!(keys(r1), vec![b("a"), b("aa"), b("ab")]);
            assert_eq!(keys(d), vec![b("a"), b("aa"), b("ab")]);
            assert_eq!(keys(r2), vec![b("b")]);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(r.revision, 3);
}

#[test]
fn put_with_missing_lease_changes_nothing() {
    let mut s = MemStore::new();
    let err = s
        .txn(&ops(vec![put("a", "1"), put_lease("b", "1", 42)]))
        .unwrap_err();
    assert_eq!(err, StoreError::LeaseNotFound(42));
    assert_eq!(s.revision(), 1);
    assert!(s.is_empty());
    // Only the branch that runs is checked.
    let t = Txn {
        compares: vec![Compare {
            key: b("x"),
            op: CmpOp::Equal,
            target: CompareTarget::Version(0),
        }],
        success: vec![put("a", "1")],
        failure: vec![put_lease("b", "1", 42)],
    };
    assert!(s.txn(&t).unwrap().succeeded);
}

#[test]
fn delete_events_and_prev_kv() {
    let mut s = MemStore::new();
    let w = s.watch(KeyRange::Prefix(b("")), 0).unwrap();
    s.txn(&ops(vec![put("a", "1")])).unwrap();
    s.txn(&ops(vec![put("a", "2")])).unwrap();
    s.txn(&ops(vec![Op::Delete(KeyRange::Key(b("a")))]))
        .unwrap();
    let batch = s.poll_watch(w).unwrap().unwrap();
    assert_eq!(batch.revision, 4);
    assert_eq!(batch.events.len(), 3);
    assert_eq!(batch.events[0].prev_kv, None);
    assert_eq!(batch.events[1].prev_kv.as_ref().unwrap().value, b("1"));
    let del = &batch.events[2];
    assert_eq!(del.kind, EventKind::Delete);
    assert_eq!(
        del.kv,
        KeyValue {
            key: b("a"),
            value: Bytes::new(),
            create_revision: 0,
            mod_revision: 4,
            version: 0,
            lease: 0
        }
    );
    assert_eq!(del.prev_kv.as_ref().unwrap().version, 2);
    assert!(s.poll_watch(w).is_none());
}

#[test]
fn watch_from_future_revision_gets_no_older_events() {
    let mut s = MemStore::new();
    s.txn(&ops(vec![put("a", "1")])).unwrap(); // rev 2
    let w = s.watch(KeyRange::Prefix(b("")), 5).unwrap();
    s.txn(&ops(vec![put("a", "2")])).unwrap(); // rev 3
    s.txn(&ops(vec![put("b", "2")])).unwrap(); // rev 4
    assert!(s.poll_watch(w).is_none());
    s.txn(&ops(vec![put("c", "2")])).unwrap(); // rev 5
    assert_eq!(events(&mut s, w), vec![(EventKind::Put, "c".into(), 5)]);
    // Polling before the start revision does not move the cursor back.
    let w2 = s.watch(KeyRange::Prefix(b("")), 9).unwrap();
    assert!(s.poll_watch(w2).is_none());
    for _ in 0..4 {
        s.txn(&ops(vec![put("d", "x")])).unwrap(); // revs 6..=9
        if s.revision() < 9 {
            assert!(s.poll_watch(w2).is_none());
        }
    }
    assert_eq!(events(&mut s, w2), vec![(EventKind::Put, "d".into(), 9)]);
}

#[test]
fn watch_from_past_revision_replays_history_once() {
    let mut s = MemStore::new();
    s.txn(&ops(vec![put("a", "1"), put("b", "1")])).unwrap(); // 2
    s.txn(&ops(vec![put("b", "2")])).unwrap(); // 3
    let w = s.watch(KeyRange::Key(b("b")), 2).unwrap();
    assert_eq!(
        events(&mut s, w),
        vec![
            (EventKind::Put, "b".into(), 2),
            (EventKind::Put, "b".into(), 3)
        ]
    );
    assert!(s.poll_watch(w).is_none());
    assert!(s.cancel_watch(w));
    assert!(!s.cancel_watch(w));
    assert!(s.poll_watch(w).is_none());
}

#[test]
fn poll_watch_up_to_delivers_whole_revisions() {
    let mut s = MemStore::new();
    let w = s.watch(KeyRange::Prefix(b("")), 0).unwrap();
    s.txn(&ops(vec![put("a", "1"), put("b", "1")])).unwrap(); // 2
    s.txn(&ops(vec![put("c", "1")])).unwrap(); // 3
    let batch = s.poll_watch_up_to(w, 2).unwrap().unwrap();
    assert_eq!((batch.events.len(), batch.revision), (2, 2));
    let batch = s.poll_watch_up_to(w, 10).unwrap().unwrap();
    assert_eq!((batch.events.len(), batch.revision), (1, 3));
}

#[test]
fn compact_detached_hands_back_the_dropped_history() {
    let mut s = MemStore::new();
    for i in 0..4 {
        s.txn(&ops(vec![put("a", &i.to_string())])).unwrap(); // 2..=5
    }
    // Revision 1 wrote nothing: revisions 2 and 3 have history.
    assert_eq!(s.compact_detached(3).unwrap().revisions(), 2);
    assert_eq!(s.compact_revision(), 3);
    assert_eq!(
        s.compact_detached(3).map(|h| h.revisions()),
        Err(StoreError::Compacted {
            compact_revision: 3
        })
    );
    let w = s.watch(KeyRange::Prefix(b("")), 4).unwrap();
    assert_eq!(
        events(&mut s, w),
        vec![
            (EventKind::Put, "a".into(), 4),
            (EventKind::Put, "a".into(), 5)
        ]
    );
    assert_eq!(s.compact_detached(5).unwrap().revisions(), 2);
}

#[test]
fn compaction() {
    let mut s = MemStore::new();
    assert_eq!(
        s.compact(0),
        Err(StoreError::Compacted {
            compact_revision: 0
        })
    );
    assert_eq!(
        s.compact(2),
        Err(StoreError::FutureRevision {
            requested: 2,
            current: 1
        })
    );
    let lagging = s.watch(KeyRange::Prefix(b("")), 0).unwrap();
    let current = s.watch(KeyRange::Prefix(b("")), 0).unwrap();
    for i in 0..4 {
        s.txn(&ops(vec![put("a", &i.to_string())])).unwrap(); // 2..=5
    }
    assert_eq!(events(&mut s, current).len(), 4);
    s.compact(3).unwrap();
    assert_eq!(
        s.compact(3),
        Err(StoreError::Compacted {
            compact_revision: 3
        })
    );
    assert_eq!(s.compact_revision(), 3);
    assert_eq!(
        s.poll_watch(lagging),
        Some(Err(StoreError::Compacted {
            compact_revision: 3
        }))
    );
    assert_eq!(s.poll_watch(lagging), None, "compacted once, then removed");
    assert!(s.poll_watch(current).is_none());
    assert_eq!(
        s.watch(KeyRange::Prefix(b("")), 3),
        Err(StoreError::Compacted {
            compact_revision: 3
        })
    );
    let w = s.watch(KeyRange::Prefix(b("")), 4).unwrap();
    assert_eq!(
        events(&mut s, w),
        vec![
            (EventKind::Put, "a".into(), 4),
            (EventKind::Put, "a".into(), 5)
        ]
    );
    // Compacting up to the current revision is allowed.
    s.compact(5).unwrap();
    assert!(s.poll_watch(w).is_none());
    assert!(s.poll_watch(current).is_none());
}

#[test]
fn leases_expire_on_injected_time() {
    let mut s = MemStore::new();
    let l1 = s.lease_grant(0, Duration::from_secs(10), at(0)).unwrap();
    let l2 = s.lease_grant(0, Duration::from_secs(5), at(0)).unwrap();
    assert_eq!((l1, l2), (1, 2));
    assert_eq!(
        s.lease_grant(l1, Duration::from_secs(1), at(0)),
        Err(StoreError::LeaseExists(1))
    );
    assert_eq!(s.lease_grant(10, Duration::from_secs(5), at(0)), Ok(10));
    assert_eq!(s.lease_grant(0, Duration::from_secs(5), at(0)), Ok(11));
    s.lease_revoke(10).unwrap();
    s.lease_revoke(11).unwrap();
    s.txn(&ops(vec![
        put_lease("a", "1", l1),
        put_lease("b", "1", l1),
        put_lease("c", "1", l2),
    ]))
    .unwrap(); // 2
    assert_eq!(s.poll_timeout(), Some(at(5)));
    assert_eq!(s.lease_keep_alive(l2, at(4)), Ok(Duration::from_secs(5)));
    assert_eq!(s.poll_timeout(), Some(at(9)));
    assert_eq!(s.handle_timeout(at(8)), Vec::<LeaseId>::new());
    let info = s.lease_time_to_live(l1, at(8)).unwrap();
    assert_eq!(info.remaining, Duration::from_secs(2));
    assert_eq!(info.keys, vec![b("a"), b("b")]);
    // Moving a key to another lease detaches it.
    s.txn(&ops(vec![put("b", "2")])).unwrap(); // 3
    assert_eq!(s.lease_time_to_live(l1, at(8)).unwrap().keys, vec![b("a")]);
    // Both expire by 10: l2 (deadline 9) first, each in its own revision.
    assert_eq!(s.handle_timeout(at(10)), vec![l2, l1]);
    assert_eq!(s.revision(), 5);
    assert_eq!(s.range(&KeyRange::Prefix(b(""))).len(), 1);
    assert_eq!(s.poll_timeout(), None);
    assert_eq!(
        s.lease_keep_alive(l1, at(10)),
        Err(StoreError::LeaseNotFound(l1))
    );
    assert_eq!(s.lease_revoke(l1), Err(StoreError::LeaseNotFound(l1)));
    s.check_invariants();
}

#[test]
fn expired_lease_cannot_be_kept_alive_and_same_deadline_orders_by_id() {
    let mut s = MemStore::new();
    s.lease_grant(7, Duration::from_secs(1), at(0)).unwrap();
    s.lease_grant(3, Duration::from_secs(1), at(0)).unwrap();
    assert_eq!(
        s.lease_keep_alive(7, at(1)),
        Err(StoreError::LeaseNotFound(7))
    );
    // Revoking a lease without keys does not move the revision.
    assert_eq!(s.handle_timeout(at(1)), vec![3, 7]);
    assert_eq!(s.revision(), 1);
}

#[test]
fn lease_revoke_deletes_keys_in_one_revision() {
    let mut s = MemStore::new();
    let l = s.lease_grant(0, Duration::from_secs(10), at(0)).unwrap();
    s.txn(&ops(vec![put_lease("a", "1", l), put_lease("b", "1", l)]))
        .unwrap();
    let w = s.watch(KeyRange::Prefix(b("")), 0).unwrap();
    assert_eq!(s.lease_revoke(l), Ok(3));
    assert_eq!(
        events(&mut s, w),
        vec![
            (EventKind::Delete, "a".into(), 3),
            (EventKind::Delete, "b".into(), 3)
        ]
    );
}

#[test]
fn replay_and_snapshot_restore() {
    let mut s = MemStore::new();
    let mut log = Vec::new();
    let l = s.lease_grant(0, Duration::from_secs(10), at(0)).unwrap();
    log.push(Record::LeaseGrant {
        id: l,
        ttl: Duration::from_secs(10),
    });
    let t = ops(vec![put_lease("a", "1", l), put("b", "1")]);
    s.txn(&t).unwrap();
    log.push(Record::Txn(t));
    let snap = s.snapshot();
    let snap_at = log.len();
    s.compact(2).unwrap();
    log.push(Record::Compact(2));
    let t = ops(vec![put("c", "1")]);
    s.txn(&t).unwrap();
    log.push(Record::Txn(t));

    let mut replayed = MemStore::new();
    for r in &log {
        replayed
            .apply(&decode_record(&encode_record(r)).unwrap(), at(100))
            .unwrap();
    }
    assert_eq!(replayed.snapshot(), s.snapshot());

    let snap = decode_snapshot(&encode_snapshot(&snap)).unwrap();
    let mut restored = MemStore::from_snapshot(snap, at(100));
    assert_eq!(restored.compact_revision(), 2);
    assert_eq!(
        restored.lease_time_to_live(l, at(100)).unwrap().remaining,
        Duration::from_secs(10)
    );
    for r in &log[snap_at..] {
        restored.apply(r, at(100)).unwrap();
    }
    restored.check_invariants();
    let mut expected = s.snapshot();
    expected.compact_revision = 2;
    assert_eq!(restored.snapshot(), expected);
    assert_eq!(
        restored.watch(KeyRange::Prefix(b("")), 2),
        Err(StoreError::Compacted {
            compact_revision: 2
        })
    );
}
