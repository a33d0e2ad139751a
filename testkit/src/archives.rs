//! Image archives for the image store and LoadImage tests, built in
//! memory with the `tar` crate (Docker and OCI tarballs, and hostile ones
//! with what each must be refused for), and checks of the OCI layout a
//! store left in a directory the test names.

use std::collections::BTreeMap;
use std::path::Path;

use bytes::Bytes;
use metropolis_archive::{
    Digest, MEDIA_TYPE_OCI_CONFIG, MEDIA_TYPE_OCI_INDEX, MEDIA_TYPE_OCI_LAYER,
    MEDIA_TYPE_OCI_MANIFEST,
};
use serde_json::{Value, json};
use sha2::Digest as _;
use tonic::Code;

/// One member of a test archive.
#[derive(Clone)]
pub enum E {
    /// A regular file at a checked path, with its contents.
    File(String, Vec<u8>),
    /// A file whose path goes into the header unchecked (`..`, `/`).
    RawFile(Vec<u8>, Vec<u8>),
    /// A symbolic link at a path, to a target.
    Symlink(String, String),
    /// A hard link at a path, to an earlier member.
    Hardlink(String, String),
}

fn file(path: &str, data: impl Into<Vec<u8>>) -> E {
    E::File(path.to_owned(), data.into())
}

fn header(kind: tar::EntryType, size: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_size(size);
    h.set_mode(0o644);
    h.set_mtime(1_700_000_000);
    h
}

/// A complete archive of `entries`.
pub fn build(entries: &[E]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for e in entries {
        match e {
            E::File(path, data) => {
                let mut h = header(tar::EntryType::Regular, data.len() as u64);
                b.append_data(&mut h, path, &data[..]).expect("append file");
            }
            E::RawFile(path, data) => {
                let mut h = header(tar::EntryType::Regular, data.len() as u64);
                h.as_old_mut().name[..path.len()].copy_from_slice(path);
                h.set_cksum();
                b.append(&h, &data[..]).expect("append raw file");
            }
            E::Symlink(path, target) => {
                let mut h = header(tar::EntryType::Symlink, 0);
                b.append_link(&mut h, path, target).expect("append symlink");
            }
            E::Hardlink(path, target) => {
                let mut h = header(tar::EntryType::Link, 0);
                b.append_link(&mut h, path, target)
                    .expect("append hard link");
            }
        }
    }
    b.into_inner().expect("finish archive")
}

/// `archive` in chunks of `size` bytes, as a client would stream it.
pub fn chunks(archive: &[u8], size: usize) -> Vec<Result<Bytes, tonic::Status>> {
    archive
        .chunks(size)
        .map(|c| Ok(Bytes::copy_from_slice(c)))
        .collect()
}

fn to_vec(v: &Value) -> Vec<u8> {
    serde_json::to_vec(v).expect("serialise test JSON")
}

/// A one-file layer whose file holds `content`.
fn layer(content: &str) -> Vec<u8> {
    build(&[file("hello.txt", content.as_bytes().to_vec())])
}

fn config(diff_id: Digest) -> Vec<u8> {
    to_vec(&json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {"Cmd": ["/hello"], "Healthcheck": {"Test": ["CMD", "true"]}},
        "rootfs": {"type": "layers", "diff_ids": [diff_id.to_string()]},
    }))
}

/// The members of a `docker save` (v1.2) archive of one image tagged
/// `tag`, whose layer holds `content`.
pub fn docker_entries(tag: &str, content: &str) -> Vec<E> {
    let layer = layer(content);
    let config = config(Digest::of(&layer));
    let config_name = format!("{}.json", Digest::of(&config).hex());
    let id = Digest::of(content.as_bytes()).hex();
    vec![
        file(&format!("{id}/VERSION"), "1.0"),
        file(&format!("{id}/json"), format!("{{\"id\":\"{id}\"}}")),
        file(&format!("{id}/layer.tar"), layer),
        file(&config_name, config),
        file(
            "manifest.json",
            to_vec(&json!([{
                "Config": config_name,
                "RepoTags": [tag],
                "Layers": [format!("{id}/layer.tar")],
            }])),
        ),
        file(
            "repositories",
            to_vec(&json!({tag.split(':').next().unwrap_or(tag): {"latest": id}})),
        ),
    ]
}

/// A `docker save` archive, see [`docker_entries`].
pub fn docker_archive(tag: &str, content: &str) -> Vec<u8> {
    build(&docker_entries(tag, content))
}

/// The blobs of a one-layer OCI image.
pub struct OciParts {
    /// The layer (an uncompressed tar of one file).
    pub layer: Vec<u8>,
    /// The image configuration naming the layer's digest.
    pub config: Vec<u8>,
    /// The image manifest of the config and the layer.
    pub manifest: Vec<u8>,
}

fn descriptor(media_type: &str, data: &[u8]) -> Value {
    json!({"mediaType": media_type, "digest": Digest::of(data).to_string(), "size": data.len()})
}

/// The blobs of a one-layer OCI image whose one file holds `content`.
pub fn oci_parts(content: &str) -> OciParts {
    let layer = layer(content);
    let config = config(Digest::of(&layer));
    let manifest = to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": MEDIA_TYPE_OCI_MANIFEST,
        "config": descriptor(MEDIA_TYPE_OCI_CONFIG, &config),
        "layers": [descriptor(MEDIA_TYPE_OCI_LAYER, &layer)],
    }));
    OciParts {
        layer,
        config,
        manifest,
    }
}

fn blob(data: &[u8]) -> E {
    file(
        &format!("blobs/sha256/{}", Digest::of(data).hex()),
        data.to_vec(),
    )
}

/// The members of an OCI image layout of `parts`, the manifest named
/// `name` (containerd annotation) or unnamed.
pub fn oci_entries(parts: &OciParts, name: Option<&str>) -> Vec<E> {
    let mut entry = descriptor(MEDIA_TYPE_OCI_MANIFEST, &parts.manifest);
    entry["annotations"] = match name {
        Some(name) => {
            json!({"io.containerd.image.name": name, "org.opencontainers.image.ref.name": "1.0"})
        }
        None => json!({"org.opencontainers.image.ref.name": "latest"}),
    };
    vec![
        file("oci-layout", r#"{"imageLayoutVersion":"1.0.0"}"#),
        blob(&parts.layer),
        blob(&parts.config),
        blob(&parts.manifest),
        file(
            "index.json",
            to_vec(&json!({"schemaVersion": 2, "manifests": [entry]})),
        ),
    ]
}

/// An OCI layout archive and its manifest's digest.
pub struct OciArchive {
    /// The archive.
    pub bytes: Vec<u8>,
    /// The digest of its image manifest.
    pub manifest: Digest,
}

/// An OCI layout archive of the one-layer image of `content`, named
/// `name` (containerd annotation) or unnamed.
pub fn oci_archive(name: Option<&str>, content: &str) -> OciArchive {
    let parts = oci_parts(content);
    OciArchive {
        bytes: build(&oci_entries(&parts, name)),
        manifest: Digest::of(&parts.manifest),
    }
}

/// Which limits a hostile case runs under.
pub enum Limit {
    /// The store's default limits.
    Default,
    /// JSON documents of at most 100 bytes.
    SmallJson,
    /// Archives of at most 8 KiB.
    SmallTotal,
}

/// An archive every store must reject, and the code it must get.
pub struct Case {
    /// What the case is, for failure messages.
    pub name: &'static str,
    /// The archive.
    pub bytes: Vec<u8>,
    /// The status code it must be refused with.
    pub code: Code,
    /// A piece of the message that says why.
    pub why: &'static str,
    /// The limits it runs under.
    pub limit: Limit,
}

/// Docker entries with `extra` inserted before `manifest.json`.
fn docker_with(extra: E) -> Vec<u8> {
    let mut entries = docker_entries("evil:latest", "evil");
    entries.insert(3, extra);
    build(&entries)
}

/// Every hostile archive: path traversal, links, duplicates, bad JSON,
/// digests and sizes that do not match, archives over the limits.
pub fn hostile_cases() -> Vec<Case> {
    let invalid = |name, why, bytes| Case {
        name,
        bytes,
        code: Code::InvalidArgument,
        why,
        limit: Limit::Default,
    };
    let parts = oci_parts("mismatch");
    let mut digest_mismatch = oci_entries(&parts, Some("evil:1"));
    digest_mismatch[1] = E::File(
        format!("blobs/sha256/{}", Digest::of(&parts.layer).hex()),
        layer("not the layer"),
    );
    let mut size_mismatch = oci_parts("size");
    let mut manifest: Value = serde_json::from_slice(&size_mismatch.manifest).expect("manifest");
    manifest["layers"][0]["size"] = json!(size_mismatch.layer.len() + 1);
    size_mismatch.manifest = to_vec(&manifest);
    let valid = docker_archive("evil:latest", "evil");
    let mut duplicate = docker_entries("evil:latest", "evil");
    duplicate.push(duplicate[2].clone());
    vec![
        invalid(
            "parent component",
            "'..' component",
            docker_with(E::RawFile(b"../escape".to_vec(), b"x".to_vec())),
        ),
        invalid(
            "absolute path",
            "is absolute",
            docker_with(E::RawFile(b"/etc/escape".to_vec(), b"x".to_vec())),
        ),
        invalid(
            "symlink out of the archive",
            "points outside the archive",
            docker_with(E::Symlink("evil".into(), "../../etc/passwd".into())),
        ),
        invalid(
            "hard link out of the archive",
            "points outside the archive",
            docker_with(E::Hardlink("evil".into(), "../outside".into())),
        ),
        invalid(
            "digest mismatch",
            "content is sha256:",
            build(&digest_mismatch),
        ),
        invalid(
            "size mismatch",
            "declared",
            build(&oci_entries(&size_mismatch, Some("evil:1"))),
        ),
        invalid("truncated", "truncated", valid[..valid.len() / 2].to_vec()),
        invalid(
            "cut at the end marker",
            "end-of-archive marker",
            valid[..valid.len() - 1024].to_vec(),
        ),
        invalid("duplicate member", "appears twice", build(&duplicate)),
        invalid(
            "unknown layout",
            "not a Docker archive",
            build(&[file("hello.txt", "hello")]),
        ),
        Case {
            name: "JSON over the cap",
            bytes: valid.clone(),
            code: Code::ResourceExhausted,
            why: "over the cap",
            limit: Limit::SmallJson,
        },
        Case {
            name: "total over the limit",
            bytes: docker_archive("evil:latest", &"x".repeat(20_000)),
            code: Code::ResourceExhausted,
            why: "larger than the limit",
            limit: Limit::SmallTotal,
        },
    ]
}

/// Every path under `dir` (relative) with the sha256 of its content, or
/// `dir` for directories and `-> target` for symlinks.
pub fn snapshot(dir: &Path) -> BTreeMap<String, String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
        for entry in std::fs::read_dir(dir).expect("read dir") {
            let entry = entry.expect("dir entry");
            let path = entry.path();
            let rel = path
                .strip_prefix(root)
                .expect("under the root")
                .to_string_lossy()
                .into_owned();
            let kind = entry.file_type().expect("file type");
            if kind.is_dir() {
                out.insert(rel, "dir".to_owned());
                walk(root, &path, out);
            } else if kind.is_symlink() {
                let target = std::fs::read_link(&path).expect("read link");
                out.insert(rel, format!("-> {}", target.display()));
            } else {
                let data = std::fs::read(&path).expect("read file");
                out.insert(
                    rel,
                    metropolis_core::hex::encode(&sha2::Sha256::digest(&data)),
                );
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

/// Checks that `dir` is a valid OCI image layout: `oci-layout` and
/// `index.json` parse, every blob reachable from the index exists with its
/// descriptor's sha256 and size, nothing but the layout is there. Returns
/// the number of blobs in `blobs/sha256`.
pub fn check_layout(dir: &Path) -> usize {
    let layout: Value =
        serde_json::from_slice(&std::fs::read(dir.join("oci-layout")).expect("oci-layout"))
            .expect("oci-layout parses");
    assert_eq!(layout["imageLayoutVersion"], "1.0.0");
    let index: Value =
        serde_json::from_slice(&std::fs::read(dir.join("index.json")).expect("index.json"))
            .expect("index.json parses");
    assert_eq!(index["schemaVersion"], 2);
    assert_eq!(index["mediaType"], MEDIA_TYPE_OCI_INDEX);
    let manifests = index["manifests"].as_array().expect("manifests array");
    for entry in manifests {
        let name = &entry["annotations"]["org.opencontainers.image.ref.name"];
        assert!(name.is_string(), "entry without a name: {entry}");
        assert_eq!(
            entry["annotations"]["io.containerd.image.name"], *name,
            "both names set"
        );
        check_descriptor(dir, entry);
    }
    let mut top: Vec<String> = std::fs::read_dir(dir)
        .expect("read layout")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    top.sort();
    assert_eq!(
        top,
        ["blobs", "index.json", "oci-layout"],
        "only the layout"
    );
    std::fs::read_dir(dir.join("blobs/sha256"))
        .expect("read blobs")
        .count()
}

/// Checks one descriptor's blob, and what it references.
fn check_descriptor(dir: &Path, descriptor: &Value) {
    let digest = descriptor["digest"].as_str().expect("digest");
    let hex_digest = digest.strip_prefix("sha256:").expect("sha256 digest");
    let data = std::fs::read(dir.join("blobs/sha256").join(hex_digest))
        .unwrap_or_else(|e| panic!("blob {digest}: {e}"));
    assert_eq!(
        metropolis_core::hex::encode(&sha2::Sha256::digest(&data)),
        hex_digest,
        "blob {digest} content"
    );
    assert_eq!(
        Some(data.len() as u64),
        descriptor["size"].as_u64(),
        "blob {digest} size"
    );
    let media_type = descriptor["mediaType"].as_str().unwrap_or_default();
    if media_type.contains("manifest") || media_type.contains("index") {
        let doc: Value = serde_json::from_slice(&data).expect("manifest parses");
        if let Some(children) = doc["manifests"].as_array() {
            for child in children {
                check_descriptor(dir, child);
            }
        } else {
            check_descriptor(dir, &doc["config"]);
            for layer in doc["layers"].as_array().expect("layers") {
                check_descriptor(dir, layer);
            }
        }
    }
}
