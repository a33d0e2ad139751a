//! The safety checks, and the oracle they compare against: the store's
//! history of node records as the store itself committed it, the
//! installation requests the operator got committed, the reports agents
//! sent, and which client calls committed.
//!
//! Every component reports what it did through [`Checks`] as it happens;
//! a violated invariant is recorded with the simulated time and ends the
//! run.

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use metropolis_core::leadership::ElectionKey;
use metropolis_core::provisioning::{MachineRecord, ReportResult};
use metropolis_core::store::{Event, EventKind, Revision};

use crate::msg::{CallId, WriteTag};
use crate::net::Time;

/// Key prefix of node records.
pub const NODES: &str = "nodes/";
/// Key prefix of machine records.
pub const MACHINES: &str = "machines/";
/// Key prefix of the election.
pub const ELECTION: &str = "election/";

/// The oracle and the violations found so far.
#[derive(Debug, Default)]
pub struct Checks {
    /// Violations, with the simulated time they were found at.
    pub violations: Vec<(Time, String)>,
    /// The current simulated time (set by the world before each event).
    pub now: Time,
    /// Per node ID, every committed state: (revision, encoded or deleted).
    node_history: BTreeMap<String, Vec<(Revision, Option<Bytes>)>>,
    /// The revisions at which each encoded node state was committed
    /// (every client call carries a unique status; a duplicated call may
    /// commit the same bytes again).
    rev_of: BTreeMap<Bytes, Vec<Revision>>,
    /// Installation requests committed: (machine, generation) -> bytes.
    submitted: BTreeMap<(String, i64), Bytes>,
    /// Reports agents sent: (machine, generation, result).
    sent_reports: BTreeSet<(String, i64, Result<(), String>)>,
    /// Reports stored as successes: (machine, generation).
    successes: BTreeSet<(String, i64)>,
    /// Generations installed per machine, across agent restarts.
    installed: BTreeMap<String, BTreeSet<i64>>,
    /// Client calls whose write committed.
    committed_calls: BTreeSet<CallId>,
    /// Who leads with each won revision: (curator, incarnation).
    leaders: BTreeMap<Revision, (usize, u32)>,
    /// Counters for the report: fenced writes committed, refused.
    pub writes: (u64, u64),
}

fn key_suffix<'a>(key: &'a [u8], prefix: &str) -> Option<&'a str> {
    std::str::from_utf8(key).ok()?.strip_prefix(prefix)
}

impl Checks {
    /// Records a violation.
    pub fn fail(&mut self, what: impl Into<String>) {
        let what = what.into();
        self.violations.push((self.now, what));
    }

    /// Whether any invariant failed.
    pub fn failed(&self) -> bool {
        !self.violations.is_empty()
    }

    /// The store committed these events (every key, in revision order).
    pub fn store_committed(&mut self, events: &[Event]) {
        for e in events {
            if let Some(id) = key_suffix(&e.kv.key, NODES) {
                let state = match e.kind {
                    EventKind::Put => {
                        self.rev_of
                            .entry(e.kv.value.clone())
                            .or_default()
                            .push(e.kv.mod_revision);
                        Some(e.kv.value.clone())
                    }
                    EventKind::Delete => None,
                };
                self.node_history
                    .entry(id.to_string())
                    .or_default()
                    .push((e.kv.mod_revision, state));
            } else if let Some(machine) = key_suffix(&e.kv.key, MACHINES)
                && e.kind == EventKind::Put
            {
                self.machine_committed(machine.to_string(), &e.kv.value);
            }
        }
    }

    /// A machine record was committed: its request and reports must be
    /// ones that were really issued and sent.
    fn machine_committed(&mut self, machine: String, value: &[u8]) {
        let record = match MachineRecord::decode(value) {
            Ok(r) => r,
            Err(e) => return self.fail(format!("machine {machine}: undecodable record: {e}")),
        };
        if let Some(request) = &record.request {
            let key = (machine.clone(), request.generation);
            match self.submitted.get(&key) {
                Some(bytes) if *bytes != request.encoded => self.fail(format!(
                    "machine {machine}: generation {} issued twice with different requests",
                    request.generation
                )),
                Some(_) => {}
                None => {
                    if let Some((&(_, newest), _)) = self
                        .submitted
                        .range((machine.clone(), i64::MIN)..=(machine.clone(), i64::MAX))
                        .next_back()
                        && newest > request.generation
                    {
                        self.fail(format!(
                            "machine {machine}: generation went back from {newest} to {}",
                            request.generation
                        ));
                    }
                    self.submitted.insert(key, request.encoded.clone());
                }
            }
        }
        for (generation, report) in &record.reports {
            let result = match &report.result {
                ReportResult::Success => Ok(()),
                ReportResult::Error(e) => Err(e.clone()),
            };
            let key = (machine.clone(), *generation);
            if !self
                .sent_reports
                .contains(&(machine.clone(), *generation, result.clone()))
            {
                self.fail(format!(
                    "machine {machine}: stored report for generation {generation} ({result:?}) \
                     that no agent sent for that generation"
                ));
            }
            if result.is_ok() {
                self.successes.insert(key);
            } else if self.successes.contains(&key) {
                self.fail(format!(
                    "machine {machine}: success report of generation {generation} replaced"
                ));
            }
        }
    }

    /// A fenced leader write reached the store, which led with
    /// `leader` (the oldest election key) right before applying it.
    pub fn write_applied(&mut self, tag: &WriteTag, leader: Option<&ElectionKey>, committed: bool) {
        if !committed {
            self.writes.1 += 1;
            return;
        }
        self.writes.0 += 1;
        self.committed_calls.insert(tag.call);
        if leader != Some(&tag.believed) {
            self.fail(format!(
                "stale leader's write committed: curator {} believed it led with {:?} (won at \
                 revision {}), the store's leader was {:?}",
                tag.author,
                String::from_utf8_lossy(&tag.believed.key),
                tag.believed.create_revision,
                leader.map(|k| (
                    String::from_utf8_lossy(&k.key).into_owned(),
                    k.create_revision
                ))
            ));
        }
    }

    /// A curator instance reports that it leads with `key`.
    pub fn leader_claim(&mut self, curator: usize, incarnation: u32, key: &ElectionKey) {
        let claim = (curator, incarnation);
        match self.leaders.get(&key.create_revision) {
            Some(holder) if *holder != claim => self.fail(format!(
                "two leaders for the epoch won at revision {}: {holder:?} and {claim:?}",
                key.create_revision
            )),
            _ => {
                self.leaders.insert(key.create_revision, claim);
            }
        }
    }

    /// Whether the client call's write committed.
    pub fn call_committed(&self, call: CallId) -> bool {
        self.committed_calls.contains(&call)
    }

    /// The earliest revision above `after` at which this encoded node
    /// state was committed.
    pub fn revision_of(&self, encoded: &Bytes, after: Revision) -> Option<Revision> {
        self.rev_of
            .get(encoded)?
            .iter()
            .copied()
            .find(|r| *r > after)
    }

    /// Whether node `id` was put at a revision above `after` (created
    /// after that revision, possibly deleted again).
    pub fn put_after(&self, id: &str, after: Revision) -> bool {
        self.node_history
            .get(id)
            .is_some_and(|h| h.iter().any(|(rev, state)| *rev > after && state.is_some()))
    }

    /// Whether this encoded node state was ever committed.
    pub fn committed(&self, encoded: &Bytes) -> bool {
        self.rev_of.contains_key(encoded)
    }

    /// The nodes of the store at revision `at`: ID -> encoded.
    pub fn nodes_at(&self, at: Revision) -> BTreeMap<String, Bytes> {
        let mut nodes = BTreeMap::new();
        for (id, history) in &self.node_history {
            let i = history.partition_point(|(rev, _)| *rev <= at);
            if i > 0
                && let Some(encoded) = &history[i - 1].1
            {
                nodes.insert(id.clone(), encoded.clone());
            }
        }
        nodes
    }

    /// An agent sent a report.
    pub fn report_sent(&mut self, machine: &str, generation: i64, result: Result<(), String>) {
        self.sent_reports
            .insert((machine.to_string(), generation, result));
    }

    /// An agent starts installing `generation` with `request`.
    pub fn installing(&mut self, machine: &str, generation: i64, request: &Bytes) {
        if !self
            .installed
            .entry(machine.to_string())
            .or_default()
            .insert(generation)
        {
            self.fail(format!(
                "machine {machine}: generation {generation} installed twice"
            ));
        }
        match self.submitted.get(&(machine.to_string(), generation)) {
            Some(bytes) if bytes == request => {}
            Some(_) => self.fail(format!(
                "machine {machine}: installing generation {generation} with another request's bytes"
            )),
            None => self.fail(format!(
                "machine {machine}: installing generation {generation}, never committed"
            )),
        }
    }
}
