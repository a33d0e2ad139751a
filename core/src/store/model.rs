//! [`MemStore`]: the MVCC key-value store with etcd v3 semantics, as a pure
//! machine.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use bytes::Bytes;

use super::types::{
    Compare, CompareTarget, Event, EventKind, KeyRange, KeyValue, LeaseId, Op, OpResult, Revision,
    StoreError, Txn, TxnResponse,
};
use crate::ports::WatchBatch;
use crate::time::Instant;

/// Identifies one watch of a [`MemStore`]. Never reused by the same store.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WatchId(u64);

impl WatchId {
    /// The raw number of this watch (unique within its store).
    pub fn get(self) -> u64 {
        self.0
    }
}

/// What [`MemStore::lease_time_to_live`] reports about a lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseInfo {
    /// The lease.
    pub id: LeaseId,
    /// The TTL it was granted with.
    pub ttl: Duration,
    /// Time left before it expires (zero once its deadline has passed).
    pub remaining: Duration,
    /// The keys attached to it, in key order.
    pub keys: Vec<Bytes>,
}

/// Watch history dropped by [`MemStore::compact_detached`]: the events of
/// the compacted revisions, freed when this value is dropped.
#[derive(Debug, Default)]
pub struct CompactedHistory(Vec<(Revision, Vec<Event>)>);

impl CompactedHistory {
    /// Number of revisions whose events this holds.
    pub fn revisions(&self) -> usize {
        self.0.len()
    }
}

/// One lease: its TTL, its deadline, and the keys attached to it.
#[derive(Clone, Debug)]
pub(super) struct Lease {
    pub(super) ttl: Duration,
    pub(super) deadline: Instant,
    pub(super) keys: BTreeSet<Bytes>,
}

/// One watch: what it looks at and the next revision it has not seen.
#[derive(Clone, Debug)]
struct Watcher {
    range: KeyRange,
    /// The lowest revision whose events this watcher has not received.
    next: Revision,
}

/// An MVCC key-value store with the etcd v3 semantics the project relies
/// on (revisions, compare-and-swap transactions, prefix ranges and watches,
/// leases, compaction), as a pure, deterministic machine.
///
/// It is the engine of the durable embedded store and the simulated etcd of
/// the simulator, so both exercise this one model.
///
/// # Driving contract
///
/// `MemStore` does no I/O and reads no clock: its owner drives it.
///
/// - **Inputs (mutators)**: [`txn`](Self::txn), [`lease_grant`](Self::lease_grant),
///   [`lease_keep_alive`](Self::lease_keep_alive),
///   [`lease_revoke`](Self::lease_revoke), [`compact`](Self::compact),
///   [`watch`](Self::watch), [`cancel_watch`](Self::cancel_watch), and
///   [`handle_timeout`](Self::handle_timeout), which expires leases.
/// - **Outputs**: [`poll_watch`](Self::poll_watch) (pending events of one
///   watch) and [`poll_timeout`](Self::poll_timeout) (when the owner must
///   next call `handle_timeout`). Queries ([`range`](Self::range),
///   [`revision`](Self::revision), …) never change anything.
///
/// Time is a [`crate::time::Instant`] passed in by the owner. It must be
/// monotonic: every call must pass an instant no earlier than the previous
/// one. The owner should call `handle_timeout` at (or soon after) the
/// instant returned by `poll_timeout`, and re-check `poll_timeout` after
/// every input, since granting or keeping a lease alive moves it. Lease
/// expiry happens only in `handle_timeout`: a lease whose deadline has
/// passed still exists (and keys can still be attached to it) until then,
/// but it cannot be kept alive.
///
/// Watches are pull-based: after an input that changed the revision, the
/// owner polls the watches it serves. Events stay available for every
/// revision above [`compact_revision`](Self::compact_revision); nothing
/// trims the history but [`compact`](Self::compact), so a long-lived owner
/// must compact.
///
/// For persistence, every state-changing call can be logged as a
/// [`Record`](super::Record) and replayed with [`apply`](Self::apply); see
/// [`Record`](super::Record) for which calls log what.
#[derive(Clone, Debug)]
pub struct MemStore {
    pub(super) kvs: BTreeMap<Bytes, KeyValue>,
    pub(super) revision: Revision,
    pub(super) compact_revision: Revision,
    /// Events of every writing revision above `compact_revision`, in
    /// revision order.
    history: VecDeque<(Revision, Vec<Event>)>,
    pub(super) leases: BTreeMap<LeaseId, Lease>,
    deadlines: BTreeSet<(Instant, LeaseId)>,
    pub(super) next_lease_id: LeaseId,
    watchers: BTreeMap<WatchId, Watcher>,
    next_watch_id: u64,
}

impl Default for MemStore {
    fn default() -> Self {
        Self::new()
    }
}

/// Iterates the keys of `range` in `kvs`, in key order.
fn range_iter<'a>(
    kvs: &'a BTreeMap<Bytes, KeyValue>,
    range: &'a KeyRange,
) -> Box<dyn Iterator<Item = &'a KeyValue> + 'a> {
    match range {
        KeyRange::Key(k) => Box::new(kvs.get(k).into_iter()),
        KeyRange::Prefix(p) => Box::new(
            kvs.range::<[u8], _>((
                std::ops::Bound::Included(p.as_ref()),
                std::ops::Bound::Unbounded,
            ))
            .take_while(move |(k, _)| k.starts_with(p))
            .map(|(_, v)| v),
        ),
    }
}

/// Whether `compare` holds against `kv` (`None`: the key does not exist).
fn compare_holds(compare: &Compare, kv: Option<&KeyValue>) -> bool {
    match &compare.target {
        CompareTarget::Value(v) => match kv {
            Some(kv) => compare.op.holds(kv.value.as_ref(), v.as_ref()),
            None => false,
        },
        CompareTarget::CreateRevision(r) => {
            compare.op.holds(&kv.map_or(0, |kv| kv.create_revision), r)
        }
        CompareTarget::ModRevision(r) => compare.op.holds(&kv.map_or(0, |kv| kv.mod_revision), r),
        CompareTarget::Version(v) => compare.op.holds(&kv.map_or(0, |kv| kv.version), v),
    }
}

impl MemStore {
    /// An empty store at revision 1, with no history compacted.
    pub fn new() -> Self {
        MemStore {
            kvs: BTreeMap::new(),
            revision: 1,
            compact_revision: 0,
            history: VecDeque::new(),
            leases: BTreeMap::new(),
            deadlines: BTreeSet::new(),
            next_lease_id: 1,
            watchers: BTreeMap::new(),
            next_watch_id: 1,
        }
    }

    /// Rebuilds a store from its parts (used by snapshot restore). History
    /// is empty and compacted up to `revision`.
    pub(super) fn from_parts(
        kvs: BTreeMap<Bytes, KeyValue>,
        revision: Revision,
        leases: BTreeMap<LeaseId, Lease>,
        next_lease_id: LeaseId,
    ) -> Self {
        let deadlines = leases.iter().map(|(id, l)| (l.deadline, *id)).collect();
        MemStore {
            kvs,
            revision,
            compact_revision: revision,
            history: VecDeque::new(),
            leases,
            deadlines,
            next_lease_id,
            watchers: BTreeMap::new(),
            next_watch_id: 1,
        }
    }

    /// The current revision: 1 for an empty store, plus one per writing
    /// transaction or lease revocation that deleted keys.
    pub fn revision(&self) -> Revision {
        self.revision
    }

    /// The revision up to which history has been compacted (0: none).
    /// Watches can start at `compact_revision() + 1` at the earliest.
    pub fn compact_revision(&self) -> Revision {
        self.compact_revision
    }

    /// The keys of `range` in the current state, in key order.
    pub fn range(&self, range: &KeyRange) -> Vec<KeyValue> {
        match range {
            // The common read-for-update of one record: no boxed iterator.
            KeyRange::Key(k) => self.kvs.get(k).cloned().into_iter().collect(),
            KeyRange::Prefix(_) => range_iter(&self.kvs, range).cloned().collect(),
        }
    }

    /// One key in the current state.
    pub fn get(&self, key: &[u8]) -> Option<&KeyValue> {
        self.kvs.get(key)
    }

    /// Number of keys in the current state.
    pub fn len(&self) -> usize {
        self.kvs.len()
    }

    /// Whether the store holds no key.
    pub fn is_empty(&self) -> bool {
        self.kvs.is_empty()
    }

    /// Runs a transaction: evaluates its compares against the current
    /// state, then runs `success` or `failure` in order. Every write of the
    /// transaction commits at `revision() + 1`; a transaction that writes
    /// nothing (only ranges, or deletes of absent keys) leaves the revision
    /// unchanged.
    ///
    /// A put naming a lease that does not exist fails the whole
    /// transaction with [`StoreError::LeaseNotFound`] and changes nothing.
    pub fn txn(&mut self, txn: &Txn) -> Result<TxnResponse, StoreError> {
        let succeeded = txn
            .compares
            .iter()
            .all(|c| compare_holds(c, self.kvs.get(&c.key)));
        let ops = if succeeded {
            &txn.success
        } else {
            &txn.failure
        };
        // Leases do not change within a transaction: check them all first,
        // so that a failing transaction changes nothing.
        for op in ops {
            if let Op::Put { lease, .. } = op
                && *lease != 0
                && !self.leases.contains_key(lease)
            {
                return Err(StoreError::LeaseNotFound(*lease));
            }
        }
        let rev = self.revision + 1;
        let mut events = Vec::new();
        let mut results = Vec::with_capacity(ops.len());
        for op in ops {
            let result = match op {
                Op::Range(range) => OpResult::Range(self.range(range)),
                Op::Put { key, value, lease } => {
                    OpResult::Put(self.put(rev, key, value, *lease, &mut events))
                }
                Op::Delete(range) => OpResult::Delete(self.delete(rev, range, &mut events)),
            };
            results.push(result);
        }
        if !events.is_empty() {
            self.commit(rev, events);
        }
        Ok(TxnResponse {
            succeeded,
            revision: self.revision,
            results,
        })
    }

    /// Writes one key at revision `rev`; returns its previous value.
    fn put(
        &mut self,
        rev: Revision,
        key: &Bytes,
        value: &Bytes,
        lease: LeaseId,
        events: &mut Vec<Event>,
    ) -> Option<KeyValue> {
        let new = |prev: Option<&KeyValue>| KeyValue {
            key: key.clone(),
            value: value.clone(),
            create_revision: prev.map_or(rev, |p| p.create_revision),
            mod_revision: rev,
            version: prev.map_or(1, |p| p.version + 1),
            lease,
        };
        // One lookup: the key's slot is overwritten in place if it exists.
        let (kv, prev) = match self.kvs.get_mut(key) {
            Some(slot) => {
                let kv = new(Some(slot));
                (kv.clone(), Some(std::mem::replace(slot, kv)))
            }
            None => {
                let kv = new(None);
                self.kvs.insert(key.clone(), kv.clone());
                (kv, None)
            }
        };
        if let Some(p) = &prev
            && p.lease != 0
            && p.lease != lease
        {
            self.detach(p.lease, key);
        }
        if lease != 0
            && let Some(l) = self.leases.get_mut(&lease)
        {
            l.keys.insert(key.clone());
        }
        events.push(Event {
            kind: EventKind::Put,
            kv,
            prev_kv: prev.clone(),
        });
        prev
    }

    /// Deletes every key of `range` at revision `rev`; returns them.
    fn delete(
        &mut self,
        rev: Revision,
        range: &KeyRange,
        events: &mut Vec<Event>,
    ) -> Vec<KeyValue> {
        let deleted = self.range(range);
        for prev in &deleted {
            self.kvs.remove(&prev.key);
            if prev.lease != 0 {
                self.detach(prev.lease, &prev.key);
            }
            events.push(Event {
                kind: EventKind::Delete,
                kv: KeyValue {
                    key: prev.key.clone(),
                    value: Bytes::new(),
                    create_revision: 0,
                    mod_revision: rev,
                    version: 0,
                    lease: 0,
                },
                prev_kv: Some(prev.clone()),
            });
        }
        deleted
    }

    /// Removes `key` from the keys attached to `lease`.
    fn detach(&mut self, lease: LeaseId, key: &[u8]) {
        if let Some(l) = self.leases.get_mut(&lease) {
            l.keys.remove(key);
        }
    }

    /// Makes `rev` the current revision, recording its events.
    fn commit(&mut self, rev: Revision, events: Vec<Event>) {
        debug_assert_eq!(rev, self.revision + 1, "commits are sequential");
        self.revision = rev;
        self.history.push_back((rev, events));
    }

    /// Grants a lease of `ttl` expiring at `now + ttl` unless kept alive.
    /// `id` 0 allocates the next ID (deterministically: one above every
    /// positive ID granted so far); another `id` is used as is, or fails
    /// with [`StoreError::LeaseExists`] if that lease exists.
    pub fn lease_grant(
        &mut self,
        id: LeaseId,
        ttl: Duration,
        now: Instant,
    ) -> Result<LeaseId, StoreError> {
        let id = if id == 0 { self.next_lease_id } else { id };
        if self.leases.contains_key(&id) {
            return Err(StoreError::LeaseExists(id));
        }
        if id > 0 {
            self.next_lease_id = self.next_lease_id.max(id.saturating_add(1));
        }
        let deadline = now + ttl;
        self.leases.insert(
            id,
            Lease {
                ttl,
                deadline,
                keys: BTreeSet::new(),
            },
        );
        self.deadlines.insert((deadline, id));
        Ok(id)
    }

    /// Keeps a lease alive: its deadline becomes `now + ttl`. Returns the
    /// TTL. A lease whose deadline has passed cannot be kept alive
    /// ([`StoreError::LeaseNotFound`]), even before `handle_timeout`
    /// revokes it.
    pub fn lease_keep_alive(&mut self, id: LeaseId, now: Instant) -> Result<Duration, StoreError> {
        let lease = match self.leases.get_mut(&id) {
            Some(l) if l.deadline > now => l,
            _ => return Err(StoreError::LeaseNotFound(id)),
        };
        let old = lease.deadline;
        lease.deadline = now + lease.ttl;
        let (new, ttl) = (lease.deadline, lease.ttl);
        self.deadlines.remove(&(old, id));
        self.deadlines.insert((new, id));
        Ok(ttl)
    }

    /// Revokes a lease, deleting every key attached to it in one revision
    /// (if any is attached). Returns the revision after the revocation.
    pub fn lease_revoke(&mut self, id: LeaseId) -> Result<Revision, StoreError> {
        let lease = self
            .leases
            .remove(&id)
            .ok_or(StoreError::LeaseNotFound(id))?;
        self.deadlines.remove(&(lease.deadline, id));
        if !lease.keys.is_empty() {
            let rev = self.revision + 1;
            let mut events = Vec::with_capacity(lease.keys.len());
            for key in &lease.keys {
                // The keys of a lease are attached to it: deleting them
                // cannot touch another lease.
                self.delete(rev, &KeyRange::Key(key.clone()), &mut events);
            }
            self.commit(rev, events);
        }
        Ok(self.revision)
    }

    /// What is known about a lease at `now`.
    pub fn lease_time_to_live(&self, id: LeaseId, now: Instant) -> Result<LeaseInfo, StoreError> {
        let lease = self.leases.get(&id).ok_or(StoreError::LeaseNotFound(id))?;
        Ok(LeaseInfo {
            id,
            ttl: lease.ttl,
            remaining: lease.deadline.saturating_duration_since(now),
            keys: lease.keys.iter().cloned().collect(),
        })
    }

    /// The IDs of the existing leases, in order.
    pub fn leases(&self) -> Vec<LeaseId> {
        self.leases.keys().copied().collect()
    }

    /// Input: time has reached `now`. Revokes every lease whose deadline is
    /// at or before `now`, in deadline order (then ID order), each in its
    /// own revision if it had keys. Returns the revoked IDs in that order.
    pub fn handle_timeout(&mut self, now: Instant) -> Vec<LeaseId> {
        let mut revoked = Vec::new();
        while let Some(&(deadline, id)) = self.deadlines.first() {
            if deadline > now {
                break;
            }
            // The lease exists: `deadlines` mirrors `leases`.
            let _ = self.lease_revoke(id);
            revoked.push(id);
        }
        revoked
    }

    /// Output: the earliest lease deadline, when `handle_timeout` must next
    /// be called. `None` when there is no lease.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.deadlines.first().map(|(deadline, _)| *deadline)
    }

    /// Starts a watch of `range` from `start_revision` on (inclusive).
    /// `start_revision` 0 (or negative) means "changes after the current
    /// revision". A start revision at or below the compact revision fails
    /// with [`StoreError::Compacted`]; one in the future is allowed, and
    /// the watch then receives no event below it.
    pub fn watch(
        &mut self,
        range: KeyRange,
        start_revision: Revision,
    ) -> Result<WatchId, StoreError> {
        let next = if start_revision <= 0 {
            self.revision + 1
        } else if start_revision <= self.compact_revision {
            return Err(StoreError::Compacted {
                compact_revision: self.compact_revision,
            });
        } else {
            start_revision
        };
        let id = WatchId(self.next_watch_id);
        self.next_watch_id += 1;
        self.watchers.insert(id, Watcher { range, next });
        Ok(id)
    }

    /// Output: every pending event of a watch, up to the current revision.
    /// See [`poll_watch_up_to`](Self::poll_watch_up_to).
    pub fn poll_watch(&mut self, id: WatchId) -> Option<Result<WatchBatch, StoreError>> {
        self.poll_watch_up_to(id, self.revision)
    }

    /// Output: every pending event of a watch with a revision at or below
    /// `max_revision` (capped at the current revision), in revision order,
    /// as one batch; the watch's cursor moves past `max_revision`. `None`
    /// when nothing is pending (or the watch does not exist).
    ///
    /// If compaction removed revisions the watch had not yet received, it
    /// yields `Err(Compacted)` once and the watch is removed. The batch's
    /// `revision` is the revision up to which the watch is now current.
    /// A durable owner passes its durable revision as `max_revision`.
    pub fn poll_watch_up_to(
        &mut self,
        id: WatchId,
        max_revision: Revision,
    ) -> Option<Result<WatchBatch, StoreError>> {
        let watcher = self.watchers.get_mut(&id)?;
        if watcher.next <= self.compact_revision {
            self.watchers.remove(&id);
            return Some(Err(StoreError::Compacted {
                compact_revision: self.compact_revision,
            }));
        }
        let upto = max_revision.min(self.revision);
        if watcher.next > upto {
            return None;
        }
        let start = self.history.partition_point(|(rev, _)| *rev < watcher.next);
        let events: Vec<Event> = self
            .history
            .range(start..)
            .take_while(|(rev, _)| *rev <= upto)
            .flat_map(|(_, events)| events.iter())
            .filter(|e| watcher.range.contains(&e.kv.key))
            .cloned()
            .collect();
        watcher.next = upto + 1;
        if events.is_empty() {
            None
        } else {
            Some(Ok(WatchBatch {
                events,
                revision: upto,
            }))
        }
    }

    /// Ends a watch. Returns whether it existed.
    pub fn cancel_watch(&mut self, id: WatchId) -> bool {
        self.watchers.remove(&id).is_some()
    }

    /// Number of active watches.
    pub fn watch_count(&self) -> usize {
        self.watchers.len()
    }

    /// Drops the history of every revision at or below `revision`. Watches
    /// that had not received those revisions get `Err(Compacted)` on their
    /// next poll. Fails with [`StoreError::FutureRevision`] above the
    /// current revision and [`StoreError::Compacted`] at or below the
    /// current compact revision.
    pub fn compact(&mut self, revision: Revision) -> Result<(), StoreError> {
        self.compact_detached(revision).map(drop)
    }

    /// [`compact`](Self::compact), returning the dropped history instead
    /// of freeing it: an owner that compacts under a lock frees it after
    /// releasing the lock.
    pub fn compact_detached(&mut self, revision: Revision) -> Result<CompactedHistory, StoreError> {
        if revision > self.revision {
            return Err(StoreError::FutureRevision {
                requested: revision,
                current: self.revision,
            });
        }
        if revision <= self.compact_revision {
            return Err(StoreError::Compacted {
                compact_revision: self.compact_revision,
            });
        }
        // The history is in revision order.
        let end = self.history.partition_point(|(rev, _)| *rev <= revision);
        let removed = self.history.drain(..end).collect();
        self.compact_revision = revision;
        Ok(CompactedHistory(removed))
    }

    /// Checks internal invariants (tests only): lease key sets and
    /// deadlines mirror the keys and leases.
    #[cfg(test)]
    pub(super) fn check_invariants(&self) {
        for (id, lease) in &self.leases {
            let attached: BTreeSet<Bytes> = self
                .kvs
                .values()
                .filter(|kv| kv.lease == *id)
                .map(|kv| kv.key.clone())
                .collect();
            assert_eq!(attached, lease.keys, "keys of lease {id}");
            assert!(self.deadlines.contains(&(lease.deadline, *id)));
        }
        assert_eq!(self.deadlines.len(), self.leases.len());
        for kv in self.kvs.values() {
            assert!(
                kv.lease == 0 || self.leases.contains_key(&kv.lease),
                "dangling lease"
            );
        }
        assert!(
            self.history
                .iter()
                .all(|(rev, _)| *rev > self.compact_revision)
        );
    }
}
