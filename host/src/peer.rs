//! Who is calling: TLS servers that let every client certificate through
//! the handshake and classify it afterwards.
//!
//! The semantics ask for a gRPC `Unauthenticated` status (not a failed
//! handshake) when a caller has no certificate or one not chained to the
//! cluster CA. So the TLS layer only checks that the client holds the key
//! of the certificate it presents (the TLS 1.3 CertificateVerify
//! signature), and [`PeerClassifier`] then verifies the chain against the
//! cluster CA and derives the [`Identity`] the service layer authorizes.
//! The same split serves agents, whose certificates are self-signed.

use std::sync::Arc;

use metropolis_core::identity::{Identity, identity_from_certificate};
use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme};

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Accepts any client certificate whose key the client proves it holds;
/// trust is decided after the handshake.
#[derive(Debug)]
struct DeferredClientAuth {
    algorithms: WebPkiSupportedAlgorithms,
}

impl ClientCertVerifier for DeferredClientAuth {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Err(rustls::Error::PeerIncompatible(
            rustls::PeerIncompatible::Tls12NotOffered,
        ))
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// A TLS 1.3 server configuration (ALPN `h2`) that asks every client for a
/// certificate, accepts any whose key the client holds, and leaves trust
/// to a [`PeerClassifier`] (or to the service, for self-signed agents).
pub fn deferred_server_config(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<Arc<rustls::ServerConfig>, rustls::Error> {
    let provider = provider();
    let verifier = Arc::new(DeferredClientAuth {
        algorithms: provider.signature_verification_algorithms,
    });
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// Decides the [`Identity`] of a TLS peer from its certificate chain.
#[derive(Debug)]
pub struct PeerClassifier {
    verifier: Arc<dyn ClientCertVerifier>,
}

impl PeerClassifier {
    /// A classifier trusting certificates chained to `ca` (DER).
    pub fn new(ca: CertificateDer<'static>) -> Result<Self, rustls::Error> {
        let mut roots = RootCertStore::empty();
        roots
            .add(ca)
            .map_err(|e| rustls::Error::General(format!("cluster CA certificate: {e}")))?;
        let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
            .build()
            .map_err(|e| rustls::Error::General(format!("client verifier: {e}")))?;
        Ok(PeerClassifier { verifier })
    }

    /// The identity of a peer that presented `chain` (end entity first):
    /// unauthenticated when there is none, when it does not chain to the
    /// cluster CA, or when it names no known kind of identity.
    pub fn classify(&self, chain: Option<&[CertificateDer<'_>]>) -> Identity {
        let Some((leaf, intermediates)) = chain.and_then(|c| c.split_first()) else {
            return Identity::Unauthenticated;
        };
        if let Err(e) = self
            .verifier
            .verify_client_cert(leaf, intermediates, UnixTime::now())
        {
            tracing::debug!(error = %e, "client certificate not issued by the cluster CA");
            return Identity::Unauthenticated;
        }
        match identity_from_certificate(leaf) {
            Ok(identity) => identity,
            Err(e) => {
                tracing::warn!(error = %e, "client certificate from the cluster CA names no known identity");
                Identity::Unauthenticated
            }
        }
    }
}
