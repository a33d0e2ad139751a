//! Lowercase hex, the one encoder of the workspace: digests, fingerprints
//! and keys in names and messages. Every crate that writes hex depends on
//! `core` already, so it lives here.

use std::fmt;

/// The lowercase hex of `bytes`, two digits per byte.
pub fn encode(bytes: &[u8]) -> String {
    Hex(bytes).to_string()
}

/// `bytes` written as lowercase hex when displayed (see [`encode`]), for
/// `write!` and log fields without a `String` in between.
#[derive(Clone, Copy)]
pub struct Hex<'a>(pub &'a [u8]);

impl fmt::Display for Hex<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl fmt::Debug for Hex<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lowercase_two_digits_per_byte() {
        assert_eq!(encode(&[]), "");
        assert_eq!(encode(&[0x00, 0x0f, 0xa5, 0xff]), "000fa5ff");
        assert_eq!(format!("key {}", Hex(&[0xde, 0xad])), "key dead");
    }
}
