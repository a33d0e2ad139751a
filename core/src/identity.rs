//! Who is calling, and what they may do.
//!
//! A caller is an [`Identity`]: a node of the cluster, the cluster owner, or
//! nobody in particular. Identities come from client certificates issued by
//! the cluster CA ([`identity_from_certificate`]) or from the transport
//! itself (the node's local UNIX socket is always that node). What a method
//! needs is a [`Rule`] read from the `.proto` files; [`authorize`] checks an
//! identity against it.
//!
//! # Certificate convention
//!
//! The cluster PKI issues exactly two kinds of leaf certificates, and this
//! module is where their meaning is defined:
//!
//! - **Owner**: subject common name [`OWNER_COMMON_NAME`] (`owner`) and
//!   organization [`OWNER_ORGANIZATION`] (`metropolis`). Any key type.
//! - **Node**: subject common name = the node's [`NodeId`], and an Ed25519
//!   subject public key from which that same node ID derives. The key is
//!   checked: a certificate whose common name names another node than its
//!   key is refused.
//!
//! Any other subject is an error, never a silent downgrade to
//! [`Identity::Unauthenticated`]: a certificate chained to the cluster CA
//! that does not follow the convention points at a PKI bug.
//!
//! Everything here is pure: no files, no clock, no randomness.

use std::fmt;
use std::str::FromStr;

use metropolis_proto::authorization::{Permission, Rule};
use x509_parser::certificate::X509Certificate;
use x509_parser::oid_registry::OID_SIG_ED25519;
use x509_parser::x509::X509Name;

use crate::quote::cut;

/// The prefix of every node ID.
pub const NODE_ID_PREFIX: &str = "metropolis-";

/// The subject common name (CN) of the cluster owner's certificates.
pub const OWNER_COMMON_NAME: &str = "owner";

/// The subject organization (O) of the cluster owner's certificates.
pub const OWNER_ORGANIZATION: &str = "metropolis";

/// How many lowercase hex characters follow [`NODE_ID_PREFIX`]: the first 16
/// bytes of the node's public key.
const NODE_ID_HEX_LEN: usize = 32;

/// How many bytes of the public key a node ID is made of.
const NODE_ID_KEY_BYTES: usize = NODE_ID_HEX_LEN / 2;

/// How many values of a certificate's attribute an error lists at most.
const MAX_LISTED: usize = 4;

/// The identifier of a node: `metropolis-` followed by the lowercase hex of
/// the first 16 bytes of the node's Ed25519 public key (32 characters).
///
/// A `NodeId` is always well-formed: the only ways to get one are
/// [`NodeId::parse`] and [`NodeId::from_public_key`].
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeId(String);

impl NodeId {
    /// Parses a node ID, accepting exactly `metropolis-` followed by 32
    /// lowercase hex characters.
    pub fn parse(s: &str) -> Result<NodeId, NodeIdError> {
        let Some(hex) = s.strip_prefix(NODE_ID_PREFIX) else {
            return Err(NodeIdError::MissingPrefix { input: cut(s) });
        };
        if let Some(character) = hex.chars().find(|c| !matches!(c, '0'..='9' | 'a'..='f')) {
            return Err(NodeIdError::InvalidCharacter {
                input: cut(s),
                character,
            });
        }
        // Only ASCII hex digits are left, so bytes are characters.
        if hex.len() != NODE_ID_HEX_LEN {
            return Err(NodeIdError::WrongLength {
                input: cut(s),
                hex_chars: hex.len(),
            });
        }
        Ok(NodeId(s.to_owned()))
    }

    /// The node ID of the node whose Ed25519 public key is `public_key`.
    pub fn from_public_key(public_key: &[u8; 32]) -> NodeId {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut id = String::with_capacity(NODE_ID_PREFIX.len() + NODE_ID_HEX_LEN);
        id.push_str(NODE_ID_PREFIX);
        for byte in &public_key[..NODE_ID_KEY_BYTES] {
            id.push(char::from(DIGITS[usize::from(byte >> 4)]));
            id.push(char::from(DIGITS[usize::from(byte & 0x0f)]));
        }
        NodeId(id)
    }

    /// The node ID as text, e.g. `metropolis-0123456789abcdef0123456789abcdef`.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NodeId({})", self.0)
    }
}

impl FromStr for NodeId {
    type Err = NodeIdError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        NodeId::parse(s)
    }
}

impl AsRef<str> for NodeId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// Why a string is not a node ID.
///
/// The `input` of each variant is the rejected string, cut to its first
/// [`QUOTE_CHARS`](crate::quote::QUOTE_CHARS) characters (with `…`
/// appended) when it is longer.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum NodeIdError {
    /// The string does not start with `metropolis-`.
    MissingPrefix {
        /// The rejected string.
        input: String,
    },
    /// A character after the prefix is not a lowercase hex digit.
    InvalidCharacter {
        /// The rejected string.
        input: String,
        /// The first offending character.
        character: char,
    },
    /// There are not exactly 32 hex characters after the prefix.
    WrongLength {
        /// The rejected string.
        input: String,
        /// How many hex characters follow the prefix.
        hex_chars: usize,
    },
}

impl fmt::Display for NodeIdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let input = match self {
            NodeIdError::MissingPrefix { input }
            | NodeIdError::InvalidCharacter { input, .. }
            | NodeIdError::WrongLength { input, .. } => input,
        };
        write!(
            f,
            "node ID {input:?} must be {NODE_ID_PREFIX:?} followed by {NODE_ID_HEX_LEN} lowercase hex characters"
        )?;
        match self {
            NodeIdError::MissingPrefix { .. } => {
                write!(f, " (it does not start with {NODE_ID_PREFIX:?})")
            }
            NodeIdError::InvalidCharacter { character, .. } => {
                write!(f, " ({character:?} is not one of 0-9, a-f)")
            }
            NodeIdError::WrongLength { hex_chars, .. } => {
                write!(f, " (it has {hex_chars} hex characters after the prefix)")
            }
        }
    }
}

impl std::error::Error for NodeIdError {}

/// Who is calling.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Identity {
    /// A node of the cluster: over the node's local UNIX socket, or with a
    /// node certificate issued by the cluster CA.
    Node(NodeId),
    /// The cluster owner (operator), with an owner certificate issued by the
    /// cluster CA.
    Owner,
    /// A provisioning agent, by the Ed25519 key of the self-signed
    /// certificate it presented on the AgentCallback port. Holds no
    /// permission; the AgentCallback service matches the key against the
    /// machine registered under the request's machine ID.
    Agent([u8; 32]),
    /// No certificate, or one not chained to the cluster CA.
    Unauthenticated,
}

impl Identity {
    /// Whether this identity holds permission `p`.
    ///
    /// A node holds `READ_CLUSTER_STATUS` and `UPDATE_NODE_SELF`; the owner
    /// holds every permission; an unauthenticated caller holds none.
    /// `PERMISSION_UNSPECIFIED` is not a permission and is held by nobody,
    /// so a method wrongly requiring it fails closed.
    pub fn holds(&self, p: Permission) -> bool {
        match self {
            Identity::Node(_) => matches!(
                p,
                Permission::ReadClusterStatus | Permission::UpdateNodeSelf
            ),
            Identity::Owner => p != Permission::Unspecified,
            Identity::Agent(_) | Identity::Unauthenticated => false,
        }
    }

    /// The node ID, if this identity is a node.
    pub fn node_id(&self) -> Option<&NodeId> {
        match self {
            Identity::Node(id) => Some(id),
            Identity::Owner | Identity::Agent(_) | Identity::Unauthenticated => None,
        }
    }

    /// Whether this is a node or the owner, rather than nobody.
    pub fn is_authenticated(&self) -> bool {
        !matches!(self, Identity::Unauthenticated)
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Identity::Node(id) => write!(f, "node {id}"),
            Identity::Owner => f.write_str("the cluster owner"),
            Identity::Agent(key) => {
                write!(f, "the agent with key {}", crate::hex::Hex(key))
            }
            Identity::Unauthenticated => f.write_str("an unauthenticated caller"),
        }
    }
}

/// Checks `identity` against a method's `rule`.
///
/// A rule that allows unauthenticated callers admits everyone. Otherwise an
/// [`Identity::Unauthenticated`] caller gets [`AuthzError::Unauthenticated`],
/// and any other caller must hold every permission the rule needs, or gets
/// [`AuthzError::PermissionDenied`] listing the ones it lacks.
pub fn authorize(identity: &Identity, rule: &Rule) -> Result<(), AuthzError> {
    if rule.allow_unauthenticated {
        return Ok(());
    }
    if !identity.is_authenticated() {
        return Err(AuthzError::Unauthenticated);
    }
    let missing: Vec<Permission> = rule
        .need
        .iter()
        .copied()
        .filter(|p| !identity.holds(*p))
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(AuthzError::PermissionDenied {
            identity: identity.clone(),
            missing,
        })
    }
}

/// Why a caller may not call a method.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum AuthzError {
    /// The method needs an identity and the caller has none.
    Unauthenticated,
    /// The caller lacks permissions the method needs.
    PermissionDenied {
        /// Who called.
        identity: Identity,
        /// The needed permissions the caller does not hold, in the order of
        /// the rule; never empty.
        missing: Vec<Permission>,
    },
}

impl fmt::Display for AuthzError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AuthzError::Unauthenticated => f.write_str(
                "this method requires an authenticated caller: connect over TLS with a client \
                 certificate issued by the cluster CA (a node or owner certificate)",
            ),
            AuthzError::PermissionDenied { identity, missing } => {
                let names: Vec<&str> = missing.iter().map(|p| p.as_str_name()).collect();
                let noun = if names.len() == 1 {
                    "permission"
                } else {
                    "permissions"
                };
                write!(
                    f,
                    "{identity} lacks the {noun} {} required by this method (nodes hold \
                     PERMISSION_READ_CLUSTER_STATUS and PERMISSION_UPDATE_NODE_SELF; the cluster \
                     owner holds every permission)",
                    names.join(", ")
                )
            }
        }
    }
}

impl std::error::Error for AuthzError {}

/// Classifies a client certificate (DER) that the TLS layer has already
/// verified as chained to the cluster CA, following the convention in the
/// [module documentation](self).
///
/// This function does not verify signatures, validity periods or key usages:
/// that is the TLS layer's job. It must never be given a certificate the TLS
/// layer has not verified against the cluster CA.
pub fn identity_from_certificate(der: &[u8]) -> Result<Identity, CertIdentityError> {
    let (rest, cert) =
        x509_parser::parse_x509_certificate(der).map_err(|e| CertIdentityError::Malformed {
            reason: e.to_string(),
        })?;
    if !rest.is_empty() {
        return Err(CertIdentityError::Malformed {
            reason: format!(
                "{} bytes of trailing data after the certificate",
                rest.len()
            ),
        });
    }
    let common_name = single_string(cert.subject(), Attr::CommonName)?;
    if common_name == OWNER_COMMON_NAME {
        let organizations = all_strings(cert.subject(), Attr::Organization)?;
        if organizations != [OWNER_ORGANIZATION] {
            // Quoted like every name from the certificate: cut, and only
            // the first few.
            return Err(CertIdentityError::OwnerOrganization {
                found: organizations
                    .iter()
                    .take(MAX_LISTED)
                    .map(|o| cut(o))
                    .collect(),
            });
        }
        check_owner_usage(&cert)?;
        return Ok(Identity::Owner);
    }
    if common_name.starts_with(NODE_ID_PREFIX) {
        let node_id = NodeId::parse(&common_name).map_err(CertIdentityError::InvalidNodeId)?;
        let key = ed25519_public_key(&cert, &node_id)?;
        let key_node_id = NodeId::from_public_key(&key);
        if key_node_id != node_id {
            return Err(CertIdentityError::NodeKeyMismatch {
                node_id,
                key_node_id,
            });
        }
        check_node_usage(&cert, &node_id)?;
        return Ok(Identity::Node(node_id));
    }
    Err(CertIdentityError::UnknownSubject {
        common_name: cut(&common_name),
    })
}

/// Checks what the reference requires of a user certificate beyond its
/// name: an Ed25519 key (as every client certificate there) and the
/// client-auth extended key usage.
fn check_owner_usage(
    cert: &x509_parser::certificate::X509Certificate<'_>,
) -> Result<(), CertIdentityError> {
    let algorithm = &cert.public_key().algorithm.algorithm;
    if *algorithm != OID_SIG_ED25519 {
        return Err(CertIdentityError::OwnerKeyNotEd25519 {
            algorithm: cut(&algorithm.to_id_string()),
        });
    }
    let client_auth = cert
        .extended_key_usage()
        .map_err(|e| CertIdentityError::Malformed {
            reason: e.to_string(),
        })?
        .is_some_and(|eku| eku.value.client_auth);
    if client_auth {
        Ok(())
    } else {
        Err(CertIdentityError::OwnerWithoutClientAuth)
    }
}

/// Checks what the reference requires of a node certificate beyond its
/// name and key: the server-auth extended key usage (a node serves as
/// well as calls) and the node ID among its DNS names.
fn check_node_usage(
    cert: &x509_parser::certificate::X509Certificate<'_>,
    node_id: &NodeId,
) -> Result<(), CertIdentityError> {
    use x509_parser::extensions::GeneralName;
    let malformed = |e: x509_parser::error::X509Error| CertIdentityError::Malformed {
        reason: e.to_string(),
    };
    let server_auth = cert
        .extended_key_usage()
        .map_err(malformed)?
        .is_some_and(|eku| eku.value.server_auth);
    if !server_auth {
        return Err(CertIdentityError::NodeWithoutServerAuth {
            node_id: node_id.clone(),
        });
    }
    let named =
        cert.subject_alternative_name()
            .map_err(malformed)?
            .is_some_and(|san| {
                san.value.general_names.iter().any(
                    |name| matches!(name, GeneralName::DNSName(dns) if *dns == node_id.as_str()),
                )
            });
    if !named {
        return Err(CertIdentityError::NodeNameNotInSan {
            node_id: node_id.clone(),
        });
    }
    Ok(())
}

/// A subject value that [`identity_from_certificate`] reads as (or tries
/// to read as) a cluster identity, so that certificates signed for other
/// purposes (debug kubeconfigs) must never carry it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReservedName {
    /// A common name equal to [`OWNER_COMMON_NAME`], ignoring ASCII case.
    OwnerCommonName,
    /// A common name starting with [`NODE_ID_PREFIX`], ignoring ASCII case:
    /// the classifier reads every such name as a node ID.
    NodeIdPrefix,
    /// An organization equal to [`OWNER_ORGANIZATION`], ignoring ASCII
    /// case.
    OwnerOrganization,
}

impl fmt::Display for ReservedName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReservedName::OwnerCommonName => write!(
                f,
                "{OWNER_COMMON_NAME:?} is the common name of the Metropolis cluster owner"
            ),
            ReservedName::NodeIdPrefix => write!(
                f,
                "names starting with {NODE_ID_PREFIX:?} are Metropolis node IDs"
            ),
            ReservedName::OwnerOrganization => write!(
                f,
                "{OWNER_ORGANIZATION:?} is the organization of the Metropolis cluster owner"
            ),
        }
    }
}

/// Whether `common_name` is one [`identity_from_certificate`] looks at as
/// a cluster identity: `owner`, or anything starting with `metropolis-`
/// (both ignoring ASCII case, so that no spelling close to them passes
/// either).
pub fn reserved_common_name(common_name: &str) -> Option<ReservedName> {
    let starts_with = |prefix: &str| {
        common_name
            .get(..prefix.len())
            .is_some_and(|head| head.eq_ignore_ascii_case(prefix))
    };
    if common_name.eq_ignore_ascii_case(OWNER_COMMON_NAME) {
        Some(ReservedName::OwnerCommonName)
    } else if starts_with(NODE_ID_PREFIX) {
        Some(ReservedName::NodeIdPrefix)
    } else {
        None
    }
}

/// Whether `organization` is one [`identity_from_certificate`] looks at
/// as a cluster identity: `metropolis`, ignoring ASCII case.
pub fn reserved_organization(organization: &str) -> Option<ReservedName> {
    organization
        .eq_ignore_ascii_case(OWNER_ORGANIZATION)
        .then_some(ReservedName::OwnerOrganization)
}

/// The subject alternative name (a URI) marking the node certificate of a
/// curator instance: only peers presenting one may forward calls on
/// another caller's behalf.
pub const CURATOR_URI: &str = "urn:metropolis:role:curator";

/// Whether `der` (a certificate the TLS layer verified against the cluster
/// CA, naming a node) carries [`CURATOR_URI`] among its subject
/// alternative names.
pub fn is_curator_certificate(der: &[u8]) -> bool {
    use x509_parser::extensions::{GeneralName, ParsedExtension};
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else {
        return false;
    };
    cert.iter_extensions()
        .any(|ext| match ext.parsed_extension() {
            ParsedExtension::SubjectAlternativeName(san) => san
                .general_names
                .iter()
                .any(|name| matches!(name, GeneralName::URI(uri) if *uri == CURATOR_URI)),
            _ => false,
        })
}

/// The subject attributes this module reads.
#[derive(Debug, Clone, Copy)]
enum Attr {
    CommonName,
    Organization,
}

impl Attr {
    fn label(self) -> &'static str {
        match self {
            Attr::CommonName => "common name (CN)",
            Attr::Organization => "organization (O)",
        }
    }
}

/// Every value of `attr` in `name`, as text.
fn all_strings(name: &X509Name<'_>, attr: Attr) -> Result<Vec<String>, CertIdentityError> {
    let values: Vec<_> = match attr {
        Attr::CommonName => name.iter_common_name().collect(),
        Attr::Organization => name.iter_organization().collect(),
    };
    values
        .into_iter()
        .map(|v| {
            v.as_str()
                .map(str::to_owned)
                .map_err(|_| CertIdentityError::Subject {
                    reason: format!("its {} is not a text string", attr.label()),
                })
        })
        .collect()
}

/// The one value of `attr` in `name`, as text.
fn single_string(name: &X509Name<'_>, attr: Attr) -> Result<String, CertIdentityError> {
    let mut values = all_strings(name, attr)?;
    match values.len() {
        1 => Ok(values.remove(0)),
        0 => Err(CertIdentityError::Subject {
            reason: format!("it has no {}", attr.label()),
        }),
        n => Err(CertIdentityError::Subject {
            reason: format!("it has {n} values of {}, not one", attr.label()),
        }),
    }
}

/// The raw Ed25519 public key of a node certificate.
fn ed25519_public_key(
    cert: &X509Certificate<'_>,
    node_id: &NodeId,
) -> Result<[u8; 32], CertIdentityError> {
    let spki = cert.public_key();
    if spki.algorithm.algorithm != OID_SIG_ED25519 {
        return Err(CertIdentityError::NodeKeyNotEd25519 {
            node_id: node_id.clone(),
            algorithm: cut(&spki.algorithm.algorithm.to_id_string()),
        });
    }
    let bits = &spki.subject_public_key;
    if bits.unused_bits != 0 {
        return Err(CertIdentityError::Malformed {
            reason: "the Ed25519 public key is not a whole number of bytes".to_owned(),
        });
    }
    <[u8; 32]>::try_from(bits.data.as_ref()).map_err(|_| CertIdentityError::Malformed {
        reason: format!(
            "the Ed25519 public key is {} bytes long, not 32",
            bits.data.len()
        ),
    })
}

/// Why a client certificate does not name a cluster identity.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CertIdentityError {
    /// The bytes are not one DER X.509 certificate.
    Malformed {
        /// What the parser found wrong.
        reason: String,
    },
    /// The subject lacks a usable common name or organization.
    Subject {
        /// What is wrong with the subject.
        reason: String,
    },
    /// The common name is neither [`OWNER_COMMON_NAME`] nor a node ID.
    UnknownSubject {
        /// The common name found (cut as [`crate::quote::cut`] does).
        common_name: String,
    },
    /// The common name `owner` comes with another organization than
    /// [`OWNER_ORGANIZATION`], or none, or several.
    OwnerOrganization {
        /// The organizations found: the first 4, each cut as
        /// [`crate::quote::cut`] does.
        found: Vec<String>,
    },
    /// The common name starts like a node ID but is not one.
    InvalidNodeId(NodeIdError),
    /// A node certificate's key is not Ed25519.
    NodeKeyNotEd25519 {
        /// The node ID in the common name.
        node_id: NodeId,
        /// The dotted OID of the key's algorithm (cut as
        /// [`crate::quote::cut`] does).
        algorithm: String,
    },
    /// A node certificate's common name names another node than its key.
    NodeKeyMismatch {
        /// The node ID in the common name.
        node_id: NodeId,
        /// The node ID derived from the certificate's public key.
        key_node_id: NodeId,
    },
    /// An owner certificate's key is not Ed25519.
    OwnerKeyNotEd25519 {
        /// The dotted OID of the key's algorithm (cut as
        /// [`crate::quote::cut`] does).
        algorithm: String,
    },
    /// An owner certificate lacks the client-auth extended key usage.
    OwnerWithoutClientAuth,
    /// A node certificate lacks the server-auth extended key usage.
    NodeWithoutServerAuth {
        /// The node ID in the common name.
        node_id: NodeId,
    },
    /// A node certificate's DNS subject alternative names lack its node ID.
    NodeNameNotInSan {
        /// The node ID in the common name.
        node_id: NodeId,
    },
}

impl fmt::Display for CertIdentityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CertIdentityError::Malformed { reason } => {
                write!(
                    f,
                    "client certificate is not a valid DER X.509 certificate: {reason}"
                )
            }
            CertIdentityError::Subject { reason } => write!(
                f,
                "client certificate subject is not one the cluster CA issues: {reason} (cluster \
                 certificates have exactly one common name, {OWNER_COMMON_NAME:?} or a node ID)"
            ),
            CertIdentityError::UnknownSubject { common_name } => write!(
                f,
                "client certificate common name {common_name:?} is neither {OWNER_COMMON_NAME:?} \
                 nor a node ID ({NODE_ID_PREFIX:?} followed by {NODE_ID_HEX_LEN} lowercase hex \
                 characters)"
            ),
            CertIdentityError::OwnerOrganization { found } => write!(
                f,
                "owner certificate must have exactly one organization (O), {OWNER_ORGANIZATION:?}; \
                 found {found:?}"
            ),
            CertIdentityError::InvalidNodeId(e) => {
                write!(
                    f,
                    "client certificate common name is not a valid node ID: {e}"
                )
            }
            CertIdentityError::NodeKeyNotEd25519 { node_id, algorithm } => write!(
                f,
                "node certificate for {node_id} must carry an Ed25519 public key (OID 1.3.101.112), \
                 found key algorithm {algorithm}"
            ),
            CertIdentityError::NodeKeyMismatch {
                node_id,
                key_node_id,
            } => write!(
                f,
                "node certificate common name {node_id} does not match its public key, which \
                 belongs to node {key_node_id}"
            ),
            CertIdentityError::OwnerKeyNotEd25519 { algorithm } => write!(
                f,
                "owner certificate must carry an Ed25519 public key (OID 1.3.101.112), found \
                 key algorithm {algorithm}; use the owner credential the cluster issued"
            ),
            CertIdentityError::OwnerWithoutClientAuth => f.write_str(
                "owner certificate lacks the client-auth extended key usage; use the owner \
                 credential the cluster issued",
            ),
            CertIdentityError::NodeWithoutServerAuth { node_id } => write!(
                f,
                "node certificate for {node_id} lacks the server-auth extended key usage that \
                 cluster node certificates carry; use the certificate the cluster issued"
            ),
            CertIdentityError::NodeNameNotInSan { node_id } => write!(
                f,
                "node certificate for {node_id} does not name {node_id} among its DNS subject \
                 alternative names, as cluster node certificates do; use the certificate the \
                 cluster issued"
            ),
        }
    }
}

impl std::error::Error for CertIdentityError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            CertIdentityError::InvalidNodeId(e) => Some(e),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use proptest::prelude::*;
    use rcgen::{CertificateParams, DnType, KeyPair, PKCS_ECDSA_P256_SHA256, PKCS_ED25519};

    const SAMPLE: &str = "metropolis-000102030405060708090a0b0c0d0e0f";

    fn key_bytes() -> [u8; 32] {
        std::array::from_fn(|i| u8::try_from(i).unwrap())
    }

    #[test]
    fn node_id_from_public_key_uses_first_16_bytes() {
        let id = NodeId::from_public_key(&key_bytes());
        assert_eq!(id.as_str(), SAMPLE);
        assert_eq!(id.to_string(), SAMPLE);
        assert_eq!(NodeId::parse(SAMPLE).unwrap(), id);
        assert_eq!(SAMPLE.parse::<NodeId>().unwrap(), id);
        let mut other = key_bytes();
        other[31] = 0xff;
        assert_eq!(
            NodeId::from_public_key(&other),
            id,
            "bytes past 16 do not matter"
        );
        other[15] = 0xff;
        assert_eq!(
            NodeId::from_public_key(&other).as_str(),
            "metropolis-000102030405060708090a0b0c0d0eff"
        );
    }

    #[test]
    fn node_id_parse_rejects_everything_else() {
        let cases: &[(&str, &str)] = &[
            ("", "does not start with"),
            ("foo", "does not start with"),
            (
                "Metropolis-000102030405060708090a0b0c0d0e0f",
                "does not start with",
            ),
            (
                "metropolis-000102030405060708090A0B0C0D0E0F",
                "'A' is not one of 0-9, a-f",
            ),
            (
                "metropolis-000102030405060708090a0b0c0d0e0g",
                "'g' is not one of 0-9, a-f",
            ),
            (
                "metropolis-000102030405060708090a0b0c0d0e0é",
                "'é' is not one of",
            ),
            (
                "metropolis- 00102030405060708090a0b0c0d0e0f",
                "' ' is not one of",
            ),
            ("metropolis-", "it has 0 hex characters after the prefix"),
            (
                "metropolis-000102030405060708090a0b0c0d0e0",
                "it has 31 hex characters after the prefix",
            ),
            (
                "metropolis-000102030405060708090a0b0c0d0e0f0",
                "it has 33 hex characters after the prefix",
            ),
        ];
        for (input, detail) in cases {
            let err = NodeId::parse(input).unwrap_err();
            let msg = err.to_string();
            assert!(
                msg.starts_with(&format!(
                    "node ID {input:?} must be \"metropolis-\" followed by 32 lowercase hex characters"
                )),
                "{msg}"
            );
            assert!(msg.contains(detail), "{input:?}: {msg}");
        }
    }

    #[test]
    fn node_id_error_quotes_at_most_quote_chars_characters() {
        let long = "x".repeat(10_000);
        let err = NodeId::parse(&long).unwrap_err();
        assert_eq!(
            err,
            NodeIdError::MissingPrefix {
                input: format!("{}…", "x".repeat(crate::quote::QUOTE_CHARS))
            }
        );
        assert!(err.to_string().len() < 250);
    }

    proptest! {
        #[test]
        fn every_public_key_gives_a_parsable_id(key in any::<[u8; 32]>()) {
            let id = NodeId::from_public_key(&key);
            prop_assert_eq!(NodeId::parse(id.as_str()).unwrap(), id);
        }

        #[test]
        fn parse_accepts_exactly_the_format(s in "(metropolis-)?[0-9a-fA-F\u{e9}-]{0,40}") {
            let hex = s.strip_prefix("metropolis-");
            let valid = hex.is_some_and(|h| {
                h.len() == 32 && h.chars().all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c))
            });
            prop_assert_eq!(NodeId::parse(&s).is_ok(), valid);
        }
    }

    fn node() -> Identity {
        Identity::Node(NodeId::parse(SAMPLE).unwrap())
    }

    const ALL: &[Permission] = &[
        Permission::Unspecified,
        Permission::GetRegisterTicket,
        Permission::ReadClusterStatus,
        Permission::UpdateNodeSelf,
        Permission::ApproveNode,
        Permission::UpdateNodeRoles,
        Permission::ReadNodeLogs,
        Permission::UpdateNode,
        Permission::DecommissionNode,
        Permission::DeleteNode,
    ];

    #[test]
    fn permissions_held() {
        for &p in ALL {
            let real = p != Permission::Unspecified;
            assert_eq!(Identity::Owner.holds(p), real, "{p:?}");
            assert!(!Identity::Unauthenticated.holds(p), "{p:?}");
            let node_holds = matches!(
                p,
                Permission::ReadClusterStatus | Permission::UpdateNodeSelf
            );
            assert_eq!(node().holds(p), node_holds, "{p:?}");
        }
    }

    #[test]
    fn authorize_distinguishes_missing_identity_from_missing_permission() {
        let read = Rule {
            need: &[Permission::ReadClusterStatus],
            allow_unauthenticated: false,
        };
        let admin = Rule {
            need: &[
                Permission::ReadClusterStatus,
                Permission::DeleteNode,
                Permission::ApproveNode,
            ],
            allow_unauthenticated: false,
        };
        let open = Rule {
            need: &[Permission::DeleteNode],
            allow_unauthenticated: true,
        };
        let nothing = Rule {
            need: &[],
            allow_unauthenticated: false,
        };

        assert_eq!(
            authorize(&Identity::Unauthenticated, &read),
            Err(AuthzError::Unauthenticated)
        );
        assert_eq!(
            authorize(&Identity::Unauthenticated, &nothing),
            Err(AuthzError::Unauthenticated)
        );
        assert_eq!(authorize(&Identity::Unauthenticated, &open), Ok(()));
        assert_eq!(authorize(&node(), &open), Ok(()));
        assert_eq!(authorize(&node(), &read), Ok(()));
        assert_eq!(authorize(&node(), &nothing), Ok(()));
        assert_eq!(authorize(&Identity::Owner, &admin), Ok(()));

        let err = authorize(&node(), &admin).unwrap_err();
        assert_eq!(
            err,
            AuthzError::PermissionDenied {
                identity: node(),
                missing: vec![Permission::DeleteNode, Permission::ApproveNode]
            }
        );
        let msg = err.to_string();
        assert!(msg.starts_with(&format!("node {SAMPLE} lacks the permissions PERMISSION_DELETE_NODE, PERMISSION_APPROVE_NODE")), "{msg}");
        assert!(
            AuthzError::Unauthenticated
                .to_string()
                .contains("client certificate issued by the cluster CA")
        );
    }

    #[test]
    fn authorize_with_proto_policies() {
        let watch = metropolis_proto::authorization::policy(
            "/metropolis.node.core.curator.proto.api.Curator/Watch",
        )
        .and_then(|p| p.rule)
        .unwrap();
        assert_eq!(authorize(&node(), &watch), Ok(()));
        assert_eq!(authorize(&Identity::Owner, &watch), Ok(()));
        assert_eq!(
            authorize(&Identity::Unauthenticated, &watch),
            Err(AuthzError::Unauthenticated)
        );
    }

    /// A self-signed certificate with the given subject; the TLS layer's
    /// chain check is not this module's concern.
    fn cert(key: &KeyPair, subject: &[(DnType, &str)]) -> Vec<u8> {
        let mut params = CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        for (ty, value) in subject {
            params.distinguished_name.push(ty.clone(), *value);
        }
        params.self_signed(key).unwrap().der().to_vec()
    }

    /// A node certificate for `cn` as the cluster issues it: server-auth
    /// usage, `cn` among the DNS names; `strip` leaves out one of them.
    fn node_cert(key: &KeyPair, cn: &str, strip: Option<&str>) -> Vec<u8> {
        let mut params = CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, cn);
        if strip != Some("eku") {
            params.extended_key_usages = vec![
                rcgen::ExtendedKeyUsagePurpose::ServerAuth,
                rcgen::ExtendedKeyUsagePurpose::ClientAuth,
            ];
        } else {
            params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        }
        params.subject_alt_names = vec![rcgen::SanType::DnsName("localhost".try_into().unwrap())];
        if strip != Some("san") {
            params
                .subject_alt_names
                .push(rcgen::SanType::DnsName(cn.try_into().unwrap()));
        }
        params.self_signed(key).unwrap().der().to_vec()
    }

    fn ed25519() -> (KeyPair, NodeId) {
        let key = KeyPair::generate_for(&PKCS_ED25519).unwrap();
        let raw: [u8; 32] = key.public_key_raw().try_into().unwrap();
        let id = NodeId::from_public_key(&raw);
        (key, id)
    }

    #[test]
    fn owner_certificate() {
        let (key, _) = ed25519();
        let owner = |key: &KeyPair, usage: rcgen::ExtendedKeyUsagePurpose| {
            let mut params = CertificateParams::default();
            params.distinguished_name = rcgen::DistinguishedName::new();
            params
                .distinguished_name
                .push(DnType::OrganizationName, "metropolis");
            params.distinguished_name.push(DnType::CommonName, "owner");
            params.extended_key_usages = vec![usage];
            params.self_signed(key).unwrap().der().to_vec()
        };
        let client = rcgen::ExtendedKeyUsagePurpose::ClientAuth;
        assert_eq!(
            identity_from_certificate(&owner(&key, client.clone())),
            Ok(Identity::Owner)
        );
        // As the reference: an Ed25519 key and the client-auth usage.
        let server = rcgen::ExtendedKeyUsagePurpose::ServerAuth;
        assert_eq!(
            identity_from_certificate(&owner(&key, server)),
            Err(CertIdentityError::OwnerWithoutClientAuth)
        );
        let ecdsa = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
        let err = identity_from_certificate(&owner(&ecdsa, client)).unwrap_err();
        assert!(
            matches!(err, CertIdentityError::OwnerKeyNotEd25519 { .. }),
            "{err:?}"
        );
        assert!(err.to_string().contains("1.2.840.10045.2.1"), "{err}");

        let der = cert(&key, &[(DnType::CommonName, "owner")]);
        let err = identity_from_certificate(&der).unwrap_err();
        assert_eq!(err, CertIdentityError::OwnerOrganization { found: vec![] });
        assert!(err.to_string().contains("\"metropolis\""), "{err}");

        let der = cert(
            &key,
            &[
                (DnType::OrganizationName, "acme"),
                (DnType::CommonName, "owner"),
            ],
        );
        assert_eq!(
            identity_from_certificate(&der),
            Err(CertIdentityError::OwnerOrganization {
                found: vec!["acme".to_owned()]
            })
        );

        // Found by review for the `peer_certificate` fuzz target (its
        // message bound; fuzz/regressions/peer_certificate/): a long
        // organization is quoted cut, not whole.
        let long = "o".repeat(3000);
        let der = cert(
            &key,
            &[
                (DnType::OrganizationName, long.as_str()),
                (DnType::CommonName, "owner"),
            ],
        );
        let err = identity_from_certificate(&der).unwrap_err();
        let CertIdentityError::OwnerOrganization { found } = &err else {
            panic!("{err:?}");
        };
        assert_eq!(
            found,
            &[format!("{}…", "o".repeat(crate::quote::QUOTE_CHARS))]
        );
        assert!(err.to_string().len() < 300, "{err}");
    }

    #[test]
    fn node_certificate() {
        let (key, id) = ed25519();
        let der = node_cert(&key, id.as_str(), None);
        assert_eq!(
            identity_from_certificate(&der),
            Ok(Identity::Node(id.clone()))
        );

        // As the reference: the server-auth usage and the node's DNS name
        // are required too.
        let der = cert(&key, &[(DnType::CommonName, id.as_str())]);
        assert_eq!(
            identity_from_certificate(&der),
            Err(CertIdentityError::NodeWithoutServerAuth {
                node_id: id.clone()
            })
        );
        let der = node_cert(&key, id.as_str(), Some("eku"));
        let err = identity_from_certificate(&der).unwrap_err();
        assert_eq!(
            err,
            CertIdentityError::NodeWithoutServerAuth {
                node_id: id.clone()
            }
        );
        assert!(err.to_string().contains("server-auth"), "{err}");
        let der = node_cert(&key, id.as_str(), Some("san"));
        let err = identity_from_certificate(&der).unwrap_err();
        assert_eq!(
            err,
            CertIdentityError::NodeNameNotInSan {
                node_id: id.clone()
            }
        );
        assert!(err.to_string().contains("DNS subject alternative"), "{err}");

        let (_, other) = ed25519();
        let der = cert(&key, &[(DnType::CommonName, other.as_str())]);
        let err = identity_from_certificate(&der).unwrap_err();
        assert_eq!(
            err,
            CertIdentityError::NodeKeyMismatch {
                node_id: other.clone(),
                key_node_id: id
            }
        );
        assert!(
            err.to_string()
                .contains(&format!("{other} does not match its public key")),
            "{err}"
        );

        let ecdsa = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
        let der = cert(&ecdsa, &[(DnType::CommonName, other.as_str())]);
        let err = identity_from_certificate(&der).unwrap_err();
        assert!(
            matches!(err, CertIdentityError::NodeKeyNotEd25519 { ref node_id, .. } if *node_id == other),
            "{err:?}"
        );
        assert!(err.to_string().contains("1.2.840.10045.2.1"), "{err}");

        let der = cert(&key, &[(DnType::CommonName, "metropolis-XYZ")]);
        let err = identity_from_certificate(&der).unwrap_err();
        assert!(
            matches!(
                err,
                CertIdentityError::InvalidNodeId(NodeIdError::InvalidCharacter { .. })
            ),
            "{err:?}"
        );
        assert!(std::error::Error::source(&err).is_some());
    }

    #[test]
    fn reserved_names() {
        for cn in [
            "owner",
            "OWNER",
            "Owner",
            SAMPLE,
            "metropolis-",
            "Metropolis-x",
            "METROPOLIS-zz",
        ] {
            assert!(reserved_common_name(cn).is_some(), "{cn}");
        }
        for cn in [
            "alice",
            "owner ",
            "owners",
            "metropolis",
            "system:node:metropolis-1",
            "",
            "ö",
        ] {
            assert_eq!(reserved_common_name(cn), None, "{cn}");
        }
        assert_eq!(
            reserved_organization("Metropolis"),
            Some(ReservedName::OwnerOrganization)
        );
        assert_eq!(reserved_organization("metropolis-dev"), None);
        assert_eq!(reserved_organization("system:masters"), None);
        let msg = ReservedName::NodeIdPrefix.to_string();
        assert!(msg.contains("\"metropolis-\""), "{msg}");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Every subject the classifier accepts as a cluster identity is
        /// reserved: a certificate with no reserved name is never an
        /// identity, whatever signs it.
        #[test]
        fn every_identity_subject_is_reserved(
            cn in prop_oneof![
                Just("owner".to_owned()),
                Just("<node>".to_owned()),
                "metropolis-[0-9a-f]{32}",
                "[a-zA-Z:-]{1,16}",
            ],
            // rcgen keeps one value per attribute type: at most one O.
            org in proptest::option::of(prop_oneof![
                Just("metropolis".to_owned()),
                "[a-z]{1,8}",
            ]),
        ) {
            let (key, id) = ed25519();
            let cn = if cn == "<node>" { id.to_string() } else { cn };
            let mut subject: Vec<(DnType, &str)> = org
                .iter()
                .map(|o| (DnType::OrganizationName, o.as_str()))
                .collect();
            subject.push((DnType::CommonName, cn.as_str()));
            let der = cert(&key, &subject);
            if identity_from_certificate(&der).is_ok() {
                let reserved = reserved_common_name(&cn).is_some()
                    || org.as_deref().and_then(reserved_organization).is_some();
                prop_assert!(reserved, "{cn:?} {org:?} is an identity but not reserved");
            }
        }
    }

    #[test]
    fn other_certificates() {
        let (key, id) = ed25519();
        let der = cert(&key, &[(DnType::CommonName, "admin")]);
        let err = identity_from_certificate(&der).unwrap_err();
        assert_eq!(
            err,
            CertIdentityError::UnknownSubject {
                common_name: "admin".to_owned()
            }
        );
        assert!(
            err.to_string().contains("neither \"owner\" nor a node ID"),
            "{err}"
        );

        let der = cert(&key, &[(DnType::OrganizationName, "metropolis")]);
        let err = identity_from_certificate(&der).unwrap_err();
        assert!(
            err.to_string().contains("it has no common name (CN)"),
            "{err}"
        );

        let der = cert(&key, &[(DnType::CommonName, id.as_str())]);
        let mut trailing = der.clone();
        trailing.push(0);
        let err = identity_from_certificate(&trailing).unwrap_err();
        assert!(
            err.to_string().contains("1 bytes of trailing data"),
            "{err}"
        );

        let err = identity_from_certificate(&der[..der.len() - 1]).unwrap_err();
        assert!(
            matches!(err, CertIdentityError::Malformed { .. }),
            "{err:?}"
        );
        let err = identity_from_certificate(b"not a certificate").unwrap_err();
        assert!(
            err.to_string()
                .starts_with("client certificate is not a valid DER X.509 certificate"),
            "{err}"
        );
        assert!(identity_from_certificate(&[]).is_err());
    }
}
