//! Watch over real sockets: a backlog larger than 2 MiB in several events
//! with one marker and a writer running meanwhile; tombstones; the
//! `NodeInCluster` lifecycle; status timestamps stamped by the curator.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use metropolis_core::identity::NodeId;
use metropolis_proto::prelude::{common, curator};
use metropolis_proto::version::spec::{
    Version,
    version::{GitInformation, Release},
};
use metropolis_tests::{
    Daemon, RuntimeKind, against_both_runtimes_and_etcd, curator, status_seq, watch_nodes,
};
use metropolis_transport::grpc::Channel;
use prost::Message;

const LIMIT: usize = 2 * 1024 * 1024;

/// A status whose version carries `seq` as its release's patch number (so
/// a client can order states; the curator overwrites the timestamp) and
/// `pad` bytes of commit hash (so nodes are large).
fn status(addr: &str, seq: i64, pad: usize) -> common::NodeStatus {
    common::NodeStatus {
        external_address: addr.into(),
        version: Some(Version {
            release: Some(Release {
                patch: seq,
                ..Default::default()
            }),
            git_information: Some(GitInformation {
                commit_hash: "c".repeat(pad),
                ..Default::default()
            }),
        }),
        ..Default::default()
    }
}

fn seq(node: &curator::Node) -> i64 {
    status_seq(node.status.as_ref()).unwrap_or(-1)
}

async fn big_backlog_is_chunked_and_followed_without_gap(rt: RuntimeKind) {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("d"), rt);
    // 300 nodes of ~15 KiB each: about 4.5 MiB of backlog.
    let mut clients = Vec::new();
    for i in 0..300 {
        let cdir = dir.path().join(format!("n{i}"));
        let id = d.add_node(&cdir).await;
        let mut c = curator(d.tls(&cdir, "node").await);
        let req = curator::UpdateNodeStatusRequest {
            node_id: id.to_string(),
            status: Some(status(
                &format!("10.0.{}.{}", i / 250, i % 250 + 1),
                1,
                15_000,
            )),
        };
        c.update_node_status(req).await.unwrap();
        clients.push((id, c));
    }

    // A writer keeps updating while the backlog streams.
    let writer = tokio::spawn(async move {
        let mut last = BTreeMap::new();
        for round in 2..6i64 {
            for (id, c) in clients.iter_mut().step_by(7) {
                let req = curator::UpdateNodeStatusRequest {
                    node_id: id.to_string(),
                    status: Some(status("10.9.9.9", round, 15_000)),
                };
                c.update_node_status(req).await.unwrap();
                last.insert(id.to_string(), round);
            }
        }
        last
    });

    let mut stream = watch_nodes(d.unix().await).await;
    let mut view: BTreeMap<String, i64> = BTreeMap::new();
    let mut backlog_events = 0;
    let mut marker_seen = false;
    while !marker_seen {
        let ev = stream.next().await.unwrap().unwrap();
        assert!(
            ev.encoded_len() <= LIMIT,
            "event of {} bytes",
            ev.encoded_len()
        );
        backlog_events += 1;
        marker_seen = ev.progress == curator::watch_event::Progress::LastBacklogged as i32;
        for n in &ev.nodes {
            assert!(
                view.insert(n.id.clone(), seq(n)).is_none(),
                "node {} twice in the backlog",
                n.id
            );
        }
    }
    assert!(
        backlog_events >= 3,
        "4.5 MiB backlog came in {backlog_events} events"
    );
    assert_eq!(view.len(), 301, "300 added nodes and the daemon's own");

    let last = writer.await.unwrap();
    // Follow until every final write is seen; states per node only grow.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while last.iter().any(|(id, s)| view.get(id) != Some(s)) {
        let ev = tokio::time::timeout_at(deadline, stream.next())
            .await
            .expect("updates arrive")
            .unwrap()
            .unwrap();
        assert!(ev.encoded_len() <= LIMIT);
        assert_eq!(ev.progress, 0, "marker exactly once");
        for n in &ev.nodes {
            let prev = view.insert(n.id.clone(), seq(n)).unwrap();
            assert!(
                seq(n) > prev,
                "node {}: state {} after {prev} (replayed or reordered)",
                n.id,
                seq(n)
            );
        }
    }
    // The view equals a fresh backlog.
    let mut fresh = watch_nodes(d.unix().await).await;
    let mut fresh_view = BTreeMap::new();
    loop {
        let ev = fresh.next().await.unwrap().unwrap();
        for n in &ev.nodes {
            fresh_view.insert(n.id.clone(), seq(n));
        }
        if ev.progress != 0 {
            break;
        }
    }
    assert_eq!(view, fresh_view);
}

async fn tombstones_and_node_in_cluster(rt: RuntimeKind) {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("d"), rt);
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
    let raw: [u8; 32] = key.public_key_raw().try_into().unwrap();
    let id = NodeId::from_public_key(&raw);

    let kind = curator::watch_request::Kind::NodeInCluster(curator::watch_request::NodeInCluster {
        node_id: id.to_string(),
    });
    let mut one = curator(d.unix().await)
        .watch(curator::WatchRequest { kind: Some(kind) })
        .await
        .unwrap()
        .into_inner();
    let mut all = watch_nodes(d.unix().await).await;
    let first = all.next().await.unwrap().unwrap();
    assert_eq!(
        first.progress,
        curator::watch_event::Progress::LastBacklogged as i32
    );

    // Silent while the node does not exist.
    assert!(
        tokio::time::timeout(Duration::from_millis(300), one.next())
            .await
            .is_err()
    );

    // Create it with this key, then update it, then remove it.
    let mut mgmt = metropolis_proto::metropolis::node::core::curator::proto::private::node_management_client::NodeManagementClient::with_origin(
        d.owner().await,
        Channel::origin(),
    );
    let resp = mgmt
        .add_node(
            metropolis_proto::metropolis::node::core::curator::proto::private::AddNodeRequest {
                public_key: raw.to_vec().into(),
            },
        )
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resp.node_id, id.to_string());
    let ev = one.next().await.unwrap().unwrap();
    assert_eq!(ev.nodes.len(), 1);
    assert_eq!(ev.nodes[0].id, id.to_string());
    assert!(ev.node_tombstones.is_empty());
    assert_eq!(ev.progress, 0, "progress is unset on NodeInCluster events");
    assert_eq!(next_change(&mut all).await, format!("put {id}"));

    mgmt.remove_node(
        metropolis_proto::metropolis::node::core::curator::proto::private::RemoveNodeRequest {
            node_id: id.to_string(),
        },
    )
    .await
    .unwrap();
    let ev = one.next().await.unwrap().unwrap();
    assert!(ev.nodes.is_empty());
    assert_eq!(ev.node_tombstones.len(), 1);
    assert_eq!(ev.node_tombstones[0].node_id, id.to_string());
    assert_eq!(next_change(&mut all).await, format!("del {id}"));
    // Then silent, even if the node comes back.
    mgmt.add_node(
        metropolis_proto::metropolis::node::core::curator::proto::private::AddNodeRequest {
            public_key: raw.to_vec().into(),
        },
    )
    .await
    .unwrap();
    assert!(
        tokio::time::timeout(Duration::from_millis(300), one.next())
            .await
            .is_err()
    );

    assert_eq!(next_change(&mut all).await, format!("put {id}"));
}

/// Seconds since the Unix epoch by this process's clock.
fn unix_now() -> i64 {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    i64::try_from(since.as_secs()).unwrap()
}

async fn the_curator_stamps_status_timestamps(rt: RuntimeKind) {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("d"), rt);
    let me = d.node_id();
    // Sent as of 1990-01-01T00:00:00Z.
    let mut sent = status("10.1.2.3", 7, 0);
    sent.timestamp = Some(prost_types::Timestamp {
        seconds: 631_152_000,
        nanos: 0,
    });
    let before = unix_now();
    curator(d.unix().await)
        .update_node_status(curator::UpdateNodeStatusRequest {
            node_id: me.to_string(),
            status: Some(sent),
        })
        .await
        .unwrap();
    let kind = curator::watch_request::Kind::NodeInCluster(curator::watch_request::NodeInCluster {
        node_id: me.to_string(),
    });
    let mut one = curator(d.unix().await)
        .watch(curator::WatchRequest { kind: Some(kind) })
        .await
        .unwrap()
        .into_inner();
    let ev = tokio::time::timeout(Duration::from_secs(10), one.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let after = unix_now();
    assert_eq!(ev.nodes.len(), 1);
    let node = &ev.nodes[0];
    // Served with the curator's time of acceptance, the rest as sent.
    assert_eq!(seq(node), 7, "the marker in the version is kept");
    let status = node.status.as_ref().unwrap();
    assert_eq!(status.external_address, "10.1.2.3");
    let stamped = status.timestamp.as_ref().unwrap().seconds;
    assert!(
        (before - 120..=after + 120).contains(&stamped),
        "served timestamp {stamped}, sent 631152000, this clock {before}..{after}"
    );
}

/// The next single change on a NodesInCluster stream, as "put ID" or "del ID".
async fn next_change(s: &mut tonic::Streaming<curator::WatchEvent>) -> String {
    let ev = tokio::time::timeout(Duration::from_secs(10), s.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let mut seen: Vec<String> = ev.nodes.iter().map(|n| format!("put {}", n.id)).collect();
    seen.extend(
        ev.node_tombstones
            .iter()
            .map(|t| format!("del {}", t.node_id)),
    );
    assert_eq!(seen.len(), 1, "one change per event here: {seen:?}");
    seen.remove(0)
}

against_both_runtimes_and_etcd!(
    big_backlog_is_chunked_and_followed_without_gap,
    tombstones_and_node_in_cluster,
    the_curator_stamps_status_timestamps
);
