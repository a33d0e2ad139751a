//! One payload streamed into its layer blob: read once, hashed chunk by
//! chunk as the config needs, compressed into one zstd frame (or copied),
//! and the blob's own SHA-256 taken as it is written. Nothing is held in
//! memory beyond the compressor's window or the copy buffer.

use std::cell::Cell;
use std::io::{self, Read, Write};
use std::rc::Rc;

use base64::Engine as _;
use sha2::{Digest, Sha256};

use super::format::{Compression, Payload, digest_of};

/// The zstd level layers are compressed at: the `zstd` program's default.
const ZSTD_LEVEL: i32 = 3;

/// Reads a payload, hashing each `chunk` bytes (SHA-256, base64 without
/// padding) and counting them on a progress bar.
///
/// A read error ends the stream (`Ok(0)`) and is kept in `error`, so that
/// it is reported as the payload's, not as the blob's (the copy through
/// the encoder would not tell them apart). Reading also ends when the
/// sink failed (`stop`).
struct ChunkReader<R> {
    inner: R,
    chunk: u64,
    hasher: Sha256,
    in_chunk: u64,
    total: u64,
    hashes: Vec<String>,
    error: Option<io::Error>,
    stop: Rc<Cell<bool>>,
    progress: indicatif::ProgressBar,
}

impl<R: Read> ChunkReader<R> {
    fn take_hash(&mut self) {
        let hash = std::mem::take(&mut self.hasher).finalize();
        let encoded = base64::engine::general_purpose::STANDARD_NO_PAD.encode(hash);
        self.hashes.push(encoded);
        self.in_chunk = 0;
    }

    fn hash(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let room = usize::try_from(self.chunk - self.in_chunk).unwrap_or(usize::MAX);
            let (now, rest) = bytes.split_at(room.min(bytes.len()));
            self.hasher.update(now);
            self.in_chunk += now.len() as u64;
            if self.in_chunk == self.chunk {
                self.take_hash();
            }
            bytes = rest;
        }
    }

    /// The chunk hashes once the payload is read (the last chunk may be
    /// short), or the error that stopped reading.
    fn finish(mut self) -> io::Result<(u64, Vec<String>)> {
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        if self.in_chunk > 0 {
            self.take_hash();
        }
        Ok((self.total, self.hashes))
    }
}

impl<R: Read> Read for ChunkReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.error.is_some() || self.stop.get() {
            return Ok(0);
        }
        let n = loop {
            match self.inner.read(buf) {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    self.error = Some(e);
                    return Ok(0);
                }
            }
        };
        self.hash(&buf[..n]);
        self.total += n as u64;
        self.progress.inc(n as u64);
        Ok(n)
    }
}

/// Writes the blob, taking its SHA-256 and length. A write error is kept
/// and stops the reader at its next read; later writes are dropped, and
/// the error is reported by the flush after the copy.
struct BlobWriter<W> {
    inner: W,
    hasher: Sha256,
    written: u64,
    error: Option<io::Error>,
    stop: Rc<Cell<bool>>,
}

impl<W: Write> Write for BlobWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.error.is_some() {
            return Ok(buf.len());
        }
        if let Err(e) = self.inner.write_all(buf) {
            self.error = Some(e);
            self.stop.set(true);
            return Ok(buf.len());
        }
        self.hasher.update(buf);
        self.written += buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        match self.error.take() {
            Some(e) => Err(e),
            None => self.inner.flush(),
        }
    }
}

/// Why encoding a payload failed.
#[derive(Debug)]
pub enum EncodeError {
    /// Reading the payload failed.
    Read(io::Error),
    /// Writing the blob failed.
    Write(io::Error),
}

/// A payload written as a layer blob.
#[derive(Debug)]
pub struct Encoded {
    /// The payload as the config describes it.
    pub payload: Payload,
    /// The blob's digest (`sha256:<hex>`).
    pub digest: String,
    /// The blob's length.
    pub blob_size: u64,
}

/// Reads `source` to its end as the payload `name`, hashing chunks of
/// `chunk` bytes, and writes its layer blob, compressed as `compression`
/// says, to `sink` (flushed, not synced).
pub fn encode<R: Read, W: Write>(
    name: &str,
    source: R,
    sink: W,
    chunk: u64,
    compression: Compression,
    progress: indicatif::ProgressBar,
) -> Result<Encoded, EncodeError> {
    let stop = Rc::new(Cell::new(false));
    let mut reader = ChunkReader {
        inner: source,
        chunk,
        hasher: Sha256::new(),
        in_chunk: 0,
        total: 0,
        hashes: Vec::new(),
        error: None,
        stop: stop.clone(),
        progress,
    };
    let mut writer = BlobWriter {
        inner: sink,
        hasher: Sha256::new(),
        written: 0,
        error: None,
        stop,
    };
    match compression {
        Compression::None => {
            io::copy(&mut reader, &mut writer).map_err(EncodeError::Write)?;
        }
        Compression::Zstd => {
            let mut encoder = zstd::stream::write::Encoder::new(&mut writer, ZSTD_LEVEL)
                .map_err(EncodeError::Write)?;
            encoder.include_checksum(true).map_err(EncodeError::Write)?;
            io::copy(&mut reader, &mut encoder).map_err(EncodeError::Write)?;
            encoder.finish().map_err(EncodeError::Write)?;
        }
    }
    writer.flush().map_err(EncodeError::Write)?;
    let (size, chunk_hashes) = reader.finish().map_err(EncodeError::Read)?;
    Ok(Encoded {
        payload: Payload {
            name: name.to_string(),
            size,
            hash_chunk_size: chunk,
            chunk_hashes,
        },
        digest: digest_of(&writer.hasher.finalize()),
        blob_size: writer.written,
    })
}
