//! The OCI distribution client of `bmaas-agent` (pulling OS images) and
//! `metroctl osimage push` (pushing them): one client, so both speak to
//! registries alike.
//!
//! - [`Client`]: blocking HTTP/1.1 over `std::net` and rustls, one
//!   connection per request; every socket operation bounded by a timeout
//!   and every request by a deadline ([`deadline`]); redirects followed
//!   for `GET` and `HEAD` to `https` only across hosts.
//! - [`Session`]: one user's requests to one repository: logins answered
//!   to `401` challenges (Basic, or the Docker token flow) with the
//!   [`RegistryCredentials`] of a Docker `config.json`, and transient
//!   failures tried again by the [`RetryPolicy`] (`Retry-After`
//!   honoured).
//! - [`registry_tls`]: the system's roots plus `--registry-ca` files.
//!
//! Blocking on purpose: the agent installs on a thread of its own, and a
//! push is a few dozen sequential requests. It must not depend on a
//! runtime, the store or the node.

#![forbid(unsafe_code)]

mod auth;
mod body;
mod credentials;
pub mod deadline;
mod error;
mod fetch;
mod http;
mod retry;
mod trust;
mod url;

pub use auth::{Access, Session};
pub use body::Body;
pub use credentials::{Login, RegistryCredentials};
pub use error::{RegistryError, reason};
pub use fetch::Whole;
pub use http::{
    Client, HttpError, MAX_HEAD_BYTES, MAX_HEADERS, MAX_REDIRECTS, Method, Request, Response,
    Stream, Upload, bounded, may_redirect, read_response,
};
pub use retry::{MAX_RETRY_AFTER, RetryPolicy, retry_after, retryable_status};
pub use trust::{RegistryTls, registry_tls};
pub use url::{Scheme, Url};
