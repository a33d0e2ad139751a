//! Agent credentials: a provisioning agent proves ownership of its Ed25519
//! key with a self-signed certificate, no CA involved.

use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair, PKCS_ED25519};

use super::PkiError;

/// Common name of agent certificates (informative only: the server
/// identifies the agent by its key).
pub const AGENT_COMMON_NAME: &str = "metropolis agent";

/// A new Ed25519 agent key, PKCS#8 v1 PEM (see
/// [`generate_ed25519_key`](super::generate_ed25519_key)).
pub fn generate_agent_key() -> Result<String, PkiError> {
    Ok(super::keys::generate_ed25519("generate the agent key")?.serialize_pem())
}

/// A self-signed certificate (PEM) for the Ed25519 agent key in `key_pem`,
/// and the key's 32 public bytes.
pub fn self_signed_agent_certificate(key_pem: &str) -> Result<(String, [u8; 32]), PkiError> {
    let key = KeyPair::from_pem(key_pem).map_err(PkiError::crypto("read the agent key"))?;
    if key.algorithm() != &PKCS_ED25519 {
        return Err(PkiError::invalid("agent key", "not an Ed25519 key"));
    }
    let public: [u8; 32] = key
        .public_key_raw()
        .try_into()
        .map_err(|_| PkiError::invalid("agent key", "the Ed25519 public key is not 32 bytes"))?;
    let mut params = CertificateParams::new(Vec::<String>::new())
        .map_err(PkiError::crypto("build the agent certificate"))?;
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, AGENT_COMMON_NAME);
    params.distinguished_name = name;
    let cert = params
        .self_signed(&key)
        .map_err(PkiError::crypto("sign the agent certificate"))?;
    Ok((cert.pem(), public))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_certificate_is_accepted_as_an_agent_certificate() {
        let key = generate_agent_key().expect("key");
        let (pem, public) = self_signed_agent_certificate(&key).expect("certificate");
        let der = rustls::pki_types::pem::PemObject::from_pem_slice(pem.as_bytes())
            .map(|c: rustls::pki_types::CertificateDer<'static>| c.to_vec())
            .expect("PEM certificate");
        let got = metropolis_core::agent_cert::agent_key_from_certificate(&der)
            .expect("agent certificate");
        assert_eq!(got, public);
    }
}
