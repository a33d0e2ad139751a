//! The writer driven by its caller (`EmbeddedStore::open_stepped`) on a
//! clock the test sets: nothing is durable until a step writes it, the
//! waker a waiting step left is woken by what gives it work, leases
//! expire on the injected clock and at the deadline the step names.

// Test code: a failed setup or check should panic.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use common::{b, block_on, dump, put};
use futures::FutureExt;
use metropolis_core::ports::MonotonicClock;
use metropolis_core::store::{Op, Txn};
use metropolis_core::time::Instant;
use metropolis_store::{EmbeddedStore, StoreOptions, WriterStep};

/// A clock that moves only when told.
#[derive(Default)]
struct SetClock(AtomicU64);

impl SetClock {
    fn set(&self, t: Duration) {
        self.0.store(t.as_nanos() as u64, Ordering::SeqCst);
    }
}

impl MonotonicClock for SetClock {
    fn now(&self) -> Instant {
        Instant::from_offset(Duration::from_nanos(self.0.load(Ordering::SeqCst)))
    }
}

/// Counts its wake-ups.
#[derive(Default)]
struct Count(AtomicUsize);

impl Wake for Count {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn options(clock: &Arc<SetClock>) -> StoreOptions {
    StoreOptions::default()
        .with_commit_delay(Duration::ZERO)
        .with_clock(clock.clone())
}

#[test]
fn nothing_is_durable_until_a_step_writes_it() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(SetClock::default());
    let (store, mut writer) = EmbeddedStore::open_stepped(dir.path(), options(&clock)).unwrap();
    let count = Arc::new(Count::default());
    let waker = Waker::from(count.clone());
    assert_eq!(writer.step(&waker), WriterStep::Wait { until: None });

    let mut put_a = store.txn(put("a", "1"));
    let mut cx = Context::from_waker(Waker::noop());
    assert!(
        put_a.poll_unpin(&mut cx).is_pending(),
        "acknowledged before a step"
    );
    assert_eq!(
        count.0.load(Ordering::SeqCst),
        1,
        "the waiting writer is woken"
    );
    // A second change before the step does not wake it again.
    let mut put_b = store.txn(put("b", "2"));
    assert_eq!(count.0.load(Ordering::SeqCst), 1);
    assert_eq!(store.revision(), 1, "nothing new is durable");

    assert_eq!(writer.step(&waker), WriterStep::Wrote);
    assert!(matches!(put_a.poll_unpin(&mut cx), Poll::Ready(Ok(_))));
    assert!(matches!(put_b.poll_unpin(&mut cx), Poll::Ready(Ok(_))));
    assert_eq!(writer.step(&waker), WriterStep::Wait { until: None });

    // A closed store stops its writer once the queue is written.
    let mut put_c = store.txn(put("c", "3"));
    drop(store);
    assert!(
        count.0.load(Ordering::SeqCst) >= 2,
        "the close wakes the writer"
    );
    assert_eq!(writer.step(&waker), WriterStep::Wrote);
    assert!(matches!(put_c.poll_unpin(&mut cx), Poll::Ready(Ok(_))));
    assert_eq!(writer.step(&waker), WriterStep::Stopped);
    drop(writer);

    let store = EmbeddedStore::open(dir.path(), StoreOptions::default()).unwrap();
    let keys: Vec<_> = dump(&store).1.into_iter().map(|kv| kv.key).collect();
    assert_eq!(keys, vec![b("a"), b("b"), b("c")]);
}

#[test]
fn a_dropped_writer_acknowledges_nothing_and_keeps_nothing_unwritten() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(SetClock::default());
    let (store, mut writer) = EmbeddedStore::open_stepped(dir.path(), options(&clock)).unwrap();
    block_on(async {
        let put_a = store.txn(put("a", "1"));
        assert_eq!(writer.step(Waker::noop()), WriterStep::Wrote);
        put_a.await.unwrap();
    });
    let put_b = store.txn(put("b", "2"));
    // A crash: the writer goes before it wrote `b`.
    drop(writer);
    drop(store);
    assert!(
        block_on(put_b).is_err(),
        "an unwritten change was acknowledged"
    );
    let store = EmbeddedStore::open(dir.path(), StoreOptions::default()).unwrap();
    let keys: Vec<_> = dump(&store).1.into_iter().map(|kv| kv.key).collect();
    assert_eq!(keys, vec![b("a")]);
}

#[test]
fn leases_expire_on_the_injected_clock_at_the_deadline_the_step_names() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(SetClock::default());
    let (store, mut writer) = EmbeddedStore::open_stepped(dir.path(), options(&clock)).unwrap();
    let noop = Waker::noop();
    let grant = store.lease_grant(0, Duration::from_secs(5));
    assert_eq!(writer.step(noop), WriterStep::Wrote);
    let lease = block_on(grant).unwrap();
    let attach = store.txn(Txn {
        success: vec![Op::Put {
            key: b("leased"),
            value: b("x"),
            lease,
        }],
        ..Txn::default()
    });
    assert_eq!(writer.step(noop), WriterStep::Wrote);
    block_on(attach).unwrap();
    let deadline = Instant::from_offset(Duration::from_secs(5));
    assert_eq!(
        writer.step(noop),
        WriterStep::Wait {
            until: Some(deadline)
        }
    );
    clock.set(Duration::from_millis(4_999));
    assert_eq!(
        writer.step(noop),
        WriterStep::Wait {
            until: Some(deadline)
        },
        "expired early"
    );
    assert!(dump(&store).1.iter().any(|kv| kv.key == b("leased")));
    clock.set(Duration::from_secs(5));
    assert_eq!(writer.step(noop), WriterStep::Wrote, "the revocation");
    assert_eq!(writer.step(noop), WriterStep::Wait { until: None });
    assert!(dump(&store).1.is_empty());
}
