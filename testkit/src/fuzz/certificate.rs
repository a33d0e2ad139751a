//! `peer_certificate`: the x509 parsing of the certificates peers and
//! agents present: [`identity_from_certificate`] (node and owner
//! certificates), [`is_curator_certificate`] (the curator mark a
//! forwarding peer needs) and [`agent_key_from_certificate`] (an agent's
//! self-signed certificate).
//!
//! Input: the DER bytes of one certificate, as a TLS peer sends them.
//! The seeds are real certificates, written by the PKI's tests
//! (`cargo test -p metropolis-pki --test fuzz_seeds -- --ignored`).
//!
//! Checked, against the certificate as `x509-parser` reads it on its own:
//! - an identity is only [`Identity::Node`] or [`Identity::Owner`], and
//!   only for bytes that are exactly one certificate: `Owner` with the
//!   one common name `owner`, the one organization `metropolis`, an
//!   Ed25519 key and the client-auth extended key usage;
//!   `Node(id)` with the one common name `id`, an Ed25519 key of 32
//!   bytes from which `id` derives, the server-auth extended key usage
//!   and `id` among its DNS subject alternative names;
//! - a curator certificate is a certificate with the curator URI among
//!   the names of a subject alternative name extension;
//! - an agent key is the 32-byte Ed25519 key of exactly one certificate
//!   whose signature verifies with it (and, for a node certificate, the
//!   node's key);
//! - bytes that are not exactly one certificate fail as `Malformed`;
//!   every error's message is at most [`MAX_MESSAGE`] bytes, however
//!   long the names in the certificate.

use metropolis_core::agent_cert::{AgentCertError, agent_key_from_certificate};
use metropolis_core::identity::{
    CURATOR_URI, CertIdentityError, Identity, NodeId, OWNER_COMMON_NAME, OWNER_ORGANIZATION,
    identity_from_certificate, is_curator_certificate,
};
use x509_parser::certificate::X509Certificate;
use x509_parser::extensions::{GeneralName, ParsedExtension};
use x509_parser::oid_registry::OID_SIG_ED25519;

/// The longest error message accepted: messages quote names from the
/// certificate, cut to [`QUOTE_CHARS`](metropolis_core::quote::QUOTE_CHARS)
/// characters.
pub const MAX_MESSAGE: usize = 2048;

fn strings<'a>(
    values: impl Iterator<Item = &'a x509_parser::x509::AttributeTypeAndValue<'a>>,
) -> Vec<String> {
    values
        .map(|v| {
            v.as_str()
                .map(str::to_owned)
                .unwrap_or_else(|_| "\u{0}not text".into())
        })
        .collect()
}

/// The raw Ed25519 key of `cert`, if it has one.
fn ed25519_key(cert: &X509Certificate<'_>) -> Option<[u8; 32]> {
    let spki = cert.public_key();
    if spki.algorithm.algorithm != OID_SIG_ED25519 || spki.subject_public_key.unused_bits != 0 {
        return None;
    }
    <[u8; 32]>::try_from(spki.subject_public_key.data.as_ref()).ok()
}

/// Whether some subject alternative name extension of `cert` holds a
/// name `wanted` accepts.
fn has_san(cert: &X509Certificate<'_>, wanted: impl Fn(&GeneralName<'_>) -> bool) -> bool {
    cert.extensions()
        .iter()
        .any(|ext| match ext.parsed_extension() {
            ParsedExtension::SubjectAlternativeName(san) => san.general_names.iter().any(&wanted),
            _ => false,
        })
}

fn has_curator_uri(cert: &X509Certificate<'_>) -> bool {
    has_san(
        cert,
        |n| matches!(n, GeneralName::URI(uri) if *uri == CURATOR_URI),
    )
}

/// Whether some extension of `cert` names `dns` as a DNS name.
fn has_dns_name(cert: &X509Certificate<'_>, dns: &str) -> bool {
    has_san(
        cert,
        |n| matches!(n, GeneralName::DNSName(name) if *name == dns),
    )
}

/// Whether some extended key usage extension of `cert` passes `usage`.
fn has_usage(
    cert: &X509Certificate<'_>,
    usage: impl Fn(&x509_parser::extensions::ExtendedKeyUsage<'_>) -> bool,
) -> bool {
    cert.extensions()
        .iter()
        .any(|ext| match ext.parsed_extension() {
            ParsedExtension::ExtendedKeyUsage(eku) => usage(eku),
            _ => false,
        })
}

fn check_message(what: &str, message: String) {
    assert!(
        message.len() <= MAX_MESSAGE,
        "{what} error of {} bytes: {}…",
        message.len(),
        message.chars().take(200).collect::<String>()
    );
}

/// Runs one input.
pub fn run(data: &[u8]) {
    let parsed = x509_parser::parse_x509_certificate(data).ok();
    let whole = parsed
        .as_ref()
        .filter(|(rest, _)| rest.is_empty())
        .map(|(_, cert)| cert);
    let identity = identity_from_certificate(data);
    match (&identity, whole) {
        (Ok(Identity::Owner), Some(cert)) => {
            assert_eq!(
                strings(cert.subject().iter_common_name()),
                [OWNER_COMMON_NAME]
            );
            assert_eq!(
                cert.public_key().algorithm.algorithm,
                OID_SIG_ED25519,
                "an owner without an Ed25519 key"
            );
            assert!(
                has_usage(cert, |u| u.client_auth),
                "an owner without client-auth"
            );
            assert_eq!(
                strings(cert.subject().iter_organization()),
                [OWNER_ORGANIZATION]
            );
        }
        (Ok(Identity::Node(id)), Some(cert)) => {
            assert_eq!(strings(cert.subject().iter_common_name()), [id.as_str()]);
            let Some(key) = ed25519_key(cert) else {
                panic!("a node identity without an Ed25519 key");
            };
            assert_eq!(
                &NodeId::from_public_key(&key),
                id,
                "the key names another node"
            );
            assert!(
                has_usage(cert, |u| u.server_auth),
                "a node without server-auth"
            );
            assert!(
                has_dns_name(cert, id.as_str()),
                "a node not named in its SANs"
            );
        }
        (Ok(other), cert) => panic!(
            "identity {other:?} from a certificate (whole: {})",
            cert.is_some()
        ),
        (Err(e), cert) => {
            if cert.is_none() {
                assert!(
                    matches!(e, CertIdentityError::Malformed { .. }),
                    "not one certificate, yet {e:?}"
                );
            }
            check_message("identity", e.to_string());
        }
    }
    if is_curator_certificate(data) {
        let Some((_, cert)) = &parsed else {
            panic!("a curator mark on bytes that do not parse");
        };
        assert!(
            has_curator_uri(cert),
            "a curator mark without the curator URI"
        );
    } else if let Some((_, cert)) = &parsed {
        assert!(!has_curator_uri(cert), "the curator URI was missed");
    }
    match agent_key_from_certificate(data) {
        Ok(key) => {
            let Some(cert) = whole else {
                panic!("an agent key from bytes that are not one certificate");
            };
            assert_eq!(
                ed25519_key(cert),
                Some(key),
                "the agent key is not the certificate's"
            );
            assert!(
                cert.verify_signature(None).is_ok(),
                "not self-signed, yet accepted"
            );
            if let Ok(Identity::Node(id)) = &identity {
                assert_eq!(&NodeId::from_public_key(&key), id);
            }
        }
        Err(e) => {
            assert!(
                !matches!(e, AgentCertError::Missing),
                "bytes given, yet Missing"
            );
            if whole.is_none() {
                assert!(
                    matches!(e, AgentCertError::Malformed(_)),
                    "not one certificate, yet {e:?}"
                );
            }
            check_message("agent", e.to_string());
        }
    }
}
