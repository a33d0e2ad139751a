//! The log tree served by `NodeDebugService.GetLogs`.
//!
//! Logs form a tree of DNs ([`Dn`]: `root`, `root.curator`, ...). Every
//! component logs [`Entry`]s into the [`LogTree`] machine, which keeps
//! per-DN ring buffers under a global memory cap, answers backlog queries
//! ([`Query`], validated from a `GetLogsRequest`) and queues new entries
//! to streaming subscriptions. See [`LogTree`] for the driving contract.

mod dn;
mod entry;
mod query;
mod tree;

pub use dn::{Dn, DnError, MAX_DN_LEN};
pub use entry::{ENTRY_OVERHEAD, Entry, EntryKind, Sequenced, Severity};
pub use query::{Backlog, KindFilter, MAX_FILTERS, Query, QueryError, Stream};
pub use tree::{Drained, LogTree, LogTreeConfig, SubscriptionId};

#[cfg(test)]
mod tests;
