//! `metroctl osimage build|push` and `install request --node-parameters`
//! in JSON, run as `metroctl-under-test`: layouts checked independently of
//! the code that wrote them (blob names, digests, the chunk hashes
//! recomputed from the input files, zstd frames decoded), pushes to a real
//! Debian `docker-registry` in the clear, with htpasswd logins over TLS
//! (apache2-utils' `htpasswd`) and with the Docker token flow, read back
//! through the distribution API, and through a link that drops uploads
//! midway; bad input refused naming the flag; and
//! JSON node parameters submitted to a real `metropolisd` and read back.
//! Needs docker-registry and apache2-utils (`.ci/run` installs them).

#![allow(clippy::unwrap_used)]

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use base64::Engine as _;
use metropolis_proto::metropolis::node::core::curator::proto::private::GetMachineRequest;
use metropolis_proto::prelude::agent;
use metropolis_proto::prelude::debug::node_parameters::Cluster;
use metropolis_tests::cut_proxy::{CutProxy, Way};
use metropolis_tests::outcome::{stderr, stdout};
use metropolis_tests::registry::{Access, Registry, digest, http};
use metropolis_tests::token_server::{TokenIssuer, TokenServer};
use metropolis_tests::{Daemon, RuntimeKind, daemon_bin};
use prost::Message;
use serde_json::Value;
use sha2::{Digest as _, Sha256};

const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const CONFIG: &str = "application/vnd.monogon.os.image.config.v1+json";

/// Runs `metroctl-under-test` with `args` (no daemon needed).
fn metroctl(args: &[&str]) -> Output {
    Command::new(daemon_bin().with_file_name("metroctl-under-test"))
        .args(args)
        .output()
        .unwrap()
}

/// `len` bytes that compress somewhat, different for each `seed`.
fn payload(len: usize, seed: u32) -> Vec<u8> {
    (0..len as u32)
        .map(|i| ((i / 7).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 24) as u8 & 0x3f)
        .collect()
}

/// Two payload files in `dir`: a kernel and a system image.
fn inputs(dir: &Path) -> (PathBuf, PathBuf, Vec<u8>, Vec<u8>) {
    let (kernel, system) = (payload(70_001, 1), payload(300_000, 2));
    let (k, s) = (dir.join("kernel.efi"), dir.join("system.img"));
    std::fs::write(&k, &kernel).unwrap();
    std::fs::write(&s, &system).unwrap();
    (k, s, kernel, system)
}

/// Builds a metropolis image into `out`; returns the manifest digest.
fn build(out: &Path, kernel: &Path, system: &Path, extra: &[&str]) -> String {
    let k = format!("kernel.efi={}", kernel.display());
    let s = format!("system={}", system.display());
    let mut args = vec!["-o", "json", "osimage", "build", "--out"];
    let out = out.display().to_string();
    args.extend([out.as_str(), "--payload", &s, "--payload", &k]);
    args.extend(extra);
    let run = metroctl(&args);
    assert!(run.status.success(), "{}", stderr(&run));
    let json: Value = serde_json::from_str(&stdout(&run)).unwrap();
    json["digest"].as_str().unwrap().to_string()
}

fn blob(out: &Path, digest: &str) -> Vec<u8> {
    std::fs::read(out.join("blobs/sha256").join(&digest["sha256:".len()..])).unwrap()
}

/// The content of `frame`, checked to be one zstd frame that carries its
/// content checksum (as the `zstd` program writes them), nothing after it.
fn unzstd(frame: &[u8]) -> Vec<u8> {
    assert_eq!(frame[..4], 0xFD2F_B528u32.to_le_bytes(), "a zstd frame");
    assert_ne!(frame[4] & 0x04, 0, "the frame carries its content checksum");
    let mut decoder = zstd::stream::read::Decoder::with_buffer(frame)
        .unwrap()
        .single_frame();
    let mut out = Vec::new();
    decoder.read_to_end(&mut out).unwrap();
    assert!(decoder.finish().is_empty(), "one frame, nothing after it");
    out
}

/// Checks the layout in `out` from first principles; returns the manifest.
fn check_layout(out: &Path, payloads: &[(&str, &[u8])], chunk: usize, layer: &str) -> Value {
    let layout: Value =
        serde_json::from_slice(&std::fs::read(out.join("oci-layout")).unwrap()).unwrap();
    assert_eq!(layout["imageLayoutVersion"], "1.0.0");
    for entry in std::fs::read_dir(out.join("blobs/sha256")).unwrap() {
        let entry = entry.unwrap();
        let bytes = std::fs::read(entry.path()).unwrap();
        let name = entry.file_name().into_string().unwrap();
        assert_eq!(
            format!("sha256:{name}"),
            digest(&bytes),
            "blob named by its hash"
        );
    }
    let index: Value =
        serde_json::from_slice(&std::fs::read(out.join("index.json")).unwrap()).unwrap();
    let entries = index["manifests"].as_array().unwrap();
    assert_eq!(entries.len(), 1);
    let manifest_digest = entries[0]["digest"].as_str().unwrap();
    let manifest_bytes = blob(out, manifest_digest);
    assert_eq!(entries[0]["size"], manifest_bytes.len());
    assert_eq!(entries[0]["mediaType"], MANIFEST);
    let manifest: Value = serde_json::from_slice(&manifest_bytes).unwrap();
    assert_eq!(manifest["schemaVersion"], 2);
    assert_eq!(manifest["mediaType"], MANIFEST);
    let artifact = match payloads[0].0 {
        "disk" => "application/vnd.metropolis-rs.os.disk-image.v1",
        _ => "application/vnd.monogon.os.image.v1",
    };
    assert_eq!(manifest["artifactType"], artifact);
    assert_eq!(entries[0]["artifactType"], artifact);
    assert_eq!(manifest["config"]["mediaType"], CONFIG);
    let config_bytes = blob(out, manifest["config"]["digest"].as_str().unwrap());
    assert_eq!(manifest["config"]["size"], config_bytes.len());
    let config: Value = serde_json::from_slice(&config_bytes).unwrap();
    assert_eq!(config["format_version"], "1");
    let described = config["payloads"].as_array().unwrap();
    let layers = manifest["layers"].as_array().unwrap();
    assert_eq!(
        (described.len(), layers.len()),
        (payloads.len(), payloads.len())
    );
    for (i, (name, bytes)) in payloads.iter().enumerate() {
        let p = &described[i];
        assert_eq!(p["name"], *name, "payload {i} is layer {i}");
        assert_eq!(p["size"], bytes.len());
        assert_eq!(p["hash_chunk_size"], chunk);
        let want: Vec<String> = bytes
            .chunks(chunk)
            .map(|c| base64::engine::general_purpose::STANDARD_NO_PAD.encode(Sha256::digest(c)))
            .collect();
        assert_eq!(want.len(), bytes.len().div_ceil(chunk));
        let hashes: Vec<&str> = p["chunk_hashes_sha256"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| h.as_str().unwrap())
            .collect();
        assert_eq!(hashes, want);
        assert!(hashes.iter().all(|h| h.len() == 43 && !h.ends_with('=')));
        assert_eq!(layers[i]["mediaType"], layer);
        let stored = blob(out, layers[i]["digest"].as_str().unwrap());
        assert_eq!(layers[i]["size"], stored.len());
        let content = match layer {
            "application/zstd" => unzstd(&stored),
            _ => stored,
        };
        assert!(content == *bytes, "layer {i} holds payload {name}");
    }
    manifest
}

#[test]
fn builds_layouts_that_check_out() {
    let dir = tempfile::tempdir().unwrap();
    let (k, s, kernel, system) = inputs(dir.path());
    let payloads: [(&str, &[u8]); 2] = [("kernel.efi", &kernel), ("system", &system)];
    let zstd = dir.path().join("zstd");
    let d1 = build(&zstd, &k, &s, &["--chunk-size", "65536"]);
    check_layout(&zstd, &payloads, 65536, "application/zstd");
    let raw = dir.path().join("raw");
    std::fs::create_dir(&raw).unwrap(); // empty is fine
    let d2 = build(
        &raw,
        &k,
        &s,
        &["--compression", "none", "--chunk-size", "4096"],
    );
    check_layout(&raw, &payloads, 4096, "application/octet-stream");
    assert_ne!(d1, d2);
    // The default chunk is 1 MiB, as the reference's; the build is
    // reproducible.
    let again = dir.path().join("again");
    let d3 = build(&again, &k, &s, &[]);
    check_layout(&again, &payloads, 1 << 20, "application/zstd");
    assert_eq!(d3, build(&dir.path().join("twice"), &k, &s, &[]));
    // A whole-disk image: one payload, "disk".
    let disk = dir.path().join("disk");
    let spec = format!("disk={}", s.display());
    let out = disk.display().to_string();
    let run = metroctl(&[
        "osimage",
        "build",
        "--out",
        &out,
        "--kind",
        "disk",
        "--payload",
        &spec,
    ]);
    assert!(run.status.success(), "{}", stderr(&run));
    assert!(
        stdout(&run).contains("disk image sha256:"),
        "{}",
        stdout(&run)
    );
    check_layout(&disk, &[("disk", &system)], 1 << 20, "application/zstd");
}

/// Runs `args`; asserts exit status `code` and an error naming `flag`.
fn refused(args: &[&str], code: i32, flag: &str) -> String {
    let run = metroctl(args);
    let err = stderr(&run);
    assert_eq!(run.status.code(), Some(code), "{args:?}: {err}");
    assert!(err.starts_with("metroctl: "), "{err}");
    assert!(err.contains(flag), "{args:?} should name {flag}: {err}");
    assert!(err.lines().count() == 1 && err.len() < 400, "short: {err}");
    err
}

#[test]
fn bad_input_is_refused_naming_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let (k, s, _, _) = inputs(dir.path());
    let out = dir.path().join("out").display().to_string();
    let k = format!("kernel.efi={}", k.display());
    let sys = format!("system={}", s.display());
    let disk = format!("disk={}", s.display());
    let base = ["osimage", "build", "--out", &out];
    fn args<'a>(base: &[&'a str], extra: &[&'a str]) -> Vec<&'a str> {
        [base, extra].concat()
    }
    let e = refused(&args(&base, &["--payload", &k]), 2, "--payload system=FILE");
    assert!(
        e.contains("kernel.efi=FILE and --payload system=FILE"),
        "{e}"
    );
    refused(&args(&base, &["--kind", "disk"]), 2, "--payload disk=FILE");
    let e = refused(
        &args(
            &base,
            &["--payload", &k, "--payload", &sys, "--payload", "initrd=/x"],
        ),
        2,
        "--payload initrd",
    );
    assert!(e.contains("not a payload of a metropolis image"), "{e}");
    let e = refused(
        &args(
            &base,
            &["--kind", "disk", "--payload", &disk, "--payload", &sys],
        ),
        2,
        "--payload system",
    );
    assert!(e.contains("disk image"), "{e}");
    let e = refused(
        &args(
            &base,
            &["--payload", &k, "--payload", &k, "--payload", &sys],
        ),
        2,
        "--payload kernel.efi",
    );
    assert!(e.contains("twice"), "{e}");
    for bad in ["a b=/x", ".hidden=/x", "_x=/x", "x.=/x", "ké=/x", "=/x"] {
        let e = refused(&args(&base, &["--payload", bad]), 2, "--payload");
        assert!(e.contains("payload name"), "{e}");
    }
    let long = format!("{}=/x", "n".repeat(81));
    refused(&args(&base, &["--payload", &long]), 2, "1 to 80 characters");
    refused(&args(&base, &["--payload", "system"]), 2, "NAME=FILE");
    for size in ["0", "16777217"] {
        let e = refused(
            &args(
                &base,
                &["--payload", &k, "--payload", &sys, "--chunk-size", size],
            ),
            2,
            "--chunk-size",
        );
        assert!(e.contains("16 MiB"), "{e}");
    }
    // clap's own errors: usage (2), naming the flag.
    let run = metroctl(&args(&base, &["--chunk-size", "4MiB"]));
    assert_eq!(run.status.code(), Some(2));
    assert!(stderr(&run).contains("--chunk-size"), "{}", stderr(&run));
    refused(
        &args(
            &base,
            &["--payload", &k, "--payload", "system=/no/such/file"],
        ),
        2,
        "--payload system=/no/such/file",
    );
    let empty = dir.path().join("empty");
    std::fs::write(&empty, b"").unwrap();
    let e = refused(
        &args(
            &base,
            &[
                "--payload",
                &k,
                "--payload",
                &format!("system={}", empty.display()),
            ],
        ),
        2,
        "--payload system=",
    );
    assert!(e.contains("empty"), "{e}");
    assert!(
        !dir.path().join("out").exists(),
        "a failed build leaves nothing"
    );
    // An --out that exists and is not empty.
    std::fs::create_dir(dir.path().join("out")).unwrap();
    std::fs::write(dir.path().join("out/keep"), b"mine").unwrap();
    let e = refused(
        &args(&base, &["--payload", &k, "--payload", &sys]),
        2,
        "--out",
    );
    assert!(e.contains("not empty"), "{e}");
    assert_eq!(std::fs::read(dir.path().join("out/keep")).unwrap(), b"mine");
    // Malformed references and layouts.
    let good = dir.path().join("good");
    build(&good, &dir.path().join("kernel.efi"), &s, &[]);
    let good = good.display().to_string();
    for reference in [
        "ftp://127.0.0.1:5000/os/m",
        "127.0.0.1:5000",
        "127.0.0.1:5000/OS/m",
        "127.0.0.1:5000/os/m:",
        "127.0.0.1:5000/os/m@sha256:00",
        "127.0.0.1:99999/os/m",
    ] {
        let e = refused(&["osimage", "push", &good, reference], 2, "REFERENCE");
        assert!(e.contains("HOST[:PORT]/REPOSITORY[:TAG]"), "{e}");
    }
    refused(
        &["osimage", "push", &out, "http://127.0.0.1:1/os/m"],
        2,
        "DIR",
    );
}

#[test]
fn pushes_to_a_registry_and_again() {
    assert!(
        Registry::available(),
        "docker-registry is not installed (apt-get install docker-registry; .ci/run does it)"
    );
    let registry = Registry::start();
    let dir = tempfile::tempdir().unwrap();
    let (k, s, kernel, system) = inputs(dir.path());
    let out = dir.path().join("image");
    let built = build(&out, &k, &s, &["--chunk-size", "8192"]);
    let reference = format!("http://{}/os/metropolis:v1", registry.addr);
    let outdir = out.display().to_string();
    let push = |reference: &str| {
        let run = metroctl(&["-o", "json", "osimage", "push", &outdir, reference]);
        assert!(run.status.success(), "{}\n{}", stderr(&run), registry.log());
        serde_json::from_str::<Value>(&stdout(&run)).unwrap()
    };
    let first = push(&reference);
    let image = format!("http://{}/os/metropolis@{built}", registry.addr);
    assert_eq!(first["image"], image.as_str());
    assert_eq!(first["tag"], "v1");
    assert_eq!(
        (
            first["blobs_uploaded"].as_u64(),
            first["blobs_present"].as_u64()
        ),
        (Some(3), Some(0))
    );
    // What `install request --image` takes.
    assert!(image.ends_with(&built));

    // Read back through the registry's API: the manifest by tag and by
    // digest, every blob, byte for byte as built.
    let manifest_bytes = blob(&out, &built);
    for target in ["v1", built.as_str()] {
        let (status, headers, body) = http(
            &registry.addr,
            "GET",
            &format!("/v2/os/metropolis/manifests/{target}"),
            &[("Accept", MANIFEST)],
            &[],
        );
        assert_eq!(status, 200, "{target}");
        assert_eq!(body, manifest_bytes);
        assert!(
            headers
                .iter()
                .any(|(k, v)| k == "docker-content-digest" && *v == built)
        );
    }
    let manifest = check_layout(
        &out,
        &[("kernel.efi", &kernel), ("system", &system)],
        8192,
        "application/zstd",
    );
    let mut digests = vec![manifest["config"]["digest"].as_str().unwrap().to_string()];
    for layer in manifest["layers"].as_array().unwrap() {
        digests.push(layer["digest"].as_str().unwrap().to_string());
    }
    for d in &digests {
        let (status, _, body) = http(
            &registry.addr,
            "GET",
            &format!("/v2/os/metropolis/blobs/{d}"),
            &[],
            &[],
        );
        assert_eq!(status, 200, "{d}");
        assert_eq!(body, blob(&out, d), "{d}");
    }

    // Again: nothing uploaded, the same image.
    let second = push(&reference);
    assert_eq!(second["image"], image.as_str());
    assert_eq!(
        (
            second["blobs_uploaded"].as_u64(),
            second["blobs_present"].as_u64()
        ),
        (Some(0), Some(3))
    );
    // Without a tag: by digest, in another repository; table output.
    let run = metroctl(&[
        "osimage",
        "push",
        &outdir,
        &format!("http://{}/other/os", registry.addr),
    ]);
    assert!(run.status.success(), "{}", stderr(&run));
    let text = stdout(&run);
    assert!(
        text.contains(&format!("http://{}/other/os@{built}", registry.addr)),
        "{text}"
    );
    let (status, _, body) = http(
        &registry.addr,
        "GET",
        &format!("/v2/other/os/manifests/{built}"),
        &[("Accept", MANIFEST)],
        &[],
    );
    assert_eq!((status, body), (200, manifest_bytes));
    // Nothing listens: unavailable.
    let port = metropolis_tests::free_port();
    let run = metroctl(&[
        "osimage",
        "push",
        &outdir,
        &format!("http://127.0.0.1:{port}/os/m"),
    ]);
    assert_eq!(run.status.code(), Some(3), "{}", stderr(&run));
    assert!(stderr(&run).contains("unreachable"), "{}", stderr(&run));
}

#[test]
fn pushes_through_uploads_cut_short() {
    assert!(Registry::available(), "docker-registry is not installed");
    let registry = Registry::start();
    // The link drops twice in the middle of an upload.
    let proxy = CutProxy::start(&registry.addr, Way::Upload, 64 * 1024, 2);
    let dir = tempfile::tempdir().unwrap();
    let (k, s, _, _) = inputs(dir.path());
    let out = dir.path().join("image");
    let built = build(&out, &k, &s, &["--compression", "none"]);
    let out = out.display().to_string();
    let reference = format!("http://{}/os/cut:v1", proxy.addr);
    let run = metroctl(&["-o", "json", "osimage", "push", &out, &reference]);
    let said = stderr(&run);
    assert!(run.status.success(), "{said}\n{}", registry.log());
    assert_eq!(proxy.cut.load(Ordering::SeqCst), 2);
    assert_eq!(
        said.matches("starting the upload over").count(),
        2,
        "{said}"
    );
    let json: Value = serde_json::from_str(&stdout(&run)).unwrap();
    assert_eq!(json["digest"], built.as_str());
    layers_are_stored(&registry, &out, &built);
}

fn auth_file(path: &Path, registry: &str, user: &str, password: &str) {
    let encoded = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    let json = format!(r#"{{"auths": {{"{registry}": {{"auth": "{encoded}"}}}}}}"#);
    std::fs::write(path, json).unwrap();
}

/// Builds an image in `dir`; returns its layout directory and digest.
/// Every layer of the layout `out`'s manifest `built` is in `registry`'s
/// storage, byte for byte.
fn layers_are_stored(registry: &Registry, out: &str, built: &str) {
    let manifest: Value = serde_json::from_slice(&blob(Path::new(out), built)).unwrap();
    for layer in manifest["layers"].as_array().unwrap() {
        let d = layer["digest"].as_str().unwrap();
        let stored = std::fs::read(registry.blob_path(d)).unwrap();
        assert_eq!(stored, blob(Path::new(out), d));
    }
}

fn small_image(dir: &Path) -> (String, String) {
    let (k, s, _, _) = inputs(dir);
    let out = dir.join("image");
    let digest = build(&out, &k, &s, &[]);
    (out.display().to_string(), digest)
}

#[test]
fn pushes_with_a_login_and_not_without() {
    assert!(Registry::available(), "docker-registry is not installed");
    let registry = Registry::start_secure("pusher", "s3cret");
    let dir = tempfile::tempdir().unwrap();
    let (out, built) = small_image(dir.path());
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, registry.ca_pem.clone().unwrap()).unwrap();
    let (good, bad) = (dir.path().join("good.json"), dir.path().join("bad.json"));
    auth_file(&good, &registry.addr, "pusher", "s3cret");
    auth_file(&bad, &registry.addr, "pusher", "wrong");
    let reference = format!("{}/os/metropolis:v2", registry.addr);
    let ca = ca.display().to_string();
    let (good, bad) = (good.display().to_string(), bad.display().to_string());

    // Without --registry-ca the self-signed certificate is not trusted.
    let e = refused(&["osimage", "push", &out, &reference], 1, "--registry-ca");
    assert!(e.contains("TLS"), "{e}");
    // Without a login, or with a wrong one: denied (4), naming the flag.
    let e = refused(
        &["osimage", "push", &out, &reference, "--registry-ca", &ca],
        4,
        "--registry-auth",
    );
    assert!(e.contains("requires a login"), "{e}");
    let args = [
        "osimage",
        "push",
        &out,
        &reference,
        "--registry-ca",
        &ca,
        "--registry-auth",
        &bad,
    ];
    let e = refused(&args, 4, "--registry-auth");
    assert!(e.contains("refused the login of user \"pusher\""), "{e}");
    let missing = dir.path().join("none.json").display().to_string();
    refused(
        &[
            "osimage",
            "push",
            &out,
            &reference,
            "--registry-auth",
            &missing,
        ],
        2,
        "--registry-auth",
    );

    let args = [
        "osimage",
        "push",
        &out,
        &reference,
        "--registry-ca",
        &ca,
        "--registry-auth",
        &good,
    ];
    let run = metroctl(&args);
    assert!(run.status.success(), "{}\n{}", stderr(&run), registry.log());
    let text = stdout(&run);
    assert!(
        text.contains(&format!("https://{}/os/metropolis@{built}", registry.addr)),
        "{text}"
    );
    assert!(text.contains("tag v2"), "{text}");
    layers_are_stored(&registry, &out, &built);
}

#[test]
fn pushes_with_a_token() {
    assert!(Registry::available(), "docker-registry is not installed");
    let issuer = Arc::new(TokenIssuer::new());
    let login = base64::engine::general_purpose::STANDARD.encode("robot:t0ken-pw");
    let server = TokenServer::granting(issuer.clone(), format!("Basic {login}"), &["pull", "push"]);
    let (tokens, tokens_ca, requests) = (
        server.addr.clone(),
        server.ca_pem.clone(),
        server.requests.clone(),
    );
    let realm = format!("https://{tokens}/token");
    let registry = Registry::start_as(Access::Token {
        issuer,
        realm: &realm,
    });
    let dir = tempfile::tempdir().unwrap();
    let (out, built) = small_image(dir.path());
    let ca = dir.path().join("ca.pem");
    let both = format!("{}{tokens_ca}", registry.ca_pem.clone().unwrap());
    std::fs::write(&ca, both).unwrap();
    let auth = dir.path().join("auth.json");
    auth_file(&auth, &registry.addr, "robot", "t0ken-pw");
    let (ca, auth) = (ca.display().to_string(), auth.display().to_string());
    let reference = format!("https://{}/os/tokened:v1", registry.addr);
    let args = [
        "-o",
        "json",
        "osimage",
        "push",
        &out,
        &reference,
        "--registry-ca",
        &ca,
        "--registry-auth",
        &auth,
    ];
    let run = metroctl(&args);
    assert!(run.status.success(), "{}\n{}", stderr(&run), registry.log());
    let json: Value = serde_json::from_str(&stdout(&run)).unwrap();
    assert_eq!(json["digest"], built.as_str());
    assert!(requests.load(Ordering::SeqCst) > 0);
    layers_are_stored(&registry, &out, &built);
    // Anonymous: the token server refuses, and says so.
    let e = refused(&args[..8], 4, "token server");
    assert!(e.contains("401"), "{e}");
}

const MACHINE: &str = "6f1c1f7e-3d4a-4b8e-9a51-0c2f3e4d5a6b";

#[tokio::test(flavor = "multi_thread")]
async fn node_parameters_in_json() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("d"), RuntimeKind::Tokio);
    let mut op = d.enroll_machine(MACHINE, dir.path()).await.operator;
    let key: Vec<u8> = (100u8..132).collect();
    let params = dir.path().join("params.json");
    let json = format!(
        r#"
        {{
          "cluster_bootstrap": {{"owner_public_key": "{}"}},
          "network_config": {{
            "interface": [{{
              "name": "uplink",
              "device": {{"hardware_address": "52:54:00:12:34:56"}},
              "address": ["192.0.2.10/24"],
              "route": [{{"destination": "0.0.0.0/0", "gateway_ip": "192.0.2.1"}}],
              "ipv6Autoconfig": {{"privacy": "PRIVACY_PREFER"}}
            }}],
            "nameserver": [{{"ip": "192.0.2.53"}}]
          }}
        }}"#,
        base64::engine::general_purpose::STANDARD.encode(&key)
    );
    std::fs::write(&params, json).unwrap();
    let image = format!(
        "http://127.0.0.1:5000/os/metropolis@sha256:{}",
        "c".repeat(64)
    );
    let p = params.display().to_string();
    let args = [
        "install",
        "request",
        MACHINE,
        "--image",
        &image,
        "--root-device",
        "sda",
        "--node-parameters",
        &p,
    ];
    let run = d.metroctl(&args);
    assert!(run.status.success(), "{}", stderr(&run));
    let m = op
        .get_machine(GetMachineRequest {
            machine_id: MACHINE.into(),
        })
        .await
        .unwrap()
        .into_inner();
    let request = agent::OsInstallationRequest::decode(m.current_request.as_ref()).unwrap();
    let Some(agent::os_installation_request::Type::Metropolis(r)) = request.r#type else {
        panic!("not a Metropolis request");
    };
    let np = r.node_parameters.unwrap();
    let Some(Cluster::ClusterBootstrap(b)) = np.cluster else {
        panic!("no cluster_bootstrap: {np:?}");
    };
    assert_eq!(b.owner_public_key.as_ref(), key.as_slice());
    let net = np.network_config.unwrap();
    let uplink = &net.interface[0];
    assert_eq!(uplink.name, "uplink");
    assert_eq!(uplink.address, ["192.0.2.10/24"]);
    assert_eq!(uplink.route[0].gateway_ip, "192.0.2.1");
    assert_eq!(uplink.ipv6_autoconfig.as_ref().unwrap().privacy, 2);
    assert_eq!(net.nameserver[0].ip, "192.0.2.53");
    // The encoded form still works.
    let encoded = dir.path().join("params.bin");
    std::fs::write(
        &encoded,
        metropolis_proto::prelude::debug::NodeParameters {
            network_config: Some(net),
            ..Default::default()
        }
        .encode_to_vec(),
    )
    .unwrap();
    let e = encoded.display().to_string();
    let run = d.metroctl(&[&args[..8], &[e.as_str()]].concat());
    assert!(run.status.success(), "{}", stderr(&run));

    // Malformed JSON is refused naming the field; nothing is submitted.
    for (json, field) in [
        (
            r#"{"network_config": {"interface": [{"mtu": "big"}]}}"#,
            "network_config.interface[0].mtu",
        ),
        (
            r#"{"cluster_bootstrap": {"owner_public_key": "not base64!"}}"#,
            "cluster_bootstrap.owner_public_key",
        ),
        (r#"{"cluster_bootstrap": {"colour": 1}}"#, "colour"),
        (r#" {"network_config": "#, "--node-parameters"),
    ] {
        std::fs::write(&params, json).unwrap();
        let run = d.metroctl(&args);
        let err = stderr(&run);
        assert_eq!(run.status.code(), Some(2), "{err}");
        assert!(
            err.contains("--node-parameters") && err.contains(field),
            "{field}: {err}"
        );
    }
    let m = op
        .get_machine(GetMachineRequest {
            machine_id: MACHINE.into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(m.current_generation, 2);
}
