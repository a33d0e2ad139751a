//! The messages simulated processes exchange over the [`crate::net`].
//!
//! Unary messages (store calls, RPC calls and their replies) may be
//! dropped, duplicated and reordered. Stream messages (store watches,
//! `Watch` streams) model a TCP connection: FIFO, never duplicated; a
//! dropped one breaks the connection, and both ends get a [`Msg::Reset`].

use std::time::Duration;

use bytes::Bytes;
use metropolis_core::leadership::ElectionKey;
use metropolis_core::ports::WatchBatch;
use metropolis_core::store::{LeaseId, Revision, StoreError, Txn, TxnResponse};
use metropolis_proto::prelude::agent::HeartbeatRequest;
use metropolis_proto::wire::EncodedWatchEvent;

/// A process address: an index into the world's process table.
pub type Addr = usize;
/// Correlates a store call with its reply (unique per run).
pub type OpId = u64;
/// Correlates an RPC call with its reply (unique per run).
pub type CallId = u64;
/// Names one stream (unique per run).
pub type StreamId = u64;

/// What the simulator knows about a write sent to the store, for the
/// checks (never read by the store model itself).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WriteTag {
    /// The curator that sent it.
    pub author: usize,
    /// The election key its author believed it led with.
    pub believed: ElectionKey,
    /// The client call it serves.
    pub call: CallId,
}

/// An RPC of the curator's clients (Curator, AgentCallback, the
/// operator's machine management), as the simulator carries it.
#[derive(Clone, Debug, PartialEq)]
pub enum Call {
    /// Register a node (create-only).
    CreateNode {
        /// The node's ID.
        id: String,
        /// The encoded `curator.api.Node`.
        encoded: Bytes,
    },
    /// `UpdateNodeStatus`: overwrite an existing node.
    UpdateNode {
        /// The node's ID.
        id: String,
        /// The encoded `curator.api.Node` with its new status.
        encoded: Bytes,
    },
    /// Remove a node.
    DeleteNode {
        /// The node's ID.
        id: String,
    },
    /// `AgentCallback.Heartbeat`.
    Heartbeat {
        /// The heartbeat.
        request: HeartbeatRequest,
    },
    /// An operator's installation request for a machine.
    Submit {
        /// The machine.
        machine: String,
        /// The encoded `OSInstallationRequest`.
        request: Bytes,
    },
}

/// A successful reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CallOk {
    /// The write committed.
    Done,
    /// The heartbeat's response: the offered installation request.
    Heartbeat(Option<Bytes>),
}

/// A failed reply, by gRPC code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallError {
    /// Unavailable: retryable (no leader, backend switched, lost
    /// leadership, store failure).
    Unavailable,
    /// Aborted: too many compare-and-swap conflicts; retryable.
    Aborted,
    /// NotFound (unknown node or machine).
    NotFound,
    /// AlreadyExists (node exists).
    AlreadyExists,
}

impl CallError {
    /// Whether the client may retry.
    pub fn retryable(self) -> bool {
        matches!(self, CallError::Unavailable | CallError::Aborted)
    }
}

/// One message.
#[derive(Clone, Debug)]
pub enum Msg {
    /// Curator to store: a transaction.
    Txn {
        /// Correlation.
        op: OpId,
        /// The transaction.
        txn: Txn,
        /// For leader writes: what the checks need.
        tag: Option<WriteTag>,
    },
    /// Store to curator.
    TxnReply {
        /// Correlation.
        op: OpId,
        /// The result.
        result: Result<TxnResponse, StoreError>,
    },
    /// Curator to store: grant a lease.
    LeaseGrant {
        /// Correlation.
        op: OpId,
        /// The TTL.
        ttl: Duration,
    },
    /// Store to curator.
    LeaseGrantReply {
        /// Correlation.
        op: OpId,
        /// The lease and its TTL.
        result: Result<(LeaseId, Duration), StoreError>,
    },
    /// Curator to store: keep a lease alive.
    KeepAlive {
        /// Correlation.
        op: OpId,
        /// The lease.
        lease: LeaseId,
    },
    /// Store to curator.
    KeepAliveReply {
        /// Correlation.
        op: OpId,
        /// The TTL.
        result: Result<Duration, StoreError>,
    },
    /// Curator to store: revoke a lease (no reply).
    Revoke {
        /// The lease.
        lease: LeaseId,
    },
    /// Curator to store (stream): watch `nodes/` from `start`.
    WatchOpen {
        /// The stream.
        stream: StreamId,
        /// The first revision wanted.
        start: Revision,
    },
    /// Store to curator (stream): a batch, or the watch's end.
    WatchBatch {
        /// The stream.
        stream: StreamId,
        /// The batch.
        batch: Result<WatchBatch, StoreError>,
    },
    /// Curator to store (stream): stop watching.
    WatchCancel {
        /// The stream.
        stream: StreamId,
    },
    /// An RPC call (client to curator, or follower to leader).
    Call {
        /// Correlation.
        call: CallId,
        /// The client's call this is (kept across forwarding hops).
        origin: CallId,
        /// The call.
        body: Call,
        /// Time left until the caller's deadline.
        timeout: Duration,
        /// How many curators forwarded it so far.
        hops: u8,
    },
    /// The reply to a [`Msg::Call`].
    CallReply {
        /// Correlation.
        call: CallId,
        /// The result.
        result: Result<CallOk, CallError>,
    },
    /// Client (or follower) to curator (stream): `Watch(NodesInCluster)`.
    WatchStart {
        /// The stream.
        stream: StreamId,
        /// How many curators forwarded it so far.
        hops: u8,
    },
    /// Curator to client (stream): one `WatchEvent`.
    WatchEvent {
        /// The stream.
        stream: StreamId,
        /// The event.
        event: EncodedWatchEvent,
        /// Set on the last event of a drain: the sender's cache revision,
        /// the revision the client's view must now equal (a check).
        consistent_at: Option<Revision>,
    },
    /// Curator to client (stream): the stream ended with Unavailable.
    WatchEnd {
        /// The stream.
        stream: StreamId,
    },
    /// Client to curator (stream): the client cancelled.
    WatchClose {
        /// The stream.
        stream: StreamId,
    },
    /// The transport broke the stream's connection.
    Reset {
        /// The stream.
        stream: StreamId,
    },
}

impl Msg {
    /// The stream this message travels on, if it is a stream message.
    pub fn stream(&self) -> Option<StreamId> {
        match self {
            Msg::WatchOpen { stream, .. }
            | Msg::WatchBatch { stream, .. }
            | Msg::WatchCancel { stream }
            | Msg::WatchStart { stream, .. }
            | Msg::WatchEvent { stream, .. }
            | Msg::WatchEnd { stream }
            | Msg::WatchClose { stream }
            | Msg::Reset { stream } => Some(*stream),
            _ => None,
        }
    }

    /// A small number naming the message kind (for the trace hash).
    pub fn kind(&self) -> u64 {
        match self {
            Msg::Txn { .. } => 1,
            Msg::TxnReply { .. } => 2,
            Msg::LeaseGrant { .. } => 3,
            Msg::LeaseGrantReply { .. } => 4,
            Msg::KeepAlive { .. } => 5,
            Msg::KeepAliveReply { .. } => 6,
            Msg::Revoke { .. } => 7,
            Msg::WatchOpen { .. } => 8,
            Msg::WatchBatch { .. } => 9,
            Msg::WatchCancel { .. } => 10,
            Msg::Call { .. } => 11,
            Msg::CallReply { .. } => 12,
            Msg::WatchStart { .. } => 13,
            Msg::WatchEvent { .. } => 14,
            Msg::WatchEnd { .. } => 15,
            Msg::WatchClose { .. } => 16,
            Msg::Reset { .. } => 17,
        }
    }

    /// The correlation number of the message (op, call or stream).
    pub fn id(&self) -> u64 {
        match self {
            Msg::Txn { op, .. }
            | Msg::TxnReply { op, .. }
            | Msg::LeaseGrant { op, .. }
            | Msg::LeaseGrantReply { op, .. }
            | Msg::KeepAlive { op, .. }
            | Msg::KeepAliveReply { op, .. } => *op,
            Msg::Revoke { lease } => *lease as u64,
            Msg::Call { call, .. } | Msg::CallReply { call, .. } => *call,
            other => other.stream().unwrap_or(0),
        }
    }
}
