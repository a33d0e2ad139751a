//! What the installer accepts of a registry's manifests: an OS image
//! manifest (docs/spec/metropolis-install.md section 1: an OCI image
//! manifest whose `artifactType` names a Metropolis or a whole-disk image,
//! with the OS image config and one layer per payload), or an image index
//! (multi-platform image) from which the agent's own platform's manifest
//! is picked.

use std::fmt;

use serde::Deserialize;

use super::digest::Digest;

pub(super) const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub(super) const INDEX_TYPES: [&str; 2] = [
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
];
use super::image_config::{
    CONFIG_MEDIA_TYPE, DISK_ARTIFACT, METROPOLIS_ARTIFACT, PAYLOAD_RAW, PAYLOAD_ZSTD,
};

/// The largest config blob accepted.
pub(super) const MAX_CONFIG_BYTES: u64 = 50 * 1024 * 1024;

/// How many of an index's platforms an error lists.
const MAX_PLATFORMS_LISTED: usize = 10;

/// The platform whose image is picked from an image index: an OCI
/// `os`/`architecture` pair, and a `variant` when one is required.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Platform {
    /// `linux`.
    pub os: String,
    /// `amd64`, `arm64`, ... (GOARCH names, as OCI uses them).
    pub architecture: String,
    /// `v8`, `v7`, ...: when set, an entry with another variant is not
    /// taken (one without a variant is).
    pub variant: Option<String>,
}

impl Platform {
    /// The platform the agent itself runs on: Rust's target architecture
    /// in OCI's names (`x86_64` is `amd64`, `aarch64` is `arm64`).
    pub fn host() -> Platform {
        let architecture = match std::env::consts::ARCH {
            "x86_64" => "amd64",
            "aarch64" => "arm64",
            "x86" => "386",
            "powerpc64" if cfg!(target_endian = "little") => "ppc64le",
            "powerpc64" => "ppc64",
            "loongarch64" => "loong64",
            other => other,
        };
        Platform {
            os: std::env::consts::OS.to_string(),
            architecture: architecture.to_string(),
            variant: None,
        }
    }
}

impl fmt::Display for Platform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.os, self.architecture)?;
        if let Some(variant) = &self.variant {
            write!(f, "/{variant}")?;
        }
        Ok(())
    }
}

/// A payload's layer, as a verified manifest names it.
#[derive(Clone, Debug)]
pub(super) struct Layer {
    pub(super) digest: Digest,
    pub(super) size: u64,
    pub(super) compressed: bool,
}

/// What an OS image installs as, by its manifest's `artifactType`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImageKind {
    /// Metropolis: `kernel.efi` and `system`, installed with the A/B
    /// layout (`application/vnd.monogon.os.image.v1`).
    Metropolis,
    /// A whole-disk image: one payload, `disk`, written over the device
    /// from its first byte (`application/vnd.metropolis-rs.os.disk-image.v1`).
    Disk,
}

impl fmt::Display for ImageKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ImageKind::Metropolis => "Metropolis OS image",
            ImageKind::Disk => "whole-disk image",
        })
    }
}

/// The config blob a manifest names.
#[derive(Clone, Debug)]
pub(super) struct ConfigRef {
    pub(super) digest: Digest,
    pub(super) size: u64,
    /// The descriptor's embedded `data`, when its length is the size.
    pub(super) data: Option<Vec<u8>>,
}

/// A verified OS image manifest.
#[derive(Clone, Debug)]
pub(super) struct ImageManifest {
    pub(super) kind: ImageKind,
    pub(super) config: ConfigRef,
    /// One per payload, in the config's order.
    pub(super) layers: Vec<Layer>,
}

/// An index's manifest for one platform.
pub(super) struct Entry {
    pub(super) digest: Digest,
    pub(super) size: u64,
}

/// What a verified manifest is.
pub(super) enum Manifest {
    Image(ImageManifest),
    /// An image index, with the entry for the wanted platform, or the
    /// platforms it offers when none is.
    Index(Result<Entry, String>),
}

pub(super) enum ManifestProblem {
    Invalid(String),
    Unsupported(String),
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ManifestDocument {
    schema_version: Option<u32>,
    media_type: Option<String>,
    artifact_type: Option<String>,
    config: Option<DescriptorDocument>,
    layers: Option<Vec<DescriptorDocument>>,
    manifests: Option<Vec<IndexEntryDocument>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct DescriptorDocument {
    media_type: String,
    digest: String,
    size: u64,
    data: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct IndexEntryDocument {
    media_type: Option<String>,
    digest: String,
    size: u64,
    platform: Option<PlatformDocument>,
}

#[derive(Deserialize)]
struct PlatformDocument {
    architecture: String,
    os: String,
    variant: Option<String>,
}

/// Parses a manifest (already verified by digest); an index's entry is
/// picked for `platform`.
pub(super) fn parse_manifest(
    body: &[u8],
    content_type: Option<&str>,
    platform: &Platform,
) -> Result<Manifest, ManifestProblem> {
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
        let Some(entries) = document.manifests else {
            return Err(Invalid("image index without manifests".to_string()));
        };
        return pick(&entries, platform).map(Manifest::Index);
    }
    match document.media_type.as_deref() {
        Some(OCI_MANIFEST) => {}
        Some(media_type) => {
            return Err(Invalid(format!(
                "mediaType {:?} is not an OCI image manifest",
                metropolis_registry::bounded(media_type)
            )));
        }
        None => {
            return Err(Invalid(format!(
                "mediaType is missing: an OS image manifest has {OCI_MANIFEST}"
            )));
        }
    }
    if document.schema_version != Some(2) {
        return Err(Invalid(format!(
            "schemaVersion is {:?}, not 2",
            document.schema_version
        )));
    }
    let kind = match document.artifact_type.as_deref() {
        Some(METROPOLIS_ARTIFACT) => ImageKind::Metropolis,
        Some(DISK_ARTIFACT) => ImageKind::Disk,
        other => {
            return Err(Unsupported(format!(
                "artifactType {} is not an OS image (accepted: {METROPOLIS_ARTIFACT}, \
                 {DISK_ARTIFACT}; `metroctl osimage build` makes them)",
                other.map_or("missing".to_string(), |t| format!(
                    "{:?}",
                    metropolis_registry::bounded(t)
                ))
            )));
        }
    };
    let config = document
        .config
        .ok_or_else(|| Invalid("config: missing".to_string()))?;
    if config.media_type != CONFIG_MEDIA_TYPE {
        return Err(Invalid(format!(
            "config.mediaType {:?} is not {CONFIG_MEDIA_TYPE}",
            metropolis_registry::bounded(&config.media_type)
        )));
    }
    if config.size > MAX_CONFIG_BYTES {
        return Err(Invalid(format!(
            "config.size {} is above the {MAX_CONFIG_BYTES} bytes accepted",
            config.size
        )));
    }
    let data = config.data.as_deref().and_then(|data| {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD
            .decode(data)
            .ok()
            .filter(|bytes| bytes.len() as u64 == config.size)
    });
    let config = ConfigRef {
        digest: Digest::parse(&config.digest)
            .map_err(|e| Invalid(format!("config.digest: {e}")))?,
        size: config.size,
        data,
    };
    let layers = document
        .layers
        .ok_or_else(|| Invalid("layers: missing".to_string()))?
        .iter()
        .enumerate()
        .map(|(i, layer)| {
            let compressed = match layer.media_type.as_str() {
                PAYLOAD_RAW => false,
                PAYLOAD_ZSTD => true,
                other => {
                    return Err(Unsupported(format!(
                        "layers[{i}].mediaType {:?} (accepted: {PAYLOAD_RAW}, {PAYLOAD_ZSTD})",
                        metropolis_registry::bounded(other)
                    )));
                }
            };
            let digest = Digest::parse(&layer.digest)
                .map_err(|e| Invalid(format!("layers[{i}].digest: {e}")))?;
            Ok(Layer {
                digest,
                size: layer.size,
                compressed,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Manifest::Image(ImageManifest {
        kind,
        config,
        layers,
    }))
}

/// The first image manifest of `entries` for `platform`; else the
/// platforms they offer.
fn pick(
    entries: &[IndexEntryDocument],
    platform: &Platform,
) -> Result<Result<Entry, String>, ManifestProblem> {
    let fits = |p: &PlatformDocument| {
        p.os == platform.os
            && p.architecture == platform.architecture
            && match (&platform.variant, &p.variant) {
                (Some(wanted), Some(offered)) => wanted == offered,
                _ => true,
            }
    };
    let is_image =
        |e: &IndexEntryDocument| e.media_type.as_deref().is_none_or(|t| t == OCI_MANIFEST);
    let found = entries
        .iter()
        .find(|e| is_image(e) && e.platform.as_ref().is_some_and(fits));
    if let Some(entry) = found {
        let digest = Digest::parse(&entry.digest)
            .map_err(|e| ManifestProblem::Invalid(format!("the {platform} entry's digest: {e}")))?;
        return Ok(Ok(Entry {
            digest,
            size: entry.size,
        }));
    }
    let mut offered: Vec<String> = Vec::new();
    for p in entries.iter().filter_map(|e| e.platform.as_ref()) {
        let mut name = format!("{}/{}", p.os, p.architecture);
        if let Some(variant) = &p.variant {
            name.push('/');
            name.push_str(variant);
        }
        let name = bounded(&name);
        if !offered.contains(&name) {
            offered.push(name);
        }
    }
    let mut list = offered
        .iter()
        .take(MAX_PLATFORMS_LISTED)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if offered.len() > MAX_PLATFORMS_LISTED {
        list.push_str(&format!(
            " and {} more",
            offered.len() - MAX_PLATFORMS_LISTED
        ));
    }
    if list.is_empty() {
        list = "none".to_string();
    }
    Ok(Err(list))
}

/// At most 40 characters of a platform name an index gives.
fn bounded(text: &str) -> String {
    match text.char_indices().nth(40) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_string(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn amd64() -> Platform {
        Platform {
            os: "linux".into(),
            architecture: "amd64".into(),
            variant: None,
        }
    }

    fn parse(body: &[u8]) -> Result<Manifest, ManifestProblem> {
        parse_manifest(body, None, &amd64())
    }

    fn manifest(media_type: &str, layers: &str) -> Vec<u8> {
        format!(
            r#"{{"schemaVersion":2,"mediaType":"{media_type}","artifactType":"{METROPOLIS_ARTIFACT}","config":{{"mediaType":"{CONFIG_MEDIA_TYPE}","digest":"sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a","size":2,"data":"e30="}},"layers":[{layers}]}}"#
        )
        .into_bytes()
    }

    const LAYER: &str = r#"{"mediaType":"application/zstd","digest":"sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855","size":0}"#;
    const RAW: &str = r#"{"mediaType":"application/octet-stream","digest":"sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855","size":7}"#;

    #[test]
    fn manifests() {
        let Ok(Manifest::Image(image)) = parse(&manifest(OCI_MANIFEST, &format!("{LAYER},{RAW}")))
        else {
            panic!("not an image");
        };
        assert_eq!(image.kind, ImageKind::Metropolis);
        assert_eq!(image.config.data.as_deref(), Some(&b"{}"[..]));
        assert_eq!(image.layers.len(), 2);
        assert!(image.layers[0].compressed);
        assert!(!image.layers[1].compressed);
        assert_eq!(image.layers[1].size, 7);
        let disk = String::from_utf8(manifest(OCI_MANIFEST, RAW))
            .unwrap()
            .replace(METROPOLIS_ARTIFACT, DISK_ARTIFACT);
        let Ok(Manifest::Image(image)) = parse(disk.as_bytes()) else {
            panic!("not a disk image");
        };
        assert_eq!(image.kind, ImageKind::Disk);
        let mismatched_data = String::from_utf8(manifest(OCI_MANIFEST, RAW))
            .unwrap()
            .replace("e30=", "e30xMjM=");
        let Ok(Manifest::Image(image)) = parse(mismatched_data.as_bytes()) else {
            panic!("not an image");
        };
        assert!(image.config.data.is_none(), "data of another length used");

        let with = |from: &str, to: &str| {
            String::from_utf8(manifest(OCI_MANIFEST, LAYER))
                .unwrap()
                .replace(from, to)
                .into_bytes()
        };
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (b"{".to_vec(), "not an image manifest"),
            (
                with(
                    LAYER,
                    &LAYER.replace("application/zstd", "application/gzip"),
                ),
                "layers[0].mediaType \"application/gzip\"",
            ),
            (
                with(LAYER, &LAYER.replace(":0}", ":-1}")),
                "not an image manifest",
            ),
            (
                with(
                    METROPOLIS_ARTIFACT,
                    "application/vnd.oci.image.config.v1+json",
                ),
                "artifactType \"application/vnd.oci.image.config.v1+json\" is not an OS image",
            ),
            (
                with(&format!(r#""artifactType":"{METROPOLIS_ARTIFACT}","#), ""),
                "artifactType missing",
            ),
            (with(CONFIG_MEDIA_TYPE, "text/plain"), "config.mediaType"),
            (with("\"size\":2,", "\"size\":52428801,"), "config.size"),
            (manifest("text/plain", LAYER), "mediaType"),
            (manifest(INDEX_TYPES[0], LAYER), "image index"),
            (
                with(r#""schemaVersion":2"#, r#""schemaVersion":1"#),
                "schemaVersion",
            ),
            (
                with(&format!(r#""mediaType":"{OCI_MANIFEST}","#), ""),
                "mediaType is missing",
            ),
        ];
        for (body, expected) in cases {
            let problem = match parse(&body) {
                Ok(_) => panic!("accepted {}", String::from_utf8_lossy(&body)),
                Err(ManifestProblem::Invalid(p) | ManifestProblem::Unsupported(p)) => p,
            };
            assert!(problem.contains(expected), "{problem:?} lacks {expected:?}");
        }
    }

    /// Found by the `registry_responses` fuzz target
    /// (fuzz/regressions/registry_responses/long-digest-text): a digest
    /// or media type the registry wrote was quoted whole in the problem.
    #[test]
    fn problems_quote_registry_text_cut() {
        let long = "Z".repeat(50_000);
        let bodies = [
            manifest(
                OCI_MANIFEST,
                &LAYER.replace("sha256:", &format!("sha256:{long}")),
            ),
            manifest(OCI_MANIFEST, &LAYER.replace("/zstd", &long)),
            manifest(&long, LAYER),
            String::from_utf8_lossy(&index(&[("linux/amd64", OCI_MANIFEST)]))
                .replace("sha256:", &format!("{long}:"))
                .into_bytes(),
        ];
        for body in bodies {
            let problem = match parse(&body) {
                Err(ManifestProblem::Invalid(p) | ManifestProblem::Unsupported(p)) => p,
                Ok(_) => panic!("accepted"),
            };
            assert!(problem.len() < 600, "a {}-byte problem", problem.len());
        }
    }

    fn index(entries: &[(&str, &str)]) -> Vec<u8> {
        let entries: Vec<String> = entries
            .iter()
            .enumerate()
            .map(|(i, (platform, media_type))| {
                let mut parts = platform.split('/');
                let (os, arch, variant) = (parts.next().unwrap(), parts.next().unwrap(), parts.next());
                let variant = variant.map_or(String::new(), |v| format!(r#","variant":"{v}""#));
                format!(
                    r#"{{"mediaType":"{media_type}","digest":"sha256:{i:064x}","size":{i},"platform":{{"os":"{os}","architecture":"{arch}"{variant}}}}}"#
                )
            })
            .collect();
        format!(
            r#"{{"schemaVersion":2,"mediaType":"{}","manifests":[{}]}}"#,
            INDEX_TYPES[0],
            entries.join(",")
        )
        .into_bytes()
    }

    #[test]
    fn indexes_pick_the_platform() {
        let body = index(&[
            ("unknown/unknown", OCI_MANIFEST),
            ("linux/arm64/v8", OCI_MANIFEST),
            ("linux/amd64", INDEX_TYPES[0]),
            ("linux/amd64", OCI_MANIFEST),
        ]);
        let Ok(Manifest::Index(Ok(entry))) = parse(&body) else {
            panic!("no amd64 entry picked");
        };
        assert_eq!(entry.size, 3);
        let arm = Platform {
            architecture: "arm64".into(),
            variant: Some("v8".into()),
            ..amd64()
        };
        let Ok(Manifest::Index(Ok(entry))) = parse_manifest(&body, None, &arm) else {
            panic!("no arm64 entry picked");
        };
        assert_eq!(entry.size, 1);
        let arm7 = Platform {
            variant: Some("v7".into()),
            ..arm
        };
        let Ok(Manifest::Index(Err(offered))) = parse_manifest(&body, None, &arm7) else {
            panic!("an arm64/v7 entry was picked");
        };
        assert_eq!(offered, "unknown/unknown, linux/arm64/v8, linux/amd64");

        let many: Vec<(String, &str)> = (0..30)
            .map(|i| (format!("linux/arch{i}"), OCI_MANIFEST))
            .collect();
        let many: Vec<(&str, &str)> = many.iter().map(|(p, t)| (p.as_str(), *t)).collect();
        let Ok(Manifest::Index(Err(offered))) = parse(&index(&many)) else {
            panic!("picked from 30 other platforms");
        };
        assert!(offered.ends_with("linux/arch9 and 20 more"), "{offered}");
        let Ok(Manifest::Index(Err(offered))) = parse(br#"{"schemaVersion":2,"manifests":[]}"#)
        else {
            panic!("picked from an empty index");
        };
        assert_eq!(offered, "none");
        assert_eq!(Platform::host().os, std::env::consts::OS);
    }
}
