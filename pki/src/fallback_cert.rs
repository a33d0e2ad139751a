//! This node's ECDSA P-256 server certificate: the identity of its Ed25519
//! node certificate, for TLS clients that offer no Ed25519 signature scheme
//! (BoringSSL, inside gRPC C-core: Python `grpcio`, C++, Ruby).
//!
//! The P-256 certificate copies the Ed25519 certificate's subject and its
//! subject alternative names (which carry the curator mark), key usage and
//! extended key usage extensions byte for byte, and is signed by the
//! cluster CA. It lives next to the Ed25519 certificate in `pki/`
//! ([`P256_PREFIX`]), is created when missing and re-issued when it no
//! longer matches (see [`p256_mismatch`]). It does not authenticate the
//! node as a client: a node identity needs the node's Ed25519 key
//! ([`metropolis_core::identity`]).

use std::path::Path;
use std::time::Duration;

use rcgen::{CustomExtension, KeyPair, PKCS_ECDSA_P256_SHA256};
use x509_parser::certificate::X509Certificate;
use x509_parser::oid_registry::{
    OID_EC_P256, OID_KEY_TYPE_EC_PUBLIC_KEY, OID_X509_EXT_BASIC_CONSTRAINTS,
    OID_X509_EXT_EXTENDED_KEY_USAGE, OID_X509_EXT_KEY_USAGE, OID_X509_EXT_SUBJECT_ALT_NAME, Oid,
};

use super::ca::{distinguished_name, format_unix, unix_now};
use super::{ClusterCa, Credentials, PkiError, files};

/// The file prefix of the P-256 server certificate in `pki/`:
/// `node-p256.pem` and `node-p256-key.pem` (mode 0600).
pub const P256_PREFIX: &str = "node-p256";

/// A P-256 certificate that expires within this time is re-issued at start
/// (unless it already lasts as long as the CA).
pub const P256_RENEW_BEFORE: Duration = Duration::from_secs(30 * 24 * 3600);

/// The extensions copied from the Ed25519 certificate, with their names for
/// messages. Basic constraints are not copied (rcgen writes `CA:FALSE`
/// itself) but compared all the same.
const COPIED: [(&Oid<'static>, &str); 3] = [
    (&OID_X509_EXT_SUBJECT_ALT_NAME, "subject alternative names"),
    (&OID_X509_EXT_KEY_USAGE, "key usage"),
    (&OID_X509_EXT_EXTENDED_KEY_USAGE, "extended key usage"),
];

/// The extensions compared but not copied.
const ALSO_COMPARED: [(&Oid<'static>, &str); 1] =
    [(&OID_X509_EXT_BASIC_CONSTRAINTS, "basic constraints")];

/// What [`load_or_issue_p256`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum P256Status {
    /// The certificate on disk matches; it was kept.
    Kept,
    /// There was none; one was issued and written.
    Created,
    /// The one on disk did not match (the reason says why); a new one was
    /// issued and written over it.
    Reissued {
        /// Why the old one was replaced.
        reason: String,
    },
}

impl ClusterCa {
    /// Issues an ECDSA P-256 server certificate (fresh key) with the
    /// identity of the node certificate in `node`: the same subject, and
    /// the same subject alternative name, key usage and extended key usage
    /// extensions.
    pub fn issue_p256_server_cert(&self, node: &Credentials) -> Result<Credentials, PkiError> {
        let origin = "node certificate";
        let node_der = node.cert_der()?;
        let node_cert = parse(origin, &node_der)?;
        let subject = distinguished_name(node_cert.subject(), origin)?;
        let mut params = self.leaf_params(subject, Vec::new(), Vec::new())?;
        params.key_usages.clear();
        for (oid, _) in COPIED {
            let Some(ext) = extension(&node_cert, oid) else {
                continue;
            };
            let arcs: Vec<u64> = oid
                .iter()
                .ok_or_else(|| PkiError::invalid(origin, "an extension OID is too long"))?
                .collect();
            let mut copy = CustomExtension::from_oid_content(&arcs, ext.value.to_vec());
            copy.set_criticality(ext.critical);
            params.custom_extensions.push(copy);
        }
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)
            .map_err(PkiError::crypto("generate the P-256 server key"))?;
        let cert_pem = self.sign(&params, &key)?;
        let issued = Credentials::from_parts(cert_pem, key.serialize_pem(), self.cert_pem());
        let issued_der = issued.cert_der()?;
        let issued_cert = parse("issued P-256 certificate", &issued_der)?;
        if let Some(problem) = identity_mismatch(&node_cert, &issued_cert) {
            return Err(PkiError::invalid("issued P-256 certificate", problem));
        }
        Ok(issued)
    }
}

/// Why `p256` is not, at `now` (seconds since the Unix epoch), a usable
/// P-256 twin of the node certificate in `node` under `ca`; `None` when it
/// is. It must: hold a P-256 key and that key, be signed by `ca`, carry
/// the node certificate's subject and subject alternative name, key usage,
/// extended key usage and basic constraints extensions, be valid at `now`,
/// and not expire within [`P256_RENEW_BEFORE`] unless it lasts as long as
/// the CA. An error only when `node` itself cannot be parsed.
pub fn p256_mismatch(
    ca: &ClusterCa,
    node: &Credentials,
    p256: &Credentials,
    now: u64,
) -> Result<Option<String>, PkiError> {
    let node_der = node.cert_der()?;
    let node_cert = parse("node certificate", &node_der)?;
    let p256_der = match p256.cert_der() {
        Ok(der) => der,
        Err(e) => return Ok(Some(e.to_string())),
    };
    let cert = match parse("P-256 certificate", &p256_der) {
        Ok(cert) => cert,
        Err(e) => return Ok(Some(e.to_string())),
    };
    let spki = &cert.public_key().algorithm;
    let curve = spki.parameters.as_ref().and_then(|p| p.as_oid().ok());
    if spki.algorithm != OID_KEY_TYPE_EC_PUBLIC_KEY || curve != Some(OID_EC_P256) {
        return Ok(Some("its key is not an ECDSA P-256 key".to_owned()));
    }
    let under_ca =
        Credentials::from_parts(p256.cert_pem.clone(), p256.key_pem.clone(), ca.cert_pem());
    if let Err(e) = under_ca.validate() {
        return Ok(Some(format!("not usable under the cluster CA: {e}")));
    }
    if let Some(problem) = identity_mismatch(&node_cert, &cert) {
        return Ok(Some(problem));
    }
    let validity = cert.validity();
    let not_before = u64::try_from(validity.not_before.timestamp()).unwrap_or(0);
    let not_after = u64::try_from(validity.not_after.timestamp()).unwrap_or(0);
    if not_before > now {
        return Ok(Some(format!(
            "it is not valid before {}",
            format_unix(not_before)
        )));
    }
    if not_after <= now.saturating_add(P256_RENEW_BEFORE.as_secs()) && not_after < ca.not_after() {
        return Ok(Some(format!("it expires at {}", format_unix(not_after))));
    }
    Ok(None)
}

/// The P-256 server certificate of the node whose credentials are `node`,
/// in `dir` (files [`P256_PREFIX`]`.pem` and `-key.pem`): read and kept
/// when it [matches](p256_mismatch) at the current time, otherwise issued
/// by `ca` and written (key mode 0600, each file atomically and durably;
/// the directory's `ca.pem` is left alone). An unreadable or garbled file
/// is replaced, not an error.
pub fn load_or_issue_p256(
    dir: &Path,
    ca: &ClusterCa,
    node: &Credentials,
) -> Result<(Credentials, P256Status), PkiError> {
    let cert_path = Credentials::cert_path(dir, P256_PREFIX);
    let key_path = Credentials::key_path(dir, P256_PREFIX);
    let status = if !cert_path.exists() && !key_path.exists() {
        P256Status::Created
    } else {
        let reason = match Credentials::read_from_dir(dir, P256_PREFIX) {
            Err(e) => e.to_string(),
            Ok(found) => match p256_mismatch(ca, node, &found, unix_now())? {
                None => return Ok((found, P256Status::Kept)),
                Some(reason) => reason,
            },
        };
        P256Status::Reissued { reason }
    };
    let issued = ca.issue_p256_server_cert(node)?;
    // The key first: a crash in between leaves a key that does not fit
    // the old certificate, which the next start replaces.
    files::write_atomic(&key_path, issued.key_pem.as_bytes(), files::PRIVATE_MODE)?;
    files::write_atomic(&cert_path, issued.cert_pem.as_bytes(), files::PUBLIC_MODE)?;
    Ok((issued, status))
}

/// Why `cert` does not carry the identity of `node` (subject and the
/// extensions that define what the certificate is for); `None` when it
/// does.
fn identity_mismatch(node: &X509Certificate<'_>, cert: &X509Certificate<'_>) -> Option<String> {
    if node.subject().as_raw() != cert.subject().as_raw() {
        return Some(format!(
            "its subject ({}) is not the node certificate's ({})",
            bounded(&cert.subject().to_string()),
            bounded(&node.subject().to_string()),
        ));
    }
    for (oid, name) in COPIED.into_iter().chain(ALSO_COMPARED) {
        let theirs = extension(node, oid).map(|e| (e.critical, e.value));
        let ours = extension(cert, oid).map(|e| (e.critical, e.value));
        if theirs != ours {
            return Some(format!(
                "its {name} extension is not the node certificate's"
            ));
        }
    }
    None
}

fn extension<'c, 'd>(
    cert: &'c X509Certificate<'d>,
    oid: &Oid<'_>,
) -> Option<&'c x509_parser::extensions::X509Extension<'d>> {
    cert.iter_extensions().find(|ext| ext.oid == *oid)
}

fn parse<'a>(origin: &str, der: &'a [u8]) -> Result<X509Certificate<'a>, PkiError> {
    let (_, cert) = x509_parser::parse_x509_certificate(der)
        .map_err(|e| PkiError::invalid(origin, format!("not a valid X.509 certificate: {e}")))?;
    Ok(cert)
}

/// At most 80 characters of `s`, for messages.
fn bounded(s: &str) -> String {
    match s.char_indices().nth(80) {
        Some((at, _)) => format!("{}…", &s[..at]),
        None => s.to_owned(),
    }
}
