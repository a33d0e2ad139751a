//! Docker archives (`docker save`, image spec v1.1/v1.2): `manifest.json`
//! lists images as a config file and layer files; the plan gets the
//! config and layers as blobs and an OCI manifest synthesized for each.

use std::collections::BTreeMap;

use bytes::Bytes;
use serde::de::IgnoredAny;
use serde::{Deserialize, Serialize};

use super::error::ArchiveError;
use super::layout::{Ctx, Found, PlanBuilder, parse_digest};
use super::members::normalize_reference;
use super::name;
use super::plan::{
    BlobSource, Compression, Descriptor, Digest, ImageRef, MEDIA_TYPE_OCI_CONFIG,
    MEDIA_TYPE_OCI_LAYER, MEDIA_TYPE_OCI_LAYER_GZIP, MEDIA_TYPE_OCI_LAYER_ZSTD,
    MEDIA_TYPE_OCI_MANIFEST, SynthesizedBlob,
};

/// One image of `manifest.json`.
#[derive(Deserialize)]
struct ManifestEntry {
    #[serde(rename = "Config")]
    config: String,
    #[serde(rename = "RepoTags", default)]
    repo_tags: Option<Vec<String>>,
    #[serde(rename = "Layers", default)]
    layers: Vec<String>,
}

/// The parts of an image config (Docker or OCI) checked here.
#[derive(Deserialize)]
pub(crate) struct ImageConfig {
    rootfs: RootFs,
    #[serde(default)]
    config: Option<RunConfig>,
    #[serde(default)]
    container_config: Option<RunConfig>,
}

#[derive(Deserialize)]
struct RootFs {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    diff_ids: Vec<String>,
}

#[derive(Deserialize)]
struct RunConfig {
    #[serde(rename = "Healthcheck", default)]
    healthcheck: Option<IgnoredAny>,
}

impl ImageConfig {
    /// Whether the config uses Docker image spec v1.2 (`Healthcheck`).
    fn has_healthcheck(&self) -> bool {
        [&self.config, &self.container_config]
            .into_iter()
            .flatten()
            .any(|c| c.healthcheck.is_some())
    }

    /// The `rootfs.diff_ids`, parsed; `config` names the config member.
    pub(crate) fn diff_ids(&self, config: &str) -> Result<Vec<Digest>, ArchiveError> {
        if self.rootfs.kind != "layers" {
            return Err(ArchiveError::InvalidJson {
                member: config.to_owned(),
                reason: format!("rootfs.type must be \"layers\", got {:?}", self.rootfs.kind),
            });
        }
        self.rootfs
            .diff_ids
            .iter()
            .enumerate()
            .map(|(i, d)| parse_digest(d, || format!("{config}.rootfs.diff_ids[{i}]")))
            .collect()
    }
}

/// Checks a layer against its `diff_id`: an uncompressed layer must hash
/// to it; a compressed one cannot be checked without decompressing, so
/// the `diff_id` is returned for the store to check.
pub(crate) fn check_layer(
    layer: &Found<'_>,
    diff_id: Digest,
    field: impl FnOnce() -> String,
) -> Result<(Compression, Option<Digest>), ArchiveError> {
    match layer.compression() {
        Compression::None if layer.info.digest != diff_id => Err(ArchiveError::DiffIdMismatch {
            field: field(),
            member: layer.path.to_owned(),
            expected: diff_id,
            actual: layer.info.digest,
        }),
        Compression::None => Ok((Compression::None, None)),
        c => Ok((c, Some(diff_id))),
    }
}

/// The OCI layer media type for a compression.
pub(crate) fn layer_media_type(c: Compression) -> &'static str {
    match c {
        Compression::None => MEDIA_TYPE_OCI_LAYER,
        Compression::Gzip => MEDIA_TYPE_OCI_LAYER_GZIP,
        Compression::Zstd => MEDIA_TYPE_OCI_LAYER_ZSTD,
    }
}

/// The digest a config's path names, if it follows a naming convention:
/// `<hex>.json` (legacy `docker save`) or `blobs/sha256/<hex>`.
fn named_digest(path: &str) -> Option<Digest> {
    if let Some(hex) = path.strip_prefix("blobs/sha256/") {
        return Digest::from_hex(hex);
    }
    let file = path.rsplit('/').next()?;
    Digest::from_hex(file.strip_suffix(".json")?)
}

#[derive(Serialize)]
struct OutDescriptor<'a> {
    #[serde(rename = "mediaType")]
    media_type: &'a str,
    digest: String,
    size: u64,
}

#[derive(Serialize)]
struct OutManifest<'a> {
    #[serde(rename = "schemaVersion")]
    schema_version: u32,
    #[serde(rename = "mediaType")]
    media_type: &'a str,
    config: OutDescriptor<'a>,
    layers: Vec<OutDescriptor<'a>>,
}

/// Validates `manifest.json` and everything it references, adding blobs,
/// synthesized manifests and images to `builder`. Returns whether any
/// config uses Docker image spec v1.2.
pub(crate) fn plan(ctx: &Ctx<'_>, builder: &mut PlanBuilder) -> Result<bool, ArchiveError> {
    let manifest = ctx.file("manifest.json", "archive")?;
    let entries: Vec<ManifestEntry> = ctx.json(&manifest)?;
    if entries.is_empty() {
        return Err(ArchiveError::InvalidJson {
            member: "manifest.json".to_owned(),
            reason: "lists no images".to_owned(),
        });
    }
    // Legacy, optional: `{"repo": {"tag": "<layer id>"}}`. Names come from
    // RepoTags; only its shape is checked.
    if ctx.contains("repositories") {
        let repositories = ctx.file("repositories", "archive")?;
        let _: BTreeMap<String, BTreeMap<String, String>> = ctx.json(&repositories)?;
    }
    let mut v1_2 = false;
    for (i, entry) in entries.iter().enumerate() {
        let config_field = format!("manifest.json[{i}].Config");
        let config = ctx.file(&entry.config, &config_field)?;
        let written = normalize_reference(&entry.config).unwrap_or_default();
        for name in [written.as_str(), config.path] {
            if let Some(expected) = named_digest(name)
                && expected != config.info.digest
            {
                return Err(ArchiveError::ConfigDigestMismatch {
                    member: name.to_owned(),
                    expected,
                    actual: config.info.digest,
                });
            }
        }
        let image_config: ImageConfig = ctx.json(&config)?;
        v1_2 |= image_config.has_healthcheck();
        let diff_ids = image_config.diff_ids(config.path)?;
        if diff_ids.len() != entry.layers.len() {
            return Err(ArchiveError::LayerCountMismatch {
                field: format!("manifest.json[{i}].Layers"),
                layers: entry.layers.len(),
                diff_ids: diff_ids.len(),
            });
        }
        builder.add_blob(BlobSource {
            digest: config.info.digest,
            size: config.info.size,
            media_type: Some(MEDIA_TYPE_OCI_CONFIG.to_owned()),
            member: config.index,
            compression: None,
            unverified_diff_id: None,
        });
        let mut layers = Vec::with_capacity(entry.layers.len());
        let mut layer_digests = Vec::with_capacity(entry.layers.len());
        for (j, (path, diff_id)) in entry.layers.iter().zip(diff_ids).enumerate() {
            let field = format!("manifest.json[{i}].Layers[{j}]");
            let layer = ctx.file(path, &field)?;
            let (compression, unverified) = check_layer(&layer, diff_id, || {
                format!("{}.rootfs.diff_ids[{j}]", config.path)
            })?;
            let media_type = layer_media_type(compression);
            builder.add_blob(BlobSource {
                digest: layer.info.digest,
                size: layer.info.size,
                media_type: Some(media_type.to_owned()),
                member: layer.index,
                compression: Some(compression),
                unverified_diff_id: unverified,
            });
            layer_digests.push(layer.info.digest);
            layers.push(OutDescriptor {
                media_type,
                digest: layer.info.digest.to_string(),
                size: layer.info.size,
            });
        }
        let manifest = OutManifest {
            schema_version: 2,
            media_type: MEDIA_TYPE_OCI_MANIFEST,
            config: OutDescriptor {
                media_type: MEDIA_TYPE_OCI_CONFIG,
                digest: config.info.digest.to_string(),
                size: config.info.size,
            },
            layers,
        };
        let data = Bytes::from(
            serde_json::to_vec(&manifest).expect("serialising plain structs to JSON cannot fail"),
        );
        let descriptor = Descriptor {
            media_type: MEDIA_TYPE_OCI_MANIFEST.to_owned(),
            digest: Digest::of(&data),
            size: data.len() as u64,
        };
        let mut children = Vec::with_capacity(1 + manifest.layers.len());
        children.push(Descriptor {
            media_type: MEDIA_TYPE_OCI_CONFIG.to_owned(),
            digest: config.info.digest,
            size: config.info.size,
        });
        for (layer, digest) in manifest.layers.iter().zip(layer_digests) {
            children.push(Descriptor {
                media_type: layer.media_type.to_owned(),
                digest,
                size: layer.size,
            });
        }
        builder.set_children(descriptor.digest, children);
        builder.add_synthesized(SynthesizedBlob {
            digest: descriptor.digest,
            data,
            media_type: MEDIA_TYPE_OCI_MANIFEST.to_owned(),
        });
        let mut names = Vec::new();
        for (j, tag) in entry.repo_tags.iter().flatten().enumerate() {
            let normalized =
                name::normalize(tag).map_err(|reason| ArchiveError::InvalidImageName {
                    field: format!("manifest.json[{i}].RepoTags[{j}]"),
                    name: tag.clone(),
                    reason,
                })?;
            names.push(normalized);
        }
        if names.is_empty() {
            builder.images.push(ImageRef {
                name: None,
                manifest: descriptor,
            });
        } else {
            for name in &names {
                builder.images.push(ImageRef {
                    name: Some(name.clone()),
                    manifest: descriptor.clone(),
                });
            }
            builder
                .names_by_config
                .entry(config.info.digest)
                .or_default()
                .extend(names);
        }
    }
    Ok(v1_2)
}
