//! Why an archive is rejected.

use std::fmt;

use super::plan::Digest;

/// Where an archive ended early.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TruncatedAt {
    /// Inside a 512-byte header block.
    Header,
    /// Inside the data (or padding) of this member.
    Member {
        /// The member's path.
        path: String,
    },
    /// Inside the data of an extension header (GNU long name, PAX), or
    /// after an extension header with no member following it.
    Extension,
    /// After the last member, without the two zero blocks that end a tar
    /// archive (or with only one of them).
    EndMarker,
}

/// Why an archive is rejected. Every variant names the offending member,
/// field or offset in its `Display`. The variants say what happened, not
/// what a protocol makes of it: the limits passed are
/// [`ArchiveTooLarge`](Self::ArchiveTooLarge),
/// [`TooManyMembers`](Self::TooManyMembers),
/// [`JsonTooLarge`](Self::JsonTooLarge) and
/// [`MetadataTooLarge`](Self::MetadataTooLarge); every other variant is a
/// malformed or inconsistent archive.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ArchiveError {
    /// A header's stored checksum does not match its bytes.
    BadChecksum {
        /// Offset of the header in the archive.
        offset: u64,
        /// The checksum stored in the header.
        stored: u32,
        /// The checksum of the header's bytes.
        computed: u32,
    },
    /// A header field (or PAX record) cannot be parsed, an extension
    /// header is too large or not followed by a member, or a lone zero
    /// block is followed by a header.
    BadHeader {
        /// Offset of the header in the archive.
        offset: u64,
        /// What is wrong, naming the field.
        what: &'static str,
    },
    /// The archive ended early.
    Truncated {
        /// Number of bytes received.
        offset: u64,
        /// Where.
        at: TruncatedAt,
    },
    /// Non-zero bytes after the end-of-archive marker.
    TrailingData {
        /// Offset of the first non-zero byte.
        offset: u64,
    },
    /// A member type that has no place in an image archive: character or
    /// block device, FIFO, sparse file, volume label, multi-volume
    /// continuation, or an unknown type flag.
    UnsupportedMember {
        /// The member's path.
        path: String,
        /// What it is.
        kind: &'static str,
    },
    /// A member path that is not a usable name (empty, not UTF-8, too
    /// long, or a non-blob name under `blobs/sha256/`).
    InvalidPath {
        /// The path as written (lossily decoded).
        path: String,
        /// Why.
        reason: &'static str,
    },
    /// A member path with a `..` component.
    ParentComponent {
        /// The path as written.
        path: String,
    },
    /// A member path that is absolute.
    AbsolutePath {
        /// The path as written.
        path: String,
    },
    /// A symbolic link whose target is absolute or leaves the archive.
    SymlinkEscapes {
        /// The link's path.
        member: String,
        /// The target as written.
        target: String,
    },
    /// A hard link whose target is absolute or leaves the archive.
    HardlinkEscapes {
        /// The link's path.
        member: String,
        /// The target as written.
        target: String,
    },
    /// Two members with the same (normalised) path.
    DuplicateMember {
        /// The path.
        path: String,
    },
    /// The archive is larger than the configured limit.
    ArchiveTooLarge {
        /// The limit in bytes.
        limit: u64,
    },
    /// The archive has more members than the configured limit.
    TooManyMembers {
        /// The limit.
        limit: usize,
    },
    /// A JSON document (or an extension header) is larger than the cap.
    JsonTooLarge {
        /// The member.
        member: String,
        /// Its size.
        size: u64,
        /// The cap.
        limit: usize,
    },
    /// A JSON document was needed but not kept, because the total budget
    /// for buffered metadata was spent.
    MetadataTooLarge {
        /// The member.
        member: String,
        /// The budget in bytes.
        limit: usize,
    },
    /// Neither a Docker archive (`manifest.json`) nor an OCI layout
    /// (`oci-layout`).
    UnknownLayout {
        /// What was found instead.
        reason: &'static str,
    },
    /// A referenced member does not exist (or a link leads nowhere).
    MissingMember {
        /// The path looked up.
        path: String,
        /// The field that references it.
        field: String,
    },
    /// A referenced member is not a regular file.
    NotAFile {
        /// The path looked up.
        path: String,
        /// The field that references it.
        field: String,
    },
    /// Following links from a path takes more than 40 steps.
    LinkLoop {
        /// The path looked up.
        path: String,
    },
    /// A JSON document does not parse or lacks a required field.
    InvalidJson {
        /// The member.
        member: String,
        /// The parser's message.
        reason: String,
    },
    /// `oci-layout` has an `imageLayoutVersion` other than `1.0.0`.
    OciLayoutVersion {
        /// The version found.
        found: String,
    },
    /// A digest string is malformed.
    InvalidDigest {
        /// The field.
        field: String,
        /// The value.
        value: String,
    },
    /// A digest uses an algorithm other than sha256.
    UnsupportedDigestAlgorithm {
        /// The field.
        field: String,
        /// The value.
        value: String,
    },
    /// A blob's content does not hash to the digest it is named or
    /// referenced by.
    BlobDigestMismatch {
        /// The member.
        member: String,
        /// The digest expected (its name, or the referencing descriptor).
        expected: Digest,
        /// The content's digest.
        actual: Digest,
    },
    /// A Docker image config's content does not hash to its file name.
    ConfigDigestMismatch {
        /// The member.
        member: String,
        /// The digest its name says.
        expected: Digest,
        /// The content's digest.
        actual: Digest,
    },
    /// An uncompressed layer's content does not hash to the config's
    /// `rootfs.diff_ids` entry.
    DiffIdMismatch {
        /// The field (`<config>.rootfs.diff_ids[i]`).
        field: String,
        /// The layer member.
        member: String,
        /// The `diff_id`.
        expected: Digest,
        /// The layer's digest.
        actual: Digest,
    },
    /// A descriptor's `size` differs from the blob's size.
    SizeMismatch {
        /// The descriptor's field.
        field: String,
        /// The member.
        member: String,
        /// The size declared.
        declared: u64,
        /// The member's size.
        actual: u64,
    },
    /// An image lists a different number of layers than its config has
    /// `rootfs.diff_ids`.
    LayerCountMismatch {
        /// The field listing the layers.
        field: String,
        /// Number of layers.
        layers: usize,
        /// Number of `diff_ids`.
        diff_ids: usize,
    },
    /// An image name (`RepoTags`, `io.containerd.image.name`) is not a
    /// valid reference.
    InvalidImageName {
        /// The field.
        field: String,
        /// The name.
        name: String,
        /// Why.
        reason: &'static str,
    },
    /// Image indexes nested deeper than 8 levels.
    NestingTooDeep {
        /// The descriptor at which the limit was passed.
        field: String,
    },
}

impl fmt::Display for TruncatedAt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TruncatedAt::Header => write!(f, "inside a header"),
            TruncatedAt::Member { path } => write!(f, "inside member {path}"),
            TruncatedAt::Extension => write!(f, "inside an extension header"),
            TruncatedAt::EndMarker => write!(f, "before the end-of-archive marker"),
        }
    }
}

impl fmt::Display for ArchiveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use ArchiveError as E;
        match self {
            E::BadChecksum {
                offset,
                stored,
                computed,
            } => write!(
                f,
                "header at offset {offset}: checksum {stored:o} stored, {computed:o} computed"
            ),
            E::BadHeader { offset, what } => write!(f, "header at offset {offset}: {what}"),
            E::Truncated { offset, at } => {
                write!(f, "archive truncated after {offset} bytes, {at}")
            }
            E::TrailingData { offset } => write!(
                f,
                "non-zero data at offset {offset} after the end-of-archive marker"
            ),
            E::UnsupportedMember { path, kind } => {
                write!(f, "member {path}: {kind} members are not allowed")
            }
            E::InvalidPath { path, reason } => write!(f, "member path {path:?}: {reason}"),
            E::ParentComponent { path } => {
                write!(f, "member path {path:?} has a '..' component")
            }
            E::AbsolutePath { path } => write!(f, "member path {path:?} is absolute"),
            E::SymlinkEscapes { member, target } => write!(
                f,
                "symlink {member} -> {target:?} points outside the archive"
            ),
            E::HardlinkEscapes { member, target } => write!(
                f,
                "hard link {member} -> {target:?} points outside the archive"
            ),
            E::DuplicateMember { path } => write!(f, "member {path} appears twice"),
            E::ArchiveTooLarge { limit } => {
                write!(f, "archive larger than the limit of {limit} bytes")
            }
            E::TooManyMembers { limit } => {
                write!(f, "archive has more than {limit} members")
            }
            E::JsonTooLarge {
                member,
                size,
                limit,
            } => write!(
                f,
                "{member}: {size} bytes, over the cap of {limit} bytes for a JSON document"
            ),
            E::MetadataTooLarge { member, limit } => write!(
                f,
                "{member}: not kept, the archive's JSON documents exceed {limit} bytes in total"
            ),
            E::UnknownLayout { reason } => write!(
                f,
                "not a Docker archive (manifest.json) or an OCI image layout (oci-layout): {reason}"
            ),
            E::MissingMember { path, field } => {
                write!(f, "{field}: member {path} is not in the archive")
            }
            E::NotAFile { path, field } => {
                write!(f, "{field}: member {path} is not a regular file")
            }
            E::LinkLoop { path } => write!(f, "{path}: too many levels of links"),
            E::InvalidJson { member, reason } => write!(f, "{member}: {reason}"),
            E::OciLayoutVersion { found } => write!(
                f,
                "oci-layout: imageLayoutVersion must be \"1.0.0\", got {found:?}"
            ),
            E::InvalidDigest { field, value } => {
                write!(f, "{field}: {value:?} is not a valid digest")
            }
            E::UnsupportedDigestAlgorithm { field, value } => write!(
                f,
                "{field}: digest {value:?} uses an algorithm other than sha256"
            ),
            E::BlobDigestMismatch {
                member,
                expected,
                actual,
            } => write!(f, "blob {member}: expected {expected}, content is {actual}"),
            E::ConfigDigestMismatch {
                member,
                expected,
                actual,
            } => write!(
                f,
                "config {member}: name says {expected}, content is {actual}"
            ),
            E::DiffIdMismatch {
                field,
                member,
                expected,
                actual,
            } => write!(
                f,
                "{field}: layer {member} should be {expected}, content is {actual}"
            ),
            E::SizeMismatch {
                field,
                member,
                declared,
                actual,
            } => write!(
                f,
                "{field}: size {declared} declared, member {member} has {actual} bytes"
            ),
            E::LayerCountMismatch {
                field,
                layers,
                diff_ids,
            } => write!(
                f,
                "{field}: {layers} layers, but the config has {diff_ids} rootfs.diff_ids"
            ),
            E::InvalidImageName {
                field,
                name,
                reason,
            } => write!(f, "{field}: image name {name:?}: {reason}"),
            E::NestingTooDeep { field } => {
                write!(f, "{field}: image indexes nested too deep")
            }
        }
    }
}

impl std::error::Error for ArchiveError {}
