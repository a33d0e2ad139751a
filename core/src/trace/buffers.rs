//! Trace buffers (the global one, or an instance) and the registry that
//! keeps one session per buffer.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

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
}

/// The registry of buffers in use, shared by every session of a process
/// (clone the handle; clones share the set). A session claims its buffer
/// before it writes anything and releases it once its teardown is done, so
/// a second session on the same buffer gets
/// [`TraceError::AlreadyInProgress`] (FailedPrecondition, "a trace is
/// already in progress") instead of sharing a tracer.
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
        self.buffers.lock().claimed.remove(&self.target);
    }
}
