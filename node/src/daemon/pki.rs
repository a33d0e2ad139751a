//! This node's PKI in the data directory ([`NodePki`]): created on first
//! start (the cluster CA, this node's Ed25519 identity and certificate,
//! its ECDSA P-256 server certificate, the owner credential), loaded on
//! later starts, and upgraded in place when an earlier version wrote it
//! (PKCS#8 v2 Ed25519 keys rewritten as v1, a node certificate without the
//! curator mark reissued, the P-256 certificate added or reissued); and
//! the cluster CA as the services' certificate issuer.

use std::sync::Arc;

use metropolis_core::identity::{NodeId, is_curator_certificate};
use metropolis_core::ports::CertIssuer;
use metropolis_pki::{
    CA_KEY_FILE, ClusterCa, Credentials, P256Status, load_or_issue_p256, upgrade_key_file,
};

use super::layout::{create_data_dir, create_private_dir};
use super::{Config, DaemonError, Layout};

/// The cluster CA as the services' [`CertIssuer`]: it signs the node
/// certificates the curator hands out.
pub(super) struct Issuer(pub(super) ClusterCa);

impl CertIssuer for Issuer {
    fn issue_node_certificate(
        &self,
        public_key: &[u8; 32],
    ) -> Result<metropolis_core::ports::IssuedCertificate, metropolis_core::ports::CertIssueError>
    {
        let cert = self
            .0
            .issue_node_for_key(public_key, &[])
            .map_err(|e| metropolis_core::ports::CertIssueError::Signing(e.to_string()))?;
        Ok(metropolis_core::ports::IssuedCertificate {
            certificate_pem: cert,
            ca_pem: self.0.cert_pem(),
        })
    }
}

/// This node's PKI (cluster CA, this node's identity and credentials),
/// created on first start.
pub struct NodePki {
    pub(super) ca: ClusterCa,
    pub(super) node: Credentials,
    /// The ECDSA P-256 twin of `node`'s certificate, for TLS clients
    /// without Ed25519.
    pub(super) node_p256: Credentials,
    pub(super) node_id: NodeId,
    pub(super) node_key: [u8; 32],
}

impl NodePki {
    /// Creates the data directory and the PKI in it if missing, and loads
    /// them: a runtime calls this before
    /// [`NodeServices::prepare_elected`](super::NodeServices::prepare_elected)
    /// to learn this node's ID and credentials (for its election value and
    /// its connections to the leader).
    pub fn load_or_create(config: &Config) -> Result<NodePki, DaemonError> {
        create_data_dir(config)?;
        let layout = Layout::new(&config.data_dir);
        if let Some(bundle) = &config.cluster.join {
            create_private_dir(&layout.pki, "PKI directory")?;
            crate::join::install_bundle(bundle, &layout.pki)?;
        }
        load_or_create_pki(&layout, &config.extra_sans)
    }

    /// This node's ID.
    pub fn node_id(&self) -> &NodeId {
        &self.node_id
    }

    /// A TLS client configuration presenting this node's certificate and
    /// trusting the cluster CA: how this instance connects to the leader.
    pub fn client_config(&self) -> Result<Arc<rustls::ClientConfig>, DaemonError> {
        Ok(metropolis_pki::client_config(
            Some(&self.node),
            &self.node.ca_pem,
        )?)
    }
}

/// Loads the PKI under `layout`, creating what is missing (a new node
/// certificate names `extra_sans`) and upgrading what an earlier version
/// wrote: Ed25519 keys in PKCS#8 v2 are rewritten as v1, a node
/// certificate without the curator mark is reissued with it (same key),
/// and the P-256 server certificate is created or reissued when it no
/// longer matches the node's.
pub(super) fn load_or_create_pki(
    layout: &Layout,
    extra_sans: &[String],
) -> Result<NodePki, DaemonError> {
    // Earlier versions wrote Ed25519 keys as PKCS#8 v2, which OpenSSL and
    // BoringSSL refuse: the same keys, rewritten as v1.
    for key in [
        layout.pki.join(CA_KEY_FILE),
        Credentials::key_path(&layout.pki, "node"),
        Credentials::key_path(&layout.owner, "owner"),
    ] {
        if upgrade_key_file(&key)? {
            tracing::info!(file = %key.display(), "rewrote the Ed25519 key as PKCS#8 v1");
        }
    }
    let ca_cert = layout.pki.join("ca.pem");
    let ca = if ca_cert.exists() {
        ClusterCa::read_from_dir(&layout.pki)?
    } else {
        tracing::info!(dir = %layout.pki.display(), "first start: creating the cluster CA");
        let ca = ClusterCa::generate()?;
        ca.write_to_dir(&layout.pki)?;
        ca
    };
    let node = if layout.pki.join("node.pem").exists() {
        let creds = Credentials::read_from_dir(&layout.pki, "node")?;
        if is_curator_certificate(&creds.cert_der()?) {
            creds
        } else {
            // Written before node certificates marked curator instances:
            // the same key and name, with the mark.
            let key = creds.ed25519_public_key()?;
            let cert_pem = ca.issue_node_cert(&key, extra_sans, true)?;
            let creds = Credentials::from_parts(cert_pem, creds.key_pem, creds.ca_pem);
            creds.write_to_dir(&layout.pki, "node")?;
            tracing::info!("reissued this node's certificate to mark it as a curator instance's");
            creds
        }
    } else {
        let (creds, id) = ca.issue_curator_node(extra_sans)?;
        creds.write_to_dir(&layout.pki, "node")?;
        tracing::info!(node = %id, "created this node's identity");
        creds
    };
    if !layout.owner.join("owner.pem").exists() {
        let owner = ca.issue_owner()?;
        owner.write_to_dir(&layout.owner, "owner")?;
        tracing::info!(dir = %layout.owner.display(), "created the owner credential");
    }
    let (node_p256, status) = load_or_issue_p256(&layout.pki, &ca, &node)?;
    match status {
        P256Status::Kept => {}
        P256Status::Created => {
            tracing::info!(
                "created this node's P-256 server certificate (for TLS clients without Ed25519)"
            );
        }
        P256Status::Reissued { reason } => {
            tracing::info!(%reason, "reissued this node's P-256 server certificate");
        }
        other => tracing::info!(?other, "this node's P-256 server certificate"),
    }
    let node_key = node.ed25519_public_key()?;
    let node_id = NodeId::from_public_key(&node_key);
    Ok(NodePki {
        ca,
        node,
        node_p256,
        node_id,
        node_key,
    })
}
