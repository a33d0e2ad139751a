//! The OS image format (docs/cli.md, "OS images"): an OCI artifact whose
//! config lists the payloads with the SHA-256 of every chunk, and whose
//! layers are the payloads, raw or as one zstd frame each.

use serde_json::{Value, json};

/// The manifest's media type.
pub const MANIFEST_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
/// The media type of an OCI image index (`index.json` of a layout).
pub const INDEX_MEDIA_TYPE: &str = "application/vnd.oci.image.index.v1+json";
/// The config's media type.
pub const CONFIG_MEDIA_TYPE: &str = "application/vnd.monogon.os.image.config.v1+json";
/// The media type of a raw payload.
pub const LAYER_RAW: &str = "application/octet-stream";
/// The media type of a payload compressed as one zstd frame.
pub const LAYER_ZSTD: &str = "application/zstd";
/// The largest `hash_chunk_size`.
pub const MAX_CHUNK_SIZE: u64 = 16 << 20;
/// The default `hash_chunk_size`: 1 MiB, the size the reference's image
/// builder (`osbase/build/mkoci`) always uses.
pub const DEFAULT_CHUNK_SIZE: u64 = 1 << 20;

/// What an image is for, and so its artifact type and payloads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Kind {
    /// A Metropolis node: `kernel.efi` and `system`
    /// (`application/vnd.monogon.os.image.v1`).
    #[default]
    Metropolis,
    /// A whole-disk image of another OS: one payload `disk`, written raw
    /// over the root device (`application/vnd.metropolis-rs.os.disk-image.v1`).
    Disk,
}

impl Kind {
    /// The manifest's `artifactType`.
    pub fn artifact_type(self) -> &'static str {
        match self {
            Kind::Metropolis => "application/vnd.monogon.os.image.v1",
            Kind::Disk => "application/vnd.metropolis-rs.os.disk-image.v1",
        }
    }

    /// The payloads an image of this kind has, in layer order.
    pub fn payloads(self) -> &'static [&'static str] {
        match self {
            Kind::Metropolis => &["kernel.efi", "system"],
            Kind::Disk => &["disk"],
        }
    }

    /// The kind's name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Metropolis => "metropolis",
            Kind::Disk => "disk",
        }
    }
}

/// How payloads are stored in their layers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Compression {
    /// One zstd frame per payload (`application/zstd`).
    #[default]
    Zstd,
    /// The payload as it is (`application/octet-stream`).
    None,
}

impl Compression {
    /// The layer media type of a payload stored this way.
    pub fn media_type(self) -> &'static str {
        match self {
            Compression::Zstd => LAYER_ZSTD,
            Compression::None => LAYER_RAW,
        }
    }
}

/// Caller input quoted for messages, cut (core's one quoting helper).
pub use metropolis_core::quote::quoted;

/// Why `name` is not a payload name, if it is not: 1–80 characters of
/// `[0-9A-Za-z._-]`, not starting with `.` or `_`, not ending with `.`.
pub fn name_problem(name: &str) -> Option<&'static str> {
    if name.is_empty() || name.len() > 80 {
        return Some("a payload name is 1 to 80 characters long");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
    {
        return Some("a payload name has only the characters 0-9 A-Z a-z . _ -");
    }
    if name.starts_with(['.', '_']) || name.ends_with('.') {
        return Some("a payload name does not start with . or _ nor end with .");
    }
    None
}

/// An OCI content descriptor: media type, digest and size of a blob.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Descriptor {
    /// The blob's media type.
    pub media_type: String,
    /// `sha256:<64 lowercase hex>`.
    pub digest: String,
    /// The blob's length in bytes.
    pub size: u64,
}

impl Descriptor {
    /// The descriptor as JSON.
    pub fn to_json(&self) -> Value {
        json!({"mediaType": self.media_type, "digest": self.digest, "size": self.size})
    }
}

/// One payload as the config describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Payload {
    /// The payload's name.
    pub name: String,
    /// Its uncompressed length.
    pub size: u64,
    /// The length of the hashed chunks.
    pub hash_chunk_size: u64,
    /// The SHA-256 of each chunk, standard base64 without padding.
    pub chunk_hashes: Vec<String>,
}

/// The config blob: format version 1 and the payloads.
pub fn config_json(payloads: &[Payload]) -> Vec<u8> {
    let payloads: Vec<Value> = payloads
        .iter()
        .map(|p| {
            json!({
                "name": p.name,
                "size": p.size,
                "hash_chunk_size": p.hash_chunk_size,
                "chunk_hashes_sha256": p.chunk_hashes,
            })
        })
        .collect();
    json!({"format_version": "1", "payloads": payloads})
        .to_string()
        .into_bytes()
}

/// The manifest of an image of `kind` with `config` and `layers`.
pub fn manifest_json(kind: Kind, config: &Descriptor, layers: &[Descriptor]) -> Vec<u8> {
    json!({
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA_TYPE,
        "artifactType": kind.artifact_type(),
        "config": config.to_json(),
        "layers": layers.iter().map(Descriptor::to_json).collect::<Vec<_>>(),
    })
    .to_string()
    .into_bytes()
}

/// `index.json` of a layout holding the one manifest `manifest`.
pub fn index_json(kind: Kind, manifest: &Descriptor) -> Vec<u8> {
    let mut entry = manifest.to_json();
    entry["artifactType"] = kind.artifact_type().into();
    json!({
        "schemaVersion": 2,
        "mediaType": INDEX_MEDIA_TYPE,
        "manifests": [entry],
    })
    .to_string()
    .into_bytes()
}

/// The `oci-layout` file.
pub const OCI_LAYOUT: &[u8] = br#"{"imageLayoutVersion":"1.0.0"}"#;

/// `sha256:<hex>` of a finished SHA-256.
pub fn digest_of(hash: &[u8]) -> String {
    format!("sha256:{}", metropolis_core::hex::Hex(hash))
}

/// Whether `digest` is `sha256:` and 64 lowercase hex characters.
pub fn is_digest(digest: &str) -> bool {
    digest.strip_prefix("sha256:").is_some_and(|hex| {
        hex.len() == 64
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}
