//! Reading an OCI image layout directory for `metroctl osimage push`: its
//! one manifest (digest checked) and the blobs it names (present, of the
//! size it says; the registry checks their digests as they arrive).

use std::io::Read as _;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::format::{Descriptor, MANIFEST_MEDIA_TYPE, digest_of, is_digest, quoted};
use crate::CliError;
use crate::exit::usage;

/// The largest `index.json`, `oci-layout` or manifest read.
const MAX_JSON_BYTES: u64 = 4 << 20;

/// An image layout with one manifest.
#[derive(Debug)]
pub struct Layout {
    /// The directory.
    pub dir: PathBuf,
    /// The manifest's descriptor.
    pub manifest: Descriptor,
    /// The manifest as it is stored.
    pub manifest_bytes: Vec<u8>,
    /// Its `artifactType`, if any.
    pub artifact_type: Option<String>,
    /// The config's and the layers' descriptors.
    pub blobs: Vec<Descriptor>,
}

impl Layout {
    /// Where the blob `digest` is.
    pub fn blob_path(&self, digest: &str) -> PathBuf {
        let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
        self.dir.join("blobs").join("sha256").join(hex)
    }
}

fn read_small(path: &Path, what: &str) -> Result<Vec<u8>, CliError> {
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_JSON_BYTES + 1).read_to_end(&mut bytes))
        .map_err(|e| usage(format!("DIR: {what} {}: {e}", path.display())))?;
    if bytes.len() as u64 > MAX_JSON_BYTES {
        return Err(usage(format!(
            "DIR: {what} {}: larger than {MAX_JSON_BYTES} bytes",
            path.display()
        )));
    }
    Ok(bytes)
}

fn json(bytes: &[u8], path: &Path) -> Result<Value, CliError> {
    serde_json::from_slice(bytes)
        .map_err(|e| usage(format!("DIR: {}: not JSON: {e}", path.display())))
}

/// The descriptor `value` (`mediaType`, `digest`, `size`), or why not.
fn descriptor(value: &Value, what: &str) -> Result<Descriptor, CliError> {
    let bad = |why: &str| usage(format!("DIR: {what}: {why}"));
    let media_type = value
        .get("mediaType")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("no mediaType"))?;
    let digest = value
        .get("digest")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("no digest"))?;
    if !is_digest(digest) {
        return Err(bad(&format!(
            "digest {} is not sha256:<64 lowercase hex>",
            quoted(digest)
        )));
    }
    let size = value
        .get("size")
        .and_then(Value::as_u64)
        .ok_or_else(|| bad("no size"))?;
    Ok(Descriptor {
        media_type: media_type.to_string(),
        digest: digest.to_string(),
        size,
    })
}

/// Reads the layout at `dir`: `oci-layout`, `index.json` with exactly one
/// manifest, the manifest (its digest checked), and the size of every
/// blob it names.
pub fn read(dir: &Path) -> Result<Layout, CliError> {
    let marker = dir.join("oci-layout");
    if !marker.is_file() {
        return Err(usage(format!(
            "DIR {}: not an OCI image layout (no oci-layout file); \
             `metroctl osimage build --out DIR` writes one",
            dir.display()
        )));
    }
    json(&read_small(&marker, "oci-layout")?, &marker)?;
    let index_path = dir.join("index.json");
    let index = json(&read_small(&index_path, "index")?, &index_path)?;
    let manifests = index
        .get("manifests")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let [entry] = manifests else {
        return Err(usage(format!(
            "DIR: {} lists {} manifests; push takes a layout with exactly one",
            index_path.display(),
            manifests.len()
        )));
    };
    let manifest = descriptor(entry, "index.json's manifest")?;
    if manifest.media_type != MANIFEST_MEDIA_TYPE {
        return Err(usage(format!(
            "DIR: the manifest is a {}, not an OCI image manifest",
            quoted(&manifest.media_type)
        )));
    }
    let mut layout = Layout {
        dir: dir.to_path_buf(),
        manifest,
        manifest_bytes: Vec::new(),
        artifact_type: None,
        blobs: Vec::new(),
    };
    let path = layout.blob_path(&layout.manifest.digest);
    let bytes = read_small(&path, "manifest")?;
    use sha2::Digest as _;
    if digest_of(&sha2::Sha256::digest(&bytes)) != layout.manifest.digest {
        return Err(usage(format!(
            "DIR: the manifest {} does not match its digest",
            path.display()
        )));
    }
    let value = json(&bytes, &path)?;
    layout.artifact_type = value
        .get("artifactType")
        .and_then(Value::as_str)
        .map(str::to_string);
    let config = value.get("config").unwrap_or(&Value::Null);
    layout
        .blobs
        .push(descriptor(config, "the manifest's config")?);
    let layers = value
        .get("layers")
        .and_then(Value::as_array)
        .ok_or_else(|| usage("DIR: the manifest has no layers"))?;
    for (i, layer) in layers.iter().enumerate() {
        layout
            .blobs
            .push(descriptor(layer, &format!("the manifest's layer {i}"))?);
    }
    for blob in &layout.blobs {
        let path = layout.blob_path(&blob.digest);
        let size = std::fs::metadata(&path)
            .map_err(|e| usage(format!("DIR: blob {}: {e}", path.display())))?
            .len();
        if size != blob.size {
            return Err(usage(format!(
                "DIR: blob {} has {size} bytes, the manifest says {}",
                path.display(),
                blob.size
            )));
        }
    }
    layout.manifest_bytes = bytes;
    Ok(layout)
}
