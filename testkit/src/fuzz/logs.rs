//! `log_queries`: `GetLogs` requests validated by [`Query::from_request`]
//! and answered by a [`LogTree`] and by the service's [`LogHub`], under
//! arbitrary entries, limits, subscriptions, polls and cancels, against a
//! naive model.
//!
//! Input: `max_bytes` (u16), `max_entries_per_dn % 8`,
//! `1 + max_queued % 8`, then operations (`op % 6`): 0-1 insert an entry,
//! 2 a `GetLogs` request (tree backlog, and a `LogHub::get_logs` call kept
//! open when it streams), 3 subscribe the tree, 4 poll subscription
//! `i % 8` and hub stream `i % 4`, 5 cancel them. See [`entry`] and
//! [`request`] for how entries and requests are read.
//!
//! Checked: validation equals an independent re-implementation of the
//! rules (same error, same query); every backlog equals the model's
//! (retained = per-DN and global caps applied oldest first); NotFound
//! exactly for DNs never logged to; subscriptions and followed `GetLogs`
//! streams get exactly the matching entries inserted after them, with
//! drops counted and reported in-band; retained entries of a DN are the
//! newest suffix of its history; retained bytes within the cap.

use std::collections::VecDeque;
use std::num::NonZeroU64;
use std::task::Poll;

use metropolis_core::logtree::{
    Backlog, Dn, DnError, Entry, EntryKind, KindFilter, LogTree, LogTreeConfig, Query, QueryError,
    Sequenced, Severity, Stream, SubscriptionId,
};
use metropolis_proto::prelude::{common, debug};
use metropolis_service::debug::{LogHub, LogStream};

use super::input::Input;
use crate::exec::poll_next;

/// DNs most entries and queries use (selector bytes below 240).
pub const DNS: [&str; 8] = [
    "root", "root.a", "root.a.b", "root.ab", "root.b", "other", "root.a-b", "root.a_b",
];

/// A DN string: from [`DNS`] (selector below 240) or read from the input.
pub fn dn_string(input: &mut Input) -> String {
    let sel = input.u8();
    if sel < 240 {
        DNS[usize::from(sel) % DNS.len()].to_string()
    } else {
        input.short_string()
    }
}

/// Reads an entry: a DN (see [`dn_string`]), a kind byte (bit 0: raw;
/// bits 1-2: severity; bits 3-4: line count), the text, a timestamp.
/// `Err` with the DN error when the DN is invalid.
pub fn entry(input: &mut Input) -> Result<Entry, DnError> {
    let dn = Dn::parse(&dn_string(input))?;
    let kind = input.u8();
    let text = input.short_string();
    let timestamp = input.u64() as i64;
    let kind = if kind & 1 == 1 {
        EntryKind::Raw {
            original_length: text.len() as i64 + i64::from(kind >> 5),
            data: text,
        }
    } else {
        let severity = [
            Severity::Info,
            Severity::Warning,
            Severity::Error,
            Severity::Fatal,
        ][usize::from((kind >> 1) & 3)];
        EntryKind::Leveled {
            lines: vec![text; usize::from((kind >> 3) & 3)],
            timestamp_unix_nanos: timestamp,
            severity,
            location: format!("fuzz.rs:{}", kind >> 5),
        }
    };
    Ok(Entry { dn, kind })
}

/// A small signed value from one byte: mostly the enum's valid range.
fn small(input: &mut Input) -> i32 {
    i32::from(input.u8() as i8) % 5
}

/// Reads a `GetLogsRequest`: a DN (see [`dn_string`]), up to 3 filters
/// (kind `% 6`: 0 unset, 1 WithChildren, 2 OnlyRaw, 3 OnlyLeveled, 4-5
/// minimum severity as a small signed byte), backlog mode, count (signed
/// byte) and stream mode (small signed bytes).
pub fn request(input: &mut Input) -> debug::GetLogsRequest {
    use common::log_filter::{
        Filter, LeveledWithMinimumSeverity, OnlyLeveled, OnlyRaw, WithChildren,
    };
    let dn = dn_string(input);
    let n = input.below(4);
    let filters = (0..n)
        .map(|_| common::LogFilter {
            filter: match input.u8() % 6 {
                0 => None,
                1 => Some(Filter::WithChildren(WithChildren {})),
                2 => Some(Filter::OnlyRaw(OnlyRaw {})),
                3 => Some(Filter::OnlyLeveled(OnlyLeveled {})),
                _ => Some(Filter::LeveledWithMinimumSeverity(
                    LeveledWithMinimumSeverity {
                        minimum: small(input),
                    },
                )),
            },
        })
        .collect();
    debug::GetLogsRequest {
        dn,
        filters,
        backlog_mode: small(input),
        backlog_count: i64::from(input.u8() as i8),
        stream_mode: small(input),
    }
}

/// The DN rules, written out again: empty, too long, bad character (the
/// first), empty component (the first).
fn model_dn(s: &str) -> Result<(), DnError> {
    if s.is_empty() {
        return Err(DnError::Empty);
    }
    if s.len() > 255 {
        return Err(DnError::TooLong { len: s.len() });
    }
    for (offset, ch) in s.char_indices() {
        if !(ch.is_ascii_lowercase() || ch.is_ascii_digit() || "_-.".contains(ch)) {
            return Err(DnError::InvalidCharacter { offset, ch });
        }
    }
    match s.split('.').position(str::is_empty) {
        Some(index) => Err(DnError::EmptyComponent { index }),
        None => Ok(()),
    }
}

/// The validation rules of `GetLogs`, written out again from the proto's
/// comments and the module docs.
fn model_query(req: &debug::GetLogsRequest) -> Result<Query, QueryError> {
    use common::log_filter::Filter;
    // At most ten filters, checked first (as the reference).
    if req.filters.len() > 10 {
        return Err(QueryError::TooManyFilters(req.filters.len()));
    }
    // The empty DN is the root.
    let dn = if req.dn.is_empty() {
        Dn::root()
    } else {
        model_dn(&req.dn).map_err(QueryError::InvalidDn)?;
        Dn::parse(&req.dn).map_err(QueryError::InvalidDn)?
    };
    let backlog = match req.backlog_mode {
        1 => Backlog::Disable,
        2 => Backlog::All,
        3 => match NonZeroU64::new(req.backlog_count.max(0) as u64) {
            Some(n) => Backlog::Count(n),
            None => return Err(QueryError::NonPositiveBacklogCount(req.backlog_count)),
        },
        m => return Err(QueryError::InvalidBacklogMode(m)),
    };
    // Only UNBUFFERED streams (as the reference).
    let stream = if req.stream_mode == 2 {
        Stream::Unbuffered
    } else {
        Stream::Disable
    };
    let (mut children, mut raw, mut leveled, mut min) = (false, false, false, None);
    for (index, f) in req.filters.iter().enumerate() {
        match &f.filter {
            None => return Err(QueryError::EmptyFilter { index }),
            Some(Filter::WithChildren(_)) => children = true,
            Some(Filter::OnlyRaw(_)) => raw = true,
            Some(Filter::OnlyLeveled(_)) => leveled = true,
            Some(Filter::LeveledWithMinimumSeverity(m)) => {
                let s = match m.minimum {
                    1 => Severity::Info,
                    2 => Severity::Warning,
                    3 => Severity::Error,
                    4 => Severity::Fatal,
                    value => return Err(QueryError::InvalidMinimumSeverity { index, value }),
                };
                // The last one applies.
                min = Some(s);
            }
        }
    }
    let kind = match (raw, leveled) {
        (true, true) => return Err(QueryError::ConflictingKindFilters),
        (true, false) => KindFilter::OnlyRaw,
        (false, true) => KindFilter::OnlyLeveled,
        (false, false) => KindFilter::Any,
    };
    Ok(Query {
        dn,
        with_children: children,
        kind,
        min_severity: min,
        backlog,
        stream,
    })
}

/// The notice of `dropped` lost entries a stream of `q` gets before
/// `next`: raw where `q` takes raw entries, else leveled at WARNING (or
/// `q`'s minimum, if higher) with `next`'s time; on `q`'s DN, or `root`
/// for the whole tree.
fn model_notice(q: &Query, dropped: u64, next: Option<&Sequenced>) -> Entry {
    let data = format!("{dropped} log entries dropped: reader too slow");
    let dn = if q.dn.as_str().is_empty() {
        Dn::parse("root").expect("a valid DN")
    } else {
        q.dn.clone()
    };
    let kind = if q.kind != KindFilter::OnlyLeveled && q.min_severity.is_none() {
        EntryKind::Raw {
            original_length: data.len() as i64,
            data,
        }
    } else {
        let severity = match q.min_severity {
            Some(min) if min > Severity::Warning => min,
            _ => Severity::Warning,
        };
        let timestamp_unix_nanos = match next.map(|s| &s.entry.kind) {
            Some(EntryKind::Leveled {
                timestamp_unix_nanos,
                ..
            }) => *timestamp_unix_nanos,
            _ => 0,
        };
        EntryKind::Leveled {
            lines: vec![data],
            timestamp_unix_nanos,
            severity,
            location: "logtree".into(),
        }
    };
    Entry { dn, kind }
}

/// Whether `entry` matches `q`, written out again.
fn model_matches(q: &Query, e: &Entry) -> bool {
    let dn_ok = e.dn == q.dn
        || (q.with_children && q.dn.as_str().is_empty())
        || (q.with_children && e.dn.as_str().starts_with(&format!("{}.", q.dn.as_str())));
    let kind_ok = match q.kind {
        KindFilter::Any => true,
        KindFilter::OnlyRaw => !e.is_leveled(),
        KindFilter::OnlyLeveled => e.is_leveled(),
    };
    let severity_ok = match q.min_severity {
        None => true,
        Some(min) => e.severity().is_some_and(|s| s >= min),
    };
    dn_ok && kind_ok && severity_ok
}

/// The naive model: every entry ever inserted, with a retained flag.
struct Model {
    config: LogTreeConfig,
    all: Vec<(Sequenced, bool)>,
}

impl Model {
    fn insert(&mut self, s: Sequenced) {
        let dn = s.entry.dn.clone();
        self.all.push((s, true));
        let mut same: VecDeque<usize> = (0..self.all.len())
            .filter(|&i| self.all[i].1 && self.all[i].0.entry.dn == dn)
            .collect();
        while same.len() > self.config.max_entries_per_dn {
            if let Some(i) = same.pop_front() {
                self.all[i].1 = false;
            }
        }
        while self.bytes() > self.config.max_bytes {
            let i = self
                .all
                .iter()
                .position(|(_, kept)| *kept)
                .expect("bytes imply a retained entry");
            self.all[i].1 = false;
        }
    }

    fn bytes(&self) -> usize {
        self.all
            .iter()
            .filter(|(_, k)| *k)
            .map(|(s, _)| s.entry.cost())
            .sum()
    }

    fn backlog(&self, q: &Query) -> Vec<Sequenced> {
        let m: Vec<Sequenced> = self
            .all
            .iter()
            .filter(|(s, k)| *k && model_matches(q, &s.entry))
            .map(|(s, _)| s.clone())
            .collect();
        match q.backlog {
            Backlog::Disable => vec![],
            Backlog::All => m,
            Backlog::Count(n) => {
                let n = usize::try_from(n.get()).unwrap_or(usize::MAX);
                m[m.len().saturating_sub(n)..].to_vec()
            }
        }
    }
}

/// A model queue of one subscription.
struct ModelQueue {
    query: Query,
    queue: VecDeque<Sequenced>,
    dropped: u64,
}

impl ModelQueue {
    fn push(&mut self, s: &Sequenced, cap: usize) {
        if model_matches(&self.query, &s.entry) {
            self.queue.push_back(s.clone());
            while self.queue.len() > cap {
                self.queue.pop_front();
                self.dropped += 1;
            }
        }
    }
}

struct World {
    tree: LogTree,
    hub: LogHub,
    model: Model,
    subs: Vec<(SubscriptionId, ModelQueue)>,
    streams: Vec<(LogStream, ModelQueue)>,
}

impl World {
    fn insert(&mut self, e: Entry) {
        let seq = self.tree.handle_entry(e.clone());
        assert_eq!(seq, self.model.all.len() as u64 + 1, "sequence numbers");
        self.hub.append(e.clone());
        let s = Sequenced { seq, entry: e };
        let cap = self.model.config.max_queued_per_subscription;
        for (_, q) in &mut self.subs {
            q.push(&s, cap);
        }
        for (_, q) in &mut self.streams {
            q.push(&s, cap);
        }
        self.model.insert(s);
        assert!(self.tree.total_bytes() <= self.model.config.max_bytes);
        assert_eq!(
            self.tree.total_bytes(),
            self.model.bytes(),
            "retained bytes"
        );
        assert_eq!(
            self.hub.retained_bytes(),
            self.model.bytes(),
            "hub retained bytes"
        );
    }

    fn get_logs(&mut self, req: &debug::GetLogsRequest) {
        let validated = Query::from_request(req);
        assert_eq!(validated, model_query(req), "validation of {req:?}");
        let hub = self.hub.get_logs(req);
        let query = match validated {
            Ok(q) => q,
            Err(e) => {
                assert_eq!(
                    metropolis_service::status::debug::log_query(&e).code(),
                    tonic::Code::InvalidArgument
                );
                let status = hub.expect_err("the hub accepted an invalid request");
                assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status}");
                return;
            }
        };
        // A DN never logged to is no error: its backlog is empty.
        assert_eq!(
            self.tree.backlog(&query),
            self.model.backlog(&query),
            "backlog of {query:?}"
        );
        let mut stream = match hub {
            Ok(stream) => stream,
            Err(status) => panic!("the hub refused a valid request: {status}"),
        };
        let mut backlog = Vec::new();
        let mut ended = false;
        loop {
            match poll_next(&mut stream) {
                Poll::Ready(Some(Ok(r))) => {
                    assert!(r.stream_entries.is_empty(), "stream entries in the backlog");
                    assert!(!r.backlog_entries.is_empty(), "empty backlog response");
                    backlog.extend(r.backlog_entries);
                }
                Poll::Ready(Some(Err(status))) => panic!("GetLogs failed: {status}"),
                Poll::Ready(None) => {
                    ended = true;
                    break;
                }
                Poll::Pending => break,
            }
        }
        let want: Vec<common::LogEntry> = self
            .model
            .backlog(&query)
            .iter()
            .map(|s| s.entry.to_proto())
            .collect();
        assert_eq!(backlog, want, "GetLogs backlog of {query:?}");
        assert_eq!(ended, query.stream == Stream::Disable, "stream end");
        if query.stream == Stream::Unbuffered && self.streams.len() < 4 {
            self.streams.push((
                stream,
                ModelQueue {
                    query,
                    queue: VecDeque::new(),
                    dropped: 0,
                },
            ));
        }
    }

    fn poll(&mut self, i: usize) {
        if let Some((id, q)) = self.subs.get_mut(i % 8) {
            let d = self.tree.poll_subscription(*id).expect("subscribed");
            assert_eq!(
                d.entries,
                q.queue.drain(..).collect::<Vec<_>>(),
                "subscription"
            );
            assert_eq!(d.dropped, std::mem::take(&mut q.dropped), "dropped count");
        }
        if let Some((stream, q)) = self.streams.get_mut(i % 4) {
            let mut want = Vec::new();
            if q.dropped > 0 {
                let notice = model_notice(&q.query, q.dropped, q.queue.front());
                assert!(
                    model_matches(&q.query, &notice),
                    "a drop notice its query does not select: {notice:?} for {:?}",
                    q.query
                );
                want.push(notice.to_proto());
            }
            want.extend(q.queue.drain(..).map(|s| s.entry.to_proto()));
            q.dropped = 0;
            let got = match poll_next(stream) {
                Poll::Ready(Some(Ok(r))) => {
                    assert!(
                        r.backlog_entries.is_empty(),
                        "backlog entries while following"
                    );
                    r.stream_entries
                }
                Poll::Pending => Vec::new(),
                other => panic!("a followed GetLogs ended: {other:?}"),
            };
            assert_eq!(got, want, "followed GetLogs entries");
            assert!(
                poll_next(stream).is_pending(),
                "a drained follower has more"
            );
        }
    }

    fn cancel(&mut self, i: usize) {
        if i % 8 < self.subs.len() {
            let (id, _) = self.subs.remove(i % 8);
            assert!(self.tree.unsubscribe(id));
            assert_eq!(self.tree.poll_subscription(id), None);
        }
        if i % 4 < self.streams.len() {
            let before = self.hub.followers();
            drop(self.streams.remove(i % 4));
            assert_eq!(
                self.hub.followers(),
                before - 1,
                "dropped stream still follows"
            );
        }
    }

    fn check_suffixes(&self) {
        for d in DNS {
            let Ok(d) = Dn::parse(d) else { continue };
            let history: Vec<u64> = self
                .model
                .all
                .iter()
                .filter(|(s, _)| s.entry.dn == d)
                .map(|(s, _)| s.seq)
                .collect();
            let kept: Vec<u64> = self.tree.entries(&d).map(|s| s.seq).collect();
            assert!(kept.len() <= self.model.config.max_entries_per_dn);
            assert!(
                history.ends_with(&kept),
                "{kept:?} not a suffix of {history:?}"
            );
        }
    }
}

/// Runs one input; panics if a property fails.
pub fn run(data: &[u8]) {
    let mut input = Input::new(data);
    let config = LogTreeConfig {
        max_bytes: usize::from(input.u16()),
        max_entries_per_dn: input.below(8),
        max_queued_per_subscription: 1 + input.below(8),
    };
    let mut w = World {
        tree: LogTree::new(config),
        hub: LogHub::new(config),
        model: Model {
            config,
            all: Vec::new(),
        },
        subs: Vec::new(),
        streams: Vec::new(),
    };
    let mut ops = 0;
    while !input.is_empty() && ops < 512 {
        ops += 1;
        match input.u8() % 6 {
            0 | 1 => match entry(&mut input) {
                Ok(e) => w.insert(e),
                Err(e) => assert!(!e.to_string().is_empty()),
            },
            2 => {
                let req = request(&mut input);
                w.get_logs(&req);
            }
            3 => {
                let req = request(&mut input);
                if let Ok(q) = Query::from_request(&req)
                    && w.subs.len() < 8
                {
                    let id = w.tree.subscribe(q.clone());
                    w.subs.push((
                        id,
                        ModelQueue {
                            query: q,
                            queue: VecDeque::new(),
                            dropped: 0,
                        },
                    ));
                }
            }
            4 => {
                let i = usize::from(input.u8());
                w.poll(i);
            }
            _ => {
                let i = usize::from(input.u8());
                w.cancel(i);
            }
        }
        w.check_suffixes();
    }
    // Every follower still open gets what it is owed.
    for i in 0..w.streams.len() {
        w.poll(i);
    }
}
