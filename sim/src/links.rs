//! Which simulated nodes reach which: links cut one way or both ways, as
//! a partition or a half-broken route cuts them.
//!
//! A cut link carries nothing; nobody is told. A caller whose request
//! cannot arrive, or whose answer cannot come back, waits
//! [`LINK_TIMEOUT`] and then sees its call fail, as a client's deadline
//! or HTTP/2 keepalive would end it. What the request did on the far side
//! stands: a write whose answer was lost may have committed. Links are
//! checked when something crosses them (a request, each frame of an
//! answer, each batch of a store watch, each lease renewal).

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::runtime::NodeId;

/// How long a caller waits on a link that carries nothing before its call
/// fails.
pub const LINK_TIMEOUT: Duration = Duration::from_secs(2);

/// The cut links of one simulated world; clones share them.
#[derive(Clone, Default)]
pub struct Links(Arc<Mutex<State>>);

#[derive(Default)]
struct State {
    /// Directed links (from, to) that carry nothing.
    cut: BTreeSet<(NodeId, NodeId)>,
    /// Links cut so far, counted once per cut.
    cuts_made: u64,
}

impl Links {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Nothing from `from` reaches `to` (the other way is untouched).
    pub fn cut(&self, from: NodeId, to: NodeId) {
        let mut s = self.lock();
        if from != to && s.cut.insert((from, to)) {
            s.cuts_made += 1;
        }
    }

    /// `node` and each of `others` reach each other no more, both ways.
    pub fn isolate(&self, node: NodeId, others: impl IntoIterator<Item = NodeId>) {
        for other in others {
            self.cut(node, other);
            self.cut(other, node);
        }
    }

    /// Every link carries again.
    pub fn heal(&self) {
        self.lock().cut.clear();
    }

    /// Whether what `from` sends reaches `to` now.
    pub fn up(&self, from: NodeId, to: NodeId) -> bool {
        !self.lock().cut.contains(&(from, to))
    }

    /// Whether `a` and `b` reach each other both ways now.
    pub fn both_up(&self, a: NodeId, b: NodeId) -> bool {
        self.up(a, b) && self.up(b, a)
    }

    /// How many links were cut so far.
    pub fn cuts_made(&self) -> u64 {
        self.lock().cuts_made
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_are_one_way_until_healed() {
        let links = Links::default();
        assert!(links.both_up(0, 1));
        links.cut(0, 1);
        assert!(!links.up(0, 1));
        assert!(links.up(1, 0));
        links.isolate(2, [0, 1]);
        assert!(!links.up(2, 0) && !links.up(1, 2));
        assert_eq!(links.cuts_made(), 5);
        links.heal();
        assert!(links.both_up(0, 1) && links.both_up(2, 1));
        // A node always reaches itself.
        links.cut(3, 3);
        assert!(links.up(3, 3));
    }
}
