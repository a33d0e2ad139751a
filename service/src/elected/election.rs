//! Leader election over any [`KvStore`], the recipe of etcd's
//! `concurrency` package: every candidate creates `<prefix><lease id in
//! hex>` attached to its lease; the leader is the candidate whose key has
//! the lowest create revision. Plus the fence that makes a leader's writes
//! commit only while it leads.
//!
//! Written once over the store port, so etcd, the embedded store and the
//! simulator's store all run the same campaign and observation.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};

use metropolis_core::leadership::{ElectionKey, Fence, FenceCheck};
use metropolis_core::ports::{KvStore, WatchBatch};
use metropolis_core::store::{
    CmpOp, Compare, CompareTarget, EventKind, KeyRange, KeyValue, LeaseId, Op, OpResult, Revision,
    StoreError, Txn, TxnResponse,
};

/// The current leader: its election key and value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leader {
    /// The leader's key and the revision it was created at (the revision
    /// the leader won at, which its fence compares).
    pub key: ElectionKey,
    /// The election value (an encoded `LeaderElectionValue`).
    pub value: Bytes,
}

/// What [`Election::observe`] reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Observation {
    /// This candidate leads now (newly, or it changed its value).
    Leader(Leader),
    /// The leader's key is gone (resigned, revoked or expired); if another
    /// candidate leads now, a [`Observation::Leader`] follows at once.
    Gone(ElectionKey),
}

/// A fenced transaction's outcome ([`Election::fenced_txn`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FencedResponse {
    /// Whether the fence held. [`FenceCheck::Lost`]: nothing of the
    /// success branch committed; the writer no longer leads.
    pub fence: FenceCheck,
    /// The transaction's response, without the fence's own read.
    pub response: TxnResponse,
}

/// An election under one key prefix of a store.
///
/// Candidates campaign with a lease of their own (the
/// [`Leases`](metropolis_core::ports::Leases) port); a candidate's key disappears
/// with its lease, so a leader that stops renewing (crashed, paused,
/// partitioned) loses its key after the TTL, and the next oldest
/// candidate leads.
#[derive(Clone)]
pub struct Election {
    store: Arc<dyn KvStore>,
    prefix: Bytes,
}

impl std::fmt::Debug for Election {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Election")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl Election {
    /// The election under `prefix` of `store`; a `/` is appended if it
    /// does not end with one. Nothing else should write under the prefix.
    pub fn new(store: Arc<dyn KvStore>, prefix: impl Into<Bytes>) -> Election {
        Election {
            store,
            prefix: election_prefix(prefix.into()),
        }
    }

    /// The election's prefix (ends with `/`).
    pub fn prefix(&self) -> &Bytes {
        &self.prefix
    }

    /// The key a candidate with `lease` campaigns with:
    /// `<prefix><lease id in lowercase hex>`.
    pub fn candidate_key(&self, lease: LeaseId) -> Bytes {
        candidate_key(&self.prefix, lease)
    }

    /// Campaigns with `lease`: creates this candidate's key with `value`
    /// (or, if it exists from an earlier campaign with the same lease,
    /// sets its value), then waits until every older candidate's key is
    /// gone. Resolves with the key and its create revision once this
    /// candidate leads.
    ///
    /// Fails with [`StoreError::LeaseNotFound`] if the lease is gone (also
    /// when it expires while waiting), and `Unavailable` if the store
    /// fails. Dropping the future stops waiting but leaves the key: revoke
    /// the lease (or [`Election::resign`]) to withdraw.
    pub fn campaign(
        &self,
        lease: LeaseId,
        value: Bytes,
    ) -> BoxFuture<'static, Result<ElectionKey, StoreError>> {
        campaign(self.store.clone(), self.prefix.clone(), lease, value).boxed()
    }

    /// The current leader, if any, and the revision it was read at.
    pub fn leader(&self) -> BoxFuture<'static, Result<(Option<Leader>, Revision), StoreError>> {
        let store = self.store.clone();
        let prefix = self.prefix.clone();
        async move {
            let (candidates, revision) = read_candidates(store.as_ref(), &prefix).await?;
            Ok((leader_of(&candidates), revision))
        }
        .boxed()
    }

    /// Follows the leader: first the current one (nothing if there is
    /// none), then every change, in order. Survives compaction (it reads
    /// the candidates afresh and reports the difference); ends with
    /// `Unavailable` if the store fails (observe again to resume: the
    /// first report is then the leader at that time).
    pub fn observe(&self) -> BoxStream<'static, Result<Observation, StoreError>> {
        let state = Observing {
            store: self.store.clone(),
            prefix: self.prefix.clone(),
            reported: None,
            candidates: BTreeMap::new(),
            watch: None,
            queue: VecDeque::new(),
            failed: false,
        };
        futures::stream::unfold(state, |mut state| async move {
            let next = state.next().await?;
            Some((next, state))
        })
        .boxed()
    }

    /// Resigns: deletes `key` if it still has its create revision.
    /// Resolves with whether it did. The lease lives on (revoke it to end
    /// it); a later campaign with it creates a new key, at a new revision.
    pub fn resign(&self, key: &ElectionKey) -> BoxFuture<'static, Result<bool, StoreError>> {
        let txn = Txn {
            compares: vec![key.unchanged()],
            success: vec![Op::Delete(KeyRange::Key(key.key.clone()))],
            failure: vec![],
        };
        self.store.txn(txn).map(|r| Ok(r?.succeeded)).boxed()
    }

    /// Runs `txn` fenced by `key` (see [`fence`]) and reports whether the
    /// fence held.
    pub fn fenced_txn(
        &self,
        key: &ElectionKey,
        txn: Txn,
    ) -> BoxFuture<'static, Result<FencedResponse, StoreError>> {
        let key = key.clone();
        let sent = self.store.txn(fence(&key, txn));
        async move {
            let mut response = sent.await?;
            let fence = fence_check(&key, &response);
            if !response.succeeded {
                // The fence's own read, appended to the failure branch.
                response.results.pop();
            }
            Ok(FencedResponse { fence, response })
        }
        .boxed()
    }
}

/// `prefix` with a `/` appended if it does not end with one: the prefix
/// [`Election::new`] campaigns under.
pub fn election_prefix(prefix: Bytes) -> Bytes {
    if prefix.ends_with(b"/") {
        return prefix;
    }
    let mut p = BytesMut::with_capacity(prefix.len() + 1);
    p.put_slice(&prefix);
    p.put_u8(b'/');
    p.freeze()
}

/// `<prefix><lease in hex>`.
fn candidate_key(prefix: &Bytes, lease: LeaseId) -> Bytes {
    let mut key = BytesMut::with_capacity(prefix.len() + 16);
    key.put_slice(prefix);
    key.put_slice(format!("{lease:x}").as_bytes());
    key.freeze()
}

/// `txn`, fenced by the election key `key`: [`Fence::guard`] for the key
/// the election returns.
pub fn fence(key: &ElectionKey, txn: Txn) -> Txn {
    Fence::election(key.clone()).guard(txn)
}

/// Whether the fence of a transaction made by [`fence`] held:
/// [`Fence::check`].
pub fn fence_check(key: &ElectionKey, response: &TxnResponse) -> FenceCheck {
    Fence::election(key.clone()).check(response)
}

/// The candidates (keys under `prefix`) by key, and the revision read at.
async fn read_candidates(
    store: &dyn KvStore,
    prefix: &Bytes,
) -> Result<(BTreeMap<Bytes, KeyValue>, Revision), StoreError> {
    let mut response = store
        .txn(Txn {
            success: vec![Op::Range(KeyRange::Prefix(prefix.clone()))],
            ..Txn::default()
        })
        .await?;
    let Some(OpResult::Range(kvs)) = response.results.pop() else {
        return Err(StoreError::Unavailable(
            "the store answered a range read without its result".into(),
        ));
    };
    Ok((
        kvs.into_iter().map(|kv| (kv.key.clone(), kv)).collect(),
        response.revision,
    ))
}

/// The candidate with the lowest create revision.
fn leader_of(candidates: &BTreeMap<Bytes, KeyValue>) -> Option<Leader> {
    candidates
        .values()
        .min_by_key(|kv| kv.create_revision)
        .map(|kv| Leader {
            key: ElectionKey {
                key: kv.key.clone(),
                create_revision: kv.create_revision,
            },
            value: kv.value.clone(),
        })
}

/// `batch` applied to the candidates.
fn apply(candidates: &mut BTreeMap<Bytes, KeyValue>, batch: WatchBatch) {
    for e in batch.events {
        match e.kind {
            EventKind::Put => {
                candidates.insert(e.kv.key.clone(), e.kv);
            }
            EventKind::Delete => {
                candidates.remove(&e.kv.key);
            }
        }
    }
}

/// The watch of the candidates from `revision + 1`.
fn watch_after(
    store: &dyn KvStore,
    prefix: &Bytes,
    revision: Revision,
) -> BoxStream<'static, Result<WatchBatch, StoreError>> {
    store.watch(KeyRange::Prefix(prefix.clone()), revision + 1)
}

/// The next batch of a candidates' watch; a watch that ends is a failure.
async fn next_batch(
    watch: &mut BoxStream<'static, Result<WatchBatch, StoreError>>,
) -> Result<WatchBatch, StoreError> {
    watch
        .next()
        .await
        .unwrap_or_else(|| Err(StoreError::Unavailable("the election's watch ended".into())))
}

async fn campaign(
    store: Arc<dyn KvStore>,
    prefix: Bytes,
    lease: LeaseId,
    value: Bytes,
) -> Result<ElectionKey, StoreError> {
    let key = candidate_key(&prefix, lease);
    let put = Op::Put {
        key: key.clone(),
        value: value.clone(),
        lease,
    };
    let created = store
        .txn(Txn {
            compares: vec![Compare {
                key: key.clone(),
                op: CmpOp::Equal,
                target: CompareTarget::CreateRevision(0),
            }],
            success: vec![put.clone()],
            failure: vec![Op::Range(KeyRange::Key(key.clone()))],
        })
        .await?;
    let mine = if created.succeeded {
        ElectionKey {
            key: key.clone(),
            create_revision: created.revision,
        }
    } else {
        let existing = match created.results.first() {
            Some(OpResult::Range(kvs)) => kvs.first().cloned(),
            _ => None,
        };
        let Some(existing) = existing else {
            // Deleted between the compare and the read: cannot be, the
            // read runs in the same transaction. Treat as lost.
            return Err(StoreError::LeaseNotFound(lease));
        };
        let mine = ElectionKey {
            key: key.clone(),
            create_revision: existing.create_revision,
        };
        if existing.value != value || existing.lease != lease {
            let updated = store
                .txn(Txn {
                    compares: vec![mine.unchanged()],
                    success: vec![put],
                    failure: vec![],
                })
                .await?;
            if !updated.succeeded {
                return Err(StoreError::LeaseNotFound(lease));
            }
        }
        mine
    };
    wait_for_predecessors(store.as_ref(), &prefix, &mine, lease).await?;
    Ok(mine)
}

/// Waits until no candidate older than `mine` is left.
async fn wait_for_predecessors(
    store: &dyn KvStore,
    prefix: &Bytes,
    mine: &ElectionKey,
    lease: LeaseId,
) -> Result<(), StoreError> {
    'snapshot: loop {
        let (mut candidates, revision) = read_candidates(store, prefix).await?;
        let mut watch = None;
        loop {
            match candidates.get(&mine.key) {
                Some(kv) if kv.create_revision == mine.create_revision => {}
                _ => return Err(StoreError::LeaseNotFound(lease)),
            }
            if !candidates
                .values()
                .any(|kv| kv.create_revision < mine.create_revision)
            {
                return Ok(());
            }
            let w = watch.get_or_insert_with(|| watch_after(store, prefix, revision));
            match next_batch(w).await {
                Ok(batch) => apply(&mut candidates, batch),
                Err(StoreError::Compacted { .. }) => continue 'snapshot,
                Err(e) => return Err(e),
            }
        }
    }
}

/// The state of [`Election::observe`]'s stream.
struct Observing {
    store: Arc<dyn KvStore>,
    prefix: Bytes,
    /// The leader last reported.
    reported: Option<Leader>,
    candidates: BTreeMap<Bytes, KeyValue>,
    /// `None` until the candidates were read (again, after compaction).
    watch: Option<BoxStream<'static, Result<WatchBatch, StoreError>>>,
    /// Observations computed and not yet handed out.
    queue: VecDeque<Observation>,
    failed: bool,
}

impl Observing {
    /// The next report; `None` after a failure was reported.
    async fn next(&mut self) -> Option<Result<Observation, StoreError>> {
        loop {
            if let Some(observation) = self.queue.pop_front() {
                return Some(Ok(observation));
            }
            if self.failed {
                return None;
            }
            if let Err(e) = self.step().await {
                self.failed = true;
                return Some(Err(e));
            }
        }
    }

    /// Reads the candidates (when there is no watch) or waits for the
    /// watch's next batch, and queues what changed about the leader.
    async fn step(&mut self) -> Result<(), StoreError> {
        match &mut self.watch {
            None => {
                let (candidates, revision) =
                    read_candidates(self.store.as_ref(), &self.prefix).await?;
                self.candidates = candidates;
                self.watch = Some(watch_after(self.store.as_ref(), &self.prefix, revision));
            }
            Some(watch) => match next_batch(watch).await {
                // A batch holds whole revisions: the leader is computed
                // between revisions, never in the middle of one.
                Ok(batch) => apply(&mut self.candidates, batch),
                // Compacted: read the candidates afresh; the difference
                // to what was reported is reported.
                Err(StoreError::Compacted { .. }) => {
                    self.watch = None;
                    return Ok(());
                }
                Err(e) => return Err(e),
            },
        }
        let now = leader_of(&self.candidates);
        self.queue.extend(changes(&self.reported, &now));
        self.reported = now;
        Ok(())
    }
}

/// What to report when the leader goes from `before` to `now`.
fn changes(before: &Option<Leader>, now: &Option<Leader>) -> Vec<Observation> {
    let mut out = Vec::new();
    if let Some(b) = before
        && now.as_ref().is_none_or(|n| n.key != b.key)
    {
        out.push(Observation::Gone(b.key.clone()));
    }
    if let Some(n) = now
        && before.as_ref() != Some(n)
    {
        out.push(Observation::Leader(n.clone()));
    }
    out
}
#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn leader(key: &'static [u8], rev: Revision, value: &'static [u8]) -> Leader {
        Leader {
            key: ElectionKey {
                key: Bytes::from_static(key),
                create_revision: rev,
            },
            value: Bytes::from_static(value),
        }
    }

    #[test]
    fn changes_report_gone_before_the_new_leader() {
        let a = leader(b"e/1", 5, b"a");
        let b = leader(b"e/2", 7, b"b");
        assert_eq!(changes(&None, &None), vec![]);
        assert_eq!(
            changes(&None, &Some(a.clone())),
            vec![Observation::Leader(a.clone())]
        );
        assert_eq!(changes(&Some(a.clone()), &Some(a.clone())), vec![]);
        assert_eq!(
            changes(&Some(a.clone()), &Some(b.clone())),
            vec![
                Observation::Gone(a.key.clone()),
                Observation::Leader(b.clone())
            ]
        );
        assert_eq!(
            changes(&Some(a.clone()), &None),
            vec![Observation::Gone(a.key.clone())]
        );
        // Same key, new value: a new report, no gone.
        let a2 = leader(b"e/1", 5, b"a2");
        assert_eq!(
            changes(&Some(a.clone()), &Some(a2.clone())),
            vec![Observation::Leader(a2)]
        );
        // Same key re-created: gone, then the new one.
        let a3 = leader(b"e/1", 9, b"a");
        assert_eq!(
            changes(&Some(a.clone()), &Some(a3.clone())),
            vec![Observation::Gone(a.key), Observation::Leader(a3)]
        );
    }

    #[test]
    fn fence_check_tells_a_lost_fence_from_a_failed_compare() {
        let key = ElectionKey {
            key: Bytes::from_static(b"e/1"),
            create_revision: 5,
        };
        let txn = fence(&key, Txn::default());
        assert_eq!(txn.compares.len(), 1);
        let response = |succeeded, results| TxnResponse {
            succeeded,
            revision: 9,
            results,
        };
        assert_eq!(fence_check(&key, &response(true, vec![])), FenceCheck::Held);
        let held = KeyValue {
            key: key.key.clone(),
            value: Bytes::new(),
            create_revision: 5,
            mod_revision: 5,
            version: 1,
            lease: 1,
        };
        assert_eq!(
            fence_check(
                &key,
                &response(false, vec![OpResult::Range(vec![held.clone()])])
            ),
            FenceCheck::Held
        );
        let recreated = KeyValue {
            create_revision: 8,
            ..held
        };
        assert_eq!(
            fence_check(
                &key,
                &response(false, vec![OpResult::Range(vec![recreated])])
            ),
            FenceCheck::Lost
        );
        assert_eq!(
            fence_check(&key, &response(false, vec![OpResult::Range(vec![])])),
            FenceCheck::Lost
        );
        assert_eq!(
            fence_check(&key, &response(false, vec![])),
            FenceCheck::Lost
        );
    }

    #[test]
    fn candidate_keys_are_hex() {
        assert_eq!(
            candidate_key(&Bytes::from_static(b"p/"), 0x694d_1234),
            Bytes::from_static(b"p/694d1234")
        );
    }
}
