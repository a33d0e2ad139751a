//! Where `metroctl osimage push` puts an image:
//! `[http://|https://]HOST[:PORT]/REPOSITORY[:TAG]`.

use super::format::quoted;

/// A parsed push reference.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reference {
    /// `http` or `https` (the default).
    pub scheme: &'static str,
    /// `host[:port]`.
    pub host: String,
    /// The repository, e.g. `os/metropolis`.
    pub repository: String,
    /// The tag, if one was given.
    pub tag: Option<String>,
}

/// Whether `c` is one path component of the OCI distribution name rule:
/// `[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*`.
fn is_component(c: &str) -> bool {
    let bytes = c.as_bytes();
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let (Some(&first), Some(&last)) = (bytes.first(), bytes.last()) else {
        return false;
    };
    if !alnum(first) || !alnum(last) {
        return false;
    }
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if alnum(b) {
            i += 1;
            continue;
        }
        // A separator: ".", "_", "__" or a run of "-", then alphanumerics.
        let run = bytes[i..].iter().take_while(|&&s| s == b).count();
        let ok = match b {
            b'.' => run == 1,
            b'_' => run <= 2,
            b'-' => true,
            _ => false,
        };
        if !ok {
            return false;
        }
        i += run;
    }
    true
}

/// Whether `name` follows the OCI distribution repository name rule.
pub fn is_repository(name: &str) -> bool {
    name.len() <= 255 && name.split('/').all(is_component)
}

/// Whether `tag` is `[a-zA-Z0-9_][a-zA-Z0-9._-]{0,127}`.
pub fn is_tag(tag: &str) -> bool {
    let ok = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    tag.len() <= 128
        && tag.as_bytes().first().is_some_and(|&b| ok(b))
        && tag.bytes().all(|b| ok(b) || b == b'.' || b == b'-')
}

/// Whether `host` is `name[:port]` or `[ipv6][:port]`.
fn is_host(host: &str) -> bool {
    let (name, port) = match host.strip_prefix('[') {
        Some(rest) => {
            let Some((ip, after)) = rest.split_once(']') else {
                return false;
            };
            if ip.parse::<std::net::Ipv6Addr>().is_err() {
                return false;
            }
            (None, after)
        }
        None => match host.find(':') {
            Some(i) => (Some(&host[..i]), &host[i..]),
            None => (Some(host), ""),
        },
    };
    let port_ok = port.is_empty()
        || port
            .strip_prefix(':')
            .is_some_and(|p| p.parse::<u16>().is_ok_and(|p| p > 0));
    let name_ok = name.is_none_or(|n| {
        !n.is_empty()
            && n.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-')
    });
    port_ok && name_ok
}

/// Parses `reference`; the error says what is wrong and what is expected.
pub fn parse(reference: &str) -> Result<Reference, String> {
    let bad = |why: &str| {
        format!(
            "REFERENCE {}: {why} (expected [http://|https://]HOST[:PORT]/REPOSITORY[:TAG], \
             e.g. registry.example:5000/os/metropolis:v1)",
            quoted(reference)
        )
    };
    let (scheme, rest) = match reference.split_once("://") {
        Some(("https", rest)) => ("https", rest),
        Some(("http", rest)) => ("http", rest),
        Some(_) => return Err(bad("the scheme must be http:// or https://")),
        None => ("https", reference),
    };
    let (host, path) = rest
        .split_once('/')
        .ok_or_else(|| bad("no /REPOSITORY after the host"))?;
    if !is_host(host) {
        return Err(bad("the host must be HOST or HOST:PORT"));
    }
    if path.contains('@') {
        return Err(bad(
            "a digest is not given: the image's digest is its manifest's",
        ));
    }
    let last = path.rfind('/').map_or(0, |i| i + 1);
    let (repository, tag) = match path[last..].find(':') {
        Some(i) => (&path[..last + i], Some(&path[last + i + 1..])),
        None => (path, None),
    };
    if !is_repository(repository) {
        return Err(bad(
            "the repository must be lowercase path components of [a-z0-9] joined by . _ __ or -",
        ));
    }
    if let Some(tag) = tag
        && !is_tag(tag)
    {
        return Err(bad(
            "the tag must be 1 to 128 characters of [A-Za-z0-9_.-], not starting with . or -",
        ));
    }
    Ok(Reference {
        scheme,
        host: host.to_string(),
        repository: repository.to_string(),
        tag: tag.map(str::to_string),
    })
}
