//! Logging in to a registry: answering its `401` challenge
//! (`WWW-Authenticate`) with Basic authentication or with a token from
//! the token server the challenge names (the Docker token flow, what
//! Docker Hub, GHCR, Harbor, Quay and `docker-registry` with `auth: token`
//! speak).
//!
//! A [`Session`] is one user's requests to one repository: it sends
//! them anonymously until the registry asks for more, answers the
//! challenge once per request, and keeps the `Authorization` it got for
//! the requests after. Rules:
//!
//! - a login (user and password) goes only over `https`: to the registry
//!   for Basic, to the token server for a token. A registry in the clear
//!   that asks for one fails, saying why;
//! - without a login for the registry, the token flow is tried
//!   anonymously (public images on Docker Hub need a token too);
//! - the `Authorization` header goes to the registry's own scheme and
//!   authority only, never to a host a redirect leads to (`http.rs`).

use base64::Engine as _;
use serde::Deserialize;

use crate::credentials::{Login, RegistryCredentials};
use crate::deadline::Deadline;
use crate::error::RegistryError;
use crate::http::{Client, Method, Request, Response, Scheme, Url, bounded};
use crate::retry::wait_before_retry;

/// The largest token response read.
const MAX_TOKEN_RESPONSE_BYTES: u64 = 256 * 1024;

/// What a session asks the token server for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Reading the repository (`pull`).
    Pull,
    /// Reading and writing it (`pull,push`).
    Push,
}

/// One user's requests to one repository of one registry.
pub struct Session<'a> {
    pub(crate) client: &'a Client,
    registry: &'a Url,
    login: Option<&'a Login>,
    /// The token scope asked for when the challenge names none.
    scope: String,
    authorization: Option<String>,
    /// A deadline over all the session's requests (an installation's).
    pub(crate) install_deadline: Option<Deadline>,
    /// Told of every failed try that is tried again.
    pub(crate) notice: Option<&'a (dyn Fn(&str) + Sync)>,
}

#[derive(Deserialize)]
struct TokenResponse {
    token: Option<String>,
    access_token: Option<String>,
}

impl<'a> Session<'a> {
    /// A session with the registry at `registry` (its base URL) for
    /// `access` to `repository`.
    pub fn new(
        client: &'a Client,
        credentials: &'a RegistryCredentials,
        registry: &'a Url,
        repository: &str,
        access: Access,
    ) -> Session<'a> {
        let actions = match access {
            Access::Pull => "pull",
            Access::Push => "pull,push",
        };
        Session {
            client,
            registry,
            login: credentials.login(&registry.authority),
            scope: format!("repository:{repository}:{actions}"),
            authorization: None,
            install_deadline: None,
            notice: None,
        }
    }

    /// The session telling `notice` of every failed try it tries again
    /// (what failed and the wait), for a user watching; they are logged
    /// at `info` either way.
    pub fn telling(mut self, notice: &'a (dyn Fn(&str) + Sync)) -> Self {
        self.notice = Some(notice);
        self
    }

    /// The session with every request bounded by the caller's
    /// `deadline` too.
    pub fn within(mut self, deadline: Deadline) -> Self {
        self.install_deadline = Some(deadline);
        self
    }

    fn unauthorized(&self, problem: String) -> RegistryError {
        RegistryError::Unauthorized {
            registry: self.registry.authority.clone(),
            problem,
        }
    }

    /// `GET url` with the session's authorization (see [`Session::send`]);
    /// from byte `range_from` of the body when given.
    pub fn get(
        &mut self,
        url: &Url,
        accept: Option<&str>,
        range_from: Option<u64>,
    ) -> Result<Response, RegistryError> {
        self.send(
            url,
            Request {
                accept,
                range_from,
                ..Request::default()
            },
        )
    }

    /// Sends `request` to `url` with the session's authorization, logging
    /// in when the registry answers `401`, tried again as the client's
    /// retry policy says (`retry.rs`). The request's own `authorization`
    /// and deadline are the session's.
    pub fn send(&mut self, url: &Url, request: Request<'_>) -> Result<Response, RegistryError> {
        let policy = self.client.retry;
        let mut attempt = 0;
        loop {
            let outcome = self.send_once(url, request);
            let Some(wait) = wait_before_retry(&policy, attempt, &outcome) else {
                return outcome;
            };
            let failed = || match &outcome {
                Ok(response) => format!("{url}: the registry answered {}", response.status),
                Err(e) => e.to_string(),
            };
            if !self.pause_before_retry(url, wait, failed) {
                // No time left to wait for another try: what the last one
                // got is the answer.
                return outcome;
            }
            attempt = attempt.saturating_add(1);
        }
    }

    /// Waits `wait` before another try at `url` after one that `failed`
    /// (said to the session's notice, logged): `false` without waiting
    /// when the session's deadline leaves no time for it.
    pub(crate) fn pause_before_retry(
        &self,
        url: &Url,
        wait: std::time::Duration,
        failed: impl FnOnce() -> String,
    ) -> bool {
        if self.install_deadline.is_some_and(|d| d.left() <= wait) {
            return false;
        }
        tracing::info!(
            url = %url,
            "registry request failed; trying again in {:.1} s",
            wait.as_secs_f64()
        );
        if let Some(notice) = self.notice {
            notice(&format!(
                "{}; trying again in {:.1} s",
                failed(),
                wait.as_secs_f64()
            ));
        }
        std::thread::sleep(wait);
        true
    }

    /// The wait before retry `attempt` (from 0) by the client's policy.
    pub fn retry_delay(&self, attempt: u32) -> std::time::Duration {
        self.client.retry.delay(attempt)
    }

    /// Sends `request` to `url` once: a `401` is answered (a login, a
    /// token) and the request sent again with it, but a failure is not
    /// tried again. For requests that cannot simply be repeated, such as
    /// the `PUT` that ends an upload, whose caller starts the upload over.
    pub fn send_once(
        &mut self,
        url: &Url,
        request: Request<'_>,
    ) -> Result<Response, RegistryError> {
        let send = |authorization: Option<&str>| {
            self.client
                .send(
                    url,
                    Request {
                        authorization,
                        install_deadline: self.install_deadline,
                        ..request
                    },
                )
                .map_err(RegistryError::from)
        };
        let response = send(self.authorization.as_deref())?;
        if response.status != 401 || !response.url.same_origin(self.registry) {
            return Ok(response);
        }
        // Without a challenge there is nothing to answer: report what the
        // registry said.
        let Some(challenge) = response.header("www-authenticate").map(str::to_string) else {
            return Err(RegistryError::status(response));
        };
        let authorization = self.authorize(&challenge)?;
        let response = send(Some(&authorization))?;
        if response.status == 401 && response.url.same_origin(self.registry) {
            return Err(self.unauthorized(match self.login {
                Some(login) => format!(
                    "the registry refused the login of user {:?}",
                    bounded(&login.username)
                ),
                None => "the registry refused the anonymous token".to_string(),
            }));
        }
        self.authorization = Some(authorization);
        Ok(response)
    }

    /// The `Authorization` answering `challenge`.
    fn authorize(&self, challenge: &str) -> Result<String, RegistryError> {
        let challenges = http_auth::parse_challenges(challenge).map_err(|e| {
            self.unauthorized(format!(
                "the registry asks for login with an unreadable challenge {}: {e}",
                bounded(challenge)
            ))
        })?;
        let find = |scheme: &str| {
            challenges
                .iter()
                .find(|c| c.scheme.eq_ignore_ascii_case(scheme))
        };
        if let Some(bearer) = find("Bearer") {
            let param = |name: &str| {
                bearer
                    .params
                    .iter()
                    .find(|(n, _)| n.eq_ignore_ascii_case(name))
                    .map(|(_, v)| v.to_unescaped())
            };
            let Some(realm) = param("realm") else {
                return Err(self.unauthorized(
                    "the registry's Bearer challenge names no token server (realm)".to_string(),
                ));
            };
            let scope = param("scope").unwrap_or_else(|| self.scope.clone());
            return self.token(&realm, param("service").as_deref(), &scope);
        }
        if find("Basic").is_some() {
            let Some(login) = self.login else {
                return Err(self.unauthorized(format!(
                    "the registry requires a login (Basic) and the credentials file (--registry-auth) has none for {}",
                    self.registry.authority
                )));
            };
            if self.registry.scheme != Scheme::Https {
                return Err(self.unauthorized(
                    "the registry asks for a password over plain http; logins are sent over https only"
                        .to_string(),
                ));
            }
            return Ok(format!("Basic {}", basic(login)));
        }
        Err(self.unauthorized(format!(
            "the registry asks for login by a scheme other than Basic or Bearer: {}",
            bounded(challenge)
        )))
    }

    /// A token from the token server at `realm` for `scope`, as an
    /// `Authorization` value.
    fn token(
        &self,
        realm: &str,
        service: Option<&str>,
        scope: &str,
    ) -> Result<String, RegistryError> {
        let mut url = Url::parse(realm).map_err(|problem| {
            self.unauthorized(format!("the token server's URL (realm): {problem}"))
        })?;
        if let Some(service) = service {
            url = url.with_query("service", service);
        }
        url = url.with_query("scope", scope);
        let authorization = match self.login {
            Some(_) if url.scheme != Scheme::Https => {
                return Err(self.unauthorized(format!(
                    "the token server {} is plain http; logins are sent over https only",
                    bounded(&url.authority)
                )));
            }
            Some(login) => Some(format!("Basic {}", basic(login))),
            None => None,
        };
        let mut response = self
            .client
            .send(
                &url,
                Request {
                    method: Method::Get,
                    accept: Some("application/json"),
                    authorization: authorization.as_deref(),
                    install_deadline: self.install_deadline,
                    ..Request::default()
                },
            )
            .map_err(RegistryError::from)?;
        match response.status {
            200 => {}
            401 | 403 => {
                return Err(self.unauthorized(match self.login {
                    Some(login) => format!(
                        "the token server {} refused the login of user {:?} ({})",
                        url.authority,
                        bounded(&login.username),
                        response.status
                    ),
                    None => format!(
                        "the token server {} refused an anonymous token ({}); the credentials file (--registry-auth) has no login for {}",
                        url.authority, response.status, self.registry.authority
                    ),
                }));
            }
            _ => return Err(RegistryError::status(response)),
        }
        let body = response
            .read_body(MAX_TOKEN_RESPONSE_BYTES)
            .map_err(|source| RegistryError::Transfer {
                url: response.url.to_string(),
                source,
            })?
            .ok_or_else(|| {
                self.unauthorized(format!(
                    "the token server's answer is larger than {MAX_TOKEN_RESPONSE_BYTES} bytes"
                ))
            })?;
        let answer: TokenResponse = serde_json::from_slice(&body).map_err(|e| {
            self.unauthorized(format!("the token server's answer is not a token: {e}"))
        })?;
        let token = answer
            .token
            .or(answer.access_token)
            .filter(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_graphic()))
            .ok_or_else(|| {
                self.unauthorized("the token server's answer holds no usable token".to_string())
            })?;
        Ok(format!("Bearer {token}"))
    }
}

/// The Basic credentials of `login`, base64-encoded.
fn basic(login: &Login) -> String {
    base64::engine::general_purpose::STANDARD
        .encode(format!("{}:{}", login.username, login.password))
}
