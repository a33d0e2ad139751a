//! The node's image stores behind `NodeDebugService.LoadImage`
//! (implementations of [`metropolis_service::images::ImageStore`]):
//!
//! - [`OciLayoutStore`]: the embedded default, an OCI image layout in a
//!   directory (`<data-dir>/images`);
//! - [`ContainerdStore`]: containerd, over its gRPC API.
//!
//! The OCI layout store stages an import's members in a staging directory
//! on the import's own thread (fed through a bounded channel, so blocking
//! disk IO never runs on the caller's executor), and commits on that
//! thread; the containerd store streams each member into containerd's
//! content store as it arrives and commits over the same connection.
//!
//! # Names
//!
//! Every image of an archive must have a name: the archive validator
//! gives `RepoTags` entries, `io.containerd.image.name` annotations and
//! full references in `org.opencontainers.image.ref.name` (normalised:
//! `busybox` is `docker.io/library/busybox:latest`). An image without one
//! (an OCI layout whose ref name is a bare tag such as `latest`, a Docker
//! archive without `RepoTags`) is refused with InvalidArgument rather
//! than given a made-up name: nothing could find it under a name the
//! client never chose.

mod containerd;
mod oci;
mod staging;
mod writeback;

use metropolis_archive::{Descriptor, ImportPlan};
use metropolis_service::images::ImageStoreError;

pub use containerd::{ContainerdConfig, ContainerdStore};
pub use metropolis_archive::normalize_reference;
pub use oci::{
    ANNOTATION_CONTAINERD_NAME, ANNOTATION_REF_NAME, OciLayoutOptions, OciLayoutStore, StoredImage,
};

/// The plan's images with their names (normalised), in plan order, once
/// per name; Invalid if an image has none.
fn named_images(plan: &ImportPlan) -> Result<Vec<(String, &Descriptor)>, ImageStoreError> {
    let mut images: Vec<(String, &Descriptor)> = Vec::with_capacity(plan.images.len());
    for (i, image) in plan.images.iter().enumerate() {
        let Some(name) = &image.name else {
            return Err(ImageStoreError::Invalid(format!(
                "image {i} of the archive ({}) has no name: give it a RepoTags entry (Docker \
                 archive) or an io.containerd.image.name annotation or a full reference in \
                 org.opencontainers.image.ref.name (OCI layout)",
                image.manifest.digest
            )));
        };
        let name = normalize_reference(name).unwrap_or_else(|_| name.clone());
        if !images.iter().any(|(n, _)| *n == name) {
            images.push((name, &image.manifest));
        }
    }
    if images.is_empty() {
        return Err(ImageStoreError::Invalid(
            "the archive holds no image".to_owned(),
        ));
    }
    Ok(images)
}
