//! A listener's connection slots: at most N connections open at once; the
//! accept loop waits for a free slot before it accepts again (new
//! connections then queue in the kernel's backlog), as Go's
//! `netutil.LimitListener` does.

use std::future::poll_fn;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Poll, Waker};

/// Connection slots shared by an accept loop and its connections.
#[derive(Clone, Debug)]
pub struct Slots(Arc<Mutex<State>>);

#[derive(Debug)]
struct State {
    free: usize,
    waiter: Option<Waker>,
}

/// One connection's slot, returned when dropped.
#[derive(Debug)]
pub struct Slot(Arc<Mutex<State>>);

impl Slots {
    /// `n` slots (at least one).
    pub fn new(n: usize) -> Self {
        Slots(Arc::new(Mutex::new(State {
            free: n.max(1),
            waiter: None,
        })))
    }

    /// Waits for a free slot and takes it. One task (the accept loop)
    /// waits at a time.
    pub async fn acquire(&self) -> Slot {
        poll_fn(|cx| {
            let mut state = lock(&self.0);
            if state.free > 0 {
                state.free -= 1;
                Poll::Ready(Slot(self.0.clone()))
            } else {
                state.waiter = Some(cx.waker().clone());
                Poll::Pending
            }
        })
        .await
    }

    /// Free slots now.
    pub fn free(&self) -> usize {
        lock(&self.0).free
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let waiter = {
            let mut state = lock(&self.0);
            state.free += 1;
            state.waiter.take()
        };
        if let Some(waker) = waiter {
            waker.wake();
        }
    }
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use futures::FutureExt;

    #[test]
    fn waits_for_a_returned_slot() {
        let slots = Slots::new(2);
        let a = slots.acquire().now_or_never().unwrap();
        let _b = slots.acquire().now_or_never().unwrap();
        assert_eq!(slots.free(), 0);
        let mut third = Box::pin(slots.acquire());
        let (waker, woken) = futures_test_waker();
        let mut cx = std::task::Context::from_waker(&waker);
        assert!(third.as_mut().poll(&mut cx).is_pending());
        drop(a);
        assert!(woken.load(std::sync::atomic::Ordering::SeqCst));
        assert!(third.as_mut().poll(&mut cx).is_ready());
    }

    fn futures_test_waker() -> (Waker, Arc<std::sync::atomic::AtomicBool>) {
        struct Flag(Arc<std::sync::atomic::AtomicBool>);
        impl std::task::Wake for Flag {
            fn wake(self: Arc<Self>) {
                self.0.store(true, std::sync::atomic::Ordering::SeqCst);
            }
        }
        let flag = Arc::new(std::sync::atomic::AtomicBool::new(false));
        (Waker::from(Arc::new(Flag(flag.clone()))), flag)
    }
}
