//! Property tests of the watch machines: for random store histories and
//! random consumer speeds, the view a client rebuilds from the events
//! equals the cache at every quiescent point, the backlog marker appears
//! exactly once, no event exceeds the size limit, and per node the states
//! arrive in increasing revision order without duplicates.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use proptest::prelude::*;
use prost::Message;

use super::*;
use crate::store::Revision;

/// Encodes `id@revision` padded to `size` bytes, so the client can read
/// back which state of which node it got.
fn encoded(id: &str, revision: Revision, size: usize) -> Bytes {
    let mut s = format!("{id}@{revision}@");
    while s.len() < size {
        s.push('x');
    }
    let node = metropolis_proto::prelude::curator::Node {
        id: s,
        ..Default::default()
    };
    Bytes::from(node.encode_to_vec())
}

fn parse(bytes: &Bytes) -> (String, Revision) {
    let node = metropolis_proto::prelude::curator::Node::decode(bytes.as_ref())
        .expect("test payload is a Node");
    let mut parts = node.id.split('@');
    let id = parts.next().expect("id").to_string();
    let rev = parts.next().expect("rev").parse().expect("revision number");
    (id, rev)
}

#[derive(Clone, Debug)]
enum Step {
    /// Put node `id` with a payload of `size` bytes.
    Put { id: u8, size: usize },
    /// Delete node `id` (no-op if absent).
    Delete { id: u8 },
    /// The client reads up to `n` events.
    Read { n: usize },
    /// Replace the cache from a snapshot in which these nodes changed.
    Resync { drop: u8, touch: u8 },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0u8..24, 10usize..400).prop_map(|(id, size)| Step::Put { id, size }),
        2 => (0u8..24).prop_map(|id| Step::Delete { id }),
        3 => (0usize..4).prop_map(|n| Step::Read { n }),
        1 => (0u8..24, 0u8..24).prop_map(|(drop, touch)| Step::Resync { drop, touch }),
    ]
}

/// The client side: rebuilds a view and checks ordering rules.
#[derive(Default)]
struct Client {
    view: BTreeMap<String, Bytes>,
    last_rev: BTreeMap<String, Revision>,
    markers: usize,
    events_after_marker_in_backlog: bool,
}

impl Client {
    fn receive(&mut self, ev: &metropolis_proto::wire::EncodedWatchEvent, limit: usize) {
        let wire = ev.encode_to_vec();
        let single = ev.nodes.len() + ev.tombstones.len() == 1;
        assert!(
            wire.len() <= limit || single,
            "event of {} bytes exceeds {limit}",
            wire.len()
        );
        // Decode with the ordinary generated type, as a real client would.
        let plain = metropolis_proto::prelude::curator::WatchEvent::decode(wire.as_slice())
            .expect("decodes");
        assert_eq!(
            plain.nodes.len() + plain.node_tombstones.len(),
            ev.nodes.len() + ev.tombstones.len()
        );
        if ev.is_last_backlogged() {
            self.markers += 1;
        }
        for n in &ev.nodes {
            let (id, rev) = parse(n);
            if let Some(&prev) = self.last_rev.get(&id) {
                assert!(rev > prev, "node {id}: got revision {rev} after {prev}");
            }
            self.last_rev.insert(id.clone(), rev);
            self.view.insert(id, n.clone());
        }
        for t in &ev.tombstones {
            self.view.remove(t);
        }
    }
}

struct Harness {
    cache: NodeCache,
    revision: Revision,
    limit: usize,
}

impl Harness {
    fn apply(&mut self, change: NodeChange, streams: &mut [&mut dyn FnMut(&NodeChange)]) {
        if self.cache.handle_change(&change) {
            for s in streams.iter_mut() {
                s(&change);
            }
        }
    }

    fn step_to_changes(&mut self, step: &Step) -> Vec<NodeChange> {
        match *step {
            Step::Put { id, size } => {
                self.revision += 1;
                let id: Arc<str> = format!("n{id:02}").into();
                vec![NodeChange::Put(CachedNode {
                    encoded: encoded(&id, self.revision, size),
                    id,
                    revision: self.revision,
                })]
            }
            Step::Delete { id } => {
                let id: Arc<str> = format!("n{id:02}").into();
                if self.cache.get(&id).is_none() {
                    return vec![];
                }
                self.revision += 1;
                vec![NodeChange::Delete {
                    id,
                    revision: self.revision,
                }]
            }
            Step::Read { .. } => vec![],
            Step::Resync { drop, touch } => {
                // The store moved on while the cache was not watching: one
                // node vanished, another changed, in one revision.
                self.revision += 1;
                let drop = format!("n{drop:02}");
                let touch = format!("n{touch:02}");
                let mut snapshot: Vec<CachedNode> = self
                    .cache
                    .nodes_after(None)
                    .filter(|n| *n.id != *drop)
                    .cloned()
                    .collect();
                for n in snapshot.iter_mut() {
                    if *n.id == *touch {
                        n.revision = self.revision;
                        n.encoded = encoded(&touch, self.revision, 50);
                    }
                }
                self.cache.handle_resync(self.revision, snapshot)
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn nodes_watch_converges(initial in proptest::collection::vec(step(), 0..30),
                             steps in proptest::collection::vec(step(), 0..120),
                             limit in 300usize..2000) {
        let mut h = Harness { cache: NodeCache::new(), revision: 1, limit };
        // History before the watch starts.
        for s in &initial {
            let resync = matches!(s, Step::Resync { .. });
            for c in h.step_to_changes(s) {
                if !resync { h.cache.handle_change(&c); }
            }
        }
        let mut watch = NodesWatch::new(h.limit);
        let mut client = Client::default();
        let mut saw_marker_event_index = None;
        let mut events = 0usize;
        let mut deliver = |watch: &mut NodesWatch, cache: &NodeCache, client: &mut Client, n: usize| {
            for _ in 0..n {
                let Some(ev) = watch.poll_event(cache) else { break };
                if client.markers > 0 && !watch.is_live() {
                    client.events_after_marker_in_backlog = true;
                }
                client.receive(&ev, limit);
                events += 1;
                if ev.is_last_backlogged() { saw_marker_event_index = Some(events); }
            }
        };
        for s in &steps {
            if let Step::Read { n } = s {
                deliver(&mut watch, &h.cache, &mut client, *n);
                continue;
            }
            let resync = matches!(s, Step::Resync { .. });
            for c in h.step_to_changes(s) {
                if resync {
                    watch.handle_change(&c);
                } else {
                    let w = &mut watch;
                    h.apply(c, &mut [&mut |c: &NodeChange| {
                        w.handle_change(c);
                    }]);
                }
            }
        }
        // Quiescent point: drain.
        deliver(&mut watch, &h.cache, &mut client, usize::MAX);
        prop_assert_eq!(client.markers, 1);
        prop_assert!(!client.events_after_marker_in_backlog);
        prop_assert!(saw_marker_event_index.is_some());
        let expected: BTreeMap<String, Bytes> =
            h.cache.nodes_after(None).map(|n| (n.id.to_string(), n.encoded.clone())).collect();
        prop_assert_eq!(&client.view, &expected);
        prop_assert_eq!(watch.pending_len(), 0);
    }

    /// The same with streams taking the shared encoded backlog
    /// (`poll_encoded`), several of them opening at different points of
    /// the history: each converges to the cache, with one marker.
    #[test]
    fn shared_backlog_streams_converge(initial in proptest::collection::vec(step(), 0..30),
                                       steps in proptest::collection::vec(step(), 0..120),
                                       opens in proptest::collection::vec(0usize..120, 1..4),
                                       limit in 300usize..2000) {
        let mut h = Harness { cache: NodeCache::new(), revision: 1, limit };
        for s in &initial {
            let resync = matches!(s, Step::Resync { .. });
            for c in h.step_to_changes(s) {
                if !resync { h.cache.handle_change(&c); }
            }
        }
        let mut streams: Vec<(NodesWatch, Client)> = Vec::new();
        let deliver = |streams: &mut Vec<(NodesWatch, Client)>, cache: &mut NodeCache, n: usize| {
            for (watch, client) in streams.iter_mut() {
                for _ in 0..n {
                    let Some(bytes) = watch.poll_encoded(cache) else { break };
                    let ev = metropolis_proto::wire::EncodedWatchEvent::decode(bytes)
                        .expect("decodes");
                    if client.markers > 0 && !watch.is_live() {
                        client.events_after_marker_in_backlog = true;
                    }
                    client.receive(&ev, limit);
                }
            }
        };
        for (i, s) in steps.iter().enumerate() {
            for _ in opens.iter().filter(|&&at| at == i) {
                streams.push((NodesWatch::new(limit), Client::default()));
            }
            if let Step::Read { n } = s {
                deliver(&mut streams, &mut h.cache, *n);
                continue;
            }
            let resync = matches!(s, Step::Resync { .. });
            for c in h.step_to_changes(s) {
                // A resync's changes are already in the cache.
                if resync || h.cache.handle_change(&c) {
                    for (w, _) in streams.iter_mut() { w.handle_change(&c); }
                }
            }
        }
        for _ in opens.iter().filter(|&&at| at >= steps.len()) {
            streams.push((NodesWatch::new(limit), Client::default()));
        }
        deliver(&mut streams, &mut h.cache, usize::MAX);
        let expected: BTreeMap<String, Bytes> =
            h.cache.nodes_after(None).map(|n| (n.id.to_string(), n.encoded.clone())).collect();
        for (watch, client) in &streams {
            prop_assert_eq!(client.markers, 1);
            prop_assert!(!client.events_after_marker_in_backlog);
            prop_assert_eq!(&client.view, &expected);
            prop_assert_eq!(watch.pending_len(), 0);
        }
    }

    #[test]
    fn node_watch_sequence(steps in proptest::collection::vec(step(), 0..80), watched in 0u8..4) {
        let mut h = Harness { cache: NodeCache::new(), revision: 1, limit: usize::MAX };
        let id: Arc<str> = format!("n{watched:02}").into();
        let mut watch = NodeWatch::new(id.clone(), &h.cache);
        let mut last_rev = 0;
        let mut tombstones = 0;
        let mut view: Option<Bytes> = None;
        let mut ever_deleted = false;
        for s in &steps {
            if let Step::Read { n } = s {
                for _ in 0..*n {
                    let Some(ev) = watch.poll_event() else { break };
                    prop_assert_eq!(tombstones, 0, "no event after the tombstone");
                    for n in &ev.nodes {
                        let (nid, rev) = parse(n);
                        prop_assert_eq!(&nid, &*id);
                        prop_assert!(rev > last_rev);
                        last_rev = rev;
                        view = Some(n.clone());
                    }
                    tombstones += ev.tombstones.len();
                    if !ev.tombstones.is_empty() { view = None; }
                }
                continue;
            }
            let resync = matches!(s, Step::Resync { .. });
            for c in h.step_to_changes(s) {
                if matches!(c, NodeChange::Delete { ref id, .. } if **id == *watch.node_id()) {
                    ever_deleted = true;
                }
                if resync {
                    watch.handle_change(&c);
                } else {
                    let w = &mut watch;
                    h.apply(c, &mut [&mut |c: &NodeChange| {
                        w.handle_change(c);
                    }]);
                }
            }
        }
        while let Some(ev) = watch.poll_event() {
            prop_assert_eq!(tombstones, 0, "no event after the tombstone");
            if let Some(n) = ev.nodes.last() { view = Some(n.clone()); }
            tombstones += ev.tombstones.len();
            if !ev.tombstones.is_empty() { view = None; }
        }
        prop_assert!(tombstones <= 1);
        prop_assert_eq!(tombstones == 1, ever_deleted);
        if !ever_deleted {
            prop_assert_eq!(view, h.cache.get(&id).map(|n| n.encoded.clone()));
        }
    }
}

#[test]
fn empty_cluster_backlog_is_one_marker_event() {
    let cache = NodeCache::new();
    let mut w = NodesWatch::new(MAX_EVENT_BYTES);
    let ev = w.poll_event(&cache).expect("backlog event");
    assert!(ev.nodes.is_empty());
    assert!(ev.is_last_backlogged());
    assert!(w.poll_event(&cache).is_none());
}

#[test]
fn large_backlog_is_chunked_with_one_marker() {
    let mut cache = NodeCache::new();
    for i in 0..100 {
        let id: Arc<str> = format!("n{i:03}").into();
        cache.handle_change(&NodeChange::Put(CachedNode {
            encoded: encoded(&id, 2 + i, 50_000),
            id,
            revision: 2 + i,
        }));
    }
    let mut w = NodesWatch::new(MAX_EVENT_BYTES);
    let mut events = Vec::new();
    while let Some(ev) = w.poll_event(&cache) {
        events.push(ev);
    }
    assert!(
        events.len() >= 3,
        "5 MB of nodes needs at least 3 events of 2 MiB"
    );
    assert!(events.iter().all(|e| e.encoded_len() <= MAX_EVENT_BYTES));
    assert_eq!(events.iter().filter(|e| e.is_last_backlogged()).count(), 1);
    assert!(events.last().expect("events").is_last_backlogged());
    assert_eq!(events.iter().map(|e| e.nodes.len()).sum::<usize>(), 100);
}

/// Streams opening at one revision share one encoding of the backlog (the
/// same bytes, not copies); a change makes the next stream's backlog a new
/// encoding that holds it, and is queued for a stream that took the old
/// one.
#[test]
fn streams_share_the_backlog_encoded_once_per_revision() {
    let mut cache = NodeCache::new();
    let put = |cache: &mut NodeCache, i: i64, revision: Revision| {
        let id: Arc<str> = format!("n{i:03}").into();
        let change = NodeChange::Put(CachedNode {
            encoded: encoded(&id, revision, 100),
            id,
            revision,
        });
        assert!(cache.handle_change(&change));
        change
    };
    for i in 0..50 {
        put(&mut cache, i, 2 + i);
    }
    let mut a = NodesWatch::new(1000);
    let mut b = NodesWatch::new(1000);
    let first_a = a.poll_encoded(&mut cache).expect("a backlog");
    let first_b = b.poll_encoded(&mut cache).expect("b backlog");
    assert_eq!(first_a.as_ptr(), first_b.as_ptr(), "one encoding, shared");
    // The encoding is that of the lazy backlog, event for event.
    let mut lazy = NodesWatch::new(1000);
    let mut lazy_events = Vec::new();
    while let Some(ev) = lazy.poll_event(&cache) {
        lazy_events.push(Bytes::from(ev.encode_to_vec()));
    }
    let mut shared = vec![first_a];
    while !a.is_live() {
        shared.push(a.poll_encoded(&mut cache).expect("the rest of the backlog"));
    }
    assert!(
        shared.len() > 1,
        "50 nodes of 100 bytes need several 1000-byte events"
    );
    assert_eq!(shared, lazy_events);
    // A change: queued for the streams that took the old encoding, and in
    // the next stream's new one.
    let change = put(&mut cache, 7, 100);
    a.handle_change(&change);
    let live = a.poll_encoded(&mut cache).expect("the change");
    let live = metropolis_proto::wire::EncodedWatchEvent::decode(live).expect("decodes");
    assert_eq!(live.nodes.len(), 1);
    assert_eq!(parse(&live.nodes[0]), ("n007".to_string(), 100));
    let mut c = NodesWatch::new(1000);
    let first_c = c.poll_encoded(&mut cache).expect("c backlog");
    assert_ne!(
        first_c.as_ptr(),
        shared[0].as_ptr(),
        "a new encoding after a change"
    );
    let mut seen = Vec::new();
    let mut next = Some(first_c);
    while let Some(bytes) = next {
        let ev = metropolis_proto::wire::EncodedWatchEvent::decode(bytes).expect("decodes");
        seen.extend(ev.nodes.iter().map(parse));
        next = c.poll_encoded(&mut cache);
    }
    assert_eq!(seen.len(), 50);
    assert!(seen.contains(&("n007".to_string(), 100)));
}
