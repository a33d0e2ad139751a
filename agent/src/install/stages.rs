//! The stages a payload's chunks pass through after they were received
//! and verified, each on its own thread (see [`writer`](super::writer),
//! "Three threads"): writing, reading back. Each takes chunks from the stage
//! before and gives them to the next; the last gives the buffer back to
//! be filled again. A stage that fails returns, dropping its channels,
//! and the stages around it see that and stop.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender};

use super::InstallError;
use super::aligned::AlignedBuf;
use super::device::{Device, Head};

/// The size of the read-back buffer (grown to a batch's size as needed).
const SCRATCH_BYTES: usize = 4 * 1024 * 1024;

/// A filled buffer on its way from stage to stage: the image's bytes
/// from `offset`.
pub(super) struct Chunk {
    /// The buffer.
    pub(super) buf: AlignedBuf,
    /// How many of its bytes are the image's.
    pub(super) len: usize,
    /// Where in the image they start.
    pub(super) offset: u64,
    /// How many of them the head holds back (set by [`write`]).
    held: usize,
}

impl Chunk {
    /// A chunk of `len` image bytes at `offset`, in `buf`.
    pub(super) fn new(buf: AlignedBuf, len: usize, offset: u64) -> Chunk {
        Chunk {
            buf,
            len,
            offset,
            held: 0,
        }
    }

    fn bytes(&self) -> &[u8] {
        &self.buf.as_slice()[..self.len]
    }
}

/// Holds back the head (when `hold_head`) and writes the rest of each
/// chunk to `device`, then sends it on to be read back; the head once the
/// chunks ended.
pub(super) fn write(
    chunks: Receiver<Chunk>,
    out: SyncSender<Chunk>,
    device: &Device,
    hold_head: bool,
) -> Result<Head, InstallError> {
    let mut head = Head::new();
    for mut chunk in chunks {
        if hold_head {
            chunk.held = head.hold(chunk.bytes(), chunk.offset);
        }
        let rest = &chunk.bytes()[chunk.held..];
        if !rest.is_empty() {
            device.write_at(rest, chunk.offset + chunk.held as u64)?;
        }
        if out.send(chunk).is_err() {
            break;
        }
    }
    Ok(head)
}

/// Reads each chunk back from `device` and compares it, counts it in
/// `verified` and gives its buffer back (to the verifier, when it still
/// reads).
pub(super) fn read_back(
    chunks: Receiver<Chunk>,
    returned: Option<SyncSender<AlignedBuf>>,
    device: &Device,
    verified: &AtomicU64,
) -> Result<(), InstallError> {
    let mut scratch = AlignedBuf::new(SCRATCH_BYTES);
    for chunk in chunks {
        let rest = &chunk.bytes()[chunk.held..];
        if !rest.is_empty() {
            device.read_back(rest, chunk.offset + chunk.held as u64, &mut scratch)?;
        }
        verified.fetch_add(chunk.len as u64, Ordering::Relaxed);
        // The receiving stage is gone once it has all it needs.
        if let Some(returned) = &returned {
            let _ = returned.send(chunk.buf);
        }
    }
    Ok(())
}
