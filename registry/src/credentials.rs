//! [`RegistryCredentials`]: the logins the installer may give registries,
//! read from a file in the format of Docker's `config.json`.

use std::fmt;
use std::path::Path;

use base64::Engine as _;
use metropolis_core::quote::quoted;
use serde::Deserialize;

/// The largest credentials file read.
const MAX_FILE_BYTES: u64 = 1024 * 1024;

/// A user name and password for one registry.
#[derive(Clone)]
pub struct Login {
    pub(crate) username: String,
    pub(crate) password: String,
}

impl fmt::Debug for Login {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Login")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// Logins for registries, by registry (`host[:port]`, as in an image
/// reference's host).
///
/// The installer answers a registry's `401` challenge with the login for
/// its host: Basic authentication directly, or the Docker token flow
/// (the registry's `Bearer` challenge names a token server, which is
/// asked for a pull token with the login; without one, anonymously). A
/// login is only ever sent over `https`. `Debug` never shows passwords.
#[derive(Clone, Debug, Default)]
pub struct RegistryCredentials {
    logins: Vec<(String, Login)>,
}

#[derive(Deserialize)]
struct ConfigFile {
    #[serde(default)]
    auths: std::collections::BTreeMap<String, AuthEntry>,
}

#[derive(Deserialize)]
struct AuthEntry {
    auth: Option<String>,
    username: Option<String>,
    password: Option<String>,
    identitytoken: Option<String>,
}

/// The registry a Docker config key names: `host[:port]`, lowercase,
/// without a scheme or path (`https://index.docker.io/v1/` is
/// `index.docker.io`).
fn registry_key(key: &str) -> String {
    let key = key.split_once("://").map_or(key, |(_, rest)| rest);
    key.split('/').next().unwrap_or("").to_ascii_lowercase()
}

impl RegistryCredentials {
    /// No logins: every registry is accessed anonymously.
    pub fn new() -> Self {
        RegistryCredentials::default()
    }

    /// Adds (or replaces) the login for `registry` (`host[:port]`).
    pub fn insert(&mut self, registry: &str, username: &str, password: &str) {
        let registry = registry_key(registry);
        self.logins.retain(|(r, _)| *r != registry);
        self.logins.push((
            registry,
            Login {
                username: username.to_string(),
                password: password.to_string(),
            },
        ));
    }

    /// The registries there are logins for.
    pub fn registries(&self) -> impl Iterator<Item = &str> {
        self.logins.iter().map(|(r, _)| r.as_str())
    }

    /// The login for the registry at `authority` (`host[:port]`).
    pub fn login(&self, authority: &str) -> Option<&Login> {
        let authority = authority.to_ascii_lowercase();
        self.logins
            .iter()
            .find(|(r, _)| *r == authority)
            .map(|(_, login)| login)
    }

    /// Parses a Docker `config.json`: `{"auths": {"host:port": {...}}}`,
    /// each entry with `auth` (base64 of `user:password`) or `username`
    /// and `password`. Other top-level fields are ignored; credential
    /// helpers (`credsStore`, `credHelpers`) are not run, and an entry
    /// with only an `identitytoken` is refused.
    pub fn from_docker_config(json: &[u8]) -> Result<Self, String> {
        let config: ConfigFile =
            serde_json::from_slice(json).map_err(|e| format!("not a Docker config.json: {e}"))?;
        let mut credentials = RegistryCredentials::new();
        for (key, entry) in config.auths {
            let registry = registry_key(&key);
            if registry.is_empty() {
                return Err(format!("auths: {} names no registry", quoted(&key)));
            }
            let (username, password) = match (entry.auth, entry.username, entry.password) {
                (Some(auth), _, _) => {
                    let decoded = base64::engine::general_purpose::STANDARD
                        .decode(auth.trim())
                        .ok()
                        .and_then(|bytes| String::from_utf8(bytes).ok())
                        .ok_or_else(|| {
                            format!("auths.{}.auth: not base64 of user:password", quoted(&key))
                        })?;
                    let Some((username, password)) = decoded.split_once(':') else {
                        return Err(format!(
                            "auths.{}.auth: not base64 of user:password (no ':')",
                            quoted(&key)
                        ));
                    };
                    (username.to_string(), password.to_string())
                }
                (None, Some(username), Some(password)) => (username, password),
                _ if entry.identitytoken.is_some() => {
                    return Err(format!(
                        "auths.{}: identity tokens are not supported; give auth or username and password",
                        quoted(&key)
                    ));
                }
                _ => {
                    return Err(format!(
                        "auths.{}: neither auth nor username and password",
                        quoted(&key)
                    ));
                }
            };
            if username.is_empty() {
                return Err(format!("auths.{}: the user name is empty", quoted(&key)));
            }
            credentials.insert(&registry, &username, &password);
        }
        Ok(credentials)
    }

    /// Reads [`from_docker_config`](Self::from_docker_config) from
    /// `path`, warning when others than its owner may read it.
    pub fn read(path: &Path) -> Result<Self, String> {
        use std::io::Read as _;
        use std::os::unix::fs::PermissionsExt as _;
        let shown = path.display();
        let file = std::fs::File::open(path).map_err(|e| format!("{shown}: {e}"))?;
        let mode = file
            .metadata()
            .map_err(|e| format!("{shown}: {e}"))?
            .permissions()
            .mode()
            & 0o777;
        if mode & 0o077 != 0 {
            tracing::warn!(
                "{shown}: readable by others than its owner (mode {mode:o}); chmod 600 it"
            );
        }
        let mut bytes = Vec::new();
        file.take(MAX_FILE_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| format!("{shown}: {e}"))?;
        if bytes.len() as u64 > MAX_FILE_BYTES {
            return Err(format!("{shown}: larger than {MAX_FILE_BYTES} bytes"));
        }
        RegistryCredentials::from_docker_config(&bytes).map_err(|e| format!("{shown}: {e}"))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn docker_configs() {
        let json = br#"{
            "auths": {
                "Registry.Example:5000": {"auth": "dXNlcjpwYTpzcw=="},
                "https://index.docker.io/v1/": {"username": "u2", "password": "p2"}
            },
            "credsStore": "desktop"
        }"#;
        let credentials = RegistryCredentials::from_docker_config(json).unwrap();
        let login = credentials.login("registry.example:5000").unwrap();
        assert_eq!(
            (login.username.as_str(), login.password.as_str()),
            ("user", "pa:ss")
        );
        assert_eq!(credentials.login("index.docker.io").unwrap().username, "u2");
        assert!(credentials.login("registry.example").is_none());
        assert!(!format!("{credentials:?}").contains("pa:ss"));

        for (bad, expected) in [
            (&br#"{"auths": {"r": {"auth": "!!"}}}"#[..], "base64"),
            (br#"{"auths": {"r": {"auth": "bm9jb2xvbg=="}}}"#, "no ':'"),
            (br#"{"auths": {"r": {"identitytoken": "x"}}}"#, "identity"),
            (br#"{"auths": {"r": {"username": "u"}}}"#, "neither"),
            (
                br#"{"auths": {"": {"username": "u", "password": "p"}}}"#,
                "no registry",
            ),
            (
                br#"{"auths": {"r": {"username": "", "password": "p"}}}"#,
                "empty",
            ),
            (b"{", "config.json"),
        ] {
            let e = RegistryCredentials::from_docker_config(bad).unwrap_err();
            assert!(e.contains(expected), "{e:?} lacks {expected:?}");
        }
    }
}
