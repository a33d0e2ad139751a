//! Who is calling: the classification of a TLS peer's certificate after a
//! handshake made with [`ClientAuth::Deferred`](metropolis_pki::ClientAuth).
//!
//! The semantics ask for a gRPC `Unauthenticated` status (not a failed
//! handshake) when a caller has no certificate or one not chained to the
//! cluster CA. So the TLS layer only checks that the client holds the key
//! of the certificate it presents, and [`PeerClassifier`] then verifies the
//! chain against the cluster CA and derives the [`Identity`] the service
//! layer authorizes.
//!
//! A peer must present exactly one certificate, as the reference's
//! servers require (`metropolis/node/core/rpc/server_authentication.go` at
//! `80861fd7`, lines 206-212, used by the BMaaS server at `4cc3d4d2`): a
//! chain identifies nobody, and [`admit`] gives its [`Peer`] a
//! [`refusal`](Peer::refusal) that the calls needing an identity are
//! answered with (see [`serve_connection`](crate::grpc::serve_connection)).

use std::net::SocketAddr;
use std::sync::Arc;

use metropolis_core::agent_cert::agent_key_from_certificate;
use metropolis_core::identity::{
    Identity, NodeId, identity_from_certificate, is_curator_certificate,
};
use rustls::RootCertStore;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::ClientCertVerifier;

/// The peer that presented `chain` (end entity first), as `classifier`
/// sees it; a peer that presented more than one certificate is
/// unauthenticated whatever they are, with the [`refusal`](Peer::refusal)
/// saying so.
pub fn admit(classifier: &dyn Classify, chain: Option<&[CertificateDer<'_>]>) -> Peer {
    match chain {
        Some(chain) if chain.len() > 1 => {
            tracing::debug!(
                certificates = chain.len(),
                "client certificate chain refused"
            );
            Peer {
                refusal: Some(Arc::from(chain_refusal(chain.len()))),
                ..Peer::from(Identity::Unauthenticated)
            }
        }
        _ => classifier.peer(chain),
    }
}

/// Why a peer that presented `count` certificates is unauthenticated.
fn chain_refusal(count: usize) -> String {
    format!(
        "exactly one client certificate must be sent (got {count}): present the \
         end-entity certificate alone, without intermediates or the CA certificate"
    )
}

/// The certificate of `chain` when it holds exactly one.
fn only_certificate<'a>(chain: Option<&'a [CertificateDer<'a>]>) -> Option<&'a CertificateDer<'a>> {
    match chain {
        Some([leaf]) => Some(leaf),
        _ => None,
    }
}

/// Decides who a TLS peer is from the certificate chain it presented
/// (end entity first), after a [`ClientAuth::Deferred`](metropolis_pki::ClientAuth)
/// handshake. Listeners classify through [`admit`], which refuses a chain
/// of more than one certificate before asking the classifier.
pub trait Classify: Send + Sync + 'static {
    /// The identity of a peer that presented `chain`.
    fn classify(&self, chain: Option<&[CertificateDer<'_>]>) -> Identity;

    /// The peer as a whole: its identity and, when its certificate is a
    /// curator instance's, that mark (which lets it forward calls on its
    /// callers' behalf). By default no peer is a curator instance.
    fn peer(&self, chain: Option<&[CertificateDer<'_>]>) -> Peer {
        Peer::from(self.classify(chain))
    }
}

/// Classifies agents on the AgentCallback port: a self-signed Ed25519
/// certificate, presented alone, is [`Identity::Agent`] with its key;
/// anything else is unauthenticated.
#[derive(Debug, Default, Clone, Copy)]
pub struct AgentClassifier;

impl Classify for AgentClassifier {
    fn classify(&self, chain: Option<&[CertificateDer<'_>]>) -> Identity {
        let Some(leaf) = only_certificate(chain) else {
            return Identity::Unauthenticated;
        };
        match agent_key_from_certificate(leaf) {
            Ok(key) => Identity::Agent(key),
            Err(e) => {
                tracing::debug!(error = %e, "agent certificate refused");
                Identity::Unauthenticated
            }
        }
    }
}

impl Classify for PeerClassifier {
    fn classify(&self, chain: Option<&[CertificateDer<'_>]>) -> Identity {
        PeerClassifier::classify(self, chain)
    }

    fn peer(&self, chain: Option<&[CertificateDer<'_>]>) -> Peer {
        let identity = PeerClassifier::classify(self, chain);
        let curator = match (&identity, only_certificate(chain)) {
            // Only a verified node certificate can mark a curator.
            (Identity::Node(id), Some(leaf)) if is_curator_certificate(leaf) => Some(id.clone()),
            _ => None,
        };
        Peer {
            identity,
            curator,
            addr: None,
            refusal: None,
        }
    }
}

/// A connection's peer, as the listeners hand it to
/// [`serve_connection`](crate::grpc::serve_connection).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    /// Who it is.
    pub identity: Identity,
    /// Its node ID when it is a curator instance (its calls may carry an
    /// on-behalf-of identity).
    pub curator: Option<NodeId>,
    /// Its socket address, when the listener passes it on to the services
    /// (as [`RemoteAddr`](metropolis_service::RemoteAddr) in each
    /// call's extensions).
    pub addr: Option<SocketAddr>,
    /// Why the certificates it presented identify nobody, when that is the
    /// peer's to fix (it sent a chain): a call that is refused for want of
    /// an identity is answered Unauthenticated with this message.
    pub refusal: Option<Arc<str>>,
}

impl Peer {
    /// This peer, with its socket address passed on to the services.
    pub fn with_addr(self, addr: SocketAddr) -> Peer {
        Peer {
            addr: Some(addr),
            ..self
        }
    }
}

impl From<Identity> for Peer {
    fn from(identity: Identity) -> Peer {
        Peer {
            identity,
            curator: None,
            addr: None,
            refusal: None,
        }
    }
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
        let verifier = WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            metropolis_pki::provider(),
        )
        .build()
        .map_err(|e| rustls::Error::General(format!("client verifier: {e}")))?;
        Ok(PeerClassifier { verifier })
    }

    /// The identity of a peer that presented `chain` (end entity first):
    /// unauthenticated when there is none, when there is more than one
    /// certificate (the reference takes exactly one), when it is not issued
    /// by the cluster CA, or when it names no known kind of identity.
    pub fn classify(&self, chain: Option<&[CertificateDer<'_>]>) -> Identity {
        let Some(leaf) = only_certificate(chain) else {
            return Identity::Unauthenticated;
        };
        if let Err(e) = self.verifier.verify_client_cert(leaf, &[], UnixTime::now()) {
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
