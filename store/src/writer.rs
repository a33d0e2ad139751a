//! Recovery at open, and the writer thread: group commit, snapshots and WAL
//! rotation, lease expiry.

use std::path::{Path, PathBuf};
use std::sync::{Arc, MutexGuard};

use metropolis_core::store::{MemStore, Record, Snapshot};
use metropolis_core::time::Instant;

use super::commit::CommitPolicy;
use super::disk::Disk;
use super::error::{Corruption, OpenError, io_err};
use super::wal::{self, FORMAT_VERSION_1, KEEP_BUFFER_BYTES, Wal};
use super::wal_read;
use super::{Completions, Queued, Shared, State, StoreOptions, snapshot};

/// The state rebuilt from the directory.
pub(super) struct Recovered {
    pub(super) mem: MemStore,
    /// Sequence number of the last record in the state.
    pub(super) last_seq: u64,
    /// The WAL, open for appending.
    pub(super) wal: Wal,
    /// Number of WAL records applied.
    pub(super) replayed: usize,
}

/// Loads the snapshot and replays the WAL of `dir`; zeroes a torn final
/// batch (or, in a version 1 WAL, ignores a torn tail); creates the WAL of
/// a fresh directory.
/// A version 1 WAL is replaced by a snapshot and a fresh version 2 WAL.
/// `direct`: see [`StoreOptions::direct_io`].
pub(super) fn recover(
    disk: &dyn Disk,
    dir: &Path,
    now: Instant,
    direct: bool,
) -> Result<Recovered, OpenError> {
    let snap = snapshot::read(disk, dir)?;
    let (mut mem, snapshot_seq) = match snap {
        Some((seq, snap)) => (MemStore::from_snapshot(snap, now), seq),
        None => (MemStore::new(), 0),
    };
    let wal_path = wal::path(dir);
    let Some(data) = disk.read(&wal_path).map_err(io_err(&wal_path, "read"))? else {
        if snapshot_seq != 0 {
            return Err(OpenError::Corrupt {
                path: wal_path,
                offset: 0,
                problem: Corruption::MissingWal,
            });
        }
        let wal = Wal::create(disk, dir, 1, direct).map_err(io_err(&wal_path, "create"))?;
        return Ok(Recovered {
            mem,
            last_seq: 0,
            wal,
            replayed: 0,
        });
    };
    let contents = wal_read::read(&wal_path, &data)?;
    drop(data);
    if contents.first_seq == 0 || contents.first_seq > snapshot_seq + 1 {
        return Err(OpenError::Corrupt {
            path: wal_path,
            offset: 0,
            problem: Corruption::MissingRecords {
                snapshot_seq,
                wal_first_seq: contents.first_seq,
            },
        });
    }
    let mut replayed = 0;
    let mut seq = contents.first_seq;
    for (offset, record) in &contents.records {
        if seq > snapshot_seq {
            mem.apply(record, now).map_err(|e| OpenError::Corrupt {
                path: wal_path.clone(),
                offset: *offset,
                problem: Corruption::Inconsistent(e),
            })?;
            replayed += 1;
        }
        seq += 1;
    }
    let last_in_wal = seq - 1;
    if contents.torn_len > 0 {
        tracing::warn!(
            "{}: discarding {} bytes at offset {}: an unfinished write from a crash, never acknowledged",
            wal_path.display(),
            contents.torn_len,
            contents.valid_len
        );
    }
    let wal = if last_in_wal <= snapshot_seq {
        // Everything in the WAL is in the snapshot (a crash between writing
        // a snapshot and starting the next WAL): start the next WAL now.
        Wal::create(disk, dir, snapshot_seq + 1, direct).map_err(io_err(&wal_path, "create"))?
    } else if contents.version == FORMAT_VERSION_1 {
        // A WAL of the first format: its records go into a snapshot, and
        // the log continues in the current format.
        snapshot::write(disk, dir, last_in_wal, &mem.snapshot())
            .map_err(io_err(&snapshot::path(dir), "write"))?;
        tracing::info!(
            "{}: converted a version 1 WAL (records up to {last_in_wal}) into a snapshot and a version {} WAL",
            wal_path.display(),
            wal::FORMAT_VERSION
        );
        Wal::create(disk, dir, last_in_wal + 1, direct).map_err(io_err(&wal_path, "create"))?
    } else {
        Wal::reopen(
            disk,
            &wal_path,
            contents.valid_len,
            contents.valid_len + contents.torn_len,
            direct,
        )
        .map_err(io_err(&wal_path, "reopen"))?
    };
    Ok(Recovered {
        mem,
        last_seq: last_in_wal.max(snapshot_seq),
        wal,
        replayed,
    })
}

/// The writer thread's own state.
pub(super) struct Writer {
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
}

impl Writer {
    pub(super) fn new(
        disk: Arc<dyn Disk>,
        dir: PathBuf,
        wal: Wal,
        options: StoreOptions,
    ) -> Writer {
        let snapshot_at = options.snapshot_threshold;
        let policy = CommitPolicy::new(options.commit_delay, options.commit_batch);
        Writer {
            disk,
            policy,
            dir,
            wal,
            options,
            snapshot_at,
            spare: Vec::new(),
            done: Completions::default(),
        }
    }

    /// The thread's body: until the store is closed and its queue drained,
    /// write what is queued, expire leases, rotate the WAL.
    pub(super) fn run(mut self, shared: &Shared) {
        loop {
            let mut state = shared.lock();
            // Wait for records to write (or the close).
            loop {
                if state.failure.is_none() && !state.closed {
                    let revoked = state.mem.handle_timeout(shared.clock.now());
                    for id in &revoked {
                        state.queue_record(&Record::LeaseRevoke(*id));
                    }
                    if !revoked.is_empty() {
                        tracing::debug!("leases expired: {revoked:?}");
                        drop(state.maybe_compact());
                    }
                }
                if !state.queue.is_empty() {
                    break;
                }
                if state.closed {
                    return;
                }
                let deadline = if state.failure.is_none() {
                    state.mem.poll_timeout()
                } else {
                    None
                };
                state.writer_idle = true;
                state = match deadline {
                    Some(deadline) => {
                        let wait = deadline.saturating_duration_since(shared.clock.now());
                        shared
                            .writer_wake
                            .wait_timeout(state, wait)
                            .unwrap_or_else(std::sync::PoisonError::into_inner)
                            .0
                    }
                    None => shared
                        .writer_wake
                        .wait(state)
                        .unwrap_or_else(std::sync::PoisonError::into_inner),
                };
                state.writer_idle = false;
            }
            state = self.gather(shared, state);
            self.policy
                .taken(state.queue.len(), std::time::Instant::now());
            self.write_batch(shared, state);
        }
    }

    /// Holds the queued batch open while the policy expects more records
    /// soon: until it reaches the target size, the delay has passed since
    /// its first record, or the store closes or fails.
    fn gather<'a>(
        &self,
        shared: &'a Shared,
        mut state: MutexGuard<'a, State>,
    ) -> MutexGuard<'a, State> {
        let Some(until) = self
            .policy
            .hold_until(state.queue.len(), state.first_queued)
        else {
            return state;
        };
        state.writer_gathering = true;
        while !state.closed && state.failure.is_none() && state.queue.len() < self.policy.target() {
            let now = std::time::Instant::now();
            if now >= until {
                break;
            }
            state = shared
                .writer_wake
                .wait_timeout(state, until - now)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
        state.writer_gathering = false;
        state
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

        let result = self.wal.append(batch.iter().map(|q| q.frame.as_slice()));
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
        if let Err(e) = snapshot::write(self.disk.as_ref(), &self.dir, last_seq, snapshot) {
            // The WAL still holds everything: go on with it, retry later.
            tracing::warn!("writing a snapshot in {} failed: {e}", self.dir.display());
            self.snapshot_at = self.wal.size() + self.options.snapshot_threshold;
            return;
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
        self.snapshot_at = self.options.snapshot_threshold;
    }
}
