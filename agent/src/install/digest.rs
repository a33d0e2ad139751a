//! SHA-256 content digests as OCI writes them: `sha256:<64 lowercase hex>`.

use std::fmt;

use sha2::{Digest as _, Sha256};

/// A SHA-256 digest.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Digest([u8; 32]);

impl Digest {
    /// Parses `sha256:<64 lowercase hex>` (the only form the OCI image
    /// specification allows for SHA-256); the error says what is wrong.
    pub(crate) fn parse(text: &str) -> Result<Digest, String> {
        // Quoted cut: the text comes from a registry.
        let quoted = metropolis_registry::bounded(text);
        let Some((algorithm, encoded)) = text.split_once(':') else {
            return Err(format!("{quoted:?} is not a digest (algorithm:hex)"));
        };
        if algorithm != "sha256" {
            return Err(format!(
                "{quoted:?}: only sha256 digests are supported, not {:?}",
                metropolis_registry::bounded(algorithm)
            ));
        }
        let bytes = encoded.as_bytes();
        if bytes.len() != 64 {
            return Err(format!(
                "{quoted:?}: a sha256 digest has 64 hexadecimal digits, not {}",
                bytes.len()
            ));
        }
        let mut digest = [0u8; 32];
        for (i, pair) in bytes.chunks_exact(2).enumerate() {
            match (hex_value(pair[0]), hex_value(pair[1])) {
                (Some(high), Some(low)) => digest[i] = high << 4 | low,
                _ => {
                    return Err(format!(
                        "{quoted:?}: a sha256 digest is lowercase hexadecimal"
                    ));
                }
            }
        }
        Ok(Digest(digest))
    }
}

fn hex_value(digit: u8) -> Option<u8> {
    match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'a'..=b'f' => Some(digit - b'a' + 10),
        _ => None,
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("sha256:")?;
        for byte in self.0 {
            write!(f, "{byte:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// A running SHA-256 over a byte stream, with its length.
#[derive(Clone, Default)]
pub(crate) struct Hasher {
    sha: Sha256,
}

impl Hasher {
    /// Adds `data`.
    pub(crate) fn update(&mut self, data: &[u8]) {
        self.sha.update(data);
    }

    /// The digest of everything added.
    pub(crate) fn finish(self) -> Digest {
        Digest(self.sha.finalize().into())
    }
}

/// The digest of `data`.
pub(crate) fn digest_of(data: &[u8]) -> Digest {
    let mut hasher = Hasher::default();
    hasher.update(data);
    hasher.finish()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const EMPTY: &str = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

    #[test]
    fn round_trip_and_known_value() {
        assert_eq!(digest_of(b"").to_string(), EMPTY);
        assert_eq!(Digest::parse(EMPTY), Ok(digest_of(b"")));
    }

    #[test]
    fn rejects_malformed() {
        for bad in [
            "",
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
            "sha512:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
            "sha256:e3b0",
            "sha256:E3B0C44298FC1C149AFBF4C8996FB92427AE41E4649B934CA495991B7852B855",
            "sha256:g3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b85é",
        ] {
            assert!(Digest::parse(bad).is_err(), "{bad:?}");
        }
    }
}
