//! An OS image whose manifest and config were fetched and verified, and
//! its payloads, each read through the chunk verifier
//! ([`verify`](super::verify)) as it streams from the registry.

use std::io::BufReader;

use super::InstallError;
use super::blob::BlobReader;
use super::image_config::{ImageConfig, PayloadSpec};
use super::manifest::{ImageManifest, Layer};
use super::reference::Reference;
use super::verify::{PayloadFailure, VerifiedRead, with_verified};
use super::writer::StreamError;
use super::zstd::ZstdReader;
use metropolis_registry::{RegistryError, Session};

/// A fetched OS image, ready to read payloads from.
pub(super) struct FetchedImage<'a> {
    pub(super) session: Session<'a>,
    pub(super) reference: &'a Reference,
    pub(super) manifest: ImageManifest,
    pub(super) config: ImageConfig,
    /// Threads hashing chunks.
    pub(super) workers: usize,
}

/// A payload's layer as it arrives: raw, or decompressed.
enum Source<'s, 'a> {
    Raw(Box<BlobReader<'s, 'a>>),
    Zstd(Box<ZstdReader<BufReader<BlobReader<'s, 'a>>>>),
}

impl std::io::Read for Source<'_, '_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Source::Raw(blob) => blob.read(buf),
            Source::Zstd(zstd) => zstd.read(buf),
        }
    }
}

impl<'s, 'a> Source<'s, 'a> {
    fn blob(&mut self) -> &mut BlobReader<'s, 'a> {
        match self {
            Source::Raw(blob) => blob,
            Source::Zstd(zstd) => zstd.source_mut().get_mut(),
        }
    }
}

impl<'a> FetchedImage<'a> {
    /// The image, as `host/repository@digest`, for errors.
    pub(super) fn name(&self) -> String {
        self.reference.name()
    }

    /// The payload `name` and its layer; an image without it is invalid.
    pub(super) fn payload(&self, name: &str) -> Result<(PayloadSpec, Layer), InstallError> {
        let missing = || InstallError::InvalidImage {
            image: self.name(),
            problem: format!("it has no {name} payload"),
        };
        let (index, spec) = self.config.payload(name).ok_or_else(missing)?;
        let layer = self.manifest.layers.get(index).ok_or_else(missing)?;
        Ok((spec.clone(), layer.clone()))
    }

    /// Reads payload `name` through `reader`, which sees only verified
    /// bytes; a read failure becomes the error naming the payload and what
    /// went wrong (the transfer, the chunk, the decompression).
    pub(super) fn read_payload<T>(
        &mut self,
        name: &str,
        reader: impl FnOnce(&mut VerifiedRead) -> Result<T, StreamError>,
    ) -> Result<T, InstallError> {
        let (spec, layer) = self.payload(name)?;
        let url = self.reference.url("blobs", &layer.digest.to_string())?;
        let response = self.session.get(&url, None, None)?;
        match response.status {
            200 => {}
            404 => {
                return Err(InstallError::LayerNotFound {
                    layer: format!(
                        "{}/{}@{} (payload {name})",
                        self.reference.base.authority, self.reference.repository, layer.digest
                    ),
                });
            }
            _ => return Err(RegistryError::status(response).into()),
        }
        let decompress_error = |e: std::io::Error| InstallError::Decompress {
            digest: format!("{} (payload {name})", layer.digest),
            problem: e.to_string(),
        };
        let blob = BlobReader::new(&mut self.session, url, response, layer.size);
        let mut source = if layer.compressed {
            let reader = ZstdReader::new(BufReader::with_capacity(256 * 1024, blob))
                .map_err(decompress_error)?;
            Source::Zstd(Box::new(reader))
        } else {
            Source::Raw(Box::new(blob))
        };
        let result = with_verified(&mut source, &spec, self.workers, reader);
        let e = match result {
            Ok(value) => return Ok(value),
            Err(StreamError::Install(e)) => return Err(e),
            Err(StreamError::Read(e)) => e,
        };
        let failure = match PayloadFailure::of(e) {
            Ok(failure) => failure,
            Err(other) => PayloadFailure::Source(other),
        };
        // The transfer's own error says the most, unless a chunk was bad.
        let transfer = source.blob().take_failure();
        Err(match (failure, transfer) {
            (PayloadFailure::ChunkMismatch { chunk, offset }, _) => InstallError::ChunkMismatch {
                payload: name.to_string(),
                chunk,
                offset,
            },
            (_, Some(transfer)) => transfer,
            (PayloadFailure::Truncated { received }, None) => InstallError::PayloadTruncated {
                payload: name.to_string(),
                expected: spec.size,
                received,
            },
            (PayloadFailure::Source(e), None) if layer.compressed => decompress_error(e),
            (PayloadFailure::Source(source), None) => InstallError::from(RegistryError::Transfer {
                url: format!("{} (payload {name})", layer.digest),
                source,
            }),
        })
    }
}
