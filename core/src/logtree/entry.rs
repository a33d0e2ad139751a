//! Log entries and their conversion to `metropolis.proto.common.LogEntry`.

use metropolis_proto::prelude::common;

use super::Dn;

/// Fixed accounting cost of one retained entry, in bytes, on top of its
/// string bytes (see [`Entry::cost`]).
pub const ENTRY_OVERHEAD: usize = 64;

/// Severity of a leveled entry, ordered `Info < Warning < Error < Fatal`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Severity {
    /// Informational.
    Info,
    /// Something unexpected, but handled.
    Warning,
    /// An error.
    Error,
    /// An error after which the component stops.
    Fatal,
}

impl Severity {
    /// Converts from the wire enum value; `None` for `INVALID` and unknown
    /// values.
    pub fn from_proto(value: i32) -> Option<Severity> {
        match common::LeveledLogSeverity::try_from(value).ok()? {
            common::LeveledLogSeverity::Invalid => None,
            common::LeveledLogSeverity::Info => Some(Severity::Info),
            common::LeveledLogSeverity::Warning => Some(Severity::Warning),
            common::LeveledLogSeverity::Error => Some(Severity::Error),
            common::LeveledLogSeverity::Fatal => Some(Severity::Fatal),
        }
    }

    /// The wire enum value.
    pub fn to_proto(self) -> common::LeveledLogSeverity {
        match self {
            Severity::Info => common::LeveledLogSeverity::Info,
            Severity::Warning => common::LeveledLogSeverity::Warning,
            Severity::Error => common::LeveledLogSeverity::Error,
            Severity::Fatal => common::LeveledLogSeverity::Fatal,
        }
    }
}

/// The payload of an [`Entry`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EntryKind {
    /// A structured entry from a leveled logger.
    Leveled {
        /// The message, one string per line.
        lines: Vec<String>,
        /// When it was logged, in nanoseconds since the Unix epoch (given
        /// by the caller: the machine reads no clock).
        timestamp_unix_nanos: i64,
        /// Its severity.
        severity: Severity,
        /// Source location, e.g. `curator.rs:42`.
        location: String,
    },
    /// A line of unstructured output, e.g. of a child process.
    Raw {
        /// The (possibly truncated) line.
        data: String,
        /// The line's length before truncation, in bytes.
        original_length: i64,
    },
}

/// One log entry of a DN.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The DN that logged it.
    pub dn: Dn,
    /// The payload.
    pub kind: EntryKind,
}

impl Entry {
    /// Whether this is a leveled entry.
    pub fn is_leveled(&self) -> bool {
        matches!(self.kind, EntryKind::Leveled { .. })
    }

    /// The severity of a leveled entry, `None` for a raw one.
    pub fn severity(&self) -> Option<Severity> {
        match &self.kind {
            EntryKind::Leveled { severity, .. } => Some(*severity),
            EntryKind::Raw { .. } => None,
        }
    }

    /// The memory this entry is accounted for while retained: the bytes
    /// of its strings (DN, lines, location or data) plus
    /// [`ENTRY_OVERHEAD`].
    pub fn cost(&self) -> usize {
        let payload = match &self.kind {
            EntryKind::Leveled {
                lines, location, ..
            } => lines.iter().map(String::len).sum::<usize>() + location.len(),
            EntryKind::Raw { data, .. } => data.len(),
        };
        ENTRY_OVERHEAD + self.dn.as_str().len() + payload
    }

    /// Converts to the wire `LogEntry`.
    pub fn to_proto(&self) -> common::LogEntry {
        use common::log_entry::{Kind, Leveled, Raw};
        let kind = match &self.kind {
            EntryKind::Leveled {
                lines,
                timestamp_unix_nanos,
                severity,
                location,
            } => Kind::Leveled(Leveled {
                lines: lines.clone(),
                timestamp: Some(prost_types::Timestamp {
                    seconds: timestamp_unix_nanos.div_euclid(1_000_000_000),
                    // rem_euclid of a positive divisor lies in 0..1e9.
                    nanos: i32::try_from(timestamp_unix_nanos.rem_euclid(1_000_000_000))
                        .expect("remainder below 1e9 fits in i32"),
                }),
                severity: severity.to_proto() as i32,
                location: location.clone(),
            }),
            EntryKind::Raw {
                data,
                original_length,
            } => Kind::Raw(Raw {
                data: data.clone(),
                original_length: *original_length,
            }),
        };
        common::LogEntry {
            dn: self.dn.as_str().to_owned(),
            kind: Some(kind),
        }
    }
}

/// An entry together with the global sequence number it got on insert.
/// Sequence numbers start at 1 and increase by one per inserted entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sequenced {
    /// The global sequence number.
    pub seq: u64,
    /// The entry.
    pub entry: Entry,
}
