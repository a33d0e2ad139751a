//! The store's writer: group commit, snapshots and WAL rotation, lease
//! expiry, one [`StoreWriter::step`] at a time.

use std::path::PathBuf;
use std::sync::{Arc, MutexGuard};
use std::task::Waker;

use metropolis_core::store::{Record, Snapshot};
use metropolis_core::time::Instant;

use super::commit::CommitPolicy;
use super::disk::{Disk, LockGuard};
use super::wal::{self, KEEP_BUFFER_BYTES, Wal};
use super::{Completions, Queued, Shared, State, StoreOptions, snapshot};

/// What one [`StoreWriter::step`] did, and when the writer wants the next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum WriterStep {
    /// It wrote a batch (and completed its callers): step again.
    Wrote,
    /// Nothing to write now: step again once the waker given to `step`
    /// is woken, or at `until` on the store's clock (a lease to expire, a
    /// batch held open for more records), whichever comes first.
    Wait {
        /// The deadline, if there is one.
        until: Option<Instant>,
    },
    /// The store was closed and everything queued is written: the writer
    /// is done and can be dropped. (A failed store's writer waits for the
    /// close like an idle one.)
    Stopped,
}

/// The writer of an [`EmbeddedStore`](super::EmbeddedStore): the only code
/// that writes its files after open.
///
/// [`EmbeddedStore::open`](super::EmbeddedStore::open) runs it on a
/// thread of its own. [`EmbeddedStore::open_stepped`](super::EmbeddedStore::open_stepped)
/// hands it to the caller, who drives it by the contract of
/// [`step`](Self::step): a simulator does, on its own tasks and clock
/// ([`drive`](super::drive::drive) is that loop over core's `Timer`).
/// It holds the directory's lock: dropping it (a finished writer, or a
/// simulated crash) releases the directory.
pub struct StoreWriter {
    shared: Arc<Shared>,
    disk: Arc<dyn Disk>,
    dir: PathBuf,
    wal: Wal,
    options: StoreOptions,
    /// WAL size at which the next snapshot is due.
    snapshot_at: u64,
    /// An empty queue swapped with the state's at each batch, so that
    /// neither reallocates under load.
    spare: Vec<Queued>,
    /// Callers and watch streams to complete after a batch (reused).
    done: Completions,
    /// When to hold a batch open for more records.
    policy: CommitPolicy,
    /// Holds the directory's lock while the writer exists.
    _lock: Box<dyn LockGuard>,
}

impl std::fmt::Debug for StoreWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreWriter")
            .field("dir", &self.dir)
            .field("wal_size", &self.wal.size())
            .finish_non_exhaustive()
    }
}

impl StoreWriter {
    pub(super) fn new(
        shared: Arc<Shared>,
        (dir, wal, lock): (PathBuf, Wal, Box<dyn LockGuard>),
        options: StoreOptions,
    ) -> StoreWriter {
        let snapshot_at = options.snapshot_threshold;
        let policy = CommitPolicy::new(options.commit_delay, options.commit_batch);
        options.metrics.set_wal_size(wal.size());
        StoreWriter {
            shared,
            disk: options.disk.clone(),
            policy,
            dir,
            wal,
            options,
            snapshot_at,
            spare: Vec::new(),
            done: Completions::default(),
            _lock: lock,
        }
    }

    /// Does what is due now, on the store's clock: revokes the leases
    /// whose time ran out, then writes the queued records as one batch
    /// (one synchronous write) and completes their callers, unless the
    /// commit policy holds the batch open for more.
    ///
    /// The driving contract: call `step` until it returns
    /// [`WriterStep::Wait`]; then call it again once `waker` is woken (a
    /// record queued, a lease granted or revoked, the store closed) or
    /// `until` has passed, whichever is first, until it returns
    /// [`WriterStep::Stopped`]. A spurious call does no harm. The waker is
    /// the one kept for the next wake-up: pass the current task's (or
    /// thread's) each time.
    pub fn step(&mut self, waker: &Waker) -> WriterStep {
        let shared = self.shared.clone();
        let mut state = shared.lock();
        let now = state.clock.now();
        if state.failure.is_none() && !state.closed {
            let revoked = state.mem.handle_timeout(now);
            for id in &revoked {
                state.queue_record(&Record::LeaseRevoke(*id));
            }
            if !revoked.is_empty() {
                tracing::debug!("leases expired: {revoked:?}");
                drop(state.maybe_compact());
            }
        }
        if state.queue.is_empty() {
            if state.closed {
                return WriterStep::Stopped;
            }
            let until = if state.failure.is_none() {
                state.mem.poll_timeout()
            } else {
                None
            };
            state.writer_gathering = false;
            state.park_writer(waker);
            return WriterStep::Wait { until };
        }
        if let Some(until) = self
            .policy
            .hold_until(state.queue.len(), state.first_queued)
            && !state.closed
            && now < until
        {
            // Held open: woken at `until`, or once the batch reaches its
            // target size (`State::take_writer_wake`), or on close.
            state.writer_gathering = true;
            state.park_writer(waker);
            return WriterStep::Wait { until: Some(until) };
        }
        state.writer_gathering = false;
        state.writer_waker = None;
        self.policy.taken(state.queue.len(), now);
        self.write_batch(&shared, state);
        WriterStep::Wrote
    }

    /// Writes everything queued with one sync, completes its waiters, and
    /// rotates the WAL if it has grown past the threshold.
    fn write_batch(&mut self, shared: &Shared, mut state: MutexGuard<'_, State>) {
        let mut batch = std::mem::replace(&mut state.queue, std::mem::take(&mut self.spare));
        let Some(last) = batch.last() else {
            self.spare = batch;
            return;
        };
        let (last_seq, last_revision) = (last.seq, last.revision);
        let bytes: usize = batch.iter().map(|q| q.frame.len()).sum();
        // The model now holds exactly the records up to `last_seq`: a
        // snapshot taken here pairs with that sequence number.
        let snapshot: Option<Snapshot> =
            (self.wal.size() + bytes as u64 >= self.snapshot_at).then(|| state.mem.snapshot());
        drop(state);

        let started = self.options.clock.now();
        let result = self.wal.append(batch.iter().map(|q| q.frame.as_slice()));
        if result.is_ok() {
            let took = self.options.clock.now().saturating_duration_since(started);
            self.options
                .metrics
                .committed(batch.len(), bytes, took.as_secs_f64(), self.wal.size());
        }
        let mut state = shared.lock();
        if let Err(e) = result {
            state.fail(format!(
                "writing {} failed: {e}",
                wal::path(&self.dir).display()
            ));
            return;
        }
        state.mark_durable(last_seq, last_revision, &mut self.done);
        // Waking a caller from this thread can take a system call (the
        // runtime unparks a worker): done outside the lock, so that the
        // workers queueing the next changes do not sleep on it meanwhile.
        // Only this thread completes callers, so they still learn in order.
        drop(state);
        self.done.complete();
        // Freed after the acknowledgements went out.
        batch.clear();
        if batch.capacity() * std::mem::size_of::<Queued>() <= KEEP_BUFFER_BYTES {
            self.spare = batch;
        }

        if let Some(snapshot) = snapshot {
            self.rotate(shared, last_seq, &snapshot);
        }
    }

    /// Writes a snapshot containing every record up to `last_seq`, then
    /// starts a fresh WAL after it.
    fn rotate(&mut self, shared: &Shared, last_seq: u64, snapshot: &Snapshot) {
        match snapshot::write(self.disk.as_ref(), &self.dir, last_seq, snapshot) {
            Ok(size) => self.options.metrics.snapshot_written(size),
            Err(e) => {
                // The WAL still holds everything: go on with it, retry later.
                tracing::warn!("writing a snapshot in {} failed: {e}", self.dir.display());
                self.snapshot_at = self.wal.size() + self.options.snapshot_threshold;
                return;
            }
        }
        let wal = match Wal::prepare(
            self.disk.as_ref(),
            &self.dir,
            last_seq + 1,
            self.options.direct_io,
        ) {
            Ok(wal) => wal,
            Err(e) => {
                // The old WAL is untouched and still in use: go on with it.
                tracing::warn!("preparing a new WAL in {} failed: {e}", self.dir.display());
                self.snapshot_at = self.wal.size() + self.options.snapshot_threshold;
                return;
            }
        };
        if let Err(e) = wal.install(self.disk.as_ref(), &self.dir) {
            // The new WAL may or may not have replaced the old one under its
            // name: appending to either could lose acknowledged records at
            // the next open. Stop accepting changes.
            shared.lock().fail(format!(
                "installing a new WAL in {} after a snapshot failed: {e}",
                self.dir.display()
            ));
            return;
        }
        tracing::info!(
            "snapshot written at record {last_seq}, revision {}; WAL restarted",
            snapshot.revision
        );
        self.wal = wal;
        self.options.metrics.set_wal_size(self.wal.size());
        self.snapshot_at = self.options.snapshot_threshold;
    }
}
