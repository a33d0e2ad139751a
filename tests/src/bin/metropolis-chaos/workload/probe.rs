//! Probes: fresh raw `Watch` streams, not through a node view, whose
//! backlogs are reads placed soundly in time (a backlog holds every write
//! acknowledged before its call and nothing committed after its end, so
//! it is a read somewhere between the two), and whose protocol is checked
//! as it arrives: one backlog marker per stream, and no node's state going
//! back within a stream.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use metropolis_proto::prelude::curator::watch_request::{Kind, NodeInCluster};
use tokio::time::Instant;

use super::client::RawWatches;
use super::state_of;
use crate::cluster::{Cluster, N};
use crate::history::{Back, Clock, NodeState, ReadOp, Recorder};
use crate::schedule::Rng;

/// How long a probe keeps reading after its backlog, to catch a second
/// marker or a state going back.
const LINGER: Duration = Duration::from_millis(300);

/// Probes every few hundred milliseconds, through instance after instance,
/// until aborted.
pub async fn run(
    client: RawWatches,
    ids: Vec<String>,
    clock: Clock,
    recorder: Recorder,
    seed: u64,
) {
    let mut rng = Rng::new(seed ^ 0x5eed_9e0b);
    let mut round = 0usize;
    loop {
        round += 1;
        let via = round % N;
        let kind = if rng.chance(50) || ids.is_empty() {
            Kind::NodesInCluster(Default::default())
        } else {
            let i = usize::try_from(rng.below(ids.len() as u64)).unwrap_or(0);
            Kind::NodeInCluster(NodeInCluster {
                node_id: ids[i].clone(),
            })
        };
        let _ = backlog(&client, via, kind, &ids, clock, &recorder, LINGER).await;
        tokio::time::sleep(Duration::from_millis(150 + rng.below(300))).await;
    }
}

/// One probe through curator `via`: the backlog's view (node ID to
/// state), recorded as reads of the campaign's nodes; `Err` when the
/// stream failed before its backlog ended.
pub async fn backlog(
    client: &RawWatches,
    via: usize,
    kind: Kind,
    ids: &[String],
    clock: Clock,
    recorder: &Recorder,
    linger: Duration,
) -> Result<BTreeMap<String, NodeState>, String> {
    let endpoint = Cluster::curator_addr(via);
    let single = matches!(kind, Kind::NodeInCluster(_));
    let called = clock.now();
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut stream = client.open(&endpoint, kind, deadline).await?;
    let mut view = BTreeMap::new();
    loop {
        let event = match tokio::time::timeout_at(deadline, stream.next()).await {
            Ok(Some(Ok(e))) => e,
            Ok(Some(Err(s))) => {
                client.forget(&endpoint);
                return Err(format!("{endpoint}: {}", s.message()));
            }
            Ok(None) => return Err(format!("{endpoint}: the stream ended in its backlog")),
            Err(_) => {
                client.forget(&endpoint);
                return Err(format!("{endpoint}: no backlog in time"));
            }
        };
        for n in &event.nodes {
            view.insert(n.id.clone(), state_of(n, ids));
        }
        for t in &event.node_tombstones {
            view.remove(&t.node_id);
        }
        if single || event.progress != 0 {
            break;
        }
    }
    let returned = clock.now();
    {
        let mut h = recorder.lock();
        for (node, id) in ids.iter().enumerate() {
            let seq = match view.get(id) {
                Some(NodeState::Ours { seq, .. }) => Some(*seq),
                Some(NodeState::Other(_)) => continue,
                None if single => continue,
                None => None,
            };
            h.reads.push(ReadOp {
                node,
                seq,
                called,
                returned,
            });
        }
    }
    // Linger: no second marker, no state going back (but to a write of
    // unknown outcome, judged at the end).
    let mut latest = view.clone();
    let mut shown: std::collections::BTreeSet<(usize, i64)> = view
        .values()
        .filter_map(|s| match s {
            NodeState::Ours { node, seq, .. } => Some((*node, *seq)),
            NodeState::Other(_) => None,
        })
        .collect();
    let until = Instant::now() + linger;
    while let Ok(Some(Ok(event))) = tokio::time::timeout_at(until, stream.next()).await {
        if !single && event.progress != 0 {
            recorder.lock().protocol.push(format!(
                "a NodesInCluster stream through curator-{via} marked its backlog twice"
            ));
        }
        for n in &event.nodes {
            let state = state_of(n, ids);
            if let (Some(NodeState::Ours { seq: old, node, .. }), NodeState::Ours { seq, .. }) =
                (latest.get(&n.id), &state)
                && seq < old
            {
                recorder.lock().backs.push(Back {
                    who: format!("a Watch stream through curator-{via}"),
                    node: *node,
                    from: *old,
                    to: *seq,
                    shown_before: shown.contains(&(*node, *seq)),
                });
            }
            if let NodeState::Ours { node, seq, .. } = &state {
                shown.insert((*node, *seq));
            }
            latest.insert(n.id.clone(), state);
        }
    }
    Ok(view)
}
