//! The durable embedded store: the store model ([`MemStore`]) made durable
//! in a data directory with a write-ahead log and snapshots.
//!
//! # Why a WAL and snapshots of the one model
//!
//! The embedded store is the default deployment's etcd. Its semantics are
//! those of `metropolis_core::store::MemStore`, the pure machine the
//! simulator also runs, so tests of the simulator exercise the exact code
//! that serves a real node. Durability is layered on top by logging every
//! change as a [`Record`] and replaying the records at start: the model is
//! deterministic, so replay rebuilds the same state bit for bit. This needs
//! no database dependency (no sled, no SQLite) and keeps the on-disk format
//! small, documented and checked.
//!
//! # Writing
//!
//! A transaction is encoded and framed (checksummed) by its caller, straight
//! from the borrowed request, then applied to the in-memory model under a
//! mutex and queued for a single dedicated writer thread (no async runtime:
//! the store is shared by tokio and smol programs alike). The writer takes
//! everything queued, appends it to the WAL as one batch with one
//! synchronous write, then completes every waiting caller (group commit: N
//! concurrent transactions cost one sync). While transactions arrive fast
//! enough, the writer holds a batch open a little for more
//! ([`StoreOptions::commit_delay`], `commit.rs`). A caller's future
//! resolves only once its record is on disk. A read-only transaction resolves at once when nothing is in flight,
//! else once what it may have read is durable. Watch streams deliver only
//! durable revisions. If a write or sync fails, the store is failed: that
//! change and every later one resolve to [`StoreError::Unavailable`] naming
//! the I/O error, and nothing unsynced is ever acknowledged.
//!
//! The writer thread also expires leases (sleeping until the model's next
//! lease deadline) and logs their revocations. The writer is a
//! [`StoreWriter`] stepped by its thread; [`EmbeddedStore::open_stepped`]
//! hands it to the caller instead, to drive on its own tasks by the
//! contract of [`StoreWriter::step`] (the simulator does, on its virtual
//! time: leases and the commit policy read [`StoreOptions::clock`]). History for watches is kept
//! for the last [`StoreOptions::history_revisions`] revisions; compactions
//! are logged records too.
//!
//! # On-disk format
//!
//! The directory (created with mode 0700) holds:
//!
//! - `LOCK`: held with an exclusive file lock while the store is open, so a
//!   second process fails clearly instead of corrupting the files.
//! - `wal`: a 24-byte header (magic `MTRPWAL\n`, u32 format version 2, u64
//!   sequence number of its first record, CRC-32C of those 20 bytes), then
//!   one batch per group commit (several, one write each, beyond 128 MiB;
//!   magic `MTRB`, u32 length and CRC-32C of
//!   its frames, CRC-32C of those 12 bytes), each holding frames
//!   `[u32 length][u32 CRC-32C of payload][payload]`, each payload an
//!   encoded [`Record`] (protobuf with a schema version), then zeros up to
//!   the preallocated end of the file. Integers are little-endian. The file
//!   grows in preallocated steps of written zeros, and each commit is one
//!   `O_DIRECT | O_DSYNC` write of whole 4 KiB blocks (through the page
//!   cache with `O_DSYNC` where the file system refuses `O_DIRECT`, or with
//!   [`StoreOptions::direct_io`] off): the reasons and measurements are in
//!   `wal.rs`.
//! - `snapshot` (once the WAL has grown past
//!   [`StoreOptions::snapshot_threshold`]): magic `MTRPSNAP`, u32 format
//!   version, u64 sequence number of the last record it contains, u64
//!   payload length, CRC-32C of all that and the payload, then the encoded
//!   [`Snapshot`](metropolis_core::store::Snapshot).
//!
//! Rotation: the snapshot is written to `snapshot.tmp`, synced, renamed
//! over `snapshot` and the directory synced; then a fresh WAL starting at
//! the next sequence number is written to `wal.tmp`, synced and renamed
//! over `wal`. A crash at any point leaves a directory that opens to exactly
//! the acknowledged data: before the snapshot rename, the old snapshot and
//! the full WAL; between the renames, the new snapshot and the old WAL
//! whose records it already contains (skipped by sequence number); after,
//! the new snapshot and the new WAL.
//!
//! # Opening
//!
//! Open loads the snapshot (if any) and replays the WAL records after it.
//! A torn final batch (a crash during a write that was never acknowledged:
//! any of its 512-byte sectors may be missing, reading as zeros) is dropped
//! with a warning and zeroed. Any other damage (a batch or frame checksum
//! mismatch followed by a valid batch or with no sector of the batch
//! reading as zeros, a bad frame inside a batch whose checksum matches, an undecodable
//! or inapplicable record, a bad header, a damaged snapshot, records
//! missing between snapshot and WAL) is an [`OpenError`] naming the file
//! and byte offset: the store refuses to start rather than silently lose
//! acknowledged data. The rule that tells the two apart is in
//! `wal_read.rs`. Before it zeroes a torn batch or refuses a file as
//! damaged, the store reads the file again: other bytes the second time
//! (a failing device, cable or memory) fail the open as an I/O error and
//! change nothing, so a sector misread once cannot erase an acknowledged
//! batch. The block the next commit rewrites is taken from the bytes
//! recovery checked, not read again. Leases restart with their full TTL,
//! like etcd's.
//!
//! A WAL of format version 1 (frames without batches, written by earlier
//! builds) is read with its own rules (a final frame cut short or a
//! zero-filled tail is torn) and replaced at open by a snapshot and a
//! version 2 WAL.
//!
//! Assumed of the device, as by every write-ahead log: a sector being
//! written holds afterwards either its old or its new contents. A commit
//! rewrites the block holding the end of the previous one with the same
//! bytes there, so a torn commit cannot damage an acknowledged one.

#![forbid(unsafe_code)]

/// Whether the bug `$name` (a `metropolis_core::canary::Canary`) is
/// planted on this thread: only with the `canary` feature, which only the
/// simulator turns on.
macro_rules! canary_planted {
    ($name:ident) => {{
        #[cfg(feature = "canary")]
        let planted = metropolis_core::canary::planted(metropolis_core::canary::Canary::$name);
        #[cfg(not(feature = "canary"))]
        let planted = false;
        planted
    }};
}

mod aligned;
mod backup;
mod commit;
mod crc;
pub mod disk;
pub mod drive;
mod error;
mod metrics;
mod recover;
mod snapshot;
mod wal;
mod wal_read;
mod watch;
mod writer;

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::Waker;
use std::thread::JoinHandle;
use std::time::Duration;

use futures::FutureExt;
use futures::channel::oneshot;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use metropolis_core::ports::Readiness;
use metropolis_core::ports::{KvStore, MonotonicClock, WatchBatch};
use metropolis_core::store::{
    CompactedHistory, KeyRange, KeyValue, LeaseId, LeaseInfo, MemStore, Op, Record, Revision,
    StoreError, Txn, TxnResponse, WatchId, encode_record, encode_txn_record, txn_record_len,
};
use metropolis_core::time::Instant;

pub use backup::{Backup, RestoreError, Restored, restore};
pub use disk::{Disk, OsDisk};
pub use drive::HostClock;
pub use error::{Corruption, OpenError};
pub use metrics::StoreMetrics;
pub use writer::{StoreWriter, WriterStep};

/// Name of the lock file in the store directory.
const LOCK_FILE: &str = "LOCK";

/// Tuning of an [`EmbeddedStore`]: start from [`StoreOptions::default`]
/// and change what you need with the `with_*` methods (new fields may be
/// added, so the struct cannot be written out in full outside this crate).
#[derive(Clone)]
#[non_exhaustive]
pub struct StoreOptions {
    /// WAL size in bytes past which a snapshot is written and the WAL
    /// started afresh. Default 64 MiB.
    pub snapshot_threshold: u64,
    /// Number of most recent revisions whose events stay available to
    /// watches; older ones are compacted. Default 10 000.
    pub history_revisions: i64,
    /// Group commit: the longest a change waits for others to share its
    /// WAL sync, taken only while changes arrive fast enough that at least
    /// two more are expected within it (a lone client never waits). Zero
    /// disables it. Default 200 µs. See `commit.rs` for the measurements
    /// behind it.
    pub commit_delay: Duration,
    /// Group commit: a batch this large is written without waiting longer.
    /// Default 64.
    pub commit_batch: usize,
    /// Write the WAL with `O_DIRECT` (bypassing the page cache) where the
    /// file system accepts it; the WAL falls back to page-cache writes by
    /// itself where it does not. Default on; off, every write goes through
    /// the page cache (same format, same durability, more CPU per commit).
    pub direct_io: bool,
    /// What the store's files are written to. Default [`OsDisk`], the
    /// operating system's file system; a simulator gives a disk of its own.
    pub disk: Arc<dyn Disk>,
    /// The clock of leases and of the commit policy. Default
    /// [`HostClock`]; a simulator gives its virtual time.
    pub clock: Arc<dyn MonotonicClock>,
    /// Where commits, batch sizes, sync times and file sizes are recorded.
    /// Default: families nobody registered.
    pub metrics: StoreMetrics,
}

impl std::fmt::Debug for StoreOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreOptions")
            .field("snapshot_threshold", &self.snapshot_threshold)
            .field("history_revisions", &self.history_revisions)
            .field("commit_delay", &self.commit_delay)
            .field("commit_batch", &self.commit_batch)
            .field("direct_io", &self.direct_io)
            .field("disk", &self.disk)
            .finish_non_exhaustive()
    }
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            snapshot_threshold: 64 << 20,
            history_revisions: 10_000,
            commit_delay: Duration::from_micros(200),
            commit_batch: 64,
            direct_io: true,
            disk: Arc::new(OsDisk),
            clock: Arc::new(HostClock::new()),
            metrics: StoreMetrics::default(),
        }
    }
}

impl StoreOptions {
    /// Sets [`snapshot_threshold`](Self::snapshot_threshold).
    pub fn with_snapshot_threshold(mut self, bytes: u64) -> Self {
        self.snapshot_threshold = bytes;
        self
    }

    /// Sets [`history_revisions`](Self::history_revisions).
    pub fn with_history_revisions(mut self, revisions: i64) -> Self {
        self.history_revisions = revisions;
        self
    }

    /// Sets [`commit_delay`](Self::commit_delay).
    pub fn with_commit_delay(mut self, delay: Duration) -> Self {
        self.commit_delay = delay;
        self
    }

    /// Sets [`commit_batch`](Self::commit_batch).
    pub fn with_commit_batch(mut self, records: usize) -> Self {
        self.commit_batch = records;
        self
    }

    /// Sets [`direct_io`](Self::direct_io).
    pub fn with_direct_io(mut self, direct: bool) -> Self {
        self.direct_io = direct;
        self
    }

    /// Sets [`disk`](Self::disk).
    pub fn with_disk(mut self, disk: Arc<dyn Disk>) -> Self {
        self.disk = disk;
        self
    }

    /// Sets [`metrics`](Self::metrics).
    pub fn with_metrics(mut self, metrics: StoreMetrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// Sets [`clock`](Self::clock).
    pub fn with_clock(mut self, clock: Arc<dyn MonotonicClock>) -> Self {
        self.clock = clock;
        self
    }
}

/// The store's clock ([`StoreOptions::clock`]).
#[derive(Clone)]
struct Clock(Arc<dyn MonotonicClock>);

impl Clock {
    fn now(&self) -> Instant {
        self.0.now()
    }
}

impl std::fmt::Debug for Clock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Clock")
    }
}

/// A record applied to the model, waiting for the writer.
#[derive(Debug)]
struct Queued {
    seq: u64,
    /// The record's WAL frame (header and encoded record), built by the
    /// caller so that the writer only concatenates.
    frame: Vec<u8>,
    /// The model's revision after this record.
    revision: Revision,
}

/// Everything shared between callers, watch streams and the writer.
#[derive(Debug)]
struct State {
    /// The writer's waker while it waits for work (set by
    /// [`StoreWriter::step`]): only then is it worth a wake-up (a busy
    /// writer re-checks the queue after each batch), which saves a futex
    /// call per transaction under load.
    writer_waker: Option<Waker>,
    /// Whether the writer is holding a batch open for more records: it is
    /// woken only once the batch reaches `commit_batch`.
    writer_gathering: bool,
    /// See [`StoreOptions::commit_batch`].
    commit_batch: usize,
    /// The store's clock.
    clock: Clock,
    /// When the first record of the current queue was queued.
    first_queued: Instant,
    mem: MemStore,
    /// Applied to `mem`, not yet taken by the writer, in order.
    queue: Vec<Queued>,
    /// Sequence number of the next record.
    next_seq: u64,
    /// Every record up to this one is durable.
    durable_seq: u64,
    /// Every revision up to this one is durable.
    durable_revision: Revision,
    /// Callers waiting for a record to be durable, in sequence order.
    waiters: VecDeque<(u64, oneshot::Sender<Result<(), StoreError>>)>,
    /// Watch streams waiting for events (a hash map: draining it keeps its
    /// allocation).
    wakers: HashMap<WatchId, Waker>,
    /// Set when a write failed: the store accepts nothing more.
    failure: Option<String>,
    /// Set by close: the writer drains the queue and stops.
    closed: bool,
    history_revisions: i64,
    /// Woken whenever the store fails or closes ([`StoreHealth`]); kept.
    health: Vec<Waker>,
}

impl State {
    /// Fails unless the store accepts changes.
    fn check_open(&self) -> Result<(), StoreError> {
        if let Some(failure) = &self.failure {
            return Err(StoreError::Unavailable(format!(
                "the embedded store failed and accepts no more requests: {failure}"
            )));
        }
        if self.closed {
            return Err(StoreError::Unavailable(
                "the embedded store is closed".into(),
            ));
        }
        Ok(())
    }

    /// Queues a record applied to the model; returns its sequence number.
    fn queue_record(&mut self, record: &Record) -> u64 {
        self.queue_frame(wal::frame(&encode_record(record)))
    }

    /// Queues the WAL frame of a record applied to the model; returns its
    /// sequence number.
    fn queue_frame(&mut self, frame: Vec<u8>) -> u64 {
        if self.queue.is_empty() {
            self.first_queued = self.clock.now();
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.queue.push(Queued {
            seq,
            frame,
            revision: self.mem.revision(),
        });
        seq
    }

    /// The writer's waker if it needs a wake-up for what is queued: it
    /// waits for work, or it holds a batch that has now reached its target
    /// size. Takes the waker, so that the changes queued before the writer
    /// runs again do not wake it once each.
    fn take_writer_wake(&mut self) -> Option<Waker> {
        if self.writer_gathering {
            if self.queue.len() < self.commit_batch {
                return None;
            }
            self.writer_gathering = false;
        }
        self.writer_waker.take()
    }

    /// The writer's waker, whatever it waits for (a lease changed, the
    /// store closes).
    fn take_writer_waker(&mut self) -> Option<Waker> {
        self.writer_gathering = false;
        self.writer_waker.take()
    }

    /// Keeps `waker` as the writer's, to wake once there is work.
    fn park_writer(&mut self, waker: &Waker) {
        match &mut self.writer_waker {
            Some(kept) => kept.clone_from(waker),
            None => self.writer_waker = Some(waker.clone()),
        }
    }

    /// A receiver resolving once record `seq` is durable (`None`: it is).
    fn wait_for(&mut self, seq: u64) -> Option<oneshot::Receiver<Result<(), StoreError>>> {
        if self.durable_seq >= seq {
            return None;
        }
        let (tx, rx) = oneshot::channel();
        self.waiters.push_back((seq, tx));
        Some(rx)
    }

    /// A receiver resolving once everything queued so far is durable.
    fn barrier(&mut self) -> Option<oneshot::Receiver<Result<(), StoreError>>> {
        self.wait_for(self.next_seq - 1)
    }

    /// Compacts watch history beyond the configured number of revisions
    /// (never past the durable revision, so watches can catch up), in
    /// steps of a sixteenth of it to keep compaction records rare.
    /// Returns the history dropped, for the caller to free once the lock is
    /// released (hundreds of revisions' events: freeing them under the
    /// lock held every caller up).
    #[must_use = "the history is freed where it is dropped: after releasing the lock"]
    fn maybe_compact(&mut self) -> Option<CompactedHistory> {
        let keep = self.history_revisions.max(0);
        let target = (self.mem.revision() - keep).min(self.durable_revision);
        if target - self.mem.compact_revision() <= keep / 16 {
            return None;
        }
        let compacted = self.mem.compact_detached(target).ok()?;
        self.queue_record(&Record::Compact(target));
        self.wake_watchers();
        Some(compacted)
    }

    /// Records that everything up to `seq` (revision `revision`) is
    /// durable. The callers and watch streams to tell go into `done`, which
    /// the writer completes before releasing the lock. (Completing them
    /// after releasing it, so that callers could queue meanwhile, measured
    /// slower under `metropolis-load update-tls` on two shared cores: p50
    /// 4.0 to 4.2 ms against 3.0 to 3.3 ms, 3 to 28 % fewer requests/s in
    /// six interleaved runs.)
    fn mark_durable(&mut self, seq: u64, revision: Revision, done: &mut Completions) {
        self.durable_seq = seq;
        while self.waiters.front().is_some_and(|(s, _)| *s <= seq) {
            if let Some((_, tx)) = self.waiters.pop_front() {
                done.acks.push(tx);
            }
        }
        if revision > self.durable_revision {
            self.durable_revision = revision;
            done.wakers
                .extend(self.wakers.drain().map(|(_, waker)| waker));
        }
        done.compacted = self.maybe_compact();
    }

    /// Fails the store: every pending and later request gets `Unavailable`.
    fn fail(&mut self, why: String) {
        tracing::error!("embedded store failed: {why}");
        let err = StoreError::Unavailable(format!(
            "the embedded store failed and accepts no more requests: {why}"
        ));
        self.failure = Some(why);
        self.queue.clear();
        // Health first: no caller learns of the failure before health does.
        self.wake_health();
        for (_, tx) in self.waiters.drain(..) {
            let answer = if canary_planted!(AckFailedWrite) {
                Ok(())
            } else {
                Err(err.clone())
            };
            let _ = tx.send(answer);
        }
        self.wake_watchers();
    }

    fn wake_health(&self) {
        for waker in &self.health {
            waker.wake_by_ref();
        }
    }

    fn wake_watchers(&mut self) {
        for (_, waker) in self.wakers.drain() {
            waker.wake();
        }
    }
}

/// Callers and watch streams to complete after a batch, and the history
/// its compaction dropped (see [`State::mark_durable`]). Reused by the
/// writer.
#[derive(Debug, Default)]
struct Completions {
    acks: Vec<oneshot::Sender<Result<(), StoreError>>>,
    wakers: Vec<Waker>,
    compacted: Option<CompactedHistory>,
}

impl Completions {
    /// Acknowledges the callers, in sequence order, wakes the watch
    /// streams, then frees the compacted history.
    fn complete(&mut self) {
        for tx in self.acks.drain(..) {
            let _ = tx.send(Ok(()));
        }
        for waker in self.wakers.drain(..) {
            waker.wake();
        }
        self.compacted = None;
    }
}

/// The state shared by the store's handles, its watch streams and its
/// writer.
#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
}

impl Shared {
    /// Locks the state. A panic while it was held would be a bug in this
    /// module or the model; the other users then go on (and can still
    /// close the store) instead of panicking in turn.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Waits for a durability receiver, mapping a dropped sender (the writer
/// stopped) to `Unavailable`.
async fn durable(rx: Option<oneshot::Receiver<Result<(), StoreError>>>) -> Result<(), StoreError> {
    match rx {
        None => Ok(()),
        Some(rx) => rx.await.unwrap_or_else(|_| {
            Err(StoreError::Unavailable(
                "the embedded store's writer stopped".into(),
            ))
        }),
    }
}

/// The store model made durable in a directory: see the [module
/// documentation](self) for the design and the on-disk format.
///
/// Requests are applied when called (not when their future is first
/// polled); the future resolves once the change is durable. Dropping the
/// store (or [`close`](Self::close)) writes what is queued, stops the
/// writer thread and releases the directory.
#[derive(Debug)]
pub struct EmbeddedStore {
    shared: Arc<Shared>,
    /// The writer's thread; `None` when the caller drives the writer
    /// ([`open_stepped`](Self::open_stepped)).
    writer: Mutex<Option<JoinHandle<()>>>,
    dir: PathBuf,
}

impl EmbeddedStore {
    /// Opens (or creates, with mode 0700) the store in `dir`: takes the
    /// directory's lock, loads the snapshot, replays the WAL, and starts
    /// the writer thread. Fails without changing anything acknowledged if
    /// a file is damaged, or if another process has the store open.
    pub fn open(dir: &Path, options: StoreOptions) -> Result<EmbeddedStore, OpenError> {
        let clock = options.clock.clone();
        let (mut store, writer) = Self::open_stepped(dir, options)?;
        let handle = std::thread::Builder::new()
            .name("embedded-store-writer".into())
            .spawn(move || drive::on_this_thread(writer, clock))
            .map_err(error::io_err(dir, "start the writer thread for"))?;
        store.writer = Mutex::new(Some(handle));
        Ok(store)
    }

    /// [`open`](Self::open) without the writer thread: the caller drives
    /// the [`StoreWriter`] by the contract of [`StoreWriter::step`] (for
    /// example with [`drive::drive`] on its own runtime). Nothing becomes
    /// durable, and no lease expires, while it is not driven. Dropping
    /// the store does not wait for the writer: the caller steps it until
    /// [`WriterStep::Stopped`] (or drops it, as a crash does).
    pub fn open_stepped(
        dir: &Path,
        options: StoreOptions,
    ) -> Result<(EmbeddedStore, StoreWriter), OpenError> {
        let clock = Clock(options.clock.clone());
        let disk = options.disk.clone();
        disk.create_dir(dir)
            .map_err(error::io_err(dir, "create directory"))?;
        let lock_path = dir.join(LOCK_FILE);
        let lock = match disk.lock(&lock_path) {
            Ok(Some(lock)) => lock,
            Ok(None) => return Err(OpenError::Locked { path: lock_path }),
            Err(e) => return Err(error::io_err(&lock_path, "lock")(e)),
        };
        for tmp in [wal::WAL_TMP_FILE, snapshot::SNAPSHOT_TMP_FILE] {
            let path = dir.join(tmp);
            match disk.remove(&path) {
                Ok(true) => tracing::info!("removed unfinished {}", path.display()),
                Ok(false) => {}
                Err(e) => return Err(error::io_err(&path, "remove")(e)),
            }
        }

        let recovered = recover::recover(disk.as_ref(), dir, clock.now(), options.direct_io)?;
        let mem = recovered.mem;
        tracing::info!(
            "opened embedded store {}: revision {}, {} WAL records replayed, WAL written {}",
            dir.display(),
            mem.revision(),
            recovered.replayed,
            if recovered.wal.is_direct() {
                "with direct I/O"
            } else {
                "through the page cache"
            }
        );
        let state = State {
            writer_waker: None,
            writer_gathering: false,
            commit_batch: options.commit_batch.max(1),
            first_queued: clock.now(),
            clock,
            durable_revision: mem.revision(),
            mem,
            queue: Vec::new(),
            next_seq: recovered.last_seq + 1,
            durable_seq: recovered.last_seq,
            waiters: VecDeque::new(),
            wakers: HashMap::new(),
            failure: None,
            closed: false,
            history_revisions: options.history_revisions,
            health: Vec::new(),
        };
        let shared = Arc::new(Shared {
            state: Mutex::new(state),
        });
        let writer = StoreWriter::new(
            shared.clone(),
            (dir.to_path_buf(), recovered.wal, lock),
            options,
        );
        let store = EmbeddedStore {
            shared,
            writer: Mutex::new(None),
            dir: dir.to_path_buf(),
        };
        Ok((store, writer))
    }

    /// The store's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whether the store accepts requests, as a condition of this
    /// instance's health ([`Readiness`]): unready once a write or sync
    /// failed (the store then refuses every change for good) or once it
    /// is closed.
    pub fn health(&self) -> StoreHealth {
        StoreHealth {
            shared: self.shared.clone(),
        }
    }

    /// The latest durable revision.
    pub fn revision(&self) -> Revision {
        self.shared.lock().durable_revision
    }

    /// Runs a transaction; resolves once it is durable. Same as
    /// [`KvStore::txn`].
    pub fn txn(&self, txn: Txn) -> BoxFuture<'static, Result<TxnResponse, StoreError>> {
        let writes = txn
            .success
            .iter()
            .chain(&txn.failure)
            .any(|op| !matches!(op, Op::Range(_)));
        // Sized before applying, so that a transaction too large to log is
        // refused without changing anything; encoded and framed here, from
        // the borrowed transaction, outside the lock.
        let frame = if writes {
            let len = txn_record_len(&txn);
            if len > wal::MAX_RECORD_LEN {
                let why = format!(
                    "transaction too large: {len} bytes encoded, the limit is {}",
                    wal::MAX_RECORD_LEN
                );
                return futures::future::ready(Err(StoreError::Unavailable(why))).boxed();
            }
            let mut frame = wal::start_frame(len);
            encode_txn_record(&txn, &mut frame);
            wal::seal_frame(&mut frame);
            Some(frame)
        } else {
            None
        };
        let mut state = self.shared.lock();
        if let Err(e) = state.check_open() {
            return futures::future::ready(Err(e)).boxed();
        }
        let before = state.mem.revision();
        let mut compacted = None;
        let response = match state.mem.txn(&txn) {
            Ok(r) => r,
            Err(e) => return futures::future::ready(Err(e)).boxed(),
        };
        let mut wake_writer = None;
        let rx = match frame {
            Some(frame) if state.mem.revision() != before => {
                let seq = state.queue_frame(frame);
                compacted = state.maybe_compact();
                wake_writer = state.take_writer_wake();
                state.wait_for(seq)
            }
            _ => state.barrier(),
        };
        drop(state);
        // Signalled after unlocking: the writer checks its queue under the
        // lock, so it cannot miss the record, and it does not wake up only
        // to wait for the lock this thread still holds.
        if let Some(waker) = wake_writer {
            waker.wake();
        }
        drop(compacted);
        async move {
            durable(rx).await?;
            Ok(response)
        }
        .boxed()
    }

    /// Streams the changes of `range` from `start_revision` on (0: from
    /// the next revision). Same as [`KvStore::watch`].
    pub fn watch(
        &self,
        range: KeyRange,
        start_revision: Revision,
    ) -> BoxStream<'static, Result<WatchBatch, StoreError>> {
        watch::WatchStream::start(self.shared.clone(), range, start_revision)
    }

    /// Grants a lease (`id` 0: the next free ID); resolves with its ID once
    /// durable. The writer thread revokes it when its TTL passes without a
    /// keep-alive.
    pub fn lease_grant(
        &self,
        id: LeaseId,
        ttl: Duration,
    ) -> BoxFuture<'static, Result<LeaseId, StoreError>> {
        let mut state = self.shared.lock();
        let result = state.check_open().and_then(|()| {
            let now = state.clock.now();
            let id = state.mem.lease_grant(id, ttl, now)?;
            let seq = state.queue_record(&Record::LeaseGrant { id, ttl });
            Ok((id, state.wait_for(seq)))
        });
        let writer = state.take_writer_waker();
        drop(state);
        if let Some(waker) = writer {
            waker.wake();
        }
        async move {
            let (id, rx) = result?;
            durable(rx).await?;
            Ok(id)
        }
        .boxed()
    }

    /// Keeps a lease alive for another TTL; resolves with the TTL. Not
    /// logged (leases restart with their full TTL on open), but resolves
    /// only once the lease's grant is durable.
    pub fn lease_keep_alive(
        &self,
        id: LeaseId,
    ) -> BoxFuture<'static, Result<Duration, StoreError>> {
        let mut state = self.shared.lock();
        let result = state.check_open().and_then(|()| {
            let now = state.clock.now();
            let ttl = state.mem.lease_keep_alive(id, now)?;
            Ok((ttl, state.barrier()))
        });
        drop(state);
        async move {
            let (ttl, rx) = result?;
            durable(rx).await?;
            Ok(ttl)
        }
        .boxed()
    }

    /// Revokes a lease, deleting its keys; resolves with the revision after
    /// the revocation once durable.
    pub fn lease_revoke(&self, id: LeaseId) -> BoxFuture<'static, Result<Revision, StoreError>> {
        let mut state = self.shared.lock();
        let result = state.check_open().and_then(|()| {
            let revision = state.mem.lease_revoke(id)?;
            let seq = state.queue_record(&Record::LeaseRevoke(id));
            drop(state.maybe_compact());
            Ok((revision, state.wait_for(seq)))
        });
        let writer = state.take_writer_waker();
        drop(state);
        if let Some(waker) = writer {
            waker.wake();
        }
        async move {
            let (revision, rx) = result?;
            durable(rx).await?;
            Ok(revision)
        }
        .boxed()
    }

    /// What is known about a lease now (its grant may not be durable yet).
    pub fn lease_time_to_live(&self, id: LeaseId) -> Result<LeaseInfo, StoreError> {
        let state = self.shared.lock();
        state.check_open()?;
        state.mem.lease_time_to_live(id, state.clock.now())
    }

    /// Writes what is queued, stops the writer thread and releases the
    /// directory. Returns the store's failure, if it failed.
    pub fn close(self) -> Result<(), StoreError> {
        self.shutdown();
        let state = self.shared.lock();
        match &state.failure {
            Some(_) => state.check_open(),
            None => Ok(()),
        }
    }

    fn shutdown(&self) {
        let writer = {
            let mut state = self.shared.lock();
            state.closed = true;
            state.wake_watchers();
            state.wake_health();
            state.take_writer_waker()
        };
        if let Some(waker) = writer {
            waker.wake();
        }
        let handle = self
            .writer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        // A stepped writer is its driver's to finish (or drop).
        let Some(handle) = handle else {
            return;
        };
        if handle.join().is_err() {
            tracing::error!("the embedded store's writer thread panicked");
        }
        // Anyone still waiting (only possible if the writer panicked) is
        // told the store is gone.
        let mut state = self.shared.lock();
        for (_, tx) in state.waiters.drain(..) {
            let _ = tx.send(Err(StoreError::Unavailable(
                "the embedded store is closed".into(),
            )));
        }
    }
}

/// The health of an [`EmbeddedStore`], from [`EmbeddedStore::health`].
/// It keeps the store's state (not its files or writer) alive.
#[derive(Clone, Debug)]
pub struct StoreHealth {
    shared: Arc<Shared>,
}

impl StoreHealth {
    /// Why the store failed (a WAL write or sync failed), if it did;
    /// `None` while it works and once it was closed without failing.
    pub fn failure(&self) -> Option<String> {
        self.shared.lock().failure.clone()
    }
}

impl Readiness for StoreHealth {
    fn unready(&self) -> Option<String> {
        match self.shared.lock().check_open() {
            Ok(()) => None,
            Err(StoreError::Unavailable(why)) => Some(why),
            Err(e) => Some(e.to_string()),
        }
    }

    fn subscribe(&self, waker: Waker) {
        self.shared.lock().health.push(waker);
    }
}

impl Drop for EmbeddedStore {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl KvStore for EmbeddedStore {
    fn txn(&self, txn: Txn) -> BoxFuture<'static, Result<TxnResponse, StoreError>> {
        EmbeddedStore::txn(self, txn)
    }

    fn read_for_update(
        &self,
        range: KeyRange,
    ) -> BoxFuture<'static, Result<Vec<KeyValue>, StoreError>> {
        let state = self.shared.lock();
        let result = state.check_open().map(|()| state.mem.range(&range));
        futures::future::ready(result).boxed()
    }

    /// Writes apply to the in-memory model in submission order, before
    /// their log batch is durable, and reads for an update see them.
    fn applies_in_order(&self) -> bool {
        true
    }

    fn watch(
        &self,
        range: KeyRange,
        start_revision: Revision,
    ) -> BoxStream<'static, Result<WatchBatch, StoreError>> {
        EmbeddedStore::watch(self, range, start_revision)
    }
}
