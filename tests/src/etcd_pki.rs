//! Certificates for an etcd serving TLS in tests: a CA (ECDSA P-256, as
//! etcd's own tooling would make), a server certificate for 127.0.0.1 and
//! client certificates, written as PEM files under a directory. rcgen
//! makes them; nothing here is Metropolis' own PKI.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};

use crate::etcd::ServerTls;

/// A test CA and the directory its files go to.
pub struct EtcdPki {
    dir: PathBuf,
    ca: PathBuf,
    issuer: Issuer<'static, KeyPair>,
}

impl EtcdPki {
    /// A new CA named `name`, written to `<dir>/<name>.pem`.
    pub fn new(dir: &Path, name: &str) -> EtcdPki {
        std::fs::create_dir_all(dir).unwrap();
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let cert = params.self_signed(&key).unwrap();
        let ca = dir.join(format!("{name}.pem"));
        std::fs::write(&ca, cert.pem()).unwrap();
        EtcdPki {
            dir: dir.to_path_buf(),
            ca,
            issuer: Issuer::new(params, key),
        }
    }

    /// The CA certificate file.
    pub fn ca(&self) -> PathBuf {
        self.ca.clone()
    }

    /// Issues a certificate with common name `cn`, `sans` and `usage`;
    /// returns its certificate and key files, `<dir>/<file>.pem` and
    /// `<dir>/<file>-key.pem`.
    fn issue(
        &self,
        file: &str,
        cn: &str,
        sans: &[&str],
        usage: ExtendedKeyUsagePurpose,
    ) -> (PathBuf, PathBuf) {
        let key = KeyPair::generate().unwrap();
        let mut params =
            CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, cn);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![usage];
        params.use_authority_key_identifier_extension = true;
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let cert_file = self.dir.join(format!("{file}.pem"));
        let key_file = self.dir.join(format!("{file}-key.pem"));
        std::fs::write(&cert_file, cert.pem()).unwrap();
        std::fs::write(&key_file, key.serialize_pem()).unwrap();
        (cert_file, key_file)
    }

    /// A server certificate for 127.0.0.1 and localhost.
    pub fn server(&self, file: &str) -> (PathBuf, PathBuf) {
        self.issue(
            file,
            "etcd",
            &["127.0.0.1", "localhost"],
            ExtendedKeyUsagePurpose::ServerAuth,
        )
    }

    /// A client certificate with common name `cn` (with etcd's
    /// authentication on and no user given, etcd takes it as the user).
    pub fn client(&self, file: &str, cn: &str) -> (PathBuf, PathBuf) {
        self.issue(file, cn, &[], ExtendedKeyUsagePurpose::ClientAuth)
    }

    /// TLS for an etcd with a server certificate of this CA, requiring
    /// client certificates of it when `client_cert_auth`, and `etcdctl`
    /// presenting one with common name `root`.
    pub fn server_tls(&self, client_cert_auth: bool) -> ServerTls {
        let (cert, key) = self.server("etcd-server");
        ServerTls {
            ca: self.ca(),
            cert,
            key,
            client_cert_auth,
            etcdctl_cert: Some(self.client("etcdctl", "root")),
        }
    }
}
