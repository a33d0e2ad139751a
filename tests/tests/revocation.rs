//! Issue 18, item 2: a node removed with `RemoveNode` keeps a certificate
//! the cluster CA signed, but the cluster no longer accepts it. Every later
//! call is refused with Unauthenticated, and the Watch streams it opened
//! before end with Unauthenticated; on the embedded store and elected over
//! etcd, on both runtimes, and through a follower.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use futures::StreamExt;
use metropolis_core::identity::NodeId;
use metropolis_proto::metropolis::node::core::curator::proto::private::{
    RemoveNodeRequest, node_management_client::NodeManagementClient,
};
use metropolis_proto::prelude::{common, curator};
use metropolis_tests::{Daemon, RuntimeKind, against_both_runtimes_and_etcd, watch_nodes};
use metropolis_transport::grpc::Channel;
use tonic::Code;

fn update(id: &NodeId, address: &str) -> curator::UpdateNodeStatusRequest {
    curator::UpdateNodeStatusRequest {
        node_id: id.to_string(),
        status: Some(common::NodeStatus {
            external_address: address.into(),
            ..Default::default()
        }),
    }
}

fn watch_node_request(id: &NodeId) -> curator::WatchRequest {
    curator::WatchRequest {
        kind: Some(curator::watch_request::Kind::NodeInCluster(
            curator::watch_request::NodeInCluster {
                node_id: id.to_string(),
            },
        )),
    }
}

/// Reads `stream` until it ends; the status it ended with.
async fn ended_with(
    stream: &mut tonic::Streaming<curator::WatchEvent>,
    what: &str,
) -> tonic::Status {
    let limit = Duration::from_secs(10);
    loop {
        match tokio::time::timeout(limit, stream.next()).await {
            Err(_) => panic!("{what}: still open {limit:?} after the removal"),
            Ok(Some(Ok(_))) => continue,
            Ok(Some(Err(status))) => return status,
            Ok(None) => panic!("{what}: ended without a status"),
        }
    }
}

/// Reads `stream` up to its last backlogged event.
async fn through_backlog(stream: &mut tonic::Streaming<curator::WatchEvent>) {
    while let Some(event) = stream.next().await {
        let event = event.unwrap();
        if event.progress == curator::watch_event::Progress::LastBacklogged as i32 {
            return;
        }
    }
    panic!("the watch ended before its backlog");
}

async fn remove(owner: Channel, id: &NodeId) {
    NodeManagementClient::with_origin(owner, Channel::origin())
        .remove_node(RemoveNodeRequest {
            node_id: id.to_string(),
        })
        .await
        .unwrap();
}

/// X's watches opened before its removal (NodesInCluster, and
/// NodeInCluster of another node, whose events say nothing about X), over
/// `as_x`.
async fn open_watches(
    as_x: &Channel,
    other: &NodeId,
) -> [tonic::Streaming<curator::WatchEvent>; 2] {
    let mut nodes = watch_nodes(as_x.clone()).await;
    through_backlog(&mut nodes).await;
    let mut client = metropolis_tests::curator(as_x.clone());
    let other = client
        .watch(watch_node_request(other))
        .await
        .unwrap()
        .into_inner();
    [nodes, other]
}

/// After X's removal: its open streams end, and calls over a connection
/// it already had and over a new one are refused.
async fn assert_refused(
    open: [tonic::Streaming<curator::WatchEvent>; 2],
    old: Channel,
    new: Channel,
    x: &NodeId,
) {
    for (mut stream, what) in open.into_iter().zip(["NodesInCluster", "NodeInCluster"]) {
        let status = ended_with(&mut stream, what).await;
        assert_eq!(status.code(), Code::Unauthenticated, "{what}: {status:?}");
        assert!(status.message().contains(x.as_str()), "{status:?}");
    }
    for (channel, how) in [(old, "the connection it had"), (new, "a new connection")] {
        let mut client = metropolis_tests::curator(channel);
        let e = client
            .update_node_status(update(x, "192.0.2.66"))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::Unauthenticated, "status, {how}: {e:?}");
        let mut stream = client
            .watch(curator::WatchRequest {
                kind: Some(curator::watch_request::Kind::NodesInCluster(
                    Default::default(),
                )),
            })
            .await
            .map(|s| s.into_inner());
        let status = match &mut stream {
            Err(status) => status.clone(),
            Ok(stream) => ended_with(stream, how).await,
        };
        assert_eq!(
            status.code(),
            Code::Unauthenticated,
            "watch, {how}: {status:?}"
        );
    }
}

async fn a_removed_node_is_refused(rt: RuntimeKind) {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("d"), rt);
    let x_dir = dir.path().join("x");
    let x = d.add_node(&x_dir).await;
    let as_x = d.tls(&x_dir, "node").await;
    metropolis_tests::curator(as_x.clone())
        .update_node_status(update(&x, "192.0.2.6"))
        .await
        .unwrap();
    let open = open_watches(&as_x, &d.node_id()).await;

    remove(d.owner().await, &x).await;
    assert_refused(open, as_x, d.tls(&x_dir, "node").await, &x).await;

    // The owner and the instance's own node are unaffected.
    let mut owner_watch = watch_nodes(d.owner().await).await;
    through_backlog(&mut owner_watch).await;
    metropolis_tests::curator(d.unix().await)
        .update_node_status(update(&d.node_id(), "192.0.2.1"))
        .await
        .unwrap();
}

against_both_runtimes_and_etcd!(a_removed_node_is_refused);

/// The cases that need etcd (the `system` feature).
#[cfg(feature = "system")]
mod over_etcd {
    use super::*;
    use metropolis_tests::cluster::Curators;
    use metropolis_tests::etcd::Etcd;
    use std::path::Path;

    /// Two instances over etcd: X's streams and calls go through the follower
    /// (forwarded to the leader on X's behalf), the removal through the
    /// leader.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_removed_node_is_refused_through_a_follower() {
        let etcd = Etcd::start();
        let dir = tempfile::tempdir().unwrap();
        let c = Curators::pair(dir.path(), &etcd.urls());
        let l = c.leader(&etcd, Duration::from_secs(10)).await;
        let (leader, follower) = (&c.daemons[l], &c.daemons[c.followers(l)[0]]);
        let x_dir: &Path = &dir.path().join("x");
        let x = leader.add_node(x_dir).await;
        let as_x = follower.tls(x_dir, "node").await;
        metropolis_tests::curator(as_x.clone())
            .update_node_status(update(&x, "192.0.2.6"))
            .await
            .unwrap();
        let open = open_watches(&as_x, &leader.node_id()).await;

        remove(leader.owner().await, &x).await;
        assert_refused(open, as_x, follower.tls(x_dir, "node").await, &x).await;
        // And on the leader directly.
        let e = metropolis_tests::curator(leader.tls(x_dir, "node").await)
            .update_node_status(update(&x, "192.0.2.67"))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
    }
}
