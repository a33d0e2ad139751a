//! Streaming a verified payload onto the root device: the verifier's
//! batches ([`VerifiedRead::take_run`], aligned buffers) written and read
//! back without a copy, each on its own thread.
//!
//! # Three threads
//!
//! Receiving (through the verifier, which hashes on threads of its own),
//! writing and reading back each take about as long as the others at disk
//! speed, so each has its own thread and they overlap: the caller's thread
//! takes each verified batch and sends it on; the [stages](super::stages)
//! write it to the device (direct I/O where it can), read it back and
//! compare, and give the buffer back to the verifier to be filled again.
//! Memory stays at the verifier's batches whatever the payload's size. A
//! stage that fails drops its channels; the others see that and stop, and
//! the failure reported is the earliest stage's own.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{SyncSender, sync_channel};

use super::device::{Device, Head};
use super::stages::{self, Chunk};
use super::verify::VerifiedRead;
use super::{InstallError, PROGRESS_STEP_BYTES, Progress};

/// How many batches wait between two stages.
const STAGE_QUEUE: usize = 1;

/// Why streaming a payload failed: reading it (the caller knows which
/// payload and classifies it), or the device.
pub(super) enum StreamError {
    /// Reading the verified payload failed.
    Read(io::Error),
    /// Anything else.
    Install(InstallError),
}

impl From<InstallError> for StreamError {
    fn from(e: InstallError) -> Self {
        StreamError::Install(e)
    }
}

/// Where a payload goes on the device.
pub(super) struct Placement<'a> {
    /// Its name, for progress reports.
    pub(super) payload: &'a str,
    /// The device offset of its first byte.
    pub(super) base: u64,
    /// Its size.
    pub(super) size: u64,
    /// Whether the device's first [`GUARD_BYTES`](super::GUARD_BYTES)
    /// are held back until the end (a whole-disk image: see
    /// `device.rs`, "Head last").
    pub(super) hold_head: bool,
}

/// How the receiving stage ended.
enum Received {
    /// The payload ended.
    Whole,
    /// A later stage stopped taking chunks (its own result says why).
    Stopped,
}

/// The receiving stage: takes verified batches from `payload` and sends
/// them on, reporting progress.
fn receive(
    payload: &mut VerifiedRead,
    place: &Placement,
    out: SyncSender<Chunk>,
    verified: &AtomicU64,
    progress: &mut dyn FnMut(&Progress),
) -> Result<Received, StreamError> {
    let mut next_report = PROGRESS_STEP_BYTES;
    loop {
        let Some(run) = payload.take_run().map_err(StreamError::Read)? else {
            return Ok(Received::Whole);
        };
        let end = run.offset + run.len as u64;
        if out
            .send(Chunk::new(run.buf, run.len, place.base + run.offset))
            .is_err()
        {
            return Ok(Received::Stopped);
        }
        if end >= next_report {
            next_report = end + PROGRESS_STEP_BYTES;
            progress(&Progress::Writing {
                payload: place.payload.to_string(),
                written: verified.load(Ordering::Relaxed),
                total: place.size,
            });
        }
    }
}

/// The result of a stage's thread, its panic carried on.
fn joined<T>(result: std::thread::Result<T>) -> T {
    result.unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

/// Streams `payload` onto the device at `place`. Returns once every byte
/// but a held-back head was written and read back; the head, empty unless
/// `place.hold_head`.
pub(super) fn write_payload(
    payload: &mut VerifiedRead,
    place: &Placement,
    device: &Device,
    progress: &mut dyn FnMut(&Progress),
) -> Result<Head, StreamError> {
    let verified = AtomicU64::new(0);
    let recycler = payload.recycler();
    let (received, wrote, read_back) = std::thread::scope(|scope| {
        let (to_write, write_in) = sync_channel(STAGE_QUEUE);
        let (to_read_back, read_back_in) = sync_channel(STAGE_QUEUE);
        let verified = &verified;
        let hold_head = place.hold_head;
        let writing = scope.spawn(move || stages::write(write_in, to_read_back, device, hold_head));
        let reading =
            scope.spawn(move || stages::read_back(read_back_in, recycler, device, verified));
        let received = receive(payload, place, to_write, verified, progress);
        (received, joined(writing.join()), joined(reading.join()))
    });
    match received? {
        Received::Whole => {}
        Received::Stopped => {
            // The stages end before their input only when one of the
            // device's stages failed.
            wrote?;
            read_back?;
            unreachable!("the device's stages stopped taking chunks without an error");
        }
    }
    let head = wrote?;
    read_back?;
    progress(&Progress::Writing {
        payload: place.payload.to_string(),
        written: place.size,
        total: place.size,
    });
    Ok(head)
}
