//! The shared log tree behind `GetLogs`: components append entries, calls
//! read backlogs and follow subscriptions.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use futures::Stream;
use metropolis_proto::prelude::{common, debug};
use prost::Message;
use tonic::Status;

use metropolis_core::logtree::{
    Entry, EntryKind, KindFilter, LogTree, LogTreeConfig, Query, Sequenced, Severity,
    SubscriptionId,
};

/// Most entries sent in one `GetLogsResponse`.
pub const MAX_ENTRIES_PER_RESPONSE: usize = 4096;

/// Encoded size after which a `GetLogsResponse` is sent without waiting
/// for more entries (well under tonic's 4 MiB default decoding limit).
pub const MAX_RESPONSE_BYTES: usize = 1024 * 1024;

/// A [`LogTree`] shared between the components logging into it and the
/// `GetLogs` calls reading it. Cloning gives another handle to the same
/// tree.
///
/// Appending never blocks on readers: it inserts under a short lock and
/// wakes the followers whose subscription may have new entries. Nothing
/// logs (through `tracing` or otherwise) while the lock is held, so a
/// `tracing` layer writing into the hub cannot deadlock with it.
#[derive(Clone)]
pub struct LogHub {
    inner: Arc<Mutex<Inner>>,
}

struct Inner {
    tree: LogTree,
    /// Followers waiting for entries, woken (and removed) on append.
    waiting: BTreeMap<SubscriptionId, Waker>,
}

impl std::fmt::Debug for LogHub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = self.lock();
        f.debug_struct("LogHub")
            .field("total_bytes", &inner.tree.total_bytes())
            .field("subscriptions", &inner.tree.subscription_count())
            .finish()
    }
}

impl Default for LogHub {
    /// A hub with [`LogTreeConfig::default`] limits.
    fn default() -> Self {
        LogHub::new(LogTreeConfig::default())
    }
}

impl LogHub {
    /// An empty hub with these limits.
    pub fn new(config: LogTreeConfig) -> LogHub {
        LogHub {
            inner: Arc::new(Mutex::new(Inner {
                tree: LogTree::new(config),
                waiting: BTreeMap::new(),
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves the tree consistent (every
        // method of it completes its bookkeeping before returning), so a
        // poisoned lock is still usable.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Appends an entry and wakes waiting followers.
    pub fn append(&self, entry: Entry) {
        let woken = {
            let mut inner = self.lock();
            inner.tree.handle_entry(entry);
            std::mem::take(&mut inner.waiting)
        };
        for waker in woken.into_values() {
            waker.wake();
        }
    }

    /// Appends many entries under one lock (for bulk loads).
    pub fn append_all(&self, entries: impl IntoIterator<Item = Entry>) {
        let woken = {
            let mut inner = self.lock();
            for entry in entries {
                inner.tree.handle_entry(entry);
            }
            std::mem::take(&mut inner.waiting)
        };
        for waker in woken.into_values() {
            waker.wake();
        }
    }

    /// Summed cost of the retained entries (see [`Entry::cost`]).
    pub fn retained_bytes(&self) -> usize {
        self.lock().tree.total_bytes()
    }

    /// How many calls are following the tree right now.
    pub fn followers(&self) -> usize {
        self.lock().tree.subscription_count()
    }

    /// Opens a `GetLogs` call: validates the request (InvalidArgument
    /// naming the field; a DN never logged to is valid), then returns
    /// the response stream: the backlog in `backlog_entries` chunks, then,
    /// when the request streams, `stream_entries` as they are logged until
    /// the stream is dropped. Entries a slow follower lost to its bounded
    /// queue are reported in-band as one entry the query selects
    /// ("N log entries dropped: reader too slow", see `drop_notice`).
    pub fn get_logs(&self, request: &debug::GetLogsRequest) -> Result<LogStream, Status> {
        let query =
            Query::from_request(request).map_err(|e| crate::status::debug::log_query(&e))?;
        let (backlog, subscription) = self.lock().tree.open(query.clone());
        Ok(LogStream {
            hub: self.clone(),
            backlog: backlog.into_iter(),
            subscription,
            query,
        })
    }
}

/// The response stream of one `GetLogs` call (see [`LogHub::get_logs`]).
/// Dropping it ends the call's subscription.
pub struct LogStream {
    hub: LogHub,
    backlog: std::vec::IntoIter<Sequenced>,
    subscription: Option<SubscriptionId>,
    query: Query,
}

impl std::fmt::Debug for LogStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogStream")
            .field("backlog_left", &self.backlog.len())
            .field("subscription", &self.subscription)
            .finish()
    }
}

/// The in-band notice that `dropped` entries were lost to a slow reader
/// of `query`, shaped so that `query` selects it: on the query's DN (or
/// `root` for the whole tree, as the empty root is no entry's DN); raw
/// where the query takes raw entries, else leveled at WARNING or the
/// query's minimum, stamped with the time of `next` (the first entry
/// after the gap) when it has one.
fn drop_notice(query: &Query, dropped: u64, next: Option<&Entry>) -> Entry {
    let dn = if query.dn.is_root() {
        metropolis_core::logtree::Dn::parse("root").unwrap_or_else(|_| query.dn.clone())
    } else {
        query.dn.clone()
    };
    let data = format!("{dropped} log entries dropped: reader too slow");
    let takes_raw = query.kind != KindFilter::OnlyLeveled && query.min_severity.is_none();
    let kind = if takes_raw {
        EntryKind::Raw {
            original_length: i64::try_from(data.len()).unwrap_or(i64::MAX),
            data,
        }
    } else {
        let timestamp_unix_nanos = match next.map(|e| &e.kind) {
            Some(EntryKind::Leveled {
                timestamp_unix_nanos,
                ..
            }) => *timestamp_unix_nanos,
            _ => 0,
        };
        EntryKind::Leveled {
            lines: vec![data],
            timestamp_unix_nanos,
            severity: query
                .min_severity
                .map_or(Severity::Warning, |min| min.max(Severity::Warning)),
            location: "logtree".into(),
        }
    };
    Entry { dn, kind }
}

/// Moves entries from `from` into wire entries until a response is full.
fn fill(from: &mut impl Iterator<Item = Sequenced>, out: &mut Vec<common::LogEntry>) {
    let mut bytes = 0;
    while out.len() < MAX_ENTRIES_PER_RESPONSE && bytes < MAX_RESPONSE_BYTES {
        let Some(next) = from.next() else { break };
        let entry = next.entry.to_proto();
        bytes += entry.encoded_len() + 4;
        out.push(entry);
    }
}

impl Stream for LogStream {
    type Item = Result<debug::GetLogsResponse, Status>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.backlog.len() > 0 {
            let mut backlog_entries = Vec::new();
            fill(&mut this.backlog, &mut backlog_entries);
            return Poll::Ready(Some(Ok(debug::GetLogsResponse {
                backlog_entries,
                stream_entries: Vec::new(),
            })));
        }
        let Some(id) = this.subscription else {
            return Poll::Ready(None);
        };
        let mut inner = this.hub.lock();
        let Some(drained) = inner.tree.poll_subscription(id) else {
            // Unsubscribed underneath us: cannot happen while we own the
            // id, but end the stream rather than hang.
            return Poll::Ready(None);
        };
        if drained.entries.is_empty() && drained.dropped == 0 {
            // Registered under the same lock as the empty poll, so an
            // append after this point finds the waker.
            inner.waiting.insert(id, cx.waker().clone());
            return Poll::Pending;
        }
        drop(inner);
        let mut stream_entries = Vec::with_capacity(drained.entries.len() + 1);
        if drained.dropped > 0 {
            let next = drained.entries.first().map(|s| &s.entry);
            let notice = drop_notice(&this.query, drained.dropped, next);
            stream_entries.push(notice.to_proto());
        }
        // A burst larger than one response is sent in one go: the queue is
        // bounded by the tree's per-subscription cap.
        stream_entries.extend(drained.entries.iter().map(|s| s.entry.to_proto()));
        Poll::Ready(Some(Ok(debug::GetLogsResponse {
            backlog_entries: Vec::new(),
            stream_entries,
        })))
    }
}

impl Drop for LogStream {
    fn drop(&mut self) {
        if let Some(id) = self.subscription.take() {
            let mut inner = self.hub.lock();
            inner.tree.unsubscribe(id);
            inner.waiting.remove(&id);
        }
    }
}
