//! What the clients saw, with times: every write's call and answer, every
//! read (a fresh Watch's backlog, placed between the call and the backlog's
//! end), every watcher's stream of events, every heartbeat. Times are
//! microseconds since the schedule began, on this process's monotonic
//! clock.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

/// Microseconds since the schedule began.
pub type Micros = u64;

/// The schedule's clock.
#[derive(Clone, Copy, Debug)]
pub struct Clock(Instant);

impl Clock {
    /// A clock starting now.
    pub fn start() -> Clock {
        Clock(Instant::now())
    }

    /// Now.
    pub fn now(&self) -> Micros {
        u64::try_from(self.0.elapsed().as_micros()).unwrap_or(u64::MAX)
    }
}

/// An `UpdateNodeStatus` as its writer saw it.
#[derive(Clone, Debug)]
pub struct WriteOp {
    /// The node (writer) index.
    pub node: usize,
    /// The sequence number written.
    pub seq: i64,
    /// When called.
    pub called: Micros,
    /// When the answer (or the give-up) came.
    pub returned: Micros,
    /// `None`: acknowledged; otherwise why not (the outcome is unknown).
    pub error: Option<String>,
}

/// A read of one node's sequence number.
#[derive(Clone, Debug)]
pub struct ReadOp {
    /// The node index.
    pub node: usize,
    /// What was read (`0`: no status yet; `None`: no such node).
    pub seq: Option<i64>,
    /// When the Watch was called.
    pub called: Micros,
    /// When its backlog (or first event) ended.
    pub returned: Micros,
}

/// One event a watcher received, as the client library hands it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Seen {
    /// The first backlog ended.
    Synced,
    /// The stream broke; the library reconnects.
    Reconnecting(String),
    /// A later backlog ended (after a reconnect).
    Resynced,
    /// A node's state: one of ours (its index and sequence number) or
    /// another node (a curator's own), by ID.
    Changed(NodeState),
    /// A node went away.
    Removed(String),
}

/// A node's state as far as the checks care.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum NodeState {
    /// One of the campaign's nodes: its index, sequence and writer index.
    Ours {
        /// The node index.
        node: usize,
        /// `status.version.release.patch`.
        seq: i64,
        /// `status.version.release.minor`.
        writer: i64,
    },
    /// Another node, by ID.
    Other(String),
}

/// Which stream a watcher follows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchKind {
    /// `NodesInCluster`.
    Nodes,
    /// `NodeInCluster` of node `i`.
    Node(usize),
}

/// One watcher's whole stream.
#[derive(Clone, Debug)]
pub struct WatcherLog {
    /// Its name (`nodes@curator-1`, `node-2@curator-0`).
    pub name: String,
    /// What it watches.
    pub kind: WatchKind,
    /// Its events with the time each arrived.
    pub events: Vec<(Micros, Seen)>,
}

/// A heartbeat.
#[derive(Clone, Debug)]
pub struct BeatOp {
    /// The agent index.
    pub agent: usize,
    /// When it was answered (or given up).
    pub returned: Micros,
    /// Whether it was answered OK.
    pub ok: bool,
}

/// A schedule's whole history.
#[derive(Debug, Default)]
pub struct History {
    /// The campaign's nodes' IDs, by index.
    pub nodes: Vec<String>,
    /// Every write.
    pub writes: Vec<WriteOp>,
    /// Every placed read.
    pub reads: Vec<ReadOp>,
    /// Every heartbeat.
    pub beats: Vec<BeatOp>,
    /// Breaches of the Watch protocol seen on raw streams (a second
    /// backlog marker).
    pub protocol: Vec<String>,
    /// Raw streams that showed a node's sequence going back, judged once
    /// every write's outcome is known (see [`Back`]).
    pub backs: Vec<Back>,
}

/// A stream that showed node `node` at sequence `from`, then at `to <
/// from`. Correct only when `to`'s write has an unknown outcome (it may
/// land at any time after its call, so after later writes too) and the
/// stream had not shown `to` before; `shown_before` says whether it had.
#[derive(Clone, Debug)]
pub struct Back {
    /// Which stream.
    pub who: String,
    /// The node index.
    pub node: usize,
    /// The sequence shown before.
    pub from: i64,
    /// The lower sequence shown after it.
    pub to: i64,
    /// Whether the stream had shown `to` before.
    pub shown_before: bool,
}

impl History {
    /// Whether node `node`'s write `seq` ended without an answer (its
    /// outcome unknown: it may have been applied, or may be later).
    pub fn unknown_write(&self, node: usize, seq: i64) -> bool {
        self.writes
            .iter()
            .any(|w| w.node == node && w.seq == seq && w.error.is_some())
    }

    /// Whether going back as `back` did is allowed: only to a write of
    /// unknown outcome the stream had not shown before.
    pub fn back_allowed(&self, back: &Back) -> bool {
        !back.shown_before && self.unknown_write(back.node, back.to)
    }
}

/// The history, shared by the workload's tasks.
#[derive(Clone, Default)]
pub struct Recorder(Arc<Mutex<History>>);

impl Recorder {
    /// The history, locked.
    pub fn lock(&self) -> MutexGuard<'_, History> {
        match self.0.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }
}
