//! The labels by which containerd's garbage collector keeps what a
//! manifest or index references.
//!
//! containerd does not read manifests to decide what to keep: an image
//! record keeps its target blob, and a blob keeps every blob a
//! `containerd.io/gc.ref.content.*` label on it names. The key says what
//! the child is (`config`, `m.<i>` for a manifest, `l.<i>` for a layer,
//! `<i>` otherwise), the value is its digest; these are the keys
//! containerd's own clients set when they import or pull.

use std::collections::HashMap;

use metropolis_archive::{
    Descriptor, MEDIA_TYPE_DOCKER_CONFIG, MEDIA_TYPE_DOCKER_MANIFEST, MEDIA_TYPE_OCI_CONFIG,
    MEDIA_TYPE_OCI_MANIFEST,
};

/// The prefix of every reference label.
const PREFIX: &str = "containerd.io/gc.ref.content.";

/// The labels a blob referencing `children` (in order) carries.
pub(super) fn gc_labels(children: &[Descriptor]) -> HashMap<String, String> {
    let mut counts: HashMap<&'static str, usize> = HashMap::new();
    let mut labels = HashMap::with_capacity(children.len());
    for child in children {
        let kind = kind(&child.media_type);
        let n = counts.entry(kind).or_insert(0);
        // A kind without a trailing dot (`config`) is numbered only from
        // its second occurrence on.
        let key = if kind.ends_with('.') || kind.is_empty() || *n > 0 {
            format!("{PREFIX}{kind}{n}")
        } else {
            format!("{PREFIX}{kind}")
        };
        *n += 1;
        labels.insert(key, child.digest.to_string());
    }
    labels
}

/// The key's kind for a child of this media type.
fn kind(media_type: &str) -> &'static str {
    match media_type {
        MEDIA_TYPE_OCI_CONFIG
        | MEDIA_TYPE_DOCKER_CONFIG
        | "application/vnd.containerd.container.checkpoint.config.v1+proto" => "config",
        MEDIA_TYPE_OCI_MANIFEST | MEDIA_TYPE_DOCKER_MANIFEST => "m.",
        m if is_layer(m) => "l.",
        _ => "",
    }
}

/// Whether `media_type` is a layer's (OCI, OCI non-distributable, or
/// Docker's).
fn is_layer(media_type: &str) -> bool {
    media_type.starts_with("application/vnd.oci.image.layer.")
        || media_type.starts_with("application/vnd.docker.image.rootfs.")
}

#[cfg(test)]
mod tests {
    use metropolis_archive::{
        Digest, MEDIA_TYPE_OCI_INDEX, MEDIA_TYPE_OCI_LAYER, MEDIA_TYPE_OCI_LAYER_GZIP,
    };

    use super::*;

    fn child(media_type: &str, seed: &[u8]) -> Descriptor {
        Descriptor {
            media_type: media_type.to_owned(),
            digest: Digest::of(seed),
            size: seed.len() as u64,
        }
    }

    #[test]
    fn a_manifest_labels_its_config_and_numbered_layers() {
        let children = [
            child(MEDIA_TYPE_OCI_CONFIG, b"c"),
            child(MEDIA_TYPE_OCI_LAYER_GZIP, b"l0"),
            child(MEDIA_TYPE_OCI_LAYER, b"l1"),
            child("application/vnd.docker.image.rootfs.diff.tar.gzip", b"l2"),
        ];
        let labels = gc_labels(&children);
        let expect = |key: &str, seed: &[u8]| {
            assert_eq!(
                labels.get(key),
                Some(&Digest::of(seed).to_string()),
                "{key}: {labels:?}"
            );
        };
        expect("containerd.io/gc.ref.content.config", b"c");
        expect("containerd.io/gc.ref.content.l.0", b"l0");
        expect("containerd.io/gc.ref.content.l.1", b"l1");
        expect("containerd.io/gc.ref.content.l.2", b"l2");
        assert_eq!(labels.len(), 4);
    }

    #[test]
    fn an_index_labels_manifests_and_other_children_apart() {
        let children = [
            child(MEDIA_TYPE_OCI_MANIFEST, b"m0"),
            child(MEDIA_TYPE_OCI_INDEX, b"i"),
            child(MEDIA_TYPE_DOCKER_MANIFEST, b"m1"),
            child("application/octet-stream", b"x"),
        ];
        let labels = gc_labels(&children);
        let keys: std::collections::BTreeSet<&str> = labels.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "containerd.io/gc.ref.content.0",
                "containerd.io/gc.ref.content.1",
                "containerd.io/gc.ref.content.m.0",
                "containerd.io/gc.ref.content.m.1",
            ]
            .into()
        );
        assert_eq!(
            labels["containerd.io/gc.ref.content.m.1"],
            Digest::of(b"m1").to_string()
        );
    }
}
