//! A checked image reference: the registry's base URL, the repository,
//! the tag if any and the manifest digest the request names.

use metropolis_core::quote::quoted;
use metropolis_proto::prelude::debug::OsImageRef;

use super::InstallError;
use super::digest::Digest;
use metropolis_registry::{Scheme, Url};

/// A checked image reference.
pub(super) struct Reference {
    pub(super) base: Url,
    pub(super) repository: String,
    pub(super) tag: Option<String>,
    pub(super) digest: Digest,
}

impl Reference {
    pub(super) fn parse(image: &OsImageRef, have_tls: bool) -> Result<Reference, InstallError> {
        let scheme = match image.scheme.as_str() {
            "http" => Scheme::Http,
            "https" if have_tls => Scheme::Https,
            "https" => {
                return Err(InstallError::Unsupported {
                    what: format!(
                        "https registry {}: the installer has no TLS configuration to trust it with",
                        quoted(&image.host)
                    ),
                });
            }
            other => {
                return Err(InstallError::InvalidRequest {
                    field: "os_image.scheme",
                    problem: format!("{} is not http or https", quoted(other)),
                });
            }
        };
        let base = Url::parse(&format!("{}://{}/", image.scheme, image.host))
            .ok()
            .filter(|url| url.authority == image.host)
            .ok_or_else(|| InstallError::InvalidRequest {
                field: "os_image.host",
                problem: format!("{} is not host[:port]", quoted(&image.host)),
            })?;
        debug_assert_eq!(base.scheme, scheme);
        check_repository(&image.repository)?;
        let tag = if image.tag.is_empty() {
            None
        } else {
            check_tag(&image.tag)?;
            Some(image.tag.clone())
        };
        if image.digest.is_empty() {
            return Err(InstallError::InvalidRequest {
                field: "os_image.digest",
                problem: "missing (the manifest digest is required)".to_string(),
            });
        }
        let digest =
            Digest::parse(&image.digest).map_err(|problem| InstallError::InvalidRequest {
                field: "os_image.digest",
                problem,
            })?;
        Ok(Reference {
            base,
            repository: image.repository.clone(),
            tag,
            digest,
        })
    }

    pub(super) fn url(&self, kind: &str, reference: &str) -> Result<Url, InstallError> {
        let target = format!("/v2/{}/{kind}/{reference}", self.repository);
        self.base
            .with_target(&target)
            .map_err(|problem| InstallError::InvalidRequest {
                field: "os_image",
                problem,
            })
    }

    /// The image as `host/repository[:tag]@digest`.
    pub(super) fn name(&self) -> String {
        match &self.tag {
            Some(tag) => format!(
                "{}/{}:{tag}@{}",
                self.base.authority, self.repository, self.digest
            ),
            None => format!(
                "{}/{}@{}",
                self.base.authority, self.repository, self.digest
            ),
        }
    }
}

/// Checks a repository name against the OCI distribution grammar:
/// `/`-separated components of lowercase letters and digits, joined by
/// single separators `.`, `_`, `__` or runs of `-`.
fn check_repository(repository: &str) -> Result<(), InstallError> {
    let invalid = |problem: String| InstallError::InvalidRequest {
        field: "os_image.repository",
        problem,
    };
    if repository.is_empty() {
        return Err(invalid("missing".to_string()));
    }
    if repository.len() > 255 {
        return Err(invalid("longer than 255 characters".to_string()));
    }
    for component in repository.split('/') {
        let bytes = component.as_bytes();
        let alnum = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
        let well_formed = bytes.first().is_some_and(alnum)
            && bytes.last().is_some_and(alnum)
            && bytes
                .iter()
                .all(|b| alnum(b) || matches!(b, b'.' | b'_' | b'-'))
            && !component.contains("..")
            && !component.contains("___")
            && !component.contains("._")
            && !component.contains("_.")
            && !component.contains(".-")
            && !component.contains("-.")
            && !component.contains("_-")
            && !component.contains("-_");
        if !well_formed {
            return Err(invalid(format!(
                "{} is not a repository name (lowercase letters and digits, separated by '.', '_', '__', '-' or '/')",
                quoted(repository)
            )));
        }
    }
    Ok(())
}

/// Checks a tag: `[A-Za-z0-9_][A-Za-z0-9._-]{0,127}`.
fn check_tag(tag: &str) -> Result<(), InstallError> {
    let bytes = tag.as_bytes();
    let well_formed = bytes.len() <= 128
        && bytes
            .first()
            .is_some_and(|b| b.is_ascii_alphanumeric() || *b == b'_')
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if well_formed {
        Ok(())
    } else {
        Err(InstallError::InvalidRequest {
            field: "os_image.tag",
            problem: format!("{} is not a tag", quoted(tag)),
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn repository_names() {
        for good in ["os", "metropolis/node", "a.b_c__d---e/f0", "x/y/z"] {
            assert!(check_repository(good).is_ok(), "{good}");
        }
        for bad in [
            "", "OS", "a//b", "/a", "a/", "-a", "a-", "a..b", "a___b", "a b", "../x", "a?b", "a%2f",
        ] {
            assert!(check_repository(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn tags() {
        for good in ["latest", "v1.2.3", "_x", "A-b_c.d"] {
            assert!(check_tag(good).is_ok(), "{good}");
        }
        for bad in [".x", "-x", "a/b", "a:b", &"x".repeat(129)] {
            assert!(check_tag(bad).is_err(), "{bad}");
        }
    }
}
