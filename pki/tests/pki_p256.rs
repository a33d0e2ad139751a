//! The node's ECDSA P-256 server certificate: which certificate real rustls
//! handshakes get (a client restricted to ECDSA signature schemes, like
//! BoringSSL, against one offering Ed25519), and the certificate's files
//! (created, kept, re-issued when it no longer matches).

#![allow(clippy::unwrap_used)]

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;

use metropolis_core::identity::{Identity, NodeId, identity_from_certificate};
use metropolis_pki::{
    ClientAuth, ClusterCa, Credentials, P256_PREFIX, P256Status, PkiError, client_config,
    load_or_issue_p256, node_server_config, p256_mismatch, server_config,
};
use metropolis_testkit::tls::{self, Failure};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, RootCertStore, ServerConfig, SignatureScheme};
use x509_parser::oid_registry::{OID_KEY_TYPE_EC_PUBLIC_KEY, OID_SIG_ED25519};

/// A handshake in memory: the server certificate the client got and the
/// client certificate the server got, or the first error (client's or
/// server's).
fn handshake(
    client: Arc<ClientConfig>,
    server: Arc<ServerConfig>,
    name: ServerName<'static>,
) -> Result<(CertificateDer<'static>, Option<CertificateDer<'static>>), rustls::Error> {
    let (client, server) = tls::handshake(client, server, name).map_err(Failure::into_error)?;
    let server_cert = client.peer_certificates().unwrap()[0].clone().into_owned();
    let client_cert = server
        .peer_certificates()
        .map(|c| c[0].clone().into_owned());
    Ok((server_cert, client_cert))
}

/// The *ring* provider offering only ECDSA signature schemes in its
/// ClientHello, as BoringSSL offers no Ed25519. It still verifies Ed25519
/// signatures on certificates (the cluster CA's), as BoringSSL does.
fn ecdsa_only_provider() -> Arc<CryptoProvider> {
    let mut provider = rustls::crypto::ring::default_provider();
    let mapping: Vec<_> = provider
        .signature_verification_algorithms
        .mapping
        .iter()
        .filter(|(scheme, _)| {
            matches!(
                scheme,
                SignatureScheme::ECDSA_NISTP256_SHA256 | SignatureScheme::ECDSA_NISTP384_SHA384
            )
        })
        .cloned()
        .collect();
    assert_eq!(mapping.len(), 2);
    provider.signature_verification_algorithms.mapping = Box::leak(mapping.into_boxed_slice());
    Arc::new(provider)
}

/// A TLS 1.3 client offering only ECDSA schemes, trusting `ca_pem`,
/// presenting `creds` when given.
fn ecdsa_only_client(ca_pem: &str, creds: Option<&Credentials>) -> Arc<ClientConfig> {
    let mut roots = RootCertStore::empty();
    roots
        .add(
            Credentials::from_parts(String::new(), String::new(), ca_pem.to_owned())
                .ca_der()
                .unwrap(),
        )
        .unwrap();
    let builder = ClientConfig::builder_with_provider(ecdsa_only_provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots);
    let mut config = match creds {
        Some(c) => builder
            .with_client_auth_cert(c.chain_der().unwrap(), c.key_der().unwrap())
            .unwrap(),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    Arc::new(config)
}

fn key_algorithm(der: &[u8]) -> x509_parser::der_parser::oid::Oid<'static> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).unwrap();
    cert.public_key().algorithm.algorithm.to_owned()
}

fn common_name(der: &[u8]) -> String {
    let (_, cert) = x509_parser::parse_x509_certificate(der).unwrap();
    let cn = cert.subject().iter_common_name().next().unwrap();
    cn.as_str().unwrap().to_owned()
}

/// A CA, its node's credentials (a curator instance's), and their P-256
/// twin.
struct Node {
    ca: ClusterCa,
    node: Credentials,
    id: NodeId,
    p256: Credentials,
}

fn node() -> Node {
    let ca = ClusterCa::generate().unwrap();
    let (node, id) = ca.issue_curator_node(&["10.0.0.7".to_owned()]).unwrap();
    let p256 = ca.issue_p256_server_cert(&node).unwrap();
    Node { ca, node, id, p256 }
}

fn name(s: &str) -> ServerName<'static> {
    ServerName::try_from(s.to_owned()).unwrap()
}

#[test]
fn a_client_without_ed25519_gets_the_p256_certificate_for_the_same_names() {
    let n = node();
    let owner = n.ca.issue_owner().unwrap();
    let server = node_server_config(&n.node, &n.p256, ClientAuth::Deferred).unwrap();
    // Full WebPKI verification, names included: the P-256 certificate
    // carries the node's SANs (node ID, loopback, the extra one).
    for dialed in [n.id.as_str(), "localhost", "127.0.0.1", "10.0.0.7"] {
        let client = ecdsa_only_client(&n.ca.cert_pem(), Some(&owner));
        let (server_cert, client_cert) = handshake(client, server.clone(), name(dialed)).unwrap();
        assert_eq!(server_cert, n.p256.cert_der().unwrap(), "dialed {dialed}");
        assert_eq!(key_algorithm(&server_cert), OID_KEY_TYPE_EC_PUBLIC_KEY);
        assert_eq!(common_name(&server_cert), n.id.as_str());
        // The client still authenticates with its Ed25519 owner key.
        assert_eq!(
            identity_from_certificate(&client_cert.unwrap()).unwrap(),
            Identity::Owner
        );
    }
    // A name the certificates do not carry is refused.
    let client = ecdsa_only_client(&n.ca.cert_pem(), None);
    let err = handshake(client, server, name("elsewhere.example")).unwrap_err();
    assert!(
        matches!(err, rustls::Error::InvalidCertificate(_)),
        "{err:?}"
    );
}

#[test]
fn a_client_offering_ed25519_gets_the_ed25519_certificate() {
    let n = node();
    let server = node_server_config(&n.node, &n.p256, ClientAuth::Deferred).unwrap();
    let client = client_config(Some(&n.node), &n.ca.cert_pem()).unwrap();
    let (server_cert, client_cert) = handshake(client, server, name(n.id.as_str())).unwrap();
    assert_eq!(server_cert, n.node.cert_der().unwrap());
    assert_eq!(key_algorithm(&server_cert), OID_SIG_ED25519);
    assert_eq!(
        identity_from_certificate(&server_cert).unwrap(),
        Identity::Node(n.id.clone())
    );
    assert_eq!(
        identity_from_certificate(&client_cert.unwrap()).unwrap(),
        Identity::Node(n.id)
    );
}

#[test]
fn an_ed25519_only_server_fails_a_client_without_ed25519() {
    // The measured problem the P-256 certificate solves.
    let n = node();
    let server = server_config(&n.node, ClientAuth::Deferred).unwrap();
    let client = ecdsa_only_client(&n.ca.cert_pem(), None);
    let err = handshake(client, server, name(n.id.as_str())).unwrap_err();
    assert_eq!(
        err,
        rustls::Error::PeerIncompatible(rustls::PeerIncompatible::NoSignatureSchemesInCommon)
    );
}

#[test]
fn the_p256_certificate_does_not_authenticate_as_the_node() {
    let n = node();
    let err = identity_from_certificate(&n.p256.cert_der().unwrap()).unwrap_err();
    assert!(err.to_string().contains("Ed25519"), "{err}");
}

#[test]
fn swapped_certificates_are_refused() {
    let n = node();
    let err = node_server_config(&n.p256, &n.node, ClientAuth::Deferred).unwrap_err();
    assert!(matches!(err, PkiError::Invalid { .. }), "{err}");
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

fn read(dir: &Path) -> (Vec<u8>, Vec<u8>) {
    (
        std::fs::read(Credentials::cert_path(dir, P256_PREFIX)).unwrap(),
        std::fs::read(Credentials::key_path(dir, P256_PREFIX)).unwrap(),
    )
}

fn reason(status: P256Status) -> String {
    match status {
        P256Status::Reissued { reason } => reason,
        other => panic!("not reissued: {other:?}"),
    }
}

#[test]
fn the_p256_certificate_is_created_kept_and_reissued_when_it_no_longer_matches() {
    let dir = tempfile::tempdir().unwrap();
    let pki = dir.path();
    let n = node();
    n.ca.write_to_dir(pki).unwrap();
    n.node.write_to_dir(pki, "node").unwrap();

    let (created, status) = load_or_issue_p256(pki, &n.ca, &n.node).unwrap();
    assert_eq!(status, P256Status::Created);
    assert_eq!(mode(&Credentials::key_path(pki, P256_PREFIX)), 0o600);
    assert_eq!(mode(&Credentials::cert_path(pki, P256_PREFIX)), 0o644);
    let files = read(pki);
    assert_eq!(files.0, created.cert_pem.as_bytes());
    assert!(
        !std::fs::read_dir(pki).unwrap().any(|e| e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .ends_with(".tmp")),
        "no temporary file is left behind"
    );

    let (kept, status) = load_or_issue_p256(pki, &n.ca, &n.node).unwrap();
    assert_eq!(status, P256Status::Kept);
    assert_eq!(kept, created);
    assert_eq!(read(pki), files);

    // The node certificate gains SANs: its twin follows.
    let cert_pem =
        n.ca.issue_node_cert(&n.node.ed25519_public_key().unwrap(), &[], true)
            .unwrap();
    let node = Credentials::from_parts(cert_pem, n.node.key_pem.clone(), n.node.ca_pem.clone());
    let (_, status) = load_or_issue_p256(pki, &n.ca, &node).unwrap();
    assert!(reason(status).contains("subject alternative names"));
    let (_, status) = load_or_issue_p256(pki, &n.ca, &node).unwrap();
    assert_eq!(status, P256Status::Kept);

    // Another node identity.
    let (other, _) = n.ca.issue_curator_node(&[]).unwrap();
    let (twin, status) = load_or_issue_p256(pki, &n.ca, &other).unwrap();
    assert!(reason(status).contains("subject"));
    assert_eq!(
        common_name(&twin.cert_der().unwrap()),
        common_name(&other.cert_der().unwrap())
    );

    // Another CA (the directory's ca.pem is the new CA's).
    let ca2 = ClusterCa::generate().unwrap();
    let (node2, _) = ca2.issue_curator_node(&[]).unwrap();
    ca2.write_to_dir(pki).unwrap();
    let (twin, status) = load_or_issue_p256(pki, &ca2, &node2).unwrap();
    assert!(!reason(status).is_empty());
    Credentials::from_parts(twin.cert_pem, twin.key_pem, ca2.cert_pem())
        .validate()
        .unwrap();
    let (_, status) = load_or_issue_p256(pki, &ca2, &node2).unwrap();
    assert_eq!(status, P256Status::Kept);

    // A garbled key file.
    std::fs::write(Credentials::key_path(pki, P256_PREFIX), "garbage").unwrap();
    let (_, status) = load_or_issue_p256(pki, &ca2, &node2).unwrap();
    assert!(reason(status).contains(P256_PREFIX));
    assert_eq!(mode(&Credentials::key_path(pki, P256_PREFIX)), 0o600);
}

#[test]
fn mismatches_are_named() {
    let n = node();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert_eq!(p256_mismatch(&n.ca, &n.node, &n.p256, now).unwrap(), None);

    let der = n.p256.cert_der().unwrap();
    let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
    let not_before = u64::try_from(cert.validity().not_before.timestamp()).unwrap();
    let not_after = u64::try_from(cert.validity().not_after.timestamp()).unwrap();
    let near_expiry = not_after - 10 * 24 * 3600;
    let why = p256_mismatch(&n.ca, &n.node, &n.p256, near_expiry)
        .unwrap()
        .unwrap();
    assert!(why.contains("expires"), "{why}");
    let early = p256_mismatch(&n.ca, &n.node, &n.p256, not_before - 1)
        .unwrap()
        .unwrap();
    assert!(early.contains("not valid before"), "{early}");

    // The Ed25519 certificate is no P-256 twin of itself.
    let why = p256_mismatch(&n.ca, &n.node, &n.node, now)
        .unwrap()
        .unwrap();
    assert!(why.contains("not an ECDSA P-256 key"), "{why}");

    // The key of another P-256 certificate.
    let other = n.ca.issue_p256_server_cert(&n.node).unwrap();
    let swapped = Credentials::from_parts(
        n.p256.cert_pem.clone(),
        other.key_pem,
        n.p256.ca_pem.clone(),
    );
    let why = p256_mismatch(&n.ca, &n.node, &swapped, now)
        .unwrap()
        .unwrap();
    assert!(why.contains("does not belong"), "{why}");

    // Issued by another CA.
    let ca2 = ClusterCa::generate().unwrap();
    let foreign = ca2.issue_p256_server_cert(&n.node).unwrap();
    let why = p256_mismatch(&n.ca, &n.node, &foreign, now)
        .unwrap()
        .unwrap();
    assert!(why.contains("cluster CA"), "{why}");
}
