//! Image names: validated and normalised the way Docker and containerd do
//! (`busybox` -> `docker.io/library/busybox:latest`), so the same image
//! gets the same name from a Docker archive's `RepoTags` and from a Docker
//! 25+ or containerd `io.containerd.image.name` annotation.
//!
//! Grammar (the distribution reference grammar): `[domain/]path[:tag][@digest]`
//! where the first `/`-separated component is a domain if it contains `.`
//! or `:`, is `localhost`, or has an upper-case letter; path components are
//! lower-case alphanumerics separated by `.`, `_`, `__` or dashes; a tag is
//! `[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}`. Without a domain the name is on
//! `docker.io` (`index.docker.io` is the same), where a one-component path
//! is under `library/`. Without a tag or digest the tag is `latest`.

/// Longest repository name (domain and path), as in Docker.
const MAX_NAME: usize = 255;

/// Validates and normalises an image reference the way Docker and
/// containerd do (`busybox` -> `docker.io/library/busybox:latest`); the
/// error says which part is invalid.
pub fn normalize(reference: &str) -> Result<String, &'static str> {
    if reference.is_empty() {
        return Err("empty");
    }
    let (rest, digest) = match reference.split_once('@') {
        Some((rest, digest)) => {
            if !valid_digest(digest) {
                return Err("invalid digest");
            }
            (rest, Some(digest))
        }
        None => (reference, None),
    };
    let last_slash = rest.rfind('/');
    let (name, tag) = match rest.rfind(':') {
        Some(colon) if last_slash.is_none_or(|s| colon > s) => {
            (&rest[..colon], Some(&rest[colon + 1..]))
        }
        _ => (rest, None),
    };
    if let Some(tag) = tag
        && !valid_tag(tag)
    {
        return Err("invalid tag");
    }
    let (domain, path) = match name.split_once('/') {
        Some((first, path))
            if first.contains(['.', ':'])
                || first == "localhost"
                || first.bytes().any(|b| b.is_ascii_uppercase()) =>
        {
            (first, path)
        }
        _ => ("docker.io", name),
    };
    if !valid_domain(domain) {
        return Err("invalid registry host");
    }
    let domain = if domain == "index.docker.io" {
        "docker.io"
    } else {
        domain
    };
    if path.is_empty() || !path.split('/').all(valid_component) {
        return Err(if path.bytes().any(|b| b.is_ascii_uppercase()) {
            "repository name must be lower-case"
        } else {
            "invalid repository name"
        });
    }
    let mut out = String::with_capacity(reference.len() + 24);
    out.push_str(domain);
    out.push('/');
    if domain == "docker.io" && !path.contains('/') {
        out.push_str("library/");
    }
    out.push_str(path);
    if out.len() > MAX_NAME {
        return Err("repository name longer than 255 bytes");
    }
    match (tag, digest) {
        (Some(tag), _) => {
            out.push(':');
            out.push_str(tag);
        }
        (None, None) => out.push_str(":latest"),
        (None, Some(_)) => {}
    }
    if let Some(digest) = digest {
        out.push('@');
        out.push_str(digest);
    }
    Ok(out)
}

/// `[a-z0-9]+` runs separated by `.`, `_`, `__` or one or more `-`.
fn valid_component(c: &str) -> bool {
    let b = c.as_bytes();
    let alnum = |x: u8| x.is_ascii_lowercase() || x.is_ascii_digit();
    let mut i = 0;
    loop {
        let start = i;
        while i < b.len() && alnum(b[i]) {
            i += 1;
        }
        if i == start {
            return false;
        }
        if i == b.len() {
            return true;
        }
        match b[i] {
            b'.' => i += 1,
            b'_' => {
                i += 1;
                if i < b.len() && b[i] == b'_' {
                    i += 1;
                }
            }
            b'-' => {
                while i < b.len() && b[i] == b'-' {
                    i += 1;
                }
            }
            _ => return false,
        }
    }
}

fn valid_tag(tag: &str) -> bool {
    let b = tag.as_bytes();
    let word = |x: u8| x.is_ascii_alphanumeric() || x == b'_';
    !b.is_empty()
        && b.len() <= 128
        && word(b[0])
        && b[1..].iter().all(|&x| word(x) || x == b'.' || x == b'-')
}

/// A host name or IP literal with an optional port.
fn valid_domain(domain: &str) -> bool {
    let (host, port) = if let Some(v6) = domain.strip_prefix('[') {
        let Some((addr, rest)) = v6.split_once(']') else {
            return false;
        };
        if addr.is_empty()
            || !addr
                .bytes()
                .all(|b| b.is_ascii_hexdigit() || b == b':' || b == b'.')
        {
            return false;
        }
        match rest {
            "" => return true,
            r => match r.strip_prefix(':') {
                Some(port) => ("x", Some(port)),
                None => return false,
            },
        }
    } else {
        match domain.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (domain, None),
        }
    };
    if let Some(port) = port
        && (port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()))
    {
        return false;
    }
    !host.is_empty()
        && host.split('.').all(|label| {
            let b = label.as_bytes();
            !b.is_empty()
                && b.iter().all(|&x| x.is_ascii_alphanumeric() || x == b'-')
                && b[0] != b'-'
                && b[b.len() - 1] != b'-'
        })
}

/// `algorithm:encoded` with the OCI grammar (any algorithm; at least 32
/// encoded characters).
fn valid_digest(digest: &str) -> bool {
    let Some((alg, encoded)) = digest.split_once(':') else {
        return false;
    };
    !alg.is_empty()
        && alg
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"+._-".contains(&b))
        && encoded.len() >= 32
        && encoded
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"=_-".contains(&b))
}

#[cfg(test)]
mod tests {
    use super::normalize;

    #[test]
    fn normalises_like_docker() {
        let cases = [
            ("busybox", "docker.io/library/busybox:latest"),
            ("busybox:1.36", "docker.io/library/busybox:1.36"),
            ("library/busybox:1", "docker.io/library/busybox:1"),
            ("index.docker.io/foo/bar", "docker.io/foo/bar:latest"),
            ("localhost/app:v1", "localhost/app:v1"),
            ("localhost:5000/app", "localhost:5000/app:latest"),
            (
                "registry.example.com/a/b-c__d.e:tag_1",
                "registry.example.com/a/b-c__d.e:tag_1",
            ),
            (
                "docker.io/library/busybox:latest",
                "docker.io/library/busybox:latest",
            ),
            ("[::1]:5000/x:y", "[::1]:5000/x:y"),
        ];
        for (input, want) in cases {
            assert_eq!(normalize(input).as_deref(), Ok(want), "{input}");
        }
        let digest = format!("busybox@sha256:{}", "a".repeat(64));
        assert_eq!(
            normalize(&digest),
            Ok(format!(
                "docker.io/library/busybox@sha256:{}",
                "a".repeat(64)
            ))
        );
    }

    #[test]
    fn rejects_invalid_names() {
        for bad in [
            "",
            "BusyBox",
            "busybox:",
            "busybox:-x",
            "a//b",
            "-a",
            "a-",
            "a..b",
            "a___b",
            "host:port/x",
            "busybox@sha256:xyz",
            ":latest",
            "a/b:c:d",
        ] {
            assert!(normalize(bad).is_err(), "{bad:?} accepted");
        }
    }

    // The cases the image stores rely on (moved from host's copy of this
    // normaliser, now removed).
    #[test]
    fn normalises_like_docker_and_containerd() {
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
            assert_eq!(normalize(input).as_deref(), Ok(&*want), "{input}");
        }
    }

    #[test]
    fn rejects_what_is_not_a_reference_either() {
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
            assert!(normalize(bad).is_err(), "{bad}");
        }
    }
}
