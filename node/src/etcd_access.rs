//! How an elected instance reaches etcd securely: TLS with etcd's CA and a
//! client certificate, and etcd's user/password authentication, read from
//! the `--etcd-*` flags ([`ClusterFlags`](crate::cluster::ClusterFlags)).
//!
//! Everything is read and checked before the first connection, so that a
//! missing or unreadable file, a file that is not PEM, a key that does not
//! belong to its certificate, or an endpoint of the wrong scheme fails the
//! start at once, naming the flag and the file (quoted to a bounded
//! prefix). The types carry the PEM bytes and the password to the etcd
//! port; their `Debug` shows neither the private key nor the password.

use std::fmt;
use std::path::Path;

use metropolis_core::quote::quoted;
use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;

/// TLS to etcd: the CA that signed etcd's server certificates and,
/// optionally, this client's certificate.
#[derive(Clone, PartialEq, Eq)]
pub struct EtcdTls {
    /// One or more CA certificates (PEM) trusted for etcd's server
    /// certificates; nothing else is trusted (no system roots).
    pub ca_pem: Vec<u8>,
    /// The client certificate presented to etcd (`--client-cert-auth`).
    pub client: Option<EtcdClientCert>,
}

impl fmt::Debug for EtcdTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdTls")
            .field("ca_pem_bytes", &self.ca_pem.len())
            .field("client", &self.client)
            .finish()
    }
}

/// A client certificate for etcd and its private key, both PEM.
#[derive(Clone, PartialEq, Eq)]
pub struct EtcdClientCert {
    /// The certificate, then any intermediates.
    pub cert_pem: Vec<u8>,
    /// Its private key (PKCS#8, PKCS#1 RSA or SEC1 EC).
    pub key_pem: Vec<u8>,
}

impl fmt::Debug for EtcdClientCert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdClientCert")
            .field("cert_pem_bytes", &self.cert_pem.len())
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

/// An etcd user and its password (etcd's authentication).
#[derive(Clone, PartialEq, Eq)]
pub struct EtcdUser {
    /// The user name.
    pub name: String,
    /// The password.
    pub password: String,
}

impl fmt::Debug for EtcdUser {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdUser")
            .field("name", &self.name)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// The value of `--etcd-user` (`USER[:PASSWORD]`) as given; its `Debug`
/// leaves out the password, so that printing the daemon's configuration
/// does not show it.
#[derive(Clone, PartialEq, Eq)]
pub struct EtcdUserArg(String);

impl EtcdUserArg {
    /// The value as given.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::str::FromStr for EtcdUserArg {
    type Err = std::convert::Infallible;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(EtcdUserArg(s.to_owned()))
    }
}

impl fmt::Debug for EtcdUserArg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.split_once(':') {
            Some((name, _)) => write!(f, "{:?}", format!("{name}:<redacted>")),
            None => write!(f, "{:?}", self.0),
        }
    }
}

/// What the `--etcd-*` flags say about reaching etcd.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EtcdAccess {
    /// TLS, when `--etcd-cacert` is given.
    pub tls: Option<EtcdTls>,
    /// The user, when `--etcd-user` is given.
    pub user: Option<EtcdUser>,
}

/// The files and values of the `--etcd-*` flags, as given.
#[derive(Clone, Copy, Debug, Default)]
pub struct EtcdAccessFlags<'a> {
    /// `--etcd`: the endpoints.
    pub endpoints: &'a [String],
    /// `--etcd-cacert`.
    pub cacert: Option<&'a Path>,
    /// `--etcd-cert`.
    pub cert: Option<&'a Path>,
    /// `--etcd-key`.
    pub key: Option<&'a Path>,
    /// `--etcd-user`.
    pub user: Option<&'a str>,
    /// `--etcd-password-file`.
    pub password_file: Option<&'a Path>,
}

impl EtcdAccessFlags<'_> {
    /// Reads and checks everything the flags name; the error names the
    /// flag, and the file or endpoint (quoted to a bounded prefix).
    pub fn load(&self) -> Result<EtcdAccess, String> {
        let tls_flag = self
            .cacert
            .map(|_| "--etcd-cacert")
            .or(self.cert.map(|_| "--etcd-cert"))
            .or(self.key.map(|_| "--etcd-key"));
        check_endpoints(self.endpoints, tls_flag)?;
        let tls = match self.cacert {
            None => {
                if let Some(flag) = tls_flag {
                    return Err(format!(
                        "{flag} needs --etcd-cacert FILE, the CA certificate that signed \
                         etcd's server certificates"
                    ));
                }
                None
            }
            Some(ca) => Some(EtcdTls {
                ca_pem: read_ca(ca)?,
                client: match (self.cert, self.key) {
                    (None, None) => None,
                    (Some(cert), Some(key)) => Some(read_client_cert(cert, key)?),
                    (Some(_), None) => return Err("--etcd-cert needs --etcd-key".into()),
                    (None, Some(_)) => return Err("--etcd-key needs --etcd-cert".into()),
                },
            }),
        };
        let user = match self.user {
            None if self.password_file.is_some() => {
                return Err("--etcd-password-file needs --etcd-user USER".into());
            }
            None => None,
            Some(user) => Some(parse_user(user, self.password_file)?),
        };
        if user.is_some() && tls.is_none() {
            tracing::warn!(
                "--etcd-user without TLS: the password and etcd's token cross the network \
                 in the clear (use https:// endpoints and --etcd-cacert)"
            );
        }
        Ok(EtcdAccess { tls, user })
    }
}

/// A path as a bounded quote.
fn q(path: &Path) -> String {
    quoted(&path.display().to_string()).to_string()
}

/// With TLS (`tls_flag` names the flag that asks for it) every endpoint
/// must be `https://`; without, none may be.
fn check_endpoints(endpoints: &[String], tls_flag: Option<&str>) -> Result<(), String> {
    for endpoint in endpoints {
        let https = endpoint.starts_with("https://");
        match tls_flag {
            Some(_) if https => {}
            Some(flag) if endpoint.starts_with("http://") => {
                return Err(format!(
                    "--etcd {}: plain http:// with {flag}: with TLS every endpoint must be \
                     https://",
                    quoted(endpoint)
                ));
            }
            Some(flag) => {
                return Err(format!(
                    "--etcd {}: with {flag} every endpoint must be https://HOST:PORT",
                    quoted(endpoint)
                ));
            }
            None if https => {
                return Err(format!(
                    "--etcd {}: https:// needs --etcd-cacert FILE, the CA certificate that \
                     signed etcd's server certificates (the system's roots are not used)",
                    quoted(endpoint)
                ));
            }
            None => {}
        }
    }
    Ok(())
}

/// Reads `path` for `flag`.
fn read(flag: &str, path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("{flag} {}: cannot read it: {e}", q(path)))
}

/// The certificates of a PEM file, at least one.
fn certificates(
    flag: &str,
    path: &Path,
    pem: &[u8],
) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{flag} {}: not valid PEM: {e}", q(path)))?;
    if certs.is_empty() {
        return Err(format!(
            "{flag} {}: no PEM certificate in it (expected -----BEGIN CERTIFICATE-----)",
            q(path)
        ));
    }
    Ok(certs)
}

/// `--etcd-cacert`: PEM certificates that parse as trust anchors.
fn read_ca(path: &Path) -> Result<Vec<u8>, String> {
    let flag = "--etcd-cacert";
    let pem = read(flag, path)?;
    let mut roots = RootCertStore::empty();
    for (i, cert) in certificates(flag, path, &pem)?.into_iter().enumerate() {
        roots.add(cert).map_err(|e| {
            format!(
                "{flag} {}: certificate {} is not a usable CA certificate: {e}",
                q(path),
                i + 1
            )
        })?;
    }
    Ok(pem)
}

/// `--etcd-cert` and `--etcd-key`: a certificate chain and the private key
/// of its first certificate.
fn read_client_cert(cert: &Path, key: &Path) -> Result<EtcdClientCert, String> {
    let cert_pem = read("--etcd-cert", cert)?;
    let chain = certificates("--etcd-cert", cert, &cert_pem)?;
    let key_pem = read("--etcd-key", key)?;
    let key_der = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| {
        format!(
            "{} {}: no PEM private key in it (PKCS#8, PKCS#1 RSA or SEC1 EC): {e}",
            "--etcd-key",
            q(key)
        )
    })?;
    let provider = rustls::crypto::ring::default_provider();
    CertifiedKey::from_der(chain, key_der, &provider).map_err(|e| match e {
        rustls::Error::InconsistentKeys(_) => format!(
            "--etcd-key {} is not the key of the certificate in --etcd-cert {}",
            q(key),
            q(cert)
        ),
        other => format!("--etcd-key {}: {other}", q(key)),
    })?;
    Ok(EtcdClientCert { cert_pem, key_pem })
}

/// `--etcd-user USER[:PASSWORD]`, the password from `password_file` if
/// given.
fn parse_user(user: &str, password_file: Option<&Path>) -> Result<EtcdUser, String> {
    let (name, password) = match (user.split_once(':'), password_file) {
        (Some(_), Some(_)) => {
            return Err(
                "--etcd-user USER:PASSWORD and --etcd-password-file: give the password \
                        once (the file keeps it off the command line)"
                    .into(),
            );
        }
        (Some((name, password)), None) => {
            tracing::warn!(
                "the etcd password is on the command line (--etcd-user USER:PASSWORD), where \
                 every local user can read it; --etcd-password-file keeps it off"
            );
            (name.to_owned(), password.to_owned())
        }
        (None, Some(file)) => (user.to_owned(), read_password(file)?),
        (None, None) => {
            return Err(format!(
                "--etcd-user {}: no password: give USER:PASSWORD or --etcd-password-file FILE",
                quoted(user)
            ));
        }
    };
    if name.is_empty() {
        return Err("--etcd-user: the user name is empty".into());
    }
    if password.is_empty() {
        return Err(format!(
            "--etcd-user {}: the password is empty",
            quoted(&name)
        ));
    }
    Ok(EtcdUser { name, password })
}

/// The password in `path`: the file's text less one line ending.
fn read_password(path: &Path) -> Result<String, String> {
    let flag = "--etcd-password-file";
    let bytes = read(flag, path)?;
    let text =
        String::from_utf8(bytes).map_err(|_| format!("{flag} {}: not UTF-8 text", q(path)))?;
    let password = text
        .strip_suffix('\n')
        .map(|t| t.strip_suffix('\r').unwrap_or(t))
        .unwrap_or(&text);
    if password.is_empty() {
        return Err(format!("{flag} {}: the file is empty", q(path)));
    }
    if let Ok(meta) = std::fs::metadata(path) {
        use std::os::unix::fs::PermissionsExt;
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            tracing::warn!(
                "{flag} {}: readable by others than its owner (mode {mode:o}); chmod 600 it",
                q(path)
            );
        }
    }
    Ok(password.to_owned())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn endpoints(urls: &[&str]) -> Vec<String> {
        urls.iter().map(|s| s.to_string()).collect()
    }

    /// A CA and a leaf it signed, as PEM files in `dir`.
    struct Files {
        dir: tempfile::TempDir,
    }

    impl Files {
        fn new() -> Files {
            let dir = tempfile::tempdir().unwrap();
            let ca_key = rcgen::KeyPair::generate().unwrap();
            let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
            ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
            let ca_cert = ca.self_signed(&ca_key).unwrap();
            let issuer = rcgen::Issuer::new(ca, ca_key);
            let leaf_key = rcgen::KeyPair::generate().unwrap();
            let leaf = rcgen::CertificateParams::new(vec!["client".to_string()])
                .unwrap()
                .signed_by(&leaf_key, &issuer)
                .unwrap();
            let other_key = rcgen::KeyPair::generate().unwrap();
            let write =
                |name: &str, text: &str| std::fs::write(dir.path().join(name), text).unwrap();
            write("ca.pem", &ca_cert.pem());
            write("cert.pem", &leaf.pem());
            write("key.pem", &leaf_key.serialize_pem());
            write("other-key.pem", &other_key.serialize_pem());
            write("garbage.pem", "not a certificate\n");
            Files { dir }
        }

        fn path(&self, name: &str) -> PathBuf {
            self.dir.path().join(name)
        }
    }

    #[test]
    fn tls_files_are_read_and_checked_naming_the_flag_and_file() {
        let f = Files::new();
        let urls = endpoints(&["https://127.0.0.1:2379"]);
        let (ca, cert, key) = (f.path("ca.pem"), f.path("cert.pem"), f.path("key.pem"));
        let flags = EtcdAccessFlags {
            endpoints: &urls,
            cacert: Some(&ca),
            cert: Some(&cert),
            key: Some(&key),
            ..Default::default()
        };
        let access = flags.load().unwrap();
        let tls = access.tls.unwrap();
        assert!(tls.client.is_some());
        assert!(!format!("{tls:?}").contains("PRIVATE KEY"), "{tls:?}");

        let missing = f.path("missing.pem");
        let e = EtcdAccessFlags {
            cacert: Some(&missing),
            ..flags
        }
        .load()
        .unwrap_err();
        assert!(
            e.starts_with("--etcd-cacert \"")
                && e.contains("missing.pem")
                && e.contains("cannot read"),
            "{e}"
        );
        let garbage = f.path("garbage.pem");
        let e = EtcdAccessFlags {
            cacert: Some(&garbage),
            ..flags
        }
        .load()
        .unwrap_err();
        assert!(
            e.starts_with("--etcd-cacert") && e.contains("no PEM certificate"),
            "{e}"
        );
        let e = EtcdAccessFlags {
            cert: Some(&garbage),
            ..flags
        }
        .load()
        .unwrap_err();
        assert!(
            e.starts_with("--etcd-cert") && e.contains("no PEM certificate"),
            "{e}"
        );
        let e = EtcdAccessFlags {
            key: Some(&garbage),
            ..flags
        }
        .load()
        .unwrap_err();
        assert!(
            e.starts_with("--etcd-key") && e.contains("no PEM private key"),
            "{e}"
        );
        let other = f.path("other-key.pem");
        let e = EtcdAccessFlags {
            key: Some(&other),
            ..flags
        }
        .load()
        .unwrap_err();
        assert!(e.contains("is not the key of the certificate"), "{e}");
        let e = EtcdAccessFlags {
            cacert: None,
            ..flags
        }
        .load()
        .unwrap_err();
        assert!(e.contains("needs --etcd-cacert"), "{e}");
        // A long path is quoted to a bounded prefix.
        let long = f.path(&"x".repeat(300));
        let e = EtcdAccessFlags {
            cacert: Some(&long),
            ..flags
        }
        .load()
        .unwrap_err();
        assert!(e.len() < 300 && e.contains("bytes)"), "{e}");
    }

    #[test]
    fn tls_needs_https_everywhere_and_https_needs_a_ca() {
        let f = Files::new();
        let ca = f.path("ca.pem");
        let mixed = endpoints(&["https://10.0.0.1:2379", "http://10.0.0.2:2379"]);
        let e = EtcdAccessFlags {
            endpoints: &mixed,
            cacert: Some(&ca),
            ..Default::default()
        }
        .load()
        .unwrap_err();
        assert!(
            e.contains("\"http://10.0.0.2:2379\"") && e.contains("https://"),
            "{e}"
        );
        let bare = endpoints(&["10.0.0.1:2379"]);
        let e = EtcdAccessFlags {
            endpoints: &bare,
            cacert: Some(&ca),
            ..Default::default()
        }
        .load()
        .unwrap_err();
        assert!(e.contains("https://HOST:PORT"), "{e}");
        let https = endpoints(&["https://10.0.0.1:2379"]);
        let e = EtcdAccessFlags {
            endpoints: &https,
            ..Default::default()
        }
        .load()
        .unwrap_err();
        assert!(e.contains("needs --etcd-cacert"), "{e}");
        let plain = endpoints(&["http://10.0.0.1:2379", "10.0.0.2:2379"]);
        assert_eq!(
            EtcdAccessFlags {
                endpoints: &plain,
                ..Default::default()
            }
            .load()
            .unwrap(),
            EtcdAccess::default()
        );
    }

    #[test]
    fn users_and_passwords() {
        let f = Files::new();
        let urls = endpoints(&["http://127.0.0.1:2379"]);
        let flags = EtcdAccessFlags {
            endpoints: &urls,
            ..Default::default()
        };
        let user = |u: &'static str, file: Option<&Path>| {
            EtcdAccessFlags {
                user: Some(u),
                password_file: file,
                ..flags
            }
            .load()
        };
        let u = user("metropolis:s3:cret", None).unwrap().user.unwrap();
        assert_eq!(
            (u.name.as_str(), u.password.as_str()),
            ("metropolis", "s3:cret")
        );
        assert!(!format!("{u:?}").contains("s3:cret"));
        let arg: EtcdUserArg = "metropolis:s3:cret".parse().unwrap();
        assert_eq!(format!("{arg:?}"), "\"metropolis:<redacted>\"");
        let e = user("metropolis", None).unwrap_err();
        assert!(
            e.contains("no password") && e.contains("--etcd-password-file"),
            "{e}"
        );
        assert!(
            user(":pw", None)
                .unwrap_err()
                .contains("user name is empty")
        );
        assert!(
            user("metropolis:", None)
                .unwrap_err()
                .contains("password is empty")
        );

        let file = f.path("password");
        std::fs::write(&file, "from file\r\n").unwrap();
        let u = user("metropolis", Some(&file)).unwrap().user.unwrap();
        assert_eq!(u.password, "from file");
        let e = user("metropolis:pw", Some(&file)).unwrap_err();
        assert!(e.contains("give the password once"), "{e}");
        std::fs::write(&file, "\n").unwrap();
        let e = user("metropolis", Some(&file)).unwrap_err();
        assert!(
            e.starts_with("--etcd-password-file") && e.contains("empty"),
            "{e}"
        );
        let missing = f.path("nothing");
        let e = user("metropolis", Some(&missing)).unwrap_err();
        assert!(
            e.starts_with("--etcd-password-file") && e.contains("cannot read"),
            "{e}"
        );
        let e = EtcdAccessFlags {
            password_file: Some(&file),
            ..flags
        }
        .load()
        .unwrap_err();
        assert!(e.contains("needs --etcd-user"), "{e}");
    }
}
