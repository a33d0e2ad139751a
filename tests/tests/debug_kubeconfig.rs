//! GetDebugKubeconfig against a real daemon: the kubeconfig parses, its
//! certificate chains to the Kubernetes CA (generated or configured) with
//! CN=id and O=each group and the configured validity; errors name the
//! field or the flags. No kubeconfig is ever a Metropolis credential: the
//! cluster CA is refused as the Kubernetes CA at start, and Metropolis
//! identities' names are refused in requests. The debug listener needs an
//! opt-in to listen beyond loopback, and every issuance logs its caller's
//! address.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::time::Duration;

use base64::Engine as _;
use metropolis_pki::{ClusterCa, GENERATED_KUBERNETES_CA_CERT, Kubeconfig};
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
    let log = d.log_once_it_holds("issued a debug kubeconfig");
    assert!(log.contains("issued a debug kubeconfig"), "{log}");
    assert!(log.contains("not_after_unix"), "{log}");
    // With the caller's address.
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

/// A daemon with the debug service and a Kubernetes CA of its own (an
/// ECDSA P-256 CA generated here, not the cluster CA), and that CA.
fn with_own_kubernetes_ca(dir: &std::path::Path, runtime: RuntimeKind) -> (Daemon, ClusterCa) {
    let ca =
        ClusterCa::generate_with("Test Kubernetes CA", &rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let cert = dir.join("k8s-ca.pem");
    let key = dir.join("k8s-ca-key.pem");
    std::fs::write(&cert, ca.cert_pem()).unwrap();
    std::fs::write(&key, ca.key_pem()).unwrap();
    let d = Daemon::start_debug(
        &dir.join("data"),
        runtime,
        &[
            "--kubernetes-ca-cert",
            cert.to_str().unwrap(),
            "--kubernetes-ca-key",
            key.to_str().unwrap(),
        ],
    );
    (d, ca)
}

async fn configured_ca_kubeconfig(runtime: RuntimeKind) {
    let dir = tempfile::tempdir().unwrap();
    let (d, ca) = with_own_kubernetes_ca(dir.path(), runtime);
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

/// The takeover: the cluster CA given as the Kubernetes CA would sign
/// `O=metropolis, CN=owner` for anyone reaching the debug service, an
/// owner credential. The daemon refuses to start with it, or with its key
/// under another certificate, or with a CA it signed.
async fn the_cluster_ca_is_refused_as_kubernetes_ca(runtime: RuntimeKind) {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut d = Daemon::start(&data, runtime);
    assert!(d.terminate().success());
    let pki = data.join("pki");
    let cluster_key = std::fs::read_to_string(pki.join("ca-key.pem")).unwrap();
    let key_pair = rcgen::KeyPair::from_pem(&cluster_key).unwrap();
    let ca_params = |cn: &str| {
        let mut params = rcgen::CertificateParams::default();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign];
        params
    };
    // The cluster key under a certificate of its own.
    let rekeyed = dir.path().join("rekeyed.pem");
    let cert = ca_params("Kubernetes CA").self_signed(&key_pair).unwrap();
    std::fs::write(&rekeyed, cert.pem()).unwrap();
    // A CA the cluster CA signed.
    let sub_key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let cluster_issuer = rcgen::Issuer::new(
        ca_params(metropolis_pki::CA_COMMON_NAME),
        rcgen::KeyPair::from_pem(&cluster_key).unwrap(),
    );
    let sub = ca_params("Kubernetes CA")
        .signed_by(&sub_key, &cluster_issuer)
        .unwrap();
    let sub_cert = dir.path().join("sub.pem");
    let sub_key_file = dir.path().join("sub-key.pem");
    std::fs::write(&sub_cert, sub.pem()).unwrap();
    std::fs::write(&sub_key_file, sub_key.serialize_pem()).unwrap();

    let cases = [
        (
            pki.join("ca.pem"),
            pki.join("ca-key.pem"),
            "it is the cluster CA certificate",
        ),
        (
            rekeyed,
            pki.join("ca-key.pem"),
            "its key is the cluster CA's key",
        ),
        (sub_cert, sub_key_file, "it is signed by the cluster CA"),
    ];
    for (cert, key, why) in cases {
        let log = refused_start(
            &data,
            runtime,
            &[
                "--debug-listen".into(),
                format!("127.0.0.1:{}", free_port()),
                "--kubernetes-ca-cert".into(),
                cert.display().to_string(),
                "--kubernetes-ca-key".into(),
                key.display().to_string(),
            ],
        );
        let error = log
            .lines()
            .find(|l| l.starts_with("metropolisd: "))
            .unwrap_or_else(|| panic!("no error line:\n{log}"));
        assert!(error.contains("--kubernetes-ca-cert"), "{error}");
        assert!(error.contains(why), "{why}: {error}");
        assert!(error.contains("not the cluster CA"), "{error}");
        assert!(!log.contains("curator serving"), "{log}");
    }
}

/// Even with a legitimate Kubernetes CA of its own, a debug kubeconfig
/// never names a Metropolis identity: CN owner, CN metropolis-…, O
/// metropolis are InvalidArgument naming the field (the kubeconfig RPC
/// has no caller identity to deny: the argument is what is refused).
async fn metropolis_identities_are_refused(runtime: RuntimeKind) {
    let dir = tempfile::tempdir().unwrap();
    let (d, ca) = with_own_kubernetes_ca(dir.path(), runtime);
    let node = d.node_id().to_string();
    let mut client = d.debug_client().await;
    for (id, groups, field) in [
        ("owner", vec!["metropolis"], "id:"),
        ("owner", vec![], "id:"),
        (node.as_str(), vec![], "id:"),
        ("Metropolis-0123", vec!["dev"], "id:"),
        ("alice", vec!["dev", "metropolis"], "groups[1]:"),
        ("alice", vec!["METROPOLIS"], "groups[0]:"),
    ] {
        let e = client
            .get_debug_kubeconfig(debug::GetDebugKubeconfigRequest {
                id: id.into(),
                groups: groups.iter().map(|g| g.to_string()).collect(),
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{id} {groups:?}");
        assert!(e.message().starts_with(field), "{}", e.message());
        assert!(e.message().contains("is reserved"), "{}", e.message());
    }
    // As the takeover would ask for it, through metroctl.
    let out = d.metroctl(&["kubeconfig", "--id", "owner", "--group", "metropolis"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("InvalidArgument") && stderr.contains("id:"),
        "{stderr}"
    );
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    // Names that only resemble them are Kubernetes names like any other.
    let resp = client
        .get_debug_kubeconfig(debug::GetDebugKubeconfigRequest {
            id: "owner-alice".into(),
            groups: vec!["metropolis-admins".into()],
        })
        .await
        .unwrap()
        .into_inner();
    check(
        &resp.debug_kubeconfig,
        &ca.cert_pem(),
        "owner-alice",
        &["metropolis-admins"],
        "https://127.0.0.1:6443",
    );
}

/// Asserts that `d` logs `text` within 10 s: the daemon answers on its
/// listeners (bound first) a moment before it logs what it serves.
fn logs_soon(d: &Daemon, text: &str) {
    let log = d.log_once_it_holds(text);
    assert!(log.contains(text), "{text:?} not logged:\n{log}");
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
    logs_soon(&d, "REACHABLE FROM THE NETWORK");
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
    logs_soon(&d, "UNAUTHENTICATED");
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
    the_cluster_ca_is_refused_as_kubernetes_ca,
    metropolis_identities_are_refused,
    non_loopback_debug_listen_needs_the_opt_in,
);
