//! The node writers of the shipped-code cluster: one per node, each
//! update through a random instance, sent again at times after an
//! Unavailable, read back through the instance that acknowledged it; and
//! what is checked of them, per-node linearizability included.

use super::watchers::{NodeWatched, Watched};
use super::*;

/// What one writer saw.
#[derive(Clone, Debug, Default)]
pub(super) struct Writes {
    sent: u64,
    acked: u64,
    /// Global time of the last success, µs.
    last_ok_us: u128,
    codes: Vec<tonic::Code>,
    /// Watches opened right after an acknowledged write, through the
    /// instance that acknowledged it, that sent their backlog: the write,
    /// the instance, and the write the backlog held.
    read_backs: Vec<(u64, usize, Option<u64>)>,
    /// This node's record as this writer wrote and read it (its writes'
    /// sequence numbers), for the linearizability check.
    pub(super) history: Vec<Op<u64>>,
}

impl Cluster {
    /// One writer per curator identity on the clients' node, until `stop`
    /// (global time): each update through a random instance, with pauses.
    pub(super) fn writers(&self, stop: Duration) -> Vec<Arc<Mutex<Writes>>> {
        let curators = self.curators;
        (0..curators)
            .map(|j| {
                let writes = Arc::new(Mutex::new(Writes::default()));
                let (routers, rt, out) = (self.routers.clone(), self.rt.clone(), writes.clone());
                let ticks = self.ticks.clone();
                let retried = self.retried.clone();
                let client = self.rt.node(CLIENTS);
                let mut rng = Rng::new(self.seed ^ (0xc11e47 + j as u64));
                self.rt.node(CLIENTS).spawn(async move {
                    let (id, _) = identity(j);
                    let mut seq = 0;
                    while rt.now() < stop {
                        let pause = Duration::from_millis(rng.range(20, 200));
                        client.sleep_until(client.now() + pause).await;
                        seq += 1;
                        out.lock().unwrap().sent = seq;
                        let request = update(&id, address_of(seq));
                        // An update that ended Unavailable may have
                        // committed: sending it again (up to twice more)
                        // may make the same write twice.
                        let mut attempts = 0;
                        let (target, acked) = loop {
                            attempts += 1;
                            let target = rng.index(curators);
                            let caller = Identity::Node(id.clone());
                            let called = ticks.next();
                            let result = unary(
                                &rt,
                                &routers,
                                CLIENTS,
                                target,
                                UPDATE,
                                caller,
                                request.clone(),
                            )
                            .await;
                            let acked = result.is_ok();
                            log!(
                                "{:?} tick {called}: node {j} write {seq} via {target}: {:?}",
                                rt.now(),
                                result.as_ref().map(|_| ())
                            );
                            let mut w = out.lock().unwrap();
                            w.history.push(Op {
                                called,
                                returned: acked.then(|| ticks.next()),
                                kind: OpKind::Write(seq),
                            });
                            match result {
                                Ok(_) => {
                                    w.acked = seq;
                                    w.last_ok_us = rt.now().as_micros();
                                }
                                Err(code) => w.codes.push(code),
                            }
                            if acked || attempts == 3 || !rng.chance(0.5) {
                                break (target, acked);
                            }
                            retried.lock().unwrap().insert(address_of(seq));
                        };
                        // Read your writes: a watch opened now through the
                        // same instance has the write in its backlog.
                        let called = ticks.next();
                        if acked
                            && rng.chance(0.25)
                            && let Some(view) = backlog(&rt, &routers, target).await
                        {
                            let seen = view.get(id.as_str()).and_then(|a| seq_of(a));
                            let mut w = out.lock().unwrap();
                            w.history.push(Op {
                                called,
                                returned: Some(ticks.next()),
                                kind: OpKind::Read(seen),
                            });
                            w.read_backs.push((seq, target, seen));
                        }
                    }
                });
                writes
            })
            .collect()
    }
}

/// Asserts what each writer's node record went through: stored between
/// the last acknowledged and the last sent write, read back, only
/// Unavailable failures, and linearizable with every read of it.
pub(super) fn check(
    seed: u64,
    cluster: &Cluster,
    writers: &[Arc<Mutex<Writes>>],
    watchers: &[Arc<Mutex<Watched>>],
    node_watchers: &[(String, Arc<Mutex<NodeWatched>>)],
) {
    for (j, writes) in writers.iter().enumerate() {
        let w = writes.lock().unwrap().clone();
        let stored = cluster.stored_seq(j).unwrap_or(0);
        assert!(
            w.acked <= stored && stored <= w.sent,
            "seed {seed}: node {j} holds write {stored}, acknowledged {}, sent {}",
            w.acked,
            w.sent
        );
        assert!(w.acked > 50, "seed {seed}: writer {j} hardly wrote: {w:?}");
        // The last fault starts before 25 s and ends within 4 s; a cut-off
        // leader's lease runs out within the TTL after: calls succeed
        // again before 33 s.
        assert!(
            w.last_ok_us > 33_000_000,
            "seed {seed}: writer {j} had no success after the faults: {w:?}"
        );
        // Read your writes: the backlog holds the write, or a later one,
        // or an earlier one whose call ended unknown (the store may
        // carry out a request after its caller gave up).
        let unknown: BTreeSet<u64> = w
            .history
            .iter()
            .filter_map(|op| match (&op.kind, op.returned) {
                (OpKind::Write(v), None) => Some(*v),
                _ => None,
            })
            .collect();
        let unread: Vec<_> = w
            .read_backs
            .iter()
            .filter(|(seq, _, seen)| seen.is_none_or(|s| s < *seq && !unknown.contains(&s)))
            .collect();
        assert!(
            unread.is_empty(),
            "seed {seed}: writer {j} did not read its writes (write, instance, backlog's): \
             {unread:?}"
        );
        assert!(
            !w.read_backs.is_empty(),
            "seed {seed}: writer {j} never read back: {w:?}"
        );
        for code in &w.codes {
            assert!(
                matches!(code, tonic::Code::Unavailable),
                "seed {seed}: writer {j} got {code:?}"
            );
        }
        // The node's record is linearizable: its writer's writes (an
        // Unavailable one of unknown outcome) and every backlog that
        // showed it, the writer's own read-backs included.
        let (id, _) = identity(j);
        let mut history = w.history.clone();
        for watched in watchers {
            for (called, returned, view) in &watched.lock().unwrap().backlogs {
                history.push(Op {
                    called: *called,
                    returned: Some(*returned),
                    kind: OpKind::Read(view.get(id.as_str()).and_then(|a| seq_of(a))),
                });
            }
        }
        for (called, returned, address) in &node_watchers[j].1.lock().unwrap().first_reads {
            history.push(Op {
                called: *called,
                returned: Some(*returned),
                kind: OpKind::Read(seq_of(address)),
            });
        }
        if let Err(failure) = linearizable::check(None, &history) {
            panic!(
                "seed {seed}: node {j}'s record is not linearizable: {}",
                linearizable::explain(&history, &failure)
            );
        }
    }
}
