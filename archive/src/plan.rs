//! The result of a validated archive: what a store writes, and where the
//! bytes came from.

use std::collections::BTreeMap;
use std::fmt;

use bytes::Bytes;

/// OCI image manifest media type (used for synthesized manifests).
pub const MEDIA_TYPE_OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
/// OCI image index media type.
pub const MEDIA_TYPE_OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
/// OCI image config media type (used for Docker archive configs too, as
/// Docker 25's own `docker save` does).
pub const MEDIA_TYPE_OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
/// OCI uncompressed layer media type.
pub const MEDIA_TYPE_OCI_LAYER: &str = "application/vnd.oci.image.layer.v1.tar";
/// OCI gzip-compressed layer media type.
pub const MEDIA_TYPE_OCI_LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
/// OCI zstd-compressed layer media type.
pub const MEDIA_TYPE_OCI_LAYER_ZSTD: &str = "application/vnd.oci.image.layer.v1.tar+zstd";
/// Docker schema 2 manifest media type (accepted in OCI layouts).
pub const MEDIA_TYPE_DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
/// Docker manifest list media type (accepted in OCI layouts).
pub const MEDIA_TYPE_DOCKER_MANIFEST_LIST: &str =
    "application/vnd.docker.distribution.manifest.list.v2+json";
/// Docker image config media type (accepted in OCI layouts).
pub const MEDIA_TYPE_DOCKER_CONFIG: &str = "application/vnd.docker.container.image.v1+json";

/// A sha256 content digest (the only algorithm this validator hashes).
///
/// Displays and parses as `sha256:<64 lowercase hex digits>`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest([u8; 32]);

impl Digest {
    /// The digest with these sha256 bytes.
    pub fn from_sha256(bytes: [u8; 32]) -> Digest {
        Digest(bytes)
    }

    /// The sha256 of `data`.
    pub fn of(data: &[u8]) -> Digest {
        use sha2::Digest as _;
        Digest(sha2::Sha256::digest(data).into())
    }

    /// The raw sha256 bytes.
    pub fn sha256(&self) -> &[u8; 32] {
        &self.0
    }

    /// The 64 lowercase hex digits, without the `sha256:` prefix (the blob
    /// file name in an OCI layout).
    pub fn hex(&self) -> String {
        let mut s = String::with_capacity(64);
        for b in self.0 {
            s.push(HEX[(b >> 4) as usize] as char);
            s.push(HEX[(b & 0xf) as usize] as char);
        }
        s
    }

    /// Parses 64 lowercase hex digits (no prefix).
    pub fn from_hex(hex: &str) -> Option<Digest> {
        let bytes = hex.as_bytes();
        if bytes.len() != 64 {
            return None;
        }
        let mut out = [0u8; 32];
        for (i, pair) in bytes.chunks_exact(2).enumerate() {
            out[i] = (hex_val(pair[0])? << 4) | hex_val(pair[1])?;
        }
        Some(Digest(out))
    }

    /// Parses `sha256:<64 lowercase hex>`.
    pub fn parse(s: &str) -> Result<Digest, DigestError> {
        let Some((alg, hex)) = s.split_once(':') else {
            return Err(DigestError::Malformed);
        };
        if alg != "sha256" {
            // OCI algorithm grammar: [a-z0-9]+([+._-][a-z0-9]+)*
            let valid_alg = !alg.is_empty()
                && alg
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"+._-".contains(&b));
            return Err(if valid_alg {
                DigestError::UnsupportedAlgorithm
            } else {
                DigestError::Malformed
            });
        }
        Digest::from_hex(hex).ok_or(DigestError::Malformed)
    }
}

/// Why a digest string does not parse.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DigestError {
    /// Not `algorithm:encoded`, or not 64 lowercase hex digits for sha256.
    Malformed,
    /// A well-formed digest with an algorithm other than sha256.
    UnsupportedAlgorithm,
}

const HEX: &[u8; 16] = b"0123456789abcdef";

fn hex_val(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}", self.hex())
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}", self.hex())
    }
}

/// The archive format a plan was built from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// A `docker save` archive (`manifest.json`) whose image configs use
    /// nothing newer than Docker image spec v1.1. The v1.1 and v1.2 archive
    /// layouts are identical; they differ only in the image JSON (v1.2
    /// added `Healthcheck`), so the lowest version the configs conform to
    /// is reported.
    DockerV1_1,
    /// A `docker save` archive at least one of whose configs has a
    /// `Healthcheck` (Docker image spec v1.2).
    DockerV1_2,
    /// An OCI image layout v1 (`oci-layout`, `index.json`, `blobs/`),
    /// including Docker 25+ `docker save` output, which is an OCI layout
    /// with a `manifest.json` beside it (that one is validated as well).
    Oci,
}

/// Compression of a layer blob, from its leading magic bytes (and, in an
/// OCI layout, its media type).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    /// An uncompressed tar (no known magic).
    None,
    /// gzip (`1f 8b`).
    Gzip,
    /// zstd (`28 b5 2f fd`).
    Zstd,
}

/// A content descriptor, as in OCI.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Descriptor {
    /// Media type of the referenced content.
    pub media_type: String,
    /// Digest of the referenced content.
    pub digest: Digest,
    /// Size in bytes of the referenced content.
    pub size: u64,
}

/// A blob whose bytes are a member of the archive.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlobSource {
    /// Digest of the blob's content (checked against the member's bytes).
    pub digest: Digest,
    /// Size in bytes (equal to the member's size).
    pub size: u64,
    /// Media type, where a descriptor or the Docker manifest says it
    /// (the first descriptor naming this blob wins).
    pub media_type: Option<String>,
    /// Index of the regular-file member holding the bytes (the `index` of
    /// its [`Output::MemberStart`](super::Output::MemberStart)); links were
    /// resolved to this member.
    pub member: usize,
    /// For layers: their compression (from magic bytes). `None` for
    /// configs, manifests and indexes.
    pub compression: Option<Compression>,
    /// For a compressed layer whose uncompressed digest (Docker `diff_id`)
    /// the archive declares: that digest, **not verified** here (it would
    /// need decompression). A store that unpacks the layer should check
    /// it. `None` when there is nothing left to check (uncompressed layers
    /// were checked against their `diff_id`; non-layers have none).
    pub unverified_diff_id: Option<Digest>,
}

/// A blob the validator wrote itself (the manifest of a Docker archive
/// image), for the store to write like any other blob.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SynthesizedBlob {
    /// The sha256 of `data`.
    pub digest: Digest,
    /// The content.
    pub data: Bytes,
    /// Its media type ([`MEDIA_TYPE_OCI_MANIFEST`]).
    pub media_type: String,
}

/// An image the archive names (or carries unnamed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageRef {
    /// Normalised reference (`docker.io/library/busybox:latest`), if the
    /// archive names the image; see the module docs for the rules.
    pub name: Option<String>,
    /// The image's manifest (or index) descriptor: a [`BlobSource`] or a
    /// [`SynthesizedBlob`] of the same plan has this digest.
    pub manifest: Descriptor,
}

/// What a validated archive holds, format-neutral: enough to write an OCI
/// image layout store (blobs from members, synthesized blobs, and an
/// `index.json` from `images`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImportPlan {
    /// The archive's format.
    pub format: Format,
    /// Every blob reachable from the images, once per digest, in order of
    /// discovery, with the member holding its bytes. Members not listed
    /// here (legacy `json`/`VERSION` files, `manifest.json`, unreferenced
    /// files) are not part of the image.
    pub blobs: Vec<BlobSource>,
    /// Blobs written by the validator (Docker archives: one OCI image
    /// manifest per distinct config and layer list). Empty for OCI.
    pub synthesized: Vec<SynthesizedBlob>,
    /// The images, in archive order; one per name (an unnamed image once).
    pub images: Vec<ImageRef>,
    /// What each image manifest and index of the plan references, in its
    /// own order: an image manifest's config then its layers, an index's
    /// manifests. Every referenced digest is a blob or synthesized blob of
    /// the plan. For stores whose garbage collection follows references
    /// (containerd's `containerd.io/gc.ref.content.*` labels).
    pub children: BTreeMap<Digest, Vec<Descriptor>>,
}

impl ImportPlan {
    /// The blob source with this digest, if the plan has one.
    pub fn blob(&self, digest: &Digest) -> Option<&BlobSource> {
        self.blobs.iter().find(|b| &b.digest == digest)
    }

    /// The synthesized blob with this digest, if the plan has one.
    pub fn synthesized_blob(&self, digest: &Digest) -> Option<&SynthesizedBlob> {
        self.synthesized.iter().find(|b| &b.digest == digest)
    }
}
