//! Image names normalised as Docker and containerd do, to compare the
//! names in an archive with those a store already has.

/// The default registry of names without one.
const DEFAULT_DOMAIN: &str = "docker.io";
/// Docker's old name for it.
const LEGACY_DEFAULT_DOMAIN: &str = "index.docker.io";

/// Normalises an image reference: `busybox` ->
/// `docker.io/library/busybox:latest`, `foo/bar:1` -> `docker.io/foo/bar:1`,
/// `registry:5000/x` -> `registry:5000/x:latest`; a digest is kept
/// (`x@sha256:…` gets no tag). The first component is a registry when it
/// has a `.` or `:`, is `localhost`, or has an upper-case letter, as in
/// Docker's reference library. `None` for what is not a reference (empty
/// parts, upper case in the repository, a bad tag).
pub fn normalize(reference: &str) -> Option<String> {
    let (name_tag, digest) = match reference.split_once('@') {
        Some((n, d)) => (n, Some(d)),
        None => (reference, None),
    };
    let (domain, rest) = split_domain(name_tag);
    let rest: &str = &rest;
    let last = rest.rfind('/').map_or(0, |i| i + 1);
    let (path, tag) = match rest[last..].find(':') {
        Some(j) => (&rest[..last + j], Some(&rest[last + j + 1..])),
        None => (rest, None),
    };
    if domain.is_empty() || !valid_path(path) || !tag.is_none_or(valid_tag) {
        return None;
    }
    if let Some(d) = digest
        && !valid_digest(d)
    {
        return None;
    }
    let mut out = format!("{domain}/{path}");
    if let Some(tag) = tag {
        out.push(':');
        out.push_str(tag);
    }
    match digest {
        Some(d) => {
            out.push('@');
            out.push_str(d);
        }
        None if tag.is_none() => out.push_str(":latest"),
        None => {}
    }
    Some(out)
}

/// Splits off the registry, defaulting it (and `library/` for official
/// images).
fn split_domain(name: &str) -> (&str, std::borrow::Cow<'_, str>) {
    let (domain, rest) = match name.split_once('/') {
        Some((first, rest))
            if first.contains(['.', ':'])
                || first == "localhost"
                || first.chars().any(|c| c.is_ascii_uppercase()) =>
        {
            (first, rest)
        }
        _ => (DEFAULT_DOMAIN, name),
    };
    let domain = if domain == LEGACY_DEFAULT_DOMAIN {
        DEFAULT_DOMAIN
    } else {
        domain
    };
    if domain == DEFAULT_DOMAIN && !rest.contains('/') {
        (domain, format!("library/{rest}").into())
    } else {
        (domain, rest.into())
    }
}

fn valid_path(path: &str) -> bool {
    !path.is_empty()
        && path.split('/').all(|c| {
            !c.is_empty()
                && c.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
        })
}

fn valid_tag(tag: &str) -> bool {
    let bytes = tag.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 128
        && bytes[0] != b'.'
        && bytes[0] != b'-'
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(b))
}

fn valid_digest(digest: &str) -> bool {
    digest.split_once(':').is_some_and(|(alg, hex)| {
        !alg.is_empty() && hex.len() >= 32 && hex.bytes().all(|b| b.is_ascii_hexdigit())
    })
}

#[cfg(test)]
mod tests {
    use super::normalize;

    #[test]
    fn normalises_like_docker() {
        let digest = format!("sha256:{}", "ab".repeat(32));
        let cases = [
            ("busybox", "docker.io/library/busybox:latest".to_owned()),
            ("busybox:1.36", "docker.io/library/busybox:1.36".to_owned()),
            ("foo/bar:1", "docker.io/foo/bar:1".to_owned()),
            (
                "docker.io/busybox",
                "docker.io/library/busybox:latest".to_owned(),
            ),
            (
                "index.docker.io/foo/bar",
                "docker.io/foo/bar:latest".to_owned(),
            ),
            ("registry:5000/x", "registry:5000/x:latest".to_owned()),
            ("localhost/x:2", "localhost/x:2".to_owned()),
            ("quay.io/a/b/c:v1", "quay.io/a/b/c:v1".to_owned()),
            (
                &*format!("busybox@{digest}"),
                format!("docker.io/library/busybox@{digest}"),
            ),
            (&*format!("r.io/x:1@{digest}"), format!("r.io/x:1@{digest}")),
            (
                "docker.io/library/busybox:latest",
                "docker.io/library/busybox:latest".to_owned(),
            ),
        ];
        for (input, want) in cases {
            assert_eq!(normalize(input).as_deref(), Some(&*want), "{input}");
        }
    }

    #[test]
    fn rejects_what_is_not_a_reference() {
        for bad in [
            "",
            "Busybox",
            "a//b",
            "x:",
            "x:-tag",
            "x@sha256:zz",
            "/x",
            "r.io/",
        ] {
            assert_eq!(normalize(bad), None, "{bad}");
        }
    }
}
