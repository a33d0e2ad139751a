//! Logging in to a registry: the logins of a Docker `config.json`
//! (`--registry-auth`, the format `bmaas-agent --registry-auth` reads),
//! answered to a `401` challenge with Basic authentication or the Docker
//! token flow (the `Bearer` challenge names a token server, asked for a
//! push token with the login, or anonymously without one).

use std::path::Path;

use base64::Engine as _;
use http::{HeaderMap, HeaderValue, Method, StatusCode};

use super::format::quoted;
use super::http::{Client, empty, error_text, read_body};
use crate::CliError;
use crate::exit::{Exit, failed, usage};

/// The largest credentials file read.
const MAX_FILE_BYTES: u64 = 1 << 20;
/// The largest token response read.
const MAX_TOKEN_RESPONSE: usize = 1 << 20;

/// A user name and password for one registry.
#[derive(Clone)]
pub struct Login {
    username: String,
    password: String,
}

impl std::fmt::Debug for Login {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Login({:?}, <redacted>)", self.username)
    }
}

impl Login {
    /// The `Authorization` value of Basic authentication.
    fn basic(&self) -> String {
        let pair = format!("{}:{}", self.username, self.password);
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(pair)
        )
    }
}

/// The registry a Docker config key names: `host[:port]`, lowercase
/// (`https://index.docker.io/v1/` is `index.docker.io`).
fn registry_key(key: &str) -> String {
    let key = key.split_once("://").map_or(key, |(_, rest)| rest);
    key.split('/').next().unwrap_or("").to_ascii_lowercase()
}

/// The login for `host` in the Docker `config.json` at `path`, if it has
/// one. Entries have `auth` (base64 of `user:password`) or `username` and
/// `password`; credential helpers are not run.
pub fn read_login(path: &Path, host: &str) -> Result<Option<Login>, CliError> {
    use std::io::Read as _;
    let flag = format!("--registry-auth {}", path.display());
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes))
        .map_err(|e| usage(format!("{flag}: {e}")))?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(usage(format!("{flag}: larger than {MAX_FILE_BYTES} bytes")));
    }
    let config: serde_json::Value = serde_json::from_slice(&bytes)
        .map_err(|e| usage(format!("{flag}: not a Docker config.json: {e}")))?;
    let Some(auths) = config.get("auths").and_then(|a| a.as_object()) else {
        return Err(usage(format!(
            "{flag}: no \"auths\" object (expected {{\"auths\": {{\"{host}\": {{\"auth\": \"<base64 of user:password>\"}}}}}})"
        )));
    };
    let host = host.to_ascii_lowercase();
    let Some((key, entry)) = auths.iter().find(|(k, _)| registry_key(k) == host) else {
        return Ok(None);
    };
    let at = format!("{flag}: auths.{}", quoted(key));
    let field = |name: &str| entry.get(name).and_then(|v| v.as_str());
    let (username, password) = match (field("auth"), field("username"), field("password")) {
        (Some(auth), _, _) => {
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(auth.trim())
                .ok()
                .and_then(|b| String::from_utf8(b).ok())
                .ok_or_else(|| usage(format!("{at}.auth: not base64 of user:password")))?;
            let (user, password) = decoded
                .split_once(':')
                .ok_or_else(|| usage(format!("{at}.auth: not base64 of user:password")))?;
            (user.to_string(), password.to_string())
        }
        (None, Some(user), Some(password)) => (user.to_string(), password.to_string()),
        _ => {
            return Err(usage(format!(
                "{at}: neither auth nor username and password"
            )));
        }
    };
    Ok(Some(Login { username, password }))
}

/// What a `401` asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum Challenge {
    /// Basic authentication.
    Basic,
    /// A token from the token server `realm`.
    Bearer {
        /// The token server's URL.
        realm: String,
        /// The `service` to ask for.
        service: Option<String>,
    },
}

/// The challenge of a `WWW-Authenticate` value: Bearer if offered, else
/// Basic; `None` for neither or an unparsable value.
pub fn parse_challenge(value: &str) -> Option<Challenge> {
    let challenges = http_auth::parse_challenges(value).ok()?;
    let param = |c: &http_auth::ChallengeRef<'_>, name: &str| {
        c.params
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.to_unescaped())
    };
    if let Some(bearer) = challenges
        .iter()
        .find(|c| c.scheme.eq_ignore_ascii_case("bearer"))
    {
        return Some(Challenge::Bearer {
            realm: param(bearer, "realm")?,
            service: param(bearer, "service"),
        });
    }
    challenges
        .iter()
        .any(|c| c.scheme.eq_ignore_ascii_case("basic"))
        .then_some(Challenge::Basic)
}

/// The `Authorization` value answering `challenge` for pushing to
/// `repository` at `registry` (`scheme://host`), with `login` if given.
/// A login is only sent over `https`.
pub async fn answer(
    client: &Client,
    registry: &str,
    repository: &str,
    challenge: &Challenge,
    login: Option<&Login>,
) -> Result<String, CliError> {
    let denied = |why: String| failed(Exit::Denied, why);
    let plain = |url: &str| url.starts_with("http://");
    match challenge {
        Challenge::Basic => {
            let login = login.ok_or_else(|| {
                denied(format!(
                    "{registry} wants a login: give --registry-auth FILE, a Docker config.json \
                     with a login for its host"
                ))
            })?;
            if plain(registry) {
                return Err(denied(format!(
                    "{registry} wants a login, which is not sent over plain http: use https://"
                )));
            }
            Ok(login.basic())
        }
        Challenge::Bearer { realm, service } => {
            if login.is_some() && plain(realm) {
                return Err(denied(format!(
                    "the token server {} is plain http: the login is not sent to it",
                    quoted(realm)
                )));
            }
            let mut url = format!(
                "{realm}{}scope=repository:{repository}:pull,push",
                if realm.contains('?') { '&' } else { '?' }
            );
            if let Some(service) = service {
                let service: String = service
                    .bytes()
                    .map(|b| match b {
                        b'0'..=b'9' | b'A'..=b'Z' | b'a'..=b'z' | b'-' | b'.' | b'_' | b'~' => {
                            (b as char).to_string()
                        }
                        _ => format!("%{b:02X}"),
                    })
                    .collect();
                url.push_str(&format!("&service={service}"));
            }
            let mut headers = HeaderMap::new();
            if let Some(login) = login
                && let Ok(value) = HeaderValue::from_str(&login.basic())
            {
                headers.insert(http::header::AUTHORIZATION, value);
            }
            let response = client.send(Method::GET, &url, headers, empty()).await?;
            let status = response.status();
            if status != StatusCode::OK {
                let said = error_text(response).await;
                let exit = match status {
                    StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => Exit::Denied,
                    _ => Exit::Failure,
                };
                return Err(failed(
                    exit,
                    format!("the token server {} answered {status}{said}", quoted(realm)),
                ));
            }
            let body = read_body(response, MAX_TOKEN_RESPONSE).await?;
            let json: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
            let token = ["token", "access_token"]
                .iter()
                .find_map(|k| json.get(k).and_then(|t| t.as_str()))
                .filter(|t| !t.is_empty())
                .ok_or_else(|| {
                    failed(
                        Exit::Failure,
                        format!("the token server {} gave no token", quoted(realm)),
                    )
                })?;
            Ok(format!("Bearer {token}"))
        }
    }
}
