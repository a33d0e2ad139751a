//! The cluster CA: generation, persistence, and issuance of node and owner
//! certificates.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use metropolis_core::identity::{NodeId, OWNER_COMMON_NAME, OWNER_ORGANIZATION};
use rcgen::string::{Ia5String, PrintableString};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, DnValue,
    ExtendedKeyUsagePurpose, IsCa, Issuer, KeyIdMethod, KeyPair, KeyUsagePurpose, PKCS_ED25519,
    PublicKeyData, SanType, SignatureAlgorithm,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use x509_parser::asn1_rs::Tag;
use x509_parser::extensions::ParsedExtension;

use super::credentials::{first_cert, key_from_pem};
use super::{CA_CERT_FILE, Credentials, PkiError, files, keys};

/// The subject common name of the cluster CA certificates this module
/// generates.
pub const CA_COMMON_NAME: &str = "Metropolis Cluster CA";

/// The file holding the cluster CA's private key, next to
/// [`CA_CERT_FILE`].
pub const CA_KEY_FILE: &str = "ca-key.pem";

/// How long a generated CA certificate is valid: 100 years. Nothing in the
/// cluster rotates the CA, so it must outlive the cluster.
pub const CA_VALIDITY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// How long an issued certificate is valid: 30 years, and never past the
/// CA's own expiry. Node and owner certificates are not rotated either.
pub const LEAF_VALIDITY: Duration = Duration::from_secs(30 * 365 * 24 * 3600);

/// Certificates are valid from this long before their issuance, so that a
/// peer whose clock is slightly behind accepts them.
pub const CLOCK_SKEW: Duration = Duration::from_secs(3600);

/// The cluster certificate authority: its Ed25519 key and self-signed
/// certificate. Cloning is cheap and shares the key.
#[derive(Clone)]
pub struct ClusterCa(Arc<Inner>);

struct Inner {
    issuer: Issuer<'static, KeyPair>,
    cert_der: CertificateDer<'static>,
    cert_pem: String,
    key_pem: String,
    /// The DER of the certificate's subject, which every issued
    /// certificate's issuer must equal byte for byte.
    subject_der: Vec<u8>,
    /// The certificate's expiry, seconds since the Unix epoch.
    not_after: u64,
}

/// A raw Ed25519 public key held elsewhere, to issue a certificate for.
struct Ed25519PublicKey([u8; 32]);

impl PublicKeyData for Ed25519PublicKey {
    fn der_bytes(&self) -> &[u8] {
        &self.0
    }

    fn algorithm(&self) -> &'static SignatureAlgorithm {
        &PKCS_ED25519
    }
}

impl ClusterCa {
    /// Generates a new cluster CA: a fresh Ed25519 key (PKCS#8 v1) and a
    /// self-signed CA
    /// certificate with common name [`CA_COMMON_NAME`], valid for
    /// [`CA_VALIDITY`], that may sign end-entity certificates only (path
    /// length 0).
    pub fn generate() -> Result<ClusterCa, PkiError> {
        ClusterCa::generate_with(CA_COMMON_NAME, &PKCS_ED25519)
    }

    /// Generates a CA like [`ClusterCa::generate`], with another common
    /// name and key algorithm (e.g. ECDSA P-256 for a CA that software
    /// without Ed25519 support must accept). Ed25519 keys are PKCS#8 v1,
    /// ECDSA keys *ring*'s PKCS#8 (also version 0).
    pub fn generate_with(
        common_name: &str,
        algorithm: &'static SignatureAlgorithm,
    ) -> Result<ClusterCa, PkiError> {
        let key = if algorithm == &PKCS_ED25519 {
            keys::generate_ed25519("generate the CA key")?
        } else {
            KeyPair::generate_for(algorithm).map_err(PkiError::crypto("generate the CA key"))?
        };
        let now = unix_now();
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        set_validity(
            &mut params,
            now.saturating_sub(CLOCK_SKEW.as_secs()),
            now.saturating_add(CA_VALIDITY.as_secs()),
        );
        let cert = params
            .self_signed(&key)
            .map_err(PkiError::crypto("sign the cluster CA certificate"))?;
        let origin = "generated CA certificate";
        ClusterCa::assemble(cert.der().clone(), cert.pem(), key, origin, origin)
    }

    /// A cluster CA from its certificate and private key (PKCS#8), PEM.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<ClusterCa, PkiError> {
        ClusterCa::load(
            cert_pem,
            key_pem,
            "CA certificate PEM",
            "CA private key PEM",
        )
    }

    fn load(
        cert_pem: &str,
        key_pem: &str,
        cert_origin: &str,
        key_origin: &str,
    ) -> Result<ClusterCa, PkiError> {
        let cert_der = first_cert(cert_origin, cert_pem)?;
        let key = match key_from_pem(key_origin, key_pem)? {
            PrivateKeyDer::Pkcs8(pkcs8) => KeyPair::try_from(&pkcs8).map_err(|e| {
                PkiError::invalid(key_origin, format!("not a usable private key: {e}"))
            })?,
            _ => {
                return Err(PkiError::invalid(
                    key_origin,
                    "the CA key must be PKCS#8 (\"-----BEGIN PRIVATE KEY-----\")",
                ));
            }
        };
        ClusterCa::assemble(cert_der, cert_pem.to_owned(), key, cert_origin, key_origin)
    }

    /// Checks that `cert_der` is a CA certificate for `key`, and prepares
    /// to issue certificates under its subject.
    fn assemble(
        cert_der: CertificateDer<'static>,
        cert_pem: String,
        key: KeyPair,
        cert_origin: &str,
        key_origin: &str,
    ) -> Result<ClusterCa, PkiError> {
        let (_, cert) = x509_parser::parse_x509_certificate(&cert_der).map_err(|e| {
            PkiError::invalid(cert_origin, format!("not a valid X.509 certificate: {e}"))
        })?;
        if !cert.is_ca() {
            return Err(PkiError::invalid(
                cert_origin,
                "not a CA certificate (its basic constraints do not say CA:TRUE)",
            ));
        }
        if key.subject_public_key_info() != cert.public_key().raw {
            return Err(PkiError::invalid(
                key_origin,
                format!("the private key does not belong to the CA certificate in {cert_origin}"),
            ));
        }
        let distinguished_name = distinguished_name(cert.subject(), cert_origin)?;
        let key_identifier_method = cert
            .iter_extensions()
            .find_map(|ext| match ext.parsed_extension() {
                ParsedExtension::SubjectKeyIdentifier(id) => {
                    Some(KeyIdMethod::PreSpecified(id.0.to_vec()))
                }
                _ => None,
            })
            .unwrap_or(KeyIdMethod::Sha256);
        let mut params = CertificateParams::default();
        params.distinguished_name = distinguished_name;
        params.key_identifier_method = key_identifier_method;
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let subject_der = cert.subject().as_raw().to_vec();
        let not_after = u64::try_from(cert.validity().not_after.timestamp()).unwrap_or(0);
        let key_pem = key.serialize_pem();
        Ok(ClusterCa(Arc::new(Inner {
            issuer: Issuer::new(params, key),
            cert_der,
            cert_pem,
            key_pem,
            subject_der,
            not_after,
        })))
    }

    /// Reads `<dir>/ca.pem` and `<dir>/ca-key.pem`.
    pub fn read_from_dir(dir: &Path) -> Result<ClusterCa, PkiError> {
        let cert_path = dir.join(CA_CERT_FILE);
        let key_path = dir.join(CA_KEY_FILE);
        let cert_pem = files::read_text(&cert_path)?;
        let key_pem = files::read_private(&key_path)?;
        ClusterCa::load(
            &cert_pem,
            &key_pem,
            &cert_path.display().to_string(),
            &key_path.display().to_string(),
        )
    }

    /// Writes `<dir>/ca.pem` (mode 0644) and `<dir>/ca-key.pem` (mode 0600),
    /// each atomically and durably. The directory must exist.
    pub fn write_to_dir(&self, dir: &Path) -> Result<(), PkiError> {
        files::write_atomic(
            &dir.join(CA_KEY_FILE),
            self.0.key_pem.as_bytes(),
            files::PRIVATE_MODE,
        )?;
        files::write_atomic(
            &dir.join(CA_CERT_FILE),
            self.0.cert_pem.as_bytes(),
            files::PUBLIC_MODE,
        )
    }

    /// The CA certificate, PEM.
    pub fn cert_pem(&self) -> String {
        self.0.cert_pem.clone()
    }

    /// The CA private key, PEM (PKCS#8). Secret.
    pub fn key_pem(&self) -> String {
        self.0.key_pem.clone()
    }

    /// The CA certificate, DER.
    pub fn cert_der(&self) -> CertificateDer<'static> {
        self.0.cert_der.clone()
    }

    /// Issues credentials for a new node: a fresh Ed25519 key (PKCS#8 v1),
    /// and a certificate whose common name is the node ID derived from it. The
    /// certificate serves both as TLS server and client certificate; its
    /// subject alternative names are the node ID (DNS), `localhost`,
    /// 127.0.0.1, ::1, and each of `extra_sans`, an IP address or a DNS
    /// name.
    pub fn issue_node(&self, extra_sans: &[String]) -> Result<(Credentials, NodeId), PkiError> {
        self.issue_node_as(extra_sans, false)
    }

    /// Issues credentials like [`ClusterCa::issue_node`] for a node that
    /// runs a curator instance: its certificate also carries the URI
    /// [`CURATOR_URI`](metropolis_core::identity::CURATOR_URI), which lets
    /// it forward calls to the leader on its callers' behalf.
    pub fn issue_curator_node(
        &self,
        extra_sans: &[String],
    ) -> Result<(Credentials, NodeId), PkiError> {
        self.issue_node_as(extra_sans, true)
    }

    fn issue_node_as(
        &self,
        extra_sans: &[String],
        curator: bool,
    ) -> Result<(Credentials, NodeId), PkiError> {
        let key = keys::generate_ed25519("generate a node key")?;
        let raw = <[u8; 32]>::try_from(key.public_key_raw()).map_err(|_| {
            PkiError::invalid(
                "generated node key",
                "the Ed25519 public key is not 32 bytes long",
            )
        })?;
        let cert_pem = self.issue_node_cert(&raw, extra_sans, curator)?;
        let id = NodeId::from_public_key(&raw);
        Ok((
            Credentials::from_parts(cert_pem, key.serialize_pem(), self.cert_pem()),
            id,
        ))
    }

    /// Issues a node certificate (PEM) for the node whose Ed25519 public key
    /// is `public_key`, the private key staying with the node. The
    /// certificate is as in [`ClusterCa::issue_node`].
    pub fn issue_node_for_key(
        &self,
        public_key: &[u8; 32],
        extra_sans: &[String],
    ) -> Result<String, PkiError> {
        self.issue_node_cert(public_key, extra_sans, false)
    }

    /// A node certificate for `public_key`, marked as a curator instance's
    /// when `curator`.
    pub fn issue_node_cert(
        &self,
        public_key: &[u8; 32],
        extra_sans: &[String],
        curator: bool,
    ) -> Result<String, PkiError> {
        let id = NodeId::from_public_key(public_key);
        let mut sans = vec![
            SanType::DnsName(ia5(id.as_str())?),
            SanType::DnsName(ia5("localhost")?),
            SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)),
            SanType::IpAddress(IpAddr::V6(Ipv6Addr::LOCALHOST)),
        ];
        for san in extra_sans {
            let san = parse_san(san)?;
            if !sans.contains(&san) {
                sans.push(san);
            }
        }
        if curator {
            sans.push(SanType::URI(ia5(metropolis_core::identity::CURATOR_URI)?));
        }
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, id.as_str());
        let params = self.leaf_params(
            dn,
            sans,
            vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
        )?;
        self.sign(&params, &Ed25519PublicKey(*public_key))
    }

    /// Issues credentials for the cluster owner: a fresh Ed25519 key
    /// (PKCS#8 v1) and a
    /// client certificate with common name [`OWNER_COMMON_NAME`] and
    /// organization [`OWNER_ORGANIZATION`].
    pub fn issue_owner(&self) -> Result<Credentials, PkiError> {
        let key = keys::generate_ed25519("generate the owner key")?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::OrganizationName, OWNER_ORGANIZATION);
        dn.push(DnType::CommonName, OWNER_COMMON_NAME);
        let params = self.leaf_params(dn, Vec::new(), vec![ExtendedKeyUsagePurpose::ClientAuth])?;
        let cert_pem = self.sign(&params, &key)?;
        Ok(Credentials::from_parts(
            cert_pem,
            key.serialize_pem(),
            self.cert_pem(),
        ))
    }

    pub(crate) fn leaf_params(
        &self,
        dn: DistinguishedName,
        sans: Vec<SanType>,
        usages: Vec<ExtendedKeyUsagePurpose>,
    ) -> Result<CertificateParams, PkiError> {
        self.leaf_params_valid_for(dn, sans, usages, LEAF_VALIDITY, CLOCK_SKEW)
    }

    /// Parameters of an end-entity certificate valid from `backdate` ago
    /// for `validity` from now (never past the CA's expiry).
    pub(crate) fn leaf_params_valid_for(
        &self,
        dn: DistinguishedName,
        sans: Vec<SanType>,
        usages: Vec<ExtendedKeyUsagePurpose>,
        validity: Duration,
        backdate: Duration,
    ) -> Result<CertificateParams, PkiError> {
        let now = unix_now();
        if self.0.not_after <= now {
            return Err(PkiError::invalid(
                "cluster CA",
                format!(
                    "its certificate expired at {} and cannot issue certificates",
                    format_unix(self.0.not_after)
                ),
            ));
        }
        let mut params = CertificateParams::default();
        params.distinguished_name = dn;
        params.subject_alt_names = sans;
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = usages;
        params.use_authority_key_identifier_extension = true;
        set_validity(
            &mut params,
            now.saturating_sub(backdate.as_secs()),
            now.saturating_add(validity.as_secs()).min(self.0.not_after),
        );
        Ok(params)
    }

    /// The CA's signing key and issuer parameters.
    pub(crate) fn issuer(&self) -> &Issuer<'static, KeyPair> {
        &self.0.issuer
    }

    /// The CA certificate's expiry, seconds since the Unix epoch.
    pub(crate) fn not_after(&self) -> u64 {
        self.0.not_after
    }

    /// Signs `params` for `key` and checks that the issuer name comes out
    /// as the CA's subject; the certificate, PEM.
    pub(crate) fn sign(
        &self,
        params: &CertificateParams,
        key: &impl PublicKeyData,
    ) -> Result<String, PkiError> {
        let cert = params
            .signed_by(key, &self.0.issuer)
            .map_err(PkiError::crypto("sign a certificate"))?;
        let (_, parsed) = x509_parser::parse_x509_certificate(cert.der()).map_err(|e| {
            PkiError::invalid("issued certificate", format!("cannot be parsed back: {e}"))
        })?;
        if parsed.issuer().as_raw() != self.0.subject_der.as_slice() {
            return Err(PkiError::invalid(
                "cluster CA",
                "its subject name cannot be reproduced exactly in issued certificates",
            ));
        }
        Ok(cert.pem())
    }
}

impl fmt::Debug for ClusterCa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClusterCa")
            .field("cert_pem", &self.0.cert_pem)
            .field("key", &"<redacted>")
            .finish()
    }
}

/// The subject of a parsed certificate, for issuing under it (a CA's) or
/// with it (a certificate reissued for another key).
pub(crate) fn distinguished_name(
    name: &x509_parser::x509::X509Name<'_>,
    origin: &str,
) -> Result<DistinguishedName, PkiError> {
    let unsupported =
        |why: &str| PkiError::invalid(origin, format!("unsupported CA subject: {why}"));
    let mut dn = DistinguishedName::new();
    let mut count = 0;
    for rdn in name.iter() {
        let mut attrs = rdn.iter();
        let (Some(attr), None) = (attrs.next(), attrs.next()) else {
            return Err(unsupported(
                "a relative distinguished name has several or no attributes",
            ));
        };
        let arcs: Vec<u64> = attr
            .attr_type()
            .iter()
            .ok_or_else(|| unsupported("an attribute type OID is too long"))?
            .collect();
        let value = attr.attr_value();
        let text = || {
            std::str::from_utf8(value.data)
                .map_err(|_| unsupported("an attribute is not valid text"))
        };
        let value = match value.tag() {
            Tag::Utf8String => DnValue::Utf8String(text()?.to_owned()),
            Tag::PrintableString => DnValue::PrintableString(
                PrintableString::try_from(text()?)
                    .map_err(|_| unsupported("a PrintableString is invalid"))?,
            ),
            Tag::Ia5String => DnValue::Ia5String(
                Ia5String::try_from(text()?).map_err(|_| unsupported("an IA5String is invalid"))?,
            ),
            tag => return Err(unsupported(&format!("attribute string type {tag}"))),
        };
        dn.push(DnType::from_oid(&arcs), value);
        count += 1;
    }
    if dn.iter().count() != count {
        return Err(unsupported("an attribute type appears twice"));
    }
    Ok(dn)
}

fn ia5(s: &str) -> Result<Ia5String, PkiError> {
    Ia5String::try_from(s).map_err(|_| PkiError::InvalidSan {
        san: s.to_owned(),
        problem: "not ASCII".to_owned(),
    })
}

/// An extra subject alternative name: an IP address, or a DNS name (letters,
/// digits and '-', in dot-separated labels of 1 to 63 characters that do not
/// start or end with '-', at most 253 characters in all).
fn parse_san(s: &str) -> Result<SanType, PkiError> {
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Ok(SanType::IpAddress(ip));
    }
    let bad = |problem: String| PkiError::InvalidSan {
        san: s.to_owned(),
        problem,
    };
    if s.is_empty() {
        return Err(bad("it is empty".to_owned()));
    }
    if s.len() > 253 {
        return Err(bad(format!(
            "it is {} characters long, more than 253",
            s.len()
        )));
    }
    for label in s.split('.') {
        if label.is_empty() {
            return Err(bad(
                "it has an empty label (a leading, trailing or double '.')".to_owned(),
            ));
        }
        if label.len() > 63 {
            return Err(bad(format!("label {label:?} is longer than 63 characters")));
        }
        if let Some(c) = label
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || *c == '-'))
        {
            return Err(bad(format!("{c:?} is not a letter, digit or '-'")));
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(bad(format!("label {label:?} starts or ends with '-'")));
        }
    }
    Ok(SanType::DnsName(ia5(s)?))
}

pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn set_validity(params: &mut CertificateParams, not_before: u64, not_after: u64) {
    let epoch = rcgen::date_time_ymd(1970, 1, 1);
    params.not_before = epoch + Duration::from_secs(not_before);
    params.not_after = epoch + Duration::from_secs(not_after);
}

pub(crate) fn format_unix(secs: u64) -> String {
    let t = rcgen::date_time_ymd(1970, 1, 1) + Duration::from_secs(secs);
    t.to_string()
}
