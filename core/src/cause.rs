//! Errors of libraries, told to people: what broke, in one line, without
//! the `Debug` dump of a library's error.
//!
//! A connection error typically arrives wrapped several times (a gRPC
//! status around an HTTP/2 error around an I/O error around a TLS alert),
//! and the outer layers' messages are either terse ("error reading a body
//! from connection") or a `Debug` rendering of the inner ones. The
//! innermost cause's `Display` is the sentence worth showing.

use std::error::Error;

/// Longest text [`describe`] returns, in characters.
pub const MAX_CAUSE_CHARS: usize = 240;

/// `e`'s innermost cause (following [`Error::source`]), as its `Display`
/// says it, without a trailing documentation link (rustls ends some
/// messages with one), cut to [`MAX_CAUSE_CHARS`].
pub fn describe(e: &(dyn Error + 'static)) -> String {
    let mut innermost = e;
    while let Some(next) = innermost.source() {
        innermost = next;
    }
    let text = innermost.to_string();
    let text = match text.find(": https://") {
        Some(i) => &text[..i],
        None => text.as_str(),
    };
    match text.char_indices().nth(MAX_CAUSE_CHARS) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fmt;
    use std::io;

    /// An error whose `Display` is a dump of its cause, as some libraries
    /// render theirs.
    #[derive(Debug)]
    struct Wrapper(io::Error);

    impl fmt::Display for Wrapper {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "Wrapper({:?})", self.0)
        }
    }

    impl Error for Wrapper {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn the_innermost_cause_without_the_dump_or_the_link() {
        let io = io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "peer closed connection without sending TLS close_notify: \
             https://docs.rs/rustls/latest/rustls/manual/_03_howto/index.html#unexpected-eof",
        );
        let e = Wrapper(io);
        assert!(e.to_string().contains("Custom {"), "{e}");
        assert_eq!(
            describe(&e),
            "peer closed connection without sending TLS close_notify"
        );
    }

    #[test]
    fn long_causes_are_cut() {
        let e = io::Error::other("x".repeat(1000));
        let text = describe(&e);
        assert_eq!(text.chars().count(), MAX_CAUSE_CHARS + 1);
        assert!(text.ends_with('…'));
    }
}
