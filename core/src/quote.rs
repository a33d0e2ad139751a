//! Quoting caller input in error messages: a bounded prefix, never the
//! whole input.
//!
//! A gRPC status message travels in the `grpc-message` header or trailer,
//! percent-encoded (which triples every `%` and non-ASCII byte); most
//! clients refuse headers beyond 8–16 KiB. So a message quotes at most
//! [`QUOTE_CHARS`] characters of what the caller sent, with its full length
//! when it was cut, and the router caps every `grpc-message` at
//! [`MAX_STATUS_MESSAGE_BYTES`] as a last resort.

use std::fmt;

/// Characters of caller input an error message quotes at most.
pub const QUOTE_CHARS: usize = 64;

/// Longest `grpc-message` value (after percent-encoding) a response
/// carries.
pub const MAX_STATUS_MESSAGE_BYTES: usize = 1024;

/// `s` quoted (as `{:?}` would) to at most [`QUOTE_CHARS`] characters,
/// followed by its length in bytes when it was cut.
pub fn quoted(s: &str) -> Quoted<'_> {
    Quoted(s)
}

/// At most [`QUOTE_CHARS`] characters of `s`, unquoted, with `…` appended
/// when it was cut: for an error that keeps caller input as a field (and
/// quotes it with `{:?}` when displayed).
pub fn cut(s: &str) -> String {
    match cut_at(s) {
        None => s.to_owned(),
        Some(end) => format!("{}…", &s[..end]),
    }
}

/// The byte offset [`QUOTE_CHARS`] characters into `s`, if `s` is longer.
fn cut_at(s: &str) -> Option<usize> {
    s.char_indices().nth(QUOTE_CHARS).map(|(end, _)| end)
}

/// The bytes `b` as [`quoted`] text (lossy UTF-8).
pub fn quoted_bytes(b: &[u8]) -> String {
    let text = String::from_utf8_lossy(&b[..b.len().min(QUOTE_CHARS * 4)]);
    let shown: String = text.chars().take(QUOTE_CHARS).collect();
    if shown.len() == b.len() {
        format!("{shown:?}")
    } else {
        format!("{shown:?}… ({} bytes)", b.len())
    }
}

/// See [`quoted`].
#[derive(Clone, Copy)]
pub struct Quoted<'a>(&'a str);

impl fmt::Display for Quoted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match cut_at(self.0) {
            None => write!(f, "{:?}", self.0),
            Some(end) => write!(f, "{:?}… ({} bytes)", &self.0[..end], self.0.len()),
        }
    }
}

impl fmt::Debug for Quoted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// `value` (a percent-encoded `grpc-message`) cut to at most
/// [`MAX_STATUS_MESSAGE_BYTES`], never inside a `%XX` escape; None when it
/// is short enough already.
pub fn cap_encoded_message(value: &[u8]) -> Option<Vec<u8>> {
    if value.len() <= MAX_STATUS_MESSAGE_BYTES {
        return None;
    }
    // Room for the marker; the marker is itself percent-encoded ASCII.
    const MARKER: &[u8] = b"%E2%80%A6%20(cut)";
    let mut end = MAX_STATUS_MESSAGE_BYTES - MARKER.len();
    // Step back over a partial escape: a '%' in the last two bytes.
    if let Some(pos) = value[end.saturating_sub(2)..end]
        .iter()
        .position(|&b| b == b'%')
    {
        end = end.saturating_sub(2) + pos;
    }
    let mut out = value[..end].to_vec();
    out.extend_from_slice(MARKER);
    Some(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn short_input_is_quoted_whole() {
        assert_eq!(quoted("abc").to_string(), "\"abc\"");
        assert_eq!(quoted("").to_string(), "\"\"");
    }

    #[test]
    fn long_input_is_cut_with_its_length() {
        let long = "é".repeat(1_000_000);
        let shown = quoted(&long).to_string();
        assert!(shown.len() < 200, "{}", shown.len());
        assert!(shown.ends_with("(2000000 bytes)"), "{shown}");
        let shown = quoted_bytes(&[0xffu8; 100_000]);
        assert!(shown.len() < 400, "{}", shown.len());
        assert!(shown.ends_with("(100000 bytes)"), "{shown}");
    }

    #[test]
    fn cut_keeps_the_first_characters_unquoted() {
        assert_eq!(cut("abc"), "abc");
        let exact = "é".repeat(QUOTE_CHARS);
        assert_eq!(cut(&exact), exact);
        assert_eq!(
            cut(&"é".repeat(1000)),
            format!("{}…", "é".repeat(QUOTE_CHARS))
        );
    }

    #[test]
    fn capped_messages_never_split_an_escape() {
        for pad in 0..4 {
            let mut v = vec![b'a'; pad];
            while v.len() < 5000 {
                v.extend_from_slice(b"%C3%A9");
            }
            let capped = cap_encoded_message(&v).unwrap();
            assert!(capped.len() <= MAX_STATUS_MESSAGE_BYTES);
            let body = &capped[..capped.len() - b"%E2%80%A6%20(cut)".len()];
            // Every '%' is followed by two bytes.
            for (i, &b) in body.iter().enumerate() {
                if b == b'%' {
                    assert!(i + 2 < body.len(), "escape cut at {i} (pad {pad})");
                }
            }
        }
        assert!(cap_encoded_message(b"short").is_none());
    }
}
