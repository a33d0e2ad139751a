//! `bmaas_agent::install` against registries as they are in the field,
//! played by the in-test registry (`fake_registry`): Basic logins over
//! https, the Docker token flow (with a login and anonymously), logins
//! refused in the clear, Authorization kept from other hosts, https-only
//! cross-host redirects, image indexes, a registry dripping the layer
//! slower than the request deadline, and one breaking off every transfer
//! or asking to come back later than the installation's limit. The same against Debian's
//! `docker-registry` with TLS, htpasswd and token auth, end to end:
//! `tests/tests/agent_registries.rs`.

#![allow(clippy::unwrap_used)]

mod fake_registry;

use std::time::{Duration, Instant};

use base64::Engine as _;
use bmaas_agent::install::{
    GUARD_BYTES, InstallError, Platform, RegistryCredentials, RegistryError,
};
use fake_registry::*;
use metropolis_proto::prelude::debug::OsImageRef;

fn basic(user: &str, password: &str) -> String {
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
    )
}

fn https(image: OsImageRef) -> OsImageRef {
    OsImageRef {
        scheme: "https".into(),
        ..image
    }
}

fn logins(registry: &str, user: &str, password: &str) -> RegistryCredentials {
    let json = format!(
        r#"{{"auths": {{"{registry}": {{"auth": "{}"}}}}}}"#,
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
    );
    RegistryCredentials::from_docker_config(json.as_bytes()).unwrap()
}

#[test]
fn basic_logins_go_over_https_only() {
    let (tls, cert) = tls_server();
    let registry = Registry::start_with(Some(tls));
    let data = image(200_000, 21);
    let (digest, _) = registry.push(&data);
    registry.require(Some(Gate {
        authorization: basic("op", "s3cret"),
        challenge: r#"Basic realm="Registry Realm""#.into(),
    }));
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk.img");
    let image = https(registry.image_ref(&digest));
    let tls = client_trusting(&cert);

    // No login for the registry: the report says what is missing.
    let anonymous = installer().with_tls(tls.clone());
    let err = must_fail(install(&anonymous, &image, &disk));
    assert!(
        matches!(
            err,
            InstallError::Registry(RegistryError::Unauthorized { .. })
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("--registry-auth"), "{err}");

    // A wrong password is refused, naming the user, not the password.
    let wrong =
        installer()
            .with_tls(tls.clone())
            .with_credentials(logins(&registry.host(), "op", "guess"));
    let err = must_fail(install(&wrong, &image, &disk));
    assert!(
        err.to_string().contains("refused the login of user \"op\""),
        "{err}"
    );
    assert!(!err.to_string().contains("guess"), "{err}");

    let right =
        installer()
            .with_tls(tls)
            .with_credentials(logins(&registry.host(), "op", "s3cret"));
    install(&right, &image, &disk).0.unwrap();
    assert!(std::fs::read(&disk).unwrap() == data);
    // The challenge is answered once; the layer is fetched logged in.
    let seen = registry.seen();
    let layer = seen.iter().rfind(|s| s.path.contains("/blobs/")).unwrap();
    assert_eq!(
        layer.authorization.as_deref(),
        Some(basic("op", "s3cret").as_str())
    );

    // The same registry in the clear: the password is not sent.
    let plain = Registry::start();
    let (digest, _) = plain.push(&data);
    plain.require(Some(Gate {
        authorization: basic("op", "s3cret"),
        challenge: r#"Basic realm="x""#.into(),
    }));
    let clear = installer().with_credentials(logins(&plain.host(), "op", "s3cret"));
    let err = must_fail(install(&clear, &plain.image_ref(&digest), &disk));
    assert!(err.to_string().contains("over https only"), "{err}");
    assert!(plain.seen().iter().all(|s| s.authorization.is_none()));
}

#[test]
fn the_docker_token_flow_with_a_login_and_anonymously() {
    let (tls, cert) = tls_server();
    let registry = Registry::start_with(Some(tls.clone()));
    let tokens = Registry::start_with(Some(tls));
    let data = image(150_000, 22);
    let (digest, layer_digest) = registry.push(&data);
    let challenge = format!(
        r#"Bearer realm="https://{}/token",service="fake-registry",scope="repository:{REPO}:pull""#,
        tokens.host()
    );
    registry.require(Some(Gate {
        authorization: "Bearer t0ken".into(),
        challenge: challenge.clone(),
    }));
    tokens.route(
        "/token",
        Route::Token {
            expect: Some(basic("robot", "pw")),
            token: "t0ken".into(),
        },
    );
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk.img");
    let image = https(registry.image_ref(&digest));
    let tls = client_trusting(&cert);

    let logged_in =
        installer()
            .with_tls(tls.clone())
            .with_credentials(logins(&registry.host(), "robot", "pw"));
    install(&logged_in, &image, &disk).0.unwrap();
    assert!(std::fs::read(&disk).unwrap() == data);
    let asked = tokens.seen();
    assert_eq!(asked.len(), 1, "one token for the whole install: {asked:?}");
    assert_eq!(
        asked[0].path,
        "/token?service=fake-registry&scope=repository%3Aos%2Fmetropolis%3Apull"
    );
    assert_eq!(
        asked[0].authorization.as_deref(),
        Some(basic("robot", "pw").as_str())
    );
    // The registry never sees the password, only the token.
    assert!(registry.seen().iter().all(|s| {
        s.authorization
            .as_deref()
            .is_none_or(|a| a == "Bearer t0ken")
    }));

    // The token server refuses: the report says who refused whom.
    let wrong = installer().with_tls(tls.clone()).with_credentials(logins(
        &registry.host(),
        "robot",
        "nope",
    ));
    let err = must_fail(install(&wrong, &image, &disk));
    assert!(
        matches!(
            err,
            InstallError::Registry(RegistryError::Unauthorized { .. })
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("token server"), "{err}");

    // Anonymous tokens (public images): no login needed.
    tokens.route(
        "/token",
        Route::Token {
            expect: None,
            token: "t0ken".into(),
        },
    );
    install(&installer().with_tls(tls), &image, &disk)
        .0
        .unwrap();

    // The Authorization header stays with the registry: a redirect of the
    // layer to storage elsewhere goes without it.
    let (storage_tls, storage_cert) = tls_server();
    let storage = Registry::start_with(Some(storage_tls));
    storage.route("/blob", Route::ok(RAW, data.clone()));
    registry.route(
        &format!("/v2/{REPO}/blobs/{layer_digest}"),
        Route::Redirect {
            status: 307,
            location: format!("https://{}/blob", storage.host()),
        },
    );
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.der().clone()).unwrap();
    roots.add(storage_cert.der().clone()).unwrap();
    let both = std::sync::Arc::new(
        rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth(),
    );
    install(&installer().with_tls(both), &image, &disk)
        .0
        .unwrap();
    assert!(std::fs::read(&disk).unwrap() == data);
    let fetched = storage.seen();
    assert_eq!(fetched.len(), 1);
    assert_eq!(fetched[0].authorization, None);
}

#[test]
fn redirects_never_go_down_to_http() {
    let (tls, cert) = tls_server();
    let registry = Registry::start_with(Some(tls));
    let data = image(10_000, 23);
    let (digest, layer_digest) = registry.push(&data);
    registry.route(
        &format!("/v2/{REPO}/blobs/{layer_digest}"),
        Route::Redirect {
            status: 302,
            location: format!("http://{}/blob", registry.host()),
        },
    );
    let dir = tempfile::tempdir().unwrap();
    let err = must_fail(install(
        &installer().with_tls(client_trusting(&cert)),
        &https(registry.image_ref(&digest)),
        &dir.path().join("disk.img"),
    ));
    assert!(err.to_string().contains("only https is followed"), "{err}");
}

/// Serves an index of `platforms` (each a whole-disk image of its own
/// bytes); the index's digest and each platform's image.
fn push_index(registry: &Registry, platforms: &[&str]) -> (String, Vec<Vec<u8>>) {
    let mut entries = Vec::new();
    let mut images = Vec::new();
    for (i, platform) in platforms.iter().enumerate() {
        let data = image(50_000 + i, 30 + i as u64);
        let pushed = registry.push_disk(&data, Compression::Raw, CHUNK);
        let (os, architecture) = platform.split_once('/').unwrap();
        entries.push(format!(
            r#"{{"mediaType":"{OCI_MANIFEST}","digest":"{}","size":{},"platform":{{"os":"{os}","architecture":"{architecture}"}}}}"#,
            pushed.manifest_digest,
            pushed.manifest.len()
        ));
        images.push(data);
    }
    let index = format!(
        r#"{{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{}]}}"#,
        entries.join(",")
    );
    let digest = sha256(index.as_bytes());
    registry.route(
        &format!("/v2/{REPO}/manifests/{digest}"),
        Route::ok(
            "application/vnd.oci.image.index.v1+json",
            index.into_bytes(),
        ),
    );
    (digest, images)
}

fn platform(architecture: &str) -> Platform {
    Platform {
        os: "linux".into(),
        architecture: architecture.into(),
        variant: None,
    }
}

#[test]
fn image_indexes_give_the_agents_platform() {
    let registry = Registry::start();
    let (digest, images) = push_index(&registry, &["linux/arm64", "linux/amd64"]);
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk.img");
    for (architecture, image) in [("arm64", &images[0]), ("amd64", &images[1])] {
        let installer = installer().with_platform(platform(architecture));
        install(&installer, &registry.image_ref(&digest), &disk)
            .0
            .unwrap();
        assert!(&std::fs::read(&disk).unwrap() == image, "{architecture}");
    }
    // By default, the agent's own.
    let own = Platform::host();
    let expected = match own.architecture.as_str() {
        "arm64" => &images[0],
        _ => &images[1],
    };
    install(&installer(), &registry.image_ref(&digest), &disk)
        .0
        .unwrap();
    assert!(&std::fs::read(&disk).unwrap() == expected);

    // An index without the platform: the report lists what there is, and
    // nothing is written.
    std::fs::write(&disk, b"old").unwrap();
    let err = must_fail(install(
        &installer().with_platform(platform("riscv64")),
        &registry.image_ref(&digest),
        &disk,
    ));
    assert!(
        matches!(err, InstallError::PlatformNotFound { .. }),
        "{err:?}"
    );
    assert!(
        err.to_string().ends_with(
            "is an image index without a linux/riscv64 image (it has: linux/arm64, linux/amd64)"
        ),
        "{err}"
    );
    assert_eq!(std::fs::read(&disk).unwrap(), b"old");
}

#[test]
fn a_dripping_registry_fails_at_the_deadline_and_leaves_no_bootable_head() {
    let registry = Registry::start();
    let data = image(3 * GUARD_BYTES as usize, 24);
    let (digest, layer_digest) = registry.push(&data);
    let blob = format!("/v2/{REPO}/blobs/{layer_digest}");
    // Past the head, 100 bytes every 20 ms: each read gets bytes long
    // before the 10 s socket timeout, but the whole would take hours.
    registry.route(
        &blob,
        Route::Reply {
            status: 200,
            content_type: Some(RAW.into()),
            headers: Vec::new(),
            body: data.clone(),
            framing: Framing::Drip {
                fast: 2 * GUARD_BYTES as usize,
                chunk: 100,
                pause: Duration::from_millis(20),
            },
        },
    );
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk.img");
    std::fs::write(&disk, vec![0xaa; data.len()]).unwrap();
    let strict = installer().with_deadline(Duration::from_secs(2));
    let started = Instant::now();
    let err = must_fail(install(&strict, &registry.image_ref(&digest), &disk));
    let took = started.elapsed();
    assert!(
        matches!(err, InstallError::Registry(RegistryError::Transfer { .. })),
        "{err:?}"
    );
    assert!(err.to_string().contains("request deadline of 2 s"), "{err}");
    assert!(took < Duration::from_secs(6), "took {took:?}");
    let tries: Vec<_> = registry
        .seen()
        .into_iter()
        .filter(|s| s.path == blob)
        .collect();
    // A transfer cut by its deadline is not resumed: that would give the
    // registry a new deadline.
    assert_eq!(tries.len(), 1, "{tries:?}");
    let after = std::fs::read(&disk).unwrap();
    assert!(
        after[..GUARD_BYTES as usize].iter().all(|b| *b == 0),
        "the head is zero"
    );

    // The registry fixed, the next install succeeds.
    registry.route(&blob, Route::ok(RAW, data.clone()));
    install(&strict, &registry.image_ref(&digest), &disk)
        .0
        .unwrap();
    assert!(std::fs::read(&disk).unwrap() == data);
}

#[test]
fn the_install_limit_bounds_resumes_and_retry_waits() {
    let registry = Registry::start();
    let data = image(3 * GUARD_BYTES as usize, 25);
    let pushed = registry.push_disk(&data, Compression::Raw, CHUNK);
    let digest = pushed.manifest_digest.clone();
    let blob = pushed.blob_path(0);
    // Every response breaks off after 100 bytes, and the registry honours
    // the ranges: each resume makes progress, the whole would take
    // 30 000 requests.
    registry.route(
        &blob,
        Route::Trickle {
            body: data.clone(),
            per_response: 100,
        },
    );
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk.img");
    std::fs::write(&disk, vec![0xaa; data.len()]).unwrap();
    let limited = installer().with_install_limit(Duration::from_secs(1));
    let started = Instant::now();
    let err = must_fail(install(&limited, &registry.image_ref(&digest), &disk));
    let took = started.elapsed();
    assert!(
        err.to_string()
            .contains("the installation did not end within its limit of 1 s"),
        "{err}"
    );
    assert!(took < Duration::from_secs(5), "took {took:?}");
    let tries: Vec<_> = registry
        .seen()
        .into_iter()
        .filter(|s| s.path == blob)
        .collect();
    assert!(tries.len() > 2, "{} requests", tries.len());
    assert_eq!(tries[1].range.as_deref(), Some("bytes=100-"));
    assert_eq!(tries[2].range.as_deref(), Some("bytes=200-"));
    let after = std::fs::read(&disk).unwrap();
    assert!(
        after[..GUARD_BYTES as usize].iter().all(|b| *b == 0),
        "the head is zero"
    );

    // A registry asking to come back in 100 s: past the limit, so the
    // installation ends now rather than waiting, with what it answered.
    registry.route(
        &pushed.manifest_path(),
        Route::status(503, &[("Retry-After", "100")]),
    );
    let started = Instant::now();
    let err = must_fail(install(&limited, &registry.image_ref(&digest), &disk));
    let took = started.elapsed();
    assert!(
        err.to_string().contains("the registry answered 503"),
        "{err}"
    );
    assert!(took < Duration::from_secs(5), "took {took:?}");

    // A registry breaking off after each mebibyte: resumed each time, to
    // the end.
    registry.route(
        &pushed.manifest_path(),
        Route::ok(OCI_MANIFEST, pushed.manifest.clone()),
    );
    registry.route(
        &blob,
        Route::Trickle {
            body: data.clone(),
            per_response: GUARD_BYTES as usize,
        },
    );
    let patient = installer().with_install_limit(Duration::from_secs(60));
    install(&patient, &registry.image_ref(&digest), &disk)
        .0
        .unwrap();
    assert!(std::fs::read(&disk).unwrap() == data);
}
