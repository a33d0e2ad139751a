//! The choice of this node's server certificate per ClientHello: Ed25519
//! when the client offers Ed25519 signatures, else ECDSA P-256.
//!
//! BoringSSL (gRPC C-core: Python `grpcio`, C++, Ruby) offers no Ed25519
//! signature scheme, so against an Ed25519-only server it fails with "no
//! signature schemes in common". Clients that do offer Ed25519 (Go,
//! OpenSSL, rustls, including this daemon's own connections to the
//! leader) keep getting the Ed25519 certificate.

use std::sync::Arc;

use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::{SignatureAlgorithm, SignatureScheme};

use super::PkiError;

/// Presents the Ed25519 certificate to clients offering
/// [`SignatureScheme::ED25519`], and the P-256 one to all others.
#[derive(Debug)]
pub(crate) struct NodeCertResolver {
    ed25519: Arc<CertifiedKey>,
    p256: Arc<CertifiedKey>,
}

impl NodeCertResolver {
    /// A resolver over the two certificates; an error when their keys are
    /// not Ed25519 and ECDSA respectively.
    pub(crate) fn new(
        ed25519: CertifiedKey,
        p256: CertifiedKey,
    ) -> Result<NodeCertResolver, PkiError> {
        if ed25519.key.algorithm() != SignatureAlgorithm::ED25519 {
            return Err(PkiError::invalid(
                "node certificate",
                "its key is not an Ed25519 key",
            ));
        }
        if p256.key.algorithm() != SignatureAlgorithm::ECDSA {
            return Err(PkiError::invalid(
                "P-256 server certificate",
                "its key is not an ECDSA key",
            ));
        }
        Ok(NodeCertResolver {
            ed25519: Arc::new(ed25519),
            p256: Arc::new(p256),
        })
    }
}

impl ResolvesServerCert for NodeCertResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        if hello
            .signature_schemes()
            .contains(&SignatureScheme::ED25519)
        {
            Some(self.ed25519.clone())
        } else {
            // Also for a client that offers neither: the handshake then
            // fails with rustls's "no signature schemes in common".
            tracing::trace!(
                "client offers no Ed25519 signatures: presenting the P-256 certificate"
            );
            Some(self.p256.clone())
        }
    }
}
