//! `watch_machine`: [`NodeCache`] with [`NodesWatch`] and [`NodeWatch`]
//! stream machines under arbitrary puts, deletes, resyncs, reads and event
//! size limits.
//!
//! Input: byte 0 sets the event size limit (`200 + 8 * b`); then pairs
//! `(op, arg)`: `op % 4` is 0 or 1: put node `n{arg % 32}` with a payload
//! `op / 4` bytes longer; 2: delete it if present (or, when
//! `(op / 4) % 8 == 7`, resync the cache from a snapshot missing the nodes
//! whose index bit is set in `arg`, plus node `n{arg % 32}`); 3: read
//! `arg % 4` events from every stream.
//!
//! Checked: every event within the limit (or a single oversized node),
//! `PROGRESS_LAST_BACKLOGGED` exactly once, per node revisions strictly
//! increasing on every stream, a `NodeInCluster` stream silent after its
//! tombstone, and after a final drain every stream's view equals the cache.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use metropolis_core::watch::{CachedNode, NodeCache, NodeChange, NodeWatch, NodesWatch};
use metropolis_proto::wire::EncodedWatchEvent;
use prost::Message;

/// The node IDs with a `NodeInCluster` stream of their own.
const SINGLE: [&str; 4] = ["n00", "n01", "n02", "n07"];

/// `(id, revision)` of a node payload `id@revision[x...]`.
fn parse(node: &Bytes) -> (String, i64) {
    let s = std::str::from_utf8(node).expect("payload is UTF-8");
    let (id, rev) = s.split_once('@').expect("id@rev");
    let rev: i64 = rev.trim_end_matches('x').parse().expect("revision");
    (id.to_string(), rev)
}

/// What one `NodeInCluster` stream showed its client.
struct Single {
    machine: NodeWatch,
    view: Option<Bytes>,
    tombstoned: bool,
    last_rev: Option<i64>,
}

/// What the `NodesInCluster` stream showed its client.
struct All {
    machine: NodesWatch,
    view: BTreeMap<String, Bytes>,
    last_rev: BTreeMap<String, i64>,
    markers: usize,
}

struct World {
    limit: usize,
    cache: NodeCache,
    all: All,
    singles: Vec<Single>,
    revision: i64,
}

impl World {
    fn apply(&mut self, change: &NodeChange) {
        if self.cache.handle_change(change) {
            self.feed(change);
        }
    }

    fn feed(&mut self, change: &NodeChange) {
        self.all.machine.handle_change(change);
        for s in &mut self.singles {
            s.machine.handle_change(change);
        }
    }

    fn check_size(&self, ev: &EncodedWatchEvent) {
        let wire = ev.encode_to_vec();
        assert!(
            wire.len() <= self.limit || ev.nodes.len() + ev.tombstones.len() == 1,
            "event of {} bytes over the limit {}",
            wire.len(),
            self.limit
        );
    }

    fn read(&mut self, n: usize) {
        for _ in 0..n {
            let Some(ev) = self.all.machine.poll_event(&self.cache) else {
                break;
            };
            self.check_size(&ev);
            if ev.is_last_backlogged() {
                self.all.markers += 1;
            }
            for node in &ev.nodes {
                let (id, rev) = parse(node);
                if let Some(prev) = self.all.last_rev.insert(id.clone(), rev) {
                    assert!(rev > prev, "node {id}: {rev} after {prev}");
                }
                self.all.view.insert(id, node.clone());
            }
            for t in &ev.tombstones {
                self.all.view.remove(t);
            }
        }
        for i in 0..self.singles.len() {
            for _ in 0..n {
                let Some(ev) = self.singles[i].machine.poll_event() else {
                    break;
                };
                self.check_size(&ev);
                let s = &mut self.singles[i];
                let id = s.machine.node_id().to_string();
                assert!(!s.tombstoned, "node {id}: event after its tombstone");
                match (&ev.nodes[..], &ev.tombstones[..]) {
                    ([node], []) => {
                        let (got, rev) = parse(node);
                        assert_eq!(got, id, "a NodeInCluster stream sent another node");
                        if let Some(prev) = s.last_rev.replace(rev) {
                            assert!(rev > prev, "node {id}: {rev} after {prev}");
                        }
                        s.view = Some(node.clone());
                    }
                    ([], [t]) => {
                        assert_eq!(t, &id, "tombstone of another node");
                        s.view = None;
                        s.tombstoned = true;
                    }
                    _ => panic!("node {id}: malformed event {ev:?}"),
                }
            }
        }
    }

    fn resync(&mut self, arg: u8) {
        self.revision += 1;
        let revision = self.revision;
        let mut snapshot: Vec<CachedNode> = self
            .cache
            .nodes_after(None)
            .enumerate()
            .filter(|(i, _)| arg & (1 << (i % 8)) == 0)
            .map(|(_, n)| n.clone())
            .collect();
        let id: Arc<str> = format!("n{:02}", arg % 32).into();
        if !snapshot.iter().any(|n| n.id == id) {
            snapshot.push(CachedNode {
                encoded: Bytes::from(format!("{id}@{revision}")),
                id,
                revision,
            });
        }
        for change in self.cache.handle_resync(revision, snapshot) {
            self.feed(&change);
        }
    }
}

/// Runs one input; panics if a property fails.
pub fn run(data: &[u8]) {
    let limit = 200 + usize::from(data.first().copied().unwrap_or(0)) * 8;
    let cache = NodeCache::new();
    let singles = SINGLE
        .iter()
        .map(|id| Single {
            machine: NodeWatch::new(Arc::from(*id), &cache),
            view: None,
            tombstoned: false,
            last_rev: None,
        })
        .collect();
    let mut w = World {
        limit,
        cache,
        all: All {
            machine: NodesWatch::new(limit),
            view: BTreeMap::new(),
            last_rev: BTreeMap::new(),
            markers: 0,
        },
        singles,
        revision: 1,
    };
    for chunk in data.get(1..).unwrap_or_default().chunks(2) {
        let (op, arg) = (chunk[0], chunk.get(1).copied().unwrap_or(0));
        let id: Arc<str> = format!("n{:02}", arg % 32).into();
        match op % 4 {
            0 | 1 => {
                w.revision += 1;
                let mut payload = format!("{id}@{}", w.revision);
                payload.push_str(&"x".repeat(usize::from(op / 4)));
                w.apply(&NodeChange::Put(CachedNode {
                    id,
                    revision: w.revision,
                    encoded: Bytes::from(payload),
                }));
            }
            2 if (op / 4) % 8 == 7 => w.resync(arg),
            2 => {
                if w.cache.get(&id).is_some() {
                    w.revision += 1;
                    let revision = w.revision;
                    w.apply(&NodeChange::Delete { id, revision });
                }
            }
            _ => w.read(usize::from(arg % 4)),
        }
    }
    w.read(usize::MAX);
    assert_eq!(w.all.markers, 1, "PROGRESS_LAST_BACKLOGGED not sent once");
    let expected: BTreeMap<String, Bytes> = w
        .cache
        .nodes_after(None)
        .map(|n| (n.id.to_string(), n.encoded.clone()))
        .collect();
    assert_eq!(
        w.all.view, expected,
        "NodesInCluster view differs from the cache"
    );
    for s in &w.singles {
        if !s.tombstoned {
            let id = s.machine.node_id();
            let want = w.cache.get(id).map(|n| n.encoded.clone());
            assert_eq!(
                s.view, want,
                "NodeInCluster {id}: view differs from the cache"
            );
        }
    }
}
