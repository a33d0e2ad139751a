//! A payload's bytes, handed out only once the chunk they belong to
//! matched its SHA-256 from the image config.
//!
//! # Threads
//!
//! Chunk hashes are independent, so they are checked on every core: one
//! thread reads the payload from its source (the registry, through the
//! decompressor) into batches of whole chunks, [`workers`] threads hash the
//! batches, and the caller's thread takes them back in order through
//! [`VerifiedRead`]. At most `workers + 2` batches of at most
//! [`BATCH_BYTES`] (or one chunk, when chunks are larger) are held at once,
//! whatever the payload's size.
//!
//! A batch holding a chunk that does not match is never handed out: the
//! read that reaches it fails with [`PayloadFailure::ChunkMismatch`]
//! naming the chunk, and nothing of it, nor of any later chunk, was
//! returned. Failures are reported in payload order: the earliest bad
//! chunk, or the source's error where it happened.

use std::collections::BTreeMap;
use std::fmt;
use std::io::{self, Read};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::sync::{Arc, Mutex};

use sha2::{Digest as _, Sha256};

use super::aligned::AlignedBuf;
use super::image_config::PayloadSpec;

/// The size batches of small chunks are gathered to.
pub(super) const BATCH_BYTES: u64 = 4 * 1024 * 1024;

/// Batches beyond one per hashing thread: one being filled, one waiting
/// to be read, and four held by a caller that takes them whole
/// ([`VerifiedRead::take_run`]: the device's write and read-back stages
/// and their queues).
const SPARE_BATCHES: usize = 6;

/// Why a verified payload could not be read, carried inside the
/// `io::Error` [`VerifiedRead`] returns (see [`PayloadFailure::of`]).
#[derive(Debug)]
pub(super) enum PayloadFailure {
    /// The source failed (the transfer, the decompressor).
    Source(io::Error),
    /// The source ended before the payload's size.
    Truncated {
        /// The bytes it gave.
        received: u64,
    },
    /// Chunk `chunk` (from 0) is not what the config's hash says.
    ChunkMismatch {
        /// The chunk's index.
        chunk: u64,
        /// Its first byte in the payload.
        offset: u64,
    },
}

impl PayloadFailure {
    /// The failure inside `e`, when `e` came from a [`VerifiedRead`].
    pub(super) fn of(e: io::Error) -> Result<PayloadFailure, io::Error> {
        if e.get_ref()
            .is_some_and(|inner| inner.is::<PayloadFailure>())
        {
            if let Some(inner) = e.into_inner()
                && let Ok(failure) = inner.downcast::<PayloadFailure>()
            {
                return Ok(*failure);
            }
            return Err(io::Error::other("payload failure lost"));
        }
        Err(e)
    }
}

impl fmt::Display for PayloadFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PayloadFailure::Source(e) => write!(f, "{e}"),
            PayloadFailure::Truncated { received } => {
                write!(f, "the payload ended after {received} bytes")
            }
            PayloadFailure::ChunkMismatch { chunk, offset } => write!(
                f,
                "chunk {chunk} (bytes from {offset}) does not match its SHA-256"
            ),
        }
    }
}

impl std::error::Error for PayloadFailure {}

/// How many threads hash: every core, at most 8. Eight hash over 10 GB/s
/// (1.25 to 1.9 GB/s each), more than any disk or link an install
/// reads from, and each holds batches in memory: more would buy nothing
/// but memory.
pub(super) fn workers() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().min(8))
}

/// A run of whole chunks read from the source.
struct Batch {
    /// Its position among the batches.
    seq: u64,
    buf: AlignedBuf,
    len: usize,
    /// Set by a hashing thread: the first chunk that did not match.
    bad_chunk: Option<u64>,
}

/// What the reading thread and the hashing threads hand to the reader.
enum Done {
    Checked(Batch),
    /// The source failed before batch `seq`.
    Failed(u64, PayloadFailure),
}

/// The shape of a payload's batches.
#[derive(Clone, Copy)]
struct Plan {
    size: u64,
    chunk: u64,
    /// Chunks per batch.
    per_batch: u64,
}

impl Plan {
    fn of(spec: &PayloadSpec) -> Plan {
        Plan {
            size: spec.size,
            chunk: spec.chunk_size,
            per_batch: (BATCH_BYTES / spec.chunk_size).max(1),
        }
    }

    fn batch_bytes(&self) -> u64 {
        self.per_batch * self.chunk
    }

    fn batches(&self) -> u64 {
        self.size.div_ceil(self.batch_bytes())
    }

    /// The length of batch `seq`.
    fn len(&self, seq: u64) -> usize {
        let start = seq * self.batch_bytes();
        (self.size - start).min(self.batch_bytes()) as usize
    }
}

/// Reads `spec`'s payload from `source`, handing `reader` a [`VerifiedRead`]
/// of it; returns what `reader` returns once every thread ended.
///
/// The source is read up to the payload's size and no further.
pub(super) fn with_verified<S, T>(
    source: S,
    spec: &PayloadSpec,
    workers: usize,
    reader: impl FnOnce(&mut VerifiedRead) -> T,
) -> T
where
    S: Read + Send,
{
    let plan = Plan::of(spec);
    let workers = workers.max(1);
    let pool = workers + SPARE_BATCHES;
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let (to_hash, hash_in) = sync_channel::<Batch>(pool);
        let (to_reader, reader_in) = sync_channel::<Done>(pool);
        let (to_refill, refill_in) = sync_channel::<AlignedBuf>(pool);
        let hash_in = Arc::new(Mutex::new(hash_in));
        for _ in 0..workers {
            let (hash_in, to_reader) = (hash_in.clone(), to_reader.clone());
            let hashes = &spec.chunk_hashes;
            scope.spawn(move || hash(&hash_in, &to_reader, hashes, plan));
        }
        let stop = &stop;
        scope.spawn(move || fill(source, plan, pool, refill_in, to_hash, to_reader, stop));
        let mut verified = VerifiedRead {
            plan,
            done: reader_in,
            refill: Some(to_refill),
            pending: BTreeMap::new(),
            current: None,
            next_seq: 0,
            failed: None,
        };
        let result = reader(&mut verified);
        // Whatever is still reading stops at its next batch.
        stop.store(true, Ordering::Relaxed);
        drop(verified);
        result
    })
}

/// The reading thread: fills batches from `source` and sends them to be
/// hashed, until the payload's size, a failure or `stop`.
fn fill<S: Read>(
    mut source: S,
    plan: Plan,
    pool: usize,
    refill: Receiver<AlignedBuf>,
    to_hash: SyncSender<Batch>,
    to_reader: SyncSender<Done>,
    stop: &AtomicBool,
) {
    let mut fresh = pool;
    let mut received = 0u64;
    for seq in 0..plan.batches() {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let mut buf = if fresh > 0 {
            fresh -= 1;
            AlignedBuf::new(plan.batch_bytes() as usize)
        } else {
            match refill.recv() {
                Ok(buf) => buf,
                Err(_) => return,
            }
        };
        let len = plan.len(seq);
        let mut got = 0;
        while got < len {
            // A reader that stopped (a bad chunk, a failed write) is not
            // kept waiting for the rest of a batch from a slow registry.
            if stop.load(Ordering::Relaxed) {
                return;
            }
            match source.read(&mut buf.as_mut_slice()[got..len]) {
                Ok(0) => {
                    let received = received + got as u64;
                    let _ =
                        to_reader.send(Done::Failed(seq, PayloadFailure::Truncated { received }));
                    return;
                }
                Ok(read) => got += read,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    let _ = to_reader.send(Done::Failed(seq, PayloadFailure::Source(e)));
                    return;
                }
            }
        }
        received += len as u64;
        let batch = Batch {
            seq,
            buf,
            len,
            bad_chunk: None,
        };
        if to_hash.send(batch).is_err() {
            return;
        }
    }
}

/// A hashing thread: checks each batch's chunks against `hashes`.
fn hash(
    batches: &Mutex<Receiver<Batch>>,
    to_reader: &SyncSender<Done>,
    hashes: &[[u8; 32]],
    plan: Plan,
) {
    loop {
        let received = batches.lock().unwrap_or_else(|p| p.into_inner()).recv();
        let Ok(mut batch) = received else { return };
        let first = batch.seq * plan.per_batch;
        let bytes = &batch.buf.as_slice()[..batch.len];
        batch.bad_chunk = bytes
            .chunks(plan.chunk as usize)
            .zip(first..)
            .find(|(chunk, index)| {
                let expected = usize::try_from(*index).ok().and_then(|i| hashes.get(i));
                expected != Some(&<[u8; 32]>::from(Sha256::digest(chunk)))
            })
            .map(|(_, index)| index);
        if to_reader.send(Done::Checked(batch)).is_err() {
            return;
        }
    }
}

/// The verified payload, in order (see the [module](self)).
pub(super) struct VerifiedRead {
    plan: Plan,
    done: Receiver<Done>,
    refill: Option<SyncSender<AlignedBuf>>,
    /// Batches that arrived before their turn.
    pending: BTreeMap<u64, Done>,
    /// The batch being read, and how much of it was handed out.
    current: Option<(Batch, usize)>,
    next_seq: u64,
    failed: Option<String>,
}

impl VerifiedRead {
    /// The next batch in order, verified.
    fn next_batch(&mut self) -> Result<Option<Batch>, PayloadFailure> {
        if self.next_seq >= self.plan.batches() {
            return Ok(None);
        }
        let seq = self.next_seq;
        let done = loop {
            if let Some(done) = self.pending.remove(&seq) {
                break done;
            }
            match self.done.recv() {
                Ok(Done::Checked(batch)) if batch.seq != seq => {
                    self.pending.insert(batch.seq, Done::Checked(batch));
                }
                Ok(Done::Failed(at, failure)) if at != seq => {
                    self.pending.insert(at, Done::Failed(at, failure));
                }
                Ok(done) => break done,
                Err(_) => {
                    return Err(PayloadFailure::Source(io::Error::other(
                        "the payload's reading threads ended early",
                    )));
                }
            }
        };
        match done {
            Done::Failed(_, failure) => Err(failure),
            Done::Checked(batch) => match batch.bad_chunk {
                Some(chunk) => Err(PayloadFailure::ChunkMismatch {
                    chunk,
                    offset: chunk * self.plan.chunk,
                }),
                None => {
                    self.next_seq += 1;
                    Ok(Some(batch))
                }
            },
        }
    }

    /// Makes `current` a batch with bytes left to hand out, recycling the
    /// one that was read; false at the payload's end.
    fn advance(&mut self) -> io::Result<bool> {
        if let Some(message) = &self.failed {
            return Err(io::Error::other(message.clone()));
        }
        if self.current.as_ref().is_some_and(|(b, at)| *at < b.len) {
            return Ok(true);
        }
        if let (Some((batch, _)), Some(refill)) = (self.current.take(), &self.refill) {
            // The reading thread may have stopped: then it is not needed.
            let _ = refill.send(batch.buf);
        }
        match self.next_batch() {
            Ok(Some(batch)) => {
                self.current = Some((batch, 0));
                Ok(true)
            }
            Ok(None) => Ok(false),
            Err(failure) => {
                self.failed = Some(failure.to_string());
                Err(io::Error::other(failure))
            }
        }
    }
}

/// A verified batch handed over whole by [`VerifiedRead::take_run`].
pub(super) struct Run {
    /// The buffer: give it back through [`VerifiedRead::recycler`].
    pub(super) buf: AlignedBuf,
    /// How many of its bytes are the payload's.
    pub(super) len: usize,
    /// Where in the payload they start.
    pub(super) offset: u64,
}

impl VerifiedRead {
    /// The next verified batch, whole, without a copy; `None` at the end.
    /// Its buffer must go back through [`recycler`](Self::recycler) (or
    /// be dropped, which ends the reading once the spare ones ran out).
    /// Not for mixing with [`Read`]: a batch partly read is an error.
    pub(super) fn take_run(&mut self) -> io::Result<Option<Run>> {
        if self.current.as_ref().is_some_and(|(b, at)| *at < b.len) {
            return Err(io::Error::other("a verified batch was partly read"));
        }
        if !self.advance()? {
            return Ok(None);
        }
        let batch_bytes = self.plan.batch_bytes();
        Ok(self.current.take().map(|(batch, _)| Run {
            offset: batch.seq * batch_bytes,
            len: batch.len,
            buf: batch.buf,
        }))
    }

    /// Where buffers of [`take_run`](Self::take_run) go back to be filled
    /// again.
    pub(super) fn recycler(&self) -> Option<SyncSender<AlignedBuf>> {
        self.refill.clone()
    }
}

impl Read for VerifiedRead {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() || !self.advance()? {
            return Ok(0);
        }
        let Some((batch, at)) = &mut self.current else {
            return Ok(0);
        };
        let n = buf.len().min(batch.len - *at);
        buf[..n].copy_from_slice(&batch.buf.as_slice()[*at..*at + n]);
        *at += n;
        Ok(n)
    }
}

impl Drop for VerifiedRead {
    fn drop(&mut self) {
        // Dropping the refill channel and the receiver lets the reading
        // and hashing threads see they are no longer wanted.
        self.refill = None;
    }
}

#[cfg(test)]
mod tests;
