//! The watch machines under arbitrary change sequences and read patterns:
//! every event fits the size limit, the backlog marker appears exactly
//! once, per node states only move forward, and after a final drain the
//! client's view equals the cache.

#![no_main]

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use metropolis_core::watch::{CachedNode, NodeCache, NodeChange, NodesWatch};
use prost::Message;

fuzz_target!(|data: &[u8]| {
    let limit = 200 + usize::from(data.first().copied().unwrap_or(0)) * 8;
    let mut cache = NodeCache::new();
    let mut watch = NodesWatch::new(limit);
    let mut revision = 1i64;
    let mut view: BTreeMap<String, Bytes> = BTreeMap::new();
    let mut last_rev: BTreeMap<String, i64> = BTreeMap::new();
    let mut markers = 0;
    let mut read = |watch: &mut NodesWatch, cache: &NodeCache, n: usize| {
        for _ in 0..n {
            let Some(ev) = watch.poll_event(cache) else { break };
            let wire = ev.encode_to_vec();
            assert!(wire.len() <= limit || ev.nodes.len() + ev.tombstones.len() == 1);
            if ev.is_last_backlogged() {
                markers += 1;
            }
            for n in &ev.nodes {
                let s = std::str::from_utf8(n).expect("payload is UTF-8");
                let (id, rev) = s.split_once('@').expect("id@rev");
                let rev: i64 = rev.trim_end_matches('x').parse().expect("revision");
                if let Some(prev) = last_rev.insert(id.to_string(), rev) {
                    assert!(rev > prev, "node {id}: {rev} after {prev}");
                }
                view.insert(id.to_string(), n.clone());
            }
            for t in &ev.tombstones {
                view.remove(t);
            }
        }
    };
    for chunk in data.get(1..).unwrap_or_default().chunks(2) {
        let (op, arg) = (chunk[0], chunk.get(1).copied().unwrap_or(0));
        let id: Arc<str> = format!("n{:02}", arg % 32).into();
        match op % 4 {
            0 | 1 => {
                revision += 1;
                let mut payload = format!("{id}@{revision}");
                payload.push_str(&"x".repeat(usize::from(op / 4)));
                let change = NodeChange::Put(CachedNode { id, revision, encoded: Bytes::from(payload) });
                if cache.handle_change(&change) {
                    watch.handle_change(&change);
                }
            }
            2 => {
                if cache.get(&id).is_some() {
                    revision += 1;
                    let change = NodeChange::Delete { id, revision };
                    if cache.handle_change(&change) {
                        watch.handle_change(&change);
                    }
                }
            }
            _ => read(&mut watch, &cache, usize::from(arg % 4)),
        }
    }
    read(&mut watch, &cache, usize::MAX);
    assert_eq!(markers, 1);
    let expected: BTreeMap<String, Bytes> =
        cache.nodes_after(None).map(|n| (n.id.to_string(), n.encoded.clone())).collect();
    assert_eq!(view, expected);
});
