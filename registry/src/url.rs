//! Absolute `http`/`https` URLs as the registry client uses them: parsed
//! strictly (no credentials, no control characters), split into what a
//! request needs, and joined with a redirect's `Location`.

use std::fmt;

/// URL schemes the client speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheme {
    /// `http`.
    Http,
    /// `https`.
    Https,
}

/// An absolute `http`/`https` URL, split for a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Url {
    /// The scheme.
    pub scheme: Scheme,
    /// The authority as written (`host[:port]`, `[v6][:port]`), for the
    /// `Host` header and messages.
    pub authority: String,
    /// The host to connect to (without IPv6 brackets).
    pub host: String,
    /// The port (the scheme's default when the URL has none).
    pub port: u16,
    /// The request target: path and query, starting with `/`.
    pub target: String,
}

impl Url {
    /// Parses an absolute `http://` or `https://` URL. Userinfo is refused
    /// (no credentials in URLs), as are control characters; other bytes
    /// that may not appear in a request target are percent-encoded.
    pub fn parse(text: &str) -> Result<Url, String> {
        let Some((scheme, rest)) = text.split_once("://") else {
            return Err(format!("{text:?} is not an absolute URL"));
        };
        let scheme = match scheme.to_ascii_lowercase().as_str() {
            "http" => Scheme::Http,
            "https" => Scheme::Https,
            other => return Err(format!("{text:?}: scheme {other:?} is not http or https")),
        };
        let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let (authority, target) = rest.split_at(end);
        let (host, port) = parse_authority(authority, scheme)?;
        Ok(Url {
            scheme,
            authority: authority.to_string(),
            host,
            port,
            target: request_target(target)?,
        })
    }

    /// Whether `other` has the same scheme and authority (host and port).
    pub fn same_origin(&self, other: &Url) -> bool {
        self.scheme == other.scheme
            && self.host.eq_ignore_ascii_case(&other.host)
            && self.port == other.port
    }

    /// `self` with `name=value` appended to its query, both
    /// percent-encoded.
    pub fn with_query(&self, name: &str, value: &str) -> Url {
        let separator = if self.target.contains('?') { '&' } else { '?' };
        Url {
            target: format!(
                "{}{separator}{}={}",
                self.target,
                query_component(name),
                query_component(value)
            ),
            ..self.clone()
        }
    }

    /// `self` with the request target `target` (a path, optionally with a
    /// query, starting with `/`).
    pub fn with_target(&self, target: &str) -> Result<Url, String> {
        Ok(Url {
            target: request_target(target)?,
            ..self.clone()
        })
    }

    /// Resolves a `Location` header against `self`: an absolute URL, a
    /// scheme-relative `//authority/path`, an absolute path, or a path
    /// relative to the current one's directory (without dot-segment
    /// removal).
    pub fn join(&self, location: &str) -> Result<Url, String> {
        let location = location.trim();
        let lower = location.to_ascii_lowercase();
        if lower.starts_with("http://") || lower.starts_with("https://") {
            Url::parse(location)
        } else if let Some(rest) = location.strip_prefix("//") {
            let scheme = match self.scheme {
                Scheme::Http => "http",
                Scheme::Https => "https",
            };
            Url::parse(&format!("{scheme}://{rest}"))
        } else if location.starts_with('/') {
            self.with_target(location)
        } else if location.contains("://") || location.is_empty() {
            Err(format!("cannot follow a redirect to {location:?}"))
        } else {
            let path = self.target.split(['?', '#']).next().unwrap_or("/");
            let directory = &path[..path.rfind('/').map_or(0, |i| i + 1)];
            self.with_target(&format!("{directory}{location}"))
        }
    }
}

impl fmt::Display for Url {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = match self.scheme {
            Scheme::Http => "http",
            Scheme::Https => "https",
        };
        write!(f, "{scheme}://{}{}", self.authority, self.target)
    }
}

/// `(host, port)` of an authority; the host without IPv6 brackets.
fn parse_authority(authority: &str, scheme: Scheme) -> Result<(String, u16), String> {
    let default_port = match scheme {
        Scheme::Http => 80,
        Scheme::Https => 443,
    };
    if authority.is_empty() {
        return Err("the URL has no host".to_string());
    }
    if authority.contains('@') {
        return Err(format!(
            "{authority:?}: credentials in URLs are not supported"
        ));
    }
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let Some((host, after)) = rest.split_once(']') else {
            return Err(format!("{authority:?}: unterminated IPv6 address"));
        };
        if host.is_empty()
            || !host
                .bytes()
                .all(|b| b.is_ascii_hexdigit() || b == b':' || b == b'.')
        {
            return Err(format!("{authority:?}: malformed IPv6 address"));
        }
        match after {
            "" => (host, None),
            _ => match after.strip_prefix(':') {
                Some(port) => (host, Some(port)),
                None => return Err(format!("{authority:?}: garbage after the IPv6 address")),
            },
        }
    } else {
        match authority.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        }
    };
    let bracketed = authority.starts_with('[');
    let plain_host = host
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'));
    if host.is_empty() || (!bracketed && !plain_host) {
        return Err(format!("{authority:?}: malformed host"));
    }
    let port = match port {
        None => default_port,
        Some(text) => match text.parse::<u16>() {
            Ok(port) if port > 0 && text.bytes().all(|b| b.is_ascii_digit()) => port,
            _ => return Err(format!("{authority:?}: malformed port {text:?}")),
        },
    };
    Ok((host.to_string(), port))
}

/// `text` percent-encoded for a query: everything but RFC 3986's
/// unreserved characters.
fn query_component(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// A request target from a URL's path and query: the fragment dropped,
/// `/` when empty, bytes outside the printable ASCII range
/// percent-encoded, control characters refused.
fn request_target(raw: &str) -> Result<String, String> {
    let raw = raw.split('#').next().unwrap_or("");
    let mut target = String::with_capacity(raw.len() + 1);
    if !raw.starts_with('/') {
        target.push('/');
    }
    for byte in raw.bytes() {
        match byte {
            0x00..=0x1f | 0x7f => {
                return Err(format!("{raw:?}: control character in the URL path"));
            }
            b' ' | b'"' | b'<' | b'>' | b'\\' | b'^' | b'`' | b'{' | b'|' | b'}' | 0x80.. => {
                target.push_str(&format!("%{byte:02X}"));
            }
            _ => target.push(char::from(byte)),
        }
    }
    Ok(target)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let url = Url::parse("http://127.0.0.1:5000/v2/os/manifests/x?y=1#frag").unwrap();
        assert_eq!(url.host, "127.0.0.1");
        assert_eq!(url.port, 5000);
        assert_eq!(url.authority, "127.0.0.1:5000");
        assert_eq!(url.target, "/v2/os/manifests/x?y=1");
        assert_eq!(
            url.to_string(),
            "http://127.0.0.1:5000/v2/os/manifests/x?y=1"
        );

        let url = Url::parse("HTTPS://[::1]/a b").unwrap();
        assert_eq!((url.host.as_str(), url.port), ("::1", 443));
        assert_eq!(url.target, "/a%20b");
        let url = Url::parse("http://registry.example?q").unwrap();
        assert_eq!((url.port, url.target.as_str()), (80, "/?q"));

        for bad in [
            "ftp://host/",
            "host/path",
            "http:///path",
            "http://user:pw@host/",
            "http://host:0/",
            "http://host:99999/",
            "http://host:/",
            "http://[::1/",
            "http://[::1]x/",
            "http://ho st/",
            "http://host/a\r\nInjected: 1",
            "http://::1/",
        ] {
            assert!(Url::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn redirects_resolve() {
        let base = Url::parse("http://a:1/v2/r/blobs/sha256:x?q").unwrap();
        assert_eq!(
            base.join("/store/blob?sig=1").unwrap().to_string(),
            "http://a:1/store/blob?sig=1"
        );
        assert_eq!(
            base.join("other").unwrap().to_string(),
            "http://a:1/v2/r/blobs/other"
        );
        assert_eq!(base.join("//b:2/x").unwrap().to_string(), "http://b:2/x");
        assert_eq!(
            base.join("https://cdn.example/x").unwrap().to_string(),
            "https://cdn.example/x"
        );
        assert!(base.join("ftp://x/").is_err());
        assert!(base.same_origin(&Url::parse("http://A:1/other").unwrap()));
        assert!(!base.same_origin(&Url::parse("https://a:1/").unwrap()));
        assert!(!base.same_origin(&Url::parse("http://a:2/").unwrap()));
        let token = Url::parse("https://auth/token")
            .unwrap()
            .with_query("scope", "repository:os/x:pull")
            .with_query("service", "r e");
        assert_eq!(
            token.target,
            "/token?scope=repository%3Aos%2Fx%3Apull&service=r%20e"
        );
        assert!(base.join("").is_err());
    }
}
