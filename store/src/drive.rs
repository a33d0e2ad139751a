//! Driving a [`StoreWriter`]: on a thread of its own with the host's clock
//! (what [`EmbeddedStore::open`](super::EmbeddedStore::open) does), or as a
//! task on any runtime's timer ([`drive`]: a simulator's).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use futures::future::BoxFuture;
use metropolis_core::ports::{MonotonicClock, Timer};
use metropolis_core::time::Instant;

use super::writer::{StoreWriter, WriterStep};

/// The host's monotonic clock, counted from when this value was made: the
/// default [`StoreOptions::clock`](super::StoreOptions::clock).
#[derive(Debug)]
pub struct HostClock {
    base: std::time::Instant,
}

impl HostClock {
    /// A clock whose origin is now.
    pub fn new() -> HostClock {
        HostClock {
            base: std::time::Instant::now(),
        }
    }
}

impl Default for HostClock {
    fn default() -> Self {
        HostClock::new()
    }
}

impl MonotonicClock for HostClock {
    fn now(&self) -> Instant {
        Instant::from_offset(self.base.elapsed())
    }
}

/// Unparks the writer's thread.
struct Unpark(std::thread::Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

/// Runs `writer` on the calling thread until it stops, parking between
/// steps. A deadline is waited for in host time, as the difference
/// between it and `clock`'s now (the store's clock: the host's by
/// default). An unpark that comes before the park is not lost (the
/// thread's token keeps it), so a record queued between a step and the
/// park is written at once.
pub(super) fn on_this_thread(mut writer: StoreWriter, clock: Arc<dyn MonotonicClock>) {
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    loop {
        match writer.step(&waker) {
            WriterStep::Wrote => {}
            WriterStep::Wait { until: None } => std::thread::park(),
            WriterStep::Wait { until: Some(until) } => {
                let wait = until.saturating_duration_since(clock.now());
                if !wait.is_zero() {
                    std::thread::park_timeout(wait);
                }
            }
            WriterStep::Stopped => return,
        }
    }
}

/// A future running `writer` by the contract of [`StoreWriter::step`] on
/// `timer` (whose timeline must be the store's clock,
/// [`StoreOptions::clock`](super::StoreOptions::clock)); it resolves once
/// the writer stops. It yields after every batch written, so that the
/// callers it completed run before the next batch.
pub fn drive(writer: StoreWriter, timer: Arc<dyn Timer>) -> Drive {
    Drive {
        writer,
        timer,
        sleep: None,
    }
}

/// The future of [`drive`].
pub struct Drive {
    writer: StoreWriter,
    timer: Arc<dyn Timer>,
    /// The timer of the deadline the writer waits for, if any.
    sleep: Option<(Instant, BoxFuture<'static, ()>)>,
}

impl std::fmt::Debug for Drive {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Drive")
            .field("writer", &self.writer)
            .field("deadline", &self.sleep.as_ref().map(|(at, _)| *at))
            .finish()
    }
}

impl Future for Drive {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        loop {
            match this.writer.step(cx.waker()) {
                WriterStep::Wrote => {
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
                WriterStep::Stopped => return Poll::Ready(()),
                WriterStep::Wait { until: None } => {
                    this.sleep = None;
                    return Poll::Pending;
                }
                WriterStep::Wait { until: Some(until) } => {
                    if this.sleep.as_ref().is_none_or(|(at, _)| *at != until) {
                        this.sleep = Some((until, this.timer.sleep_until(until)));
                    }
                    let Some((_, sleep)) = this.sleep.as_mut() else {
                        return Poll::Pending;
                    };
                    if sleep.as_mut().poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                    // The deadline passed: step again.
                    this.sleep = None;
                }
            }
        }
    }
}
