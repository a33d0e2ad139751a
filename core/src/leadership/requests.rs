//! The request table of a [`Leadership`](super::Leadership): which
//! requests wait for a leader (and until when), and which are bound to the
//! current role.

use std::collections::{BTreeMap, BTreeSet};

use super::{Epoch, RequestId};
use crate::time::Instant;

/// How a routed request is handled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Handling {
    /// Served here, as leader.
    Served,
    /// Forwarded to the leader.
    Forwarded,
}

/// Requests not yet ended. Ordered maps only: iteration order (and so the
/// order of the events built from it) depends on nothing but the inputs.
#[derive(Debug, Default)]
pub(super) struct Requests {
    next_id: u64,
    /// Requests waiting for a leader -> when their wait ends.
    waiting: BTreeMap<RequestId, Instant>,
    /// The same, by wait end.
    wait_ends: BTreeSet<(Instant, RequestId)>,
    /// Requests served or forwarded -> the epoch they were routed in.
    routed: BTreeMap<RequestId, (Epoch, Handling)>,
}

impl Requests {
    /// A fresh request ID.
    pub(super) fn next_id(&mut self) -> RequestId {
        self.next_id += 1;
        RequestId(self.next_id)
    }

    pub(super) fn wait(&mut self, id: RequestId, until: Instant) {
        self.waiting.insert(id, until);
        self.wait_ends.insert((until, id));
    }

    pub(super) fn route(&mut self, id: RequestId, epoch: Epoch, handling: Handling) {
        self.routed.insert(id, (epoch, handling));
    }

    /// Forgets `id`; whether it was waiting or routed.
    pub(super) fn remove(&mut self, id: RequestId) -> bool {
        if let Some(until) = self.waiting.remove(&id) {
            self.wait_ends.remove(&(until, id));
            return true;
        }
        self.routed.remove(&id).is_some()
    }

    /// The epoch and handling of a routed request.
    pub(super) fn routed(&self, id: RequestId) -> Option<(Epoch, Handling)> {
        self.routed.get(&id).copied()
    }

    /// Removes and returns every routed request, in ID order.
    pub(super) fn take_routed(&mut self) -> Vec<RequestId> {
        std::mem::take(&mut self.routed).into_keys().collect()
    }

    /// Removes and returns every waiting request, in ID order.
    pub(super) fn take_waiting(&mut self) -> Vec<RequestId> {
        self.wait_ends.clear();
        std::mem::take(&mut self.waiting).into_keys().collect()
    }

    /// Removes and returns the waiting requests whose wait ends at or
    /// before `now`, in order of wait end (then ID).
    pub(super) fn take_expired(&mut self, now: Instant) -> Vec<RequestId> {
        let mut expired = Vec::new();
        while let Some(&(until, id)) = self.wait_ends.first() {
            if until > now {
                break;
            }
            self.wait_ends.pop_first();
            self.waiting.remove(&id);
            expired.push(id);
        }
        expired
    }

    /// The earliest end of a wait.
    pub(super) fn next_wait_end(&self) -> Option<Instant> {
        self.wait_ends.first().map(|(until, _)| *until)
    }

    pub(super) fn waiting_len(&self) -> usize {
        self.waiting.len()
    }

    pub(super) fn routed_len(&self) -> usize {
        self.routed.len()
    }
}
