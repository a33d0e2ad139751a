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
mod blob;
mod device;
mod digest;
mod disk_image;
mod error;
pub(crate) mod fuzz;
mod fuzz_seeds;
mod image;
pub mod image_config;
mod manifest;
mod metropolis;
mod oci;
mod reference;
mod stages;
mod table;
mod verify;
mod wire;
mod writer;
mod zstd;

use std::fmt;
use std::path::{Path, PathBuf};

use metropolis_proto::prelude::agent::{OsInstallationRequest, os_installation_request};
use metropolis_proto::prelude::debug::NodeParameters;
use metropolis_proto::prelude::debug::OsImageRef;
use prost::Message;

pub use device::GUARD_BYTES;
pub use error::InstallError;
pub use manifest::{ImageKind, Platform};
pub use metropolis::{MAX_KERNEL_BYTES, MetropolisOptions};
pub use metropolis_registry::{
    RegistryCredentials, RegistryError, RegistryTls, RetryPolicy, registry_tls,
};
pub use oci::{DEFAULT_DEADLINE, DEFAULT_INSTALL_LIMIT, MAX_MANIFEST_BYTES, OciInstaller};

/// Where and with what an image is installed: the parts of a
/// `MetropolisInstallationRequest` besides the image.
#[derive(Clone, Debug, Default)]
pub struct Target {
    /// The root device (checked by [`root_device_path`]).
    pub root_device: PathBuf,
    /// The node's parameters, written to the ESP by a Metropolis install.
    pub node_parameters: Option<NodeParameters>,
    /// The same parameters as the request encoded them, when it came
    /// encoded: written as they are (fields this agent does not know
    /// kept), `network_config` appended when they have none.
    pub node_parameters_encoded: Option<Vec<u8>>,
}

/// Something that installs an OS image onto a root device.
///
/// Implementations block until the installation ended; callers on an
/// async runtime run them on a dedicated thread.
pub trait Installer: Send + Sync {
    /// Installs the image `image` names onto `target`, reporting progress
    /// through `progress`. On success the device holds the image, synced
    /// to stable storage; on failure it may hold part of it, but must not
    /// boot it.
    fn install(
        &self,
        image: &OsImageRef,
        target: &Target,
        progress: &mut dyn FnMut(&Progress),
    ) -> Result<(), InstallError>;
}

/// How far an installation got, as reported to the progress callback.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Progress {
    /// The manifest and the image config were fetched and verified.
    Image {
        /// What the image installs as.
        kind: ImageKind,
        /// Its payloads: name, uncompressed size, whether compressed.
        payloads: Vec<(String, u64, bool)>,
    },
    /// Bytes of a payload were verified, written to the root device and
    /// read back (reported every [`PROGRESS_STEP_BYTES`] and once at the
    /// payload's end).
    Writing {
        /// The payload.
        payload: String,
        /// Its bytes written and read back so far.
        written: u64,
        /// Its size.
        total: u64,
    },
    /// A step of laying out the disk is done, e.g. `partition table written`.
    Step {
        /// What was done.
        done: &'static str,
    },
    /// Something the operator should know that does not fail the
    /// install, e.g. that the kernel refused to re-read the partition
    /// table.
    Notice {
        /// What happened, and what it means.
        text: String,
    },
}

/// How many bytes pass between two progress reports of one payload.
pub const PROGRESS_STEP_BYTES: u64 = 64 * 1024 * 1024;

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

impl fmt::Display for Progress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Progress::Image { kind, payloads } => {
                write!(f, "image verified: {kind}")?;
                for (i, (name, size, compressed)) in payloads.iter().enumerate() {
                    let sep = if i == 0 { "; " } else { ", " };
                    write!(f, "{sep}{name} {}", mib(*size))?;
                    if *compressed {
                        f.write_str(" (zstd)")?;
                    }
                }
                Ok(())
            }
            Progress::Writing {
                payload,
                written,
                total,
            } => write!(
                f,
                "{payload}: verified, written and read back {} of {}",
                mib(*written),
                mib(*total)
            ),
            Progress::Step { done } => f.write_str(done),
            Progress::Notice { text } => f.write_str(text),
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
    install_checked(installer, request, None, progress)
}

/// [`install_request`], with `request` as it was `encoded` when it came
/// so (the node parameters are then written as they were sent).
fn install_checked(
    installer: &dyn Installer,
    request: &OsInstallationRequest,
    encoded: Option<&[u8]>,
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
    let target = Target {
        root_device: root_device_path(&metropolis.root_device)?,
        node_parameters: metropolis.node_parameters.clone(),
        // OSInstallationRequest.metropolis = 2, then
        // MetropolisInstallationRequest.node_parameters = 2.
        node_parameters_encoded: encoded
            .filter(|_| metropolis.node_parameters.is_some())
            .and_then(|encoded| wire::field_bytes(encoded, 2))
            .and_then(|metropolis| wire::field_bytes(&metropolis, 2)),
    };
    installer.install(image, &target, progress)
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
    install_checked(installer, &request, Some(encoded), progress)
}
