#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicBool, Ordering};

use super::*;
use std::collections::BTreeSet;

fn runtime(seed: u64, nodes: usize) -> Runtime {
    Runtime::new(seed, vec![NodeClock::default(); nodes])
}

/// Gives the other ready tasks a turn: pending once, woken at once.
async fn yield_now() {
    let mut yielded = false;
    futures::future::poll_fn(|cx| {
        if yielded {
            return Poll::Ready(());
        }
        yielded = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    })
    .await
}

/// Three tasks per node that each log their name, yield, and log again.
fn interleaving(seed: u64) -> Vec<String> {
    let rt = runtime(seed, 2);
    let log = Arc::new(Mutex::new(Vec::new()));
    for node in 0..2 {
        let handle = rt.node(node);
        for task in 0..3 {
            let log = log.clone();
            handle.spawn(async move {
                for round in 0..2 {
                    lock(&log).push(format!("{node}.{task}.{round}"));
                    yield_now().await;
                }
            });
        }
    }
    while rt.step() {}
    lock(&log).clone()
}

#[test]
fn the_seed_alone_decides_the_order() {
    assert_eq!(interleaving(7), interleaving(7));
    let orders: BTreeSet<Vec<String>> = (0..20).map(interleaving).collect();
    assert!(orders.len() > 10, "seeds pick different orders");
    for order in orders {
        assert_eq!(order.len(), 12);
    }
}

#[test]
fn time_moves_only_to_the_next_timer() {
    let rt = runtime(1, 1);
    let node = rt.node(0);
    let fired = Arc::new(Mutex::new(Vec::new()));
    for secs in [5, 1, 3] {
        let (node, fired) = (node.clone(), fired.clone());
        rt.node(0).spawn(async move {
            let at = node.now() + Duration::from_secs(secs);
            node.sleep_until(at).await;
            lock(&fired).push((secs, node.now()));
        });
    }
    rt.run_until(Duration::from_secs(4));
    assert_eq!(rt.now(), Duration::from_secs(4));
    let at = |s| Instant::from_offset(Duration::from_secs(s));
    assert_eq!(*lock(&fired), vec![(1, at(1)), (3, at(3))]);
    rt.run_for(Duration::from_secs(10));
    assert_eq!(lock(&fired).last(), Some(&(5, at(5))));
    assert_eq!(rt.tasks(), 0);
}

struct Flag(Arc<AtomicBool>);

impl Drop for Flag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[test]
fn a_crash_drops_the_nodes_tasks_and_no_others() {
    let rt = runtime(3, 2);
    let dropped = [
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    ];
    for (node, dropped) in dropped.iter().enumerate() {
        let flag = Flag(dropped.clone());
        let handle = rt.node(node);
        rt.node(node).spawn(async move {
            let _flag = flag;
            handle
                .sleep_until(Instant::from_offset(Duration::from_secs(60)))
                .await;
        });
    }
    rt.run_for(Duration::from_secs(1));
    let stale = rt.node(0);
    rt.crash(0);
    assert!(dropped[0].load(Ordering::SeqCst));
    assert!(!dropped[1].load(Ordering::SeqCst));
    assert_eq!((rt.tasks_of(0), rt.tasks_of(1)), (0, 1));
    // A handle of the crashed incarnation spawns nothing; a new one does.
    stale.spawn(async {});
    assert_eq!(rt.tasks_of(0), 0);
    rt.node(0).spawn(futures::future::pending());
    assert_eq!(rt.tasks_of(0), 1);
}

#[test]
fn each_node_sleeps_on_its_own_clock() {
    let clocks = vec![
        NodeClock::default(),
        NodeClock {
            offset_us: 30_000_000,
            drift_ppm: 100_000,
            wall_minus_monotonic_ms: 0,
        },
    ];
    let rt = Runtime::new(5, clocks);
    let woke = Arc::new(Mutex::new(BTreeMap::new()));
    for node in 0..2 {
        let (handle, woke) = (rt.node(node), woke.clone());
        rt.node(node).spawn(async move {
            // One second of the node's own time.
            handle
                .sleep_until(handle.now() + Duration::from_secs(1))
                .await;
            lock(&woke).insert(node, handle.now());
        });
    }
    rt.run_for(Duration::from_secs(2));
    let woke = lock(&woke).clone();
    assert_eq!(woke[&0], Instant::from_offset(Duration::from_secs(1)));
    // 10 % fast: its second took 0.909091 s of global time.
    assert!(woke[&1] >= Instant::from_offset(Duration::from_secs(31)));
    let node = rt.node(1);
    let before = node.now_unix_ms();
    rt.jump_wall_clock(1, -60_000);
    assert_eq!(node.now_unix_ms(), before - 60_000);
}

#[test]
#[should_panic(expected = "livelock")]
fn tasks_that_only_wake_each_other_are_a_livelock() {
    let rt = runtime(9, 1);
    rt.node(0).spawn(async {
        loop {
            yield_now().await;
        }
    });
    rt.run_for(Duration::from_secs(1));
}

/// A deadline between two microseconds, and one on a drifting clock,
/// each wake their sleeper (a timer set once for the microsecond below
/// left it asleep for ever).
#[test]
fn deadlines_off_the_microsecond_and_on_drifting_clocks_fire() {
    let clocks = vec![
        NodeClock::default(),
        NodeClock {
            drift_ppm: 1_000,
            ..NodeClock::default()
        },
    ];
    let rt = Runtime::new(1, clocks);
    let woke = Arc::new(Mutex::new(Vec::new()));
    for node in 0..2 {
        let (handle, woke) = (rt.node(node), woke.clone());
        rt.node(node).spawn(async move {
            for k in 1..=50u64 {
                let deadline = handle.now() + Duration::from_nanos(1_000 * k + 617);
                handle.sleep_until(deadline).await;
                assert!(handle.now() >= deadline);
            }
            lock(&woke).push(node);
        });
    }
    rt.run_for(Duration::from_secs(1));
    let mut woke = lock(&woke).clone();
    woke.sort_unstable();
    assert_eq!(woke, vec![0, 1]);
}

/// After `shutdown` no task is left holding the runtime, so it is freed.
#[test]
fn shutdown_drops_every_task_and_frees_the_runtime() {
    let rt = runtime(3, 2);
    for node in 0..2 {
        let handle = rt.node(node);
        rt.node(node).spawn(async move {
            loop {
                handle
                    .sleep_until(handle.now() + Duration::from_secs(1))
                    .await;
            }
        });
    }
    rt.run_for(Duration::from_secs(3));
    let weak = Arc::downgrade(&rt.state);
    rt.shutdown();
    drop(rt);
    assert!(weak.upgrade().is_none(), "the runtime outlived its run");
}
