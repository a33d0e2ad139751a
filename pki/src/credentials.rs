//! A TLS identity: a certificate, its private key, and the cluster CA
//! certificate that vouches for it.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use metropolis_core::identity::{Identity, identity_from_certificate};
use rustls::RootCertStore;
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::WebPkiClientVerifier;
use x509_parser::certificate::X509Certificate;
use x509_parser::oid_registry::OID_SIG_ED25519;

use super::{PkiError, files, provider};

/// The file holding the cluster CA certificate, in every credential
/// directory.
pub const CA_CERT_FILE: &str = "ca.pem";

/// Labels of in-memory inputs in error messages.
const CERT_LABEL: &str = "certificate PEM";
const KEY_LABEL: &str = "private key PEM";
const CA_LABEL: &str = "CA certificate PEM";

/// A certificate (PEM, possibly followed by intermediates), its private key
/// (PEM, PKCS#8 for the keys this PKI generates) and the cluster CA
/// certificate (PEM).
///
/// The fields are plain text and not checked on construction;
/// [`Credentials::validate`] checks them together, and
/// [`Credentials::read_from_dir`] and [`Credentials::write_to_dir`] do so
/// before returning or writing anything. The DER accessors parse on each
/// call.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// The certificate, PEM.
    pub cert_pem: String,
    /// The certificate's private key, PEM.
    pub key_pem: String,
    /// The cluster CA certificate, PEM.
    pub ca_pem: String,
}

/// Where each part of a set of credentials came from, for error messages.
struct Origins {
    cert: String,
    key: String,
    ca: String,
}

impl Origins {
    fn labels() -> Origins {
        Origins {
            cert: CERT_LABEL.to_owned(),
            key: KEY_LABEL.to_owned(),
            ca: CA_LABEL.to_owned(),
        }
    }
}

impl Credentials {
    /// Credentials from their three PEM texts, unchecked.
    pub fn from_parts(cert_pem: String, key_pem: String, ca_pem: String) -> Credentials {
        Credentials {
            cert_pem,
            key_pem,
            ca_pem,
        }
    }

    /// The path of the certificate file `<dir>/<prefix>.pem`.
    pub fn cert_path(dir: &Path, prefix: &str) -> PathBuf {
        dir.join(format!("{prefix}.pem"))
    }

    /// The path of the private key file `<dir>/<prefix>-key.pem`.
    pub fn key_path(dir: &Path, prefix: &str) -> PathBuf {
        dir.join(format!("{prefix}-key.pem"))
    }

    /// The certificate (the first one in [`Credentials::cert_pem`]), DER.
    pub fn cert_der(&self) -> Result<CertificateDer<'static>, PkiError> {
        first_cert(CERT_LABEL, &self.cert_pem)
    }

    /// The certificate followed by any intermediates, DER, as TLS presents
    /// them.
    pub fn chain_der(&self) -> Result<Vec<CertificateDer<'static>>, PkiError> {
        certs_from_pem(CERT_LABEL, &self.cert_pem)
    }

    /// The private key, DER.
    pub fn key_der(&self) -> Result<PrivateKeyDer<'static>, PkiError> {
        key_from_pem(KEY_LABEL, &self.key_pem)
    }

    /// The cluster CA certificate (the first one in
    /// [`Credentials::ca_pem`]), DER.
    pub fn ca_der(&self) -> Result<CertificateDer<'static>, PkiError> {
        first_cert(CA_LABEL, &self.ca_pem)
    }

    /// The raw 32-byte Ed25519 public key of the certificate; an error if
    /// the certificate's key is of another type.
    pub fn ed25519_public_key(&self) -> Result<[u8; 32], PkiError> {
        ed25519_public_key(CERT_LABEL, &self.cert_der()?)
    }

    /// The cluster identity the certificate carries (see
    /// [`metropolis_core::identity`] for the convention).
    pub fn identity(&self) -> Result<Identity, PkiError> {
        identity_from_certificate(&self.cert_der()?)
            .map_err(|e| PkiError::invalid(CERT_LABEL, e.to_string()))
    }

    /// Checks that the three parts fit together: each parses, the key is the
    /// certificate's, and the certificate is signed by the CA certificate
    /// for client authentication (as every node and owner certificate is).
    ///
    /// The signature chain is checked at a time inside both validity
    /// periods, not at the current time: this is a consistency check that
    /// does not depend on the clock. Expiry is the TLS handshake's concern,
    /// where it is reported to the peer.
    pub fn validate(&self) -> Result<(), PkiError> {
        self.validate_from(&Origins::labels())
    }

    fn validate_from(&self, origins: &Origins) -> Result<(), PkiError> {
        let chain = certs_from_pem(&origins.cert, &self.cert_pem)?;
        let key = key_from_pem(&origins.key, &self.key_pem)?;
        let cas = certs_from_pem(&origins.ca, &self.ca_pem)?;
        let leaf = parse_x509(&origins.cert, &chain[0])?;
        let ca = parse_x509(&origins.ca, &cas[0])?;
        check_key_matches(&chain, key, origins)?;
        verify_chain(&cas, &chain, (&leaf, &ca), origins)
    }

    /// Writes `<dir>/<prefix>.pem` (the certificate, mode 0644),
    /// `<dir>/<prefix>-key.pem` (the key, mode 0600) and `<dir>/ca.pem` (the
    /// CA certificate, mode 0644), each atomically and durably (temporary
    /// file, fsync, rename, fsync of the directory). The directory must
    /// exist. The credentials are [validated](Credentials::validate) first;
    /// nothing is written if they are inconsistent.
    pub fn write_to_dir(&self, dir: &Path, prefix: &str) -> Result<(), PkiError> {
        files::check_prefix(prefix)?;
        self.validate()?;
        files::write_atomic(
            &dir.join(CA_CERT_FILE),
            self.ca_pem.as_bytes(),
            files::PUBLIC_MODE,
        )?;
        files::write_atomic(
            &Self::key_path(dir, prefix),
            self.key_pem.as_bytes(),
            files::PRIVATE_MODE,
        )?;
        files::write_atomic(
            &Self::cert_path(dir, prefix),
            self.cert_pem.as_bytes(),
            files::PUBLIC_MODE,
        )
    }

    /// Writes the files of [`Credentials::write_to_dir`] into `dir` (created
    /// with mode 0700 if missing), but only if none of them exists yet:
    /// never replaces a credential. Each is written completely to a
    /// temporary file and linked into place, which fails if a file
    /// appeared there since the check; on any failure the files this call
    /// wrote are removed again, and what was there before is untouched.
    pub fn write_new_to_dir(&self, dir: &Path, prefix: &str) -> Result<(), PkiError> {
        files::check_prefix(prefix)?;
        self.validate()?;
        let parts = [
            (
                Self::key_path(dir, prefix),
                &self.key_pem,
                files::PRIVATE_MODE,
            ),
            (
                Self::cert_path(dir, prefix),
                &self.cert_pem,
                files::PUBLIC_MODE,
            ),
            (dir.join(CA_CERT_FILE), &self.ca_pem, files::PUBLIC_MODE),
        ];
        if let Some((path, _, _)) = parts.iter().find(|(path, _, _)| files::occupied(path)) {
            return Err(PkiError::Io {
                path: path.clone(),
                action: "create (it must not exist yet)",
                source: std::io::Error::from(std::io::ErrorKind::AlreadyExists),
            });
        }
        let mut written = Vec::new();
        for (path, text, mode) in &parts {
            if let Err(e) = files::write_new_file(path, text.as_bytes(), *mode) {
                for done in written {
                    let _ = std::fs::remove_file(done);
                }
                return Err(e);
            }
            written.push(path);
        }
        Ok(())
    }

    /// Reads the files [`Credentials::write_to_dir`] writes and
    /// [validates](Credentials::validate) them; errors name the file at
    /// fault. A key file readable by other users is accepted with a
    /// warning.
    pub fn read_from_dir(dir: &Path, prefix: &str) -> Result<Credentials, PkiError> {
        files::check_prefix(prefix)?;
        let cert_path = Self::cert_path(dir, prefix);
        let key_path = Self::key_path(dir, prefix);
        let ca_path = dir.join(CA_CERT_FILE);
        let creds = Credentials {
            cert_pem: files::read_text(&cert_path)?,
            key_pem: files::read_private(&key_path)?,
            ca_pem: files::read_text(&ca_path)?,
        };
        creds.validate_from(&Origins {
            cert: cert_path.display().to_string(),
            key: key_path.display().to_string(),
            ca: ca_path.display().to_string(),
        })?;
        Ok(creds)
    }
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("cert_pem", &self.cert_pem)
            .field("key_pem", &"<redacted>")
            .field("ca_pem", &self.ca_pem)
            .finish()
    }
}

/// Every certificate in `text`; at least one.
pub(crate) fn certs_from_pem(
    origin: &str,
    text: &str,
) -> Result<Vec<CertificateDer<'static>>, PkiError> {
    let certs = CertificateDer::pem_slice_iter(text.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| PkiError::invalid(origin, format!("garbled PEM: {e}")))?;
    if certs.is_empty() {
        return Err(PkiError::invalid(origin, "no PEM certificate found"));
    }
    Ok(certs)
}

/// The first certificate in `text`.
pub(crate) fn first_cert(origin: &str, text: &str) -> Result<CertificateDer<'static>, PkiError> {
    let mut certs = certs_from_pem(origin, text)?;
    Ok(certs.swap_remove(0))
}

/// The private key in `text`.
pub(crate) fn key_from_pem(origin: &str, text: &str) -> Result<PrivateKeyDer<'static>, PkiError> {
    PrivateKeyDer::from_pem_slice(text.as_bytes()).map_err(|e| match e {
        pem::Error::NoItemsFound => PkiError::invalid(origin, "no PEM private key found"),
        e => PkiError::invalid(origin, format!("garbled PEM: {e}")),
    })
}

/// The raw Ed25519 public key of a certificate.
pub(crate) fn ed25519_public_key(origin: &str, der: &[u8]) -> Result<[u8; 32], PkiError> {
    let (_, cert) = x509_parser::parse_x509_certificate(der)
        .map_err(|e| PkiError::invalid(origin, format!("not a valid X.509 certificate: {e}")))?;
    let spki = cert.public_key();
    if spki.algorithm.algorithm != OID_SIG_ED25519 {
        return Err(PkiError::invalid(
            origin,
            format!(
                "the certificate's key is not Ed25519 (OID 1.3.101.112) but {}",
                spki.algorithm.algorithm.to_id_string()
            ),
        ));
    }
    <[u8; 32]>::try_from(spki.subject_public_key.data.as_ref()).map_err(|_| {
        PkiError::invalid(origin, "the certificate's Ed25519 key is not 32 bytes long")
    })
}

/// Checks that `key` loads and belongs to the first certificate of `chain`.
fn check_key_matches(
    chain: &[CertificateDer<'static>],
    key: PrivateKeyDer<'static>,
    origins: &Origins,
) -> Result<(), PkiError> {
    let key = provider()
        .key_provider
        .load_private_key(key)
        .map_err(|e| PkiError::invalid(&origins.key, format!("not a usable private key: {e}")))?;
    match rustls::sign::CertifiedKey::new(chain.to_vec(), key).keys_match() {
        Ok(()) | Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => Ok(()),
        Err(rustls::Error::InconsistentKeys(_)) => Err(PkiError::invalid(
            &origins.key,
            format!(
                "the private key does not belong to the certificate in {}",
                origins.cert
            ),
        )),
        Err(e) => Err(PkiError::invalid(
            &origins.cert,
            format!("not a usable certificate: {e}"),
        )),
    }
}

/// Parses a certificate, for its validity period.
fn parse_x509<'a>(origin: &str, der: &'a [u8]) -> Result<X509Certificate<'a>, PkiError> {
    let (_, cert) = x509_parser::parse_x509_certificate(der)
        .map_err(|e| PkiError::invalid(origin, format!("not a valid X.509 certificate: {e}")))?;
    Ok(cert)
}

/// Seconds since the Unix epoch of a validity bound.
fn unix(t: &x509_parser::time::ASN1Time) -> u64 {
    u64::try_from(t.timestamp()).unwrap_or(0)
}

/// Checks that `chain` is signed by one of `cas` for client authentication,
/// at a time inside the validity of the leaf and of the first CA.
fn verify_chain(
    cas: &[CertificateDer<'static>],
    chain: &[CertificateDer<'static>],
    (leaf_x509, ca_x509): (&X509Certificate<'_>, &X509Certificate<'_>),
    origins: &Origins,
) -> Result<(), PkiError> {
    let (leaf, intermediates) = match chain.split_first() {
        Some(split) => split,
        None => return Err(PkiError::invalid(&origins.cert, "no PEM certificate found")),
    };
    let mut roots = RootCertStore::empty();
    for ca in cas {
        roots.add(ca.clone()).map_err(|e| {
            PkiError::invalid(&origins.ca, format!("not a usable CA certificate: {e}"))
        })?;
    }
    let (leaf_v, ca_v) = (leaf_x509.validity(), ca_x509.validity());
    let from = unix(&leaf_v.not_before).max(unix(&ca_v.not_before));
    let until = unix(&leaf_v.not_after).min(unix(&ca_v.not_after));
    if from > until {
        return Err(PkiError::invalid(
            &origins.cert,
            format!(
                "its validity period does not overlap that of the CA certificate in {}",
                origins.ca
            ),
        ));
    }
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
        .build()
        .map_err(PkiError::tls("client certificate verifier"))?;
    verifier
        .verify_client_cert(
            leaf,
            intermediates,
            UnixTime::since_unix_epoch(Duration::from_secs(from)),
        )
        .map_err(|e| {
            PkiError::invalid(
                &origins.cert,
                format!(
                    "not a client certificate issued by the CA certificate in {}: {e}",
                    origins.ca
                ),
            )
        })?;
    Ok(())
}
