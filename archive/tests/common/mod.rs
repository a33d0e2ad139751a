//! What the validator's tests share: real archives built with the `tar`
//! crate (Docker v1.2, Docker 25+, OCI layouts, and members written
//! verbatim to break them), and the validator run over them in chunks.

#![allow(dead_code)]

mod run;

use metropolis_archive::*;
use serde_json::json;

pub use run::*;

// ---------------------------------------------------------------------------
// Building archives.

/// One member of a test archive.
#[derive(Clone, Debug)]
pub enum E {
    File(String, Vec<u8>),
    Dir(String),
    Symlink(String, String),
    Hardlink(String, String),
    /// A file whose path is written into the header verbatim (no checks).
    RawFile(Vec<u8>, Vec<u8>),
    /// A symlink written verbatim.
    RawSymlink(String, Vec<u8>),
    /// A hard link written verbatim.
    RawHardlink(String, Vec<u8>),
    /// A file named through a PAX `path` record.
    PaxFile(String, Vec<u8>),
    /// A member with this type flag and no data.
    Special(String, u8),
}

pub fn file(path: &str, data: impl Into<Vec<u8>>) -> E {
    E::File(path.to_owned(), data.into())
}

pub fn header(kind: ::tar::EntryType, size: u64) -> ::tar::Header {
    let mut h = ::tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_size(size);
    h.set_mode(0o644);
    h.set_mtime(1_700_000_000);
    h
}

pub fn raw_header(kind: ::tar::EntryType, path: &[u8], link: &[u8], size: u64) -> ::tar::Header {
    let mut h = header(kind, size);
    let old = h.as_old_mut();
    old.name[..path.len()].copy_from_slice(path);
    old.linkname[..link.len()].copy_from_slice(link);
    h.set_cksum();
    h
}

/// A complete archive (with the end marker).
pub fn build(entries: &[E]) -> Vec<u8> {
    use ::tar::EntryType as T;
    let mut b = ::tar::Builder::new(Vec::new());
    for e in entries {
        match e {
            E::File(path, data) => {
                let mut h = header(T::Regular, data.len() as u64);
                b.append_data(&mut h, path, &data[..]).expect("append file");
            }
            E::Dir(path) => {
                let mut h = header(T::Directory, 0);
                b.append_data(&mut h, path, std::io::empty())
                    .expect("append dir");
            }
            E::Symlink(path, target) => {
                let mut h = header(T::Symlink, 0);
                b.append_link(&mut h, path, target).expect("append symlink");
            }
            E::Hardlink(path, target) => {
                let mut h = header(T::Link, 0);
                b.append_link(&mut h, path, target)
                    .expect("append hard link");
            }
            E::RawFile(path, data) => {
                let h = raw_header(T::Regular, path, b"", data.len() as u64);
                b.append(&h, &data[..]).expect("append raw file");
            }
            E::RawSymlink(path, target) => {
                let h = raw_header(T::Symlink, path.as_bytes(), target, 0);
                b.append(&h, std::io::empty()).expect("append raw symlink");
            }
            E::RawHardlink(path, target) => {
                let h = raw_header(T::Link, path.as_bytes(), target, 0);
                b.append(&h, std::io::empty())
                    .expect("append raw hard link");
            }
            E::PaxFile(path, data) => {
                b.append_pax_extensions([("path", path.as_bytes())])
                    .expect("append pax");
                let h = raw_header(T::Regular, b"placeholder", b"", data.len() as u64);
                b.append(&h, &data[..]).expect("append pax file");
            }
            E::Special(path, flag) => {
                let h = raw_header(T::new(*flag), path.as_bytes(), b"", 0);
                b.append(&h, std::io::empty()).expect("append special");
            }
        }
    }
    b.into_inner().expect("finish archive")
}

/// A layer: a small tar of its own.
pub fn layer(name: &str, content: &str) -> Vec<u8> {
    build(&[file(name, content.as_bytes().to_vec())])
}

pub fn sha(data: &[u8]) -> Digest {
    Digest::of(data)
}

pub fn to_vec(v: &serde_json::Value) -> Vec<u8> {
    serde_json::to_vec(v).expect("serialise test JSON")
}

pub fn config(diff_ids: &[Digest], healthcheck: bool) -> Vec<u8> {
    let mut c = json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {"Cmd": ["sh"]},
        "rootfs": {"type": "layers", "diff_ids": diff_ids.iter().map(|d| d.to_string()).collect::<Vec<_>>()},
    });
    if healthcheck {
        c["config"]["Healthcheck"] = json!({"Test": ["CMD", "true"]});
    }
    to_vec(&c)
}

/// The parts of a Docker archive, so tests can break one.
pub struct Docker {
    pub layers: Vec<Vec<u8>>,
    pub config: Vec<u8>,
    pub manifest: serde_json::Value,
    pub ids: Vec<String>,
}

pub fn docker_parts() -> Docker {
    let layers = vec![layer("hello.txt", "hello"), layer("world.txt", "world!")];
    let diff_ids: Vec<Digest> = layers.iter().map(|l| sha(l)).collect();
    let config = config(&diff_ids, true);
    let ids: Vec<String> = (0..2)
        .map(|i| sha(format!("id{i}").as_bytes()).hex())
        .collect();
    let manifest = json!([{
        "Config": format!("{}.json", sha(&config).hex()),
        "RepoTags": ["busybox:latest", "registry.example.com/tools/busybox:1.36"],
        "Layers": ids.iter().map(|id| format!("{id}/layer.tar")).collect::<Vec<_>>(),
    }]);
    Docker {
        layers,
        config,
        manifest,
        ids,
    }
}

/// A `docker save` (v1.2) archive, members in `docker save`'s order.
pub fn docker_entries(d: &Docker) -> Vec<E> {
    let mut entries = Vec::new();
    for (id, layer) in d.ids.iter().zip(&d.layers) {
        entries.push(E::Dir(format!("{id}/")));
        entries.push(file(&format!("{id}/VERSION"), "1.0"));
        entries.push(file(&format!("{id}/json"), format!("{{\"id\":\"{id}\"}}")));
        entries.push(file(&format!("{id}/layer.tar"), layer.clone()));
    }
    entries.push(file(
        &format!("{}.json", sha(&d.config).hex()),
        d.config.clone(),
    ));
    entries.push(file("manifest.json", to_vec(&d.manifest)));
    entries.push(file(
        "repositories",
        to_vec(&json!({"busybox": {"latest": d.ids[1]}})),
    ));
    entries
}

pub fn docker_archive() -> Vec<u8> {
    build(&docker_entries(&docker_parts()))
}

pub fn blob(data: &[u8]) -> E {
    file(&format!("blobs/sha256/{}", sha(data).hex()), data.to_vec())
}

pub fn descriptor(media_type: &str, data: &[u8]) -> serde_json::Value {
    json!({"mediaType": media_type, "digest": sha(data).to_string(), "size": data.len()})
}

pub fn oci_manifest(config: &[u8], layers: &[Vec<u8>]) -> Vec<u8> {
    to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": MEDIA_TYPE_OCI_MANIFEST,
        "config": descriptor(MEDIA_TYPE_OCI_CONFIG, config),
        "layers": layers.iter().map(|l| descriptor(MEDIA_TYPE_OCI_LAYER, l)).collect::<Vec<_>>(),
    }))
}

/// A Docker 25+ `docker save` archive: an OCI layout, plus `manifest.json`
/// whose layers are found through legacy-path symlinks into `blobs/`.
pub fn docker25_archive() -> Vec<u8> {
    docker25(true)
}

/// [`docker25_archive`], with or without names in `index.json`.
pub fn docker25(annotated: bool) -> Vec<u8> {
    let d = docker_parts();
    let manifest = oci_manifest(&d.config, &d.layers);
    let index = to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": MEDIA_TYPE_OCI_INDEX,
        "manifests": [{
            "mediaType": MEDIA_TYPE_OCI_MANIFEST,
            "digest": sha(&manifest).to_string(),
            "size": manifest.len(),
            "annotations": if annotated {
                json!({
                    "io.containerd.image.name": "docker.io/library/busybox:latest",
                    "org.opencontainers.image.ref.name": "latest",
                })
            } else {
                json!({})
            },
        }],
    }));
    let legacy = json!([{
        "Config": format!("blobs/sha256/{}", sha(&d.config).hex()),
        "RepoTags": ["busybox:latest"],
        "Layers": [
            format!("{}/layer.tar", d.ids[0]),
            format!("blobs/sha256/{}", sha(&d.layers[1]).hex()),
        ],
    }]);
    vec![
        E::Dir("blobs/".into()),
        E::Dir("blobs/sha256/".into()),
        blob(&d.layers[0]),
        blob(&d.layers[1]),
        blob(&d.config),
        blob(&manifest),
        E::Dir(format!("{}/", d.ids[0])),
        E::Symlink(
            format!("{}/layer.tar", d.ids[0]),
            format!("../blobs/sha256/{}", sha(&d.layers[0]).hex()),
        ),
        file("index.json", index),
        file("manifest.json", to_vec(&legacy)),
        file(
            "oci-layout",
            to_vec(&json!({"imageLayoutVersion": "1.0.0"})),
        ),
        file(
            "repositories",
            to_vec(&json!({"busybox": {"latest": d.ids[0]}})),
        ),
    ]
    .pipe(|entries| build(&entries))
}

/// Pipes a value through a function (keeps fixture code in reading order).
pub trait Pipe: Sized {
    fn pipe<R>(self, f: impl FnOnce(Self) -> R) -> R {
        f(self)
    }
}
impl<T> Pipe for T {}

/// The parts of an OCI layout.
pub struct Oci {
    pub layers: Vec<Vec<u8>>,
    pub config: Vec<u8>,
    pub manifest: Vec<u8>,
    pub nested: Vec<u8>,
    pub index: serde_json::Value,
}

pub fn oci_parts() -> Oci {
    let layers = vec![layer("a", "first layer"), layer("b", "second layer")];
    let diff_ids: Vec<Digest> = layers.iter().map(|l| sha(l)).collect();
    let config = config(&diff_ids, false);
    let manifest = oci_manifest(&config, &layers);
    let nested = to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": MEDIA_TYPE_OCI_INDEX,
        "manifests": [descriptor(MEDIA_TYPE_OCI_MANIFEST, &manifest)],
    }));
    let mut with_ref = descriptor(MEDIA_TYPE_OCI_MANIFEST, &manifest);
    with_ref["annotations"] = json!({"org.opencontainers.image.ref.name": "example.com/app:v1"});
    let mut bare_tag = descriptor(MEDIA_TYPE_OCI_INDEX, &nested);
    bare_tag["annotations"] = json!({"org.opencontainers.image.ref.name": "latest"});
    let index = json!({"schemaVersion": 2, "manifests": [with_ref, bare_tag]});
    Oci {
        layers,
        config,
        manifest,
        nested,
        index,
    }
}

pub fn oci_entries(o: &Oci) -> Vec<E> {
    vec![
        file(
            "oci-layout",
            to_vec(&json!({"imageLayoutVersion": "1.0.0"})),
        ),
        E::Dir("blobs/sha256".into()),
        blob(&o.layers[0]),
        blob(&o.layers[1]),
        blob(&o.config),
        blob(&o.manifest),
        blob(&o.nested),
        file("index.json", to_vec(&o.index)),
    ]
}

pub fn oci_archive() -> Vec<u8> {
    build(&oci_entries(&oci_parts()))
}
