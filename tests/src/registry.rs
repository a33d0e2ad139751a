//! A real OCI registry for the tests: Debian's `docker-registry` on a
//! loopback port with its storage in a temporary directory, and a minimal
//! HTTP/1.1 client to push images to it through the distribution API.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

/// Where Debian installs the registry.
pub const REGISTRY_BIN: &str = "/usr/bin/docker-registry";

/// A running registry.
pub struct Registry {
    child: Child,
    /// `127.0.0.1:port`.
    pub addr: String,
    storage: PathBuf,
    _dir: tempfile::TempDir,
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
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
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
    s.read_to_end(&mut raw).unwrap();
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

    /// Starts a registry on a free loopback port.
    pub fn start() -> Registry {
        Self::start_with(tempfile::tempdir().unwrap())
    }

    /// [`start`](Self::start) with its storage in a new directory under
    /// `parent` (e.g. on the disk a benchmark measures).
    pub fn start_in(parent: &std::path::Path) -> Registry {
        Self::start_with(tempfile::tempdir_in(parent).unwrap())
    }

    fn start_with(dir: tempfile::TempDir) -> Registry {
        let port = crate::free_port();
        let addr = format!("127.0.0.1:{port}");
        let config = dir.path().join("config.yml");
        let storage: PathBuf = dir.path().join("storage");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: {addr}\n",
                storage.display()
            ),
        )
        .unwrap();
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
            _dir: dir,
        }
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
        let (status, headers, _) = http(
            &self.addr,
            "POST",
            &format!("/v2/{repo}/blobs/uploads/"),
            &[],
            &[],
        );
        assert_eq!(status, 202, "start upload");
        let location = header(&headers, "location").unwrap().to_string();
        let path = location
            .strip_prefix(&format!("http://{}", self.addr))
            .unwrap_or(&location)
            .to_string();
        let sep = if path.contains('?') { '&' } else { '?' };
        let (status, _, body) = http(
            &self.addr,
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

    /// Pushes an OCI image whose single layer is `image` (media type
    /// `layer_media_type`); returns the manifest digest.
    pub fn push_image(
        &self,
        repo: &str,
        tag: &str,
        layer: &[u8],
        layer_media_type: &str,
    ) -> String {
        let config =
            br#"{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}"#;
        let config_digest = self.push_blob(repo, config);
        let layer_digest = self.push_blob(repo, layer);
        let manifest = format!(
            r#"{{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"{config_digest}","size":{}}},"layers":[{{"mediaType":"{layer_media_type}","digest":"{layer_digest}","size":{}}}]}}"#,
            config.len(),
            layer.len()
        );
        let (status, _, body) = http(
            &self.addr,
            "PUT",
            &format!("/v2/{repo}/manifests/{tag}"),
            &[("Content-Type", "application/vnd.oci.image.manifest.v1+json")],
            manifest.as_bytes(),
        );
        assert_eq!(
            status,
            201,
            "push manifest: {}",
            String::from_utf8_lossy(&body)
        );
        digest(manifest.as_bytes())
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
