//! Agent authentication: a provisioning agent presents a **self-signed**
//! certificate whose key is its Ed25519 agent key. The TLS handshake proves
//! the agent holds that key; this module checks the certificate is what an
//! agent must present and returns the key, which the AgentCallback service
//! then matches against the registered machine.

use x509_parser::oid_registry::OID_SIG_ED25519;
use x509_parser::prelude::{FromDer, X509Certificate};

/// Why a client certificate is not a valid agent certificate. Display says
/// what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum AgentCertError {
    /// No client certificate was presented.
    Missing,
    /// The bytes are not one DER X.509 certificate.
    Malformed(String),
    /// The key is not an Ed25519 key.
    NotEd25519 {
        /// The algorithm OID found.
        algorithm: String,
    },
    /// The certificate is not signed by its own key.
    NotSelfSigned(String),
}

impl std::fmt::Display for AgentCertError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AgentCertError::Missing => write!(
                f,
                "no client certificate: agents present a self-signed Ed25519 certificate"
            ),
            AgentCertError::Malformed(why) => write!(f, "client certificate is malformed: {why}"),
            AgentCertError::NotEd25519 { algorithm } => {
                write!(
                    f,
                    "client certificate key is {algorithm}, not Ed25519 (1.3.101.112)"
                )
            }
            AgentCertError::NotSelfSigned(why) => {
                write!(
                    f,
                    "client certificate is not self-signed by its Ed25519 key: {why}"
                )
            }
        }
    }
}

impl std::error::Error for AgentCertError {}

/// The Ed25519 agent key of a self-signed agent certificate (DER).
pub fn agent_key_from_certificate(der: &[u8]) -> Result<[u8; 32], AgentCertError> {
    let (rest, cert) =
        X509Certificate::from_der(der).map_err(|e| AgentCertError::Malformed(e.to_string()))?;
    if !rest.is_empty() {
        return Err(AgentCertError::Malformed(format!(
            "{} bytes after the certificate",
            rest.len()
        )));
    }
    let spki = cert.public_key();
    if spki.algorithm.algorithm != OID_SIG_ED25519 {
        return Err(AgentCertError::NotEd25519 {
            algorithm: spki.algorithm.algorithm.to_id_string(),
        });
    }
    let key = <[u8; 32]>::try_from(spki.subject_public_key.data.as_ref())
        .map_err(|_| AgentCertError::Malformed("the Ed25519 key is not 32 bytes".into()))?;
    cert.verify_signature(None)
        .map_err(|e| AgentCertError::NotSelfSigned(e.to_string()))?;
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn self_signed(alg: &'static rcgen::SignatureAlgorithm) -> (rcgen::KeyPair, Vec<u8>) {
        let key = rcgen::KeyPair::generate_for(alg).expect("key generation");
        let params = rcgen::CertificateParams::new(vec!["agent".into()]).expect("params");
        let cert = params.self_signed(&key).expect("self-signed certificate");
        (key, cert.der().to_vec())
    }

    #[test]
    fn self_signed_ed25519_gives_its_key() {
        let (key, der) = self_signed(&rcgen::PKCS_ED25519);
        assert_eq!(
            agent_key_from_certificate(&der).expect("valid").as_slice(),
            key.public_key_raw()
        );
    }

    #[test]
    fn other_keys_and_other_signers_are_refused() {
        let (_, der) = self_signed(&rcgen::PKCS_ECDSA_P256_SHA256);
        assert!(matches!(
            agent_key_from_certificate(&der),
            Err(AgentCertError::NotEd25519 { .. })
        ));

        // An Ed25519 certificate signed by another key (a CA).
        let ca_key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).expect("key");
        let mut ca_params = rcgen::CertificateParams::new(vec![]).expect("params");
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = ca_params.self_signed(&ca_key).expect("ca");
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        let leaf_key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).expect("key");
        let leaf = rcgen::CertificateParams::new(vec!["agent".into()])
            .expect("params")
            .signed_by(&leaf_key, &issuer)
            .expect("leaf");
        let _ = ca;
        assert!(matches!(
            agent_key_from_certificate(leaf.der()),
            Err(AgentCertError::NotSelfSigned(_))
        ));

        assert!(matches!(
            agent_key_from_certificate(b"garbage"),
            Err(AgentCertError::Malformed(_))
        ));
    }
}
