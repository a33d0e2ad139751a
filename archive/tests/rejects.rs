//! Hostile and broken archives: each rejected with its own error, at
//! every chunk size.

mod common;

use bytes::Bytes;
use common::*;
use metropolis_archive::*;
use serde_json::json;

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
