//! The watchers of the shipped-code cluster: of all nodes
//! (`NodesInCluster`) and of one node each (`NodeInCluster`), each
//! reconnecting to random instances, and what is checked of them.

use super::*;

/// What one watcher of all nodes sees.
#[derive(Clone, Debug, Default)]
pub(super) struct Watched {
    /// Node ID to external address ("" without a status), as the current
    /// stream built it.
    view: BTreeMap<String, String>,
    /// Whether the current stream is open and sent its backlog.
    live: bool,
    streams: u64,
    /// Events received after a stream's backlog.
    updates: u64,
    /// Broken promises of the Watch contract.
    violations: Vec<String>,
    /// Each backlog as a read of every node: when the stream was asked
    /// for, when its backlog was complete, and the view then.
    pub(super) backlogs: Vec<(u64, u64, BTreeMap<String, String>)>,
}

/// What one watcher of one node (`NodeInCluster`) sees.
#[derive(Clone, Debug, Default)]
pub(super) struct NodeWatched {
    /// The node's address as the current stream last sent it (`None`:
    /// nothing yet, or a tombstone).
    last: Option<String>,
    /// Whether the current stream is open.
    live: bool,
    streams: u64,
    events: u64,
    tombstones: u64,
    /// Each stream's first event as a read of the node: when the stream
    /// was asked for, when the event came, the address.
    pub(super) first_reads: Vec<(u64, u64, String)>,
    /// The addresses each stream sent, in order.
    sent: Vec<Vec<String>>,
    /// Broken promises of the Watch contract.
    violations: Vec<String>,
}

/// The incarnation of the guest an address (`10.9.x.y`) names.
fn guest_order(address: &str) -> Option<u64> {
    number(address, GUEST_PREFIX)
}

/// Whether `sent` is in the order of `committed` (each a later commit
/// than the one before): a stream sends a node's states in revision
/// order, each at most once, skipping only what it coalesced.
fn in_commit_order(sent: &[String], committed: &[String]) -> bool {
    let mut rest = committed.iter();
    sent.iter().all(|s| rest.any(|c| c == s))
}

impl Cluster {
    /// Watchers of all nodes on the clients' node: each opens a stream on
    /// a random instance and rebuilds its view from it; when the stream
    /// ends it opens another after a pause.
    pub(super) fn watchers(&self) -> Vec<Arc<Mutex<Watched>>> {
        let curators = self.curators;
        (0..WATCHERS)
            .map(|w| {
                let watched = Arc::new(Mutex::new(Watched::default()));
                let (routers, rt, out) = (self.routers.clone(), self.rt.clone(), watched.clone());
                let ticks = self.ticks.clone();
                let retried = self.retried.clone();
                let client = self.rt.node(CLIENTS);
                let mut rng = Rng::new(self.seed ^ (0x3a7c4 + w as u64));
                self.rt.node(CLIENTS).spawn(async move {
                    loop {
                        let pause = Duration::from_millis(rng.range(50, 500));
                        client.sleep_until(client.now() + pause).await;
                        let target = rng.index(curators);
                        let message = watch_all();
                        let called = ticks.next();
                        let owner = Identity::Owner;
                        let opened =
                            server_stream(&rt, &routers, CLIENTS, target, WATCH, owner, message)
                                .await;
                        let Ok(mut events) = opened else {
                            continue;
                        };
                        {
                            let mut o = out.lock().unwrap();
                            o.view.clear();
                            o.live = false;
                            o.streams += 1;
                        }
                        let mut backlogged = 0;
                        while let Some(Ok(bytes)) = events.next().await {
                            let Ok(event) = curator::WatchEvent::decode(bytes) else {
                                out.lock()
                                    .unwrap()
                                    .violations
                                    .push("undecodable event".into());
                                break;
                            };
                            let mut o = out.lock().unwrap();
                            if backlogged > 0 {
                                o.updates += 1;
                            }
                            for node in &event.nodes {
                                let address = node
                                    .status
                                    .as_ref()
                                    .map(|s| s.external_address.clone())
                                    .unwrap_or_default();
                                // Every write makes a new address (unless
                                // it was sent again), and a stream sends
                                // each state once: the same state again
                                // is a repeated event.
                                let previous = o.view.insert(node.id.clone(), address.clone());
                                if previous.as_ref() == Some(&address)
                                    && !retried.lock().unwrap().contains(&address)
                                {
                                    o.violations.push(format!(
                                        "node {} sent again unchanged ({address})",
                                        node.id
                                    ));
                                }
                            }
                            for tombstone in &event.node_tombstones {
                                o.view.remove(&tombstone.node_id);
                            }
                            if event.progress
                                == curator::watch_event::Progress::LastBacklogged as i32
                            {
                                backlogged += 1;
                                if backlogged > 1 {
                                    o.violations.push("PROGRESS_LAST_BACKLOGGED twice".into());
                                }
                                o.live = true;
                                let view = o.view.clone();
                                log!(
                                    "{:?} tick {called}: watcher {w} backlog via {target}: {:?}",
                                    rt.now(),
                                    view.values().collect::<Vec<_>>()
                                );
                                o.backlogs.push((called, ticks.next(), view));
                            }
                        }
                        out.lock().unwrap().live = false;
                    }
                });
                watched
            })
            .collect()
    }

    /// One watcher of each writer's node and one of the guest, on the
    /// clients' node: each opens a `NodeInCluster` stream on a random
    /// instance and checks it; when the stream ends, or after a
    /// tombstone (after which the stream stays silent), it opens another
    /// after a pause.
    pub(super) fn node_watchers(&self) -> Vec<(String, Arc<Mutex<NodeWatched>>)> {
        let guest = NodeId::from_public_key(&GUEST_KEY).to_string();
        let curators = self.curators;
        (0..curators)
            .map(|j| identity(j).0.to_string())
            .chain([guest])
            .enumerate()
            .map(|(k, node_id)| {
                let watched = Arc::new(Mutex::new(NodeWatched::default()));
                let (routers, rt, out) = (self.routers.clone(), self.rt.clone(), watched.clone());
                let ticks = self.ticks.clone();
                let client = self.rt.node(CLIENTS);
                let mut rng = Rng::new(self.seed ^ (0x10de + k as u64));
                let id = node_id.clone();
                self.rt.node(CLIENTS).spawn(async move {
                    let request = curator::WatchRequest {
                        kind: Some(curator::watch_request::Kind::NodeInCluster(
                            curator::watch_request::NodeInCluster {
                                node_id: id.clone(),
                            },
                        )),
                    }
                    .encode_to_vec();
                    loop {
                        let pause = Duration::from_millis(rng.range(50, 500));
                        client.sleep_until(client.now() + pause).await;
                        let target = rng.index(curators);
                        let called = ticks.next();
                        let owner = Identity::Owner;
                        let opened = server_stream(
                            &rt,
                            &routers,
                            CLIENTS,
                            target,
                            WATCH,
                            owner,
                            request.clone(),
                        )
                        .await;
                        let Ok(mut events) = opened else {
                            continue;
                        };
                        {
                            let mut o = out.lock().unwrap();
                            o.streams += 1;
                            o.last = None;
                            o.live = true;
                            o.sent.push(Vec::new());
                        }
                        let mut first = true;
                        let mut tombstoned = false;
                        // Until the stream ends, or a while after a
                        // tombstone (it must stay silent meanwhile).
                        loop {
                            let next = if tombstoned {
                                let quiet =
                                    client.sleep_until(client.now() + Duration::from_secs(1));
                                match futures::future::select(events.next(), quiet).await {
                                    futures::future::Either::Left((next, _)) => next,
                                    futures::future::Either::Right(_) => break,
                                }
                            } else {
                                events.next().await
                            };
                            let Some(Ok(bytes)) = next else { break };
                            let mut o = out.lock().unwrap();
                            let Ok(event) = curator::WatchEvent::decode(bytes) else {
                                o.violations.push("undecodable event".into());
                                break;
                            };
                            o.events += 1;
                            if tombstoned {
                                o.violations
                                    .push(format!("an event after the tombstone: {event:?}"));
                            }
                            if event.progress != 0 {
                                o.violations.push(format!("progress set: {event:?}"));
                            }
                            for node in &event.nodes {
                                if node.id != id {
                                    o.violations.push(format!("another node: {}", node.id));
                                    continue;
                                }
                                let address = node
                                    .status
                                    .as_ref()
                                    .map(|s| s.external_address.clone())
                                    .unwrap_or_default();
                                if first {
                                    o.first_reads.push((called, ticks.next(), address.clone()));
                                    first = false;
                                }
                                // The guest's incarnations only move
                                // forward (a writer's states are checked
                                // against the commits at the end).
                                let before = o.last.as_deref().and_then(guest_order);
                                if let (Some(b), Some(n)) = (before, guest_order(&address))
                                    && n <= b
                                {
                                    let why = format!("state {address} after {:?}", o.last);
                                    o.violations.push(why);
                                }
                                if let Some(stream) = o.sent.last_mut() {
                                    stream.push(address.clone());
                                }
                                o.last = Some(address);
                            }
                            for tombstone in &event.node_tombstones {
                                if tombstone.node_id == id {
                                    o.tombstones += 1;
                                    o.last = None;
                                    tombstoned = true;
                                }
                            }
                        }
                        out.lock().unwrap().live = false;
                    }
                });
                (node_id, watched)
            })
            .collect()
    }
}

/// Asserts what the watchers saw, against `stored` (every node's address
/// as stored at the end) and the commits.
pub(super) fn check(
    seed: u64,
    cluster: &Cluster,
    watchers: &[Arc<Mutex<Watched>>],
    node_watchers: &[(String, Arc<Mutex<NodeWatched>>)],
    stored: &BTreeMap<String, String>,
) {
    // Every watcher has a live stream whose view is the store's.
    for (w, watched) in watchers.iter().enumerate() {
        let watched = watched.lock().unwrap().clone();
        assert!(
            watched.violations.is_empty(),
            "seed {seed}: watcher {w}: {watched:?}"
        );
        assert!(
            watched.live,
            "seed {seed}: watcher {w} has no live stream: {watched:?}"
        );
        assert!(
            watched.updates > 10,
            "seed {seed}: watcher {w} saw no updates: {watched:?}"
        );
        assert_eq!(
            &watched.view, stored,
            "seed {seed}: watcher {w} after {} streams",
            watched.streams
        );
    }
    // Every node watcher kept the contract, and the writers' watchers
    // have a live stream at the stored state; the guest left for good.
    for (k, (node_id, watched)) in node_watchers.iter().enumerate() {
        let watched = watched.lock().unwrap().clone();
        assert!(
            watched.violations.is_empty(),
            "seed {seed}: watcher of {node_id}: {watched:?}"
        );
        if k < cluster.curators {
            let key = node_key(&identity(k).0);
            let committed: Vec<String> = cluster
                .check
                .committed(&key)
                .iter()
                .map(|v| {
                    let record = storage::NodeRecord::decode(v.as_ref()).unwrap();
                    record
                        .status
                        .map(|s| s.external_address)
                        .unwrap_or_default()
                })
                .collect();
            for (n, sent) in watched.sent.iter().enumerate() {
                assert!(
                    in_commit_order(sent, &committed),
                    "seed {seed}: stream {n} of the watcher of {node_id} sent {sent:?}, \
                     not in the order of the commits {committed:?}"
                );
            }
            assert!(
                watched.live,
                "seed {seed}: watcher of {node_id}: {watched:?}"
            );
            let stored = stored.get(node_id).cloned();
            assert_eq!(
                watched.last, stored,
                "seed {seed}: watcher of {node_id} after {} streams",
                watched.streams
            );
        } else {
            assert!(
                watched.tombstones > 0 && watched.last.is_none(),
                "seed {seed}: the guest's watcher: {watched:?}"
            );
        }
    }
}
