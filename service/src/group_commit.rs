//! [`GroupCommit`]: concurrent transactions to a remote store sent as one.
//!
//! Over etcd every record update is one fenced compare-and-swap
//! transaction, and etcd's cost is per transaction far more than per key:
//! each is a gRPC call, a Raft proposal and an apply of its own. A leader
//! serving many nodes has many such updates in flight at once, of
//! different keys. [`GroupCommit`] keeps at most
//! [`in_flight`](GroupCommitOptions::in_flight) transactions outstanding at
//! the store; what callers submit meanwhile waits, and leaves as **one**
//! transaction as soon as one of the outstanding ones is answered: the
//! compares of all (duplicates, such as the leader's fence, once), then
//! the writes of all. With nothing outstanding a transaction leaves at
//! once and unchanged, so an idle store adds no latency and nothing waits
//! for a timer.
//!
//! **Equivalence.** Only transactions whose success branch only writes
//! single keys are combined, and only when no key one of them writes is
//! compared or written by another of the group. Then the group commits iff
//! every member's compares hold, and its effect is each member's effect,
//! at one revision: what each would have done alone, in any order. Each
//! member's answer is its own slice of the writes' results, at the group's
//! revision. When a compare of the group fails, the members are sent again
//! one by one, each with its own failure branch, so a member learns what it
//! would have learnt alone (a lost race, a lost fence); a failed compare
//! costs that group one extra round trip. So does a group the store
//! refuses whole without applying any of it ([`StoreError::Refused`]: an
//! etcd started with a lower `--max-txn-ops` than
//! [`max_ops`](GroupCommitOptions::max_ops)). Any other store error answers
//! every member with it, as it would have answered each: nothing that may
//! have been applied is retried behind a caller's back. Every caller is answered only after the store
//! answered the transaction that carried its writes.
//!
//! **Bounds.** A group holds at most
//! [`max_ops`](GroupCommitOptions::max_ops) writes and as many compares
//! (etcd refuses more than its `--max-txn-ops`, 128 by default), and at
//! most [`max_bytes`](GroupCommitOptions::max_bytes) of keys and values
//! (etcd: `--max-request-bytes`, 1.5 MiB by default). A transaction beyond
//! either goes alone. What waits is bounded by the calls in flight, which
//! the listeners bound. A caller that gives up before its transaction
//! left is skipped; one that gives up later is not: its writes may commit,
//! as over a connection that broke after the request was sent.

use std::collections::{HashSet, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::channel::{mpsc, oneshot};
use futures::future::BoxFuture;
use futures::stream::{BoxStream, FuturesUnordered};
use futures::{FutureExt, StreamExt};

use metropolis_core::ports::{KvStore, Spawner, WatchBatch};
use metropolis_core::store::{
    Compare, KeyRange, KeyValue, Op, Revision, StoreError, Txn, TxnResponse,
};

/// How [`GroupCommit`] groups transactions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupCommitOptions {
    /// Transactions outstanding at the store at most; what is submitted
    /// meanwhile waits for one of them to be answered.
    pub in_flight: usize,
    /// Writes of a group at most, and compares (after removing
    /// duplicates) at most: no more than the store accepts in one
    /// transaction (etcd's `--max-txn-ops`).
    pub max_ops: usize,
    /// Bytes of keys and values of a group at most: less than the store
    /// accepts in one request (etcd's `--max-request-bytes`).
    pub max_bytes: usize,
}

impl Default for GroupCommitOptions {
    fn default() -> Self {
        GroupCommitOptions {
            in_flight: 4,
            max_ops: 128,
            max_bytes: 512 << 10,
        }
    }
}

/// A [`KvStore`] that sends concurrent transactions to `inner` in groups
/// (see the [module](self)). Reads and watches pass through. Its
/// background task ends once every clone is gone and every transaction
/// is answered.
#[derive(Clone)]
pub struct GroupCommit {
    inner: Arc<dyn KvStore>,
    submit: mpsc::UnboundedSender<Pending>,
}

/// A transaction waiting to leave, and where its answer goes.
struct Pending {
    txn: Txn,
    reply: oneshot::Sender<Result<TxnResponse, StoreError>>,
}

impl GroupCommit {
    /// Groups the transactions sent to `inner`; the task that sends them
    /// runs on `spawner`.
    pub fn new(
        inner: Arc<dyn KvStore>,
        spawner: &dyn Spawner,
        options: GroupCommitOptions,
    ) -> GroupCommit {
        let (submit, submitted) = mpsc::unbounded();
        spawner.spawn(Box::pin(Driver {
            inner: inner.clone(),
            options: GroupCommitOptions {
                in_flight: options.in_flight.max(1),
                max_ops: options.max_ops.max(1),
                ..options
            },
            submitted: Some(submitted),
            waiting: VecDeque::new(),
            in_flight: FuturesUnordered::new(),
        }));
        GroupCommit { inner, submit }
    }
}

/// Whether `txn` may be combined with others: its success branch only
/// writes single keys.
fn combinable(txn: &Txn) -> bool {
    txn.success.iter().all(|op| match op {
        Op::Put { .. } | Op::Delete(KeyRange::Key(_)) => true,
        Op::Range(_) | Op::Delete(KeyRange::Prefix(_)) => false,
    })
}

fn written_key(op: &Op) -> &Bytes {
    match op {
        Op::Put { key, .. } | Op::Delete(KeyRange::Key(key)) => key,
        // Not combinable (see `combinable`): never in a group.
        Op::Range(KeyRange::Key(key) | KeyRange::Prefix(key))
        | Op::Delete(KeyRange::Prefix(key)) => key,
    }
}

fn txn_bytes(txn: &Txn) -> usize {
    let compares: usize = txn.compares.iter().map(|c| c.key.len() + 16).sum();
    let writes: usize = txn
        .success
        .iter()
        .map(|op| match op {
            Op::Put { key, value, .. } => key.len() + value.len(),
            other => written_key(other).len(),
        })
        .sum();
    compares + writes
}

impl KvStore for GroupCommit {
    fn txn(&self, txn: Txn) -> BoxFuture<'static, Result<TxnResponse, StoreError>> {
        if !combinable(&txn) {
            return self.inner.txn(txn);
        }
        let (reply, answer) = oneshot::channel();
        if let Err(refused) = self.submit.unbounded_send(Pending { txn, reply }) {
            // The task is gone (its runtime stopped): send it alone.
            return self.inner.txn(refused.into_inner().txn);
        }
        Box::pin(answer.map(|answer| {
            answer.unwrap_or_else(|_| {
                Err(StoreError::Unavailable(
                    "the store's commit task stopped before answering".into(),
                ))
            })
        }))
    }

    fn read_for_update(
        &self,
        range: KeyRange,
    ) -> BoxFuture<'static, Result<Vec<KeyValue>, StoreError>> {
        self.inner.read_for_update(range)
    }

    fn applies_in_order(&self) -> bool {
        self.inner.applies_in_order()
    }

    fn watch(
        &self,
        range: KeyRange,
        start_revision: Revision,
    ) -> BoxStream<'static, Result<WatchBatch, StoreError>> {
        self.inner.watch(range, start_revision)
    }
}

/// The background task: takes what is submitted, sends groups while
/// fewer than `in_flight` are outstanding.
struct Driver {
    inner: Arc<dyn KvStore>,
    options: GroupCommitOptions,
    /// None once every [`GroupCommit`] is gone.
    submitted: Option<mpsc::UnboundedReceiver<Pending>>,
    waiting: VecDeque<Pending>,
    in_flight: FuturesUnordered<BoxFuture<'static, ()>>,
}

impl Future for Driver {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = &mut *self;
        loop {
            while let Some(submitted) = &mut this.submitted {
                match submitted.poll_next_unpin(cx) {
                    Poll::Ready(Some(pending)) => this.waiting.push_back(pending),
                    Poll::Ready(None) => this.submitted = None,
                    Poll::Pending => break,
                }
            }
            while let Poll::Ready(Some(())) = this.in_flight.poll_next_unpin(cx) {}
            let mut sent = false;
            while this.in_flight.len() < this.options.in_flight {
                let group = next_group(&mut this.waiting, &this.options);
                if group.is_empty() {
                    break;
                }
                this.in_flight
                    .push(Box::pin(commit(this.inner.clone(), group)));
                sent = true;
            }
            if sent {
                // Poll what was just sent before sleeping.
                continue;
            }
            let done = this.submitted.is_none() && this.in_flight.is_empty();
            return if done && this.waiting.is_empty() {
                Poll::Ready(())
            } else {
                Poll::Pending
            };
        }
    }
}

/// The next group, taken from `waiting` in order: every transaction that
/// fits and whose keys do not collide with the group's (see the
/// [module](self)); those that do not stay, in order. A transaction too
/// large to share a group goes alone when it is first. Callers that gave
/// up are dropped.
fn next_group(waiting: &mut VecDeque<Pending>, options: &GroupCommitOptions) -> Vec<Pending> {
    let mut group: Vec<Pending> = Vec::new();
    let mut compares: HashSet<Compare> = HashSet::new();
    let mut compared: HashSet<Bytes> = HashSet::new();
    let mut written: HashSet<Bytes> = HashSet::new();
    let (mut writes, mut bytes) = (0, 0);
    let mut rest = VecDeque::new();
    while let Some(pending) = waiting.pop_front() {
        if pending.reply.is_canceled() {
            continue;
        }
        let txn = &pending.txn;
        let size = txn_bytes(txn);
        if txn.success.len() > options.max_ops
            || txn.compares.len() > options.max_ops
            || size > options.max_bytes
        {
            if group.is_empty() {
                group.push(pending);
                break;
            }
            rest.push_back(pending);
            continue;
        }
        let new_compares = txn
            .compares
            .iter()
            .filter(|c| !compares.contains(*c))
            .count();
        let fits = writes + txn.success.len() <= options.max_ops
            && compares.len() + new_compares <= options.max_ops
            && bytes + size <= options.max_bytes;
        let collides = txn.success.iter().any(|op| {
            let key = written_key(op);
            written.contains(key) || compared.contains(key)
        }) || txn.compares.iter().any(|c| written.contains(&c.key));
        if !fits || collides {
            rest.push_back(pending);
            if writes >= options.max_ops {
                break;
            }
            continue;
        }
        for c in &txn.compares {
            compared.insert(c.key.clone());
            compares.insert(c.clone());
        }
        for op in &txn.success {
            written.insert(written_key(op).clone());
        }
        writes += txn.success.len();
        bytes += size;
        group.push(pending);
    }
    rest.append(waiting);
    *waiting = rest;
    group
}

/// Sends `group` as one transaction (or a lone member as it is) and
/// answers each member.
async fn commit(inner: Arc<dyn KvStore>, mut group: Vec<Pending>) {
    if group.len() == 1 {
        if let Some(Pending { txn, reply }) = group.pop() {
            let _ = reply.send(inner.txn(txn).await);
        }
        return;
    }
    let mut seen = HashSet::new();
    let combined = Txn {
        compares: group
            .iter()
            .flat_map(|p| p.txn.compares.iter())
            .filter(|c| seen.insert(*c))
            .cloned()
            .collect(),
        success: group
            .iter()
            .flat_map(|p| p.txn.success.iter().cloned())
            .collect(),
        failure: Vec::new(),
    };
    drop(seen);
    let expected = combined.success.len();
    match inner.txn(combined).await {
        Ok(response) if response.succeeded && response.results.len() == expected => {
            let mut results = response.results.into_iter();
            for Pending { txn, reply } in group {
                let _ = reply.send(Ok(TxnResponse {
                    succeeded: true,
                    revision: response.revision,
                    results: results.by_ref().take(txn.success.len()).collect(),
                }));
            }
        }
        Ok(response) if response.succeeded => {
            let e = StoreError::Unavailable(format!(
                "the store answered {} results for a transaction of {expected} writes",
                response.results.len()
            ));
            for p in group {
                let _ = p.reply.send(Err(e.clone()));
            }
        }
        // A compare failed, or the store refused the group as a whole
        // without applying any of it (more operations than it takes):
        // each member alone, with its own failure branch, concurrently
        // (their keys are disjoint).
        Ok(_) | Err(StoreError::Refused(_)) => {
            futures::future::join_all(group.into_iter().map(|Pending { txn, reply }| {
                let sent = inner.txn(txn);
                async move {
                    let _ = reply.send(sent.await);
                }
            }))
            .await;
        }
        Err(e) => {
            for p in group {
                let _ = p.reply.send(Err(e.clone()));
            }
        }
    }
}
