//! Leader election over etcd, the recipe of etcd's `concurrency` package:
//! every candidate creates `<prefix><lease id in hex>` attached to its
//! lease; the leader is the candidate whose key has the lowest create
//! revision. Plus the fence that makes a leader's writes commit only while
//! it leads.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use futures::FutureExt;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use metropolis_core::leadership::{ElectionKey, Fence, FenceCheck};
use metropolis_core::store::{
    CmpOp, Compare, CompareTarget, KeyRange, KeyValue, LeaseId, Op, OpResult, Revision, StoreError,
    Txn, TxnResponse,
};
use tokio::sync::mpsc;

use super::watch::{RawWatch, apply};
use super::{EtcdStore, Inner};

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

/// An election under one key prefix of an [`EtcdStore`].
///
/// Candidates campaign with a lease of their own
/// ([`EtcdStore::lease_grant`], kept alive with
/// [`EtcdStore::lease_keep_alive`]); a candidate's key disappears with its
/// lease, so a leader that stops renewing (crashed, paused, partitioned)
/// loses its key after the TTL, and the next oldest candidate leads.
#[derive(Clone, Debug)]
pub struct Election {
    store: EtcdStore,
    prefix: Bytes,
}

impl Election {
    /// The election under `prefix`; a `/` is appended if it does not end
    /// with one. Nothing else should write under the prefix.
    pub fn new(store: &EtcdStore, prefix: impl Into<Bytes>) -> Election {
        Election {
            store: store.clone(),
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
    /// when it expires while waiting), and `Unavailable` if etcd fails.
    /// Dropping the future stops waiting but leaves the key: revoke the
    /// lease (or [`Election::resign`]) to withdraw.
    pub fn campaign(
        &self,
        lease: LeaseId,
        value: Bytes,
    ) -> BoxFuture<'static, Result<ElectionKey, StoreError>> {
        let inner = self.store.inner.clone();
        let prefix = self.prefix.clone();
        self.store
            .exec
            .run(async move { campaign(inner, prefix, lease, value).await })
    }

    /// The current leader, if any, and the revision it was read at.
    pub fn leader(&self) -> BoxFuture<'static, Result<(Option<Leader>, Revision), StoreError>> {
        let inner = self.store.inner.clone();
        let prefix = self.prefix.clone();
        self.store.exec.run(async move {
            let (candidates, revision) = read_candidates(&inner, &prefix).await?;
            Ok((leader_of(&candidates), revision))
        })
    }

    /// Follows the leader: first the current one (nothing if there is
    /// none), then every change, in order. Survives compaction (it reads
    /// the candidates afresh and reports the difference); ends with
    /// `Unavailable` if etcd fails (observe again to resume: the first
    /// report is then the leader at that time).
    pub fn observe(&self) -> BoxStream<'static, Result<Observation, StoreError>> {
        let inner = self.store.inner.clone();
        let prefix = self.prefix.clone();
        let (tx, rx) = mpsc::channel(16);
        self.store.exec.spawn(async move {
            let result = tokio::select! {
                result = observe(inner, prefix, &tx) => result,
                () = tx.closed() => Ok(()),
            };
            if let Err(e) = result {
                let _ = tx.send(Err(e)).await;
            }
        });
        self.store.exec.stream(rx)
    }

    /// Resigns: deletes `key` if it still has its create revision.
    /// Resolves with whether it did. The lease lives on (revoke it to end
    /// it); a later campaign with it creates a new key, at a new revision.
    pub fn resign(&self, key: &ElectionKey) -> BoxFuture<'static, Result<bool, StoreError>> {
        let txn = Txn {
            compares: vec![fence_compare(key)],
            success: vec![Op::Delete(KeyRange::Key(key.key.clone()))],
            failure: vec![],
        };
        let store = self.store.clone();
        async move { Ok(store.run_txn(txn).await?.succeeded) }.boxed()
    }

    /// Runs `txn` fenced by `key` (see [`fence`]) and reports whether the
    /// fence held.
    pub fn fenced_txn(
        &self,
        key: &ElectionKey,
        txn: Txn,
    ) -> BoxFuture<'static, Result<FencedResponse, StoreError>> {
        let key = key.clone();
        let fenced = fence(&key, txn);
        let store = self.store.clone();
        async move {
            let mut response = store.run_txn(fenced).await?;
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
pub(super) fn election_prefix(prefix: Bytes) -> Bytes {
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

/// The compare "the key's create revision equals `key.create_revision`".
fn fence_compare(key: &ElectionKey) -> Compare {
    Fence::election(key.clone())
        .compare()
        .expect("an election fence has a compare")
}

/// `txn`, fenced by the election key `key`: core's
/// [`Fence::guard`](metropolis_core::leadership::Fence::guard) for the key
/// the election helpers return.
pub fn fence(key: &ElectionKey, txn: Txn) -> Txn {
    Fence::election(key.clone()).guard(txn)
}

/// Whether the fence of a transaction made by [`fence`] held: core's
/// [`Fence::check`](metropolis_core::leadership::Fence::check).
pub fn fence_check(key: &ElectionKey, response: &TxnResponse) -> FenceCheck {
    Fence::election(key.clone()).check(response)
}

/// The candidates (keys under `prefix`) by key, and the revision read at.
async fn read_candidates(
    inner: &Inner,
    prefix: &Bytes,
) -> Result<(BTreeMap<Bytes, KeyValue>, Revision), StoreError> {
    let (kvs, revision) = inner.range(KeyRange::Prefix(prefix.clone())).await?;
    Ok((
        kvs.into_iter().map(|kv| (kv.key.clone(), kv)).collect(),
        revision,
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

async fn campaign(
    inner: Arc<Inner>,
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
    let created = inner
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
            let updated = inner
                .txn(Txn {
                    compares: vec![fence_compare(&mine)],
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
    wait_for_predecessors(&inner, &prefix, &mine, lease).await?;
    Ok(mine)
}

/// Waits until no candidate older than `mine` is left.
async fn wait_for_predecessors(
    inner: &Arc<Inner>,
    prefix: &Bytes,
    mine: &ElectionKey,
    lease: LeaseId,
) -> Result<(), StoreError> {
    'snapshot: loop {
        let (mut candidates, revision) = read_candidates(inner, prefix).await?;
        let mut watch: Option<RawWatch> = None;
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
            let w = match &mut watch {
                Some(w) => w,
                None => watch.insert(
                    RawWatch::open(
                        inner.clone(),
                        KeyRange::Prefix(prefix.clone()),
                        revision + 1,
                    )
                    .await?,
                ),
            };
            match w.next().await {
                Ok(batch) => apply(&mut candidates, batch.events),
                Err(StoreError::Compacted { .. }) => continue 'snapshot,
                Err(e) => return Err(e),
            }
        }
    }
}

async fn observe(
    inner: Arc<Inner>,
    prefix: Bytes,
    tx: &mpsc::Sender<Result<Observation, StoreError>>,
) -> Result<(), StoreError> {
    let mut reported: Option<Leader> = None;
    loop {
        let (mut candidates, revision) = read_candidates(&inner, &prefix).await?;
        let mut watch = RawWatch::open(
            inner.clone(),
            KeyRange::Prefix(prefix.clone()),
            revision + 1,
        )
        .await?;
        loop {
            let now = leader_of(&candidates);
            for observation in changes(&reported, &now) {
                if tx.send(Ok(observation)).await.is_err() {
                    return Ok(());
                }
            }
            reported = now;
            match watch.next().await {
                // A batch holds whole revisions: the leader is computed
                // between revisions, never in the middle of one.
                Ok(batch) => apply(&mut candidates, batch.events),
                // Compacted: read the candidates afresh; the difference
                // to what was reported is reported.
                Err(StoreError::Compacted { .. }) => break,
                Err(e) => return Err(e),
            }
        }
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
