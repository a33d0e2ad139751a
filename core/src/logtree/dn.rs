//! Validated log tree DNs.

use std::fmt;

/// The longest DN accepted, in bytes.
pub const MAX_DN_LEN: usize = 255;

/// A validated DN of the log tree, e.g. `root` or `root.curator`.
///
/// A DN is a dot-separated list of non-empty components, each made of
/// `[a-z0-9_-]`, at most [`MAX_DN_LEN`] bytes in total. DNs order as their
/// strings, so a DN's subtree is a contiguous range starting at the DN.
///
/// Above every DN is the tree's root, [`Dn::root`], the empty DN: a query
/// may name it (its subtree is the whole tree), but nothing is logged to
/// it, and [`Dn::parse`] never returns it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Dn(String);

/// Why a string is not a valid [`Dn`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DnError {
    /// The DN is empty.
    Empty,
    /// The DN is longer than [`MAX_DN_LEN`] bytes.
    TooLong {
        /// Its length in bytes.
        len: usize,
    },
    /// A component (between dots) is empty.
    EmptyComponent {
        /// Zero-based index of the component.
        index: usize,
    },
    /// A character outside `[a-z0-9_-]` and `.`.
    InvalidCharacter {
        /// Byte offset of the character.
        offset: usize,
        /// The character.
        ch: char,
    },
}

impl fmt::Display for DnError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DnError::Empty => write!(f, "dn: must not be empty"),
            DnError::TooLong { len } => {
                write!(f, "dn: {len} bytes long, at most {MAX_DN_LEN} allowed")
            }
            DnError::EmptyComponent { index } => {
                write!(
                    f,
                    "dn: component {index} is empty (components are dot-separated and non-empty)"
                )
            }
            DnError::InvalidCharacter { offset, ch } => write!(
                f,
                "dn: invalid character {ch:?} at byte {offset} (allowed: a-z, 0-9, '_', '-', and '.' between components)"
            ),
        }
    }
}

impl std::error::Error for DnError {}

impl Dn {
    /// Parses and validates a DN.
    pub fn parse(s: &str) -> Result<Dn, DnError> {
        if s.is_empty() {
            return Err(DnError::Empty);
        }
        if s.len() > MAX_DN_LEN {
            return Err(DnError::TooLong { len: s.len() });
        }
        for (offset, ch) in s.char_indices() {
            let ok = matches!(ch, 'a'..='z' | '0'..='9' | '_' | '-' | '.');
            if !ok {
                return Err(DnError::InvalidCharacter { offset, ch });
            }
        }
        if let Some(index) = s.split('.').position(str::is_empty) {
            return Err(DnError::EmptyComponent { index });
        }
        Ok(Dn(s.to_owned()))
    }

    /// The root of the tree: the empty DN, the ancestor of every other.
    pub fn root() -> Dn {
        Dn(String::new())
    }

    /// Whether this is [`Dn::root`].
    pub fn is_root(&self) -> bool {
        self.0.is_empty()
    }

    /// The DN as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether `self` is `other` or lies in `other`'s subtree: `root.a.b`
    /// is a descendant of `root.a` and of `root`, but not of `root.ab`.
    pub fn is_descendant_or_self(&self, other: &Dn) -> bool {
        if other.is_root() {
            return true;
        }
        match self.0.strip_prefix(other.0.as_str()) {
            Some(rest) => rest.is_empty() || rest.starts_with('.'),
            None => false,
        }
    }

    /// The parent DN (`root.a` for `root.a.b`), or `None` for a
    /// single-component DN.
    pub fn parent(&self) -> Option<Dn> {
        self.0.rfind('.').map(|i| Dn(self.0[..i].to_owned()))
    }
}

impl fmt::Display for Dn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}
