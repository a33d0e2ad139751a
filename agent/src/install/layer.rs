//! Streaming the image layer onto the root device: the layer hashed and
//! counted as it arrives (cut off as soon as it is longer than the
//! manifest says), decompressed when it is zstd, written through a
//! fixed-size buffer, and its digest checked at the end.

use std::io::{self, BufReader, Read};

use super::device::Device;
use super::digest::{Digest, Hasher};
use super::http::{Body, Response};
use super::manifest::Layer;
use super::zstd::ZstdReader;
use super::{InstallError, PROGRESS_STEP_BYTES, Progress};

/// The size of the copy buffer, and so of the writes to the device.
const COPY_BUFFER_BYTES: usize = 1024 * 1024;

/// What went wrong reading the layer, recorded by [`LayerReader`] so that
/// failures that surface through the decompressor are still told apart.
enum LayerFailure {
    Transfer(io::Error),
    TooLong(u64),
}

/// The layer as received: hashed and counted, and cut off as soon as it
/// is longer than the manifest says.
struct LayerReader<'a> {
    body: &'a mut Body,
    hasher: Hasher,
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
        let received = self.hasher.len() + read as u64;
        if received > self.size {
            self.failure = Some(LayerFailure::TooLong(received));
            return Err(io::Error::other("layer longer than declared"));
        }
        self.hasher.update(&buf[..read]);
        Ok(read)
    }
}

/// The decompressed image, read from the layer.
enum ImageReader<'a> {
    Raw(LayerReader<'a>),
    Zstd(Box<ZstdReader<BufReader<LayerReader<'a>>>>),
}

impl ImageReader<'_> {
    fn layer(&self) -> &LayerReader<'_> {
        match self {
            ImageReader::Raw(layer) => layer,
            ImageReader::Zstd(zstd) => zstd.source().get_ref(),
        }
    }

    fn into_layer(self) -> Hasher {
        match self {
            ImageReader::Raw(layer) => layer.hasher,
            ImageReader::Zstd(zstd) => zstd.into_source().into_inner().hasher,
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
            None if reader.ended && reader.hasher.len() < layer.size => {
                InstallError::LayerSizeMismatch {
                    digest: layer.digest.to_string(),
                    expected: layer.size,
                    received: reader.hasher.len(),
                }
            }
            None => InstallError::Decompress {
                digest: layer.digest.to_string(),
                problem: e.to_string(),
            },
        }
    }
}

/// Streams the layer of `response` onto the device; the image's length
/// and digest.
pub(super) fn write_layer(
    response: &mut Response,
    layer: &Layer,
    device: &mut Device,
    progress: &mut dyn FnMut(&Progress),
) -> Result<Digest, InstallError> {
    let url = response.url.to_string();
    let reader = LayerReader {
        body: &mut response.body,
        hasher: Hasher::default(),
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
    let total = (!layer.compressed).then_some(layer.size);
    // The digest of the image as written, for the read-back: a raw layer
    // is the image, so its digest (verified below) is the image's, and
    // hashing the same bytes twice would only cost time.
    let mut image_hasher = layer.compressed.then(Hasher::default);
    let mut length = 0u64;
    let mut buf = vec![0u8; COPY_BUFFER_BYTES];
    let mut next_report = PROGRESS_STEP_BYTES;
    loop {
        let read = image
            .fill(&mut buf)
            .map_err(|e| image.error(e, &url, layer))?;
        if read == 0 {
            break;
        }
        device.write(&buf[..read])?;
        if let Some(hasher) = &mut image_hasher {
            hasher.update(&buf[..read]);
        }
        length += read as u64;
        if length >= next_report {
            next_report = length + PROGRESS_STEP_BYTES;
            progress(&Progress::Writing {
                written: length,
                total,
                received: image.layer().hasher.len(),
                layer_size: layer.size,
            });
        }
    }
    let received = image.layer().hasher.len();
    if received != layer.size {
        return Err(InstallError::LayerSizeMismatch {
            digest: layer.digest.to_string(),
            expected: layer.size,
            received,
        });
    }
    let actual = image.into_layer().finish();
    if actual != layer.digest {
        return Err(InstallError::LayerDigestMismatch {
            expected: layer.digest.to_string(),
            actual: actual.to_string(),
        });
    }
    progress(&Progress::Writing {
        written: length,
        total,
        received,
        layer_size: layer.size,
    });
    Ok(image_hasher.map_or(actual, Hasher::finish))
}
