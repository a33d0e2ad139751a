//! Polling a side future of a connection only when it woke.
//!
//! A connection's task is woken for every frame it receives or can send;
//! the futures it watches beside the connection (the idle timer, the
//! shutdown signal) fire at most once in a long while. Polling them on
//! every wake-up costs more than it seems (a tokio `Sleep` poll, a
//! `Shared` poll takes a mutex to store the waker). A [`WakeFlag`] polls
//! such a future with a waker of its own, which sets a flag and wakes the
//! task: until the flag is set, the task's other wake-ups skip the future
//! for the price of one atomic load.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Waker};

use futures::task::{ArcWake, AtomicWaker};

/// What the watched future's waker reaches: the flag, then the task.
#[derive(Default)]
struct Flag {
    woken: AtomicBool,
    task: AtomicWaker,
}

impl ArcWake for Flag {
    fn wake_by_ref(flag: &Arc<Self>) {
        flag.woken.store(true, Ordering::Release);
        flag.task.wake();
    }
}

/// Polls one future at a time, only after it woke (see the module).
pub(crate) struct WakeFlag {
    flag: Arc<Flag>,
    waker: Waker,
    /// The task's waker the flag wakes, as last registered.
    task: Option<Waker>,
    /// The current future was polled (and returned Pending) with the
    /// flag's waker: it wakes the flag when it can progress.
    armed: bool,
}

impl WakeFlag {
    /// A flag for a future not polled yet.
    pub(crate) fn new() -> Self {
        let flag = Arc::new(Flag::default());
        WakeFlag {
            waker: futures::task::waker(flag.clone()),
            flag,
            task: None,
            armed: false,
        }
    }

    /// The future will be replaced: the next poll polls the new one.
    pub(crate) fn rearm(&mut self) {
        self.armed = false;
    }

    /// Polls `future` on behalf of the task of `cx` if it woke since it
    /// was last polled (or was never polled); Pending otherwise.
    pub(crate) fn poll<F: Future + ?Sized>(
        &mut self,
        future: Pin<&mut F>,
        cx: &mut Context<'_>,
    ) -> Poll<F::Output> {
        let woken = self.armed && self.flag.woken.load(Ordering::Acquire);
        if woken {
            self.flag.woken.store(false, Ordering::Relaxed);
            // Waking the task took its waker out of the flag.
            self.task = None;
        }
        if !self.task.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            self.flag.task.register(cx.waker());
            self.task = Some(cx.waker().clone());
        }
        if self.armed && !woken {
            return Poll::Pending;
        }
        let mut own = Context::from_waker(&self.waker);
        match future.poll(&mut own) {
            Poll::Pending => {
                self.armed = true;
                Poll::Pending
            }
            ready => ready,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// Counts its polls; ready once `ready` is set, after waking its waker.
    #[derive(Default)]
    struct Probe {
        polls: AtomicUsize,
        ready: AtomicBool,
        waker: std::sync::Mutex<Option<Waker>>,
    }

    struct ProbeFuture(Arc<Probe>);

    impl Future for ProbeFuture {
        type Output = ();
        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            self.0.polls.fetch_add(1, Ordering::Relaxed);
            if self.0.ready.load(Ordering::Relaxed) {
                return Poll::Ready(());
            }
            *self.0.waker.lock().unwrap() = Some(cx.waker().clone());
            Poll::Pending
        }
    }

    #[test]
    fn the_future_is_polled_again_only_after_it_woke_and_then_the_task_is_woken() {
        let probe = Arc::new(Probe::default());
        let mut future = ProbeFuture(probe.clone());
        let mut flag = WakeFlag::new();
        let task = Arc::new(TaskWakes::default());
        let task_waker = futures::task::waker(task.clone());
        let mut cx = Context::from_waker(&task_waker);
        for _ in 0..5 {
            assert!(flag.poll(Pin::new(&mut future), &mut cx).is_pending());
        }
        assert_eq!(
            probe.polls.load(Ordering::Relaxed),
            1,
            "polled once, then skipped"
        );
        probe.ready.store(true, Ordering::Relaxed);
        let waker = probe.waker.lock().unwrap().take().unwrap();
        waker.wake();
        assert_eq!(task.0.load(Ordering::Relaxed), 1, "the task was woken");
        assert!(flag.poll(Pin::new(&mut future), &mut cx).is_ready());
        assert_eq!(probe.polls.load(Ordering::Relaxed), 2);

        // A second future after a rearm: its wake reaches the task too
        // (the first wake used up the task's registration).
        let second = Arc::new(Probe::default());
        let mut future = ProbeFuture(second.clone());
        flag.rearm();
        assert!(flag.poll(Pin::new(&mut future), &mut cx).is_pending());
        assert!(flag.poll(Pin::new(&mut future), &mut cx).is_pending());
        assert_eq!(second.polls.load(Ordering::Relaxed), 1);
        second.ready.store(true, Ordering::Relaxed);
        second.waker.lock().unwrap().take().unwrap().wake();
        assert_eq!(
            task.0.load(Ordering::Relaxed),
            2,
            "the task was woken again"
        );
        assert!(flag.poll(Pin::new(&mut future), &mut cx).is_ready());
    }

    #[derive(Default)]
    struct TaskWakes(AtomicUsize);

    impl ArcWake for TaskWakes {
        fn wake_by_ref(task: &Arc<Self>) {
            task.0.fetch_add(1, Ordering::Relaxed);
        }
    }
}
