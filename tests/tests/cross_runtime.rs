//! Runtimes interoperate: a smol client against the tokio server (and the
//! smol server), over the socket and over mutual TLS; a data directory
//! written by one runtime reopens in the other. (The tokio client against
//! the smol server is every `smol_server::*` test of the other files.)

#![allow(clippy::unwrap_used)]

use futures::StreamExt;
use metropolis_pki::{Credentials, client_config};
use metropolis_proto::prelude::{common, curator};
use metropolis_runtime_smol::rt::SmolRuntime;
use metropolis_tests::{Daemon, RuntimeKind, curator};
use metropolis_transport::connect;
use metropolis_transport::grpc::Channel;

fn update(id: &str, addr: &str) -> curator::UpdateNodeStatusRequest {
    let status = common::NodeStatus {
        external_address: addr.into(),
        ..Default::default()
    };
    curator::UpdateNodeStatusRequest {
        node_id: id.into(),
        status: Some(status),
    }
}

async fn backlog(channel: Channel) -> Vec<curator::Node> {
    let kind = curator::watch_request::Kind::NodesInCluster(Default::default());
    let mut s = curator(channel)
        .watch(curator::WatchRequest { kind: Some(kind) })
        .await
        .unwrap()
        .into_inner();
    let mut nodes = Vec::new();
    loop {
        let ev = s.next().await.unwrap().unwrap();
        nodes.extend(ev.nodes);
        if ev.progress != 0 {
            return nodes;
        }
    }
}

fn smol_client_against(server: RuntimeKind) {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("d"), server);
    let me = d.node_id().to_string();
    smol::block_on(async {
        let rt = SmolRuntime::global().shared();
        // Over the socket, as this node.
        let mut c = curator(connect::unix(&rt, &d.socket).await.unwrap());
        c.update_node_status(update(&me, "10.7.7.7")).await.unwrap();
        // Over mutual TLS, as the owner.
        let owner = Credentials::read_from_dir(&d.data_dir.join("owner"), "owner").unwrap();
        let tls = client_config(Some(&owner), &owner.ca_pem).unwrap();
        let channel = connect::tls(&rt, &d.addr, tls).await.unwrap();
        let nodes = backlog(channel).await;
        assert_eq!(nodes.len(), 1);
        assert_eq!(
            nodes[0].status.as_ref().unwrap().external_address,
            "10.7.7.7"
        );
    });
}

#[test]
fn smol_client_against_tokio_server() {
    smol_client_against(RuntimeKind::Tokio);
}

#[test]
fn smol_client_against_smol_server() {
    smol_client_against(RuntimeKind::Smol);
}

async fn data_dir_moves(first: RuntimeKind, second: RuntimeKind) {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d");
    let mut d = Daemon::start(&data, first);
    let me = d.node_id().to_string();
    let other = d.add_node(&dir.path().join("n1")).await;
    curator(d.unix().await)
        .update_node_status(update(&me, "fd00::9"))
        .await
        .unwrap();
    let before = backlog(d.unix().await).await;
    assert!(d.terminate().success());

    let d = Daemon::start(&data, second);
    assert_eq!(d.node_id().to_string(), me, "same identity");
    let after = backlog(d.unix().await).await;
    assert_eq!(before, after);
    assert!(after.iter().any(|n| n.id == other.to_string()));
    // The node credential issued by the first runtime works on the second.
    let mut as_other = curator(d.tls(&dir.path().join("n1"), "node").await);
    as_other
        .update_node_status(update(other.as_str(), "10.0.0.9"))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_dir_from_tokio_opens_on_smol() {
    data_dir_moves(RuntimeKind::Tokio, RuntimeKind::Smol).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_dir_from_smol_opens_on_tokio() {
    data_dir_moves(RuntimeKind::Smol, RuntimeKind::Tokio).await;
}
