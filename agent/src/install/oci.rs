//! [`OciInstaller`]: an OS image from an OCI registry onto the root
//! device.

use std::sync::Arc;
use std::time::Duration;

use metropolis_proto::prelude::debug::OsImageRef;
use metropolis_registry::deadline::{Deadline, Limit};
use metropolis_registry::{
    Access, Client, RegistryCredentials, RegistryError, RetryPolicy, Session, Whole,
};

use super::digest::{Digest, digest_of};
use super::disk_image::install_disk;
use super::image::FetchedImage;
use super::image_config::ImageConfig;
use super::manifest::{
    INDEX_TYPES, ImageKind, ImageManifest, Manifest, ManifestProblem, OCI_MANIFEST, Platform,
    parse_manifest,
};
use super::metropolis::{MetropolisOptions, install_metropolis};
use super::reference::Reference;
use super::verify::workers;
use super::{InstallError, Installer, Progress, Target};

/// The largest manifest accepted: 50 MiB, as the reference's reader
/// (docs/spec/metropolis-install.md section 1; the OCI distribution
/// specification asks registries to accept at least 4 MiB).
pub const MAX_MANIFEST_BYTES: u64 = 50 * 1024 * 1024;

/// The default limit of one installation as a whole (the reference's):
/// see [`OciInstaller::with_install_limit`].
pub const DEFAULT_INSTALL_LIMIT: Duration = Duration::from_secs(15 * 60);

/// The default deadline of one request (see [`OciInstaller::with_deadline`]).
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(3600);

/// Installs OS images from OCI registries (the distribution API, v2).
///
/// # What it fetches
///
/// The image format is the reference's (docs/spec/metropolis-install.md,
/// section 1).
///
/// 1. The manifest, `GET /v2/<repository>/manifests/<digest>` (by
///    `<tag>` when the reference has one), accepting the OCI image
///    manifest and the OCI image index and Docker manifest list media
///    types, at most [`MAX_MANIFEST_BYTES`]. Its SHA-256 must equal the
///    reference's digest, also when fetched by tag.
/// 2. An image index (a multi-platform image): the entry for the agent's
///    platform ([`Platform::host`], e.g. `linux/amd64`;
///    [`with_platform`](Self::with_platform) to choose another) is
///    fetched by its digest, which it must match, as must the size the
///    index gives. An index without that platform fails with
///    [`InstallError::PlatformNotFound`], naming the platforms it offers.
///    An index inside an index is refused.
/// 3. The image manifest: `schemaVersion` 2, an `artifactType` that says
///    what the image installs as ([`ImageKind`]: a Metropolis OS image,
///    `application/vnd.monogon.os.image.v1`, or a whole-disk image,
///    `application/vnd.metropolis-rs.os.disk-image.v1`), the OS image
///    config, and one layer per payload, `application/octet-stream` (raw)
///    or `application/zstd`. Anything else is refused.
/// 4. The config (embedded in its descriptor, or fetched), verified by
///    digest: each payload's size, chunk size and chunk hashes
///    ([`ImageConfig`]).
/// 5. Each payload's layer, `GET /v2/<repository>/blobs/<digest>`,
///    streamed through the chunk verifier (`verify.rs`: every chunk's
///    SHA-256 checked on every core before any byte of it is handed on),
///    resumed with `Range` when its transfer breaks (`blob.rs`), and onto
///    the device ([`ImageKind`] says how). Memory stays bounded whatever
///    the payload's size.
///
/// Requests that fail for a passing reason (a connection, 5xx, 429, ...)
/// are tried again with backoff, honouring `Retry-After`, by default
/// until the installation limit, as the reference does (a manifest or
/// config whose body breaks off is fetched again;
/// [`with_retries`](Self::with_retries); [`RetryPolicy`]).
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
/// login). Logins go over `https` only; [`metropolis_registry::Session`] has the rules.
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
/// [`allow_image_files`](Self::allow_image_files). A whole-disk image is
/// written from the device's first byte, its head last (`device.rs`, "Head
/// last"); a Metropolis image is laid out as `metropolis.rs` says (the
/// partition table last). What is written is read back and compared
/// alongside the writes.
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
/// when the given one fails. The project's own client (the
/// `metropolis-registry` crate, which `metroctl osimage push` uses too)
/// is small, blocking like the rest of the installer, and does what is
/// listed above.
#[derive(Clone, Debug)]
pub struct OciInstaller {
    client: Client,
    credentials: Arc<RegistryCredentials>,
    platform: Platform,
    allow_files: bool,
    metropolis: MetropolisOptions,
    workers: usize,
    install_limit: Duration,
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
                retry: RetryPolicy::until_deadline(),
            },
            credentials: Arc::new(RegistryCredentials::new()),
            platform: Platform::host(),
            allow_files: false,
            metropolis: MetropolisOptions::default(),
            workers: workers(),
            install_limit: DEFAULT_INSTALL_LIMIT,
        }
    }

    /// Sets how long one installation may take in all, from its first
    /// request to the last byte written (by default
    /// [`DEFAULT_INSTALL_LIMIT`]); past it, requests and transfers fail
    /// saying so.
    pub fn with_install_limit(mut self, limit: Duration) -> Self {
        self.install_limit = limit.max(Duration::from_millis(1));
        self
    }

    /// How failed registry requests are tried again (by default
    /// [`RetryPolicy::until_deadline`]: until the installation limit).
    pub fn with_retries(mut self, policy: RetryPolicy) -> Self {
        self.client.retry = policy;
        self
    }

    /// Where a Metropolis install finds the firmware and its variables,
    /// and the network configuration it gives the node when the request
    /// gives none.
    pub fn with_metropolis(mut self, options: MetropolisOptions) -> Self {
        self.metropolis = options;
        self
    }

    /// How many threads verify payload chunks (by default one per core,
    /// at most 8).
    pub fn with_verify_threads(mut self, threads: usize) -> Self {
        self.workers = threads.max(1);
        self
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
    /// [`RegistryError::Transfer`] saying so. It must allow for the largest
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
        target: &Target,
        progress: &mut dyn FnMut(&Progress),
    ) -> Result<(), InstallError> {
        let reference = Reference::parse(image, self.client.tls.is_some())?;
        let mut session = Session::new(
            &self.client,
            &self.credentials,
            &reference.base,
            &reference.repository,
            Access::Pull,
        )
        .within(Deadline::of(Limit::Install, self.install_limit));
        let manifest = self.fetch_image_manifest(&mut session, &reference)?;
        let config = fetch_config(&mut session, &reference, &manifest)?;
        progress(&Progress::Image {
            kind: manifest.kind,
            payloads: config
                .payloads
                .iter()
                .zip(&manifest.layers)
                .map(|(p, l)| (p.name.clone(), p.size, l.compressed))
                .collect(),
        });
        let mut image = FetchedImage {
            session,
            reference: &reference,
            manifest,
            config,
            workers: self.workers,
        };
        match image.manifest.kind {
            ImageKind::Disk => install_disk(&mut image, target, self.allow_files, progress),
            ImageKind::Metropolis => install_metropolis(
                &mut image,
                target,
                &self.metropolis,
                self.allow_files,
                progress,
            ),
        }
    }
}

/// The image config `manifest` names: embedded in its descriptor or
/// fetched, verified by digest, parsed and checked against the layers.
fn fetch_config(
    session: &mut Session<'_>,
    reference: &Reference,
    manifest: &ImageManifest,
) -> Result<ImageConfig, InstallError> {
    let invalid = |problem: String| InstallError::InvalidImage {
        image: reference.name(),
        problem,
    };
    let body = match &manifest.config.data {
        Some(data) => data.clone(),
        None => {
            let url = reference.url("blobs", &manifest.config.digest.to_string())?;
            match session.get_whole(&url, None, manifest.config.size)? {
                Whole::Body { bytes, .. } => bytes,
                Whole::TooLarge(_) => {
                    return Err(invalid(format!(
                        "the config is longer than the {} bytes its descriptor gives",
                        manifest.config.size
                    )));
                }
                Whole::Status(response) => return Err(RegistryError::status(response).into()),
            }
        }
    };
    let actual = digest_of(&body);
    if actual != manifest.config.digest || body.len() as u64 != manifest.config.size {
        return Err(invalid(format!(
            "the config ({} bytes, {actual}) is not the {} bytes of {} its descriptor gives",
            body.len(),
            manifest.config.size,
            manifest.config.digest
        )));
    }
    let config = ImageConfig::parse(&body).map_err(|e| invalid(format!("config: {e}")))?;
    if config.payloads.len() != manifest.layers.len() {
        return Err(invalid(format!(
            "the config has {} payloads and the manifest {} layers; each payload is one layer",
            config.payloads.len(),
            manifest.layers.len()
        )));
    }
    Ok(config)
}

impl OciInstaller {
    /// The image manifest's layer: the manifest the reference names, or
    /// the one for the agent's platform of the index it names.
    fn fetch_image_manifest(
        &self,
        session: &mut Session<'_>,
        reference: &Reference,
    ) -> Result<ImageManifest, InstallError> {
        let by = match &reference.tag {
            Some(tag) => tag.clone(),
            None => reference.digest.to_string(),
        };
        match self.fetch_manifest(session, reference, &by, reference.digest, None)? {
            Manifest::Image(image) => Ok(image),
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
                    Manifest::Image(image) => Ok(image),
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
        let accept = format!("{OCI_MANIFEST}, {}, {}", INDEX_TYPES[0], INDEX_TYPES[1]);
        let (response, body) = match session.get_whole(&url, Some(&accept), MAX_MANIFEST_BYTES)? {
            Whole::Body { response, bytes } => (response, bytes),
            Whole::TooLarge(_) => {
                return Err(InstallError::InvalidManifest {
                    image: reference.name(),
                    problem: format!("larger than {MAX_MANIFEST_BYTES} bytes"),
                });
            }
            Whole::Status(response) if response.status == 404 => {
                return Err(InstallError::ManifestNotFound {
                    image: reference.name(),
                });
            }
            Whole::Status(response) => return Err(RegistryError::status(response).into()),
        };
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
