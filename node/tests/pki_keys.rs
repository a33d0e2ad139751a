//! Private key files: every key the PKI and the daemon write is PKCS#8
//! version 0 ("v1"), which OpenSSL reads (checked with `openssl pkey` when
//! the `openssl` command is installed); PKCS#8 v2 Ed25519 keys, which
//! earlier versions wrote, still load, and an old data directory is
//! upgraded in place (same keys, v1 files, a P-256 server certificate).

#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use metropolis_node::daemon::{Config, NodePki};
use metropolis_pki::{
    CA_KEY_FILE, ClientAuth, ClusterCa, Credentials, KubernetesCa, P256_PREFIX, P256Status,
    generate_agent_key, generate_ed25519_key, load_or_issue_p256, server_config,
};
use rustls::pki_types::PrivateKeyDer;
use rustls::pki_types::pem::PemObject;

/// The PKCS#8 DER in a PEM key.
fn pkcs8_der(pem: &str) -> Vec<u8> {
    match PrivateKeyDer::from_pem_slice(pem.as_bytes()).unwrap() {
        PrivateKeyDer::Pkcs8(k) => k.secret_pkcs8_der().to_vec(),
        other => panic!("not PKCS#8: {other:?}"),
    }
}

/// The version INTEGER of a PKCS#8 document: 0 (v1) or 1 (v2).
fn pkcs8_version(der: &[u8]) -> u8 {
    assert_eq!(der[0], 0x30, "a SEQUENCE");
    let at = match der[1] {
        n if n < 0x80 => 2,
        0x81 => 3,
        0x82 => 4,
        n => panic!("length form {n:#x}"),
    };
    assert_eq!(der[at..at + 2], [0x02, 0x01], "an INTEGER of one byte");
    der[at + 2]
}

/// Whether `openssl pkey` reads the key file; `None` without openssl.
fn openssl_reads(path: &Path) -> Option<Result<(), String>> {
    let out = Command::new("openssl")
        .args(["pkey", "-noout", "-in"])
        .arg(path)
        .output()
        .ok()?;
    Some(if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    })
}

/// Checks that `pem` is PKCS#8 v1 and, with openssl installed, that
/// openssl reads it from a file.
fn assert_v1(what: &str, pem: &str, scratch: &Path) {
    assert_eq!(pkcs8_version(&pkcs8_der(pem)), 0, "{what} is not PKCS#8 v1");
    let file = scratch.join(format!("{}.pem", what.replace(' ', "-")));
    std::fs::write(&file, pem).unwrap();
    match openssl_reads(&file) {
        Some(result) => result.unwrap_or_else(|e| panic!("openssl refuses the {what}: {e}")),
        None => eprintln!("openssl is not installed: {what} not checked with openssl"),
    }
}

/// The same Ed25519 key in *ring*'s PKCS#8 v2 form (what earlier versions
/// wrote).
fn as_v2(v1_pem: &str) -> String {
    let der = pkcs8_der(v1_pem);
    assert_eq!(der.len(), 48);
    let key = rcgen::KeyPair::from_pem(v1_pem).unwrap();
    let mut v2 = vec![
        0x30, 0x51, 0x02, 0x01, 0x01, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04,
        0x20,
    ];
    v2.extend_from_slice(&der[16..]);
    v2.extend_from_slice(&[0x81, 0x21, 0x00]);
    v2.extend_from_slice(key.public_key_raw());
    let pem = rcgen::KeyPair::try_from(v2.as_slice())
        .unwrap()
        .serialize_pem();
    assert_eq!(pkcs8_version(&pkcs8_der(&pem)), 1);
    pem
}

#[test]
fn every_key_written_is_pkcs8_v1_and_openssl_reads_it() {
    let scratch = tempfile::tempdir().unwrap();
    let s = scratch.path();
    let ca = ClusterCa::generate().unwrap();
    assert_v1("CA key", &ca.key_pem(), s);
    let (node, _) = ca.issue_curator_node(&[]).unwrap();
    assert_v1("node key", &node.key_pem, s);
    assert_v1("owner key", &ca.issue_owner().unwrap().key_pem, s);
    assert_v1(
        "P-256 server key",
        &ca.issue_p256_server_cert(&node).unwrap().key_pem,
        s,
    );
    assert_v1("agent key", &generate_agent_key().unwrap(), s);
    let (key, public) = generate_ed25519_key().unwrap();
    assert_eq!(
        rcgen::KeyPair::from_pem(&key).unwrap().public_key_raw(),
        public
    );
    assert_v1("metroctl key", &key, s);
    let ed_ca = ClusterCa::generate_with("other", &rcgen::PKCS_ED25519).unwrap();
    assert_v1("Ed25519 CA key", &ed_ca.key_pem(), s);

    let k8s_dir = s.join("k8s");
    std::fs::create_dir(&k8s_dir).unwrap();
    let k8s = KubernetesCa::load_or_generate(&k8s_dir).unwrap();
    let k8s_key =
        std::fs::read_to_string(k8s_dir.join(metropolis_pki::GENERATED_KUBERNETES_CA_KEY)).unwrap();
    assert_v1("generated Kubernetes CA key", &k8s_key, s);
    let (_, client_key, _) = k8s
        .issue_client("someone", &[], Duration::from_secs(60))
        .unwrap();
    assert_v1("kubeconfig client key", &client_key, s);
}

fn config(dir: &Path) -> Config {
    Config::new(dir, SocketAddr::from(([127, 0, 0, 1], 0)))
}

/// The key files the daemon writes in its data directory.
fn daemon_keys(data: &Path) -> Vec<PathBuf> {
    vec![
        data.join("pki").join(CA_KEY_FILE),
        Credentials::key_path(&data.join("pki"), "node"),
        Credentials::key_path(&data.join("pki"), P256_PREFIX),
        Credentials::key_path(&data.join("owner"), "owner"),
    ]
}

fn public_key(path: &Path) -> Vec<u8> {
    let pem = std::fs::read_to_string(path).unwrap();
    rcgen::KeyPair::from_pem(&pem)
        .unwrap()
        .public_key_raw()
        .to_vec()
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[test]
fn the_daemon_writes_v1_keys_and_upgrades_an_old_data_directory() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path();
    let scratch = tempfile::tempdir().unwrap();
    NodePki::load_or_create(&config(data)).unwrap();
    let keys = daemon_keys(data);
    for key in &keys {
        let pem = std::fs::read_to_string(key).unwrap();
        let name = key.strip_prefix(data).unwrap().display().to_string();
        assert_v1(&name.replace('/', "_"), &pem, scratch.path());
        assert_eq!(mode(key), 0o600, "{}", key.display());
    }
    let certs: Vec<PathBuf> = ["pki/ca.pem", "pki/node.pem", "owner/owner.pem"]
        .iter()
        .map(|p| data.join(p))
        .collect();
    let certs_before: Vec<Vec<u8>> = certs.iter().map(|c| std::fs::read(c).unwrap()).collect();

    // What an earlier version left: v2 Ed25519 keys, no P-256 certificate.
    let ed25519_keys = [&keys[0], &keys[1], &keys[3]];
    let publics: Vec<Vec<u8>> = ed25519_keys.iter().map(|k| public_key(k)).collect();
    for key in ed25519_keys {
        let v2 = as_v2(&std::fs::read_to_string(key).unwrap());
        std::fs::write(key, v2).unwrap();
        if let Some(result) = openssl_reads(key) {
            assert!(result.is_err(), "openssl reads PKCS#8 v2 here");
        }
    }
    let p256_cert = Credentials::cert_path(&data.join("pki"), P256_PREFIX);
    std::fs::remove_file(&p256_cert).unwrap();
    std::fs::remove_file(&keys[2]).unwrap();

    NodePki::load_or_create(&config(data)).unwrap();
    for (key, public) in ed25519_keys.iter().zip(&publics) {
        let pem = std::fs::read_to_string(key).unwrap();
        assert_eq!(pkcs8_version(&pkcs8_der(&pem)), 0, "{}", key.display());
        assert_eq!(&public_key(key), public, "the same key");
        assert_eq!(mode(key), 0o600);
    }
    assert_eq!(mode(&keys[2]), 0o600);
    assert!(p256_cert.exists());
    let certs_after: Vec<Vec<u8>> = certs.iter().map(|c| std::fs::read(c).unwrap()).collect();
    assert_eq!(certs_after, certs_before, "certificates are untouched");

    // A third start keeps everything.
    let files = |paths: &[PathBuf]| -> Vec<Vec<u8>> {
        paths.iter().map(|p| std::fs::read(p).unwrap()).collect()
    };
    let mut all = keys.clone();
    all.push(p256_cert);
    let before = files(&all);
    NodePki::load_or_create(&config(data)).unwrap();
    assert_eq!(files(&all), before);
}

#[test]
fn v2_keys_still_load() {
    let dir = tempfile::tempdir().unwrap();
    let ca = ClusterCa::generate().unwrap();
    let v2_ca = ClusterCa::from_pem(&ca.cert_pem(), &as_v2(&ca.key_pem())).unwrap();
    assert_eq!(v2_ca.cert_der(), ca.cert_der());
    // A CA loaded from a v2 key still issues.
    let (node, _) = v2_ca.issue_curator_node(&[]).unwrap();
    let v2_node = Credentials::from_parts(node.cert_pem, as_v2(&node.key_pem), node.ca_pem);
    v2_node.write_to_dir(dir.path(), "node").unwrap();
    let read = Credentials::read_from_dir(dir.path(), "node").unwrap();
    assert_eq!(read, v2_node);
    server_config(&read, ClientAuth::Required).unwrap();
    let (p256, status) = load_or_issue_p256(dir.path(), &v2_ca, &read).unwrap();
    assert_eq!(status, P256Status::Created);
    metropolis_pki::node_server_config(&read, &p256, ClientAuth::Deferred).unwrap();
    let (_, public) =
        metropolis_pki::self_signed_agent_certificate(&as_v2(&generate_agent_key().unwrap()))
            .unwrap();
    assert_eq!(public.len(), 32);
}
