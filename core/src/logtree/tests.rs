//! Unit tests of DN parsing, query validation and filters, and property
//! tests of [`LogTree`] against a naive model: a `Vec` of every entry ever
//! inserted with a retained flag, evicted by linear scans.

use std::collections::VecDeque;

use metropolis_proto::prelude::{common, debug};
use proptest::prelude::*;

use super::*;

use common::log_filter::{Filter, LeveledWithMinimumSeverity, OnlyLeveled, OnlyRaw, WithChildren};
use debug::get_logs_request::{BacklogMode, StreamMode};

fn dn(s: &str) -> Dn {
    Dn::parse(s).expect("test DN is valid")
}

fn leveled(d: &str, sev: Severity, msg: &str) -> Entry {
    Entry {
        dn: dn(d),
        kind: EntryKind::Leveled {
            lines: vec![msg.to_owned()],
            timestamp_unix_nanos: 1_500_000_000,
            severity: sev,
            location: "x.rs:1".to_owned(),
        },
    }
}

fn raw(d: &str, data: &str) -> Entry {
    Entry {
        dn: dn(d),
        kind: EntryKind::Raw {
            data: data.to_owned(),
            original_length: data.len() as i64,
        },
    }
}

fn request(d: &str, filters: Vec<Filter>) -> debug::GetLogsRequest {
    debug::GetLogsRequest {
        dn: d.to_owned(),
        filters: filters
            .into_iter()
            .map(|f| common::LogFilter { filter: Some(f) })
            .collect(),
        backlog_mode: BacklogMode::BacklogAll as i32,
        backlog_count: 0,
        stream_mode: StreamMode::StreamDisable as i32,
    }
}

fn min_sev(s: common::LeveledLogSeverity) -> Filter {
    Filter::LeveledWithMinimumSeverity(LeveledWithMinimumSeverity { minimum: s as i32 })
}

fn query(d: &str, filters: Vec<Filter>) -> Query {
    Query::from_request(&request(d, filters)).expect("test query is valid")
}

fn seqs(v: &[Sequenced]) -> Vec<u64> {
    v.iter().map(|s| s.seq).collect()
}

fn big() -> LogTreeConfig {
    LogTreeConfig {
        max_bytes: 1 << 30,
        max_entries_per_dn: 1 << 20,
        max_queued_per_subscription: 1 << 20,
    }
}

#[test]
fn dn_parsing() {
    assert_eq!(dn("root.curator").as_str(), "root.curator");
    assert!(Dn::parse("a-b_c.0").is_ok());
    assert_eq!(Dn::parse(""), Err(DnError::Empty));
    assert_eq!(
        Dn::parse("root..x"),
        Err(DnError::EmptyComponent { index: 1 })
    );
    assert_eq!(
        Dn::parse(".root"),
        Err(DnError::EmptyComponent { index: 0 })
    );
    assert_eq!(
        Dn::parse("root."),
        Err(DnError::EmptyComponent { index: 1 })
    );
    assert_eq!(
        Dn::parse("root.Cur"),
        Err(DnError::InvalidCharacter { offset: 5, ch: 'C' })
    );
    assert!(matches!(
        Dn::parse(&"a".repeat(MAX_DN_LEN + 1)),
        Err(DnError::TooLong { .. })
    ));
    assert!(Dn::parse(&"a".repeat(MAX_DN_LEN)).is_ok());
    for e in [Dn::parse("").err(), Dn::parse("a b").err()] {
        let msg = e.expect("error").to_string();
        assert!(msg.starts_with("dn:"), "{msg}");
    }
}

#[test]
fn dn_descendants() {
    assert!(dn("root").is_descendant_or_self(&dn("root")));
    assert!(dn("root.a.b").is_descendant_or_self(&dn("root")));
    assert!(dn("root.a.b").is_descendant_or_self(&dn("root.a")));
    assert!(!dn("root.ab").is_descendant_or_self(&dn("root.a")));
    assert!(!dn("root").is_descendant_or_self(&dn("root.a")));
    assert_eq!(dn("root.a.b").parent(), Some(dn("root.a")));
    assert_eq!(dn("root").parent(), None);
}

#[test]
fn validation_rules() {
    let err = |r: debug::GetLogsRequest| Query::from_request(&r).expect_err("must be rejected");

    let e = err(request("root..a", vec![]));
    assert_eq!(
        e,
        QueryError::InvalidDn(DnError::EmptyComponent { index: 1 })
    );
    assert!(e.to_string().contains("dn"));
    // As the reference: the empty DN is the root.
    assert_eq!(
        Query::from_request(&request("", vec![])).map(|q| q.dn),
        Ok(Dn::root())
    );

    let mut r = request("root", vec![]);
    r.backlog_mode = BacklogMode::BacklogInvalid as i32;
    let e = err(r.clone());
    assert!(e.to_string().contains("backlog_mode"), "{e}");
    r.backlog_mode = 99;
    assert_eq!(err(r.clone()), QueryError::InvalidBacklogMode(99));

    r.backlog_mode = BacklogMode::BacklogCount as i32;
    for c in [0, -1, i64::MIN] {
        r.backlog_count = c;
        let e = err(r.clone());
        assert_eq!(e, QueryError::NonPositiveBacklogCount(c));
        assert!(e.to_string().contains("backlog_count"), "{e}");
    }
    r.backlog_count = 3;
    assert_eq!(
        Query::from_request(&r).expect("valid").backlog,
        Backlog::Count(std::num::NonZeroU64::new(3).expect("3 is non-zero"))
    );
    // backlog_count is ignored outside COUNT.
    r.backlog_mode = BacklogMode::BacklogAll as i32;
    r.backlog_count = -5;
    assert!(Query::from_request(&r).is_ok());

    let mut r = request("root", vec![]);
    // As the reference: unset, or unknown, streams nothing.
    for mode in [StreamMode::StreamInvalid as i32, 7] {
        r.stream_mode = mode;
        assert_eq!(
            Query::from_request(&r).expect("valid").stream,
            Stream::Disable
        );
    }
    r.stream_mode = StreamMode::StreamUnbuffered as i32;
    assert_eq!(
        Query::from_request(&r).expect("valid").stream,
        Stream::Unbuffered
    );

    let e = err(request(
        "root",
        vec![
            Filter::OnlyRaw(OnlyRaw {}),
            Filter::OnlyLeveled(OnlyLeveled {}),
        ],
    ));
    assert_eq!(e, QueryError::ConflictingKindFilters);
    assert!(e.to_string().contains("filters"), "{e}");

    let e = err(request(
        "root",
        vec![
            Filter::WithChildren(WithChildren {}),
            min_sev(common::LeveledLogSeverity::Invalid),
        ],
    ));
    assert_eq!(e, QueryError::InvalidMinimumSeverity { index: 1, value: 0 });
    assert!(e.to_string().contains("filters[1].minimum"), "{e}");

    let mut r = request("root", vec![]);
    r.filters.push(common::LogFilter { filter: None });
    assert_eq!(err(r), QueryError::EmptyFilter { index: 0 });

    // As the reference: at most ten filters.
    let ten = vec![Filter::WithChildren(WithChildren {}); MAX_FILTERS];
    assert!(Query::from_request(&request("root", ten.clone())).is_ok());
    let mut eleven = ten;
    eleven.push(Filter::OnlyRaw(OnlyRaw {}));
    let e = err(request("root", eleven));
    assert_eq!(e, QueryError::TooManyFilters(11));
    assert!(e.to_string().starts_with("filters: 11 given"), "{e}");
}

#[test]
fn filters() {
    let mut t = LogTree::new(big());
    let a = t.handle_entry(leveled("root", Severity::Info, "a"));
    let b = t.handle_entry(raw("root", "b"));
    let c = t.handle_entry(leveled("root.x", Severity::Error, "c"));
    let d = t.handle_entry(leveled("root.xy", Severity::Warning, "d"));
    let e = t.handle_entry(raw("root.x.y", "e"));
    let f = t.handle_entry(leveled("other", Severity::Fatal, "f"));
    let bl = |q: Query| seqs(&t.backlog(&q));

    assert_eq!(bl(query("root", vec![])), vec![a, b]);
    let wc = || Filter::WithChildren(WithChildren {});
    assert_eq!(bl(query("root", vec![wc()])), vec![a, b, c, d, e]);
    assert_eq!(bl(query("root.x", vec![wc()])), vec![c, e]);
    assert_eq!(
        bl(query("root", vec![wc(), Filter::OnlyRaw(OnlyRaw {})])),
        vec![b, e]
    );
    assert_eq!(
        bl(query(
            "root",
            vec![wc(), Filter::OnlyLeveled(OnlyLeveled {})]
        )),
        vec![a, c, d]
    );
    // Minimum severity drops lower leveled entries and all raw ones.
    assert_eq!(
        bl(query(
            "root",
            vec![wc(), min_sev(common::LeveledLogSeverity::Warning)]
        )),
        vec![c, d]
    );
    // Several minimums: the last applies (as the reference).
    assert_eq!(
        bl(query(
            "root",
            vec![
                wc(),
                min_sev(common::LeveledLogSeverity::Error),
                min_sev(common::LeveledLogSeverity::Info)
            ]
        )),
        vec![a, c, d]
    );
    assert_eq!(
        bl(query(
            "root",
            vec![
                wc(),
                min_sev(common::LeveledLogSeverity::Info),
                min_sev(common::LeveledLogSeverity::Error)
            ]
        )),
        vec![c]
    );
    assert_eq!(
        bl(query(
            "other",
            vec![min_sev(common::LeveledLogSeverity::Fatal)]
        )),
        vec![f]
    );

    let mut r = request("root", vec![wc()]);
    r.backlog_mode = BacklogMode::BacklogCount as i32;
    r.backlog_count = 2;
    assert_eq!(bl(Query::from_request(&r).expect("valid")), vec![d, e]);
    r.backlog_count = 100;
    assert_eq!(
        bl(Query::from_request(&r).expect("valid")),
        vec![a, b, c, d, e]
    );
    r.backlog_mode = BacklogMode::BacklogDisable as i32;
    assert_eq!(
        bl(Query::from_request(&r).expect("valid")),
        Vec::<u64>::new()
    );
}

#[test]
fn a_dn_never_logged_to_has_an_empty_backlog_and_a_waiting_stream() {
    let mut t = LogTree::new(big());
    let mut r = request("root.a", vec![]);
    r.stream_mode = StreamMode::StreamUnbuffered as i32;
    let q = Query::from_request(&r).expect("valid");
    let (backlog, sub) = t.open(q.clone());
    assert!(backlog.is_empty());
    let sub = sub.expect("a stream");
    assert!(!t.has_seen(&dn("root.a")));

    let first = t.handle_entry(raw("root.a", "x"));
    let drained = t.poll_subscription(sub).expect("subscribed");
    assert_eq!(seqs(&drained.entries), vec![first]);
    assert!(t.has_seen(&dn("root")));
    assert!(!t.has_seen(&dn("root.c")));
}

#[test]
fn the_empty_dn_is_the_root_of_the_whole_tree() {
    let mut t = LogTree::new(big());
    let a = t.handle_entry(raw("root.a", "a"));
    let b = t.handle_entry(raw("other", "b"));
    let wc = Filter::WithChildren(WithChildren {});
    let q = Query::from_request(&request("", vec![wc])).expect("valid");
    assert!(q.dn.is_root());
    assert_eq!(seqs(&t.backlog(&q)), vec![a, b]);
    // Without WithChildren: the root's own entries, and none is logged
    // there.
    let q = Query::from_request(&request("", vec![])).expect("valid");
    assert_eq!(seqs(&t.backlog(&q)), Vec::<u64>::new());
}

#[test]
fn to_proto() {
    let mut e = leveled("root.a", Severity::Warning, "hi");
    if let EntryKind::Leveled {
        timestamp_unix_nanos,
        ..
    } = &mut e.kind
    {
        *timestamp_unix_nanos = -1;
    }
    let p = e.to_proto();
    assert_eq!(p.dn, "root.a");
    let Some(common::log_entry::Kind::Leveled(l)) = p.kind else {
        panic!("leveled expected");
    };
    assert_eq!(l.lines, vec!["hi".to_owned()]);
    assert_eq!(l.severity, common::LeveledLogSeverity::Warning as i32);
    assert_eq!(l.location, "x.rs:1");
    let ts = l.timestamp.expect("timestamp set");
    assert_eq!((ts.seconds, ts.nanos), (-1, 999_999_999));

    let p = raw("root", "abc").to_proto();
    assert_eq!(
        p.kind,
        Some(common::log_entry::Kind::Raw(common::log_entry::Raw {
            data: "abc".to_owned(),
            original_length: 3
        }))
    );
    assert!(Severity::Info < Severity::Warning);
    assert!(Severity::Error < Severity::Fatal);
    for s in [
        Severity::Info,
        Severity::Warning,
        Severity::Error,
        Severity::Fatal,
    ] {
        assert_eq!(Severity::from_proto(s.to_proto() as i32), Some(s));
    }
    assert_eq!(Severity::from_proto(0), None);
    assert_eq!(Severity::from_proto(42), None);
}

#[test]
fn subscription_overflow_and_open() {
    let mut t = LogTree::new(LogTreeConfig {
        max_queued_per_subscription: 2,
        ..big()
    });
    t.handle_entry(raw("root", "before"));
    let mut r = request("root", vec![]);
    r.stream_mode = StreamMode::StreamUnbuffered as i32;
    let (backlog, sub) = t.open(Query::from_request(&r).expect("valid"));
    assert_eq!(seqs(&backlog), vec![1]);
    let sub = sub.expect("streaming query subscribes");
    for i in 0..5 {
        t.handle_entry(raw("root", &format!("{i}")));
    }
    t.handle_entry(raw("root.child", "not selected"));
    let d = t.poll_subscription(sub).expect("subscribed");
    assert_eq!(seqs(&d.entries), vec![5, 6]);
    assert_eq!(d.dropped, 3);
    let d = t.poll_subscription(sub).expect("subscribed");
    assert_eq!(d, Drained::default());
    assert!(t.unsubscribe(sub));
    assert!(!t.unsubscribe(sub));
    assert_eq!(t.poll_subscription(sub), None);
}

#[test]
fn eviction() {
    let mut t = LogTree::new(LogTreeConfig {
        max_bytes: 3 * (ENTRY_OVERHEAD + 4 + 1),
        ..big()
    });
    for i in 0..5 {
        t.handle_entry(raw(if i % 2 == 0 { "root" } else { "aaaa" }, "x"));
    }
    // Globally the three newest survive: seqs 3, 4, 5.
    assert_eq!(
        seqs(&t.entries(&dn("root")).cloned().collect::<Vec<_>>()),
        vec![3, 5]
    );
    assert_eq!(
        seqs(&t.entries(&dn("aaaa")).cloned().collect::<Vec<_>>()),
        vec![4]
    );
    assert_eq!(t.total_bytes(), 3 * (ENTRY_OVERHEAD + 5));
    // An entry costlier than the cap is not retained.
    t.handle_entry(raw("root", &"y".repeat(1000)));
    assert_eq!(t.total_bytes(), 0);
}

// ---- Property tests ----

const DNS: [&str; 6] = ["root", "root.a", "root.a.b", "root.ab", "root.c", "other"];
const SEVS: [Severity; 4] = [
    Severity::Info,
    Severity::Warning,
    Severity::Error,
    Severity::Fatal,
];

fn arb_entry() -> impl Strategy<Value = Entry> {
    (
        0..DNS.len(),
        any::<bool>(),
        0..SEVS.len(),
        0usize..40,
        any::<i64>(),
    )
        .prop_map(|(d, is_raw, s, len, ts)| {
            let text = "m".repeat(len);
            if is_raw {
                raw(DNS[d], &text)
            } else {
                let mut e = leveled(DNS[d], SEVS[s], &text);
                if let EntryKind::Leveled {
                    timestamp_unix_nanos,
                    ..
                } = &mut e.kind
                {
                    *timestamp_unix_nanos = ts;
                }
                e
            }
        })
}

fn arb_query() -> impl Strategy<Value = Query> {
    (
        0..DNS.len(),
        any::<bool>(),
        0u8..3,
        proptest::option::of(0..SEVS.len()),
        0u64..6,
    )
        .prop_map(|(d, with_children, kind, min, count)| Query {
            dn: dn(DNS[d]),
            with_children,
            kind: [
                KindFilter::Any,
                KindFilter::OnlyRaw,
                KindFilter::OnlyLeveled,
            ][kind as usize],
            min_severity: min.map(|i| SEVS[i]),
            backlog: match std::num::NonZeroU64::new(count) {
                None => Backlog::All,
                Some(n) => Backlog::Count(n),
            },
            stream: Stream::Unbuffered,
        })
}

#[derive(Clone, Debug)]
enum Op {
    Insert(Entry),
    Query(Query),
    Subscribe(Query),
    Poll(usize),
    Unsubscribe(usize),
}

fn arb_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => arb_entry().prop_map(Op::Insert),
        2 => arb_query().prop_map(Op::Query),
        1 => arb_query().prop_map(Op::Subscribe),
        2 => (0usize..8).prop_map(Op::Poll),
        1 => (0usize..8).prop_map(Op::Unsubscribe),
    ]
}

/// The naive model: every entry ever inserted, with a retained flag.
struct Model {
    config: LogTreeConfig,
    all: Vec<(Sequenced, bool)>,
}

impl Model {
    fn insert(&mut self, s: Sequenced) {
        let d = s.entry.dn.clone();
        self.all.push((s, true));
        let mut same: Vec<usize> = (0..self.all.len())
            .filter(|&i| self.all[i].1 && self.all[i].0.entry.dn == d)
            .collect();
        while same.len() > self.config.max_entries_per_dn {
            self.all[same.remove(0)].1 = false;
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
            .filter(|(s, k)| *k && q.matches(&s.entry))
            .map(|(s, _)| s.clone())
            .collect();
        match q.backlog {
            Backlog::Disable => vec![],
            Backlog::All => m,
            Backlog::Count(n) => {
                let n = n.get() as usize;
                m[m.len().saturating_sub(n)..].to_vec()
            }
        }
    }
}

struct ModelSub {
    id: SubscriptionId,
    query: Query,
    queue: VecDeque<Sequenced>,
    dropped: u64,
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn tree_matches_model(
        ops in proptest::collection::vec(arb_op(), 1..120),
        max_bytes in 0usize..1200,
        max_entries_per_dn in 0usize..8,
        max_queued in 1usize..10,
    ) {
        let config = LogTreeConfig {
            max_bytes,
            max_entries_per_dn,
            max_queued_per_subscription: max_queued,
        };
        let mut t = LogTree::new(config);
        let mut model = Model { config, all: Vec::new() };
        let mut subs: Vec<ModelSub> = Vec::new();

        for op in ops {
            match op {
                Op::Insert(e) => {
                    let seq = t.handle_entry(e.clone());
                    prop_assert_eq!(seq, model.all.len() as u64 + 1);
                    let s = Sequenced { seq, entry: e };
                    for sub in &mut subs {
                        if sub.query.matches(&s.entry) {
                            sub.queue.push_back(s.clone());
                            if sub.queue.len() > max_queued {
                                sub.queue.pop_front();
                                sub.dropped += 1;
                            }
                        }
                    }
                    model.insert(s);
                    prop_assert!(t.total_bytes() <= max_bytes);
                    prop_assert_eq!(t.total_bytes(), model.bytes());
                }
                Op::Query(q) => {
                    prop_assert_eq!(t.backlog(&q), model.backlog(&q));
                }
                Op::Subscribe(q) => {
                    let id = t.subscribe(q.clone());
                    subs.push(ModelSub { id, query: q, queue: VecDeque::new(), dropped: 0 });
                }
                Op::Poll(i) => {
                    if let Some(sub) = subs.get_mut(i) {
                        let d = t.poll_subscription(sub.id).expect("subscribed");
                        prop_assert_eq!(d.entries, sub.queue.drain(..).collect::<Vec<_>>());
                        prop_assert_eq!(d.dropped, std::mem::take(&mut sub.dropped));
                    }
                }
                Op::Unsubscribe(i) => {
                    if i < subs.len() {
                        let sub = subs.remove(i);
                        prop_assert!(t.unsubscribe(sub.id));
                        prop_assert_eq!(t.poll_subscription(sub.id), None);
                    }
                }
            }

            // Retained entries of each DN are the newest suffix of its
            // history, within the per-DN cap.
            for d in DNS {
                let d = dn(d);
                let history: Vec<u64> = model
                    .all
                    .iter()
                    .filter(|(s, _)| s.entry.dn == d)
                    .map(|(s, _)| s.seq)
                    .collect();
                let kept: Vec<u64> = t.entries(&d).map(|s| s.seq).collect();
                prop_assert!(kept.len() <= max_entries_per_dn);
                prop_assert!(history.ends_with(&kept), "{:?} not a suffix of {:?}", kept, history);
            }
        }
    }

    /// With queues large enough, a subscription receives exactly the
    /// matching entries inserted after it, in order.
    #[test]
    fn subscriptions_get_exactly_later_matches(
        before in proptest::collection::vec(arb_entry(), 0..20),
        after in proptest::collection::vec(arb_entry(), 0..40),
        q in arb_query(),
    ) {
        let mut t = LogTree::new(LogTreeConfig { max_bytes: 500, max_entries_per_dn: 2, ..big() });
        for e in before {
            t.handle_entry(e);
        }
        let id = t.subscribe(q.clone());
        let mut expected = Vec::new();
        for e in after {
            let m = q.matches(&e);
            let seq = t.handle_entry(e.clone());
            if m {
                expected.push(Sequenced { seq, entry: e });
            }
        }
        let d = t.poll_subscription(id).expect("subscribed");
        prop_assert_eq!(d.dropped, 0);
        prop_assert_eq!(d.entries, expected);
    }
}
