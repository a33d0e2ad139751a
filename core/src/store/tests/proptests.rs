//! Property tests of [`MemStore`] against a naive reference model: full
//! state cloned per revision, every event ever produced kept in one list,
//! lease keys found by scanning.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use proptest::prelude::*;

use crate::ports::WatchBatch;
use crate::store::*;
use crate::time::Instant;

const KEYS: &[&str] = &["a", "ab", "b", "ba", "c"];
const PREFIXES: &[&str] = &["", "a", "b", "c"];
const VALUES: &[&str] = &["", "x", "y"];

fn bytes_of(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

fn key() -> impl Strategy<Value = Bytes> {
    prop::sample::select(KEYS).prop_map(bytes_of)
}

fn value() -> impl Strategy<Value = Bytes> {
    prop::sample::select(VALUES).prop_map(bytes_of)
}

fn range() -> impl Strategy<Value = KeyRange> {
    prop_oneof![
        key().prop_map(KeyRange::Key),
        prop::sample::select(PREFIXES).prop_map(|p| KeyRange::Prefix(bytes_of(p))),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        1 => range().prop_map(Op::Range),
        3 => (key(), value(), prop::sample::select(&[0i64, 0, 1, 2, 3, 99][..]))
            .prop_map(|(key, value, lease)| Op::Put { key, value, lease }),
        1 => range().prop_map(Op::Delete),
    ]
}

fn compare() -> impl Strategy<Value = Compare> {
    let op =
        prop::sample::select(&[CmpOp::Equal, CmpOp::NotEqual, CmpOp::Less, CmpOp::Greater][..]);
    let target = prop_oneof![
        value().prop_map(CompareTarget::Value),
        (0i64..8).prop_map(CompareTarget::CreateRevision),
        (0i64..8).prop_map(CompareTarget::ModRevision),
        (0i64..4).prop_map(CompareTarget::Version),
    ];
    (key(), op, target).prop_map(|(key, op, target)| Compare { key, op, target })
}

fn txn() -> impl Strategy<Value = Txn> {
    (
        prop::collection::vec(compare(), 0..3),
        prop::collection::vec(op(), 0..4),
        prop::collection::vec(op(), 0..3),
    )
        .prop_map(|(compares, success, failure)| Txn {
            compares,
            success,
            failure,
        })
}

#[derive(Clone, Debug)]
enum Action {
    Txn(Txn),
    Grant {
        id: LeaseId,
        ttl_secs: u64,
    },
    KeepAlive(LeaseId),
    Revoke(LeaseId),
    Advance(u64),
    /// Compact `back` revisions behind the current one.
    Compact(i64),
    Watch {
        range: KeyRange,
        start: Revision,
    },
    Poll(usize),
    Cancel(usize),
    /// Take the snapshot used by the restore check (the last one wins).
    Snapshot,
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        8 => txn().prop_map(Action::Txn),
        2 => (prop::sample::select(&[0i64, 0, 1, 2, 3][..]), 1u64..6)
            .prop_map(|(id, ttl_secs)| Action::Grant { id, ttl_secs }),
        1 => (1i64..5).prop_map(Action::KeepAlive),
        1 => (1i64..5).prop_map(Action::Revoke),
        2 => (0u64..4).prop_map(Action::Advance),
        1 => (-1i64..5).prop_map(Action::Compact),
        2 => (range(), 0i64..16).prop_map(|(range, start)| Action::Watch { range, start }),
        3 => (0usize..8).prop_map(Action::Poll),
        1 => (0usize..8).prop_map(Action::Cancel),
        1 => Just(Action::Snapshot),
    ]
}

/// One watch, as the reference sees it.
struct RefWatch {
    range: KeyRange,
    first: Revision,
    next: Revision,
    live: bool,
    compacted: bool,
    cancelled: bool,
    received: Vec<Event>,
}

/// The naive reference model.
struct Reference {
    /// State at every revision (index = revision).
    states: Vec<BTreeMap<Bytes, KeyValue>>,
    compact: Revision,
    /// Every event ever produced, with its revision.
    events: Vec<(Revision, Event)>,
    /// Lease ID to (ttl, deadline).
    leases: BTreeMap<LeaseId, (Duration, Instant)>,
    next_lease: LeaseId,
    watches: Vec<RefWatch>,
}

impl Reference {
    fn new() -> Self {
        Reference {
            states: vec![BTreeMap::new(), BTreeMap::new()],
            compact: 0,
            events: vec![],
            leases: BTreeMap::new(),
            next_lease: 1,
            watches: vec![],
        }
    }

    fn revision(&self) -> Revision {
        (self.states.len() - 1) as Revision
    }

    fn state(&self) -> &BTreeMap<Bytes, KeyValue> {
        self.states.last().unwrap()
    }

    fn select(state: &BTreeMap<Bytes, KeyValue>, range: &KeyRange) -> Vec<KeyValue> {
        state
            .values()
            .filter(|kv| range.contains(&kv.key))
            .cloned()
            .collect()
    }

    fn txn(&mut self, txn: &Txn) -> Result<TxnResponse, StoreError> {
        let mut state = self.state().clone();
        let succeeded = txn.compares.iter().all(|c| {
            let kv = state.get(&c.key);
            match &c.target {
                CompareTarget::Value(v) => kv.is_some_and(|kv| c.op.holds(&kv.value, v)),
                CompareTarget::CreateRevision(r) => {
                    c.op.holds(&kv.map(|kv| kv.create_revision).unwrap_or(0), r)
                }
                CompareTarget::ModRevision(r) => {
                    c.op.holds(&kv.map(|kv| kv.mod_revision).unwrap_or(0), r)
                }
                CompareTarget::Version(v) => c.op.holds(&kv.map(|kv| kv.version).unwrap_or(0), v),
            }
        });
        let ops = if succeeded {
            &txn.success
        } else {
            &txn.failure
        };
        let rev = self.revision() + 1;
        let mut events = vec![];
        let mut results = vec![];
        for op in ops {
            match op {
                Op::Range(r) => results.push(OpResult::Range(Self::select(&state, r))),
                Op::Put { key, value, lease } => {
                    if *lease != 0 && !self.leases.contains_key(lease) {
                        return Err(StoreError::LeaseNotFound(*lease));
                    }
                    let prev = state.get(key).cloned();
                    let kv = KeyValue {
                        key: key.clone(),
                        value: value.clone(),
                        create_revision: prev.as_ref().map(|p| p.create_revision).unwrap_or(rev),
                        mod_revision: rev,
                        version: prev.as_ref().map(|p| p.version).unwrap_or(0) + 1,
                        lease: *lease,
                    };
                    state.insert(key.clone(), kv.clone());
                    events.push(Event {
                        kind: EventKind::Put,
                        kv,
                        prev_kv: prev.clone(),
                    });
                    results.push(OpResult::Put(prev));
                }
                Op::Delete(r) => {
                    let gone = Self::select(&state, r);
                    for kv in &gone {
                        state.remove(&kv.key);
                        events.push(Self::delete_event(kv, rev));
                    }
                    results.push(OpResult::Delete(gone));
                }
            }
        }
        if !events.is_empty() {
            self.push(state, events);
        }
        Ok(TxnResponse {
            succeeded,
            revision: self.revision(),
            results,
        })
    }

    fn delete_event(kv: &KeyValue, rev: Revision) -> Event {
        Event {
            kind: EventKind::Delete,
            kv: KeyValue {
                key: kv.key.clone(),
                value: Bytes::new(),
                create_revision: 0,
                mod_revision: rev,
                version: 0,
                lease: 0,
            },
            prev_kv: Some(kv.clone()),
        }
    }

    fn push(&mut self, state: BTreeMap<Bytes, KeyValue>, events: Vec<Event>) {
        let rev = self.revision() + 1;
        self.events.extend(events.into_iter().map(|e| (rev, e)));
        self.states.push(state);
    }

    fn grant(&mut self, id: LeaseId, ttl: Duration, now: Instant) -> Result<LeaseId, StoreError> {
        let id = if id == 0 { self.next_lease } else { id };
        if self.leases.contains_key(&id) {
            return Err(StoreError::LeaseExists(id));
        }
        self.next_lease = self.next_lease.max(id + 1);
        self.leases.insert(id, (ttl, now + ttl));
        Ok(id)
    }

    fn keep_alive(&mut self, id: LeaseId, now: Instant) -> Result<Duration, StoreError> {
        match self.leases.get_mut(&id) {
            Some((ttl, deadline)) if *deadline > now => {
                *deadline = now + *ttl;
                Ok(*ttl)
            }
            _ => Err(StoreError::LeaseNotFound(id)),
        }
    }

    fn revoke(&mut self, id: LeaseId) -> Result<Revision, StoreError> {
        self.leases
            .remove(&id)
            .ok_or(StoreError::LeaseNotFound(id))?;
        let gone: Vec<KeyValue> = self
            .state()
            .values()
            .filter(|kv| kv.lease == id)
            .cloned()
            .collect();
        if !gone.is_empty() {
            let rev = self.revision() + 1;
            let mut state = self.state().clone();
            let mut events = vec![];
            for kv in &gone {
                state.remove(&kv.key);
                events.push(Self::delete_event(kv, rev));
            }
            self.push(state, events);
        }
        Ok(self.revision())
    }

    fn expire(&mut self, now: Instant) -> Vec<LeaseId> {
        let mut due: Vec<(Instant, LeaseId)> = self
            .leases
            .iter()
            .filter(|(_, l)| l.1 <= now)
            .map(|(id, l)| (l.1, *id))
            .collect();
        due.sort();
        for (_, id) in &due {
            self.revoke(*id).unwrap();
        }
        due.into_iter().map(|(_, id)| id).collect()
    }

    fn compact(&mut self, rev: Revision) -> Result<(), StoreError> {
        if rev > self.revision() {
            return Err(StoreError::FutureRevision {
                requested: rev,
                current: self.revision(),
            });
        }
        if rev <= self.compact {
            return Err(StoreError::Compacted {
                compact_revision: self.compact,
            });
        }
        self.compact = rev;
        Ok(())
    }

    fn watch(&mut self, range: KeyRange, start: Revision) -> Result<usize, StoreError> {
        let first = if start <= 0 {
            self.revision() + 1
        } else if start <= self.compact {
            return Err(StoreError::Compacted {
                compact_revision: self.compact,
            });
        } else {
            start
        };
        self.watches.push(RefWatch {
            range,
            first,
            next: first,
            live: true,
            compacted: false,
            cancelled: false,
            received: vec![],
        });
        Ok(self.watches.len() - 1)
    }

    fn poll(&mut self, i: usize) -> Option<Result<WatchBatch, StoreError>> {
        let revision = self.revision();
        let compact = self.compact;
        let w = &mut self.watches[i];
        if !w.live {
            return None;
        }
        if w.next <= compact {
            w.live = false;
            w.compacted = true;
            return Some(Err(StoreError::Compacted {
                compact_revision: compact,
            }));
        }
        if w.next > revision {
            return None;
        }
        let events: Vec<Event> = self
            .events
            .iter()
            .filter(|(rev, e)| *rev >= w.next && *rev <= revision && w.range.contains(&e.kv.key))
            .map(|(_, e)| e.clone())
            .collect();
        w.next = revision + 1;
        w.received.extend(events.iter().cloned());
        if events.is_empty() {
            None
        } else {
            Some(Ok(WatchBatch { events, revision }))
        }
    }
}

/// Runs `actions` on a `MemStore` and the reference, checking they agree
/// at every step, then checks watches, replay and snapshot restore.
fn run(actions: Vec<Action>) {
    let mut store = MemStore::new();
    let mut reference = Reference::new();
    let mut now = Instant::ZERO;
    let mut log: Vec<Record> = vec![];
    let mut snapshot: Option<(Snapshot, usize)> = None;
    let mut watch_ids: Vec<WatchId> = vec![];

    for action in actions {
        match action {
            Action::Txn(txn) => {
                let before = store.revision();
                let got = store.txn(&txn);
                assert_eq!(got, reference.txn(&txn), "txn {txn:?}");
                if store.revision() != before {
                    log.push(Record::Txn(txn));
                }
            }
            Action::Grant { id, ttl_secs } => {
                let ttl = Duration::from_secs(ttl_secs);
                let got = store.lease_grant(id, ttl, now);
                assert_eq!(got, reference.grant(id, ttl, now));
                if let Ok(id) = got {
                    log.push(Record::LeaseGrant { id, ttl });
                }
            }
            Action::KeepAlive(id) => {
                assert_eq!(
                    store.lease_keep_alive(id, now),
                    reference.keep_alive(id, now)
                );
            }
            Action::Revoke(id) => {
                let got = store.lease_revoke(id);
                assert_eq!(got, reference.revoke(id));
                if got.is_ok() {
                    log.push(Record::LeaseRevoke(id));
                }
            }
            Action::Advance(secs) => {
                now = now + Duration::from_secs(secs);
                let revoked = store.handle_timeout(now);
                assert_eq!(revoked, reference.expire(now));
                log.extend(revoked.into_iter().map(Record::LeaseRevoke));
                assert!(store.poll_timeout().is_none_or(|t| t > now));
            }
            Action::Compact(back) => {
                let rev = store.revision() - back;
                let got = store.compact(rev);
                assert_eq!(got, reference.compact(rev));
                if got.is_ok() {
                    log.push(Record::Compact(rev));
                }
            }
            Action::Watch { range, start } => {
                let got = store.watch(range.clone(), start);
                match reference.watch(range, start) {
                    Ok(i) => {
                        assert_eq!(i, watch_ids.len());
                        watch_ids.push(got.unwrap());
                    }
                    Err(e) => assert_eq!(got, Err(e)),
                }
            }
            Action::Poll(i) if !watch_ids.is_empty() => {
                let i = i % watch_ids.len();
                assert_eq!(
                    store.poll_watch(watch_ids[i]),
                    reference.poll(i),
                    "watch {i}"
                );
            }
            Action::Cancel(i) if !watch_ids.is_empty() => {
                let i = i % watch_ids.len();
                let w = &mut reference.watches[i];
                assert_eq!(store.cancel_watch(watch_ids[i]), w.live);
                w.cancelled |= w.live;
                w.live = false;
            }
            Action::Poll(_) | Action::Cancel(_) => {}
            Action::Snapshot => snapshot = Some((store.snapshot(), log.len())),
        }
        store.check_invariants();
        assert_eq!(store.revision(), reference.revision());
        assert_eq!(store.compact_revision(), reference.compact);
        assert_eq!(
            store.range(&KeyRange::Prefix(Bytes::new())),
            reference.state().values().cloned().collect::<Vec<_>>()
        );
        assert_eq!(
            store.leases(),
            reference.leases.keys().copied().collect::<Vec<_>>()
        );
        assert_eq!(
            store.poll_timeout(),
            reference.leases.values().map(|l| l.1).min()
        );
    }

    // Every watch that was not compacted or cancelled received exactly the
    // events of its range from its first revision on, in order, once.
    for (i, id) in watch_ids.iter().enumerate() {
        assert_eq!(store.poll_watch(*id), reference.poll(i));
        let w = &reference.watches[i];
        if w.compacted || w.cancelled {
            continue;
        }
        let expected: Vec<Event> = reference
            .events
            .iter()
            .filter(|(rev, e)| *rev >= w.first && w.range.contains(&e.kv.key))
            .map(|(_, e)| e.clone())
            .collect();
        assert_eq!(w.received, expected, "events of watch {i}");
        // And the last event of each key in a revision is its state then.
        let mut last: BTreeMap<(Revision, Bytes), &Event> = BTreeMap::new();
        for e in &w.received {
            last.insert((e.kv.mod_revision, e.kv.key.clone()), e);
        }
        for ((rev, key), e) in last {
            let state = reference.states[rev as usize].get(&key);
            match e.kind {
                EventKind::Put => assert_eq!(state, Some(&e.kv)),
                EventKind::Delete => assert_eq!(state, None),
            }
        }
    }

    // Replaying the encoded log reproduces the state exactly.
    let decoded: Vec<Record> = log
        .iter()
        .map(|r| decode_record(&encode_record(r)).unwrap())
        .collect();
    assert_eq!(decoded, log);
    let mut replayed = MemStore::new();
    for r in &decoded {
        replayed.apply(r, now).unwrap();
    }
    replayed.check_invariants();
    assert_eq!(replayed.snapshot(), store.snapshot());

    // Restoring a snapshot and replaying the rest too, but for history.
    let (snap, at) = snapshot.unwrap_or_else(|| (MemStore::new().snapshot(), 0));
    let snap = decode_snapshot(&encode_snapshot(&snap)).unwrap();
    let mut restored = MemStore::from_snapshot(snap.clone(), now);
    assert_eq!(restored.compact_revision(), snap.revision);
    for r in &decoded[at..] {
        restored.apply(r, now).unwrap();
    }
    restored.check_invariants();
    let mut expected = store.snapshot();
    expected.compact_revision = expected.compact_revision.max(snap.revision);
    assert_eq!(restored.snapshot(), expected);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn matches_reference(actions in prop::collection::vec(action(), 1..80)) {
        run(actions);
    }
}
