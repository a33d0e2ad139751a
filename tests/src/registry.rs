//! A real OCI registry for the tests: Debian's `docker-registry` on a
//! loopback port with its storage in a temporary directory, in the clear
//! or with TLS (a fresh self-signed certificate for 127.0.0.1) and
//! htpasswd logins (bcrypt entries made by Apache's `htpasswd`, Debian
//! package apache2-utils), and a minimal HTTP/1.1 client to push images
//! and image indexes to it through the distribution API.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;

use crate::token_server::{self, TokenIssuer};

use sha2::{Digest, Sha256};

/// Where Debian installs the registry.
pub const REGISTRY_BIN: &str = "/usr/bin/docker-registry";

/// Where Debian installs Apache's `htpasswd`.
pub const HTPASSWD_BIN: &str = "/usr/bin/htpasswd";

/// A running registry.
pub struct Registry {
    child: Child,
    /// `127.0.0.1:port`.
    pub addr: String,
    storage: PathBuf,
    /// With TLS: the registry's certificate (PEM), the CA to trust.
    pub ca_pem: Option<String>,
    /// The client's TLS configuration and login for pushing.
    tls: Option<Arc<rustls::ClientConfig>>,
    login: Login,
    dir: tempfile::TempDir,
}

/// Who may use a registry.
pub enum Access<'a> {
    /// Anyone, in the clear.
    Open,
    /// Over TLS, with this user and password (htpasswd, Basic).
    Htpasswd(&'a str, &'a str),
    /// Over TLS, with tokens of `issuer` from the token server at `realm`
    /// (`auth: token`).
    Token {
        /// Whose tokens the registry accepts.
        issuer: Arc<TokenIssuer>,
        /// The token server's URL, as the registry's challenge names it.
        realm: &'a str,
    },
}

/// How the push client logs in.
enum Login {
    None,
    Basic(String),
    Bearer(Arc<TokenIssuer>),
}

/// A byte stream the push client runs over.
trait Stream: Read + Write {}
impl<T: Read + Write> Stream for T {}

/// The manifest `artifactType` of a whole-disk OS image.
pub const DISK_ARTIFACT: &str = "application/vnd.metropolis-rs.os.disk-image.v1";
/// The manifest `artifactType` of a Metropolis OS image.
pub const METROPOLIS_ARTIFACT: &str = "application/vnd.monogon.os.image.v1";

/// A payload to push: its name, its bytes, and the zstd frame to store
/// instead of them when it is compressed.
pub struct Payload<'a> {
    /// The payload's name, e.g. `system`.
    pub name: &'a str,
    /// Its (uncompressed) bytes: what the config's chunk hashes cover.
    pub bytes: &'a [u8],
    /// The layer as stored, when compressed.
    pub zstd: Option<&'a [u8]>,
}

/// One payload's entry in an OS image config: its size, chunk size and
/// the SHA-256 of each chunk in standard base64 without padding.
pub fn payload_config(name: &str, bytes: &[u8], chunk: usize) -> String {
    use base64::Engine as _;
    let hashes: Vec<String> = bytes
        .chunks(chunk)
        .map(|c| {
            format!(
                "\"{}\"",
                base64::engine::general_purpose::STANDARD_NO_PAD.encode(Sha256::digest(c))
            )
        })
        .collect();
    format!(
        r#"{{"name":"{name}","size":{},"hash_chunk_size":{chunk},"chunk_hashes_sha256":[{}]}}"#,
        bytes.len(),
        hashes.join(",")
    )
}

/// `sha256:<hex>` of `bytes`.
pub fn digest(bytes: &[u8]) -> String {
    let hash = Sha256::digest(bytes);
    format!(
        "sha256:{}",
        hash.iter().map(|b| format!("{b:02x}")).collect::<String>()
    )
}

/// One HTTP/1.1 exchange (Connection: close): status, headers, body.
pub fn http(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, Vec<(String, String)>, Vec<u8>) {
    exchange(addr, None, method, path, headers, body)
}

/// [`http`], over TLS with `tls`.
fn exchange(
    addr: &str,
    tls: Option<&Arc<rustls::ClientConfig>>,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, Vec<(String, String)>, Vec<u8>) {
    let tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut s: Box<dyn Stream> = match tls {
        None => Box::new(tcp),
        Some(config) => {
            let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
            let connection = rustls::ClientConnection::new(config.clone(), name).unwrap();
            Box::new(rustls::StreamOwned::new(connection, tcp))
        }
    };
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    let mut raw = Vec::new();
    // A TLS peer closing without close_notify still delivered the body.
    if let Err(e) = s.read_to_end(&mut raw) {
        assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof, "{e}");
    }
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("HTTP response head");
    let head = String::from_utf8_lossy(&raw[..split]).to_string();
    let mut lines = head.lines();
    let status = lines
        .next()
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers = lines
        .filter_map(|l| {
            l.split_once(':')
                .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        })
        .collect();
    (status, headers, raw[split + 4..].to_vec())
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

impl Registry {
    /// Whether the registry package is installed (`.ci/run` installs it).
    pub fn available() -> bool {
        Path::new(REGISTRY_BIN).exists()
    }

    /// Starts a registry on a free loopback port, in the clear, without
    /// logins.
    pub fn start() -> Registry {
        Registry::start_as(Access::Open)
    }

    /// Starts a registry over TLS (its certificate in [`ca_pem`](Self::ca_pem))
    /// that asks for the login `user`/`password` (htpasswd, Basic) for
    /// everything.
    pub fn start_secure(user: &str, password: &str) -> Registry {
        Registry::start_as(Access::Htpasswd(user, password))
    }

    /// Starts a registry with `access`.
    pub fn start_as(access: Access<'_>) -> Registry {
        Self::start_with(tempfile::tempdir().unwrap(), access)
    }

    /// [`start`](Self::start) with its storage in a new directory under
    /// `parent` (e.g. on the disk a benchmark measures).
    pub fn start_in(parent: &std::path::Path) -> Registry {
        Self::start_with(tempfile::tempdir_in(parent).unwrap(), Access::Open)
    }

    fn start_with(dir: tempfile::TempDir, access: Access<'_>) -> Registry {
        let port = crate::free_port();
        let addr = format!("127.0.0.1:{port}");
        let config = dir.path().join("config.yml");
        let storage: PathBuf = dir.path().join("storage");
        let mut yaml = format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: {addr}\n",
            storage.display()
        );
        let (mut ca_pem, mut tls, mut login) = (None, None, Login::None);
        if !matches!(access, Access::Open) {
            let key = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).unwrap();
            let (cert, key_file) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
            std::fs::write(&cert, key.cert.pem()).unwrap();
            std::fs::write(&key_file, key.signing_key.serialize_pem()).unwrap();
            yaml.push_str(&format!(
                "  tls:\n    certificate: {}\n    key: {}\n",
                cert.display(),
                key_file.display(),
            ));
            let mut roots = rustls::RootCertStore::empty();
            roots.add(key.cert.der().clone()).unwrap();
            tls = Some(Arc::new(
                rustls::ClientConfig::builder_with_provider(Arc::new(
                    rustls::crypto::ring::default_provider(),
                ))
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(roots)
                .with_no_client_auth(),
            ));
            ca_pem = Some(key.cert.pem());
        }
        match access {
            Access::Open => {}
            Access::Htpasswd(user, password) => {
                let htpasswd = dir.path().join("htpasswd");
                std::fs::write(&htpasswd, htpasswd_entry(user, password)).unwrap();
                yaml.push_str(&format!(
                    "auth:\n  htpasswd:\n    realm: metropolis-test\n    path: {}\n",
                    htpasswd.display()
                ));
                login = Login::Basic(format!(
                    "Basic {}",
                    base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
                ));
            }
            Access::Token { issuer, realm } => {
                let bundle = dir.path().join("token-issuer.pem");
                std::fs::write(&bundle, &issuer.cert_pem).unwrap();
                yaml.push_str(&format!(
                    "auth:\n  token:\n    realm: {realm}\n    service: {}\n    issuer: {}\n    rootcertbundle: {}\n",
                    token_server::SERVICE,
                    token_server::ISSUER,
                    bundle.display()
                ));
                login = Login::Bearer(issuer);
            }
        }
        std::fs::write(&config, yaml).unwrap();
        let log = std::fs::File::create(dir.path().join("registry.log")).unwrap();
        let child = Command::new(REGISTRY_BIN)
            .arg("serve")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(&addr).is_err() {
            assert!(Instant::now() < deadline, "registry did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        Registry {
            child,
            addr,
            storage,
            ca_pem,
            tls,
            login,
            dir,
        }
    }

    /// The registry's log (what it printed).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
    }

    /// One exchange with the registry, over TLS and logged in if it
    /// wants that.
    fn http(
        &self,
        repo: &str,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> (u16, Vec<(String, String)>, Vec<u8>) {
        let authorization = match &self.login {
            Login::None => None,
            Login::Basic(basic) => Some(basic.clone()),
            Login::Bearer(issuer) => {
                Some(format!("Bearer {}", issuer.mint(repo, &["pull", "push"])))
            }
        };
        let mut all = headers.to_vec();
        if let Some(authorization) = &authorization {
            all.push(("Authorization", authorization));
        }
        exchange(&self.addr, self.tls.as_ref(), method, path, &all, body)
    }

    /// Where the registry keeps the blob `digest` (`sha256:<hex>`) on disk:
    /// what a test rewrites to make the registry serve other bytes.
    pub fn blob_path(&self, digest: &str) -> PathBuf {
        let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
        self.storage
            .join("docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }

    /// Uploads a blob; returns its digest.
    pub fn push_blob(&self, repo: &str, bytes: &[u8]) -> String {
        let d = digest(bytes);
        let (status, headers, _) = self.http(
            repo,
            "POST",
            &format!("/v2/{repo}/blobs/uploads/"),
            &[],
            &[],
        );
        assert_eq!(status, 202, "start upload");
        let location = header(&headers, "location").unwrap().to_string();
        let path = location
            .strip_prefix(&format!("http://{}", self.addr))
            .or_else(|| location.strip_prefix(&format!("https://{}", self.addr)))
            .unwrap_or(&location)
            .to_string();
        let sep = if path.contains('?') { '&' } else { '?' };
        let (status, _, body) = self.http(
            repo,
            "PUT",
            &format!("{path}{sep}digest={d}"),
            &[("Content-Type", "application/octet-stream")],
            bytes,
        );
        assert_eq!(
            status,
            201,
            "finish upload: {}",
            String::from_utf8_lossy(&body)
        );
        d
    }

    /// Pushes a whole-disk OS image (artifact type
    /// `application/vnd.metropolis-rs.os.disk-image.v1`) whose one raw
    /// payload, `disk`, is `payload`; returns the manifest digest.
    pub fn push_image(&self, repo: &str, tag: &str, payload: &[u8]) -> String {
        self.push_os_image(repo, tag, DISK_ARTIFACT, &[("disk", payload)])
    }

    /// Pushes an OS image of `artifact_type` with raw `payloads` (name,
    /// bytes), their chunk hashes in the config at 1 MiB chunks (the
    /// format of docs/spec/metropolis-install.md section 1, written here
    /// independently of the agent's reader); returns the manifest digest.
    pub fn push_os_image(
        &self,
        repo: &str,
        tag: &str,
        artifact_type: &str,
        payloads: &[(&str, &[u8])],
    ) -> String {
        let payloads: Vec<Payload<'_>> = payloads
            .iter()
            .map(|(name, bytes)| Payload {
                name,
                bytes,
                zstd: None,
            })
            .collect();
        self.push_payloads(repo, tag, artifact_type, &payloads)
    }

    /// [`push_os_image`](Self::push_os_image) with payloads that may be
    /// stored compressed.
    pub fn push_payloads(
        &self,
        repo: &str,
        tag: &str,
        artifact_type: &str,
        payloads: &[Payload<'_>],
    ) -> String {
        let mut layers = Vec::new();
        let mut configs = Vec::new();
        for payload in payloads {
            let (media_type, blob) = match payload.zstd {
                Some(compressed) => ("application/zstd", compressed),
                None => ("application/octet-stream", payload.bytes),
            };
            let layer_digest = self.push_blob(repo, blob);
            layers.push(format!(
                r#"{{"mediaType":"{media_type}","digest":"{layer_digest}","size":{}}}"#,
                blob.len()
            ));
            configs.push(payload_config(payload.name, payload.bytes, 1 << 20));
        }
        let config = format!(
            r#"{{"format_version":"1","payloads":[{}]}}"#,
            configs.join(",")
        );
        let config_digest = self.push_blob(repo, config.as_bytes());
        let manifest = format!(
            r#"{{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","artifactType":"{artifact_type}","config":{{"mediaType":"application/vnd.monogon.os.image.config.v1+json","digest":"{config_digest}","size":{}}},"layers":[{}]}}"#,
            config.len(),
            layers.join(",")
        );
        self.push_manifest(
            repo,
            tag,
            "application/vnd.oci.image.manifest.v1+json",
            manifest.as_bytes(),
        )
    }

    /// Pushes the manifest `body` of `media_type` under `tag`; returns its
    /// digest.
    pub fn push_manifest(&self, repo: &str, tag: &str, media_type: &str, body: &[u8]) -> String {
        let (status, _, answer) = self.http(
            repo,
            "PUT",
            &format!("/v2/{repo}/manifests/{tag}"),
            &[("Content-Type", media_type)],
            body,
        );
        assert_eq!(
            status,
            201,
            "push manifest: {}",
            String::from_utf8_lossy(&answer)
        );
        digest(body)
    }

    /// Pushes an OCI image index under `tag` whose entries are the
    /// manifests `(os/architecture, manifest digest)`, each already pushed;
    /// returns the index's digest.
    pub fn push_index(&self, repo: &str, tag: &str, platforms: &[(&str, &str)]) -> String {
        let entries: Vec<String> = platforms
            .iter()
            .map(|(platform, manifest_digest)| {
                let (status, _, manifest) = self.http(
                    repo,
                    "GET",
                    &format!("/v2/{repo}/manifests/{manifest_digest}"),
                    &[("Accept", "application/vnd.oci.image.manifest.v1+json")],
                    &[],
                );
                assert_eq!(status, 200, "{platform}'s manifest");
                let (os, architecture) = platform.split_once('/').unwrap();
                format!(
                    r#"{{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"{manifest_digest}","size":{},"platform":{{"architecture":"{architecture}","os":"{os}"}}}}"#,
                    manifest.len()
                )
            })
            .collect();
        let index = format!(
            r#"{{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{}]}}"#,
            entries.join(",")
        );
        self.push_manifest(
            repo,
            tag,
            "application/vnd.oci.image.index.v1+json",
            index.as_bytes(),
        )
    }
}

/// An htpasswd line for `user` with a bcrypt hash of `password`, made by
/// `htpasswd -niB` (the password on its standard input, not its command
/// line).
fn htpasswd_entry(user: &str, password: &str) -> String {
    assert!(
        Path::new(HTPASSWD_BIN).exists(),
        "htpasswd is not installed (apt-get install apache2-utils; .ci/run does it)"
    );
    let mut child = Command::new(HTPASSWD_BIN)
        .args(["-niB", user])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(format!("{password}\n").as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
