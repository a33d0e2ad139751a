//! Why an installation failed.

use std::fmt;
use std::io;
use std::path::PathBuf;

use metropolis_registry::RegistryError;

/// Why an installation failed. Its `Display` is the reason the agent
/// reports in the installation report's error, so every variant names
/// what it is about (the image, the URL, the device) and the problem.
#[derive(Debug)]
#[non_exhaustive]
pub enum InstallError {
    /// The installation request or its image reference is unusable.
    InvalidRequest {
        /// The field, e.g. `os_image.digest`.
        field: &'static str,
        /// What is wrong with it.
        problem: String,
    },
    /// The request asks for something this installer cannot do, e.g. an
    /// `https` registry without a TLS configuration.
    Unsupported {
        /// What is not supported.
        what: String,
    },
    /// A request to the registry (or its token server) failed: it could
    /// not be reached, refused the login, answered with an unexpected
    /// status or not in HTTP/1.1, or the transfer broke.
    Registry(RegistryError),
    /// The reference names an image index without a manifest for the
    /// agent's platform.
    PlatformNotFound {
        /// The image, as `host/repository[:tag]@digest`.
        image: String,
        /// The platform wanted, e.g. `linux/amd64`.
        platform: String,
        /// The platforms the index offers (at most ten, then how many
        /// more).
        offered: String,
    },
    /// The manifest does not exist in the registry (404).
    ManifestNotFound {
        /// The image, as `host/repository@digest` or `host/repository:tag`.
        image: String,
    },
    /// The manifest's SHA-256 is not the requested digest.
    ManifestDigestMismatch {
        /// The requested digest.
        expected: String,
        /// The digest of what the registry sent.
        actual: String,
    },
    /// The manifest is not a usable OCI image manifest.
    InvalidManifest {
        /// The image, as `host/repository@digest`.
        image: String,
        /// What is wrong with it.
        problem: String,
    },
    /// The image layer does not exist in the registry (404).
    LayerNotFound {
        /// The layer, as `host/repository@digest`.
        layer: String,
    },
    /// The image (its config, or its payloads against its kind) is not
    /// one this agent can install.
    InvalidImage {
        /// The image, as `host/repository@digest`.
        image: String,
        /// What is wrong with it.
        problem: String,
    },
    /// A payload chunk is not what the image config's hash says: nothing
    /// of it reached the device.
    ChunkMismatch {
        /// The payload, e.g. `system`.
        payload: String,
        /// The chunk's index (from 0).
        chunk: u64,
        /// Its first byte in the payload.
        offset: u64,
    },
    /// A payload ended before the size its config gives.
    PayloadTruncated {
        /// The payload.
        payload: String,
        /// The size the config gives.
        expected: u64,
        /// The bytes it had.
        received: u64,
    },
    /// The machine cannot take a Metropolis install: it did not boot
    /// with EFI, or this agent was built without the A/B loader.
    Unbootable {
        /// Why.
        problem: String,
    },
    /// The layer is not valid zstd.
    Decompress {
        /// The layer's digest, or the payload's name.
        digest: String,
        /// What is wrong.
        problem: String,
    },
    /// Opening, writing, syncing or reading back the root device failed.
    Device {
        /// The root device.
        path: PathBuf,
        /// What was being done, e.g. `write`.
        action: &'static str,
        /// The error.
        source: io::Error,
    },
    /// The root device cannot take the image: not a regular file or block
    /// device, or too small.
    DeviceUnusable {
        /// The root device.
        path: PathBuf,
        /// What is wrong with it.
        problem: String,
    },
    /// What was read back from the root device is not what was written.
    VerificationFailed {
        /// The root device.
        path: PathBuf,
        /// The first byte (from the device's start) that read back other
        /// than it was written.
        offset: u64,
    },
}

impl fmt::Display for InstallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use InstallError::*;
        match self {
            InvalidRequest { field, problem } => {
                write!(f, "invalid installation request: {field}: {problem}")
            }
            Unsupported { what } => write!(f, "unsupported: {what}"),
            Registry(e) => e.fmt(f),
            PlatformNotFound {
                image,
                platform,
                offered,
            } => write!(
                f,
                "{image} is an image index without a {platform} image (it has: {offered})"
            ),
            ManifestNotFound { image } => write!(f, "manifest not found: {image}"),
            ManifestDigestMismatch { expected, actual } => {
                write!(
                    f,
                    "manifest digest mismatch: expected {expected}, got {actual}"
                )
            }
            InvalidManifest { image, problem } => {
                write!(f, "invalid manifest of {image}: {problem}")
            }
            LayerNotFound { layer } => write!(f, "image layer not found: {layer}"),
            InvalidImage { image, problem } => write!(f, "invalid OS image {image}: {problem}"),
            ChunkMismatch {
                payload,
                chunk,
                offset,
            } => write!(
                f,
                "payload {payload}: chunk {chunk} (bytes from {offset}) does not match its \
                 SHA-256 in the image config; nothing of it was written"
            ),
            PayloadTruncated {
                payload,
                expected,
                received,
            } => write!(
                f,
                "payload {payload} ended after {received} of the {expected} bytes the image \
                 config gives"
            ),
            Unbootable { problem } => write!(f, "cannot install Metropolis: {problem}"),
            Decompress { digest, problem } => {
                write!(
                    f,
                    "image layer {digest}: zstd decompression failed: {problem}"
                )
            }
            Device {
                path,
                action,
                source,
            } => write!(f, "root device {}: {action}: {source}", path.display()),
            DeviceUnusable { path, problem } => {
                write!(f, "root device {}: {problem}", path.display())
            }
            VerificationFailed { path, offset } => write!(
                f,
                "root device {}: read-back verification failed: byte {offset} reads back other \
                 than it was written",
                path.display()
            ),
        }
    }
}

impl std::error::Error for InstallError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            InstallError::Registry(e) => e.source(),
            InstallError::Device { source, .. } => Some(source),
            _ => None,
        }
    }
}

impl From<RegistryError> for InstallError {
    fn from(e: RegistryError) -> InstallError {
        InstallError::Registry(e)
    }
}
