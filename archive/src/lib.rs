//! Validation of image archives (Docker v1.1/v1.2, OCI image layout v1),
//! as a sans-IO machine fed with bytes: the archive half of
//! `NodeDebugService.LoadImage`, and what `metroctl load-image` reads the
//! images' names with.
//!
//! The crate does no IO, reads no clock and knows no protocol: its errors
//! say what is wrong with the archive, and which status a service answers
//! with is the service's to say (`metropolis_service::status::debug` maps them to
//! gRPC codes).
//!
//! [`ArchiveValidator`] reads an uncompressed tar streamed in chunks of any
//! size. While it reads, it streams every regular member out
//! ([`Output`]), so an image store can stage the bytes without the archive
//! ever being held in memory; at the end it checks the archive as a whole
//! and returns an [`ImportPlan`] (or an [`ArchiveError`]). See
//! [`ArchiveValidator`] for the driving contract.
//!
//! # What is checked
//!
//! Tar framing: header checksums (unsigned, or signed as some old writers
//! compute them), numeric fields, GNU long names and links (`L`, `K`), PAX
//! headers (`x`: `path`, `linkpath`, `size`; `g` is ignored), padding and
//! the end-of-archive marker. Members: paths are relative and have no
//! `..`; link targets stay inside the archive; no path appears twice;
//! `blobs/sha256/<hex>` members hash to their names as they arrive.
//! Limits ([`ArchiveLimits`]): total size (as soon as it is passed or a
//! header declares more), members, JSON documents.
//!
//! Then the layout: an archive with `oci-layout` is an OCI image layout
//! (`imageLayoutVersion` `1.0.0`, `index.json`, every descriptor reachable
//! from it present with its declared digest and size; for image configs,
//! uncompressed layers hash to `rootfs.diff_ids`). Docker 25+ `docker save`
//! writes such a layout plus a `manifest.json`; both are checked. Otherwise
//! an archive with `manifest.json` is a Docker archive: every `Config` and
//! `Layers` entry exists (links followed), a config named `<hex>.json` or
//! `blobs/sha256/<hex>` hashes to its name, and layer `i` hashes to the
//! config's `rootfs.diff_ids[i]`. Anything else is an unknown layout.
//!
//! # Decisions
//!
//! - **End marker.** The archive must end with the two zero blocks every
//!   writer (`docker save`, GNU tar, bsdtar, Go's and Rust's tar libraries)
//!   emits; EOF without them is [`TruncatedAt::EndMarker`], even when the
//!   last member is complete, because only the marker tells a complete
//!   archive from one cut at a member boundary. Zero bytes after the marker
//!   (record padding) are accepted; anything else is
//!   [`ArchiveError::TrailingData`].
//! - **Compressed layers.** Docker configs give `diff_ids`, digests of the
//!   *uncompressed* layer. A layer starting with the gzip (`1f 8b`) or
//!   zstd (`28 b5 2f fd`) magic cannot be compared without decompressing,
//!   which this machine does not do (it would cost more than the hash per
//!   byte): its blob is recorded with its [`Compression`] and its content
//!   digest, a matching compressed media type, and the expected `diff_id`
//!   in [`BlobSource::unverified_diff_id`] for the store to check if it
//!   unpacks the layer. Uncompressed layers are always compared.
//! - **Device and FIFO members** (and sparse files, volume labels, unknown
//!   type flags) are rejected with [`ArchiveError::UnsupportedMember`]: no
//!   image archive has them, and ignoring them would accept archives whose
//!   meaning is unclear.
//! - **Links** are resolved lexically inside the archive (nothing is
//!   extracted); a symlink target is relative to the link's directory, a
//!   hard link target to the archive root; `..` may appear in a target as
//!   long as it stays inside. Dangling links are allowed unless referenced.
//! - **Names** are normalised as Docker and containerd do
//!   (`busybox:latest` -> `docker.io/library/busybox:latest`), from
//!   `RepoTags`, or from the `io.containerd.image.name` annotation, or from
//!   `org.opencontainers.image.ref.name` when it is a full reference (not a
//!   bare tag such as `latest`). An invalid `RepoTags` entry or containerd
//!   name rejects the archive; an image without a name gets `name: None`.
//! - **Media types.** Manifests synthesized for Docker archives are OCI
//!   image manifests ([`MEDIA_TYPE_OCI_MANIFEST`]) with an OCI config
//!   ([`MEDIA_TYPE_OCI_CONFIG`]) and OCI layer types
//!   ([`MEDIA_TYPE_OCI_LAYER`], `+gzip`, `+zstd`), as Docker 25's own
//!   `docker save` labels the same configs; Docker schema 2 has no zstd
//!   layer type. OCI layouts keep their descriptors' media types.
//! - **Version.** Docker image spec v1.1 and v1.2 archives have the same
//!   layout; [`Format::DockerV1_2`] is reported when a config has a
//!   `Healthcheck` (the only v1.2 addition), else [`Format::DockerV1_1`].
//!   Archives with `repositories` but no `manifest.json` (v1.0, random
//!   layer ids, no digests to check) are rejected as unknown.

#![forbid(unsafe_code)]

mod docker;
mod error;
mod layout;
mod members;
mod name;
mod oci;
mod plan;
mod tar;
mod validator;

pub use error::{ArchiveError, TruncatedAt};
pub use name::normalize as normalize_reference;
pub use plan::{
    BlobSource, Compression, Descriptor, Digest, DigestError, Format, ImageRef, ImportPlan,
    MEDIA_TYPE_DOCKER_CONFIG, MEDIA_TYPE_DOCKER_MANIFEST, MEDIA_TYPE_DOCKER_MANIFEST_LIST,
    MEDIA_TYPE_OCI_CONFIG, MEDIA_TYPE_OCI_INDEX, MEDIA_TYPE_OCI_LAYER, MEDIA_TYPE_OCI_LAYER_GZIP,
    MEDIA_TYPE_OCI_LAYER_ZSTD, MEDIA_TYPE_OCI_MANIFEST, SynthesizedBlob,
};
pub use validator::{ArchiveLimits, ArchiveValidator, Output};
