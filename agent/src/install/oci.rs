//! [`OciInstaller`]: an OS image from an OCI registry onto the root
//! device.

use std::io::{self, BufReader, Read};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use metropolis_proto::prelude::debug::OsImageRef;
use serde::Deserialize;

use super::device::Device;
use super::digest::{Digest, Hasher, digest_of};
use super::http::{Body, Client, HttpError, Response, Scheme, Url};
use super::zstd::ZstdReader;
use super::{InstallError, Installer, PROGRESS_STEP_BYTES, Progress};

/// The largest manifest accepted (the size the OCI distribution
/// specification asks registries to accept at least).
pub const MAX_MANIFEST_BYTES: u64 = 4 * 1024 * 1024;

const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
const INDEX_TYPES: [&str; 2] = [
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
];
const LAYER_RAW: &str = "application/vnd.oci.image.layer.v1.tar";
const LAYER_ZSTD: &str = "application/vnd.oci.image.layer.v1.tar+zstd";

/// The size of the copy buffer, and so of the writes to the device.
const COPY_BUFFER_BYTES: usize = 1024 * 1024;

/// Installs OS images from OCI registries (the distribution API, v2).
///
/// # What it fetches
///
/// 1. The manifest, `GET /v2/<repository>/manifests/<digest>` (by
///    `<tag>` when the reference has one), accepting the OCI image
///    manifest and Docker image manifest v2 media types, at most
///    [`MAX_MANIFEST_BYTES`]. Its SHA-256 must equal the reference's
///    digest, also when fetched by tag. Image indexes (multi-platform
///    images) are refused: reference the platform manifest's digest.
/// 2. The manifest must have `schemaVersion` 2 and exactly one layer: the
///    OS image. Accepted layer media types:
///    - `application/vnd.oci.image.layer.v1.tar`: despite the name, the
///      blob **is** the raw disk image, written as it is;
///    - `application/vnd.oci.image.layer.v1.tar+zstd`: the blob is the
///      raw disk image compressed with zstd (one or more frames; see
///      `zstd.rs` for the window limit).
///
///    Anything else (gzip layers, several layers) is refused.
/// 3. The layer, `GET /v2/<repository>/blobs/<digest>`, streamed to the
///    root device through a fixed-size buffer (memory stays bounded
///    whatever the image size), with its SHA-256 and length checked
///    against the manifest's descriptor as it streams (a layer longer than
///    declared stops the transfer at once; the digest is checked at the
///    end, so a layer that fails it has already been written).
///
/// Redirects (registries send blob downloads to storage elsewhere) are
/// followed, also to other hosts: nothing secret is sent, and the digest
/// verifies what arrives. Registries that require authentication (`401`)
/// are not supported.
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
/// configuration with the roots to trust ([`OciInstaller::with_tls`]):
/// the agent has no system trust store, so without one an `https` image
/// fails with [`InstallError::Unsupported`].
#[derive(Clone, Debug)]
pub struct OciInstaller {
    client: Client,
    allow_files: bool,
}

impl Default for OciInstaller {
    fn default() -> Self {
        OciInstaller::new()
    }
}

impl OciInstaller {
    /// An installer for `http` registries, with a 30 s connect timeout
    /// and a 60 s timeout on every socket read and write.
    pub fn new() -> Self {
        OciInstaller {
            client: Client {
                tls: None,
                connect_timeout: Duration::from_secs(30),
                io_timeout: Duration::from_secs(60),
                user_agent: concat!("metropolis-agent/", env!("CARGO_PKG_VERSION")),
            },
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

    /// Sets the connect timeout and the timeout of each socket read or
    /// write (a stalled transfer fails after `io` without progress). Zero
    /// durations count as 1 ms (the socket API has no zero timeout).
    pub fn with_timeouts(mut self, connect: Duration, io: Duration) -> Self {
        let minimum = Duration::from_millis(1);
        self.client.connect_timeout = connect.max(minimum);
        self.client.io_timeout = io.max(minimum);
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
        let layer = self.fetch_manifest(&reference)?;
        progress(&Progress::Manifest {
            layer: layer.digest.to_string(),
            size: layer.size,
            compressed: layer.compressed,
        });
        let mut device = Device::open(root_device, self.allow_files)?;
        if !layer.compressed {
            device.check_capacity(layer.size)?;
        }
        let mut response = self.fetch_layer(&reference, &layer)?;
        // From here until the image verified, the device does not boot
        // (device.rs, "Head last").
        device.invalidate()?;
        let digest = write_layer(&mut response, &layer, &mut device, progress)?;
        device.commit()?;
        device.verify(digest, progress)
    }
}

/// A checked image reference.
struct Reference {
    base: Url,
    repository: String,
    tag: Option<String>,
    digest: Digest,
}

impl Reference {
    fn parse(image: &OsImageRef, have_tls: bool) -> Result<Reference, InstallError> {
        let scheme = match image.scheme.as_str() {
            "http" => Scheme::Http,
            "https" if have_tls => Scheme::Https,
            "https" => {
                return Err(InstallError::Unsupported {
                    what: format!(
                        "https registry {}: the installer has no TLS configuration to trust it with",
                        image.host
                    ),
                });
            }
            other => {
                return Err(InstallError::InvalidRequest {
                    field: "os_image.scheme",
                    problem: format!("{other:?} is not http or https"),
                });
            }
        };
        let base = Url::parse(&format!("{}://{}/", image.scheme, image.host))
            .ok()
            .filter(|url| url.authority == image.host)
            .ok_or_else(|| InstallError::InvalidRequest {
                field: "os_image.host",
                problem: format!("{:?} is not host[:port]", image.host),
            })?;
        debug_assert_eq!(base.scheme, scheme);
        check_repository(&image.repository)?;
        let tag = if image.tag.is_empty() {
            None
        } else {
            check_tag(&image.tag)?;
            Some(image.tag.clone())
        };
        if image.digest.is_empty() {
            return Err(InstallError::InvalidRequest {
                field: "os_image.digest",
                problem: "missing (the manifest digest is required)".to_string(),
            });
        }
        let digest =
            Digest::parse(&image.digest).map_err(|problem| InstallError::InvalidRequest {
                field: "os_image.digest",
                problem,
            })?;
        Ok(Reference {
            base,
            repository: image.repository.clone(),
            tag,
            digest,
        })
    }

    fn url(&self, kind: &str, reference: &str) -> Result<Url, InstallError> {
        let target = format!("/v2/{}/{kind}/{reference}", self.repository);
        self.base
            .with_target(&target)
            .map_err(|problem| InstallError::InvalidRequest {
                field: "os_image",
                problem,
            })
    }

    /// The image as `host/repository[:tag]@digest`.
    fn name(&self) -> String {
        match &self.tag {
            Some(tag) => format!(
                "{}/{}:{tag}@{}",
                self.base.authority, self.repository, self.digest
            ),
            None => format!(
                "{}/{}@{}",
                self.base.authority, self.repository, self.digest
            ),
        }
    }
}

/// Checks a repository name against the OCI distribution grammar:
/// `/`-separated components of lowercase letters and digits, joined by
/// single separators `.`, `_`, `__` or runs of `-`.
fn check_repository(repository: &str) -> Result<(), InstallError> {
    let invalid = |problem: String| InstallError::InvalidRequest {
        field: "os_image.repository",
        problem,
    };
    if repository.is_empty() {
        return Err(invalid("missing".to_string()));
    }
    if repository.len() > 255 {
        return Err(invalid("longer than 255 characters".to_string()));
    }
    for component in repository.split('/') {
        let bytes = component.as_bytes();
        let alnum = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
        let well_formed = bytes.first().is_some_and(alnum)
            && bytes.last().is_some_and(alnum)
            && bytes
                .iter()
                .all(|b| alnum(b) || matches!(b, b'.' | b'_' | b'-'))
            && !component.contains("..")
            && !component.contains("___")
            && !component.contains("._")
            && !component.contains("_.")
            && !component.contains(".-")
            && !component.contains("-.")
            && !component.contains("_-")
            && !component.contains("-_");
        if !well_formed {
            return Err(invalid(format!(
                "{repository:?} is not a repository name (lowercase letters and digits, separated by '.', '_', '__', '-' or '/')"
            )));
        }
    }
    Ok(())
}

/// Checks a tag: `[A-Za-z0-9_][A-Za-z0-9._-]{0,127}`.
fn check_tag(tag: &str) -> Result<(), InstallError> {
    let bytes = tag.as_bytes();
    let well_formed = bytes.len() <= 128
        && bytes
            .first()
            .is_some_and(|b| b.is_ascii_alphanumeric() || *b == b'_')
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if well_formed {
        Ok(())
    } else {
        Err(InstallError::InvalidRequest {
            field: "os_image.tag",
            problem: format!("{tag:?} is not a tag"),
        })
    }
}

/// The OS image layer named by a verified manifest.
struct Layer {
    digest: Digest,
    size: u64,
    compressed: bool,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ManifestDocument {
    schema_version: Option<u32>,
    media_type: Option<String>,
    layers: Option<Vec<DescriptorDocument>>,
    manifests: Option<serde::de::IgnoredAny>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct DescriptorDocument {
    media_type: String,
    digest: String,
    size: u64,
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
    fn get(&self, url: &Url, accept: Option<&str>) -> Result<Response, InstallError> {
        self.client.get(url, accept).map_err(http_error)
    }

    fn fetch_manifest(&self, reference: &Reference) -> Result<Layer, InstallError> {
        let by = match &reference.tag {
            Some(tag) => tag.clone(),
            None => reference.digest.to_string(),
        };
        let url = reference.url("manifests", &by)?;
        let accept = format!("{OCI_MANIFEST}, {DOCKER_MANIFEST}");
        let mut response = self.get(&url, Some(&accept))?;
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
        if actual != reference.digest {
            return Err(InstallError::ManifestDigestMismatch {
                expected: reference.digest.to_string(),
                actual: actual.to_string(),
            });
        }
        parse_manifest(&body, response.header("content-type")).map_err(|e| match e {
            ManifestProblem::Invalid(problem) => InstallError::InvalidManifest {
                image: reference.name(),
                problem,
            },
            ManifestProblem::Unsupported(what) => InstallError::Unsupported {
                what: format!("{}: {what}", reference.name()),
            },
        })
    }

    fn fetch_layer(&self, reference: &Reference, layer: &Layer) -> Result<Response, InstallError> {
        let url = reference.url("blobs", &layer.digest.to_string())?;
        let response = self.get(&url, None)?;
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
}

enum ManifestProblem {
    Invalid(String),
    Unsupported(String),
}

/// The OS image layer of a manifest (already verified by digest).
fn parse_manifest(body: &[u8], content_type: Option<&str>) -> Result<Layer, ManifestProblem> {
    use ManifestProblem::{Invalid, Unsupported};
    let document: ManifestDocument =
        serde_json::from_slice(body).map_err(|e| Invalid(format!("not an image manifest: {e}")))?;
    let media_type = document
        .media_type
        .as_deref()
        .or(content_type.map(|t| t.split(';').next().unwrap_or("").trim()));
    let is_index = media_type.is_some_and(|t| INDEX_TYPES.contains(&t))
        || (document.manifests.is_some() && document.layers.is_none());
    if is_index {
        return Err(Unsupported(
            "the digest names an image index; give the digest of the image manifest itself"
                .to_string(),
        ));
    }
    if let Some(media_type) = &document.media_type
        && media_type != OCI_MANIFEST
        && media_type != DOCKER_MANIFEST
    {
        return Err(Invalid(format!(
            "mediaType {media_type:?} is not an image manifest"
        )));
    }
    if document.schema_version != Some(2) {
        return Err(Invalid(format!(
            "schemaVersion is {:?}, not 2",
            document.schema_version
        )));
    }
    let Some(layers) = document.layers else {
        return Err(Invalid("layers: missing".to_string()));
    };
    let [layer] = &layers[..] else {
        return Err(Invalid(format!(
            "layers: expected exactly one (the OS image), found {}",
            layers.len()
        )));
    };
    let compressed = match layer.media_type.as_str() {
        LAYER_RAW => false,
        LAYER_ZSTD => true,
        other => {
            return Err(Unsupported(format!(
                "image layer media type {other:?} (accepted: {LAYER_RAW}, {LAYER_ZSTD})"
            )));
        }
    };
    let digest =
        Digest::parse(&layer.digest).map_err(|e| Invalid(format!("layers[0].digest: {e}")))?;
    Ok(Layer {
        digest,
        size: layer.size,
        compressed,
    })
}

fn http_error(e: HttpError) -> InstallError {
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

/// The error for an unexpected status, with the registry's error codes
/// when its body is an OCI error document.
fn status_error(mut response: Response) -> InstallError {
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
                    (Some(code), Some(message)) => format!("{code}: {message}"),
                    (Some(text), None) | (None, Some(text)) => text.clone(),
                    (None, None) => "unspecified error".to_string(),
                })
                .collect::<Vec<_>>()
                .join("; ")
        })
        .filter(|detail| !detail.is_empty());
    InstallError::Status {
        url: response.url.to_string(),
        status: response.status,
        reason: response.reason.clone(),
        detail,
    }
}

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
fn write_layer(
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn repository_names() {
        for good in ["os", "metropolis/node", "a.b_c__d---e/f0", "x/y/z"] {
            assert!(check_repository(good).is_ok(), "{good}");
        }
        for bad in [
            "", "OS", "a//b", "/a", "a/", "-a", "a-", "a..b", "a___b", "a b", "../x", "a?b", "a%2f",
        ] {
            assert!(check_repository(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn tags() {
        for good in ["latest", "v1.2.3", "_x", "A-b_c.d"] {
            assert!(check_tag(good).is_ok(), "{good}");
        }
        for bad in [".x", "-x", "a/b", "a:b", &"x".repeat(129)] {
            assert!(check_tag(bad).is_err(), "{bad}");
        }
    }

    fn manifest(media_type: &str, layers: &str) -> Vec<u8> {
        format!(
            r#"{{"schemaVersion":2,"mediaType":"{media_type}","config":{{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a","size":2}},"layers":[{layers}]}}"#
        )
        .into_bytes()
    }

    const LAYER: &str = r#"{"mediaType":"application/vnd.oci.image.layer.v1.tar+zstd","digest":"sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855","size":0}"#;

    #[test]
    fn manifests() {
        let layer = parse_manifest(&manifest(OCI_MANIFEST, LAYER), None)
            .ok()
            .unwrap();
        assert!(layer.compressed);
        assert_eq!(layer.size, 0);

        let cases: Vec<(Vec<u8>, &str)> = vec![
            (b"{".to_vec(), "not an image manifest"),
            (manifest(OCI_MANIFEST, ""), "found 0"),
            (
                manifest(OCI_MANIFEST, &format!("{LAYER},{LAYER}")),
                "found 2",
            ),
            (
                manifest(OCI_MANIFEST, &LAYER.replace("+zstd", "+gzip")),
                "media type",
            ),
            (
                manifest(OCI_MANIFEST, &LAYER.replace(":0}", ":-1}")),
                "not an image manifest",
            ),
            (manifest("text/plain", LAYER), "mediaType"),
            (manifest(INDEX_TYPES[0], LAYER), "image index"),
            (
                br#"{"schemaVersion":2,"manifests":[]}"#.to_vec(),
                "image index",
            ),
            (
                br#"{"schemaVersion":1,"layers":[]}"#.to_vec(),
                "schemaVersion",
            ),
        ];
        for (body, expected) in cases {
            let problem = match parse_manifest(&body, None) {
                Ok(_) => panic!("accepted {}", String::from_utf8_lossy(&body)),
                Err(ManifestProblem::Invalid(p) | ManifestProblem::Unsupported(p)) => p,
            };
            assert!(problem.contains(expected), "{problem:?} lacks {expected:?}");
        }
    }
}
