//! GetDebugKubeconfig against a real daemon: the kubeconfig parses, its
//! certificate chains to the Kubernetes CA (generated or configured) with
//! CN=id and O=each group and the configured validity; errors name the
//! field or the flags. The debug listener needs an opt-in to listen beyond
//! loopback, and every issuance logs its caller's address.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::time::Duration;

use base64::Engine as _;
use metropolis_host::pki::{ClusterCa, GENERATED_KUBERNETES_CA_CERT, Kubeconfig};
use metropolis_proto::prelude::debug;
use metropolis_tests::{Daemon, RuntimeKind, against_both_runtimes, free_port};

fn decode(b64: &str) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(b64)
        .unwrap()
}

/// Parses the kubeconfig and checks its certificate against `ca_pem`.
/// Returns the certificate's validity in seconds.
fn check(yaml: &str, ca_pem: &str, id: &str, groups: &[&str], server: &str) -> i64 {
    let config: Kubeconfig = serde_yaml_ng::from_str(yaml).unwrap();
    assert_eq!(config.kind, "Config");
    assert_eq!(config.clusters[0].cluster.server, server);
    assert_eq!(
        decode(&config.clusters[0].cluster.certificate_authority_data),
        ca_pem.as_bytes()
    );
    let cert_pem = decode(&config.users[0].user.client_certificate_data);
    let (_, pem) = x509_parser::pem::parse_x509_pem(&cert_pem).unwrap();
    let cert = pem.parse_x509().unwrap();
    let (_, ca_pem) = x509_parser::pem::parse_x509_pem(ca_pem.as_bytes()).unwrap();
    let ca = ca_pem.parse_x509().unwrap();
    cert.verify_signature(Some(ca.public_key())).unwrap();
    assert_eq!(cert.issuer(), ca.subject());
    let cn: Vec<_> = cert
        .subject()
        .iter_common_name()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(cn, [id]);
    let o: Vec<_> = cert
        .subject()
        .iter_organization()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(o, groups);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    cert.validity().not_after.timestamp() - now
}

async fn generated_ca_kubeconfig(runtime: RuntimeKind) {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let d = Daemon::start_debug(
        &data,
        runtime,
        &[
            "--kubeconfig-validity",
            "3600",
            "--kubernetes-api-server",
            "https://k8s.example:6443",
        ],
    );
    let mut client = d.debug_client().await;
    let resp = client
        .get_debug_kubeconfig(debug::GetDebugKubeconfigRequest {
            id: "alice".into(),
            groups: vec!["dev".into(), "ops".into()],
        })
        .await
        .unwrap()
        .into_inner();
    let ca_pem =
        std::fs::read_to_string(data.join("pki").join(GENERATED_KUBERNETES_CA_CERT)).unwrap();
    assert!(
        resp.debug_kubeconfig.contains("GENERATED"),
        "labelled as generated"
    );
    let validity = check(
        &resp.debug_kubeconfig,
        &ca_pem,
        "alice",
        &["dev", "ops"],
        "https://k8s.example:6443",
    );
    assert!((3500..=3600).contains(&validity), "validity {validity}");

    // Empty id: InvalidArgument naming the field.
    let e = client
        .get_debug_kubeconfig(debug::GetDebugKubeconfigRequest {
            id: String::new(),
            groups: vec![],
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().starts_with("id:"), "{}", e.message());
    // Every issuance is logged, with the expiry.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !d.log().contains("issued a debug kubeconfig") {
        assert!(std::time::Instant::now() < deadline, "{}", d.log());
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(d.log().contains("not_after_unix"), "{}", d.log());
    // With the caller's address.
    let log = d.log();
    let issued = log
        .lines()
        .find(|l| l.contains("issued a debug kubeconfig"))
        .unwrap();
    let peer = issued
        .split_once("peer")
        .map(|(_, rest)| rest)
        .unwrap_or("");
    assert!(peer.contains("127.0.0.1:"), "{issued}");
}

async fn configured_ca_kubeconfig(runtime: RuntimeKind) {
    let dir = tempfile::tempdir().unwrap();
    let ca =
        ClusterCa::generate_with("Test Kubernetes CA", &rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let cert = dir.path().join("k8s-ca.pem");
    let key = dir.path().join("k8s-ca-key.pem");
    std::fs::write(&cert, ca.cert_pem()).unwrap();
    std::fs::write(&key, ca.key_pem()).unwrap();
    let d = Daemon::start_debug(
        &dir.path().join("data"),
        runtime,
        &[
            "--kubernetes-ca-cert",
            cert.to_str().unwrap(),
            "--kubernetes-ca-key",
            key.to_str().unwrap(),
        ],
    );
    let resp = d
        .debug_client()
        .await
        .get_debug_kubeconfig(debug::GetDebugKubeconfigRequest {
            id: "system:node:worker-1".into(),
            groups: vec!["system:nodes".into()],
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!resp.debug_kubeconfig.contains("GENERATED"));
    let validity = check(
        &resp.debug_kubeconfig,
        &ca.cert_pem(),
        "system:node:worker-1",
        &["system:nodes"],
        "https://127.0.0.1:6443",
    );
    // Default validity: 24 h.
    assert!((86_300..=86_400).contains(&validity), "validity {validity}");
}

async fn no_ca_is_failed_precondition(runtime: RuntimeKind) {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start_debug(
        &dir.path().join("data"),
        runtime,
        &["--kubernetes-ca-generate=false"],
    );
    let e = d
        .debug_client()
        .await
        .get_debug_kubeconfig(debug::GetDebugKubeconfigRequest {
            id: "alice".into(),
            groups: vec![],
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    assert!(
        e.message().contains("--kubernetes-ca-cert"),
        "{}",
        e.message()
    );
    assert!(
        e.message().contains("--kubernetes-ca-key"),
        "{}",
        e.message()
    );
}

/// Spawns a daemon on `data` with `extra` flags that must refuse to
/// start; returns what it logged (not what earlier daemons on `data`
/// did).
fn refused_start(data: &Path, runtime: RuntimeKind, extra: &[String]) -> String {
    let earlier = std::fs::read_to_string(data.with_extension("log"))
        .map(|l| l.len())
        .unwrap_or(0);
    let addr = format!("127.0.0.1:{}", free_port());
    let mut d = Daemon::spawn_with(data, addr, runtime, extra);
    let status = d.wait_exit(Duration::from_secs(30));
    assert!(!status.success(), "started with {extra:?}:\n{}", d.log());
    d.log()[earlier..].to_string()
}

/// A debug listener beyond loopback needs --debug-listen-non-loopback:
/// refused without it (naming both flags), served with it, with a warning
/// that says the service is reachable from the network.
async fn non_loopback_debug_listen_needs_the_opt_in(runtime: RuntimeKind) {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let log = refused_start(
        &data,
        runtime,
        &["--debug-listen".into(), format!("0.0.0.0:{}", free_port())],
    );
    let error = log
        .lines()
        .find(|l| l.starts_with("metropolisd: "))
        .unwrap_or_else(|| panic!("no error line:\n{log}"));
    assert!(error.contains("--debug-listen 0.0.0.0:"), "{error}");
    assert!(error.contains("--debug-listen-non-loopback"), "{error}");
    assert!(error.contains("not a loopback address"), "{error}");
    assert!(
        !data.join("pki").exists(),
        "refused before creating anything"
    );

    let d = Daemon::start_debug_on(&data, runtime, "0.0.0.0", &["--debug-listen-non-loopback"]);
    assert!(
        d.log().contains("REACHABLE FROM THE NETWORK"),
        "{}",
        d.log()
    );
    d.debug_client()
        .await
        .get_debug_kubeconfig(debug::GetDebugKubeconfigRequest {
            id: "alice".into(),
            groups: vec![],
        })
        .await
        .unwrap();

    // On loopback, the opt-in changes nothing but the flag being allowed.
    let other = dir.path().join("other");
    let d = Daemon::start_debug(&other, runtime, &["--debug-listen-non-loopback"]);
    assert!(d.log().contains("UNAUTHENTICATED"), "{}", d.log());
    assert!(
        !d.log().contains("REACHABLE FROM THE NETWORK"),
        "{}",
        d.log()
    );
}

against_both_runtimes!(
    generated_ca_kubeconfig,
    configured_ca_kubeconfig,
    no_ca_is_failed_precondition,
    non_loopback_debug_listen_needs_the_opt_in,
);
