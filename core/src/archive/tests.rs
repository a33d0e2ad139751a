//! Tests of the archive validator: real archives built with the `tar`
//! crate, fed in chunks of many sizes; hostile archives, each rejected
//! with its own error; proptests over chunkings and mutations.

use std::collections::BTreeMap;

use bytes::Bytes;
use proptest::prelude::*;
use serde_json::json;

use super::*;

// ---------------------------------------------------------------------------
// Building archives.

/// One member of a test archive.
#[derive(Clone, Debug)]
enum E {
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

fn file(path: &str, data: impl Into<Vec<u8>>) -> E {
    E::File(path.to_owned(), data.into())
}

fn header(kind: ::tar::EntryType, size: u64) -> ::tar::Header {
    let mut h = ::tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_size(size);
    h.set_mode(0o644);
    h.set_mtime(1_700_000_000);
    h
}

fn raw_header(kind: ::tar::EntryType, path: &[u8], link: &[u8], size: u64) -> ::tar::Header {
    let mut h = header(kind, size);
    let old = h.as_old_mut();
    old.name[..path.len()].copy_from_slice(path);
    old.linkname[..link.len()].copy_from_slice(link);
    h.set_cksum();
    h
}

/// A complete archive (with the end marker).
fn build(entries: &[E]) -> Vec<u8> {
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
fn layer(name: &str, content: &str) -> Vec<u8> {
    build(&[file(name, content.as_bytes().to_vec())])
}

fn sha(data: &[u8]) -> Digest {
    Digest::of(data)
}

fn to_vec(v: &serde_json::Value) -> Vec<u8> {
    serde_json::to_vec(v).expect("serialise test JSON")
}

fn config(diff_ids: &[Digest], healthcheck: bool) -> Vec<u8> {
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
struct Docker {
    layers: Vec<Vec<u8>>,
    config: Vec<u8>,
    manifest: serde_json::Value,
    ids: Vec<String>,
}

fn docker_parts() -> Docker {
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
fn docker_entries(d: &Docker) -> Vec<E> {
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

fn docker_archive() -> Vec<u8> {
    build(&docker_entries(&docker_parts()))
}

fn blob(data: &[u8]) -> E {
    file(&format!("blobs/sha256/{}", sha(data).hex()), data.to_vec())
}

fn descriptor(media_type: &str, data: &[u8]) -> serde_json::Value {
    json!({"mediaType": media_type, "digest": sha(data).to_string(), "size": data.len()})
}

fn oci_manifest(config: &[u8], layers: &[Vec<u8>]) -> Vec<u8> {
    to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": MEDIA_TYPE_OCI_MANIFEST,
        "config": descriptor(MEDIA_TYPE_OCI_CONFIG, config),
        "layers": layers.iter().map(|l| descriptor(MEDIA_TYPE_OCI_LAYER, l)).collect::<Vec<_>>(),
    }))
}

/// A Docker 25+ `docker save` archive: an OCI layout, plus `manifest.json`
/// whose layers are found through legacy-path symlinks into `blobs/`.
fn docker25_archive() -> Vec<u8> {
    docker25(true)
}

/// [`docker25_archive`], with or without names in `index.json`.
fn docker25(annotated: bool) -> Vec<u8> {
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
trait Pipe: Sized {
    fn pipe<R>(self, f: impl FnOnce(Self) -> R) -> R {
        f(self)
    }
}
impl<T> Pipe for T {}

/// The parts of an OCI layout.
struct Oci {
    layers: Vec<Vec<u8>>,
    config: Vec<u8>,
    manifest: Vec<u8>,
    nested: Vec<u8>,
    index: serde_json::Value,
}

fn oci_parts() -> Oci {
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

fn oci_entries(o: &Oci) -> Vec<E> {
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

fn oci_archive() -> Vec<u8> {
    build(&oci_entries(&oci_parts()))
}

// ---------------------------------------------------------------------------
// Running the validator.

/// Feeds `archive` in chunks of `chunk` bytes (the sizes cycle), draining
/// outputs after each chunk. Returns the outputs and the result.
fn run_chunks(
    archive: &[u8],
    chunks: &[usize],
    limits: ArchiveLimits,
) -> (Vec<Output>, Result<ImportPlan, ArchiveError>) {
    let input = Bytes::copy_from_slice(archive);
    let mut v = ArchiveValidator::new(limits);
    let mut outputs = Vec::new();
    let mut at = 0;
    let mut i = 0;
    while at < input.len() {
        let n = chunks[i % chunks.len()].max(1).min(input.len() - at);
        i += 1;
        let result = v.handle_data(input.slice(at..at + n));
        at += n;
        while let Some(o) = v.poll_output() {
            outputs.push(o);
        }
        if let Err(e) = result {
            // Sticky: the same error again, and no outputs.
            assert_eq!(v.handle_data(Bytes::from_static(b"x")), Err(e.clone()));
            assert_eq!(v.poll_output(), None);
            assert_eq!(v.handle_eof(), Err(e.clone()));
            return (outputs, Err(e));
        }
    }
    (outputs, v.handle_eof())
}

fn run(archive: &[u8]) -> Result<ImportPlan, ArchiveError> {
    run_chunks(archive, &[4096], ArchiveLimits::default()).1
}

fn run_with(archive: &[u8], limits: ArchiveLimits) -> Result<ImportPlan, ArchiveError> {
    run_chunks(archive, &[4096], limits).1
}

/// A regular member as the outputs describe it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Streamed {
    index: usize,
    path: String,
    data: Vec<u8>,
    sha256: [u8; 32],
    size: u64,
}

/// Joins the outputs into members, checking their order and hashes.
fn members(outputs: &[Output]) -> Vec<Streamed> {
    let mut done = Vec::new();
    let mut open: Option<Streamed> = None;
    for o in outputs {
        match o {
            Output::MemberStart { index, path } => {
                assert!(open.is_none(), "MemberStart inside a member");
                open = Some(Streamed {
                    index: *index,
                    path: path.clone(),
                    data: Vec::new(),
                    sha256: [0; 32],
                    size: 0,
                });
            }
            Output::MemberData { index, data } => {
                let m = open.as_mut().expect("MemberData outside a member");
                assert_eq!(m.index, *index);
                assert!(!data.is_empty(), "empty MemberData");
                m.data.extend_from_slice(data);
            }
            Output::MemberEnd {
                index,
                sha256,
                size,
            } => {
                let mut m = open.take().expect("MemberEnd outside a member");
                assert_eq!(m.index, *index);
                assert_eq!(*size, m.data.len() as u64);
                assert_eq!(sha(&m.data).sha256(), sha256);
                m.sha256 = *sha256;
                m.size = *size;
                done.push(m);
            }
        }
    }
    done
}

/// Checks that a plan is consistent with the streamed members: every blob
/// is a member with its digest and size, synthesized blobs hash to their
/// digests, every image's manifest is in the plan with its size, and the
/// synthesized manifests reference blobs of the plan.
fn check_plan(plan: &ImportPlan, outputs: &[Output]) {
    let streamed = members(outputs);
    let by_index: BTreeMap<usize, &Streamed> = streamed.iter().map(|m| (m.index, m)).collect();
    for b in &plan.blobs {
        let m = by_index
            .get(&b.member)
            .unwrap_or_else(|| panic!("blob {} from unknown member {}", b.digest, b.member));
        assert_eq!(&m.sha256, b.digest.sha256(), "blob {} content", b.digest);
        assert_eq!(m.size, b.size, "blob {} size", b.digest);
    }
    for s in &plan.synthesized {
        assert_eq!(sha(&s.data), s.digest);
        let m: serde_json::Value = serde_json::from_slice(&s.data).expect("synthesized JSON");
        let config = &m["config"];
        let refs = std::iter::once(config).chain(m["layers"].as_array().expect("layers").iter());
        for d in refs {
            let digest = Digest::parse(d["digest"].as_str().expect("digest")).expect("digest");
            let b = plan
                .blob(&digest)
                .expect("synthesized manifest references a blob");
            assert_eq!(Some(b.size), d["size"].as_u64());
        }
    }
    assert!(!plan.images.is_empty());
    for image in &plan.images {
        let d = &image.manifest;
        let size = match (plan.blob(&d.digest), plan.synthesized_blob(&d.digest)) {
            (Some(b), _) => b.size,
            (None, Some(s)) => s.data.len() as u64,
            (None, None) => panic!("image manifest {} not in the plan", d.digest),
        };
        assert_eq!(size, d.size);
    }
    check_children(plan);
}

/// The plan's reference graph is what its JSON says and covers it: every
/// manifest and index lists exactly the descriptors its own bytes hold,
/// and every blob is an image's root or some blob's child.
fn check_children(plan: &ImportPlan) {
    let in_plan = |d: &Digest| plan.blob(d).is_some() || plan.synthesized_blob(d).is_some();
    let mut reached: std::collections::BTreeSet<Digest> =
        plan.images.iter().map(|i| i.manifest.digest).collect();
    for (parent, children) in &plan.children {
        assert!(in_plan(parent), "children of {parent}, not in the plan");
        for c in children {
            assert!(
                in_plan(&c.digest),
                "{parent} references {}, not in the plan",
                c.digest
            );
            reached.insert(c.digest);
        }
    }
    let all: std::collections::BTreeSet<Digest> = plan
        .blobs
        .iter()
        .map(|b| b.digest)
        .chain(plan.synthesized.iter().map(|s| s.digest))
        .collect();
    assert_eq!(reached, all, "blobs reached through images and children");
    for s in &plan.synthesized {
        let m: serde_json::Value = serde_json::from_slice(&s.data).expect("synthesized JSON");
        let listed: Vec<(String, String)> = std::iter::once(&m["config"])
            .chain(m["layers"].as_array().expect("layers").iter())
            .map(|d| {
                (
                    d["mediaType"].as_str().expect("mediaType").to_owned(),
                    d["digest"].as_str().expect("digest").to_owned(),
                )
            })
            .collect();
        let recorded: Vec<(String, String)> = plan.children[&s.digest]
            .iter()
            .map(|c| (c.media_type.clone(), c.digest.to_string()))
            .collect();
        assert_eq!(recorded, listed, "children of synthesized {}", s.digest);
    }
}

const CHUNKS: [usize; 5] = [1, 7, 512, 4096, usize::MAX];

/// Runs an archive at every chunk size of the brief, checks the results
/// agree, and returns the plan.
fn accept_everywhere(archive: &[u8]) -> ImportPlan {
    let (outputs, plan) = run_chunks(archive, &[usize::MAX], ArchiveLimits::default());
    let plan = plan.unwrap_or_else(|e| panic!("rejected: {e}"));
    check_plan(&plan, &outputs);
    let whole = members(&outputs);
    for chunk in CHUNKS {
        let (o, p) = run_chunks(archive, &[chunk], ArchiveLimits::default());
        assert_eq!(p.as_ref(), Ok(&plan), "chunk size {chunk}");
        assert_eq!(members(&o), whole, "chunk size {chunk}");
    }
    plan
}

fn reject(archive: &[u8]) -> ArchiveError {
    let e = run(archive).expect_err("archive accepted");
    // Every chunking gives the same error.
    for chunk in [1, 511, usize::MAX] {
        assert_eq!(
            run_chunks(archive, &[chunk], ArchiveLimits::default())
                .1
                .as_ref(),
            Err(&e),
            "chunk size {chunk}"
        );
    }
    e
}

// ---------------------------------------------------------------------------
// Valid archives.

#[test]
fn docker_v1_2_archive() {
    let d = docker_parts();
    let archive = build(&docker_entries(&d));
    let plan = accept_everywhere(&archive);
    assert_eq!(plan.format, Format::DockerV1_2);
    // Config, then the two layers.
    let digests: Vec<Digest> = plan.blobs.iter().map(|b| b.digest).collect();
    assert_eq!(
        digests,
        vec![sha(&d.config), sha(&d.layers[0]), sha(&d.layers[1])]
    );
    assert_eq!(
        plan.blobs[0].media_type.as_deref(),
        Some(MEDIA_TYPE_OCI_CONFIG)
    );
    assert_eq!(
        plan.blobs[1].media_type.as_deref(),
        Some(MEDIA_TYPE_OCI_LAYER)
    );
    assert_eq!(plan.blobs[1].compression, Some(Compression::None));
    assert_eq!(plan.blobs[1].unverified_diff_id, None);
    // Members: dir 0, VERSION 1, json 2, layer.tar 3, dir 4, ... config 8.
    assert_eq!(plan.blobs[0].member, 8);
    assert_eq!(plan.blobs[1].member, 3);
    assert_eq!(plan.blobs[2].member, 7);

    assert_eq!(plan.synthesized.len(), 1);
    let m: serde_json::Value = serde_json::from_slice(&plan.synthesized[0].data).expect("json");
    assert_eq!(m["mediaType"], MEDIA_TYPE_OCI_MANIFEST);
    assert_eq!(m["config"]["digest"], sha(&d.config).to_string());
    assert_eq!(m["layers"][1]["digest"], sha(&d.layers[1]).to_string());
    assert_eq!(m["layers"][1]["mediaType"], MEDIA_TYPE_OCI_LAYER);

    let names: Vec<Option<&str>> = plan.images.iter().map(|i| i.name.as_deref()).collect();
    assert_eq!(
        names,
        vec![
            Some("docker.io/library/busybox:latest"),
            Some("registry.example.com/tools/busybox:1.36"),
        ]
    );
    for image in &plan.images {
        assert_eq!(image.manifest.digest, plan.synthesized[0].digest);
        assert_eq!(image.manifest.media_type, MEDIA_TYPE_OCI_MANIFEST);
    }
}

#[test]
fn docker_v1_1_without_healthcheck_and_untagged() {
    let mut d = docker_parts();
    let diff_ids: Vec<Digest> = d.layers.iter().map(|l| sha(l)).collect();
    d.config = config(&diff_ids, false);
    d.manifest[0]["Config"] = json!(format!("./{}.json", sha(&d.config).hex()));
    d.manifest[0]["RepoTags"] = serde_json::Value::Null;
    let plan = accept_everywhere(&build(&docker_entries(&d)));
    assert_eq!(plan.format, Format::DockerV1_1);
    assert_eq!(plan.images.len(), 1);
    assert_eq!(plan.images[0].name, None);
}

#[test]
fn docker25_archive_with_symlinks_into_blobs() {
    let d = docker_parts();
    let plan = accept_everywhere(&docker25_archive());
    assert_eq!(plan.format, Format::Oci);
    assert!(plan.synthesized.is_empty());
    assert_eq!(plan.images.len(), 1);
    assert_eq!(
        plan.images[0].name.as_deref(),
        Some("docker.io/library/busybox:latest")
    );
    let manifest = oci_manifest(&d.config, &d.layers);
    assert_eq!(plan.images[0].manifest.digest, sha(&manifest));
    // Manifest, config, layers: all from blobs/ members.
    assert_eq!(plan.blobs.len(), 4);
    assert!(plan.blob(&sha(&d.layers[0])).is_some());
}

#[test]
fn docker25_names_from_repo_tags_when_the_index_has_none() {
    let plan = accept_everywhere(&docker25(false));
    let names: Vec<Option<&str>> = plan.images.iter().map(|i| i.name.as_deref()).collect();
    assert_eq!(names, vec![Some("docker.io/library/busybox:latest")]);
}

#[test]
fn docker_archive_with_legacy_symlinked_layers() {
    // Older `docker save` links a layer shared by two directories.
    let d = docker_parts();
    let mut entries = docker_entries(&d);
    // Replace the second layer.tar with a link to a third directory's.
    let moved = format!("{}/layer.tar", d.ids[1]);
    let pos = entries
        .iter()
        .position(|e| matches!(e, E::File(p, _) if *p == moved))
        .expect("layer member");
    entries[pos] = E::Symlink(moved, "../shared/layer.tar".into());
    entries.insert(0, file("shared/layer.tar", d.layers[1].clone()));
    // And the config through a hard link.
    entries.push(E::Hardlink(
        "config-link.json".into(),
        format!("{}.json", sha(&d.config).hex()),
    ));
    let mut d2 = d;
    d2.manifest[0]["Config"] = json!("config-link.json");
    let last = entries.len() - 3;
    entries[last] = file("manifest.json", to_vec(&d2.manifest));
    let plan = accept_everywhere(&build(&entries));
    assert_eq!(plan.format, Format::DockerV1_2);
    // The second layer's bytes are member 0 (shared/layer.tar).
    assert_eq!(plan.blob(&sha(&d2.layers[1])).map(|b| b.member), Some(0));
}

#[test]
fn oci_layout() {
    let o = oci_parts();
    let plan = accept_everywhere(&oci_archive());
    assert_eq!(plan.format, Format::Oci);
    assert!(plan.synthesized.is_empty());
    let names: Vec<Option<&str>> = plan.images.iter().map(|i| i.name.as_deref()).collect();
    assert_eq!(names, vec![Some("example.com/app:v1"), None]);
    assert_eq!(plan.images[1].manifest.media_type, MEDIA_TYPE_OCI_INDEX);
    assert_eq!(plan.images[1].manifest.digest, sha(&o.nested));
    let digests: Vec<Digest> = plan.blobs.iter().map(|b| b.digest).collect();
    assert_eq!(
        digests,
        vec![
            sha(&o.manifest),
            sha(&o.config),
            sha(&o.layers[0]),
            sha(&o.layers[1]),
            sha(&o.nested),
        ]
    );
    let children = |parent: &[u8]| -> Vec<Digest> {
        plan.children[&sha(parent)]
            .iter()
            .map(|c| c.digest)
            .collect()
    };
    assert_eq!(
        children(&o.manifest),
        [sha(&o.config), sha(&o.layers[0]), sha(&o.layers[1])]
    );
    assert_eq!(children(&o.nested), [sha(&o.manifest)]);
    assert_eq!(
        plan.children.len(),
        2,
        "layers and configs reference nothing"
    );
}

#[test]
fn long_and_pax_names_are_read() {
    let long = format!("{}/file", "d".repeat(150));
    let mut entries = oci_entries(&oci_parts());
    entries.push(file(&long, "x"));
    entries.push(E::PaxFile("pax/named/file".into(), b"y".to_vec()));
    let archive = build(&entries);
    let (outputs, plan) = run_chunks(&archive, &[3], ArchiveLimits::default());
    plan.expect("accepted");
    let paths: Vec<String> = members(&outputs).into_iter().map(|m| m.path).collect();
    assert!(paths.contains(&long), "{paths:?}");
    assert!(paths.contains(&"pax/named/file".to_owned()), "{paths:?}");
}

#[test]
fn member_data_is_zero_copy() {
    let archive = Bytes::from(docker_archive());
    let mut v = ArchiveValidator::new(ArchiveLimits::default());
    v.handle_data(archive.clone()).expect("accepted");
    let range = archive.as_ptr() as usize..archive.as_ptr() as usize + archive.len();
    let mut pieces = 0;
    while let Some(o) = v.poll_output() {
        if let Output::MemberData { data, .. } = o {
            assert!(
                range.contains(&(data.as_ptr() as usize)),
                "member data was copied"
            );
            pieces += 1;
        }
    }
    assert!(pieces > 0);
    v.handle_eof().expect("plan");
}

#[test]
fn compressed_docker_layer_is_recorded_unverified() {
    let mut d = docker_parts();
    // A "gzip" layer: the magic is all the validator looks at.
    d.layers[1] = [&[0x1f, 0x8b, 8, 0][..], b"not really deflate"].concat();
    let diff_ids = [sha(&d.layers[0]), sha(b"the uncompressed tar")];
    d.config = config(&diff_ids, true);
    d.manifest[0]["Config"] = json!(format!("{}.json", sha(&d.config).hex()));
    let plan = accept_everywhere(&build(&docker_entries(&d)));
    let b = plan.blob(&sha(&d.layers[1])).expect("layer blob");
    assert_eq!(b.compression, Some(Compression::Gzip));
    assert_eq!(b.media_type.as_deref(), Some(MEDIA_TYPE_OCI_LAYER_GZIP));
    assert_eq!(b.unverified_diff_id, Some(diff_ids[1]));
}

#[test]
fn zero_padding_after_the_end_marker_is_accepted() {
    let mut archive = oci_archive();
    archive.resize(archive.len().next_multiple_of(10240) + 10240, 0);
    run(&archive).expect("accepted");
}

#[test]
fn errors_map_to_grpc_codes() {
    let e = ArchiveError::ArchiveTooLarge { limit: 1 };
    assert_eq!(e.code(), tonic::Code::ResourceExhausted);
    assert_eq!(e.to_status().code(), tonic::Code::ResourceExhausted);
    let e = ArchiveError::DuplicateMember { path: "a".into() };
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert_eq!(e.to_string(), "member a appears twice");
}

// ---------------------------------------------------------------------------
// Hostile and broken archives: each with its own error.

#[test]
fn rejects_parent_components() {
    let mut entries = docker_entries(&docker_parts());
    entries.insert(0, E::RawFile(b"../evil".to_vec(), b"x".to_vec()));
    assert_eq!(
        reject(&build(&entries)),
        ArchiveError::ParentComponent {
            path: "../evil".into()
        }
    );
    let entries = vec![E::RawFile(b"a/../../b".to_vec(), b"x".to_vec())];
    assert!(matches!(
        reject(&build(&entries)),
        ArchiveError::ParentComponent { .. }
    ));
}

#[test]
fn rejects_absolute_paths() {
    let entries = vec![E::RawFile(b"/abs".to_vec(), b"x".to_vec())];
    assert_eq!(
        reject(&build(&entries)),
        ArchiveError::AbsolutePath {
            path: "/abs".into()
        }
    );
}

#[test]
fn rejects_symlinks_out_of_the_archive() {
    for target in ["../../etc/passwd", "/etc/passwd", "a/../../../x"] {
        let entries = vec![E::RawSymlink("dir/link".into(), target.as_bytes().to_vec())];
        assert_eq!(
            reject(&build(&entries)),
            ArchiveError::SymlinkEscapes {
                member: "dir/link".into(),
                target: target.into()
            }
        );
    }
    // `..` that stays inside is fine (until the layout check).
    for target in ["../x", "a/../../x"] {
        let entries = vec![E::RawSymlink("dir/link".into(), target.as_bytes().to_vec())];
        assert!(matches!(
            reject(&build(&entries)),
            ArchiveError::UnknownLayout { .. }
        ));
    }
}

#[test]
fn rejects_hardlinks_out_of_the_archive() {
    for target in ["../outside", "/etc/shadow"] {
        let entries = vec![E::RawHardlink("link".into(), target.as_bytes().to_vec())];
        assert_eq!(
            reject(&build(&entries)),
            ArchiveError::HardlinkEscapes {
                member: "link".into(),
                target: target.into()
            }
        );
    }
}

#[test]
fn rejects_blob_not_matching_its_name() {
    let o = oci_parts();
    let mut entries = oci_entries(&o);
    let name = format!("blobs/sha256/{}", sha(&o.layers[0]).hex());
    entries[2] = file(&name, b"tampered".to_vec());
    assert_eq!(
        reject(&build(&entries)),
        ArchiveError::BlobDigestMismatch {
            member: name,
            expected: sha(&o.layers[0]),
            actual: sha(b"tampered"),
        }
    );
}

#[test]
fn rejects_descriptor_size_mismatch() {
    let mut o = oci_parts();
    o.index["manifests"][0]["size"] = json!(o.manifest.len() + 1);
    assert_eq!(
        reject(&build(&oci_entries(&o))),
        ArchiveError::SizeMismatch {
            field: "index.json.manifests[0].size".into(),
            member: format!("blobs/sha256/{}", sha(&o.manifest).hex()),
            declared: o.manifest.len() as u64 + 1,
            actual: o.manifest.len() as u64,
        }
    );
}

#[test]
fn rejects_diff_id_mismatch() {
    let mut d = docker_parts();
    let diff_ids = [sha(&d.layers[0]), sha(b"something else")];
    d.config = config(&diff_ids, true);
    d.manifest[0]["Config"] = json!(format!("{}.json", sha(&d.config).hex()));
    let e = reject(&build(&docker_entries(&d)));
    assert_eq!(
        e,
        ArchiveError::DiffIdMismatch {
            field: format!("{}.json.rootfs.diff_ids[1]", sha(&d.config).hex()),
            member: format!("{}/layer.tar", d.ids[1]),
            expected: diff_ids[1],
            actual: sha(&d.layers[1]),
        }
    );
    // The same check in an OCI layout.
    let mut o = oci_parts();
    o.config = config(&[sha(&o.layers[0]), sha(b"x")], false);
    o.manifest = oci_manifest(&o.config, &o.layers);
    o.index = json!({"manifests": [descriptor(MEDIA_TYPE_OCI_MANIFEST, &o.manifest)]});
    assert!(matches!(
        reject(&build(&oci_entries(&o))),
        ArchiveError::DiffIdMismatch { .. }
    ));
}

#[test]
fn rejects_config_not_matching_its_name() {
    let d = docker_parts();
    let mut entries = docker_entries(&d);
    let name = format!("{}.json", sha(&d.config).hex());
    let pos = entries
        .iter()
        .position(|e| matches!(e, E::File(p, _) if *p == name))
        .expect("config");
    let mut altered = d.config.clone();
    altered.push(b' ');
    entries[pos] = file(&name, altered.clone());
    assert_eq!(
        reject(&build(&entries)),
        ArchiveError::ConfigDigestMismatch {
            member: name,
            expected: sha(&d.config),
            actual: sha(&altered),
        }
    );
}

#[test]
fn rejects_layer_count_mismatch() {
    let mut d = docker_parts();
    d.config = config(&[sha(&d.layers[0])], true);
    d.manifest[0]["Config"] = json!(format!("{}.json", sha(&d.config).hex()));
    assert_eq!(
        reject(&build(&docker_entries(&d))),
        ArchiveError::LayerCountMismatch {
            field: "manifest.json[0].Layers".into(),
            layers: 2,
            diff_ids: 1,
        }
    );
}

#[test]
fn rejects_truncation_mid_member() {
    let archive = docker_archive();
    // Cut inside the first layer.tar's data (member 3: after dir, VERSION, json).
    let cut = 512 * 6 + 100;
    assert_eq!(
        reject(&archive[..cut]),
        ArchiveError::Truncated {
            offset: cut as u64,
            at: TruncatedAt::Member {
                path: format!("{}/layer.tar", docker_parts().ids[0])
            },
        }
    );
}

#[test]
fn rejects_truncation_mid_header() {
    let archive = docker_archive();
    assert_eq!(
        reject(&archive[..512 + 200]),
        ArchiveError::Truncated {
            offset: 712,
            at: TruncatedAt::Header
        }
    );
}

#[test]
fn rejects_missing_end_marker() {
    let archive = docker_archive();
    // tar::Builder writes exactly two zero blocks.
    for cut in [1024, 512] {
        let short = &archive[..archive.len() - cut];
        assert_eq!(
            reject(short),
            ArchiveError::Truncated {
                offset: short.len() as u64,
                at: TruncatedAt::EndMarker
            }
        );
    }
}

#[test]
fn rejects_duplicate_members() {
    let mut entries = docker_entries(&docker_parts());
    entries.push(file("./manifest.json", "[]"));
    assert_eq!(
        reject(&build(&entries)),
        ArchiveError::DuplicateMember {
            path: "manifest.json".into()
        }
    );
}

#[test]
fn rejects_json_over_the_cap() {
    let limits = ArchiveLimits {
        max_json_size: 64,
        ..ArchiveLimits::default()
    };
    let d = docker_parts();
    let archive = build(&docker_entries(&d));
    let manifest = to_vec(&d.manifest);
    // manifest.json is rejected at its header.
    assert_eq!(
        run_with(&archive, limits.clone()),
        Err(ArchiveError::JsonTooLarge {
            member: "manifest.json".into(),
            size: manifest.len() as u64,
            limit: 64,
        })
    );
    // A config over the cap is rejected once it is known to be one.
    let mut d = docker_parts();
    let mut padded: serde_json::Value = serde_json::from_slice(&d.config).expect("config");
    padded["comment"] = json!("x".repeat(1000));
    d.config = to_vec(&padded);
    d.manifest[0]["Config"] = json!(format!("{}.json", sha(&d.config).hex()));
    let limit = to_vec(&d.manifest).len();
    let limits = ArchiveLimits {
        max_json_size: limit,
        ..ArchiveLimits::default()
    };
    assert_eq!(
        run_with(&build(&docker_entries(&d)), limits),
        Err(ArchiveError::JsonTooLarge {
            member: format!("{}.json", sha(&d.config).hex()),
            size: d.config.len() as u64,
            limit,
        })
    );
}

#[test]
fn rejects_json_over_the_total_budget() {
    let limits = ArchiveLimits {
        max_json_total: 400,
        ..ArchiveLimits::default()
    };
    let o = oci_parts();
    let e = run_with(&oci_archive(), limits).expect_err("accepted");
    assert!(matches!(e, ArchiveError::MetadataTooLarge { .. }), "{e}");
    assert_eq!(e.code(), tonic::Code::ResourceExhausted);
    let _ = o;
}

#[test]
fn rejects_archives_over_the_limit_before_eof() {
    let archive = docker_archive();
    let limit = 8 * 512;
    let limits = ArchiveLimits {
        max_total_size: limit,
        ..ArchiveLimits::default()
    };
    let mut v = ArchiveValidator::new(limits);
    let mut fed = 0;
    let mut failed = None;
    for chunk in archive.chunks(100) {
        fed += chunk.len();
        if let Err(e) = v.handle_data(Bytes::copy_from_slice(chunk)) {
            failed = Some(e);
            break;
        }
    }
    assert_eq!(failed, Some(ArchiveError::ArchiveTooLarge { limit }));
    assert!(fed as u64 <= limit, "detected only after {fed} bytes");
    assert_eq!(
        ArchiveError::ArchiveTooLarge { limit }.code(),
        tonic::Code::ResourceExhausted
    );
    // Bytes alone also count: a stream of zeros.
    let mut v = ArchiveValidator::new(ArchiveLimits {
        max_total_size: 4096,
        ..ArchiveLimits::default()
    });
    v.handle_data(Bytes::from(vec![0u8; 4096]))
        .expect("at the limit");
    assert_eq!(
        v.handle_data(Bytes::from_static(&[0])),
        Err(ArchiveError::ArchiveTooLarge { limit: 4096 })
    );
}

#[test]
fn rejects_huge_declared_sizes_at_the_header() {
    // Base-256 size field.
    let mut h = header(::tar::EntryType::Regular, u64::MAX);
    h.set_path("huge").expect("path");
    h.set_cksum();
    let e = run(h.as_bytes()).expect_err("accepted");
    assert_eq!(e, ArchiveError::ArchiveTooLarge { limit: 8 << 30 });
    // PAX size record.
    let mut b = ::tar::Builder::new(Vec::new());
    b.append_pax_extensions([("size", &b"18446744073709551615"[..])])
        .expect("pax");
    let mut archive = b.into_inner().expect("archive");
    archive.truncate(archive.len() - 1024);
    let h = raw_header(::tar::EntryType::Regular, b"huge", b"", 0);
    archive.extend_from_slice(h.as_bytes());
    assert_eq!(
        run(&archive),
        Err(ArchiveError::ArchiveTooLarge { limit: 8 << 30 })
    );
}

#[test]
fn rejects_wrong_oci_layout_version() {
    let mut entries = oci_entries(&oci_parts());
    entries[0] = file(
        "oci-layout",
        to_vec(&json!({"imageLayoutVersion": "2.0.0"})),
    );
    assert_eq!(
        reject(&build(&entries)),
        ArchiveError::OciLayoutVersion {
            found: "2.0.0".into()
        }
    );
}

#[test]
fn rejects_missing_referenced_blob() {
    let o = oci_parts();
    let mut entries = oci_entries(&o);
    entries.remove(3); // the second layer
    assert_eq!(
        reject(&build(&entries)),
        ArchiveError::MissingMember {
            path: format!("blobs/sha256/{}", sha(&o.layers[1]).hex()),
            field: format!("blobs/sha256/{}.layers[1]", sha(&o.manifest).hex()),
        }
    );
    // And a Docker layer.
    let d = docker_parts();
    let mut entries = docker_entries(&d);
    let gone = format!("{}/layer.tar", d.ids[0]);
    entries.retain(|e| !matches!(e, E::File(p, _) if *p == gone));
    assert_eq!(
        reject(&build(&entries)),
        ArchiveError::MissingMember {
            path: gone,
            field: "manifest.json[0].Layers[0]".into(),
        }
    );
}

#[test]
fn rejects_bad_header_checksum() {
    let mut archive = docker_archive();
    archive[512 + 10] ^= 0x01; // a name byte of the second header
    assert!(matches!(
        reject(&archive),
        ArchiveError::BadChecksum { offset: 512, .. }
    ));
}

#[test]
fn rejects_device_and_fifo_members() {
    for (flag, kind) in [
        (b'3', "character device"),
        (b'4', "block device"),
        (b'6', "FIFO"),
    ] {
        let entries = vec![E::Special("dev/x".into(), flag)];
        assert_eq!(
            reject(&build(&entries)),
            ArchiveError::UnsupportedMember {
                path: "dev/x".into(),
                kind
            }
        );
    }
}

#[test]
fn rejects_too_many_members() {
    let limits = ArchiveLimits {
        max_members: 5,
        ..ArchiveLimits::default()
    };
    assert_eq!(
        run_with(&docker_archive(), limits),
        Err(ArchiveError::TooManyMembers { limit: 5 })
    );
}

#[test]
fn rejects_unknown_layouts() {
    let plain = build(&[file("hello.txt", "hi")]);
    assert!(matches!(reject(&plain), ArchiveError::UnknownLayout { .. }));
    let legacy = build(&[file("repositories", "{}")]);
    assert!(matches!(
        reject(&legacy),
        ArchiveError::UnknownLayout { .. }
    ));
    let mut entries = oci_entries(&oci_parts());
    entries.remove(0);
    assert!(matches!(
        reject(&build(&entries)),
        ArchiveError::UnknownLayout { .. }
    ));
}

#[test]
fn rejects_trailing_garbage() {
    let mut archive = oci_archive();
    let at = archive.len() + 3;
    archive.extend_from_slice(&[0, 0, 0, 7]);
    assert_eq!(
        reject(&archive),
        ArchiveError::TrailingData { offset: at as u64 }
    );
}

#[test]
fn rejects_invalid_image_names() {
    let mut d = docker_parts();
    d.manifest[0]["RepoTags"] = json!(["BusyBox:latest"]);
    assert!(matches!(
        reject(&build(&docker_entries(&d))),
        ArchiveError::InvalidImageName { field, .. } if field == "manifest.json[0].RepoTags[0]"
    ));
}

#[test]
fn rejects_link_loops_and_links_to_directories() {
    let mut d = docker_parts();
    d.manifest[0]["Config"] = json!("loop/a");
    let mut entries = docker_entries(&d);
    entries.push(E::Symlink("loop/a".into(), "b".into()));
    entries.push(E::Symlink("loop/b".into(), "a".into()));
    assert_eq!(
        reject(&build(&entries)),
        ArchiveError::LinkLoop {
            path: "loop/a".into()
        }
    );
    d.manifest[0]["Config"] = json!("somedir");
    let mut entries = docker_entries(&d);
    entries.push(E::Dir("somedir".into()));
    assert!(matches!(
        reject(&build(&entries)),
        ArchiveError::NotAFile { .. }
    ));
}

#[test]
fn rejects_invalid_json_and_digests() {
    let mut entries = oci_entries(&oci_parts());
    entries[7] = file("index.json", "{not json");
    assert!(matches!(
        reject(&build(&entries)),
        ArchiveError::InvalidJson { member, .. } if member == "index.json"
    ));
    let mut o = oci_parts();
    o.index["manifests"][0]["digest"] = json!("sha512:abcd");
    assert!(matches!(
        reject(&build(&oci_entries(&o))),
        ArchiveError::UnsupportedDigestAlgorithm { .. }
    ));
    o.index["manifests"][0]["digest"] = json!("sha256:ABCD");
    assert!(matches!(
        reject(&build(&oci_entries(&o))),
        ArchiveError::InvalidDigest { field, .. } if field == "index.json.manifests[0].digest"
    ));
}

// ---------------------------------------------------------------------------
// Properties.

/// Members read as documents (not blobs): changing them may break the
/// archive.
const WELL_KNOWN: [&str; 4] = ["manifest.json", "index.json", "oci-layout", "repositories"];

fn archives() -> [Vec<u8>; 3] {
    [docker_archive(), docker25_archive(), oci_archive()]
}

/// Where each regular member's data lies in an archive, by path (read
/// with the `tar` crate's own reader).
fn data_spans(archive: &[u8]) -> BTreeMap<String, (usize, usize)> {
    let mut a = ::tar::Archive::new(archive);
    let mut spans = BTreeMap::new();
    for entry in a.entries().expect("entries") {
        let entry = entry.expect("entry");
        if entry.header().entry_type().is_file() {
            let path = entry.path().expect("path").to_string_lossy().into_owned();
            let start = entry.raw_file_position() as usize;
            spans.insert(path, (start, entry.size() as usize));
        }
    }
    spans
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Changing any byte of a member the plan uses as a blob is caught;
    /// changing any other member's bytes leaves a consistent plan.
    #[test]
    fn blob_mutations_are_caught(
        which in 0usize..3,
        member in any::<prop::sample::Index>(),
        at in any::<prop::sample::Index>(),
        flip in 1u8..=255,
    ) {
        let archive = archives()[which].clone();
        let (outputs, plan) = run_chunks(&archive, &[usize::MAX], ArchiveLimits::default());
        let plan = plan.expect("valid fixture");
        let streamed = members(&outputs);
        let spans = data_spans(&archive);
        let target = member.get(&streamed);
        prop_assume!(target.size > 0);
        let (start, size) = spans[&target.path];
        let mut mutated = archive.clone();
        mutated[start + at.index(size)] ^= flip;
        let is_blob = plan.blobs.iter().any(|b| b.member == target.index);
        let (outputs, result) = run_chunks(&mutated, &[1000], ArchiveLimits::default());
        match result {
            Ok(plan) => {
                prop_assert!(!is_blob, "mutated blob {} accepted", target.path);
                check_plan(&plan, &outputs);
            }
            Err(_) => prop_assert!(
                is_blob || WELL_KNOWN.contains(&target.path.as_str()),
                "mutating {} rejected", target.path
            ),
        }
    }

    /// Any chunking of a valid archive gives the same members and plan.
    #[test]
    fn chunkings_agree(which in 0usize..3, chunks in prop::collection::vec(1usize..3000, 1..40)) {
        let archive = &archives()[which];
        let (o1, p1) = run_chunks(archive, &[usize::MAX], ArchiveLimits::default());
        let (o2, p2) = run_chunks(archive, &chunks, ArchiveLimits::default());
        prop_assert!(p1.is_ok());
        prop_assert_eq!(p1, p2);
        prop_assert_eq!(members(&o1), members(&o2));
    }

    /// Mutated or truncated archives never panic, and are accepted only
    /// with a plan consistent with what was streamed.
    #[test]
    fn mutations_never_panic(
        which in 0usize..3,
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..8),
        cut in any::<prop::sample::Index>(),
        truncate in any::<bool>(),
        chunks in prop::collection::vec(1usize..2000, 1..8),
    ) {
        let mut archive = archives()[which].clone();
        for (at, byte) in edits {
            let i = at.index(archive.len());
            archive[i] = byte;
        }
        if truncate {
            archive.truncate(cut.index(archive.len()));
        }
        let (outputs, plan) = run_chunks(&archive, &chunks, ArchiveLimits::default());
        if let Ok(plan) = plan {
            check_plan(&plan, &outputs);
        }
    }

    /// Any declared size (octal or base-256) never panics.
    #[test]
    fn declared_sizes_never_panic(
        which in 0usize..3,
        block in 0usize..8,
        size in prop_oneof![any::<u64>(), (u64::MAX - 4096)..=u64::MAX, 0u64..100_000],
    ) {
        let mut archive = archives()[which].clone();
        let start = (block * 512).min(archive.len() - 512);
        let mut h = ::tar::Header::from_byte_slice(&archive[start..start + 512]).clone();
        h.set_size(size);
        h.set_cksum();
        archive[start..start + 512].copy_from_slice(h.as_bytes());
        let (outputs, plan) = run_chunks(&archive, &[900], ArchiveLimits::default());
        if let Ok(plan) = plan {
            check_plan(&plan, &outputs);
        }
    }

    /// Headers with fixed checksums but random fields never panic.
    #[test]
    fn header_fields_never_panic(
        which in 0usize..3,
        block in 0usize..8,
        // Anywhere, or in the size field, or the type flag.
        edits in prop::collection::vec(
            (prop_oneof![0usize..512, 124usize..136, Just(156usize)], any::<u8>()),
            1..6,
        ),
    ) {
        let mut archive = archives()[which].clone();
        let start = (block * 512).min(archive.len() - 512);
        for (at, byte) in edits {
            if !(148..156).contains(&at) {
                archive[start + at] = byte;
            }
        }
        let h = ::tar::Header::from_byte_slice(&archive[start..start + 512]).clone();
        let mut h = h;
        h.set_cksum();
        archive[start..start + 512].copy_from_slice(h.as_bytes());
        let (outputs, plan) = run_chunks(&archive, &[700], ArchiveLimits::default());
        if let Ok(plan) = plan {
            check_plan(&plan, &outputs);
        }
    }
}
