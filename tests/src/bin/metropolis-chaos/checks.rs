//! The checks every schedule's history must pass:
//!
//! - per node, `UpdateNodeStatus` is linearizable as a register (the test
//!   kit's Wing–Gong search) over every write (an acknowledged one
//!   between its call and its answer; one that failed or was given up
//!   may have happened at any time after its call, or never) and every
//!   placed read (probe backlogs, the final reads after healing); and,
//!   said plainly, no acknowledged write is lost from the final state;
//! - every watcher (a node view of the client library): `Synced` exactly
//!   once and before any `Resynced`, no more `Resynced` than
//!   `Reconnecting`, a `NodeInCluster` view only ever shows its node, and
//!   no node's state older than one it already showed (per writer, the
//!   sequence never goes back, but to a write whose outcome is unknown
//!   and which it had not shown: such a write may land after later ones);
//!   its final view is the store's;
//! - raw Watch streams (the probes): one backlog marker, no state going
//!   back (the same exception);
//! - after healing, every writer and agent is served again within the
//!   lease TTL plus [`crate::RECOVERY_BOUND`];
//! - no process exited but those the schedule killed.

use std::collections::BTreeMap;

use metropolis_testkit::linearizable::{self, Op, OpKind};

use crate::history::{Back, History, Micros, NodeState, Seen, WatchKind, WatcherLog};

/// A failed check.
#[derive(Clone, Debug)]
pub struct Violation {
    /// Which check.
    pub check: &'static str,
    /// What was wrong.
    pub detail: String,
}

fn violation(check: &'static str, detail: String) -> Violation {
    Violation { check, detail }
}

/// Linearizability of each node's register, and no acknowledged write
/// lost from `store` (the final state, by node index).
pub fn registers(h: &History, store: &BTreeMap<usize, i64>) -> Vec<Violation> {
    let mut out = Vec::new();
    for node in 0..h.nodes.len() {
        let mut ops: Vec<Op<i64>> = Vec::new();
        for w in h.writes.iter().filter(|w| w.node == node) {
            ops.push(Op {
                called: w.called,
                returned: w.error.is_none().then_some(w.returned),
                kind: OpKind::Write(w.seq),
            });
        }
        for r in h.reads.iter().filter(|r| r.node == node) {
            ops.push(Op {
                called: r.called,
                returned: Some(r.returned),
                kind: OpKind::Read(r.seq),
            });
        }
        if let Err(failure) = linearizable::check(Some(0), &ops) {
            out.push(violation(
                "linearizable",
                format!(
                    "node {node}'s status is not linearizable:\n{}",
                    linearizable::explain(&ops, &failure)
                ),
            ));
        }
        let acked = h
            .writes
            .iter()
            .filter(|w| w.node == node && w.error.is_none())
            .map(|w| w.seq)
            .max()
            .unwrap_or(0);
        match store.get(&node) {
            // A write of unknown outcome may land after every later one.
            Some(&seq) if seq >= acked || h.unknown_write(node, seq) => {}
            Some(&seq) => out.push(violation(
                "acknowledged write lost",
                format!("node {node}: update {acked} was acknowledged, the store ends at {seq}"),
            )),
            None => out.push(violation(
                "acknowledged write lost",
                format!("node {node} is missing from the final read"),
            )),
        }
    }
    for p in &h.protocol {
        out.push(violation("watch protocol", p.clone()));
    }
    for back in h.backs.iter().filter(|b| !h.back_allowed(b)) {
        out.push(violation(
            "watch never goes back",
            format!(
                "{} went back on node {}: sequence {}, then {}{}",
                back.who,
                back.node,
                back.from,
                back.to,
                if back.shown_before {
                    " (shown before)"
                } else {
                    " (an acknowledged write)"
                }
            ),
        ));
    }
    out
}

/// One watcher's stream, and its final view against `store` (node ID to
/// state; the campaign's nodes by `ids`).
pub fn watcher(
    log: &WatcherLog,
    final_view: &BTreeMap<String, NodeState>,
    store: &BTreeMap<String, NodeState>,
    ids: &[String],
    h: &History,
) -> Vec<Violation> {
    let mut out = Vec::new();
    let name = &log.name;
    let (mut synced, mut resynced, mut reconnecting) = (0usize, 0usize, 0usize);
    let mut highest: BTreeMap<usize, i64> = BTreeMap::new();
    let mut shown: std::collections::BTreeSet<(usize, i64)> = std::collections::BTreeSet::new();
    let mut first_back = None;
    for (at, seen) in &log.events {
        match seen {
            Seen::Synced => synced += 1,
            Seen::Resynced => {
                resynced += 1;
                if synced == 0 {
                    out.push(violation(
                        "watch synced once",
                        format!("{name}: Resynced at {} before any Synced", secs(*at)),
                    ));
                }
            }
            Seen::Reconnecting(_) => reconnecting += 1,
            Seen::Changed(NodeState::Ours { node, seq, .. }) => {
                if let WatchKind::Node(k) = log.kind
                    && k != *node
                {
                    out.push(violation(
                        "watch of one node",
                        format!("{name}: showed node {node}"),
                    ));
                }
                let top = highest.entry(*node).or_insert(0);
                let back = Back {
                    who: name.clone(),
                    node: *node,
                    from: *top,
                    to: *seq,
                    shown_before: shown.contains(&(*node, *seq)),
                };
                shown.insert((*node, *seq));
                if *seq < *top && first_back.is_none() && !h.back_allowed(&back) {
                    first_back = Some(format!(
                        "{name}: node {node} went back from update {top} to {seq} at {}",
                        secs(*at)
                    ));
                }
                *top = (*top).max(*seq);
            }
            Seen::Changed(NodeState::Other(id)) | Seen::Removed(id) => {
                if let WatchKind::Node(k) = log.kind {
                    out.push(violation(
                        "watch of one node",
                        format!("{name}: showed node {id}, not node {k}"),
                    ));
                }
            }
        }
    }
    if synced != 1 {
        out.push(violation(
            "watch synced once",
            format!("{name}: Synced {synced} times"),
        ));
    }
    if resynced > reconnecting {
        out.push(violation(
            "watch synced once",
            format!("{name}: {resynced} Resynced after {reconnecting} reconnects"),
        ));
    }
    if let Some(back) = first_back {
        out.push(violation("watch never goes back", back));
    }
    let expected: BTreeMap<String, NodeState> = match log.kind {
        WatchKind::Nodes => store.clone(),
        WatchKind::Node(k) => store
            .iter()
            .filter(|(id, _)| ids.get(k) == Some(*id))
            .map(|(id, s)| (id.clone(), s.clone()))
            .collect(),
    };
    if *final_view != expected {
        out.push(violation(
            "final view is the store's",
            format!(
                "{name}: ends at {} against the store's {}",
                show(final_view),
                show(&expected)
            ),
        ));
    }
    out
}

/// Whether each client was served again by `bound` (after healing at
/// `healed`): writers by their writes, agents by their heartbeats.
pub fn recovery(h: &History, healed: Micros, bound: Micros) -> Vec<Violation> {
    let mut out = Vec::new();
    for node in 0..h.nodes.len() {
        let first = h
            .writes
            .iter()
            .filter(|w| w.node == node && w.error.is_none() && w.returned >= healed)
            .map(|w| w.returned)
            .min();
        check_served(&mut out, &format!("writer {node}"), first, healed, bound);
    }
    let agents = h.beats.iter().map(|b| b.agent).max().map_or(0, |a| a + 1);
    for agent in 0..agents {
        let first = h
            .beats
            .iter()
            .filter(|b| b.agent == agent && b.ok && b.returned >= healed)
            .map(|b| b.returned)
            .min();
        check_served(&mut out, &format!("agent {agent}"), first, healed, bound);
    }
    out
}

fn check_served(
    out: &mut Vec<Violation>,
    who: &str,
    first: Option<Micros>,
    healed: Micros,
    bound: Micros,
) {
    match first {
        Some(t) if t <= healed + bound => {}
        Some(t) => out.push(violation(
            "served again after healing",
            format!(
                "{who}: first served {:.1} s after healing (bound {:.1} s)",
                (t - healed) as f64 / 1e6,
                bound as f64 / 1e6
            ),
        )),
        None => out.push(violation(
            "served again after healing",
            format!("{who}: not served again after healing"),
        )),
    }
}

/// Processes that exited unasked.
pub fn exits(unexpected: &[String]) -> Vec<Violation> {
    unexpected
        .iter()
        .map(|e| violation("no unexpected exit", e.clone()))
        .collect()
}

fn secs(at: Micros) -> String {
    format!("{:.3} s", at as f64 / 1e6)
}

fn show(view: &BTreeMap<String, NodeState>) -> String {
    let parts: Vec<String> = view
        .values()
        .map(|s| match s {
            NodeState::Ours { node, seq, .. } => format!("node {node}@{seq}"),
            NodeState::Other(id) => id.chars().take(18).collect(),
        })
        .collect();
    format!("[{}]", parts.join(", "))
}
