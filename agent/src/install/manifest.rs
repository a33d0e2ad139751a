//! What the installer accepts of a registry's manifests: an image
//! manifest with exactly one layer (the OS image), or an image index
//! (multi-platform image) from which the agent's own platform's manifest
//! is picked.

use std::fmt;

use serde::Deserialize;

use super::digest::Digest;

pub(super) const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub(super) const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
pub(super) const INDEX_TYPES: [&str; 2] = [
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
];
pub(super) const LAYER_RAW: &str = "application/vnd.oci.image.layer.v1.tar";
pub(super) const LAYER_ZSTD: &str = "application/vnd.oci.image.layer.v1.tar+zstd";

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

/// The OS image layer named by a verified manifest.
pub(super) struct Layer {
    pub(super) digest: Digest,
    pub(super) size: u64,
    pub(super) compressed: bool,
}

/// An index's manifest for one platform.
pub(super) struct Entry {
    pub(super) digest: Digest,
    pub(super) size: u64,
}

/// What a verified manifest is.
pub(super) enum Manifest {
    Image(Layer),
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
    layers: Option<Vec<DescriptorDocument>>,
    manifests: Option<Vec<IndexEntryDocument>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct DescriptorDocument {
    media_type: String,
    digest: String,
    size: u64,
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
    if let Some(media_type) = &document.media_type
        && media_type != OCI_MANIFEST
        && media_type != DOCKER_MANIFEST
    {
        return Err(Invalid(format!(
            "mediaType {:?} is not an image manifest",
            super::http::bounded(media_type)
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
                "image layer media type {:?} (accepted: {LAYER_RAW}, {LAYER_ZSTD})",
                super::http::bounded(other)
            )));
        }
    };
    let digest =
        Digest::parse(&layer.digest).map_err(|e| Invalid(format!("layers[0].digest: {e}")))?;
    Ok(Manifest::Image(Layer {
        digest,
        size: layer.size,
        compressed,
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
    let is_image = |e: &IndexEntryDocument| {
        e.media_type
            .as_deref()
            .is_none_or(|t| t == OCI_MANIFEST || t == DOCKER_MANIFEST)
    };
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
            r#"{{"schemaVersion":2,"mediaType":"{media_type}","config":{{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a","size":2}},"layers":[{layers}]}}"#
        )
        .into_bytes()
    }

    const LAYER: &str = r#"{"mediaType":"application/vnd.oci.image.layer.v1.tar+zstd","digest":"sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855","size":0}"#;

    #[test]
    fn manifests() {
        let Ok(Manifest::Image(layer)) = parse(&manifest(OCI_MANIFEST, LAYER)) else {
            panic!("not an image");
        };
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
                br#"{"schemaVersion":1,"layers":[]}"#.to_vec(),
                "schemaVersion",
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
            manifest(OCI_MANIFEST, &LAYER.replace("+zstd", &long)),
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
            ("linux/amd64", DOCKER_MANIFEST),
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
