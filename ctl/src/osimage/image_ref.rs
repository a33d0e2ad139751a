//! `metroctl install request --image`: the OS image reference, by digest
//! (`…/REPOSITORY@sha256:DIGEST`) or by tag (`…/REPOSITORY:TAG`, looked
//! up through [`resolve`](super::resolve) before the request is
//! submitted, so that the agent always gets it by digest).

use std::path::PathBuf;

use metropolis_proto::prelude::debug as api;

use crate::CliError;
use crate::exit::usage;

/// Parses `http(s)://HOST[:PORT]/REPOSITORY@sha256:DIGEST` (with `tag`,
/// the `--tag` the agent fetches by) or `http(s)://HOST[:PORT]/REPOSITORY:TAG`.
/// An image by tag has an empty digest: [`resolve_image`] looks it up.
pub fn parse_image(image: &str, tag: Option<String>) -> Result<api::OsImageRef, CliError> {
    let shown = super::format::quoted(image);
    let bad = |why: &str| {
        usage(format!(
            "--image {shown}: {why} (expected http(s)://HOST/REPOSITORY@sha256:DIGEST or \
             http(s)://HOST/REPOSITORY:TAG)"
        ))
    };
    let (scheme, rest) = image.split_once("://").ok_or_else(|| bad("no scheme"))?;
    if scheme != "http" && scheme != "https" {
        return Err(bad("the scheme must be http or https"));
    }
    let (host, path) = rest.split_once('/').ok_or_else(|| bad("no repository"))?;
    let Some((repository, digest)) = path.rsplit_once('@') else {
        return parse_tagged(scheme, host, path, tag, &bad);
    };
    if repository
        .rsplit('/')
        .next()
        .is_some_and(|last| last.contains(':'))
    {
        return Err(bad(
            "give either :TAG or @sha256:DIGEST, not both (with a digest, --tag TAG names the \
             tag the agent fetches)",
        ));
    }
    let hexpart = digest
        .strip_prefix("sha256:")
        .ok_or_else(|| bad("the digest must start with sha256:"))?;
    if hexpart.len() != 64
        || !hexpart
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
    {
        return Err(bad(
            "the digest must be sha256: and 64 lowercase hexadecimal characters",
        ));
    }
    if host.is_empty() || repository.is_empty() {
        return Err(bad("empty host or repository"));
    }
    Ok(api::OsImageRef {
        scheme: scheme.into(),
        host: host.into(),
        repository: repository.into(),
        tag: tag.unwrap_or_default(),
        digest: digest.into(),
    })
}

/// `REPOSITORY:TAG` of an image by tag: its reference, digest empty.
fn parse_tagged(
    scheme: &str,
    host: &str,
    path: &str,
    tag: Option<String>,
    bad: &dyn Fn(&str) -> CliError,
) -> Result<api::OsImageRef, CliError> {
    use super::reference::{is_repository, is_tag};
    let (repository, image_tag) = match path.rsplit_once(':') {
        Some((repository, t)) if !t.contains('/') => (repository, t),
        _ => return Err(bad("no :TAG or @sha256:DIGEST")),
    };
    if tag.is_some() {
        return Err(bad(
            "--tag goes with an image by digest; an image by tag is looked up and requested by \
             its digest",
        ));
    }
    if host.is_empty() || !is_repository(repository) {
        return Err(bad(
            "empty host, or the repository is not lowercase letters and digits separated by \
             '.', '_', '__', '-' or '/'",
        ));
    }
    if !is_tag(image_tag) {
        return Err(bad(
            "the tag must be letters, digits, '_', '.' and '-', at most 128, not starting \
             with '.' or '-'",
        ));
    }
    Ok(api::OsImageRef {
        scheme: scheme.into(),
        host: host.into(),
        repository: repository.into(),
        tag: image_tag.into(),
        digest: String::new(),
    })
}

/// An image by tag (an empty digest) looked up through the registry
/// client with `--registry-auth` and `--registry-ca`: the reference the
/// agent gets names the digest and no tag. An image by digest is
/// returned as it is.
pub async fn resolve_image(
    image: api::OsImageRef,
    registry_auth: Option<PathBuf>,
    registry_ca: Vec<PathBuf>,
) -> Result<(api::OsImageRef, Option<String>), CliError> {
    use super::resolve::{TagLookup, resolve};
    if !image.digest.is_empty() {
        return Ok((image, None));
    }
    let lookup = TagLookup {
        scheme: image.scheme.clone(),
        host: image.host.clone(),
        repository: image.repository.clone(),
        tag: image.tag.clone(),
        auth_file: registry_auth,
        ca_files: registry_ca,
        connect_limit: std::time::Duration::from_secs(10),
    };
    // The registry client blocks: one lookup, on a thread of its own.
    let digest = tokio::task::spawn_blocking(move || resolve(&lookup))
        .await
        .map_err(|e| format!("the tag lookup failed: {e}"))??;
    let tag = image.tag.clone();
    Ok((
        api::OsImageRef {
            tag: String::new(),
            digest,
            ..image
        },
        Some(tag),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_references() {
        let d = "a".repeat(64);
        let r = parse_image(
            &format!("http://127.0.0.1:5000/os/metropolis@sha256:{d}"),
            None,
        )
        .expect("valid");
        assert_eq!(
            (r.scheme.as_str(), r.host.as_str(), r.repository.as_str()),
            ("http", "127.0.0.1:5000", "os/metropolis")
        );
        assert_eq!(r.digest, format!("sha256:{d}"));
        for bad in [
            "ftp://h/r@sha256:x",
            "http://h@sha256:aa",
            "http://h/r",
            &format!("http://h/r@md5:{d}"),
        ] {
            assert!(parse_image(bad, None).is_err(), "{bad}");
        }
    }

    #[test]
    fn images_by_tag_leave_the_digest_to_the_lookup() {
        let r = parse_image("https://127.0.0.1:5000/os/trial:v2", None).expect("valid");
        assert_eq!(
            (r.repository.as_str(), r.tag.as_str(), r.digest.as_str()),
            ("os/trial", "v2", "")
        );
        let message = |image: &str, tag: Option<&str>| {
            parse_image(image, tag.map(str::to_owned))
                .expect_err(image)
                .to_string()
        };
        let d = "a".repeat(64);
        for (image, tag, why) in [
            ("http://h/os/trial:v2", Some("v3"), "--tag goes with"),
            ("http://h/Os/trial:v2", None, "repository"),
            ("http://h/os/trial:-v2", None, "the tag must be"),
            (
                &format!("http://h/os/trial:v2@sha256:{d}"),
                None,
                "not both",
            ),
            ("http://h:5000/os/trial", None, "no :TAG or @sha256:DIGEST"),
        ] {
            let said = message(image, tag);
            assert!(
                said.contains("--image") && said.contains(why),
                "{image}: {said}"
            );
        }
    }
}
