//! OCI image layouts: `oci-layout`, `index.json`, `blobs/sha256/<hex>`.
//! Every descriptor reachable from `index.json` (nested indexes,
//! manifests, configs, layers) must name a blob of the archive with the
//! declared digest and size.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::Deserialize;
use serde::de::IgnoredAny;

use super::docker::{ImageConfig, check_layer, layer_media_type};
use super::error::ArchiveError;
use super::layout::{Ctx, Found, PlanBuilder, parse_digest};
use super::name;
use super::plan::{
    BlobSource, Descriptor, Digest, ImageRef, MEDIA_TYPE_DOCKER_CONFIG, MEDIA_TYPE_DOCKER_MANIFEST,
    MEDIA_TYPE_DOCKER_MANIFEST_LIST, MEDIA_TYPE_OCI_CONFIG, MEDIA_TYPE_OCI_INDEX,
    MEDIA_TYPE_OCI_MANIFEST,
};

/// Deepest nesting of image indexes below `index.json`.
const MAX_DEPTH: usize = 8;

/// Annotation containerd (and Docker 25+) put the full image name in.
const ANNOTATION_CONTAINERD_NAME: &str = "io.containerd.image.name";
/// OCI reference-name annotation (often a tag only).
const ANNOTATION_REF_NAME: &str = "org.opencontainers.image.ref.name";

#[derive(Deserialize)]
struct Layout {
    #[serde(rename = "imageLayoutVersion")]
    version: String,
}

#[derive(Deserialize)]
struct Index {
    manifests: Vec<RawDescriptor>,
}

#[derive(Deserialize)]
struct Manifest {
    config: RawDescriptor,
    #[serde(default)]
    layers: Vec<RawDescriptor>,
}

#[derive(Deserialize)]
struct RawDescriptor {
    #[serde(rename = "mediaType", default)]
    media_type: Option<String>,
    digest: String,
    size: u64,
    #[serde(default)]
    annotations: Option<BTreeMap<String, String>>,
}

/// Enough of a JSON blob to tell what it is when its descriptor does not
/// say.
#[derive(Deserialize)]
struct Sniff {
    #[serde(rename = "mediaType", default)]
    media_type: Option<String>,
    #[serde(default)]
    manifests: Option<IgnoredAny>,
    #[serde(default)]
    config: Option<IgnoredAny>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Shape {
    Index,
    Manifest,
    Other,
}

fn shape(media_type: &str) -> Shape {
    match media_type {
        MEDIA_TYPE_OCI_INDEX | MEDIA_TYPE_DOCKER_MANIFEST_LIST => Shape::Index,
        MEDIA_TYPE_OCI_MANIFEST | MEDIA_TYPE_DOCKER_MANIFEST => Shape::Manifest,
        _ => Shape::Other,
    }
}

/// Validates the layout and adds every reachable blob and every image of
/// `index.json` to `builder`. `docker_names` (Docker 25+ archives) names
/// images `index.json` leaves unnamed, by config digest.
pub(crate) fn plan(
    ctx: &Ctx<'_>,
    builder: &mut PlanBuilder,
    docker_names: &HashMap<Digest, Vec<String>>,
) -> Result<(), ArchiveError> {
    let layout = ctx.file("oci-layout", "archive")?;
    let layout: Layout = ctx.json(&layout)?;
    if layout.version != "1.0.0" {
        return Err(ArchiveError::OciLayoutVersion {
            found: layout.version,
        });
    }
    let index = ctx.file("index.json", "oci-layout")?;
    let index: Index = ctx.json(&index)?;
    if index.manifests.is_empty() {
        return Err(ArchiveError::InvalidJson {
            member: "index.json".to_owned(),
            reason: "lists no manifests".to_owned(),
        });
    }
    let mut walker = Walker {
        ctx,
        builder,
        visited: HashSet::new(),
        configs: HashMap::new(),
    };
    for (i, raw) in index.manifests.iter().enumerate() {
        let field = format!("index.json.manifests[{i}]");
        let (descriptor, config) = walker.manifest(raw, &field, 0)?;
        let name = annotated_name(raw, &field)?;
        let fallback = match (&name, config) {
            (None, Some(config)) => docker_names.get(&config),
            _ => None,
        };
        match fallback {
            Some(names) if !names.is_empty() => {
                for name in names {
                    walker.builder.images.push(ImageRef {
                        name: Some(name.clone()),
                        manifest: descriptor.clone(),
                    });
                }
            }
            _ => walker.builder.images.push(ImageRef {
                name,
                manifest: descriptor,
            }),
        }
    }
    Ok(())
}

/// The image name an `index.json` entry's annotations give: the
/// containerd name if present (it must be a valid reference), else the
/// OCI ref name if it is a full reference (contains `/`, `:` or `@`; a
/// bare tag such as `latest` names no repository, so the image stays
/// unnamed).
fn annotated_name(raw: &RawDescriptor, field: &str) -> Result<Option<String>, ArchiveError> {
    let Some(annotations) = &raw.annotations else {
        return Ok(None);
    };
    if let Some(value) = annotations.get(ANNOTATION_CONTAINERD_NAME) {
        return name::normalize(value)
            .map(Some)
            .map_err(|reason| ArchiveError::InvalidImageName {
                field: format!("{field}.annotations[{ANNOTATION_CONTAINERD_NAME:?}]"),
                name: value.clone(),
                reason,
            });
    }
    Ok(annotations
        .get(ANNOTATION_REF_NAME)
        .filter(|r| r.contains(['/', ':', '@']))
        .and_then(|r| name::normalize(r).ok()))
}

struct Walker<'c, 'a> {
    ctx: &'c Ctx<'a>,
    builder: &'c mut PlanBuilder,
    /// Indexes and manifests already walked.
    visited: HashSet<Digest>,
    /// Image manifest digest -> its config's digest.
    configs: HashMap<Digest, Digest>,
}

impl<'a> Walker<'_, 'a> {
    /// Finds the blob a descriptor names and checks its digest and size.
    fn blob(&self, raw: &RawDescriptor, field: &str) -> Result<(Digest, Found<'a>), ArchiveError> {
        let digest = parse_digest(&raw.digest, || format!("{field}.digest"))?;
        let found = self
            .ctx
            .file(&format!("blobs/sha256/{}", digest.hex()), field)?;
        if found.info.digest != digest {
            // Only reachable through a link: regular blob members are
            // checked against their names as they arrive.
            return Err(ArchiveError::BlobDigestMismatch {
                member: found.path.to_owned(),
                expected: digest,
                actual: found.info.digest,
            });
        }
        if found.info.size != raw.size {
            return Err(ArchiveError::SizeMismatch {
                field: format!("{field}.size"),
                member: found.path.to_owned(),
                declared: raw.size,
                actual: found.info.size,
            });
        }
        Ok((digest, found))
    }

    /// Walks a descriptor from an index: an index (recursively), an image
    /// manifest, or any other blob. Returns its descriptor and, for an
    /// image manifest, its config's digest.
    fn manifest(
        &mut self,
        raw: &RawDescriptor,
        field: &str,
        depth: usize,
    ) -> Result<(Descriptor, Option<Digest>), ArchiveError> {
        let (digest, found) = self.blob(raw, field)?;
        let media_type = match &raw.media_type {
            Some(m) => Some(m.clone()),
            None => self.sniff(&found),
        };
        self.builder.add_blob(BlobSource {
            digest,
            size: found.info.size,
            media_type: media_type.clone(),
            member: found.index,
            compression: None,
            unverified_diff_id: None,
        });
        let media_type = media_type.unwrap_or_else(|| "application/octet-stream".to_owned());
        let descriptor = Descriptor {
            media_type: media_type.clone(),
            digest,
            size: found.info.size,
        };
        if !self.visited.insert(digest) {
            return Ok((descriptor, self.configs.get(&digest).copied()));
        }
        match shape(&media_type) {
            Shape::Index => {
                if depth >= MAX_DEPTH {
                    return Err(ArchiveError::NestingTooDeep {
                        field: field.to_owned(),
                    });
                }
                let index: Index = self.ctx.json(&found)?;
                let mut children = Vec::with_capacity(index.manifests.len());
                for (k, child) in index.manifests.iter().enumerate() {
                    let child_field = format!("{}.manifests[{k}]", found.path);
                    children.push(self.manifest(child, &child_field, depth + 1)?.0);
                }
                self.builder.set_children(digest, children);
                Ok((descriptor, None))
            }
            Shape::Manifest => {
                let config = self.image_manifest(&found)?;
                self.configs.insert(digest, config);
                Ok((descriptor, Some(config)))
            }
            Shape::Other => Ok((descriptor, None)),
        }
    }

    /// The media type a JSON blob declares or its shape implies.
    fn sniff(&self, found: &Found<'_>) -> Option<String> {
        let sniff: Sniff = self.ctx.json(found).ok()?;
        if let Some(m) = sniff.media_type {
            return Some(m);
        }
        if sniff.manifests.is_some() {
            Some(MEDIA_TYPE_OCI_INDEX.to_owned())
        } else if sniff.config.is_some() {
            Some(MEDIA_TYPE_OCI_MANIFEST.to_owned())
        } else {
            None
        }
    }

    /// Checks an image manifest's config and layers; returns the config's
    /// digest. For image configs (OCI or Docker media type), uncompressed
    /// layers must match `rootfs.diff_ids`.
    fn image_manifest(&mut self, found: &Found<'_>) -> Result<Digest, ArchiveError> {
        let manifest: Manifest = self.ctx.json(found)?;
        let config_field = format!("{}.config", found.path);
        let (config_digest, config) = self.blob(&manifest.config, &config_field)?;
        let config_type = manifest.config.media_type.as_deref();
        self.builder.add_blob(BlobSource {
            digest: config_digest,
            size: config.info.size,
            media_type: config_type.map(str::to_owned),
            member: config.index,
            compression: None,
            unverified_diff_id: None,
        });
        let mut children = Vec::with_capacity(1 + manifest.layers.len());
        children.push(Descriptor {
            media_type: config_type.unwrap_or("application/octet-stream").to_owned(),
            digest: config_digest,
            size: config.info.size,
        });
        let diff_ids = match config_type {
            Some(MEDIA_TYPE_OCI_CONFIG | MEDIA_TYPE_DOCKER_CONFIG) => {
                let image_config: ImageConfig = self.ctx.json(&config)?;
                let diff_ids = image_config.diff_ids(config.path)?;
                if diff_ids.len() != manifest.layers.len() {
                    return Err(ArchiveError::LayerCountMismatch {
                        field: format!("{}.layers", found.path),
                        layers: manifest.layers.len(),
                        diff_ids: diff_ids.len(),
                    });
                }
                Some(diff_ids)
            }
            _ => None,
        };
        for (j, raw) in manifest.layers.iter().enumerate() {
            let field = format!("{}.layers[{j}]", found.path);
            let (digest, layer) = self.blob(raw, &field)?;
            let (compression, unverified) = match &diff_ids {
                Some(diff_ids) => check_layer(&layer, diff_ids[j], || {
                    format!("{}.rootfs.diff_ids[{j}]", config.path)
                })?,
                None => (layer.compression(), None),
            };
            let media_type = raw
                .media_type
                .clone()
                .unwrap_or_else(|| layer_media_type(compression).to_owned());
            children.push(Descriptor {
                media_type: media_type.clone(),
                digest,
                size: layer.info.size,
            });
            self.builder.add_blob(BlobSource {
                digest,
                size: layer.info.size,
                media_type: Some(media_type),
                member: layer.index,
                compression: Some(compression),
                unverified_diff_id: unverified,
            });
        }
        self.builder.set_children(found.info.digest, children);
        Ok(config_digest)
    }
}
