//! From a complete member table to an [`ImportPlan`]: format detection and
//! the lookups and plan building both formats share.

use std::collections::{BTreeMap, HashMap};

use serde::de::DeserializeOwned;

use super::docker;
use super::error::ArchiveError;
use super::members::{FileInfo, Json, LookupError, MemberKind, Members, normalize_reference};
use super::oci;
use super::plan::{
    BlobSource, Compression, Descriptor, Digest, DigestError, Format, ImageRef, ImportPlan,
    SynthesizedBlob,
};
use super::validator::ArchiveLimits;

/// Builds the plan for a complete archive.
pub(crate) fn plan(members: &Members, limits: &ArchiveLimits) -> Result<ImportPlan, ArchiveError> {
    let ctx = Ctx { members, limits };
    let mut builder = PlanBuilder::default();
    let format = if members.contains("oci-layout") {
        let docker_names = if members.contains("manifest.json") {
            // Docker 25+: an OCI layout with a Docker manifest beside it.
            // Both must hold; the OCI side is the plan (its manifests are
            // the ones Docker wrote), the Docker side may name images the
            // index leaves unnamed.
            let mut scratch = PlanBuilder::default();
            docker::plan(&ctx, &mut scratch)?;
            scratch.names_by_config
        } else {
            HashMap::new()
        };
        oci::plan(&ctx, &mut builder, &docker_names)?;
        Format::Oci
    } else if members.contains("manifest.json") {
        if docker::plan(&ctx, &mut builder)? {
            Format::DockerV1_2
        } else {
            Format::DockerV1_1
        }
    } else if members.contains("index.json") {
        return Err(ArchiveError::UnknownLayout {
            reason: "index.json without oci-layout",
        });
    } else if members.contains("repositories") {
        return Err(ArchiveError::UnknownLayout {
            reason: "repositories without manifest.json (legacy Docker v1.0 archives are not supported)",
        });
    } else {
        return Err(ArchiveError::UnknownLayout {
            reason: "neither is present",
        });
    };
    Ok(ImportPlan {
        format,
        blobs: builder.blobs,
        synthesized: builder.synthesized,
        images: builder.images,
        children: builder.children,
    })
}

/// Read access to the member table for the format modules.
pub(crate) struct Ctx<'a> {
    members: &'a Members,
    limits: &'a ArchiveLimits,
}

/// A regular member found by a lookup.
pub(crate) struct Found<'a> {
    /// Its index.
    pub index: usize,
    /// Its normalised path (after links).
    pub path: &'a str,
    /// What is known of it.
    pub info: &'a FileInfo,
}

impl Found<'_> {
    /// Compression, from the magic bytes.
    pub(crate) fn compression(&self) -> Compression {
        let head = &self.info.head[..self.info.head_len as usize];
        if head.starts_with(&[0x1f, 0x8b]) {
            Compression::Gzip
        } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
            Compression::Zstd
        } else {
            Compression::None
        }
    }
}

impl<'a> Ctx<'a> {
    /// Whether a member (of any kind) has exactly this path.
    pub(crate) fn contains(&self, path: &str) -> bool {
        self.members.contains(path)
    }

    /// Looks up the regular member at `path` (as written in `field`),
    /// following links.
    pub(crate) fn file(&self, path: &str, field: &str) -> Result<Found<'a>, ArchiveError> {
        let missing = || ArchiveError::MissingMember {
            path: path.to_owned(),
            field: field.to_owned(),
        };
        let normalized = normalize_reference(path).ok_or_else(missing)?;
        let index = self.members.resolve(&normalized).map_err(|e| match e {
            LookupError::Missing => missing(),
            LookupError::NotAFile => ArchiveError::NotAFile {
                path: path.to_owned(),
                field: field.to_owned(),
            },
            LookupError::Loop => ArchiveError::LinkLoop {
                path: path.to_owned(),
            },
        })?;
        let member = self.members.get(index);
        let MemberKind::File(Some(info)) = &member.kind else {
            unreachable!("resolve returns complete regular members at end of archive")
        };
        Ok(Found {
            index,
            path: &member.path,
            info,
        })
    }

    /// Parses a found member as a JSON document.
    pub(crate) fn json<T: DeserializeOwned>(&self, found: &Found<'_>) -> Result<T, ArchiveError> {
        match &found.info.json {
            Json::Kept(bytes) => {
                serde_json::from_slice(bytes).map_err(|e| ArchiveError::InvalidJson {
                    member: found.path.to_owned(),
                    reason: e.to_string(),
                })
            }
            Json::TooLarge => Err(ArchiveError::JsonTooLarge {
                member: found.path.to_owned(),
                size: found.info.size,
                limit: self.limits.max_json_size,
            }),
            Json::OverBudget => Err(ArchiveError::MetadataTooLarge {
                member: found.path.to_owned(),
                limit: self.limits.max_json_total,
            }),
            Json::NotADocument => Err(ArchiveError::InvalidJson {
                member: found.path.to_owned(),
                reason: "not a JSON document".to_owned(),
            }),
        }
    }
}

/// Parses a digest from a document, naming the field on failure.
pub(crate) fn parse_digest(
    value: &str,
    field: impl FnOnce() -> String,
) -> Result<Digest, ArchiveError> {
    Digest::parse(value).map_err(|e| match e {
        DigestError::Malformed => ArchiveError::InvalidDigest {
            field: field(),
            value: value.to_owned(),
        },
        DigestError::UnsupportedAlgorithm => ArchiveError::UnsupportedDigestAlgorithm {
            field: field(),
            value: value.to_owned(),
        },
    })
}

/// The plan under construction.
#[derive(Default)]
pub(crate) struct PlanBuilder {
    pub blobs: Vec<BlobSource>,
    blob_index: HashMap<Digest, usize>,
    pub synthesized: Vec<SynthesizedBlob>,
    pub images: Vec<ImageRef>,
    /// Docker archives: normalised `RepoTags` by config digest.
    pub names_by_config: HashMap<Digest, Vec<String>>,
    /// What each manifest and index references ([`ImportPlan::children`]).
    pub children: BTreeMap<Digest, Vec<Descriptor>>,
}

impl PlanBuilder {
    /// Adds a blob unless one with its digest is already there.
    pub(crate) fn add_blob(&mut self, blob: BlobSource) {
        if self.blob_index.contains_key(&blob.digest) {
            return;
        }
        self.blob_index.insert(blob.digest, self.blobs.len());
        self.blobs.push(blob);
    }

    /// Records what the manifest or index `parent` references (the first
    /// record of a digest stands: the same bytes reference the same
    /// children).
    pub(crate) fn set_children(&mut self, parent: Digest, children: Vec<Descriptor>) {
        self.children.entry(parent).or_insert(children);
    }

    /// Adds a synthesized blob unless one with its digest is already there.
    pub(crate) fn add_synthesized(&mut self, blob: SynthesizedBlob) {
        if self.synthesized.iter().any(|b| b.digest == blob.digest) {
            return;
        }
        self.synthesized.push(blob);
    }
}
