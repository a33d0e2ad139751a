//! [`GroupCommit`] over the store model: what leaves as one transaction,
//! what must not, and that every caller gets the answer it would have got
//! alone.

#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};
use std::task::Poll;

use bytes::Bytes;
use futures::channel::oneshot;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use metropolis_core::ports::{KvStore, WatchBatch};
use metropolis_core::store::{
    CmpOp, Compare, CompareTarget, KeyRange, Op, OpResult, Revision, StoreError, Txn, TxnResponse,
};
use metropolis_service::{GroupCommit, GroupCommitOptions};
use metropolis_testkit::exec::{Tasks, poll_once};
use metropolis_testkit::store::MemKv;

/// The model behind the port, holding every transaction until the test
/// releases it (so that what arrives meanwhile has to wait), and keeping
/// what it was sent.
#[derive(Clone, Default)]
struct Held {
    kv: MemKv,
    state: Arc<Mutex<HeldState>>,
}

#[derive(Default)]
struct HeldState {
    /// Every transaction received, in order.
    sent: Vec<Txn>,
    /// Transactions not yet released, with their releases.
    held: Vec<oneshot::Sender<()>>,
    /// Answer at once instead.
    open: bool,
    /// Fail the next transaction with Unavailable.
    fail_next: bool,
    /// Refuse transactions of more writes than this (as etcd's
    /// `--max-txn-ops`).
    max_ops: Option<usize>,
}

impl Held {
    fn open() -> Held {
        let held = Held::default();
        held.state.lock().unwrap().open = true;
        held
    }

    fn sent(&self) -> Vec<Txn> {
        self.state.lock().unwrap().sent.clone()
    }

    fn outstanding(&self) -> usize {
        self.state.lock().unwrap().held.len()
    }

    /// Lets every held transaction run.
    fn release(&self) {
        for release in std::mem::take(&mut self.state.lock().unwrap().held) {
            let _ = release.send(());
        }
    }
}

impl KvStore for Held {
    fn txn(&self, txn: Txn) -> BoxFuture<'static, Result<TxnResponse, StoreError>> {
        let mut s = self.state.lock().unwrap();
        s.sent.push(txn.clone());
        if s.max_ops.is_some_and(|max| txn.success.len() > max) {
            return Box::pin(futures::future::ready(Err(StoreError::Refused(
                "too many operations in txn request".into(),
            ))));
        }
        if std::mem::take(&mut s.fail_next) {
            return Box::pin(futures::future::ready(Err(StoreError::Unavailable(
                "injected".into(),
            ))));
        }
        let kv = self.kv.clone();
        if s.open {
            return kv.txn(txn);
        }
        let (release, released) = oneshot::channel();
        s.held.push(release);
        Box::pin(async move {
            let _ = released.await;
            kv.txn(txn).await
        })
    }

    fn watch(
        &self,
        range: KeyRange,
        start_revision: Revision,
    ) -> BoxStream<'static, Result<WatchBatch, StoreError>> {
        self.kv.watch(range, start_revision)
    }
}

fn key(k: &str) -> Bytes {
    Bytes::from(k.to_owned())
}

fn put(k: &str, v: &str) -> Op {
    Op::Put {
        key: key(k),
        value: key(v),
        lease: 0,
    }
}

/// Puts `v` at `k` if `k`'s mod revision is `revision`; the failure branch
/// reads `k`.
fn cas(k: &str, revision: Revision, v: &str) -> Txn {
    Txn {
        compares: vec![Compare {
            key: key(k),
            op: CmpOp::Equal,
            target: CompareTarget::ModRevision(revision),
        }],
        success: vec![put(k, v)],
        failure: vec![Op::Range(KeyRange::Key(key(k)))],
    }
}

/// The same compare on every transaction, as the leader's fence is.
fn fence() -> Compare {
    Compare {
        key: key("/election/1"),
        op: CmpOp::Equal,
        target: CompareTarget::CreateRevision(0),
    }
}

type Answer = BoxFuture<'static, Result<TxnResponse, StoreError>>;

fn grouped(store: &Held, options: GroupCommitOptions) -> (GroupCommit, Tasks) {
    let tasks = Tasks::new();
    let store: Arc<dyn KvStore> = Arc::new(store.clone());
    (GroupCommit::new(store, &tasks, options), tasks)
}

fn one_at_a_time() -> GroupCommitOptions {
    GroupCommitOptions {
        in_flight: 1,
        ..GroupCommitOptions::default()
    }
}

fn answer(a: &mut Answer) -> Result<TxnResponse, StoreError> {
    match poll_once(a) {
        Poll::Ready(r) => r,
        Poll::Pending => panic!("no answer yet"),
    }
}

#[test]
fn what_arrives_while_one_is_outstanding_leaves_as_one_transaction() {
    let store = Held::default();
    let (group, tasks) = grouped(&store, one_at_a_time());
    let mut first = group.txn(cas("/a", 0, "a1"));
    tasks.run(2);
    // The first left alone and unchanged: nothing was outstanding.
    assert_eq!(store.sent(), vec![cas("/a", 0, "a1")]);
    let mut rest: Vec<Answer> = ["/b", "/c", "/d"]
        .iter()
        .map(|k| {
            let mut txn = cas(k, 0, "x");
            txn.compares.push(fence());
            group.txn(txn)
        })
        .collect();
    tasks.run(2);
    assert_eq!(store.sent().len(), 1, "waits while one is outstanding");
    assert!(poll_once(&mut first).is_pending());
    store.release();
    tasks.run(2);
    let first = answer(&mut first).unwrap();
    assert!(first.succeeded);
    let sent = store.sent();
    assert_eq!(sent.len(), 2, "{sent:?}");
    let combined = &sent[1];
    // Each compare once (the fence is shared), every write, no failure
    // branch (a failed group is sent again one by one).
    assert_eq!(combined.compares.len(), 4);
    assert_eq!(
        combined.compares.iter().filter(|c| **c == fence()).count(),
        1
    );
    assert_eq!(
        combined.success,
        vec![put("/b", "x"), put("/c", "x"), put("/d", "x")]
    );
    assert!(combined.failure.is_empty());
    store.release();
    tasks.run(2);
    let answers: Vec<TxnResponse> = rest.iter_mut().map(|a| answer(a).unwrap()).collect();
    for a in &answers {
        assert!(a.succeeded);
        assert_eq!(a.results, vec![OpResult::Put(None)]);
        assert_eq!(a.revision, answers[0].revision);
    }
    assert_eq!(answers[0].revision, first.revision + 1);
    for k in ["/b", "/c", "/d"] {
        assert_eq!(store.kv.get(k).unwrap(), "x");
    }
}

#[test]
fn a_failed_compare_in_a_group_answers_each_as_if_it_went_alone() {
    let store = Held::open();
    let (group, tasks) = grouped(&store, one_at_a_time());
    let revision = store.kv.put("/stale", "old");
    store.kv.put("/stale", "newer");
    let mut answers: Vec<Answer> = vec![
        group.txn(cas("/x", 0, "x")),
        group.txn(cas("/stale", revision, "mine")),
        group.txn(cas("/y", 0, "y")),
    ];
    tasks.run(3);
    let sent = store.sent();
    // The group, then each member alone with its own failure branch.
    assert_eq!(sent.len(), 4, "{sent:?}");
    assert_eq!(
        sent[1..],
        [
            cas("/x", 0, "x"),
            cas("/stale", revision, "mine"),
            cas("/y", 0, "y")
        ]
    );
    let answers: Vec<TxnResponse> = answers.iter_mut().map(|a| answer(a).unwrap()).collect();
    assert!(answers[0].succeeded && answers[2].succeeded);
    assert!(!answers[1].succeeded);
    match &answers[1].results[..] {
        [OpResult::Range(kvs)] => assert_eq!(kvs[0].value, "newer"),
        other => panic!("{other:?}"),
    }
    assert_eq!(store.kv.get("/stale").unwrap(), "newer");
    assert_eq!(store.kv.get("/x").unwrap(), "x");
}

#[test]
fn transactions_on_a_common_key_never_share_a_group() {
    let store = Held::open();
    let (group, tasks) = grouped(&store, one_at_a_time());
    let written = Txn {
        success: vec![put("/k", "1")],
        ..Default::default()
    };
    let compared = cas("/k", 0, "2");
    let other = cas("/other", 0, "o");
    let mut answers: Vec<Answer> = vec![
        group.txn(written.clone()),
        group.txn(compared.clone()),
        group.txn(other.clone()),
    ];
    tasks.run(4);
    let sent = store.sent();
    // The first with the one that does not collide; the second alone, after.
    assert_eq!(sent.len(), 2, "{sent:?}");
    assert_eq!(sent[0].success, vec![put("/k", "1"), put("/other", "o")]);
    assert_eq!(sent[1], compared);
    let answers: Vec<TxnResponse> = answers.iter_mut().map(|a| answer(a).unwrap()).collect();
    // It compared against the state after the first write, as in order.
    assert!(answers[0].succeeded && answers[2].succeeded && !answers[1].succeeded);
    assert_eq!(store.kv.get("/k").unwrap(), "1");
}

#[test]
fn at_most_in_flight_transactions_are_outstanding() {
    let store = Held::default();
    let options = GroupCommitOptions {
        in_flight: 2,
        ..GroupCommitOptions::default()
    };
    let (group, tasks) = grouped(&store, options);
    let mut answers: Vec<Answer> = Vec::new();
    for i in 0..10 {
        answers.push(group.txn(cas(&format!("/k{i}"), 0, "v")));
        tasks.run(1);
        assert!(store.outstanding() <= 2);
    }
    // The first two alone, the other eight waiting.
    assert_eq!(store.sent().len(), 2);
    store.release();
    tasks.run(2);
    // Both answered: the eight left as one (a second slot stays free).
    let sent = store.sent();
    assert_eq!(sent.len(), 3, "{sent:?}");
    assert_eq!(sent[2].success.len(), 8);
    store.release();
    tasks.run(2);
    assert!(answers.iter_mut().all(|a| answer(a).unwrap().succeeded));
}

#[test]
fn a_group_holds_at_most_max_ops_writes() {
    let store = Held::default();
    let options = GroupCommitOptions {
        in_flight: 1,
        max_ops: 4,
        ..GroupCommitOptions::default()
    };
    let (group, tasks) = grouped(&store, options);
    let mut answers: Vec<Answer> = (0..11)
        .map(|i| group.txn(cas(&format!("/k{i}"), 0, "v")))
        .collect();
    for _ in 0..6 {
        tasks.run(1);
        store.release();
    }
    tasks.run(2);
    let sizes: Vec<usize> = store.sent().iter().map(|t| t.success.len()).collect();
    assert_eq!(sizes, vec![4, 4, 3]);
    assert!(answers.iter_mut().all(|a| answer(a).unwrap().succeeded));
}

#[test]
fn a_caller_that_gave_up_before_its_transaction_left_writes_nothing() {
    let store = Held::default();
    let (group, tasks) = grouped(&store, one_at_a_time());
    let mut first = group.txn(cas("/a", 0, "a"));
    tasks.run(1);
    let gone = group.txn(cas("/gone", 0, "g"));
    let mut kept = group.txn(cas("/kept", 0, "k"));
    drop(gone);
    store.release();
    tasks.run(2);
    store.release();
    tasks.run(2);
    assert!(answer(&mut first).unwrap().succeeded);
    assert!(answer(&mut kept).unwrap().succeeded);
    assert_eq!(store.kv.get("/gone"), None);
    assert_eq!(store.sent()[1], cas("/kept", 0, "k"));
}

#[test]
fn a_store_error_answers_every_member_and_is_not_retried() {
    let store = Held::default();
    let (group, tasks) = grouped(&store, one_at_a_time());
    let mut first = group.txn(cas("/a", 0, "a"));
    tasks.run(1);
    let mut answers: Vec<Answer> = vec![group.txn(cas("/b", 0, "b")), group.txn(cas("/c", 0, "c"))];
    store.state.lock().unwrap().fail_next = true;
    store.release();
    tasks.run(2);
    assert!(answer(&mut first).unwrap().succeeded);
    for a in &mut answers {
        assert!(matches!(answer(a), Err(StoreError::Unavailable(_))));
    }
    assert_eq!(store.sent().len(), 2);
    assert_eq!(store.kv.get("/b"), None);
}

#[test]
fn reads_and_prefix_writes_go_alone_and_at_once() {
    let store = Held::open();
    let (group, tasks) = grouped(&store, one_at_a_time());
    store.kv.put("/p/1", "1");
    let read = Txn {
        success: vec![Op::Range(KeyRange::Prefix(key("/p/")))],
        ..Default::default()
    };
    // Not even the task is needed: it is sent as it is.
    let mut answer_now = group.txn(read.clone());
    match &answer(&mut answer_now).unwrap().results[..] {
        [OpResult::Range(kvs)] => assert_eq!(kvs.len(), 1),
        other => panic!("{other:?}"),
    }
    let delete = Txn {
        success: vec![Op::Delete(KeyRange::Prefix(key("/p/")))],
        ..Default::default()
    };
    let mut deleted = group.txn(delete.clone());
    assert!(answer(&mut deleted).unwrap().succeeded);
    assert_eq!(store.sent(), vec![read, delete]);
    assert_eq!(tasks.len(), 1);
}

#[test]
fn the_task_ends_once_every_handle_is_gone_and_everything_is_answered() {
    let store = Held::default();
    let (group, tasks) = grouped(&store, one_at_a_time());
    let mut a = group.txn(cas("/a", 0, "a"));
    drop(group);
    tasks.run(2);
    assert_eq!(tasks.len(), 1, "still answering");
    store.release();
    tasks.run(2);
    assert!(answer(&mut a).unwrap().succeeded);
    assert!(tasks.is_empty());
}

#[test]
fn a_group_the_store_refuses_whole_is_sent_again_one_by_one() {
    let store = Held::open();
    store.state.lock().unwrap().max_ops = Some(2);
    let (group, tasks) = grouped(&store, one_at_a_time());
    let mut answers: Vec<Answer> = (0..3)
        .map(|i| group.txn(cas(&format!("/k{i}"), 0, "v")))
        .collect();
    tasks.run(3);
    // The group of three, refused; then each alone.
    let sizes: Vec<usize> = store.sent().iter().map(|t| t.success.len()).collect();
    assert_eq!(sizes, vec![3, 1, 1, 1]);
    assert!(answers.iter_mut().all(|a| answer(a).unwrap().succeeded));
    for i in 0..3 {
        assert_eq!(store.kv.get(format!("/k{i}")).unwrap(), "v");
    }
}
