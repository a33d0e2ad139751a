//! A TLS peer must present exactly one client certificate, as the
//! reference's servers require (`getPeerCertificate`,
//! `metropolis/node/core/rpc/server_authentication.go` at `80861fd7`,
//! lines 206-212): a chain identifies nobody on either mutual-TLS port,
//! even one that verifies, and the peer is told why.

#![allow(clippy::unwrap_used)]

use metropolis_core::identity::Identity;
use metropolis_pki::ClusterCa;
use metropolis_transport::peer::{AgentClassifier, Classify, PeerClassifier, admit};
use rustls::pki_types::CertificateDer;

fn agent_certificate() -> (CertificateDer<'static>, [u8; 32]) {
    let key = metropolis_pki::generate_agent_key().unwrap();
    let (pem, public) = metropolis_pki::self_signed_agent_certificate(&key).unwrap();
    let der = rustls::pki_types::pem::PemObject::from_pem_slice(pem.as_bytes()).unwrap();
    (der, public)
}

fn assert_refused(classifier: &dyn Classify, chain: &[CertificateDer<'_>]) {
    let peer = admit(classifier, Some(chain));
    assert_eq!(peer.identity, Identity::Unauthenticated);
    assert_eq!(peer.curator, None);
    let refusal = peer.refusal.expect("a refusal saying why");
    let want = format!(
        "exactly one client certificate must be sent (got {})",
        chain.len()
    );
    assert!(refusal.starts_with(&want), "{refusal}");
    assert_eq!(classifier.classify(Some(chain)), Identity::Unauthenticated);
}

#[test]
fn the_curator_port_takes_one_certificate_and_no_chain() {
    let ca = ClusterCa::generate().unwrap();
    let classifier = PeerClassifier::new(ca.cert_der()).unwrap();
    let owner = ca.issue_owner().unwrap().cert_der().unwrap();
    let alone = admit(&classifier, Some(std::slice::from_ref(&owner)));
    assert_eq!(alone.identity, Identity::Owner);
    assert_eq!(alone.refusal, None);
    // With the CA after it, the chain verifies, and is still refused.
    assert_refused(&classifier, &[owner.clone(), ca.cert_der()]);
    assert_refused(&classifier, &[owner.clone(), owner.clone(), owner]);
    let nobody = admit(&classifier, None);
    assert_eq!(nobody.identity, Identity::Unauthenticated);
    assert_eq!(nobody.refusal, None, "no certificate is not a chain");
}

#[test]
fn the_agent_port_takes_one_certificate_and_no_chain() {
    let (cert, public) = agent_certificate();
    let alone = admit(&AgentClassifier, Some(std::slice::from_ref(&cert)));
    assert_eq!(alone.identity, Identity::Agent(public));
    assert_eq!(alone.refusal, None);
    let (other, _) = agent_certificate();
    assert_refused(&AgentClassifier, &[cert.clone(), other]);
    assert_refused(&AgentClassifier, &[cert.clone(), cert]);
}
