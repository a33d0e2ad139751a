//! A token server for `docker-registry`'s `auth: token` (the Docker token
//! flow), over TLS on a loopback port: `GET /token?service=...&scope=...`
//! with the right Basic login gets a JWT the registry accepts, anything
//! else `401`.
//!
//! The JWT is what distribution 2.8 verifies: ES256 over
//! `base64url(header).base64url(claims)`, the signature as raw `r || s`,
//! the header's `kid` the libtrust key ID of the public key (the first
//! 240 bits of the SHA-256 of its SubjectPublicKeyInfo, base32, in groups
//! of four) of a certificate in the registry's `rootcertbundle`; claims
//! `iss`, `aud` (the registry's service), `exp`/`nbf`/`iat`, and the
//! `access` granted for the scope asked.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use rcgen::{PublicKeyData as _, SigningKey as _};
use sha2::{Digest as _, Sha256};

/// The issuer the registry trusts.
pub const ISSUER: &str = "metropolis-test-token-issuer";
/// The service name the registry has, the tokens' audience.
pub const SERVICE: &str = "metropolis-test-registry";

/// Signs tokens.
pub struct TokenIssuer {
    key: rcgen::KeyPair,
    /// The certificate of the signing key (PEM): the registry's
    /// `rootcertbundle`.
    pub cert_pem: String,
    kid: String,
}

impl Default for TokenIssuer {
    fn default() -> Self {
        TokenIssuer::new()
    }
}

impl TokenIssuer {
    /// A fresh P-256 signing key and its self-signed certificate.
    pub fn new() -> TokenIssuer {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let cert = rcgen::CertificateParams::new(vec!["token-issuer".to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let kid = libtrust_key_id(&key.subject_public_key_info());
        TokenIssuer {
            key,
            cert_pem: cert.pem(),
            kid,
        }
    }

    /// A token granting `actions` on repository `repository`, valid for
    /// ten minutes.
    pub fn mint(&self, repository: &str, actions: &[&str]) -> String {
        let b64 = |bytes: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let header = serde_json::json!({"typ": "JWT", "alg": "ES256", "kid": self.kid});
        let claims = serde_json::json!({
            "iss": ISSUER,
            "sub": "metropolis-test",
            "aud": SERVICE,
            "exp": now + 600,
            "nbf": now - 10,
            "iat": now,
            "jti": format!("{now}-{}", rand_suffix()),
            "access": [{"type": "repository", "name": repository, "actions": actions}],
        });
        let signed = format!(
            "{}.{}",
            b64(header.to_string().as_bytes()),
            b64(claims.to_string().as_bytes())
        );
        let der = self.key.sign(signed.as_bytes()).unwrap();
        format!("{signed}.{}", b64(&raw_ecdsa(&der)))
    }
}

fn rand_suffix() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    NEXT.fetch_add(1, Ordering::SeqCst)
}

/// libtrust's key ID of a public key given as SubjectPublicKeyInfo DER.
fn libtrust_key_id(spki: &[u8]) -> String {
    const ALPHABET: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    let hash = Sha256::digest(spki);
    // 30 bytes are 240 bits: 48 base32 digits, no padding.
    let mut digits = String::new();
    for group in hash[..30].chunks(5) {
        let value = group.iter().fold(0u64, |v, b| (v << 8) | u64::from(*b));
        for i in (0..8).rev() {
            digits.push(char::from(ALPHABET[((value >> (i * 5)) & 31) as usize]));
        }
    }
    digits
        .as_bytes()
        .chunks(4)
        .map(|c| std::str::from_utf8(c).unwrap())
        .collect::<Vec<_>>()
        .join(":")
}

/// An ECDSA P-256 signature from DER (`SEQUENCE { INTEGER r, INTEGER s }`)
/// to JOSE's raw 64 bytes.
fn raw_ecdsa(der: &[u8]) -> Vec<u8> {
    assert_eq!(der[0], 0x30, "an ECDSA signature is a SEQUENCE");
    let mut at = 2;
    let mut raw = Vec::with_capacity(64);
    for _ in 0..2 {
        assert_eq!(der[at], 0x02, "of INTEGERs");
        let len = usize::from(der[at + 1]);
        let int = &der[at + 2..at + 2 + len];
        let int = &int[int.len().saturating_sub(32)..];
        raw.extend(std::iter::repeat_n(0, 32 - int.len()));
        raw.extend_from_slice(int);
        at += 2 + len;
    }
    raw
}

/// A running token server.
pub struct TokenServer {
    /// `127.0.0.1:port`.
    pub addr: String,
    /// The server's certificate (PEM), the CA to trust.
    pub ca_pem: String,
    /// Token requests answered so far (granted or not).
    pub requests: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl TokenServer {
    /// Serves pull tokens from `issuer` over TLS (a fresh self-signed
    /// certificate for 127.0.0.1) to requests logged in as `authorization`
    /// (a whole `Authorization` value).
    pub fn start(issuer: Arc<TokenIssuer>, authorization: String) -> TokenServer {
        TokenServer::granting(issuer, authorization, &["pull"])
    }

    /// [`start`](Self::start), granting `actions` (`["pull", "push"]` for
    /// a client that uploads).
    pub fn granting(
        issuer: Arc<TokenIssuer>,
        authorization: String,
        actions: &'static [&'static str],
    ) -> TokenServer {
        let key = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).unwrap();
        let tls = Arc::new(
            rustls::ServerConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![key.cert.der().clone()],
                rustls::pki_types::PrivateKeyDer::Pkcs8(key.signing_key.serialize_der().into()),
            )
            .unwrap(),
        );
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let stop = Arc::new(AtomicBool::new(false));
        let requests = Arc::new(AtomicUsize::new(0));
        let thread = {
            let (stop, requests) = (stop.clone(), requests.clone());
            std::thread::spawn(move || {
                for stream in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        return;
                    }
                    let Ok(stream) = stream else { continue };
                    requests.fetch_add(1, Ordering::SeqCst);
                    answer(stream, &tls, &issuer, &authorization, actions);
                }
            })
        };
        TokenServer {
            addr,
            ca_pem: key.cert.pem(),
            requests,
            stop,
            thread: Some(thread),
        }
    }
}

/// Answers one token request.
fn answer(
    stream: TcpStream,
    tls: &Arc<rustls::ServerConfig>,
    issuer: &TokenIssuer,
    authorization: &str,
    actions: &[&str],
) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    let Ok(connection) = rustls::ServerConnection::new(tls.clone()) else {
        return;
    };
    let mut tls = rustls::StreamOwned::new(connection, stream);
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match tls.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => return,
        }
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let target = head.split(' ').nth(1).unwrap_or("");
    let logged_in = head.lines().any(|l| {
        l.split_once(':').is_some_and(|(name, value)| {
            name.eq_ignore_ascii_case("authorization") && value.trim() == authorization
        })
    });
    // scope=repository:NAME:ACTIONS, percent-encoded.
    let scope = target
        .split_once('?')
        .map_or("", |(_, query)| query)
        .split('&')
        .find_map(|pair| pair.strip_prefix("scope="))
        .map(|s| s.replace("%3A", ":").replace("%2F", "/"));
    let response = match scope {
        Some(scope) if logged_in && target.starts_with("/token?") => {
            let mut parts = scope.split(':');
            let (_, repository) = (parts.next(), parts.next().unwrap_or(""));
            let token = issuer.mint(repository, actions);
            let body = format!(r#"{{"token":"{token}","expires_in":600}}"#);
            format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            )
        }
        _ => "HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            .to_string(),
    };
    let _ = tls.write_all(response.as_bytes());
    tls.conn.send_close_notify();
    let _ = tls.flush();
}

impl Drop for TokenServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(&self.addr);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_ids_and_signatures_have_their_shapes() {
        let id = libtrust_key_id(b"spki");
        assert_eq!(id.len(), 48 + 11);
        assert_eq!(id.split(':').count(), 12);
        let issuer = TokenIssuer::new();
        let token = issuer.mint("os/x", &["pull"]);
        let signature = token.rsplit('.').next().unwrap();
        let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(signature)
            .unwrap();
        assert_eq!(raw.len(), 64);
    }
}
