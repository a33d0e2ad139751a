//! `metroctl install request --image …/REPOSITORY:TAG`: the tag looked up
//! once, when the request is submitted, through the agent's registry
//! client (`metropolis-registry`: the logins of a Docker `config.json`,
//! the system's roots plus `--registry-ca`, retries), so that the request
//! the agent receives names the manifest by digest, as the reference's
//! requests do.

use std::path::{Path, PathBuf};
use std::time::Duration;

use metropolis_registry::{
    Access, Client, RegistryCredentials, RegistryError, RetryPolicy, Session, Url, Whole,
    registry_tls,
};

use super::format::{digest_of, quoted};
use crate::CliError;
use crate::exit::{Exit, failed, usage};

/// What the agent accepts for a manifest, and so what a tag is resolved
/// to: an OCI image manifest, or an image index it picks its platform
/// from (OCI's or Docker's).
const ACCEPT: &str = "application/vnd.oci.image.manifest.v1+json, \
    application/vnd.oci.image.index.v1+json, \
    application/vnd.docker.distribution.manifest.list.v2+json";

/// The largest manifest read (the agent's limit too).
const MAX_MANIFEST_BYTES: u64 = 4 * 1024 * 1024;

/// Two more tries, after 0.5 and 1 s: the lookup is one small request,
/// within the command's `--timeout`.
const RETRY: RetryPolicy = RetryPolicy {
    retries: 2,
    first_delay: Duration::from_millis(500),
    max_delay: Duration::from_secs(2),
};

/// A tag to look up, and how.
#[derive(Clone, Debug)]
pub struct TagLookup {
    /// `http` or `https`.
    pub scheme: String,
    /// `host[:port]`.
    pub host: String,
    /// The repository, e.g. `os/metropolis`.
    pub repository: String,
    /// The tag.
    pub tag: String,
    /// `--registry-auth`: a Docker `config.json` with logins.
    pub auth_file: Option<PathBuf>,
    /// `--registry-ca`: CA certificates to trust besides the system's.
    pub ca_files: Vec<PathBuf>,
    /// How long connecting may take.
    pub connect_limit: Duration,
}

impl TagLookup {
    /// `HOST/REPOSITORY:TAG`, as the operator wrote it.
    pub fn name(&self) -> String {
        format!("{}/{}:{}", self.host, self.repository, self.tag)
    }
}

/// What to say of a registry that answered the TLS handshake in plain
/// HTTP: how to write the reference, `path` (`REPOSITORY[:TAG]`) on it,
/// instead.
pub fn plain_http(registry: &str, path: &str) -> String {
    format!(
        "registry {registry} answered the TLS handshake in plain HTTP: this registry speaks \
         plain HTTP: write http://{registry}/{path}"
    )
}

/// The failure a registry error is while looking up `lookup`, naming
/// `--image` and what to do.
fn failure(lookup: &TagLookup, e: RegistryError) -> CliError {
    let full = lookup.name();
    let name = quoted(&full);
    let (exit, hint) = match &e {
        RegistryError::PlainHttp { registry } => {
            return failed(
                Exit::Failure,
                format!(
                    "--image {name}: {} (nothing was submitted)",
                    plain_http(registry, &format!("{}:{}", lookup.repository, lookup.tag))
                ),
            );
        }
        RegistryError::Unauthorized { .. } => (
            Exit::Denied,
            "; give --registry-auth FILE with a login that may pull it",
        ),
        RegistryError::Status {
            status: 401 | 403, ..
        } => (
            Exit::Denied,
            "; give --registry-auth FILE with a login that may pull it",
        ),
        RegistryError::Status { status, .. } if *status >= 500 => (Exit::Unavailable, ""),
        RegistryError::Unreachable { .. } => (Exit::Unavailable, ""),
        RegistryError::Tls { .. } => (
            Exit::Failure,
            "; a registry with a private CA needs --registry-ca FILE",
        ),
        _ => (Exit::Failure, ""),
    };
    failed(
        exit,
        format!("--image {name}: resolving the tag: {e}{hint} (nothing was submitted)"),
    )
}

/// The registry client of a lookup: for `https`, the system's roots and
/// `--registry-ca`'s.
fn client(lookup: &TagLookup) -> Result<Client, CliError> {
    let ca: Vec<&Path> = lookup.ca_files.iter().map(PathBuf::as_path).collect();
    let io = lookup.connect_limit.max(Duration::from_secs(1));
    registry_client(&lookup.scheme, &ca, lookup.connect_limit, io, io * 2)
}

/// The registry client metroctl uses for `scheme` (`https`: trusting the
/// system's roots and the `--registry-ca` files `ca`), with its time
/// limits; a CA file that cannot be used names `--registry-ca`.
pub(super) fn registry_client(
    scheme: &str,
    ca: &[&Path],
    connect_timeout: Duration,
    io_timeout: Duration,
    deadline: Duration,
) -> Result<Client, CliError> {
    let tls = if scheme == "https" {
        let tls = registry_tls(true, ca).map_err(|e| {
            if ca.is_empty() {
                failed(Exit::Failure, format!("TLS: {e}; give --registry-ca FILE"))
            } else {
                usage(format!("--registry-ca {e}"))
            }
        })?;
        Some(tls.config)
    } else {
        None
    };
    Ok(Client {
        tls,
        connect_timeout,
        io_timeout,
        deadline,
        user_agent: concat!("metroctl/", env!("CARGO_PKG_VERSION")),
        retry: RETRY,
    })
}

/// The logins of `--registry-auth` (`auth_file`), or none.
pub(super) fn registry_credentials(
    auth_file: Option<&Path>,
) -> Result<RegistryCredentials, CliError> {
    match auth_file {
        Some(path) => {
            RegistryCredentials::read(path).map_err(|e| usage(format!("--registry-auth {e}")))
        }
        None => Ok(RegistryCredentials::new()),
    }
}

/// Looks `lookup.tag` up in its repository and returns the digest of the
/// manifest the registry serves for it (`sha256:<hex>` of the bytes, as
/// the agent verifies them). Blocking: one request, tried again for a
/// passing failure.
pub fn resolve(lookup: &TagLookup) -> Result<String, CliError> {
    let credentials = registry_credentials(lookup.auth_file.as_deref())?;
    let client = client(lookup)?;
    let base = Url::parse(&format!("{}://{}/", lookup.scheme, lookup.host))
        .map_err(|e| usage(format!("--image {}: {e}", quoted(&lookup.host))))?;
    let notice = |said: &str| eprintln!("metroctl: {said}");
    let mut session = Session::new(
        &client,
        &credentials,
        &base,
        &lookup.repository,
        Access::Pull,
    )
    .telling(&notice);
    let url = base
        .with_target(&format!(
            "/v2/{}/manifests/{}",
            lookup.repository, lookup.tag
        ))
        .map_err(|e| usage(format!("--image {}: {e}", quoted(&lookup.name()))))?;
    let bytes = match session
        .get_whole(&url, Some(ACCEPT), MAX_MANIFEST_BYTES)
        .map_err(|e| failure(lookup, e))?
    {
        Whole::Body { bytes, .. } => bytes,
        Whole::TooLarge(_) => {
            return Err(failed(
                Exit::Failure,
                format!(
                    "--image {}: the manifest is larger than {MAX_MANIFEST_BYTES} bytes, more \
                     than the agent reads (nothing was submitted)",
                    quoted(&lookup.name())
                ),
            ));
        }
        Whole::Status(response) if response.status == 404 => {
            return Err(failed(
                Exit::NotFound,
                format!(
                    "--image {}: the registry has no tag {} in {} (push it with `metroctl \
                     osimage push`, or name the image by digest: …@sha256:DIGEST); nothing \
                     was submitted",
                    quoted(&lookup.name()),
                    quoted(&lookup.tag),
                    quoted(&lookup.repository)
                ),
            ));
        }
        Whole::Status(response) => return Err(failure(lookup, RegistryError::status(response))),
    };
    use sha2::Digest as _;
    Ok(digest_of(&sha2::Sha256::digest(&bytes)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_http_says_how_to_write_the_reference() {
        let said = plain_http("127.0.0.1:5000", "os/trial:v2");
        assert!(said.contains("speaks plain HTTP"), "{said}");
        assert!(
            said.ends_with("write http://127.0.0.1:5000/os/trial:v2"),
            "{said}"
        );
    }
}
