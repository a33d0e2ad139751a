//! Whom the installer trusts with `https` registries: the system's root
//! certificates (`rustls-native-certs`: `SSL_CERT_FILE` or
//! `SSL_CERT_DIR` when set, else the distribution's bundle, on Debian
//! `/etc/ssl/certs/ca-certificates.crt`) and the CA certificates of
//! `--registry-ca` files, for registries with a private CA.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject as _;

/// The largest CA file read.
const MAX_CA_FILE_BYTES: u64 = 16 * 1024 * 1024;

/// A TLS client configuration for registries and what went into it.
pub struct RegistryTls {
    /// The configuration, for [`Client::tls`](crate::Client::tls).
    pub config: Arc<rustls::ClientConfig>,
    /// Root certificates taken from the system's store.
    pub system_roots: usize,
    /// Root certificates taken from the CA files.
    pub extra_roots: usize,
    /// Problems with the system's store that did not stop it (an
    /// unreadable file, a certificate rustls refuses), for the log.
    pub warnings: Vec<String>,
}

/// The TLS configuration trusting the system's roots (when `system`) and
/// every certificate in the PEM files `ca_files`. A CA file that cannot be
/// read or holds no certificate is an error; so is ending up with no root
/// at all.
pub fn registry_tls(system: bool, ca_files: &[&Path]) -> Result<RegistryTls, String> {
    let mut roots = rustls::RootCertStore::empty();
    let mut warnings = Vec::new();
    if system {
        let found = rustls_native_certs::load_native_certs();
        warnings.extend(found.errors.iter().map(|e| e.to_string()));
        let (_, refused) = roots.add_parsable_certificates(found.certs);
        if refused > 0 {
            warnings.push(format!(
                "{refused} of the system's root certificates are unusable"
            ));
        }
    }
    let system_roots = roots.len();
    for path in ca_files {
        let shown = path.display();
        let bytes = read_bounded(path).map_err(|e| format!("{shown}: {e}"))?;
        let mut found = 0;
        for cert in CertificateDer::pem_slice_iter(&bytes) {
            let cert = cert.map_err(|e| format!("{shown}: not PEM certificates: {e}"))?;
            roots
                .add(cert)
                .map_err(|e| format!("{shown}: certificate {}: {e}", found + 1))?;
            found += 1;
        }
        if found == 0 {
            return Err(format!("{shown}: holds no PEM certificate"));
        }
    }
    if roots.is_empty() {
        return Err(
            "no root certificates: the system has none and no CA file was given".to_string(),
        );
    }
    let extra_roots = roots.len() - system_roots;
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| format!("TLS configuration: {e}"))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(RegistryTls {
        config: Arc::new(config),
        system_roots,
        extra_roots,
        warnings,
    })
}

fn read_bounded(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read as _;
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(MAX_CA_FILE_BYTES + 1)
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_CA_FILE_BYTES {
        return Err(std::io::Error::other(format!(
            "larger than {MAX_CA_FILE_BYTES} bytes"
        )));
    }
    Ok(bytes)
}
