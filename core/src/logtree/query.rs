//! Validated `GetLogs` queries.

use std::fmt;
use std::num::NonZeroU64;

use metropolis_proto::prelude::{common, debug};

use super::{Dn, DnError, Entry, Severity};

/// Most filters a query may carry, as the reference allows.
pub const MAX_FILTERS: usize = 10;

/// Which entry kinds a query selects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KindFilter {
    /// Leveled and raw entries.
    Any,
    /// Only raw entries (`OnlyRaw`).
    OnlyRaw,
    /// Only leveled entries (`OnlyLeveled`).
    OnlyLeveled,
}

/// What a query returns from the retained entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backlog {
    /// Nothing (`BACKLOG_DISABLE`).
    Disable,
    /// Every retained matching entry (`BACKLOG_ALL`).
    All,
    /// The newest `n` retained matching entries (`BACKLOG_COUNT`).
    Count(NonZeroU64),
}

/// Whether the call goes on streaming after the backlog.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    /// The call ends after the backlog (`STREAM_DISABLE`).
    Disable,
    /// New matching entries are streamed as they arrive
    /// (`STREAM_UNBUFFERED`).
    Unbuffered,
}

/// A validated `GetLogsRequest`.
///
/// An entry matches when its DN is [`Query::dn`] (or, with
/// [`Query::with_children`], lies in its subtree), its kind passes
/// [`Query::kind`], and, if [`Query::min_severity`] is set, it is a
/// leveled entry of at least that severity.
///
/// Decision: `LeveledWithMinimumSeverity` also drops **raw** entries, since
/// they carry no severity that could meet the minimum. A client wanting raw
/// lines too issues a second query.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Query {
    /// The selected DN; [`Dn::root`] for an empty `dn`.
    pub dn: Dn,
    /// Whether the DN's subtree is included (`WithChildren`).
    pub with_children: bool,
    /// Which entry kinds are selected.
    pub kind: KindFilter,
    /// Minimum severity (`LeveledWithMinimumSeverity`); if several are
    /// given, the last one applies (as the reference).
    pub min_severity: Option<Severity>,
    /// The backlog mode.
    pub backlog: Backlog,
    /// The stream mode.
    pub stream: Stream,
}

/// Why a `GetLogs` query is rejected.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum QueryError {
    /// `dn` is not a valid DN.
    InvalidDn(DnError),
    /// `backlog_mode` is `BACKLOG_INVALID` or unknown.
    InvalidBacklogMode(i32),
    /// `backlog_count` is <= 0 with `BACKLOG_COUNT`.
    NonPositiveBacklogCount(i64),
    /// More than [`MAX_FILTERS`] filters.
    TooManyFilters(usize),
    /// `filters[index]` has no filter set.
    EmptyFilter {
        /// Index in `filters`.
        index: usize,
    },
    /// Both `OnlyRaw` and `OnlyLeveled` are given.
    ConflictingKindFilters,
    /// `filters[index]` has an invalid `minimum` severity.
    InvalidMinimumSeverity {
        /// Index in `filters`.
        index: usize,
        /// The value given.
        value: i32,
    },
}

impl fmt::Display for QueryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QueryError::InvalidDn(e) => write!(f, "{e}"),
            QueryError::InvalidBacklogMode(v) => write!(
                f,
                "backlog_mode: must be BACKLOG_DISABLE, BACKLOG_ALL or BACKLOG_COUNT, got {v}"
            ),
            QueryError::NonPositiveBacklogCount(v) => write!(
                f,
                "backlog_count: must be positive with BACKLOG_COUNT, got {v}"
            ),
            QueryError::TooManyFilters(n) => {
                write!(f, "filters: {n} given, at most {MAX_FILTERS} are accepted")
            }
            QueryError::EmptyFilter { index } => {
                write!(f, "filters[{index}]: a filter must be set")
            }
            QueryError::ConflictingKindFilters => {
                write!(f, "filters: OnlyRaw and OnlyLeveled cannot both be given")
            }
            QueryError::InvalidMinimumSeverity { index, value } => write!(
                f,
                "filters[{index}].minimum: must be INFO, WARNING, ERROR or FATAL, got {value}"
            ),
        }
    }
}

impl std::error::Error for QueryError {}

impl Query {
    /// Validates a request. Checks, in order: the number of filters,
    /// `dn`, `backlog_mode`, `backlog_count`, then each filter.
    ///
    /// As the reference: an empty `dn` is the root of the tree (with
    /// `WithChildren`, every entry); a `stream_mode` other than
    /// `STREAM_UNBUFFERED` (unset, or a value this build does not know)
    /// streams nothing. A DN never logged to is valid (its backlog is
    /// empty, and a stream waits for its first entries).
    pub fn from_request(req: &debug::GetLogsRequest) -> Result<Query, QueryError> {
        use common::log_filter::Filter;
        use debug::get_logs_request::{BacklogMode, StreamMode};

        if req.filters.len() > MAX_FILTERS {
            return Err(QueryError::TooManyFilters(req.filters.len()));
        }
        let dn = if req.dn.is_empty() {
            Dn::root()
        } else {
            Dn::parse(&req.dn).map_err(QueryError::InvalidDn)?
        };
        let backlog = match BacklogMode::try_from(req.backlog_mode) {
            Ok(BacklogMode::BacklogDisable) => Backlog::Disable,
            Ok(BacklogMode::BacklogAll) => Backlog::All,
            Ok(BacklogMode::BacklogCount) => {
                let n = u64::try_from(req.backlog_count)
                    .ok()
                    .and_then(NonZeroU64::new)
                    .ok_or(QueryError::NonPositiveBacklogCount(req.backlog_count))?;
                Backlog::Count(n)
            }
            Ok(BacklogMode::BacklogInvalid) | Err(_) => {
                return Err(QueryError::InvalidBacklogMode(req.backlog_mode));
            }
        };
        let stream = match StreamMode::try_from(req.stream_mode) {
            Ok(StreamMode::StreamUnbuffered) => Stream::Unbuffered,
            _ => Stream::Disable,
        };

        let mut with_children = false;
        let mut only_raw = false;
        let mut only_leveled = false;
        let mut min_severity: Option<Severity> = None;
        for (index, filter) in req.filters.iter().enumerate() {
            match filter.filter {
                None => return Err(QueryError::EmptyFilter { index }),
                Some(Filter::WithChildren(_)) => with_children = true,
                Some(Filter::OnlyRaw(_)) => only_raw = true,
                Some(Filter::OnlyLeveled(_)) => only_leveled = true,
                Some(Filter::LeveledWithMinimumSeverity(m)) => {
                    let s = Severity::from_proto(m.minimum).ok_or(
                        QueryError::InvalidMinimumSeverity {
                            index,
                            value: m.minimum,
                        },
                    )?;
                    min_severity = Some(s);
                }
            }
        }
        let kind = match (only_raw, only_leveled) {
            (true, true) => return Err(QueryError::ConflictingKindFilters),
            (true, false) => KindFilter::OnlyRaw,
            (false, true) => KindFilter::OnlyLeveled,
            (false, false) => KindFilter::Any,
        };
        Ok(Query {
            dn,
            with_children,
            kind,
            min_severity,
            backlog,
            stream,
        })
    }

    /// Whether the DN `dn` is selected by this query.
    pub fn selects_dn(&self, dn: &Dn) -> bool {
        if self.with_children {
            dn.is_descendant_or_self(&self.dn)
        } else {
            *dn == self.dn
        }
    }

    /// Whether `entry` matches this query (DN and filters).
    pub fn matches(&self, entry: &Entry) -> bool {
        if !self.selects_dn(&entry.dn) {
            return false;
        }
        let kind_ok = match self.kind {
            KindFilter::Any => true,
            KindFilter::OnlyRaw => !entry.is_leveled(),
            KindFilter::OnlyLeveled => entry.is_leveled(),
        };
        if !kind_ok {
            return false;
        }
        match self.min_severity {
            None => true,
            Some(min) => entry.severity().is_some_and(|s| s >= min),
        }
    }
}
