//! Machine IDs: UUIDs in every textual form the reference accepts,
//! normalised to one.
//!
//! The reference parses machine IDs with Go's `uuid.Parse`, which takes
//! four forms, hexadecimal digits in any case:
//!
//! - canonical, `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` (36 characters);
//! - 32 digits without dashes;
//! - the canonical form with `urn:uuid:` (any case) in front;
//! - the canonical form enclosed in one character on each side (38
//!   characters; meant for braces, and the enclosing characters are not
//!   checked).
//!
//! Every form becomes the lowercase canonical one, which is what is
//! stored and looked up, so a machine registered in one form matches an
//! agent heartbeating in another.

use std::fmt;

/// A machine ID in lowercase canonical form
/// (`xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MachineId(String);

/// Why a string is not a machine ID. Displays with the field name
/// `machine_id` and a bounded quote of the input.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MachineIdError {
    /// The input, quoted and cut (see [`crate::quote::quoted`]).
    quoted: String,
}

impl fmt::Display for MachineIdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "machine_id: {} is not a UUID (xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx, hexadecimal; \
             also accepted without dashes, in braces, or after urn:uuid:)",
            self.quoted
        )
    }
}

impl std::error::Error for MachineIdError {}

/// Positions of the dashes in the canonical form.
const DASHES: [usize; 4] = [8, 13, 18, 23];

impl MachineId {
    /// Parses `s` in any of the accepted forms.
    pub fn parse(s: &str) -> Result<MachineId, MachineIdError> {
        let error = || MachineIdError {
            quoted: crate::quote::quoted(s).to_string(),
        };
        let b = s.as_bytes();
        let canonical: &[u8] = match b.len() {
            32 => return Self::from_digits(b.iter().copied()).ok_or_else(error),
            36 => b,
            38 => &b[1..37],
            45 if b[..9].eq_ignore_ascii_case(b"urn:uuid:") => &b[9..],
            _ => return Err(error()),
        };
        if DASHES.iter().any(|&i| canonical[i] != b'-') {
            return Err(error());
        }
        let digits = canonical
            .iter()
            .enumerate()
            .filter(|(i, _)| !DASHES.contains(i))
            .map(|(_, c)| *c);
        Self::from_digits(digits).ok_or_else(error)
    }

    /// The canonical ID of 32 hexadecimal digits, `None` if one is not.
    fn from_digits(digits: impl Iterator<Item = u8>) -> Option<MachineId> {
        let mut out = String::with_capacity(36);
        for (i, c) in digits.enumerate() {
            if !c.is_ascii_hexdigit() {
                return None;
            }
            if DASHES.contains(&out.len()) {
                out.push('-');
            }
            debug_assert!(i < 32);
            out.push(char::from(c.to_ascii_lowercase()));
        }
        Some(MachineId(out))
    }

    /// The lowercase canonical form.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for MachineId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "0f8fad5b-d9cb-469f-a165-70867728950e";

    #[test]
    fn every_form_of_the_reference_normalises_to_canonical() {
        for form in [
            ID,
            "0F8FAD5B-D9CB-469F-A165-70867728950E",
            "0f8fad5bd9cb469fa16570867728950e",
            "0F8FAD5BD9CB469FA16570867728950E",
            "{0f8fad5b-d9cb-469f-a165-70867728950e}",
            "{0F8FAD5B-d9cb-469f-a165-70867728950E}",
            "urn:uuid:0f8fad5b-d9cb-469f-a165-70867728950e",
            "URN:UUID:0F8FAD5B-D9CB-469F-A165-70867728950E",
        ] {
            assert_eq!(MachineId::parse(form).map(|m| m.0), Ok(ID.into()), "{form}");
        }
    }

    #[test]
    fn everything_else_is_refused_naming_the_field() {
        for bad in [
            "",
            "0f8fad5b-d9cb-469f-a165-70867728950",
            "0f8fad5b-d9cb-469f-a165-70867728950g",
            "0f8fad5bd9cb469fa16570867728950",
            "0f8fad5b-d9cb-469f-a165-70867728950e0",
            "0f8fad5bd9cb-469f-a165-70867728950e-",
            "urn:uuix:0f8fad5b-d9cb-469f-a165-70867728950e",
            "{0f8fad5bd9cb469fa16570867728950e}",
            "0f8fad5b-d9cb-469f-a165-70867728950é",
            "0f8fad5b-d9cb-469f-a165-7086772895\u{e9}",
        ] {
            let e = MachineId::parse(bad).expect_err(bad);
            assert!(e.to_string().starts_with("machine_id: "), "{e}");
        }
        let long = "x".repeat(10_000);
        let e = MachineId::parse(&long).expect_err("too long");
        assert!(e.to_string().len() < 400, "{e}");
    }

    proptest::proptest! {
        #[test]
        fn parse_never_panics_and_yields_canonical(s in "\\PC{0,50}") {
            if let Ok(id) = MachineId::parse(&s) {
                proptest::prop_assert_eq!(MachineId::parse(id.as_str()), Ok(id.clone()));
                proptest::prop_assert_eq!(id.as_str().len(), 36);
            }
        }
    }
}
