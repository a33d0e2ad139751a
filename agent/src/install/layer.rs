//! Streaming the image layer onto the root device: the layer counted as
//! it arrives (cut off as soon as it is longer than the manifest says),
//! decompressed when it is zstd, hashed, written and read back, and its
//! digest checked at the end.
//!
//! # Four threads
//!
//! Receiving, hashing, writing and reading back each take about as long
//! as the others at disk speed, so each has its own thread and they
//! overlap: the caller's thread receives (and for a zstd layer hashes the
//! compressed bytes and decompresses them) into one of
//! [`POOL_BUFFERS`] aligned buffers of [`CHUNK_BYTES`]; the
//! [stages](super::stages) hash it (a raw layer is the image itself),
//! write it to the device, read it back and compare, and hand the buffer
//! back to be filled again. At most [`POOL_BUFFERS`] chunks are in
//! flight, so memory stays at `POOL_BUFFERS × CHUNK_BYTES` whatever the
//! image's size. A stage that fails drops its channels; the others see
//! that and stop, and the failure reported is the earliest stage's own (a
//! transfer error rather than the device's stages seeing the stream end).

use std::io::{self, BufReader, Read};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};

use super::aligned::AlignedBuf;
use super::device::{Device, Head};
use super::digest::Hasher;
use super::http::{Body, Response};
use super::manifest::Layer;
use super::stages::{self, CHUNK_BYTES, Chunk, POOL_BUFFERS};
use super::zstd::ZstdReader;
use super::{InstallError, PROGRESS_STEP_BYTES, Progress};

/// What went wrong reading the layer, recorded by [`LayerReader`] so that
/// failures that surface through the decompressor are still told apart.
enum LayerFailure {
    Transfer(io::Error),
    TooLong(u64),
}

/// The layer as received: counted (and hashed, when it is compressed),
/// and cut off as soon as it is longer than the manifest says.
struct LayerReader<'a> {
    body: &'a mut Body,
    /// For a compressed layer; a raw one is hashed by the hashing stage.
    hasher: Option<Hasher>,
    received: u64,
    size: u64,
    ended: bool,
    failure: Option<LayerFailure>,
}

impl Read for LayerReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if let Some(failure) = &self.failure {
            return Err(match failure {
                LayerFailure::Transfer(e) => io::Error::new(e.kind(), e.to_string()),
                LayerFailure::TooLong(_) => io::Error::other("layer longer than declared"),
            });
        }
        let read = match self.body.read(buf) {
            Ok(read) => read,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return Err(e),
            Err(e) => {
                let copy = io::Error::new(e.kind(), e.to_string());
                self.failure = Some(LayerFailure::Transfer(e));
                return Err(copy);
            }
        };
        if read == 0 {
            self.ended = true;
            return Ok(0);
        }
        let received = self.received + read as u64;
        if received > self.size {
            self.failure = Some(LayerFailure::TooLong(received));
            return Err(io::Error::other("layer longer than declared"));
        }
        self.received = received;
        if let Some(hasher) = &mut self.hasher {
            hasher.update(&buf[..read]);
        }
        Ok(read)
    }
}

/// The decompressed image, read from the layer.
enum ImageReader<'a> {
    Raw(LayerReader<'a>),
    Zstd(Box<ZstdReader<BufReader<LayerReader<'a>>>>),
}

impl<'a> ImageReader<'a> {
    fn layer(&self) -> &LayerReader<'a> {
        match self {
            ImageReader::Raw(layer) => layer,
            ImageReader::Zstd(zstd) => zstd.source().get_ref(),
        }
    }

    fn into_layer(self) -> LayerReader<'a> {
        match self {
            ImageReader::Raw(layer) => layer,
            ImageReader::Zstd(zstd) => zstd.into_source().into_inner(),
        }
    }

    /// Reads until `buf` is full or the image ends.
    fn fill(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut filled = 0;
        while filled < buf.len() {
            let read = match self {
                ImageReader::Raw(layer) => layer.read(&mut buf[filled..]),
                ImageReader::Zstd(zstd) => zstd.read(&mut buf[filled..]),
            };
            match read {
                Ok(0) => break,
                Ok(read) => filled += read,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(filled)
    }

    /// The installation error for a failed read.
    fn error(&mut self, e: io::Error, url: &str, layer: &Layer) -> InstallError {
        let reader = match self {
            ImageReader::Raw(layer) => layer,
            ImageReader::Zstd(zstd) => zstd.source_mut().get_mut(),
        };
        match reader.failure.take() {
            Some(LayerFailure::Transfer(source)) => InstallError::Transfer {
                url: url.to_string(),
                source,
            },
            Some(LayerFailure::TooLong(received)) => InstallError::LayerSizeMismatch {
                digest: layer.digest.to_string(),
                expected: layer.size,
                received,
            },
            None if reader.ended && reader.received < layer.size => {
                InstallError::LayerSizeMismatch {
                    digest: layer.digest.to_string(),
                    expected: layer.size,
                    received: reader.received,
                }
            }
            None => InstallError::Decompress {
                digest: layer.digest.to_string(),
                problem: e.to_string(),
            },
        }
    }
}

/// How the receiving stage ended.
enum Received {
    /// The image ended: its length.
    Whole(u64),
    /// A later stage stopped taking chunks (its own result says why).
    Stopped,
}

/// The receiving stage: fills buffers from `image` and sends them on,
/// reporting progress.
fn receive(
    image: &mut ImageReader,
    url: &str,
    layer: &Layer,
    out: SyncSender<Chunk>,
    returned: Receiver<AlignedBuf>,
    verified: &AtomicU64,
    progress: &mut dyn FnMut(&Progress),
) -> Result<Received, InstallError> {
    let total = (!layer.compressed).then_some(layer.size);
    let mut fresh = POOL_BUFFERS;
    let mut length = 0u64;
    let mut next_report = PROGRESS_STEP_BYTES;
    loop {
        let mut buf = if fresh > 0 {
            fresh -= 1;
            AlignedBuf::new(CHUNK_BYTES)
        } else {
            match returned.recv() {
                Ok(buf) => buf,
                Err(_) => return Ok(Received::Stopped),
            }
        };
        let len = image
            .fill(buf.as_mut_slice())
            .map_err(|e| image.error(e, url, layer))?;
        if len == 0 {
            return Ok(Received::Whole(length));
        }
        let offset = length;
        length += len as u64;
        if out.send(Chunk::new(buf, len, offset)).is_err() {
            return Ok(Received::Stopped);
        }
        if length >= next_report {
            next_report = length + PROGRESS_STEP_BYTES;
            progress(&Progress::Writing {
                written: verified.load(Ordering::Relaxed),
                total,
                received: image.layer().received,
                layer_size: layer.size,
            });
        }
    }
}

/// The result of a stage's thread, its panic carried on.
fn joined<T>(result: std::thread::Result<T>) -> T {
    result.unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

/// The image as written by [`write_layer`].
pub(super) struct Written {
    /// Its length.
    pub(super) length: u64,
    /// Its first bytes, not yet written.
    pub(super) head: Head,
}

/// Streams the layer of `response` onto the device. Returns only once the
/// layer verified against its digest, and every byte but the held-back
/// head was written and read back.
pub(super) fn write_layer(
    response: &mut Response,
    layer: &Layer,
    device: &Device,
    progress: &mut dyn FnMut(&Progress),
) -> Result<Written, InstallError> {
    let url = response.url.to_string();
    let reader = LayerReader {
        body: &mut response.body,
        hasher: layer.compressed.then(Hasher::default),
        received: 0,
        size: layer.size,
        ended: false,
        failure: None,
    };
    let mut image = if layer.compressed {
        ImageReader::Zstd(Box::new(ZstdReader::new(BufReader::with_capacity(
            256 * 1024,
            reader,
        ))))
    } else {
        ImageReader::Raw(reader)
    };
    let verified = AtomicU64::new(0);
    let (received, chunk_hasher, wrote, read_back) = std::thread::scope(|scope| {
        let (to_hash, hash_in) = sync_channel(POOL_BUFFERS);
        let (to_write, write_in) = sync_channel(POOL_BUFFERS);
        let (to_read_back, read_back_in) = sync_channel(POOL_BUFFERS);
        let (to_refill, refill_in) = sync_channel(POOL_BUFFERS);
        let feed = !layer.compressed;
        let verified = &verified;
        let hashing = scope.spawn(move || stages::hash(hash_in, to_write, Hasher::default(), feed));
        let writing = scope.spawn(move || stages::write(write_in, to_read_back, device));
        let reading =
            scope.spawn(move || stages::read_back(read_back_in, to_refill, device, verified));
        let received = receive(
            &mut image, &url, layer, to_hash, refill_in, verified, progress,
        );
        (
            received,
            joined(hashing.join()),
            joined(writing.join()),
            joined(reading.join()),
        )
    });
    let length = match received? {
        Received::Whole(length) => length,
        Received::Stopped => {
            // The stages end before their input only when one of the
            // device's stages failed.
            wrote?;
            read_back?;
            unreachable!("the device's stages stopped taking chunks without an error");
        }
    };
    let head = wrote?;
    read_back?;
    let reader = image.into_layer();
    if reader.received != layer.size {
        return Err(InstallError::LayerSizeMismatch {
            digest: layer.digest.to_string(),
            expected: layer.size,
            received: reader.received,
        });
    }
    // A compressed layer was hashed as received, a raw one by its stage.
    let actual = reader.hasher.unwrap_or(chunk_hasher).finish();
    if actual != layer.digest {
        return Err(InstallError::LayerDigestMismatch {
            expected: layer.digest.to_string(),
            actual: actual.to_string(),
        });
    }
    progress(&Progress::Writing {
        written: length,
        total: (!layer.compressed).then_some(layer.size),
        received: layer.size,
        layer_size: layer.size,
    });
    Ok(Written { length, head })
}
