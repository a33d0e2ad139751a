//! Every error code of docs/spec/semantics.md for `Watch` and `UpdateNodeStatus`,
//! over real sockets against a real daemon.

#![allow(clippy::unwrap_used)]

use futures::StreamExt;
use metropolis_pki::{ClusterCa, client_config};
use metropolis_proto::prelude::{common, curator};
use metropolis_tests::{Daemon, RuntimeKind, against_both_runtimes_and_etcd, curator};
use tonic::Code;

fn status(addr: &str) -> Option<common::NodeStatus> {
    Some(common::NodeStatus {
        external_address: addr.into(),
        ..Default::default()
    })
}

fn update(id: &str, status: Option<common::NodeStatus>) -> curator::UpdateNodeStatusRequest {
    curator::UpdateNodeStatusRequest {
        node_id: id.into(),
        status,
    }
}

async fn invalid_argument(rt: RuntimeKind) {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("d"), rt);
    let mut c = curator(d.unix().await);
    let me = d.node_id().to_string();

    // As the reference: a kind this curator cannot read is Unimplemented.
    let e = c
        .watch(curator::WatchRequest { kind: None })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unimplemented, "{e:?}");
    assert!(e.message().contains("kind"), "{}", e.message());

    let kind = curator::watch_request::Kind::NodeInCluster(curator::watch_request::NodeInCluster {
        node_id: "node-1".into(),
    });
    let e = c
        .watch(curator::WatchRequest { kind: Some(kind) })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("node_id"), "{}", e.message());

    // As the reference: a node_id that is not the caller's, even a
    // malformed one, is PermissionDenied.
    let e = c
        .update_node_status(update("metropolis-XYZ", status("10.0.0.1")))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("metropolis-XYZ"), "{}", e.message());

    for (req, field) in [
        (update(&me, None), "status"),
        (update(&me, status("not-an-ip")), "status.external_address"),
        (update(&me, status("")), "status.external_address"),
    ] {
        let e = c.update_node_status(req).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
        assert!(
            e.message().contains(field),
            "message {:?} should name {field}",
            e.message()
        );
    }
    // And the daemon's own node may update itself over the socket.
    c.update_node_status(update(&me, status("192.0.2.7")))
        .await
        .unwrap();
}

async fn permission_denied_and_removed_nodes(rt: RuntimeKind) {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("d"), rt);
    let me = d.node_id().to_string();
    let other_dir = dir.path().join("other");
    let other = d.add_node(&other_dir).await;

    // Another node's ID, over the socket (caller: this node) and over TLS.
    let mut local = curator(d.unix().await);
    let e = local
        .update_node_status(update(other.as_str(), status("10.0.0.2")))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    assert!(
        e.message().contains(other.as_str()) && e.message().contains(&me),
        "{}",
        e.message()
    );
    let mut as_other = curator(d.tls(&other_dir, "node").await);
    let e = as_other
        .update_node_status(update(&me, status("10.0.0.2")))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    as_other
        .update_node_status(update(other.as_str(), status("10.0.0.2")))
        .await
        .unwrap();

    // The owner is not a node.
    let mut owner = curator(d.owner().await);
    let e = owner
        .update_node_status(update(&me, status("10.0.0.3")))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");

    // A node that was removed still holds a valid certificate, but is no
    // longer a member: Unauthenticated (tests/tests/revocation.rs has more).
    let gone_dir = dir.path().join("gone");
    let gone = d.add_node(&gone_dir).await;
    let mut mgmt = metropolis_proto::metropolis::node::core::curator::proto::private::node_management_client::NodeManagementClient::with_origin(
        d.owner().await,
        metropolis_transport::grpc::Channel::origin(),
    );
    mgmt.remove_node(
        metropolis_proto::metropolis::node::core::curator::proto::private::RemoveNodeRequest {
            node_id: gone.to_string(),
        },
    )
    .await
    .unwrap();
    let mut as_gone = curator(d.tls(&gone_dir, "node").await);
    let e = as_gone
        .update_node_status(update(gone.as_str(), status("10.0.0.4")))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");

    // A node may not manage nodes.
    let mut mgmt_as_node = metropolis_proto::metropolis::node::core::curator::proto::private::node_management_client::NodeManagementClient::with_origin(
        d.tls(&other_dir, "node").await,
        metropolis_transport::grpc::Channel::origin(),
    );
    let e = mgmt_as_node
        .remove_node(
            metropolis_proto::metropolis::node::core::curator::proto::private::RemoveNodeRequest {
                node_id: me.clone(),
            },
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
}

async fn unauthenticated(rt: RuntimeKind) {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("d"), rt);
    let ca_pem = std::fs::read_to_string(d.data_dir.join("pki/ca.pem")).unwrap();

    // TLS without a client certificate.
    let config = client_config(None, &ca_pem).unwrap();
    let mut anon = curator(
        metropolis_transport::connect::tls(
            &metropolis_runtime_tokio::rt::TokioRuntime::shared(),
            &d.addr,
            config,
        )
        .await
        .unwrap(),
    );
    let kind = curator::watch_request::Kind::NodesInCluster(Default::default());
    let e = anon
        .watch(curator::WatchRequest {
            kind: Some(kind.clone()),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
    let e = anon
        .update_node_status(update(d.node_id().as_str(), status("10.0.0.1")))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated);

    // A certificate from another CA (trusting the real server CA).
    let foreign = ClusterCa::generate().unwrap();
    let (mut creds, _) = foreign.issue_node(&[]).unwrap();
    creds.ca_pem = ca_pem;
    let config = client_config(Some(&creds), &creds.ca_pem).unwrap();
    let mut stranger = curator(
        metropolis_transport::connect::tls(
            &metropolis_runtime_tokio::rt::TokioRuntime::shared(),
            &d.addr,
            config,
        )
        .await
        .unwrap(),
    );
    let e = stranger
        .watch(curator::WatchRequest { kind: Some(kind) })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");

    // The owner over TLS may watch.
    let mut owner = curator(d.owner().await);
    let kind = curator::watch_request::Kind::NodesInCluster(Default::default());
    let mut s = owner
        .watch(curator::WatchRequest { kind: Some(kind) })
        .await
        .unwrap()
        .into_inner();
    let ev = s.next().await.unwrap().unwrap();
    assert_eq!(
        ev.progress,
        curator::watch_event::Progress::LastBacklogged as i32
    );
    assert_eq!(ev.nodes.len(), 1);
}

against_both_runtimes_and_etcd!(
    invalid_argument,
    permission_denied_and_removed_nodes,
    unauthenticated
);
