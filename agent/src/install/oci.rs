//! [`OciInstaller`]: an OS image from an OCI registry onto the root
//! device.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use metropolis_proto::prelude::debug::OsImageRef;
use serde::Deserialize;

use super::aligned::AlignedBuf;
use super::auth::Session;
use super::credentials::RegistryCredentials;
use super::device::Device;
use super::digest::{Digest, digest_of};
use super::http::{Client, HttpError, Response, bounded};
use super::layer::write_layer;
use super::manifest::{
    DOCKER_MANIFEST, INDEX_TYPES, Layer, Manifest, ManifestProblem, OCI_MANIFEST, Platform,
    parse_manifest,
};
use super::reference::Reference;
use super::{InstallError, Installer, Progress};

/// The largest manifest accepted (the size the OCI distribution
/// specification asks registries to accept at least).
pub const MAX_MANIFEST_BYTES: u64 = 4 * 1024 * 1024;

/// The default deadline of one request (see [`OciInstaller::with_deadline`]).
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(3600);

/// Installs OS images from OCI registries (the distribution API, v2).
///
/// # What it fetches
///
/// 1. The manifest, `GET /v2/<repository>/manifests/<digest>` (by
///    `<tag>` when the reference has one), accepting the OCI image
///    manifest, Docker image manifest v2, OCI image index and Docker
///    manifest list media types, at most [`MAX_MANIFEST_BYTES`]. Its
///    SHA-256 must equal the reference's digest, also when fetched by tag.
/// 2. An image index (a multi-platform image): the entry for the agent's
///    platform ([`Platform::host`], e.g. `linux/amd64`;
///    [`with_platform`](Self::with_platform) to choose another) is
///    fetched by its digest, which it must match, as must the size the
///    index gives. An index without that platform fails with
///    [`InstallError::PlatformNotFound`], naming the platforms it offers.
///    An index inside an index is refused.
/// 3. The image manifest must have `schemaVersion` 2 and exactly one
///    layer: the OS image. Accepted layer media types:
///    - `application/vnd.oci.image.layer.v1.tar`: despite the name, the
///      blob **is** the raw disk image, written as it is;
///    - `application/vnd.oci.image.layer.v1.tar+zstd`: the blob is the
///      raw disk image compressed with zstd (one or more frames; see
///      `zstd.rs` for the window limit).
///
///    Anything else (gzip layers, several layers) is refused.
/// 4. The layer, `GET /v2/<repository>/blobs/<digest>`, streamed to the
///    root device through a fixed-size buffer (memory stays bounded
///    whatever the image size), with its SHA-256 and length checked
///    against the manifest's descriptor as it streams (a layer longer than
///    declared stops the transfer at once; the digest is checked at the
///    end, so a layer that fails it has already been written).
///
/// Redirects (registries send blob downloads to storage elsewhere) are
/// followed up to 5 times: to `https` anywhere, to `http` only on the
/// same host and port when the request was `http` already. The digest
/// verifies what arrives either way.
///
/// # Logins
///
/// A registry answering `401` is logged in to with the login
/// [`with_credentials`](Self::with_credentials) holds for its host: Basic
/// authentication, or the Docker token flow (anonymously when there is no
/// login). Logins go over `https` only; `auth.rs` has the rules.
///
/// # Time limits
///
/// Connects time out after 30 s, each socket read or write after 60 s
/// without progress, and each request as a whole (the layer's download
/// included) after [`DEFAULT_DEADLINE`] ([`with_timeouts`](Self::with_timeouts),
/// [`with_deadline`](Self::with_deadline)).
///
/// # The root device
///
/// A block device; a regular file only with
/// [`allow_image_files`](Self::allow_image_files) (created unless under
/// `/dev/`, cut to the image's length). A raw layer larger than a block
/// device is refused before writing. The device never boots bytes whose
/// digest did not verify: its first and last mebibyte are zeroed before the
/// image is written, and the image's own first mebibyte is written only
/// once the whole layer verified (`device.rs`, "Head last", says why and
/// what it costs). After writing, the device is synced (`fsync`), then read
/// back and its SHA-256 compared with that of the bytes written (a mismatch
/// zeroes the head again). The read goes through the page cache, so it
/// catches short or misplaced writes and a wrong device size, not media
/// errors the drive hides behind the cache.
///
/// # TLS
///
/// `http` registries work as they are. `https` needs a rustls client
/// configuration with the roots to trust ([`OciInstaller::with_tls`];
/// [`registry_tls`](super::registry_tls) makes one from the system's
/// roots and extra CA files): without one an `https` image fails with
/// [`InstallError::Unsupported`].
///
/// # Why not an OCI client crate
///
/// `oci-client` (0.18) was weighed and not taken: it brings reqwest 0.13
/// and about a hundred crates (chrono, oci-spec with its derive macros,
/// url with ICU, regex, rustls-platform-verifier) and a second `sha2`
/// (0.11 beside the workspace's 0.10); its requests have no overall
/// deadline (read and connect timeouts only), its redirect policy is
/// reqwest's (ten hops, any scheme), it cannot take a rustls
/// configuration, and `Client::new` falls back to a default configuration
/// when the given one fails. The hand-written client here is small,
/// blocking like the rest of the installer, and does what is listed above.
#[derive(Clone, Debug)]
pub struct OciInstaller {
    client: Client,
    credentials: Arc<RegistryCredentials>,
    platform: Platform,
    allow_files: bool,
}

impl Default for OciInstaller {
    fn default() -> Self {
        OciInstaller::new()
    }
}

impl OciInstaller {
    /// An installer for `http` registries, anonymous, for the agent's own
    /// platform, with the time limits above.
    pub fn new() -> Self {
        OciInstaller {
            client: Client {
                tls: None,
                connect_timeout: Duration::from_secs(30),
                io_timeout: Duration::from_secs(60),
                deadline: DEFAULT_DEADLINE,
                user_agent: concat!("metropolis-agent/", env!("CARGO_PKG_VERSION")),
            },
            credentials: Arc::new(RegistryCredentials::new()),
            platform: Platform::host(),
            allow_files: false,
        }
    }

    /// Lets the root device be a regular file (an image file, for
    /// trials); without it only block devices are written.
    pub fn allow_image_files(mut self, allow: bool) -> Self {
        self.allow_files = allow;
        self
    }

    /// Lets the installer fetch from `https` registries, authenticating
    /// them with `config` (its root store decides whom to trust).
    pub fn with_tls(mut self, config: Arc<rustls::ClientConfig>) -> Self {
        self.client.tls = Some(config);
        self
    }

    /// The logins given to registries that ask for one.
    pub fn with_credentials(mut self, credentials: RegistryCredentials) -> Self {
        self.credentials = Arc::new(credentials);
        self
    }

    /// The platform picked from image indexes (by default
    /// [`Platform::host`]).
    pub fn with_platform(mut self, platform: Platform) -> Self {
        self.platform = platform;
        self
    }

    /// Sets the connect timeout and the timeout of each socket read or
    /// write (a stalled transfer fails after `io` without progress). Zero
    /// durations count as 1 ms (the socket API has no zero timeout).
    pub fn with_timeouts(mut self, connect: Duration, io: Duration) -> Self {
        let minimum = Duration::from_millis(1);
        self.client.connect_timeout = connect.max(minimum);
        self.client.io_timeout = io.max(minimum);
        self
    }

    /// Sets the deadline of each request as a whole, from its first
    /// connection to the last byte of its body (the layer's download is
    /// one request): a registry that sends too slowly fails the
    /// installation once it passed, with
    /// [`InstallError::Transfer`] saying so. It must allow for the largest
    /// image at the slowest link expected (10 GiB at 10 MiB/s is 17 min).
    pub fn with_deadline(mut self, deadline: Duration) -> Self {
        self.client.deadline = deadline.max(Duration::from_millis(1));
        self
    }
}

impl Installer for OciInstaller {
    fn install(
        &self,
        image: &OsImageRef,
        root_device: &Path,
        progress: &mut dyn FnMut(&Progress),
    ) -> Result<(), InstallError> {
        let reference = Reference::parse(image, self.client.tls.is_some())?;
        let mut session = Session::new(
            &self.client,
            &self.credentials,
            &reference.base,
            &reference.repository,
        );
        let layer = self.fetch_image_manifest(&mut session, &reference)?;
        progress(&Progress::Manifest {
            layer: layer.digest.to_string(),
            size: layer.size,
            compressed: layer.compressed,
        });
        let device = Device::open(root_device, self.allow_files)?;
        if !layer.compressed {
            device.check_capacity(layer.size)?;
        }
        let mut response = fetch_layer(&mut session, &reference, &layer)?;
        // From here until the image verified, the device does not boot
        // (device.rs, "Head last").
        device.invalidate()?;
        let written = write_layer(&mut response, &layer, &device, progress)?;
        device.commit(&written.head, written.length, &mut AlignedBuf::new(0))?;
        progress(&Progress::Verifying {
            verified: written.length,
            total: written.length,
        });
        Ok(())
    }
}

/// The error document of the OCI distribution API.
#[derive(Deserialize)]
struct ErrorDocument {
    errors: Vec<ErrorEntry>,
}

#[derive(Deserialize)]
struct ErrorEntry {
    code: Option<String>,
    message: Option<String>,
}

impl OciInstaller {
    /// The image manifest's layer: the manifest the reference names, or
    /// the one for the agent's platform of the index it names.
    fn fetch_image_manifest(
        &self,
        session: &mut Session<'_>,
        reference: &Reference,
    ) -> Result<Layer, InstallError> {
        let by = match &reference.tag {
            Some(tag) => tag.clone(),
            None => reference.digest.to_string(),
        };
        match self.fetch_manifest(session, reference, &by, reference.digest, None)? {
            Manifest::Image(layer) => Ok(layer),
            Manifest::Index(Err(offered)) => Err(InstallError::PlatformNotFound {
                image: reference.name(),
                platform: self.platform.to_string(),
                offered,
            }),
            Manifest::Index(Ok(entry)) => {
                let by = entry.digest.to_string();
                match self.fetch_manifest(
                    session,
                    reference,
                    &by,
                    entry.digest,
                    Some(entry.size),
                )? {
                    Manifest::Image(layer) => Ok(layer),
                    Manifest::Index(_) => Err(InstallError::InvalidManifest {
                        image: reference.name(),
                        problem: format!(
                            "the {} entry {by} is an image index itself",
                            self.platform
                        ),
                    }),
                }
            }
        }
    }

    /// `GET manifests/<by>`, checked against `digest` (and `size`, when
    /// an index gave it).
    fn fetch_manifest(
        &self,
        session: &mut Session<'_>,
        reference: &Reference,
        by: &str,
        digest: Digest,
        size: Option<u64>,
    ) -> Result<Manifest, InstallError> {
        let url = reference.url("manifests", by)?;
        let accept = format!(
            "{OCI_MANIFEST}, {DOCKER_MANIFEST}, {}, {}",
            INDEX_TYPES[0], INDEX_TYPES[1]
        );
        let mut response = session.get(&url, Some(&accept))?;
        match response.status {
            200 => {}
            404 => {
                return Err(InstallError::ManifestNotFound {
                    image: reference.name(),
                });
            }
            _ => return Err(status_error(response)),
        }
        let body = response
            .read_body(MAX_MANIFEST_BYTES)
            .map_err(|source| InstallError::Transfer {
                url: response.url.to_string(),
                source,
            })?
            .ok_or_else(|| InstallError::InvalidManifest {
                image: reference.name(),
                problem: format!("larger than {MAX_MANIFEST_BYTES} bytes"),
            })?;
        let actual = digest_of(&body);
        if actual != digest {
            return Err(InstallError::ManifestDigestMismatch {
                expected: digest.to_string(),
                actual: actual.to_string(),
            });
        }
        if let Some(size) = size
            && size != body.len() as u64
        {
            return Err(InstallError::InvalidManifest {
                image: reference.name(),
                problem: format!(
                    "the manifest {digest} is {} bytes, not the {size} its index gives",
                    body.len()
                ),
            });
        }
        parse_manifest(&body, response.header("content-type"), &self.platform).map_err(
            |e| match e {
                ManifestProblem::Invalid(problem) => InstallError::InvalidManifest {
                    image: reference.name(),
                    problem,
                },
                ManifestProblem::Unsupported(what) => InstallError::Unsupported {
                    what: format!("{}: {what}", reference.name()),
                },
            },
        )
    }
}

fn fetch_layer(
    session: &mut Session<'_>,
    reference: &Reference,
    layer: &Layer,
) -> Result<Response, InstallError> {
    let url = reference.url("blobs", &layer.digest.to_string())?;
    let response = session.get(&url, None)?;
    match response.status {
        200 => {}
        404 => {
            return Err(InstallError::LayerNotFound {
                layer: format!(
                    "{}/{}@{}",
                    reference.base.authority, reference.repository, layer.digest
                ),
            });
        }
        _ => return Err(status_error(response)),
    }
    if let Some(length) = response.content_length()
        && length != layer.size
    {
        return Err(InstallError::Protocol {
            url: response.url.to_string(),
            problem: format!(
                "Content-Length {length} is not the layer size {} the manifest gives",
                layer.size
            ),
        });
    }
    Ok(response)
}

pub(super) fn http_error(e: HttpError) -> InstallError {
    match e {
        HttpError::Connect { authority, source } => InstallError::Unreachable {
            registry: authority,
            source,
        },
        HttpError::Tls { authority, source } => InstallError::Tls {
            registry: authority,
            source,
        },
        HttpError::TlsUnavailable { url } => InstallError::Unsupported {
            what: format!("{url}: https without a TLS configuration"),
        },
        HttpError::Io { url, source } => InstallError::Transfer { url, source },
        HttpError::Protocol { url, problem } => InstallError::Protocol { url, problem },
        HttpError::TooManyRedirects { url } => InstallError::Protocol {
            url,
            problem: format!("more than {} redirects", super::http::MAX_REDIRECTS),
        },
    }
}

/// How many entries of a registry's error document an error quotes.
const MAX_ERRORS_LISTED: usize = 4;

/// The error for an unexpected status, with the registry's error codes
/// when its body is an OCI error document (the first few, each code and
/// message cut, as is the reason phrase: the registry wrote them).
pub(super) fn status_error(mut response: Response) -> InstallError {
    let detail = response
        .read_body(64 * 1024)
        .ok()
        .flatten()
        .and_then(|body| serde_json::from_slice::<ErrorDocument>(&body).ok())
        .map(|document| {
            document
                .errors
                .iter()
                .map(|e| match (&e.code, &e.message) {
                    (Some(code), Some(message)) => {
                        format!("{}: {}", bounded(code), bounded(message))
                    }
                    (Some(text), None) | (None, Some(text)) => bounded(text),
                    (None, None) => "unspecified error".to_string(),
                })
                .take(MAX_ERRORS_LISTED)
                .collect::<Vec<_>>()
                .join("; ")
        })
        .filter(|detail| !detail.is_empty());
    InstallError::Status {
        url: response.url.to_string(),
        status: response.status,
        reason: bounded(&response.reason),
        detail,
    }
}
