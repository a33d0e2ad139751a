//! Trace buffers (the global one, or an instance) and the registry that
//! keeps one session per buffer.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use super::TraceError;
use super::port::Tracefs;
use super::validate::InstanceName;

/// The tracefs buffer a session traces into.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Target {
    /// The global buffer: the files at the tracefs root. One session at a
    /// time.
    Global,
    /// A tracefs instance `instances/<name>`, created by the session and
    /// removed by its teardown; its own buffer, tracer and filters.
    Instance(InstanceName),
}

impl Target {
    /// The path of the buffer's control file `name`, relative to the
    /// tracefs root: `name` or `instances/<instance>/name`.
    pub fn file(&self, name: &str) -> String {
        match self {
            Target::Global => name.to_owned(),
            Target::Instance(i) => format!("instances/{i}/{name}"),
        }
    }

    /// The instance directory relative to the tracefs root, if any.
    pub fn instance_dir(&self) -> Option<String> {
        match self {
            Target::Global => None,
            Target::Instance(i) => Some(format!("instances/{i}")),
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Global => f.write_str("the global trace buffer"),
            Target::Instance(i) => write!(f, "tracefs instance {i:?}"),
        }
    }
}

#[derive(Debug, Default)]
struct Registry {
    claimed: BTreeSet<Target>,
    next_instance: u64,
    /// The tasks waiting for a claim to be released ([`Released`]), by
    /// waiter: woken (and removed) at every release, removed when their
    /// future is dropped, so they are never more than the waiting calls.
    waiters: BTreeMap<u64, Waker>,
    next_waiter: u64,
}

/// The registry of buffers in use, shared by every session of a process
/// (clone the handle; clones share the set). A session claims its buffer
/// before it writes anything and releases it once its teardown is done, so
/// a second session on the same buffer gets
/// [`TraceError::AlreadyInProgress`] ("a trace is already in progress")
/// instead of sharing a tracer.
///
/// It only knows this process's sessions: another program using tracefs
/// at the same time is not detected (an existing instance directory is,
/// by `mkdir` failing).
#[derive(Clone, Debug, Default)]
pub struct TraceBuffers {
    inner: Arc<Mutex<Registry>>,
}

impl TraceBuffers {
    /// An empty registry.
    pub fn new() -> TraceBuffers {
        TraceBuffers::default()
    }

    fn lock(&self) -> MutexGuard<'_, Registry> {
        // The registry is a set updated in single statements: a panic
        // elsewhere while holding the lock cannot leave it half-updated.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Claims `target`, or fails with [`TraceError::AlreadyInProgress`] if
    /// a session holds it. The claim is released when the returned guard
    /// is dropped.
    pub fn claim(&self, target: Target) -> Result<BufferClaim, TraceError> {
        if !self.lock().claimed.insert(target.clone()) {
            return Err(TraceError::AlreadyInProgress { target });
        }
        Ok(BufferClaim {
            buffers: self.clone(),
            target,
        })
    }

    /// Whether a session holds `target`.
    pub fn is_claimed(&self, target: &Target) -> bool {
        self.lock().claimed.contains(target)
    }

    /// Resolves once no session holds `target` (at once if none does):
    /// a session ending releases its claim after its teardown, so a
    /// caller refused with [`TraceError::AlreadyInProgress`] can wait for
    /// a session that is ending rather than fail. Bound the wait with a
    /// timer: a session that runs on never releases it.
    pub fn released(&self, target: Target) -> Released {
        Released {
            buffers: self.clone(),
            target,
            waiter: None,
        }
    }

    /// A fresh instance name, `metropolis-trace-<n>`, not held by any
    /// session of this registry (a numbered counter; a directory left in
    /// tracefs by another program can still collide, which the session
    /// reports as [`TraceError::InstanceExists`]).
    pub fn fresh_instance_name(&self) -> InstanceName {
        let mut reg = self.lock();
        loop {
            let n = reg.next_instance;
            reg.next_instance = reg.next_instance.wrapping_add(1);
            let name = InstanceName::new(&format!("{INSTANCE_PREFIX}{n}"))
                .expect("metropolis-trace-<digits> is a valid instance name");
            if !reg.claimed.contains(&Target::Instance(name.clone())) {
                return name;
            }
        }
    }
}

/// How the instances of sessions begin: `metropolis-trace-<n>`.
pub const INSTANCE_PREFIX: &str = "metropolis-trace-";

/// Removes the instances a previous run of this program left in tracefs
/// (named with [`INSTANCE_PREFIX`]: a crash skips a session's teardown,
/// and the kernel keeps an instance's buffers until it is removed). Call
/// once when the service starts, before any session: the numbering of
/// [`TraceBuffers::fresh_instance_name`] starts again at 0 and would
/// collide with them. Returns how many it removed; failures are logged.
pub fn remove_stale_instances(tracefs: &dyn Tracefs) -> usize {
    let names = match tracefs.instances() {
        Ok(names) => names,
        Err(e) => {
            tracing::debug!(error = %e, "no tracefs instances to look through");
            return 0;
        }
    };
    let mut removed = 0;
    for name in names.iter().filter(|n| n.starts_with(INSTANCE_PREFIX)) {
        match tracefs.rmdir(&format!("instances/{name}")) {
            Ok(()) => {
                removed += 1;
                tracing::warn!(instance = %name, "removed a tracefs instance left by a previous run");
            }
            Err(e) => tracing::warn!(
                instance = %name,
                error = %e,
                "cannot remove a tracefs instance left by a previous run"
            ),
        }
    }
    removed
}

/// A claimed buffer; dropping it releases the claim.
#[derive(Debug)]
pub struct BufferClaim {
    buffers: TraceBuffers,
    target: Target,
}

impl BufferClaim {
    /// The claimed buffer.
    pub fn target(&self) -> &Target {
        &self.target
    }
}

impl Drop for BufferClaim {
    fn drop(&mut self) {
        let waiters = {
            let mut reg = self.buffers.lock();
            reg.claimed.remove(&self.target);
            std::mem::take(&mut reg.waiters)
        };
        waiters.into_values().for_each(Waker::wake);
    }
}

/// The future of [`TraceBuffers::released`].
#[derive(Debug)]
#[must_use = "a future does nothing unless polled"]
pub struct Released {
    buffers: TraceBuffers,
    target: Target,
    /// This future's key in the registry's waiters, once it waited.
    waiter: Option<u64>,
}

impl Future for Released {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        let mut reg = this.buffers.lock();
        if !reg.claimed.contains(&this.target) {
            if let Some(id) = this.waiter.take() {
                reg.waiters.remove(&id);
            }
            return Poll::Ready(());
        }
        let id = *this.waiter.get_or_insert_with(|| {
            reg.next_waiter = reg.next_waiter.wrapping_add(1);
            reg.next_waiter
        });
        reg.waiters.insert(id, cx.waker().clone());
        Poll::Pending
    }
}

impl Drop for Released {
    fn drop(&mut self) {
        if let Some(id) = self.waiter {
            self.buffers.lock().waiters.remove(&id);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn poll(f: &mut Released) -> Poll<()> {
        Pin::new(f).poll(&mut Context::from_waker(Waker::noop()))
    }

    #[test]
    fn released_resolves_at_the_release_and_waiters_do_not_pile_up() {
        let buffers = TraceBuffers::new();
        assert!(poll(&mut buffers.released(Target::Global)).is_ready());
        let claim = buffers.claim(Target::Global).unwrap();
        // Callers that gave up leave nothing behind.
        for _ in 0..100 {
            let mut gave_up = buffers.released(Target::Global);
            assert!(poll(&mut gave_up).is_pending());
            assert!(poll(&mut gave_up).is_pending());
        }
        assert_eq!(buffers.lock().waiters.len(), 0);
        let mut waiting = buffers.released(Target::Global);
        assert!(poll(&mut waiting).is_pending());
        assert_eq!(buffers.lock().waiters.len(), 1);
        drop(claim);
        assert!(buffers.lock().waiters.is_empty());
        assert!(poll(&mut waiting).is_ready());
    }
}
