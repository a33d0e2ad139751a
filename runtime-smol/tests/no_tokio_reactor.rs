//! The smol server runs no tokio reactor: serving real requests starts no
//! tokio thread in the process.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use metropolis_node::daemon::{Config, NodeServices};
use metropolis_node::serving;
use metropolis_pki::{Credentials, client_config};
use metropolis_proto::prelude::curator::curator_client::CuratorClient;
use metropolis_proto::prelude::{common, curator};
use metropolis_runtime_smol::rt::SmolRuntime;
use metropolis_transport::connect;
use metropolis_transport::grpc::Channel;
use metropolis_transport::shutdown::shutdown_pair;

fn thread_names() -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .map(|t| {
            std::fs::read_to_string(t.unwrap().path().join("comm"))
                .unwrap()
                .trim()
                .to_string()
        })
        .collect()
}

#[test]
fn serving_on_smol_starts_no_tokio_thread() {
    let executor = Arc::new(smol::Executor::new());
    let rt = SmolRuntime::on(executor.clone()).shared();
    smol::block_on(executor.run(async move {
        let dir = tempfile::tempdir().unwrap();
        let config = Config::new(dir.path(), "127.0.0.1:0".parse().unwrap());
        let node = NodeServices::prepare(&config, rt.clone()).await.unwrap();
        let (trigger, shutdown) = shutdown_pair();
        let serving = serving::start(&rt, &node, shutdown).unwrap();

        // Over the socket: a watch and an update.
        let channel = connect::unix(&rt, &node.socket).await.unwrap();
        let mut c = CuratorClient::with_origin(channel, Channel::origin());
        let kind = curator::watch_request::Kind::NodesInCluster(Default::default());
        let mut events = c
            .watch(curator::WatchRequest { kind: Some(kind) })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(events.next().await.unwrap().unwrap().nodes.len(), 1);
        let status = common::NodeStatus {
            external_address: "10.0.0.1".into(),
            ..Default::default()
        };
        c.update_node_status(curator::UpdateNodeStatusRequest {
            node_id: node.node_id.to_string(),
            status: Some(status),
        })
        .await
        .unwrap();
        assert_eq!(events.next().await.unwrap().unwrap().nodes.len(), 1);

        // Over mutual TLS as the owner.
        let owner = Credentials::read_from_dir(&dir.path().join("owner"), "owner").unwrap();
        let tls = client_config(Some(&owner), &owner.ca_pem).unwrap();
        let channel = connect::tls(&rt, &serving.tls_addr.to_string(), tls)
            .await
            .unwrap();
        let mut c = CuratorClient::with_origin(channel, Channel::origin());
        let kind = curator::watch_request::Kind::NodesInCluster(Default::default());
        let mut events = c
            .watch(curator::WatchRequest { kind: Some(kind) })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(events.next().await.unwrap().unwrap().nodes.len(), 1);

        let names = thread_names();
        assert!(
            names.iter().all(|n| !n.starts_with("tokio")),
            "threads: {names:?}"
        );
        assert!(
            names.iter().any(|n| n == "async-io"),
            "the async-io reactor serves: {names:?}"
        );

        node.end_streams();
        trigger.trigger();
        serving.drain(Duration::from_secs(5)).await;
        node.close();
    }));
}
