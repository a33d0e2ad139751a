//! Embedding the curator in a tokio program: the server and a watcher run
//! on one runtime. The watcher sees the backlog, then this node's status
//! update, then the program shuts down. Self-terminating.
//!
//! cargo run -p metropolis-runtime-tokio --example embed_tokio

use std::time::Duration;

use futures::StreamExt;
use metropolis_node::daemon::{Config, NodeServices};
use metropolis_node::serving;
use metropolis_proto::prelude::curator::curator_client::CuratorClient;
use metropolis_proto::prelude::{common, curator};
use metropolis_runtime_tokio::rt::TokioRuntime;
use metropolis_transport::connect;
use metropolis_transport::grpc::Channel;
use metropolis_transport::shutdown::shutdown_pair;

type Error = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> Result<(), Error> {
    let dir = tempfile::tempdir()?;
    let config = Config::new(dir.path(), "127.0.0.1:0".parse()?);
    let runtime = TokioRuntime::shared();
    let node = NodeServices::prepare(&config, runtime.clone()).await?;
    let (trigger, shutdown) = shutdown_pair();
    let serving = serving::start(&runtime, &node, shutdown)?;
    println!(
        "curator serving on {} and {}",
        node.socket.display(),
        serving.tls_addr
    );

    // The watcher: a NodesInCluster stream over the local socket.
    let channel = connect::unix(&runtime, &node.socket).await?;
    let mut client = CuratorClient::with_origin(channel, Channel::origin());
    let kind = curator::watch_request::Kind::NodesInCluster(Default::default());
    let mut events = client
        .watch(curator::WatchRequest { kind: Some(kind) })
        .await?
        .into_inner();
    let backlog = events.next().await.ok_or("stream ended")??;
    println!("backlog: {} node(s)", backlog.nodes.len());

    // This node reports its address; the watcher sees it.
    let status = common::NodeStatus {
        external_address: "192.0.2.1".into(),
        ..Default::default()
    };
    let request = curator::UpdateNodeStatusRequest {
        node_id: node.node_id.to_string(),
        status: Some(status),
    };
    client.update_node_status(request).await?;
    let update = tokio::time::timeout(Duration::from_secs(10), events.next())
        .await
        .map_err(|_| "no update within 10 s")?
        .ok_or("stream ended")??;
    let address = update
        .nodes
        .first()
        .and_then(|n| n.status.as_ref())
        .map(|s| s.external_address.clone());
    println!(
        "watcher saw {} at {}",
        node.node_id,
        address.unwrap_or_default()
    );

    node.end_streams();
    trigger.trigger();
    serving.drain(Duration::from_secs(5)).await;
    node.close();
    println!("done");
    Ok(())
}
