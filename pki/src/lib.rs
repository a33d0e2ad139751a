//! The cluster PKI: the cluster CA, the node and owner credentials it
//! issues, their files, and the rustls configurations of the cluster's
//! mutual TLS.
//!
//! - [`ClusterCa`] generates the CA (Ed25519, self-signed) and issues node
//!   certificates (common name = node ID, usable as TLS server and client)
//!   and owner certificates (common name `owner`, organization
//!   `metropolis`), following the convention that
//!   [`metropolis_core::identity::identity_from_certificate`] reads back.
//! - [`Credentials`] is a certificate, its key and the CA certificate, with
//!   atomic, durable file storage (keys in mode 0600).
//! - [`load_or_issue_p256`] keeps this node's ECDSA P-256 server
//!   certificate, the twin of its Ed25519 one for clients without Ed25519
//!   (BoringSSL).
//! - [`server_config`], [`node_server_config`] (Ed25519 or P-256
//!   certificate per ClientHello) and [`client_config`] build TLS 1.3
//!   configurations on the *ring* provider.
//! - Every Ed25519 private key written is PKCS#8 v1, which OpenSSL,
//!   BoringSSL and Go read ([`generate_ed25519_key`]); PKCS#8 v2 keys
//!   written by earlier versions are still read, and
//!   [`upgrade_key_file`] rewrites them as v1.

mod agent;
mod ca;
mod cert_resolver;
mod credentials;
mod error;
mod fallback_cert;
mod files;
mod keys;
mod kubernetes;
mod tls;

pub use agent::{AGENT_COMMON_NAME, generate_agent_key, self_signed_agent_certificate};
pub use ca::{CA_COMMON_NAME, CA_KEY_FILE, CA_VALIDITY, CLOCK_SKEW, ClusterCa, LEAF_VALIDITY};
pub use credentials::{CA_CERT_FILE, Credentials};
pub use error::PkiError;
pub use fallback_cert::{
    P256_PREFIX, P256_RENEW_BEFORE, P256Status, load_or_issue_p256, p256_mismatch,
};
pub use files::write_new_file;
pub use keys::{generate_ed25519_key, upgrade_key_file};
pub use kubernetes::{
    Cluster, Context, DEFAULT_KUBECONFIG_VALIDITY, DebugKubeconfigs, GENERATED_KUBERNETES_CA_CERT,
    GENERATED_KUBERNETES_CA_KEY, GENERATED_KUBERNETES_CA_NAME, Kubeconfig, KubernetesCa,
    MAX_KUBECONFIG_GROUPS, NamedCluster, NamedContext, NamedUser, SharedCa, User,
};
pub use tls::{
    ALPN_H2, ClientAuth, client_config, curator_client_config, node_server_config, provider,
    server_config,
};
