//! rustls configurations for the cluster's mutual TLS.
//!
//! Both sides speak TLS 1.3 only, offer ALPN `h2` (gRPC), and use the
//! *ring* crypto provider explicitly: nothing depends on a process-wide
//! default provider being installed.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{WebPkiServerVerifier, verify_server_cert_signed_by_trust_anchor};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::{ParsedCertificate, WebPkiClientVerifier};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, ServerConfig,
    SignatureScheme,
};

use rustls::sign::CertifiedKey;

use super::cert_resolver::NodeCertResolver;
use super::credentials::certs_from_pem;
use super::{Credentials, PkiError};

/// The ALPN protocol both sides offer.
pub const ALPN_H2: &[u8] = b"h2";

/// The crypto provider of every configuration built here (*ring*), for
/// verifiers built elsewhere on the same provider.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Whether a server asks its clients for a certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClientAuth {
    /// Clients must present a certificate chained to the cluster CA. A
    /// client without one, or with one from another CA, fails the
    /// handshake, so the gRPC layer never sees it.
    Required,
    /// Clients may present no certificate (the gRPC layer then sees an
    /// unauthenticated caller); a certificate they do present must still be
    /// chained to the cluster CA, or the handshake fails. For services that
    /// let anonymous callers in or authenticate them differently.
    Optional,
    /// Clients are asked for a certificate and any certificate is let
    /// through, provided the client proves it holds its key (the TLS 1.3
    /// CertificateVerify signature); trust is decided after the handshake
    /// (see `peer::PeerClassifier`, or the service itself for self-signed
    /// agent certificates). So a caller without a certificate, or with one
    /// from another CA, reaches the gRPC layer and gets `Unauthenticated`
    /// there rather than a failed handshake.
    Deferred,
}

/// Accepts any client certificate whose key the client holds.
#[derive(Debug)]
struct DeferredClientAuth {
    algorithms: WebPkiSupportedAlgorithms,
}

impl rustls::server::danger::ClientCertVerifier for DeferredClientAuth {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[rustls::DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<rustls::server::danger::ClientCertVerified, rustls::Error> {
        Ok(rustls::server::danger::ClientCertVerified::assertion())
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

/// A TLS 1.3 server configuration (ALPN `h2`) presenting `creds`' certificate,
/// trusting client certificates issued by `creds`' CA, as `client_auth`
/// says.
pub fn server_config(
    creds: &Credentials,
    client_auth: ClientAuth,
) -> Result<Arc<ServerConfig>, PkiError> {
    let provider = provider();
    let verifier = client_verifier(&creds.ca_pem, client_auth, &provider)?;
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(PkiError::tls("TLS server configuration"))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(creds.chain_der()?, creds.key_der()?)
        .map_err(PkiError::tls("TLS server configuration"))?;
    config.alpn_protocols = vec![ALPN_H2.to_vec()];
    Ok(Arc::new(config))
}

/// A TLS 1.3 server configuration (ALPN `h2`) like [`server_config`] for a
/// node with two server certificates of the same identity: `node` (its
/// Ed25519 certificate) for clients that offer Ed25519 signatures, `p256`
/// (its ECDSA P-256 certificate) for the others, such as BoringSSL. Client
/// certificates are trusted as `client_auth` says, against `node`'s CA.
pub fn node_server_config(
    node: &Credentials,
    p256: &Credentials,
    client_auth: ClientAuth,
) -> Result<Arc<ServerConfig>, PkiError> {
    let provider = provider();
    let verifier = client_verifier(&node.ca_pem, client_auth, &provider)?;
    let certified = |creds: &Credentials| {
        CertifiedKey::from_der(creds.chain_der()?, creds.key_der()?, &provider)
            .map_err(PkiError::tls("server certificate"))
    };
    let resolver = NodeCertResolver::new(certified(node)?, certified(p256)?)?;
    let mut config = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(PkiError::tls("TLS server configuration"))?
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(Arc::new(resolver));
    config.alpn_protocols = vec![ALPN_H2.to_vec()];
    Ok(Arc::new(config))
}

/// How a server checks client certificates, as `client_auth` says,
/// trusting the CA certificates in `ca_pem`.
fn client_verifier(
    ca_pem: &str,
    client_auth: ClientAuth,
    provider: &Arc<CryptoProvider>,
) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>, PkiError> {
    Ok(match client_auth {
        ClientAuth::Deferred => Arc::new(DeferredClientAuth {
            algorithms: provider.signature_verification_algorithms,
        }),
        ClientAuth::Required | ClientAuth::Optional => {
            let roots = Arc::new(root_store(ca_pem, "CA certificate PEM")?);
            let mut verifier = WebPkiClientVerifier::builder_with_provider(roots, provider.clone());
            if client_auth == ClientAuth::Optional {
                verifier = verifier.allow_unauthenticated();
            }
            verifier
                .build()
                .map_err(PkiError::tls("client certificate verifier"))?
        }
    })
}

/// A TLS 1.3 client configuration (ALPN `h2`) that presents `creds`'
/// certificate when given, and trusts servers whose certificate is issued
/// by the CA in `ca_pem`.
///
/// # Trust decision: any cluster member at any address
///
/// The server certificate's chain to the cluster CA is verified in full
/// (signatures, validity, server-auth usage), but the name the client
/// dialed need not appear in it: a certificate valid for another name or
/// address is accepted. The cluster CA issues certificates to cluster
/// members only, so a server holding one *is* a member, whatever address
/// it was reached at (addresses change, NAT and load balancers rewrite
/// them, and a node's certificate cannot list every address it will ever
/// have). Callers that need a particular member check the identity in its
/// certificate after the handshake.
pub fn client_config(
    creds: Option<&Credentials>,
    ca_pem: &str,
) -> Result<Arc<ClientConfig>, PkiError> {
    cluster_client_config(creds, ca_pem, false)
}

/// A client configuration like [`client_config`] that accepts only a
/// curator instance as the server: a certificate chained to the cluster
/// CA **and** marked
/// [`CURATOR_URI`](metropolis_core::identity::CURATOR_URI), which the CA
/// issues to the nodes that hold it (curator instances) and never to a
/// node joining through the curator. For the provisioning agent, whose
/// server hands out installation requests: any node holds a certificate
/// chained to the cluster CA, but only a curator may serve AgentCallback.
/// Any other server fails the handshake, its certificate refused with a
/// message saying why.
pub fn curator_client_config(
    creds: Option<&Credentials>,
    ca_pem: &str,
) -> Result<Arc<ClientConfig>, PkiError> {
    cluster_client_config(creds, ca_pem, true)
}

fn cluster_client_config(
    creds: Option<&Credentials>,
    ca_pem: &str,
    curator_only: bool,
) -> Result<Arc<ClientConfig>, PkiError> {
    let provider = provider();
    let roots = Arc::new(root_store(ca_pem, "cluster CA certificate PEM")?);
    let inner = WebPkiServerVerifier::builder_with_provider(roots.clone(), provider.clone())
        .build()
        .map_err(PkiError::tls("server certificate verifier"))?;
    let verifier = Arc::new(ClusterServerVerifier {
        inner,
        roots,
        algorithms: provider.signature_verification_algorithms,
        curator_only,
    });
    let builder = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(PkiError::tls("TLS client configuration"))?
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    let mut config = match creds {
        Some(creds) => builder
            .with_client_auth_cert(creds.chain_der()?, creds.key_der()?)
            .map_err(PkiError::tls("TLS client configuration"))?,
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![ALPN_H2.to_vec()];
    Ok(Arc::new(config))
}

/// The trust anchors in `ca_pem`.
fn root_store(ca_pem: &str, origin: &str) -> Result<RootCertStore, PkiError> {
    let mut roots = RootCertStore::empty();
    for ca in certs_from_pem(origin, ca_pem)? {
        roots
            .add(ca)
            .map_err(|e| PkiError::invalid(origin, format!("not a usable CA certificate: {e}")))?;
    }
    Ok(roots)
}

/// Verifies server certificates against the cluster CA, accepting any
/// server name (see [`client_config`]).
#[derive(Debug)]
struct ClusterServerVerifier {
    inner: Arc<WebPkiServerVerifier>,
    roots: Arc<RootCertStore>,
    algorithms: WebPkiSupportedAlgorithms,
    /// Accept only a certificate marked as a curator instance's.
    curator_only: bool,
}

/// Why a verified cluster certificate is not a curator's.
struct NotACurator;

/// The message itself: rustls shows the error of a refused certificate
/// with `Debug`, and that is what the operator reads in the log.
impl std::fmt::Debug for NotACurator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

impl std::fmt::Display for NotACurator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the server's certificate is a cluster member's but not a curator instance's (no {} \
             subject alternative name): only curators serve this service",
            metropolis_core::identity::CURATOR_URI
        )
    }
}

impl std::error::Error for NotACurator {}

impl ServerCertVerifier for ClusterServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let verified =
            self.verify_chain(end_entity, intermediates, server_name, ocsp_response, now)?;
        if self.curator_only && !metropolis_core::identity::is_curator_certificate(end_entity) {
            return Err(rustls::Error::InvalidCertificate(CertificateError::Other(
                rustls::OtherError(Arc::new(NotACurator)),
            )));
        }
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

impl ClusterServerVerifier {
    /// The chain to the cluster CA, whatever name the server was dialed by.
    fn verify_chain(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self.inner.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        ) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => {
                // Only the name was wrong. Check the chain again explicitly
                // rather than relying on the order of the checks above.
                let cert = ParsedCertificate::try_from(end_entity)?;
                verify_server_cert_signed_by_trust_anchor(
                    &cert,
                    &self.roots,
                    intermediates,
                    now,
                    self.algorithms.all,
                )?;
                Ok(ServerCertVerified::assertion())
            }
            other => other,
        }
    }
}
