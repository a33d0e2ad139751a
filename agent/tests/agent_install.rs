//! `bmaas_agent::install` against the in-test registry
//! (`fake_registry`): OS images (the format of
//! docs/spec/metropolis-install.md, section 1) written exactly, every
//! chunk verified before a byte of it is written, never bootable
//! unverified; transfers resumed and requests tried again; failures
//! reported with their cause.

#![allow(clippy::unwrap_used)]

mod fake_registry;

use std::net::TcpListener;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fake_registry::*;

use bmaas_agent::install::{
    GUARD_BYTES, ImageKind, InstallError, Installer, MetropolisOptions, OciInstaller, Progress,
    RegistryError, RetryPolicy, Target, install_encoded_request, install_request, root_device_path,
};
use metropolis_proto::prelude::agent::{
    MetropolisInstallationRequest, OsInstallationRequest, os_installation_request,
};
use metropolis_proto::prelude::debug::{NodeParameters, OsImageRef};
use prost::Message;

const MIB: usize = 1024 * 1024;

/// The blob requests `registry` saw, in order.
fn blob_requests(registry: &Registry, path: &str) -> Vec<Seen> {
    registry
        .seen()
        .into_iter()
        .filter(|s| s.path == path)
        .collect()
}

#[test]
fn a_raw_image_is_written_exactly_with_progress() {
    let registry = Registry::start();
    let data = image(3 * MIB + 12345, 1);
    let pushed = registry.push_disk(&data, Compression::Raw, CHUNK);
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk.img");

    let (result, reports) = install(
        &installer(),
        &registry.image_ref(&pushed.manifest_digest),
        &disk,
    );
    result.unwrap();
    assert!(
        std::fs::read(&disk).unwrap() == data,
        "the file is the image"
    );

    let len = data.len() as u64;
    assert_eq!(
        reports,
        vec![
            Progress::Image {
                kind: ImageKind::Disk,
                payloads: vec![("disk".to_string(), len, false)],
            },
            Progress::Writing {
                payload: "disk".to_string(),
                written: len,
                total: len,
            },
        ]
    );
    assert_eq!(
        reports[0].to_string(),
        "image verified: whole-disk image; disk 3.0 MiB"
    );
    assert_eq!(
        reports[1].to_string(),
        "disk: verified, written and read back 3.0 MiB of 3.0 MiB"
    );

    // The manifest, the config, the layer: one request each.
    let seen = registry.seen();
    let paths: Vec<&str> = seen.iter().map(|s| s.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            pushed.manifest_path(),
            pushed.config_path(),
            pushed.blob_path(0)
        ]
    );
    let accept = seen[0].accept.clone().unwrap_or_default();
    assert!(
        accept.contains("application/vnd.oci.image.manifest.v1+json"),
        "{accept}"
    );
    assert!(
        accept.contains("application/vnd.oci.image.index.v1+json"),
        "{accept}"
    );
    assert!(seen.iter().all(|s| s.range.is_none()), "{seen:?}");
}

#[test]
fn any_chunk_size_reads_back_exactly() {
    let data = image(9 * MIB + 12345, 2);
    // Chunks dividing nothing, larger than a verifier batch (4 MiB), and
    // one chunk for the whole payload.
    for chunk in [4096, 1_000_003, 5 * MIB, 16 * MIB] {
        let registry = Registry::start();
        let pushed = registry.push_disk(&data, Compression::Raw, chunk);
        let dir = tempfile::tempdir().unwrap();
        let disk = dir.path().join("disk.img");
        install(
            &installer(),
            &registry.image_ref(&pushed.manifest_digest),
            &disk,
        )
        .0
        .unwrap();
        assert!(std::fs::read(&disk).unwrap() == data, "chunk {chunk}");
    }
}

#[test]
fn zstd_payloads_are_decompressed_and_read_back_exactly() {
    let data = image(1_000_000, 4);
    // Mostly repetitive data, so that it compresses.
    let repetitive: Vec<u8> = data.iter().map(|b| b & 0x03).collect();
    let registry = Registry::start();
    let compressed = registry.push_disk(&repetitive, Compression::Zstd, CHUNK);
    assert!(compressed.layers[0].len() < repetitive.len() / 2);
    // Poorly compressible data, and a hand-built frame of raw blocks
    // followed by a second frame.
    let random = registry.push_disk(&data, Compression::Zstd, 100_000);
    let mut handmade = raw_zstd_frame(&data[..300_000]);
    handmade.extend(raw_zstd_frame(&data[300_000..]));
    let two_frames = registry.push_image(
        DISK_ARTIFACT,
        os_config("1", &[payload_config("disk", &data, CHUNK)]),
        &[(ZSTD, handmade)],
    );

    for (pushed, expected) in [
        (compressed, &repetitive),
        (random, &data),
        (two_frames, &data),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let disk = dir.path().join("disk.img");
        let (result, reports) = install(
            &installer(),
            &registry.image_ref(&pushed.manifest_digest),
            &disk,
        );
        result.unwrap();
        assert!(std::fs::read(&disk).unwrap() == *expected);
        let len = expected.len() as u64;
        assert_eq!(
            reports,
            vec![
                Progress::Image {
                    kind: ImageKind::Disk,
                    payloads: vec![("disk".to_string(), len, true)],
                },
                Progress::Writing {
                    payload: "disk".to_string(),
                    written: len,
                    total: len,
                },
            ]
        );
        assert!(reports[0].to_string().ends_with("(zstd)"), "{}", reports[0]);
    }
}

#[test]
fn corrupt_zstd_is_a_decompression_error() {
    let registry = Registry::start();
    let data = image(1000, 5);
    let mut layer = raw_zstd_frame(&data);
    layer[13] |= 0b110; // The first block's type: 3 is reserved.
    let pushed = registry.push_image(
        DISK_ARTIFACT,
        os_config("1", &[payload_config("disk", &data, CHUNK)]),
        &[(ZSTD, layer)],
    );
    let dir = tempfile::tempdir().unwrap();
    let err = must_fail(install(
        &installer(),
        &registry.image_ref(&pushed.manifest_digest),
        &dir.path().join("disk.img"),
    ));
    assert!(matches!(err, InstallError::Decompress { .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains(pushed.layer_digest()), "{text}");
    assert!(text.contains("(payload disk)"), "{text}");
}

#[test]
fn by_tag_the_digest_is_still_verified() {
    let registry = Registry::start();
    let data = image(5000, 6);
    let pushed = registry.push_disk(&data, Compression::Raw, CHUNK);
    registry.route(
        &format!("/v2/{REPO}/manifests/v1.2"),
        Route::ok(OCI_MANIFEST, pushed.manifest.clone()),
    );
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk.img");
    let mut by_tag = registry.image_ref(&pushed.manifest_digest);
    by_tag.tag = "v1.2".into();
    install(&installer(), &by_tag, &disk).0.unwrap();
    assert!(std::fs::read(&disk).unwrap() == data);
    assert_eq!(
        registry.seen()[0].path,
        format!("/v2/{REPO}/manifests/v1.2")
    );

    // The tag now names another image than the digest asks for.
    let other = registry.push_disk(b"other", Compression::Raw, CHUNK);
    registry.route(
        &format!("/v2/{REPO}/manifests/v1.2"),
        Route::ok(OCI_MANIFEST, other.manifest.clone()),
    );
    let err = must_fail(install(&installer(), &by_tag, &disk));
    match &err {
        InstallError::ManifestDigestMismatch { expected, actual } => {
            assert_eq!(expected, &pushed.manifest_digest);
            assert_eq!(actual, &other.manifest_digest);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_manifest_digest_mismatch_is_refused() {
    let registry = Registry::start();
    let pushed = registry.push_disk(&image(5000, 7), Compression::Raw, CHUNK);
    // Serve a different manifest under the requested digest.
    let evil = b"evil".to_vec();
    let forged = os_manifest(
        DISK_ARTIFACT,
        &os_config("1", &[payload_config("disk", &evil, CHUNK)]),
        true,
        &[descriptor(RAW, &evil)],
    );
    registry.route(
        &pushed.manifest_path(),
        Route::ok(OCI_MANIFEST, forged.clone()),
    );
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk.img");
    let err = must_fail(install(
        &installer(),
        &registry.image_ref(&pushed.manifest_digest),
        &disk,
    ));
    assert_eq!(
        err.to_string(),
        format!(
            "manifest digest mismatch: expected {}, got {}",
            pushed.manifest_digest,
            sha256(&forged)
        )
    );
    assert!(
        !disk.exists(),
        "nothing is written before the manifest is verified"
    );
}

/// A target holding an old system (0xaa everywhere), longer than the
/// images.
fn old_system(dir: &Path) -> std::path::PathBuf {
    let disk = dir.join("disk.img");
    std::fs::write(&disk, vec![0xaa; 8 * MIB]).unwrap();
    disk
}

fn head_is_zero(disk: &Path) -> bool {
    let bytes = std::fs::read(disk).unwrap();
    bytes.len() >= GUARD_BYTES as usize && bytes[..GUARD_BYTES as usize].iter().all(|b| *b == 0)
}

/// A whole-disk image whose `disk` payload is `data`, its layer
/// compressed by hand into raw zstd blocks when `zstd` (so that a payload
/// of other bytes compresses to a layer of the same size).
fn push_disk_layer(registry: &Registry, data: &[u8], chunk: usize, zstd: bool) -> Pushed {
    let layer = if zstd {
        (ZSTD, raw_zstd_frame(data))
    } else {
        (RAW, data.to_vec())
    };
    registry.push_image(
        DISK_ARTIFACT,
        os_config("1", &[payload_config("disk", data, chunk)]),
        &[layer],
    )
}

/// A bad chunk fails the install at once, also when the registry sends
/// the rest slowly: the verifier's reading thread stops at its next read
/// instead of finishing its batch (which here would take until the 8 s
/// request deadline).
#[test]
fn a_wrong_chunk_fails_at_once_from_a_slow_registry() {
    let registry = Registry::start();
    let data = image(6 * MIB, 9);
    let pushed = push_disk_layer(&registry, &data, 64 * 1024, false);
    let mut served = data.clone();
    served[100] ^= 1;
    registry.route(
        &pushed.blob_path(0),
        Route::framed(
            200,
            served,
            Framing::Drip {
                fast: 4 * MIB + 10,
                chunk: 1000,
                pause: Duration::from_millis(20),
            },
        ),
    );
    let dir = tempfile::tempdir().unwrap();
    let disk = old_system(dir.path());
    let slow = installer().with_deadline(Duration::from_secs(8));
    let started = Instant::now();
    let err = must_fail(install(
        &slow,
        &registry.image_ref(&pushed.manifest_digest),
        &disk,
    ));
    let took = started.elapsed();
    assert!(
        matches!(err, InstallError::ChunkMismatch { chunk: 0, .. }),
        "{err:?}"
    );
    assert!(took < Duration::from_secs(4), "took {took:?}");
}

#[test]
fn a_wrong_chunk_is_named_and_none_of_it_is_written() {
    for zstd in [false, true] {
        let registry = Registry::start();
        // Two verifier batches (4 MiB each): the first verifies and is
        // written, the second holds the bad chunk.
        let data = image(6 * MIB, 8);
        let chunk = 64 * 1024;
        let pushed = push_disk_layer(&registry, &data, chunk, zstd);
        let mut served = data.clone();
        served[5 * MIB + 100] ^= 1;
        let bad = 5 * MIB / chunk;
        let offset = bad * chunk;
        let tampered = if zstd {
            raw_zstd_frame(&served)
        } else {
            served.clone()
        };
        assert_eq!(tampered.len(), pushed.layers[0].len());
        registry.route(&pushed.blob_path(0), Route::ok(RAW, tampered));
        let dir = tempfile::tempdir().unwrap();
        let disk = old_system(dir.path());
        let image_ref = registry.image_ref(&pushed.manifest_digest);

        let err = must_fail(install(&installer(), &image_ref, &disk));
        match &err {
            InstallError::ChunkMismatch {
                payload,
                chunk: c,
                offset: o,
            } => assert_eq!(
                (payload.as_str(), *c, *o),
                ("disk", bad as u64, offset as u64)
            ),
            other => panic!("zstd {zstd}: {other:?}"),
        }
        assert!(
            err.to_string()
                .starts_with(&format!("payload disk: chunk {bad} (bytes from {offset})")),
            "{err}"
        );
        let after = std::fs::read(&disk).unwrap();
        assert_eq!(after.len(), 8 * MIB);
        assert!(head_is_zero(&disk), "zstd {zstd}: the head is not bootable");
        assert!(
            after[offset..offset + chunk] != served[offset..offset + chunk],
            "zstd {zstd}: the bad chunk was written"
        );
        assert!(
            after[offset..].iter().all(|b| *b == 0xaa),
            "zstd {zstd}: a byte of the bad chunk or of a later one was written"
        );

        // The registry fixed, the same request installs.
        registry.route(
            &pushed.blob_path(0),
            Route::ok(RAW, pushed.layers[0].clone()),
        );
        install(&installer(), &image_ref, &disk).0.unwrap();
        assert!(std::fs::read(&disk).unwrap() == data, "zstd {zstd}");
    }
}

#[test]
fn unverified_bytes_never_leave_a_bootable_head() {
    let registry = Registry::start();
    let data = image(3 * MIB, 13);
    let pushed = registry.push_disk(&data, Compression::Raw, CHUNK);
    let image_ref = registry.image_ref(&pushed.manifest_digest);
    let dir = tempfile::tempdir().unwrap();
    let blob = pushed.blob_path(0);

    // Other bytes of the same size, in the first chunk.
    let mut tampered = data.clone();
    tampered[5] ^= 1;
    registry.route(&blob, Route::ok(RAW, tampered));
    let disk = old_system(dir.path());
    let err = must_fail(install(&installer(), &image_ref, &disk));
    assert!(
        matches!(err, InstallError::ChunkMismatch { chunk: 0, .. }),
        "{err:?}"
    );
    assert!(
        head_is_zero(&disk),
        "the old system's head is gone, the new one not written"
    );

    // Cut short, again and again: the full length declared, 2 MiB sent,
    // the connection closed; the resumed requests end the same way.
    registry.route(
        &blob,
        Route::framed(200, data.clone(), Framing::Truncated(2 * MIB)),
    );
    let disk = old_system(dir.path());
    let err = must_fail(install(&installer(), &image_ref, &disk));
    assert!(
        matches!(err, InstallError::Registry(RegistryError::Transfer { .. })),
        "{err:?}"
    );
    assert!(head_is_zero(&disk));

    // A failure before the first byte of the layer leaves the target
    // alone (after the retries a 500 earns).
    registry.route(&blob, Route::framed(500, b"down".to_vec(), Framing::Length));
    let disk = old_system(dir.path());
    let err = must_fail(install(&installer(), &image_ref, &disk));
    assert!(
        matches!(
            err,
            InstallError::Registry(RegistryError::Status { status: 500, .. })
        ),
        "{err:?}"
    );
    assert_eq!(std::fs::read(&disk).unwrap(), vec![0xaa; 8 * MIB]);

    // Served right, it installs.
    registry.route(&blob, Route::ok(RAW, data.clone()));
    install(&installer(), &image_ref, &disk).0.unwrap();
    assert!(std::fs::read(&disk).unwrap() == data);
}

#[test]
fn layers_of_another_length_than_declared() {
    let data = image(50_000, 9);
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk.img");
    let registry = Registry::start();
    let pushed = registry.push_disk(&data, Compression::Raw, 4096);
    let image_ref = registry.image_ref(&pushed.manifest_digest);
    let blob = pushed.blob_path(0);

    // Longer than the manifest says, without a Content-Length: read up to
    // the payload's size and no further.
    let mut longer = data.clone();
    longer.extend_from_slice(b"more");
    registry.route(&blob, Route::framed(200, longer, Framing::Chunked));
    install(&installer(), &image_ref, &disk).0.unwrap();
    assert!(std::fs::read(&disk).unwrap() == data);

    // Shorter, without a Content-Length: the body ends early, every time
    // it is resumed (this registry ignores Range).
    registry.route(
        &blob,
        Route::framed(200, data[..40_000].to_vec(), Framing::Close),
    );
    let before = blob_requests(&registry, &blob).len();
    let err = must_fail(install(&installer(), &image_ref, &disk));
    match &err {
        InstallError::PayloadTruncated {
            payload,
            expected,
            received,
        } => assert_eq!(
            (payload.as_str(), *expected, *received),
            ("disk", 50_000, 40_000)
        ),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        err.to_string(),
        "payload disk ended after 40000 of the 50000 bytes the image config gives"
    );
    let tries = &blob_requests(&registry, &blob)[before..];
    assert!((2..=10).contains(&tries.len()), "{tries:?}");
    assert_eq!(tries[0].range, None);
    assert!(
        tries[1..]
            .iter()
            .all(|s| s.range.as_deref() == Some("bytes=40000-")),
        "{tries:?}"
    );

    // Resumed, the registry sends the whole blob again, shorter than
    // what was received already.
    registry.route(
        &blob,
        Route::Sequence(vec![
            Route::framed(200, data[..40_000].to_vec(), Framing::Close),
            Route::framed(200, data[..30_000].to_vec(), Framing::Close),
        ]),
    );
    let err = must_fail(install(&installer(), &image_ref, &disk));
    match &err {
        InstallError::Registry(RegistryError::Protocol { problem, .. }) => assert!(
            problem.contains("30000 bytes long, shorter than the 40000 already received"),
            "{problem}"
        ),
        other => panic!("{other:?}"),
    }

    // A Content-Length shorter than the manifest's size.
    registry.route(&blob, Route::ok(RAW, data[..10].to_vec()));
    let err = must_fail(install(&installer(), &image_ref, &disk));
    assert!(
        matches!(
            err,
            InstallError::PayloadTruncated {
                expected: 50_000,
                received: 10,
                ..
            }
        ),
        "{err:?}"
    );

    // The connection closes before the declared length, every time.
    registry.route(
        &blob,
        Route::framed(200, data.clone(), Framing::Truncated(30_000)),
    );
    let err = must_fail(install(&installer(), &image_ref, &disk));
    assert!(
        matches!(err, InstallError::Registry(RegistryError::Transfer { .. })),
        "{err:?}"
    );
}

#[test]
fn a_broken_transfer_resumes_with_a_range() {
    for compression in [Compression::Raw, Compression::Zstd] {
        let registry = Registry::start();
        let data = image(3 * MIB + 777, 40);
        let pushed = registry.push_disk(&data, compression, CHUNK);
        let blob = pushed.blob_path(0);
        let cut = 1_234_567;
        registry.route(
            &blob,
            Route::Ranged {
                body: pushed.layers[0].clone(),
                cut: Some(cut),
            },
        );
        let dir = tempfile::tempdir().unwrap();
        let disk = dir.path().join("disk.img");
        install(
            &installer(),
            &registry.image_ref(&pushed.manifest_digest),
            &disk,
        )
        .0
        .unwrap();
        assert!(std::fs::read(&disk).unwrap() == data, "{compression:?}");
        let tries = blob_requests(&registry, &blob);
        let ranges: Vec<Option<&str>> = tries.iter().map(|s| s.range.as_deref()).collect();
        assert_eq!(
            ranges,
            [None, Some(format!("bytes={cut}-").as_str())],
            "{compression:?}"
        );
    }
}

#[test]
fn a_registry_ignoring_the_range_sends_it_all_again() {
    let registry = Registry::start();
    let data = image(2 * MIB + 5, 41);
    let pushed = registry.push_disk(&data, Compression::Raw, CHUNK);
    let blob = pushed.blob_path(0);
    registry.route(
        &blob,
        Route::Sequence(vec![
            Route::framed(200, data.clone(), Framing::Truncated(MIB + 3)),
            Route::ok(RAW, data.clone()),
        ]),
    );
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk.img");
    let image_ref = registry.image_ref(&pushed.manifest_digest);
    install(&installer(), &image_ref, &disk).0.unwrap();
    assert!(std::fs::read(&disk).unwrap() == data);
    let tries = blob_requests(&registry, &blob);
    assert_eq!(tries.len(), 2);
    assert_eq!(
        tries[1].range.as_deref(),
        Some(format!("bytes={}-", MIB + 3).as_str())
    );

    // A 206 from another byte than asked for is refused.
    let content_range = format!("bytes 0-{}/{}", data.len() - 1, data.len());
    registry.route(
        &blob,
        Route::Sequence(vec![
            Route::framed(200, data.clone(), Framing::Truncated(MIB + 3)),
            Route::Reply {
                status: 206,
                content_type: None,
                headers: vec![("Content-Range".into(), content_range)],
                body: data.clone(),
                framing: Framing::Length,
            },
        ]),
    );
    let err = must_fail(install(&installer(), &image_ref, &disk));
    assert!(
        matches!(err, InstallError::Registry(RegistryError::Protocol { .. })),
        "{err:?}"
    );
    assert!(
        err.to_string().contains(&format!(
            "asked for bytes from {}, the registry sent them from 0",
            MIB + 3
        )),
        "{err}"
    );
    // And one without a Content-Range.
    registry.route(
        &blob,
        Route::Sequence(vec![
            Route::framed(200, data.clone(), Framing::Truncated(MIB + 3)),
            Route::framed(206, data[MIB + 3..].to_vec(), Framing::Length),
        ]),
    );
    let err = must_fail(install(&installer(), &image_ref, &disk));
    assert!(
        err.to_string().contains("206 without a Content-Range"),
        "{err}"
    );
}

#[test]
fn passing_failures_are_tried_again_honouring_retry_after() {
    let registry = Registry::start();
    let data = image(100_000, 42);
    let pushed = registry.push_disk(&data, Compression::Raw, CHUNK);
    let busy = || Route::status(503, &[("Retry-After", "1")]);
    registry.route(
        &pushed.manifest_path(),
        Route::Sequence(vec![
            busy(),
            Route::ok(OCI_MANIFEST, pushed.manifest.clone()),
        ]),
    );
    registry.route(
        &pushed.blob_path(0),
        Route::Sequence(vec![
            busy(),
            Route::status(429, &[("Retry-After", "1")]),
            Route::ok(RAW, data.clone()),
        ]),
    );
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk.img");
    let image_ref = registry.image_ref(&pushed.manifest_digest);
    // A backoff of 10 ms, which Retry-After lengthens to 1 s, as the
    // reference does (the longer of the two): three waits.
    let patient = installer().with_retries(RetryPolicy {
        retries: 3,
        first_delay: Duration::from_millis(10),
        max_delay: Duration::from_millis(10),
    });
    let started = Instant::now();
    install(&patient, &image_ref, &disk).0.unwrap();
    let took = started.elapsed();
    assert!(std::fs::read(&disk).unwrap() == data);
    assert!(took >= Duration::from_secs(3), "took {took:?}");
    assert!(took < Duration::from_secs(20), "took {took:?}");
    assert_eq!(blob_requests(&registry, &pushed.manifest_path()).len(), 2);
    assert_eq!(blob_requests(&registry, &pushed.blob_path(0)).len(), 3);

    // A 503 that lasts: given up after the policy's retries.
    registry.route(&pushed.manifest_path(), busy());
    let before = blob_requests(&registry, &pushed.manifest_path()).len();
    let err = must_fail(install(&installer(), &image_ref, &disk));
    assert!(
        matches!(
            err,
            InstallError::Registry(RegistryError::Status { status: 503, .. })
        ),
        "{err:?}"
    );
    let tries = blob_requests(&registry, &pushed.manifest_path()).len() - before;
    assert_eq!(tries, 1 + fast_retries().retries as usize);

    // A 501 is not tried again, nor is a 404.
    for status in [501, 404] {
        registry.route(&pushed.manifest_path(), Route::status(status, &[]));
        let before = blob_requests(&registry, &pushed.manifest_path()).len();
        must_fail(install(&installer(), &image_ref, &disk));
        let tries = blob_requests(&registry, &pushed.manifest_path()).len() - before;
        assert_eq!(tries, 1, "{status}");
    }
}

#[test]
fn a_manifest_or_config_cut_short_is_fetched_again() {
    let registry = Registry::start();
    let data = image(50_000, 44);
    let pushed = registry.push_disk(&data, Compression::Raw, CHUNK);
    // Each declares its whole length and breaks off after 10 bytes, once.
    for (path, body, media_type) in [
        (
            pushed.manifest_path(),
            pushed.manifest.clone(),
            OCI_MANIFEST,
        ),
        (
            pushed.config_path(),
            pushed.config.clone(),
            CONFIG_MEDIA_TYPE,
        ),
    ] {
        registry.route(
            &path,
            Route::Sequence(vec![
                Route::framed(200, body.clone(), Framing::Truncated(10)),
                Route::ok(media_type, body),
            ]),
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk.img");
    install(
        &installer(),
        &registry.image_ref(&pushed.manifest_digest),
        &disk,
    )
    .0
    .unwrap();
    assert!(std::fs::read(&disk).unwrap() == data);
    assert_eq!(blob_requests(&registry, &pushed.manifest_path()).len(), 2);
    assert_eq!(blob_requests(&registry, &pushed.config_path()).len(), 2);

    // Without retries, the break is the error.
    registry.route(
        &pushed.manifest_path(),
        Route::framed(200, pushed.manifest.clone(), Framing::Truncated(10)),
    );
    let once = installer().with_retries(RetryPolicy {
        retries: 0,
        ..fast_retries()
    });
    let err = must_fail(install(
        &once,
        &registry.image_ref(&pushed.manifest_digest),
        &disk,
    ));
    assert!(
        matches!(err, InstallError::Registry(RegistryError::Transfer { .. })),
        "{err:?}"
    );
}

#[test]
fn an_embedded_config_is_used_without_a_request() {
    let registry = Registry::start();
    let data = image(70_000, 43);
    let config = os_config("1", &[payload_config("disk", &data, 4096)]);
    let manifest = os_manifest(DISK_ARTIFACT, &config, true, &[descriptor(RAW, &data)]);
    let pushed = registry.push_manifest(manifest, config, false, vec![data.clone()]);
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk.img");
    install(
        &installer(),
        &registry.image_ref(&pushed.manifest_digest),
        &disk,
    )
    .0
    .unwrap();
    assert!(std::fs::read(&disk).unwrap() == data);
    assert!(
        registry
            .seen()
            .iter()
            .all(|s| s.path != pushed.config_path()),
        "{:?}",
        registry.seen()
    );
}

#[test]
fn a_config_that_is_not_its_digest_is_refused() {
    let registry = Registry::start();
    let data = image(70_000, 44);
    let pushed = registry.push_disk(&data, Compression::Raw, 4096);
    // Served under its digest: another config (of other chunk hashes).
    let other = os_config("1", &[payload_config("disk", &image(70_000, 45), 4096)]);
    assert_eq!(other.len(), pushed.config.len());
    registry.route(&pushed.config_path(), Route::ok(RAW, other.clone()));
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk.img");
    let err = must_fail(install(
        &installer(),
        &registry.image_ref(&pushed.manifest_digest),
        &disk,
    ));
    assert!(matches!(err, InstallError::InvalidImage { .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains(&pushed.config_digest), "{text}");
    assert!(text.contains(&sha256(&other)), "{text}");
    assert!(
        !disk.exists(),
        "nothing is written before the config verified"
    );

    // Embedded in the descriptor: the same.
    let manifest = os_manifest(
        DISK_ARTIFACT,
        &pushed.config,
        true,
        &[descriptor(RAW, &data)],
    );
    let manifest = String::from_utf8(manifest)
        .unwrap()
        .replace(&base64_of(&pushed.config), &base64_of(&other));
    let forged = registry.push_manifest(
        manifest.into_bytes(),
        pushed.config.clone(),
        false,
        vec![data.clone()],
    );
    let err = must_fail(install(
        &installer(),
        &registry.image_ref(&forged.manifest_digest),
        &disk,
    ));
    assert!(matches!(err, InstallError::InvalidImage { .. }), "{err:?}");
    assert!(err.to_string().contains(&sha256(&other)), "{err}");
    assert!(!disk.exists());
}

fn base64_of(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[test]
fn configs_that_do_not_describe_the_image_are_refused() {
    let data = image(10_000, 46);
    let hashes = chunk_hashes(&data, 1000);
    let disk_entry = payload_config("disk", &data, 1000);
    // The config, the layers (media type, bytes), what the error says.
    type Case = (Vec<u8>, Vec<(&'static str, Vec<u8>)>, &'static str);
    let cases: Vec<Case> = vec![
        (
            os_config("2", std::slice::from_ref(&disk_entry)),
            vec![(RAW, data.clone())],
            "config: format_version is \"2\"; this agent reads version \"1\"",
        ),
        (
            os_config("1", &[payload_entry("disk", 10_000, 1000, &hashes[..9])]),
            vec![(RAW, data.clone())],
            "payloads[0].chunk_hashes_sha256: 9 hashes for 10000 bytes in chunks of 1000; \
             expected 10",
        ),
        (
            os_config("1", std::slice::from_ref(&disk_entry)),
            vec![(RAW, data.clone()), (RAW, data.clone())],
            "the config has 1 payloads and the manifest 2 layers",
        ),
        (
            os_config("1", &[payload_config("system", &data, 1000)]),
            vec![(RAW, data.clone())],
            "a whole-disk image has exactly one payload, disk; it has system",
        ),
        (
            os_config(
                "1",
                &[disk_entry.clone(), payload_config("extra", b"x", 1000)],
            ),
            vec![(RAW, data.clone()), (RAW, b"x".to_vec())],
            "a whole-disk image has exactly one payload, disk; it has disk, extra",
        ),
    ];
    let registry = Registry::start();
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk.img");
    for (config, layers, expected) in cases {
        let pushed = registry.push_image(DISK_ARTIFACT, config, &layers);
        let err = must_fail(install(
            &installer(),
            &registry.image_ref(&pushed.manifest_digest),
            &disk,
        ));
        assert!(
            matches!(err, InstallError::InvalidImage { .. }),
            "{expected}: {err:?}"
        );
        assert!(
            err.to_string().contains(expected),
            "{err} lacks {expected:?}"
        );
        assert!(!disk.exists(), "{expected}: the device was touched");
        let fetched = registry.seen();
        assert!(
            fetched.iter().all(|s| !pushed
                .layer_digests
                .iter()
                .any(|d| s.path.ends_with(d.as_str()))),
            "{expected}: a payload was fetched"
        );
    }
}

#[test]
fn an_unknown_layer_media_type_is_named() {
    let registry = Registry::start();
    let data = image(1000, 47);
    let pushed = registry.push_image(
        DISK_ARTIFACT,
        os_config("1", &[payload_config("disk", &data, 1000)]),
        &[("application/gzip", data.clone())],
    );
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk.img");
    let err = must_fail(install(
        &installer(),
        &registry.image_ref(&pushed.manifest_digest),
        &disk,
    ));
    assert!(matches!(err, InstallError::Unsupported { .. }), "{err:?}");
    assert!(
        err.to_string()
            .contains("layers[0].mediaType \"application/gzip\""),
        "{err}"
    );
    assert!(!disk.exists());
}

#[test]
fn a_metropolis_image_is_checked_before_the_device_is_touched() {
    let registry = Registry::start();
    let kernel = image(5000, 48);
    let system = image(20_000, 49);
    let whole = registry.push_metropolis(&kernel, &system, Compression::Zstd, 4096);
    let without_system = registry.push_payloads(
        METROPOLIS_ARTIFACT,
        &[("kernel.efi", &kernel)],
        Compression::Raw,
        4096,
    );
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk.img");
    // A firmware directory that exists: the machine "booted with EFI".
    let firmware = dir.path().join("efi");
    std::fs::create_dir(&firmware).unwrap();
    let efi = installer().with_metropolis(MetropolisOptions {
        firmware_dir: firmware.clone(),
        efivars_dir: firmware.join("efivars"),
        network_config: None,
    });

    // The image is fetched and verified first.
    let (result, reports) = install(&efi, &registry.image_ref(&whole.manifest_digest), &disk);
    assert_eq!(
        reports.first(),
        Some(&Progress::Image {
            kind: ImageKind::Metropolis,
            payloads: vec![
                ("kernel.efi".to_string(), 5000, true),
                ("system".to_string(), 20_000, true),
            ],
        })
    );
    // Then the agent's loader; then the image's payloads; then the disk
    // (20 KB take no A/B layout).
    let err = result.unwrap_err();
    if cfg!(feature = "loader") {
        assert!(
            matches!(err, InstallError::DeviceUnusable { .. }),
            "{err:?}"
        );
    } else {
        assert!(matches!(err, InstallError::Unbootable { .. }), "{err:?}");
        assert!(err.to_string().contains("without the A/B loader"), "{err}");
    }
    let err = must_fail(install(
        &efi,
        &registry.image_ref(&without_system.manifest_digest),
        &disk,
    ));
    if cfg!(feature = "loader") {
        assert!(matches!(err, InstallError::InvalidImage { .. }), "{err:?}");
        assert!(
            err.to_string().contains("it has no system payload"),
            "{err}"
        );
    } else {
        assert!(matches!(err, InstallError::Unbootable { .. }), "{err:?}");
    }
    // A machine not booted with EFI is refused either way.
    let not_efi = installer().with_metropolis(MetropolisOptions {
        firmware_dir: dir.path().join("no-efi"),
        efivars_dir: dir.path().join("no-efi/efivars"),
        network_config: None,
    });
    let err = must_fail(install(
        &not_efi,
        &registry.image_ref(&without_system.manifest_digest),
        &disk,
    ));
    assert!(matches!(err, InstallError::Unbootable { .. }), "{err:?}");
    assert!(!disk.exists() || std::fs::metadata(&disk).unwrap().len() == 0);
    // No payload was fetched.
    assert!(registry.seen().iter().all(|s| {
        !whole
            .layer_digests
            .iter()
            .chain(&without_system.layer_digests)
            .any(|d| s.path.ends_with(d.as_str()))
    }));
}

/// An installer of Metropolis images on a machine "booted with EFI": its
/// firmware directory and efivars under `dir`.
#[cfg(feature = "loader")]
fn efi_installer(dir: &Path) -> OciInstaller {
    let firmware = dir.join("efi");
    std::fs::create_dir_all(firmware.join("efivars")).unwrap();
    installer().with_metropolis(MetropolisOptions {
        firmware_dir: firmware.clone(),
        efivars_dir: firmware.join("efivars"),
        network_config: None,
    })
}

/// A sparse 9 GiB disk in `dir` (large enough for the layout) whose
/// first 4 KiB are 0xaa; its path and the open file.
#[cfg(feature = "loader")]
fn marked_disk(dir: &Path) -> (std::path::PathBuf, std::fs::File) {
    let disk = dir.join("disk.img");
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&disk)
        .unwrap();
    file.set_len(9 << 30).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&file, &[0xaa; 4096], 0).unwrap();
    (disk, file)
}

/// Payloads larger than their places are refused from the config's
/// sizes, before any payload is fetched or the device touched: a
/// `kernel.efi` over [`MAX_KERNEL_BYTES`] (it must fit the ESP) and a
/// `system` larger than slot A.
#[cfg(feature = "loader")]
#[test]
fn oversized_payloads_are_refused_before_the_device_is_touched() {
    use bmaas_agent::install::MAX_KERNEL_BYTES;
    const MIB16: u64 = 16 << 20;
    let registry = Registry::start();
    let dir = tempfile::tempdir().unwrap();
    let efi = efi_installer(dir.path());
    let (disk, file) = marked_disk(dir.path());
    // Entries claiming sizes (with as many chunk hashes as they need);
    // the layers are small and never asked for.
    let entry = |name: &str, size: u64| {
        let hashes = vec![chunk_hashes(b"x", 1)[0].clone(); size.div_ceil(MIB16) as usize];
        payload_entry(name, size, MIB16, &hashes)
    };
    let (blob_k, blob_s) = (
        Compression::Zstd.layer(b"k").1,
        Compression::Zstd.layer(b"s").1,
    );
    let cases = [
        (
            entry("kernel.efi", MAX_KERNEL_BYTES + 1),
            entry("system", 1),
            format!("at most {MAX_KERNEL_BYTES} fit the ESP"),
        ),
        (
            entry("kernel.efi", 1),
            entry("system", (4 << 30) + 1),
            "larger than the 4294967296 bytes of METROPOLIS-SYSTEM-A".to_string(),
        ),
    ];
    for (kernel, system, expected) in cases {
        let config = os_config("1", &[kernel, system]);
        let manifest = os_manifest(
            METROPOLIS_ARTIFACT,
            &config,
            true,
            &[descriptor(ZSTD, &blob_k), descriptor(ZSTD, &blob_s)],
        );
        let pushed = registry.push_manifest(
            manifest,
            config,
            false,
            vec![blob_k.clone(), blob_s.clone()],
        );
        let err = must_fail(install(
            &efi,
            &registry.image_ref(&pushed.manifest_digest),
            &disk,
        ));
        assert!(err.to_string().contains(&expected), "{err}");
        let mut head = [0u8; 4096];
        std::os::unix::fs::FileExt::read_exact_at(&file, &mut head, 0).unwrap();
        assert!(head.iter().all(|b| *b == 0xaa), "the disk was touched");
        assert_eq!(std::fs::metadata(&disk).unwrap().len(), 9 << 30);
        assert!(
            registry.seen().iter().all(|s| !pushed
                .layer_digests
                .iter()
                .any(|d| s.path.ends_with(d.as_str()))),
            "a payload was fetched"
        );
    }
}

/// `kernel.efi` is streamed into the ESP, each chunk verified before it
/// is written: a registry serving one wrong chunk of it fails the install
/// naming that chunk, and no sector of the ESP holds the bad bytes; the
/// disk is left unbootable (its head zeroed). With the right kernel the
/// same disk installs, the kernel on the ESP whole.
#[cfg(feature = "loader")]
#[test]
fn a_bad_kernel_chunk_is_named_and_never_reaches_the_esp() {
    const ESP: std::ops::Range<u64> = (1 << 20)..(385 << 20);
    let registry = Registry::start();
    let kernel = image(40_000, 50);
    let system = image(9_000, 51);
    let pushed = registry.push_metropolis(&kernel, &system, Compression::Raw, 4096);
    let mut tampered = kernel.clone();
    tampered[10_000] ^= 0xff;
    registry.route(&pushed.blob_path(0), Route::ok(RAW, tampered.clone()));
    let dir = tempfile::tempdir().unwrap();
    let efi = efi_installer(dir.path());
    let (disk, file) = marked_disk(dir.path());

    let image_ref = registry.image_ref(&pushed.manifest_digest);
    let err = must_fail(install(&efi, &image_ref, &disk));
    assert!(
        matches!(err, InstallError::ChunkMismatch { chunk: 2, .. }),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("payload kernel.efi: chunk 2"),
        "{err}"
    );
    let esp = |file: &std::fs::File| {
        let mut bytes = vec![0u8; (ESP.end - ESP.start) as usize];
        std::os::unix::fs::FileExt::read_exact_at(file, &mut bytes, ESP.start).unwrap();
        bytes
    };
    // The 512-byte sector of the bad chunk holding the changed byte.
    let bad = &tampered[9728..10_240];
    assert!(
        !esp(&file).chunks(512).any(|sector| sector == bad),
        "a bad kernel sector reached the ESP"
    );
    let mut head = [0u8; 4096];
    std::os::unix::fs::FileExt::read_exact_at(&file, &mut head, 0).unwrap();
    assert!(
        head.iter().all(|b| *b == 0),
        "the disk's head was not cleared"
    );

    // Fixed: the same disk installs; the whole kernel is on the ESP (its
    // clusters in order: a freshly formatted FAT allocates them so).
    registry.route(&pushed.blob_path(0), Route::ok(RAW, kernel.clone()));
    install(&efi, &image_ref, &disk).0.unwrap();
    let on_esp = esp(&file);
    assert!(
        on_esp
            .windows(kernel.len())
            .step_by(512)
            .any(|w| w == kernel.as_slice()),
        "the kernel is not on the ESP"
    );
}

#[test]
fn chunked_and_close_delimited_blobs_are_written() {
    for framing in [Framing::Chunked, Framing::Close] {
        let registry = Registry::start();
        let data = image(700_001, 2);
        let (digest, layer_digest) = registry.push(&data);
        registry.route(
            &format!("/v2/{REPO}/blobs/{layer_digest}"),
            Route::Reply {
                status: 200,
                content_type: None,
                headers: Vec::new(),
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
    let (digest, _) = registry.push(&data);
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk.img");
    std::fs::write(&disk, vec![0xff; 1_000_000]).unwrap();
    install(&installer(), &registry.image_ref(&digest), &disk)
        .0
        .unwrap();
    assert!(std::fs::read(&disk).unwrap() == data);
}

#[test]
fn a_regular_file_is_written_only_when_image_files_are_allowed() {
    let registry = Registry::start();
    let data = image(100_000, 12);
    let (digest, _) = registry.push(&data);
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

#[test]
fn a_missing_layer_is_reported() {
    let registry = Registry::start();
    let pushed = registry.push_disk(&image(1000, 10), Compression::Raw, CHUNK);
    registry.routes.lock().unwrap().remove(&pushed.blob_path(0));
    let dir = tempfile::tempdir().unwrap();
    let err = must_fail(install(
        &installer(),
        &registry.image_ref(&pushed.manifest_digest),
        &dir.path().join("disk.img"),
    ));
    assert!(matches!(err, InstallError::LayerNotFound { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        format!(
            "image layer not found: {}/{REPO}@{} (payload disk)",
            registry.host(),
            pushed.layer_digest()
        )
    );
}

#[test]
fn unusable_manifests_are_refused() {
    let registry = Registry::start();
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk.img");
    let config = os_config("1", &[payload_config("disk", b"x", 1)]);
    let layer = descriptor(RAW, b"x");
    let os_image = String::from_utf8(os_manifest(
        DISK_ARTIFACT,
        &config,
        true,
        std::slice::from_ref(&layer),
    ))
    .unwrap();
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (b"not json".to_vec(), "invalid manifest"),
        (
            br#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[]}"#
                .to_vec(),
            "is an image index without a linux/",
        ),
        (
            br#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","layers":[]}"#
                .to_vec(),
            "unsupported: ",
        ),
        (
            br#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","layers":[]}"#
                .to_vec(),
            "artifactType missing is not an OS image",
        ),
        // The media type is required, not taken from the Content-Type.
        (
            os_image
                .replace(&format!("\"mediaType\": \"{OCI_MANIFEST}\",\n"), "")
                .into_bytes(),
            "mediaType is missing",
        ),
        // A container image is not an OS image.
        (
            os_image
                .replace(
                    &format!("\"artifactType\": \"{DISK_ARTIFACT}\",\n"),
                    "",
                )
                .replace(CONFIG_MEDIA_TYPE, "application/vnd.oci.image.config.v1+json")
                .into_bytes(),
            "artifactType missing",
        ),
        (
            os_image
                .replace(DISK_ARTIFACT, "application/vnd.example.other+type")
                .into_bytes(),
            "artifactType \"application/vnd.example.other+type\" is not an OS image",
        ),
        (
            os_image
                .replace(CONFIG_MEDIA_TYPE, "application/vnd.oci.image.config.v1+json")
                .into_bytes(),
            "config.mediaType \"application/vnd.oci.image.config.v1+json\"",
        ),
        (
            os_image.replace("\"schemaVersion\": 2", "\"schemaVersion\": 1").into_bytes(),
            "schemaVersion",
        ),
    ];
    for (body, expected) in cases {
        let digest = sha256(&body);
        registry.route(
            &format!("/v2/{REPO}/manifests/{digest}"),
            Route::ok(OCI_MANIFEST, body),
        );
        let err = must_fail(install(&installer(), &registry.image_ref(&digest), &disk));
        assert!(
            err.to_string().contains(expected),
            "{err} lacks {expected:?}"
        );
        assert!(!disk.exists());
    }
    // Larger than 50 MiB: refused by its Content-Length.
    let huge = format!("{os_image}{}", " ".repeat(50 << 20));
    let digest = sha256(huge.as_bytes());
    registry.route(
        &format!("/v2/{REPO}/manifests/{digest}"),
        Route::ok(OCI_MANIFEST, huge.into_bytes()),
    );
    let err = must_fail(install(&installer(), &registry.image_ref(&digest), &disk));
    assert!(
        err.to_string().contains("larger than 52428800 bytes"),
        "{err}"
    );
    assert!(!disk.exists());
    // The unmodified manifest is fine: the cases fail for their change;
    // and so is one of 5 MiB (trailing whitespace is JSON).
    let large = format!("{os_image}{}", " ".repeat(5 << 20));
    for manifest in [os_image.clone(), large] {
        registry.push_manifest(
            manifest.clone().into_bytes(),
            config.clone(),
            false,
            vec![b"x".to_vec()],
        );
        install(
            &installer(),
            &registry.image_ref(&sha256(manifest.as_bytes())),
            &disk,
        )
        .0
        .unwrap();
        assert_eq!(std::fs::read(&disk).unwrap(), b"x");
    }
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
            headers: Vec::new(),
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
        matches!(
            err,
            InstallError::Registry(RegistryError::Status { status: 401, .. })
        ),
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
    assert!(
        matches!(
            err,
            InstallError::Registry(RegistryError::Unreachable { .. })
        ),
        "{err:?}"
    );
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
    let (digest, layer_digest) = registry.push(&data);
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
    storage.route("/bucket/blob", Route::ok(RAW, data.clone()));
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
    assert!(
        matches!(err, InstallError::Registry(RegistryError::Protocol { .. })),
        "{err:?}"
    );
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
    let (digest, _) = registry.push(&data);
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
    assert!(
        matches!(err, InstallError::Registry(RegistryError::Tls { .. })),
        "{err:?}"
    );
    assert!(err.to_string().contains("certificate"), "{err}");
}

#[test]
fn a_missing_device_under_dev_is_not_created() {
    let registry = Registry::start();
    let (digest, _) = registry.push(&image(1000, 13));
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
    let (digest, _) = registry.push(&image(1000, 14));
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
struct Recorder(Mutex<Vec<(OsImageRef, Target)>>);

impl Installer for Recorder {
    fn install(
        &self,
        image: &OsImageRef,
        target: &Target,
        _progress: &mut dyn FnMut(&Progress),
    ) -> Result<(), InstallError> {
        self.0.lock().unwrap().push((image.clone(), target.clone()));
        Ok(())
    }
}

/// What a [`Recorder`] was asked: the image, the root device and the
/// node parameters.
fn recorded(recorder: &Recorder) -> Vec<(OsImageRef, std::path::PathBuf, Option<NodeParameters>)> {
    recorder
        .0
        .lock()
        .unwrap()
        .iter()
        .map(|(image, target)| {
            (
                image.clone(),
                target.root_device.clone(),
                target.node_parameters.clone(),
            )
        })
        .collect()
}

/// An image reference for requests that are checked and dispatched to a
/// recording installer, never fetched.
fn unfetched_image() -> OsImageRef {
    OsImageRef {
        scheme: "http".into(),
        host: "127.0.0.1:5000".into(),
        repository: REPO.into(),
        tag: String::new(),
        digest: sha256(b"x"),
    }
}

#[test]
fn node_parameters_reach_the_installer_as_they_were_sent() {
    let recorder = Recorder(Mutex::new(Vec::new()));
    // A NodeParameters with a field this agent does not know (99, "new")
    // beside network_config (4, empty): as a newer cluster may send.
    let parameters = [0x22, 0x00, 0x9a, 0x06, 0x03, b'n', b'e', b'w'];
    let image = unfetched_image().encode_to_vec();
    // MetropolisInstallationRequest: node_parameters (2), root_device
    // (3), os_image (4); OSInstallationRequest: generation (1),
    // metropolis (2).
    let mut metropolis = vec![0x12, parameters.len() as u8];
    metropolis.extend_from_slice(&parameters);
    metropolis.extend_from_slice(&[0x1a, 0x03, b's', b'd', b'a']);
    metropolis.extend_from_slice(&[0x22, image.len() as u8]);
    metropolis.extend_from_slice(&image);
    let mut request = vec![0x08, 0x05, 0x12, metropolis.len() as u8];
    request.extend_from_slice(&metropolis);
    install_encoded_request(&recorder, &request, &mut |_: &Progress| {}).unwrap();
    let recorded = recorder.0.lock().unwrap();
    let (_, target) = &recorded[0];
    assert_eq!(
        target.node_parameters_encoded.as_deref(),
        Some(&parameters[..])
    );
    assert!(
        target
            .node_parameters
            .as_ref()
            .unwrap()
            .network_config
            .is_some()
    );
    // A request made in process has no encoded parameters.
    drop(recorded);
    let decoded = OsInstallationRequest::decode(request.as_slice()).unwrap();
    install_request(&recorder, &decoded, &mut |_: &Progress| {}).unwrap();
    assert_eq!(
        recorder.0.lock().unwrap()[1].1.node_parameters_encoded,
        None
    );
}

#[test]
fn whole_requests_are_checked_and_dispatched() {
    let recorder = Recorder(Mutex::new(Vec::new()));
    let image = unfetched_image();
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
    // The node parameters go with the root device.
    let parameters = NodeParameters {
        network_config: Some(Default::default()),
        cluster: None,
    };
    let mut with_parameters = request("/dev/disk/by-id/x", Some(image.clone()));
    if let Some(os_installation_request::Type::Metropolis(metropolis)) = &mut with_parameters.r#type
    {
        metropolis.node_parameters = Some(parameters.clone());
    }
    install_encoded_request(&recorder, &with_parameters.encode_to_vec(), &mut progress).unwrap();
    assert_eq!(
        recorded(&recorder),
        vec![
            (image.clone(), "/dev/nvme0n1".into(), None),
            (image.clone(), "/dev/disk/by-id/x".into(), Some(parameters)),
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
