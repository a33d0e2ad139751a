//! `bmaas_agent::install` against the in-test registry
//! (`fake_registry`): images written exactly, verified, never bootable
//! unverified; failures reported with their cause.

#![allow(clippy::unwrap_used)]

mod fake_registry;

use std::net::TcpListener;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fake_registry::*;

use bmaas_agent::install::{
    GUARD_BYTES, InstallError, Installer, OciInstaller, Progress, install_encoded_request,
    install_request, root_device_path,
};
use metropolis_proto::prelude::agent::{
    MetropolisInstallationRequest, OsInstallationRequest, os_installation_request,
};
use metropolis_proto::prelude::debug::OsImageRef;
use prost::Message;

#[test]
fn a_raw_image_is_written_exactly_with_progress() {
    let registry = Registry::start();
    let data = image(3 * 1024 * 1024 + 12345, 1);
    let (digest, layer_digest) = registry.push(RAW, &data);
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk.img");

    let (result, reports) = install(&installer(), &registry.image_ref(&digest), &disk);
    result.unwrap();
    assert!(
        std::fs::read(&disk).unwrap() == data,
        "the file is the image"
    );

    assert_eq!(
        reports.first(),
        Some(&Progress::Manifest {
            layer: layer_digest.clone(),
            size: data.len() as u64,
            compressed: false,
        })
    );
    let len = data.len() as u64;
    assert!(reports.contains(&Progress::Writing {
        written: len,
        total: Some(len),
        received: len,
        layer_size: len,
    }));
    assert_eq!(
        reports.last(),
        Some(&Progress::Verifying {
            verified: len,
            total: len,
        })
    );
    for report in &reports {
        assert!(!report.to_string().is_empty());
    }

    let seen = registry.seen();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(seen[0].path, format!("/v2/{REPO}/manifests/{digest}"));
    let accept = seen[0].accept.clone().unwrap_or_default();
    assert!(
        accept.contains("application/vnd.oci.image.manifest.v1+json"),
        "{accept}"
    );
    assert!(
        accept.contains("application/vnd.docker.distribution.manifest.v2+json"),
        "{accept}"
    );
    assert_eq!(seen[1].path, format!("/v2/{REPO}/blobs/{layer_digest}"));
}

#[test]
fn chunked_and_close_delimited_blobs_are_written() {
    for framing in [Framing::Chunked, Framing::Close] {
        let registry = Registry::start();
        let data = image(700_001, 2);
        let (digest, layer_digest) = registry.push(RAW, &data);
        registry.route(
            &format!("/v2/{REPO}/blobs/{layer_digest}"),
            Route::Reply {
                status: 200,
                content_type: None,
                body: data.clone(),
                framing,
            },
        );
        let dir = tempfile::tempdir().unwrap();
        let disk = dir.path().join("disk.img");
        install(&installer(), &registry.image_ref(&digest), &disk)
            .0
            .unwrap();
        assert!(std::fs::read(&disk).unwrap() == data);
    }
}

#[test]
fn a_longer_existing_file_is_cut_to_the_image() {
    let registry = Registry::start();
    let data = image(100_000, 3);
    let (digest, _) = registry.push(RAW, &data);
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk.img");
    std::fs::write(&disk, vec![0xff; 1_000_000]).unwrap();
    install(&installer(), &registry.image_ref(&digest), &disk)
        .0
        .unwrap();
    assert!(std::fs::read(&disk).unwrap() == data);
}

#[test]
fn zstd_images_are_decompressed() {
    let data = image(1_000_000, 4);
    // A real compressed frame (mostly repetitive data so it compresses).
    let repetitive: Vec<u8> = data.iter().map(|b| b & 0x03).collect();
    let compressed = ruzstd::encoding::compress_to_vec(
        &repetitive[..],
        ruzstd::encoding::CompressionLevel::Fastest,
    );
    assert!(compressed.len() < repetitive.len());
    // A hand-built frame of raw blocks, followed by a second frame.
    let mut handmade = raw_zstd_frame(&data[..300_000]);
    handmade.extend(raw_zstd_frame(&data[300_000..]));

    for (layer, expected) in [(compressed, repetitive), (handmade, data)] {
        let registry = Registry::start();
        let (digest, layer_digest) = registry.push(ZSTD, &layer);
        let dir = tempfile::tempdir().unwrap();
        let disk = dir.path().join("disk.img");
        let (result, reports) = install(&installer(), &registry.image_ref(&digest), &disk);
        result.unwrap();
        assert!(std::fs::read(&disk).unwrap() == expected);
        assert_eq!(
            reports.first(),
            Some(&Progress::Manifest {
                layer: layer_digest,
                size: layer.len() as u64,
                compressed: true,
            })
        );
        assert!(reports.contains(&Progress::Writing {
            written: expected.len() as u64,
            total: None,
            received: layer.len() as u64,
            layer_size: layer.len() as u64,
        }));
    }
}

#[test]
fn corrupt_zstd_is_a_decompression_error() {
    let registry = Registry::start();
    let mut layer = raw_zstd_frame(&image(1000, 5));
    layer[13] |= 0b110; // The first block's type: 3 is reserved.
    let (digest, layer_digest) = registry.push(ZSTD, &layer);
    let dir = tempfile::tempdir().unwrap();
    let err = must_fail(install(
        &installer(),
        &registry.image_ref(&digest),
        &dir.path().join("disk.img"),
    ));
    assert!(matches!(err, InstallError::Decompress { .. }), "{err:?}");
    assert!(err.to_string().contains(&layer_digest), "{err}");
}

#[test]
fn by_tag_the_digest_is_still_verified() {
    let registry = Registry::start();
    let data = image(5000, 6);
    let (digest, _) = registry.push(RAW, &data);
    let tagged = manifest(RAW, &sha256(&data), data.len() as u64);
    registry.route(
        &format!("/v2/{REPO}/manifests/v1.2"),
        Route::ok(OCI_MANIFEST, tagged),
    );
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk.img");
    let mut by_tag = registry.image_ref(&digest);
    by_tag.tag = "v1.2".into();
    install(&installer(), &by_tag, &disk).0.unwrap();
    assert!(std::fs::read(&disk).unwrap() == data);
    assert_eq!(
        registry.seen()[0].path,
        format!("/v2/{REPO}/manifests/v1.2")
    );

    // The tag now names another manifest than the digest asks for.
    let other = manifest(RAW, &sha256(b"other"), 5);
    registry.route(
        &format!("/v2/{REPO}/manifests/v1.2"),
        Route::ok(OCI_MANIFEST, other.clone()),
    );
    let err = must_fail(install(&installer(), &by_tag, &disk));
    match &err {
        InstallError::ManifestDigestMismatch { expected, actual } => {
            assert_eq!(expected, &digest);
            assert_eq!(actual, &sha256(&other));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_manifest_digest_mismatch_is_refused() {
    let registry = Registry::start();
    let (digest, _) = registry.push(RAW, &image(5000, 7));
    // Serve a different manifest under the requested digest.
    let forged = manifest(RAW, &sha256(b"evil"), 4);
    registry.route(
        &format!("/v2/{REPO}/manifests/{digest}"),
        Route::ok(OCI_MANIFEST, forged.clone()),
    );
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk.img");
    let err = must_fail(install(&installer(), &registry.image_ref(&digest), &disk));
    assert_eq!(
        err.to_string(),
        format!(
            "manifest digest mismatch: expected {digest}, got {}",
            sha256(&forged)
        )
    );
    assert!(
        !disk.exists(),
        "nothing is written before the manifest is verified"
    );
}

#[test]
fn a_layer_digest_mismatch_is_refused() {
    let registry = Registry::start();
    let data = image(200_000, 8);
    let (digest, layer_digest) = registry.push(RAW, &data);
    let mut tampered = data.clone();
    tampered[123_456] ^= 1;
    registry.route(
        &format!("/v2/{REPO}/blobs/{layer_digest}"),
        Route::ok("application/octet-stream", tampered.clone()),
    );
    let dir = tempfile::tempdir().unwrap();
    let err = must_fail(install(
        &installer(),
        &registry.image_ref(&digest),
        &dir.path().join("disk.img"),
    ));
    match &err {
        InstallError::LayerDigestMismatch { expected, actual } => {
            assert_eq!(expected, &layer_digest);
            assert_eq!(actual, &sha256(&tampered));
        }
        other => panic!("{other:?}"),
    }
    assert!(
        err.to_string()
            .starts_with("image layer digest mismatch: expected sha256:")
    );
}

#[test]
fn a_regular_file_is_written_only_when_image_files_are_allowed() {
    let registry = Registry::start();
    let data = image(100_000, 12);
    let (digest, _) = registry.push(RAW, &data);
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk.img");
    std::fs::write(&disk, b"old").unwrap();
    let strict = OciInstaller::new().with_timeouts(Duration::from_secs(5), Duration::from_secs(10));
    let err = must_fail(install(&strict, &registry.image_ref(&digest), &disk));
    assert!(
        matches!(err, InstallError::DeviceUnusable { .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("--allow-image-files"), "{err}");
    assert_eq!(std::fs::read(&disk).unwrap(), b"old");
    // Nor is a missing one created.
    let missing = dir.path().join("missing.img");
    must_fail(install(&strict, &registry.image_ref(&digest), &missing));
    assert!(!missing.exists());
    install(&installer(), &registry.image_ref(&digest), &disk)
        .0
        .unwrap();
    assert!(std::fs::read(&disk).unwrap() == data);
}

/// A target holding an old system (0xaa everywhere), longer than the
/// image.
fn old_system(dir: &Path) -> std::path::PathBuf {
    let disk = dir.join("disk.img");
    std::fs::write(&disk, vec![0xaa; 5 << 20]).unwrap();
    disk
}

fn head_is_zero(disk: &Path) -> bool {
    let bytes = std::fs::read(disk).unwrap();
    bytes.len() >= GUARD_BYTES as usize && bytes[..GUARD_BYTES as usize].iter().all(|b| *b == 0)
}

#[test]
fn unverified_bytes_never_leave_a_bootable_head() {
    let registry = Registry::start();
    let data = image(3 << 20, 13);
    let (digest, layer_digest) = registry.push(RAW, &data);
    let dir = tempfile::tempdir().unwrap();
    let blob = format!("/v2/{REPO}/blobs/{layer_digest}");

    // Other bytes of the same size.
    let mut tampered = data.clone();
    tampered[(2 << 20) + 5] ^= 1;
    registry.route(&blob, Route::ok("application/octet-stream", tampered));
    let disk = old_system(dir.path());
    let err = must_fail(install(&installer(), &registry.image_ref(&digest), &disk));
    assert!(
        matches!(err, InstallError::LayerDigestMismatch { .. }),
        "{err:?}"
    );
    assert!(
        head_is_zero(&disk),
        "the old system's head is gone, the new one not written"
    );

    // Cut short: the full length declared, 2 MiB sent, the connection
    // closed.
    registry.route(
        &blob,
        Route::Reply {
            status: 200,
            content_type: None,
            body: data.clone(),
            framing: Framing::Truncated(2 << 20),
        },
    );
    let disk = old_system(dir.path());
    let err = must_fail(install(&installer(), &registry.image_ref(&digest), &disk));
    assert!(matches!(err, InstallError::Transfer { .. }), "{err:?}");
    assert!(head_is_zero(&disk));

    // A failure before the first byte of the layer leaves the target alone.
    registry.route(
        &blob,
        Route::Reply {
            status: 500,
            content_type: None,
            body: b"down".to_vec(),
            framing: Framing::Length,
        },
    );
    let disk = old_system(dir.path());
    must_fail(install(&installer(), &registry.image_ref(&digest), &disk));
    assert_eq!(std::fs::read(&disk).unwrap(), vec![0xaa; 5 << 20]);

    // Served right, it installs.
    registry.route(&blob, Route::ok("application/octet-stream", data.clone()));
    install(&installer(), &registry.image_ref(&digest), &disk)
        .0
        .unwrap();
    assert!(std::fs::read(&disk).unwrap() == data);
}

#[test]
fn layer_size_mismatches_are_refused() {
    let data = image(50_000, 9);
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk.img");

    // Longer than the manifest says, without a Content-Length.
    let registry = Registry::start();
    let (digest, layer_digest) = registry.push(RAW, &data);
    let mut longer = data.clone();
    longer.extend_from_slice(b"more");
    registry.route(
        &format!("/v2/{REPO}/blobs/{layer_digest}"),
        Route::Reply {
            status: 200,
            content_type: None,
            body: longer,
            framing: Framing::Chunked,
        },
    );
    let err = must_fail(install(&installer(), &registry.image_ref(&digest), &disk));
    assert!(
        matches!(
            err,
            InstallError::LayerSizeMismatch {
                expected: 50_000,
                ..
            }
        ),
        "{err:?}"
    );

    // Shorter, without a Content-Length: the body ends early.
    registry.route(
        &format!("/v2/{REPO}/blobs/{layer_digest}"),
        Route::Reply {
            status: 200,
            content_type: None,
            body: data[..40_000].to_vec(),
            framing: Framing::Close,
        },
    );
    let err = must_fail(install(&installer(), &registry.image_ref(&digest), &disk));
    match &err {
        InstallError::LayerSizeMismatch {
            expected, received, ..
        } => assert_eq!((*expected, *received), (50_000, 40_000)),
        other => panic!("{other:?}"),
    }

    // A Content-Length that disagrees with the manifest.
    registry.route(
        &format!("/v2/{REPO}/blobs/{layer_digest}"),
        Route::ok("application/octet-stream", data[..10].to_vec()),
    );
    let err = must_fail(install(&installer(), &registry.image_ref(&digest), &disk));
    assert!(matches!(err, InstallError::Protocol { .. }), "{err:?}");
    assert!(err.to_string().contains("Content-Length 10"), "{err}");

    // The connection closes before the declared length.
    registry.route(
        &format!("/v2/{REPO}/blobs/{layer_digest}"),
        Route::Reply {
            status: 200,
            content_type: None,
            body: data.clone(),
            framing: Framing::Truncated(30_000),
        },
    );
    let err = must_fail(install(&installer(), &registry.image_ref(&digest), &disk));
    assert!(matches!(err, InstallError::Transfer { .. }), "{err:?}");
}

#[test]
fn a_missing_layer_is_reported() {
    let registry = Registry::start();
    let (digest, layer_digest) = registry.push(RAW, &image(1000, 10));
    registry
        .routes
        .lock()
        .unwrap()
        .remove(&format!("/v2/{REPO}/blobs/{layer_digest}"));
    let dir = tempfile::tempdir().unwrap();
    let err = must_fail(install(
        &installer(),
        &registry.image_ref(&digest),
        &dir.path().join("disk.img"),
    ));
    assert!(matches!(err, InstallError::LayerNotFound { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        format!(
            "image layer not found: {}/{REPO}@{layer_digest}",
            registry.host()
        )
    );
}

#[test]
fn a_missing_manifest_is_reported() {
    let registry = Registry::start();
    let digest = sha256(b"no such manifest");
    let dir = tempfile::tempdir().unwrap();
    let err = must_fail(install(
        &installer(),
        &registry.image_ref(&digest),
        &dir.path().join("disk.img"),
    ));
    assert_eq!(
        err.to_string(),
        format!("manifest not found: {}/{REPO}@{digest}", registry.host())
    );
}

#[test]
fn registry_errors_carry_their_codes() {
    let registry = Registry::start();
    let digest = sha256(b"x");
    registry.route(
        &format!("/v2/{REPO}/manifests/{digest}"),
        Route::Reply {
            status: 401,
            content_type: Some("application/json".into()),
            body: br#"{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}"#
                .to_vec(),
            framing: Framing::Length,
        },
    );
    let dir = tempfile::tempdir().unwrap();
    let err = must_fail(install(
        &installer(),
        &registry.image_ref(&digest),
        &dir.path().join("disk.img"),
    ));
    assert!(
        matches!(err, InstallError::Status { status: 401, .. }),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .ends_with("registry answered 401 Whatever (UNAUTHORIZED: authentication required)"),
        "{err}"
    );
}

#[test]
fn an_unreachable_registry_is_reported() {
    // A port that was just free: nothing listens there.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let image = OsImageRef {
        scheme: "http".into(),
        host: format!("127.0.0.1:{port}"),
        repository: REPO.into(),
        tag: String::new(),
        digest: sha256(b"x"),
    };
    let dir = tempfile::tempdir().unwrap();
    let err = must_fail(install(&installer(), &image, &dir.path().join("disk.img")));
    assert!(matches!(err, InstallError::Unreachable { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        format!("registry 127.0.0.1:{port} unreachable: connection refused")
    );
}

#[test]
fn redirects_are_followed_on_the_same_host_and_to_https() {
    let registry = Registry::start();
    let (tls, cert) = tls_server();
    let storage = Registry::start_with(Some(tls));
    let data = image(400_000, 11);
    let (digest, layer_digest) = registry.push(RAW, &data);
    let blob = format!("/v2/{REPO}/blobs/{layer_digest}");
    // blob → 307 same host → 302 other host (absolute URL) → 200.
    registry.route(
        &blob,
        Route::Redirect {
            status: 307,
            location: "/storage/first?sig=abc".into(),
        },
    );
    registry.route(
        "/storage/first?sig=abc",
        Route::Redirect {
            status: 302,
            location: format!("https://{}/bucket/blob", storage.host()),
        },
    );
    storage.route(
        "/bucket/blob",
        Route::ok("application/octet-stream", data.clone()),
    );
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk.img");
    let trusting = installer().with_tls(client_trusting(&cert));
    install(&trusting, &registry.image_ref(&digest), &disk)
        .0
        .unwrap();
    assert!(std::fs::read(&disk).unwrap() == data);
    assert_eq!(storage.seen().len(), 1);

    // To another host in the clear: refused, naming the rule, before any
    // request goes there.
    let plain = Registry::start();
    registry.route(
        "/storage/first?sig=abc",
        Route::Redirect {
            status: 302,
            location: format!("http://{}/bucket/blob", plain.host()),
        },
    );
    let err = must_fail(install(&trusting, &registry.image_ref(&digest), &disk));
    assert!(matches!(err, InstallError::Protocol { .. }), "{err:?}");
    assert!(err.to_string().contains("only https is followed"), "{err}");
    assert!(plain.seen().is_empty());

    // A redirect loop ends.
    registry.route(
        &blob,
        Route::Redirect {
            status: 308,
            location: blob.clone(),
        },
    );
    let err = must_fail(install(&installer(), &registry.image_ref(&digest), &disk));
    assert!(err.to_string().contains("redirects"), "{err}");
}

#[test]
fn unusable_manifests_are_refused() {
    let registry = Registry::start();
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk.img");
    let cases: [(&[u8], &str); 4] = [
        (b"not json", "invalid manifest"),
        (
            br#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[]}"#,
            "is an image index without a linux/",
        ),
        (
            br#"{"schemaVersion":2,"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855","size":0}]}"#,
            "unsupported:",
        ),
        (br#"{"schemaVersion":2,"layers":[]}"#, "expected exactly one"),
    ];
    for (body, expected) in cases {
        let digest = sha256(body);
        registry.route(
            &format!("/v2/{REPO}/manifests/{digest}"),
            Route::ok(OCI_MANIFEST, body.to_vec()),
        );
        let err = must_fail(install(&installer(), &registry.image_ref(&digest), &disk));
        assert!(
            err.to_string().contains(expected),
            "{err} lacks {expected:?}"
        );
    }
}

#[test]
fn invalid_references_fail_before_any_request() {
    let registry = Registry::start();
    let good = registry.image_ref(&sha256(b"x"));
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk.img");
    let cases: Vec<(OsImageRef, &str)> = vec![
        (
            OsImageRef {
                digest: String::new(),
                ..good.clone()
            },
            "os_image.digest",
        ),
        (
            OsImageRef {
                digest: "sha256:abc".into(),
                ..good.clone()
            },
            "os_image.digest",
        ),
        (
            OsImageRef {
                digest: "md5:abc".into(),
                ..good.clone()
            },
            "os_image.digest",
        ),
        (
            OsImageRef {
                repository: "../etc".into(),
                ..good.clone()
            },
            "os_image.repository",
        ),
        (
            OsImageRef {
                repository: String::new(),
                ..good.clone()
            },
            "os_image.repository",
        ),
        (
            OsImageRef {
                tag: "a/b".into(),
                ..good.clone()
            },
            "os_image.tag",
        ),
        (
            OsImageRef {
                host: "a/b".into(),
                ..good.clone()
            },
            "os_image.host",
        ),
        (
            OsImageRef {
                host: "user@host".into(),
                ..good.clone()
            },
            "os_image.host",
        ),
        (
            OsImageRef {
                host: String::new(),
                ..good.clone()
            },
            "os_image.host",
        ),
        (
            OsImageRef {
                scheme: "ftp".into(),
                ..good.clone()
            },
            "os_image.scheme",
        ),
    ];
    for (image, field) in cases {
        let err = must_fail(install(&installer(), &image, &disk));
        assert!(
            matches!(err, InstallError::InvalidRequest { field: f, .. } if f == field),
            "{image:?}: {err:?}"
        );
        assert!(err.to_string().contains(field), "{err}");
    }
    assert!(registry.seen().is_empty());
}

#[test]
fn https_needs_a_tls_configuration() {
    let registry = Registry::start();
    let image = OsImageRef {
        scheme: "https".into(),
        ..registry.image_ref(&sha256(b"x"))
    };
    let dir = tempfile::tempdir().unwrap();
    let err = must_fail(install(&installer(), &image, &dir.path().join("disk.img")));
    assert!(matches!(err, InstallError::Unsupported { .. }), "{err:?}");
    assert!(err.to_string().contains("https"), "{err}");
}

#[test]
fn https_registries_work_with_a_caller_supplied_root() {
    let server_key = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).unwrap();
    let server_config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![server_key.cert.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(server_key.signing_key.serialize_der().into()),
        )
        .unwrap();
    let registry = Registry::start_with(Some(Arc::new(server_config)));
    let data = image(300_000, 12);
    let (digest, _) = registry.push(RAW, &data);
    let image = OsImageRef {
        scheme: "https".into(),
        ..registry.image_ref(&digest)
    };
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk.img");

    let trusting = installer().with_tls(client_trusting(&server_key.cert));
    install(&trusting, &image, &disk).0.unwrap();
    assert!(std::fs::read(&disk).unwrap() == data);

    let stranger = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).unwrap();
    let distrusting = installer().with_tls(client_trusting(&stranger.cert));
    let err = must_fail(install(&distrusting, &image, &disk));
    assert!(matches!(err, InstallError::Tls { .. }), "{err:?}");
    assert!(err.to_string().contains("certificate"), "{err}");
}

#[test]
fn a_missing_device_under_dev_is_not_created() {
    let registry = Registry::start();
    let (digest, _) = registry.push(RAW, &image(1000, 13));
    let device = Path::new("/dev/metropolis-test-no-such-device");
    let err = must_fail(install(&installer(), &registry.image_ref(&digest), device));
    assert!(
        matches!(err, InstallError::Device { action: "open", .. }),
        "{err:?}"
    );
    assert!(!device.exists());
    assert!(
        err.to_string()
            .starts_with("root device /dev/metropolis-test-no-such-device: open: "),
        "{err}"
    );
}

#[test]
fn a_directory_is_not_a_device() {
    let registry = Registry::start();
    let (digest, _) = registry.push(RAW, &image(1000, 14));
    let dir = tempfile::tempdir().unwrap();
    let err = must_fail(install(
        &installer(),
        &registry.image_ref(&digest),
        dir.path(),
    ));
    assert!(
        matches!(
            err,
            InstallError::Device { .. } | InstallError::DeviceUnusable { .. }
        ),
        "{err:?}"
    );
}

/// An installer that records what it was asked to do.
struct Recorder(Mutex<Vec<(OsImageRef, std::path::PathBuf)>>);

impl Installer for Recorder {
    fn install(
        &self,
        image: &OsImageRef,
        root_device: &Path,
        _progress: &mut dyn FnMut(&Progress),
    ) -> Result<(), InstallError> {
        self.0
            .lock()
            .unwrap()
            .push((image.clone(), root_device.to_path_buf()));
        Ok(())
    }
}

#[test]
fn whole_requests_are_checked_and_dispatched() {
    let recorder = Recorder(Mutex::new(Vec::new()));
    let image = OsImageRef {
        scheme: "http".into(),
        host: "127.0.0.1:5000".into(),
        repository: REPO.into(),
        tag: String::new(),
        digest: sha256(b"x"),
    };
    let request = |root_device: &str, os_image: Option<OsImageRef>| OsInstallationRequest {
        generation: 1,
        r#type: Some(os_installation_request::Type::Metropolis(
            MetropolisInstallationRequest {
                os_image,
                node_parameters: None,
                root_device: root_device.into(),
            },
        )),
    };
    let mut progress = |_: &Progress| {};

    install_request(
        &recorder,
        &request("nvme0n1", Some(image.clone())),
        &mut progress,
    )
    .unwrap();
    let encoded = request("/dev/disk/by-id/x", Some(image.clone())).encode_to_vec();
    install_encoded_request(&recorder, &encoded, &mut progress).unwrap();
    assert_eq!(
        *recorder.0.lock().unwrap(),
        vec![
            (image.clone(), "/dev/nvme0n1".into()),
            (image.clone(), "/dev/disk/by-id/x".into()),
        ]
    );

    // The server's rule: a device name, or a path under /dev/ without
    // `..`; and where the path exists, its links must not lead out of /dev.
    let shm = tempfile::tempdir_in("/dev/shm").unwrap();
    let inside = shm.path().join("disk.img");
    std::fs::write(&inside, b"").unwrap();
    let link_in = shm.path().join("in");
    std::os::unix::fs::symlink(&inside, &link_in).unwrap();
    assert_eq!(
        root_device_path(link_in.to_str().unwrap()).unwrap(),
        link_in
    );
    let link_out = shm.path().join("out");
    std::os::unix::fs::symlink("/etc/passwd", &link_out).unwrap();
    for (root, problem) in [
        ("./disk.img", "not an absolute path"),
        ("/etc/shadow", "not under /dev/"),
        ("/dev/../etc/passwd", ". or .. component"),
        (link_out.to_str().unwrap(), "leads to /etc/passwd"),
    ] {
        let err = install_request(
            &recorder,
            &request(root, Some(image.clone())),
            &mut progress,
        )
        .unwrap_err();
        match err {
            InstallError::InvalidRequest {
                field: "metropolis.root_device",
                problem: p,
            } => assert!(p.contains(problem), "{root}: {p}"),
            other => panic!("{root}: {other:?}"),
        }
    }

    let err = install_request(&recorder, &request("", Some(image.clone())), &mut progress);
    assert!(matches!(
        err,
        Err(InstallError::InvalidRequest {
            field: "metropolis.root_device",
            ..
        })
    ));
    let err = install_request(&recorder, &request("sda", None), &mut progress);
    assert!(matches!(
        err,
        Err(InstallError::InvalidRequest {
            field: "metropolis.os_image",
            ..
        })
    ));
    let untyped = OsInstallationRequest {
        generation: 1,
        r#type: None,
    };
    let err = install_request(&recorder, &untyped, &mut progress);
    assert!(matches!(err, Err(InstallError::Unsupported { .. })));
    let err = install_encoded_request(&recorder, b"\xff\xff\xff", &mut progress);
    assert!(matches!(err, Err(InstallError::InvalidRequest { .. })));
    assert_eq!(recorder.0.lock().unwrap().len(), 2);
}
