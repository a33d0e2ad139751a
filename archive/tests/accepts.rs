//! Valid archives (Docker v1.1/v1.2, Docker 25+, OCI layouts), accepted
//! with the same plan and members at every chunk size.

mod common;

use bytes::Bytes;
use common::*;
use metropolis_archive::*;
use serde_json::json;

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

/// Errors say what happened; which gRPC code each becomes is the
/// service layer's (`metropolis_service::status::debug::archive_code`).
#[test]
fn errors_say_what_happened() {
    let e = ArchiveError::ArchiveTooLarge { limit: 1 };
    assert_eq!(e.to_string(), "archive larger than the limit of 1 bytes");
    let e = ArchiveError::DuplicateMember { path: "a".into() };
    assert_eq!(e.to_string(), "member a appears twice");
}
