#![allow(clippy::unwrap_used)]

use super::*;
use metropolis_archive::ArchiveValidator;
use metropolis_testkit::archives::{E, build, docker_archive, oci_entries, oci_parts};

/// An OCI layout whose index.json names its manifests with `refs`
/// (bare tags, or none).
fn layout(refs: &[Option<&str>]) -> Vec<u8> {
    let parts = oci_parts("rename");
    let mut entries = oci_entries(&parts, None);
    let E::File(_, index) = entries.pop().unwrap() else {
        panic!("index.json last");
    };
    let mut index: Value = serde_json::from_slice(&index).unwrap();
    let entry = index["manifests"][0].clone();
    index["manifests"] = refs
        .iter()
        .map(|r| {
            let mut e = entry.clone();
            e["annotations"] = match r {
                Some(tag) => serde_json::json!({ REF_NAME: tag }),
                None => serde_json::json!({}),
            };
            e
        })
        .collect();
    entries.push(E::File(
        "index.json".into(),
        serde_json::to_vec(&index).unwrap(),
    ));
    build(&entries)
}

/// `archive` through a renamer in `chunk`-byte pieces: what comes out,
/// and how many images were named.
fn renamed(archive: &[u8], name: &str, chunk: usize) -> Result<(Vec<u8>, usize), CliError> {
    let mut r = Renamer::new(NameArg::parse(name)?);
    let mut out = Vec::new();
    for piece in archive.chunks(chunk) {
        out.extend(r.feed(piece)?);
    }
    out.extend(r.finish()?);
    Ok((out, r.named.unwrap_or(0)))
}

/// The image names the node's validator reads from `archive`.
fn names(archive: &[u8]) -> Vec<Option<String>> {
    let mut v = ArchiveValidator::new(Default::default());
    v.handle_data(bytes::Bytes::copy_from_slice(archive))
        .unwrap();
    while v.poll_output().is_some() {}
    v.handle_eof()
        .unwrap()
        .images
        .into_iter()
        .map(|i| i.name)
        .collect()
}

#[test]
fn a_bare_tag_is_named_after_the_repository() {
    let archive = layout(&[Some("v2")]);
    assert_eq!(names(&archive), [None], "unnamed before");
    for chunk in [1, 100, 511, 512, 513, 1 << 20] {
        let (out, named) = renamed(&archive, "registry.example/os/trial", chunk).unwrap();
        assert_eq!(named, 1);
        assert_eq!(
            names(&out),
            [Some("registry.example/os/trial:v2".to_string())],
            "chunks of {chunk}"
        );
    }
}

#[test]
fn a_whole_reference_names_the_one_unnamed_image() {
    let (out, _) = renamed(&layout(&[None]), "trial:v9", 700).unwrap();
    assert_eq!(
        names(&out),
        [Some("docker.io/library/trial:v9".to_string())]
    );
    let (out, _) = renamed(&layout(&[None]), "example.org/trial", 700).unwrap();
    assert_eq!(names(&out), [Some("example.org/trial:latest".to_string())]);
    let e = renamed(&layout(&[Some("v1"), Some("v2")]), "trial:v9", 700).unwrap_err();
    assert!(e.to_string().contains("2 unnamed images"), "{e}");
    let (out, named) = renamed(&layout(&[Some("v1"), Some("v2")]), "trial", 700).unwrap();
    assert_eq!(named, 2);
    let mut got = names(&out);
    got.sort();
    assert_eq!(
        got,
        [
            Some("docker.io/library/trial:v1".to_string()),
            Some("docker.io/library/trial:v2".to_string())
        ]
    );
}

#[test]
fn named_images_and_other_archives_are_left_alone() {
    let named = metropolis_testkit::archives::oci_archive(Some("keep/me:1"), "x").bytes;
    let (out, n) = renamed(&named, "other", 300).unwrap();
    assert_eq!(n, 0);
    assert_eq!(names(&out), [Some("docker.io/keep/me:1".to_string())]);
    // A Docker archive: refused, and what went out has no end marker,
    // so the node imports nothing.
    let docker = docker_archive("busybox:1", "d");
    let mut r = Renamer::new(NameArg::parse("other").unwrap());
    let sent = r.feed(&docker).unwrap();
    let e = r.finish().unwrap_err();
    assert!(e.to_string().contains("has no index.json"), "{e}");
    let mut v = ArchiveValidator::new(Default::default());
    v.handle_data(bytes::Bytes::from(sent)).unwrap();
    while v.poll_output().is_some() {}
    assert!(v.handle_eof().is_err(), "truncated without its end marker");
    for bad in ["x@sha256:abc", "x/UPPER", ""] {
        let e = NameArg::parse(bad).unwrap_err();
        assert!(e.to_string().starts_with("--name"), "{bad}: {e}");
    }
}

#[test]
fn index_json_first_or_under_dot_slash_is_found() {
    let parts = oci_parts("first");
    let mut entries = oci_entries(&parts, None);
    let Some(E::File(_, index)) = entries.pop() else {
        panic!("index.json last");
    };
    entries.insert(0, E::File("./index.json".into(), index));
    let archive = build(&entries);
    let (out, named) = renamed(&archive, "example.org/first", 333).unwrap();
    assert_eq!(named, 1);
    assert_eq!(names(&out), [Some("example.org/first:latest".to_string())]);
}
