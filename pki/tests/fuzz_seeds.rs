//! Writes the seeds of the `peer_certificate` fuzz target
//! (`fuzz/seeds/peer_certificate/`): real certificates made by this
//! crate (cluster CA, node, curator node, owner, agent; Ed25519 and
//! P-256) and by `rcgen` with subjects the cluster CA never issues
//! (another organization, an ECDSA node key, a node name for another
//! key, long names; `rcgen` keeps one value per attribute type). The
//! test kit cannot make them itself: it does not depend on the PKI. Run
//! by hand: `cargo test -p metropolis-pki --test fuzz_seeds -- --ignored`
//! (which also writes `fuzz/regressions/peer_certificate/`).

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

use metropolis_core::identity::{CURATOR_URI, NodeId};
use metropolis_pki::{ClusterCa, generate_agent_key, self_signed_agent_certificate};
use rcgen::{CertificateParams, DnType, KeyPair, PKCS_ECDSA_P256_SHA256, PKCS_ED25519, SanType};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

fn der(pem: &str) -> Vec<u8> {
    CertificateDer::from_pem_slice(pem.as_bytes())
        .unwrap()
        .to_vec()
}

/// A self-signed certificate with `names` as its subject.
fn with_subject(key: &KeyPair, names: &[(DnType, &str)], sans: Vec<SanType>) -> Vec<u8> {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.distinguished_name = rcgen::DistinguishedName::new();
    for (kind, value) in names {
        params.distinguished_name.push(kind.clone(), *value);
    }
    params.subject_alt_names = sans;
    params.self_signed(key).unwrap().der().to_vec()
}

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds/peer_certificate")
}

/// The certificates, by seed name.
fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let ca = ClusterCa::generate().unwrap();
    let (node, _) = ca
        .issue_node(&["10.0.0.7".into(), "node.example".into()])
        .unwrap();
    let (curator, _) = ca.issue_curator_node(&[]).unwrap();
    let owner = ca.issue_owner().unwrap();
    let (agent, _) = self_signed_agent_certificate(&generate_agent_key().unwrap()).unwrap();
    let p256_ca = ClusterCa::generate_with("P-256 CA", &PKCS_ECDSA_P256_SHA256).unwrap();
    let (p256_node, _) = p256_ca.issue_curator_node(&[]).unwrap();

    let ed = KeyPair::generate_for(&PKCS_ED25519).unwrap();
    let ecdsa = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
    let own_id = NodeId::from_public_key(&ed.public_key_raw().try_into().unwrap());
    let other_id = NodeId::from_public_key(&[9; 32]);
    let curator_uri = || vec![SanType::URI(CURATOR_URI.try_into().unwrap())];
    let long = "x".repeat(300);
    vec![
        ("ca", ca.cert_der().to_vec()),
        ("node", der(&node.cert_pem)),
        ("curator-node", der(&curator.cert_pem)),
        ("owner", der(&owner.cert_pem)),
        ("agent", der(&agent)),
        ("p256-ca", p256_ca.cert_der().to_vec()),
        ("p256-curator-node", der(&p256_node.cert_pem)),
        (
            "self-signed-node",
            with_subject(&ed, &[(DnType::CommonName, own_id.as_str())], curator_uri()),
        ),
        (
            "node-other-key",
            with_subject(&ed, &[(DnType::CommonName, other_id.as_str())], vec![]),
        ),
        (
            "node-ecdsa-key",
            with_subject(
                &ecdsa,
                &[(DnType::CommonName, own_id.as_str())],
                curator_uri(),
            ),
        ),
        (
            "node-bad-id",
            with_subject(&ed, &[(DnType::CommonName, "metropolis-XYZ")], vec![]),
        ),
        (
            "owner-other-org",
            with_subject(
                &ed,
                &[
                    (DnType::CommonName, "owner"),
                    (DnType::OrganizationName, "evil"),
                ],
                vec![],
            ),
        ),
        (
            "owner-ecdsa",
            with_subject(
                &ecdsa,
                &[
                    (DnType::CommonName, "owner"),
                    (DnType::OrganizationName, "metropolis"),
                ],
                vec![],
            ),
        ),
        (
            "long-names",
            with_subject(
                &ed,
                &[
                    (DnType::CommonName, &long),
                    (DnType::OrganizationName, &long),
                ],
                vec![SanType::DnsName(long.as_str().try_into().unwrap())],
            ),
        ),
        ("no-subject", with_subject(&ed, &[], curator_uri())),
    ]
}

/// An owner certificate with an organization of 3,000 characters: its
/// error once quoted it whole, past the harness's bound. Kept in
/// `fuzz/regressions/peer_certificate/`. (`rcgen` keeps one value per
/// attribute type, so a subject cannot list several organizations here.)
fn owner_long_organization() -> Vec<u8> {
    let key = KeyPair::generate_for(&PKCS_ED25519).unwrap();
    let org = "o".repeat(3000);
    let names = [
        (DnType::CommonName, "owner"),
        (DnType::OrganizationName, org.as_str()),
    ];
    with_subject(&key, &names, vec![])
}

#[test]
#[ignore = "writes fuzz/regressions/peer_certificate; run by hand"]
fn write_peer_certificate_regressions() {
    let dir = dir().join("../../regressions/peer_certificate");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("owner-long-organization"),
        owner_long_organization(),
    )
    .unwrap();
}

#[test]
#[ignore = "writes fuzz/seeds/peer_certificate; run by hand"]
fn write_peer_certificate_seeds() {
    let dir = dir();
    std::fs::create_dir_all(&dir).unwrap();
    for (name, der) in seeds() {
        std::fs::write(dir.join(name), der).unwrap();
    }
}
