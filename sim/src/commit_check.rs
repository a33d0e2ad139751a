//! Fencing checked where it matters, at the simulated store's commit: a
//! [`KvStore`] in front of the store model that, for every transaction
//! that commits a write, asks whether its author could have known it led.
//!
//! A committed write must carry the compare "this election key still has
//! this create revision" for the key that leads (the oldest under the
//! election prefix) at the moment of the commit, or be a create-only
//! write (compare create revision 0 on the key it writes: a node's
//! self-registration, a campaign's own key). Anything else is a write a
//! deposed leader, or an unfenced path, could have made: a violation.
//!
//! It also keeps, per key, every value committed through it in commit
//! order ([`CommitCheck::committed`]), against which watchers check that
//! what they were sent of a key is in that order.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::FutureExt;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use metropolis_core::ports::{KvStore, WatchBatch};
use metropolis_core::store::{
    CmpOp, Compare, CompareTarget, KeyRange, KeyValue, Op, Revision, StoreError, Txn, TxnResponse,
};
use metropolis_testkit::store::MemKv;

/// The checked store; clones share the violations.
#[derive(Clone)]
pub struct CommitCheck {
    inner: MemKv,
    election_prefix: Bytes,
    violations: Arc<Mutex<Vec<String>>>,
    /// Per key, the values committed, in commit order.
    committed: Arc<Mutex<std::collections::BTreeMap<Bytes, Vec<Bytes>>>>,
}

impl CommitCheck {
    /// Checks the commits to `inner` against the election under
    /// `election_prefix`.
    pub fn new(inner: MemKv, election_prefix: impl Into<Bytes>) -> CommitCheck {
        CommitCheck {
            inner,
            election_prefix: election_prefix.into(),
            violations: Arc::new(Mutex::new(Vec::new())),
            committed: Arc::default(),
        }
    }

    /// The values committed to `key` through this store, in commit order.
    pub fn committed(&self, key: &[u8]) -> Vec<Bytes> {
        let committed = self.committed.lock().unwrap_or_else(|e| e.into_inner());
        committed.get(key).cloned().unwrap_or_default()
    }

    fn record(&self, ops: &[Op]) {
        let mut committed = self.committed.lock().unwrap_or_else(|e| e.into_inner());
        for op in ops {
            if let Op::Put { key, value, .. } = op {
                committed
                    .entry(key.clone())
                    .or_default()
                    .push(value.clone());
            }
        }
    }

    /// The violations seen so far.
    pub fn violations(&self) -> Vec<String> {
        self.violations
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The leading election key now: the oldest candidate.
    fn leader(&self) -> Option<KeyValue> {
        let range = KeyRange::Prefix(self.election_prefix.clone());
        self.inner
            .with(|m| m.range(&range))
            .into_iter()
            .min_by_key(|kv| kv.create_revision)
    }

    fn check(&self, txn: &Txn, leader: Option<&KeyValue>) {
        let writes: Vec<&Bytes> = txn
            .success
            .iter()
            .filter_map(|op| match op {
                Op::Put { key, .. } => Some(key),
                Op::Delete(KeyRange::Key(key)) => Some(key),
                Op::Delete(KeyRange::Prefix(prefix)) => Some(prefix),
                _ => None,
            })
            .collect();
        if writes.is_empty() {
            return;
        }
        let fenced = leader.is_some_and(|l| {
            txn.compares.contains(&Compare {
                key: l.key.clone(),
                op: CmpOp::Equal,
                target: CompareTarget::CreateRevision(l.create_revision),
            })
        });
        let create_only = writes.iter().all(|key| {
            txn.compares.iter().any(|c| {
                c.key == **key
                    && c.op == CmpOp::Equal
                    && c.target == CompareTarget::CreateRevision(0)
            })
        });
        // Election bookkeeping (a campaign updating its own key) is the
        // election's, fenced by the key itself.
        let election = writes.iter().all(|k| k.starts_with(&self.election_prefix));
        if !(fenced || create_only || election) {
            let keys: Vec<String> = writes
                .iter()
                .map(|k| String::from_utf8_lossy(k).into_owned())
                .collect();
            self.violations
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(format!(
                    "a write of {keys:?} committed without the fence of the leader {:?}",
                    leader.map(|l| (
                        String::from_utf8_lossy(&l.key).into_owned(),
                        l.create_revision
                    ))
                ));
        }
    }
}

impl KvStore for CommitCheck {
    fn txn(&self, txn: Txn) -> BoxFuture<'static, Result<TxnResponse, StoreError>> {
        // The model commits when the transaction is submitted: the leader
        // read now is the leader at the commit.
        let leader = self.leader();
        let sent = self.inner.txn(txn.clone());
        let this = self.clone();
        async move {
            let response = sent.await?;
            if response.succeeded {
                this.check(&txn, leader.as_ref());
                this.record(&txn.success);
            } else {
                this.record(&txn.failure);
            }
            Ok(response)
        }
        .boxed()
    }

    fn read_for_update(
        &self,
        range: KeyRange,
    ) -> BoxFuture<'static, Result<Vec<KeyValue>, StoreError>> {
        self.inner.read_for_update(range)
    }

    fn watch(
        &self,
        range: KeyRange,
        start_revision: Revision,
    ) -> BoxStream<'static, Result<WatchBatch, StoreError>> {
        self.inner.watch(range, start_revision)
    }
}
