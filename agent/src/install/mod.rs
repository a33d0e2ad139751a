//! Installing the OS an `OSInstallationRequest` asks for (docs/spec/semantics.md,
//! "The agent": fetch the image from its OCI registry, manifest by digest,
//! digest verified; write it to `root_device`; verify what was written).
//!
//! - [`Installer`] is the seam: anything that can put an image on a
//!   device. [`OciInstaller`] is the real one.
//! - [`install_request`] / [`install_encoded_request`] take a whole
//!   request (as the agent loop hands it over), check it and call an
//!   installer.
//!
//! Installation is blocking: the runtime runs it on a dedicated thread
//! (see the [parent module](super) for why), and feeds [`Progress`] to
//! its log from the callback.

mod aligned;
mod auth;
mod body;
mod credentials;
mod deadline;
mod device;
mod digest;
mod error;
pub(crate) mod fuzz;
mod fuzz_seeds;
mod http;
mod layer;
mod manifest;
mod oci;
mod reference;
mod stages;
mod trust;
mod url;
mod zstd;

use std::fmt;
use std::path::{Path, PathBuf};

use metropolis_proto::prelude::agent::{OsInstallationRequest, os_installation_request};
use metropolis_proto::prelude::debug::OsImageRef;
use prost::Message;

pub use credentials::RegistryCredentials;
pub use device::GUARD_BYTES;
pub use error::InstallError;
pub use manifest::Platform;
pub use oci::{DEFAULT_DEADLINE, MAX_MANIFEST_BYTES, OciInstaller};
pub use trust::{RegistryTls, registry_tls};

/// Something that installs an OS image onto a root device.
///
/// Implementations block until the installation ended; callers on an
/// async runtime run them on a dedicated thread.
pub trait Installer: Send + Sync {
    /// Installs the image `image` names onto `root_device`, reporting
    /// progress through `progress`. On success the device holds exactly
    /// the image, synced to stable storage and verified by reading it
    /// back; on failure it may hold part of it, but must not boot it.
    fn install(
        &self,
        image: &OsImageRef,
        root_device: &Path,
        progress: &mut dyn FnMut(&Progress),
    ) -> Result<(), InstallError>;
}

/// How far an installation got, as reported to the progress callback.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Progress {
    /// The manifest was fetched and verified; the image layer is next.
    Manifest {
        /// The layer's digest.
        layer: String,
        /// The layer's size as stored in the registry.
        size: u64,
        /// Whether the layer is zstd-compressed.
        compressed: bool,
    },
    /// Image bytes were written to the root device and read back
    /// (reported every [`PROGRESS_STEP_BYTES`] received and once at the
    /// end).
    Writing {
        /// Image bytes written and read back so far.
        written: u64,
        /// The image's size, when known before the end (an uncompressed
        /// layer).
        total: Option<u64>,
        /// Layer bytes received so far.
        received: u64,
        /// The layer's size as stored in the registry.
        layer_size: u64,
    },
    /// The image on the root device was read back and compared with what
    /// was written. Reading back runs alongside the writes, chunk by
    /// chunk, and the held-back head last: this is reported once, when
    /// all of it compared equal.
    Verifying {
        /// Bytes read back so far.
        verified: u64,
        /// The bytes written.
        total: u64,
    },
}

/// How many bytes pass between two progress reports of one stage.
pub const PROGRESS_STEP_BYTES: u64 = 64 * 1024 * 1024;

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

impl fmt::Display for Progress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Progress::Manifest {
                layer,
                size,
                compressed,
            } => write!(
                f,
                "manifest verified; image layer {layer}, {}{}",
                mib(*size),
                if *compressed { ", zstd" } else { "" }
            ),
            Progress::Writing {
                written,
                total,
                received,
                layer_size,
            } => {
                write!(f, "written and read back: {}", mib(*written))?;
                if let Some(total) = total {
                    write!(f, " of {}", mib(*total))?;
                } else {
                    write!(f, " ({} of {} received)", mib(*received), mib(*layer_size))?;
                }
                Ok(())
            }
            Progress::Verifying { verified, total } => write!(
                f,
                "verified: {} of {} on the device as written",
                mib(*verified),
                mib(*total)
            ),
        }
    }
}

/// The root device path of a request's `root_device`, by the rule the
/// server applies too ([`metropolis_core::provisioning::root_device_path`]):
/// a name without `/` (`sda`, `nvme0n1`) is the device of that name under
/// `/dev`, a path must be absolute and under `/dev/` without `.` or `..`
/// components. Where the path exists, it must also stay under `/dev/` once
/// its symbolic links are resolved: `/dev/disk/by-id/…` leads to
/// `/dev/sda`, but `/dev/stdout` or `/dev/fd/3` lead out of it.
pub fn root_device_path(root_device: &str) -> Result<PathBuf, InstallError> {
    let invalid = |problem: String| InstallError::InvalidRequest {
        field: "metropolis.root_device",
        problem,
    };
    let path = PathBuf::from(
        metropolis_core::provisioning::root_device_path(root_device)
            .map_err(|e| invalid(e.to_string()))?,
    );
    match std::fs::symlink_metadata(&path) {
        // Nothing there (yet): the installer's open says what it finds.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(path),
        Err(e) => return Err(invalid(format!("{}: {e}", path.display()))),
        Ok(_) => {}
    }
    let resolved = std::fs::canonicalize(&path).map_err(|e| {
        invalid(format!(
            "{}: cannot resolve its symbolic links: {e}",
            path.display()
        ))
    })?;
    let dev = Path::new(metropolis_core::provisioning::DEVICE_DIR);
    if resolved.parent().is_none_or(|p| !p.starts_with(dev)) {
        return Err(invalid(format!(
            "{} leads to {}, which is not under {}",
            path.display(),
            resolved.display(),
            dev.display()
        )));
    }
    Ok(path)
}

/// Carries out `request` with `installer`: checks that it is a Metropolis
/// installation with an image and a root device (see
/// [`root_device_path`]), then installs.
pub fn install_request(
    installer: &dyn Installer,
    request: &OsInstallationRequest,
    progress: &mut dyn FnMut(&Progress),
) -> Result<(), InstallError> {
    let Some(os_installation_request::Type::Metropolis(metropolis)) = &request.r#type else {
        return Err(InstallError::Unsupported {
            what: "installation request of no known type (only metropolis is supported)"
                .to_string(),
        });
    };
    let Some(image) = &metropolis.os_image else {
        return Err(InstallError::InvalidRequest {
            field: "metropolis.os_image",
            problem: "missing".to_string(),
        });
    };
    let root_device = root_device_path(&metropolis.root_device)?;
    installer.install(image, &root_device, progress)
}

/// [`install_request`] for an encoded `OSInstallationRequest`, as the
/// agent loop's `Action::Install` carries it.
pub fn install_encoded_request(
    installer: &dyn Installer,
    encoded: &[u8],
    progress: &mut dyn FnMut(&Progress),
) -> Result<(), InstallError> {
    let request =
        OsInstallationRequest::decode(encoded).map_err(|e| InstallError::InvalidRequest {
            field: "OSInstallationRequest",
            problem: format!("cannot decode: {e}"),
        })?;
    install_request(installer, &request, progress)
}
