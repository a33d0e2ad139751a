//! Issue 18, item 3: curator instances over one etcd must share the
//! cluster CA. One with a CA of its own refuses to start and says how to
//! join; one joined through the documented path (`metroctl node add
//! --curator --out DIR`, then `metropolisd --join DIR`) serves and
//! forwards.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use futures::StreamExt;
use metropolis_core::identity::NodeId;
use metropolis_proto::prelude::{common, curator};
use metropolis_tests::cluster::start_elected;
use metropolis_tests::etcd::Etcd;
use metropolis_tests::{Daemon, RuntimeKind, daemon_bin, free_port, watch_nodes};

fn metroctl(data_dir: &Path, args: &[&str]) -> std::process::Output {
    Command::new(daemon_bin().with_file_name("metroctl-under-test"))
        .arg("--data-dir")
        .arg(data_dir)
        .args(args)
        .output()
        .unwrap()
}

async fn set_status(d: &Daemon, address: &str) {
    metropolis_tests::curator(d.unix().await)
        .update_node_status(curator::UpdateNodeStatusRequest {
            node_id: d.node_id().to_string(),
            status: Some(common::NodeStatus {
                external_address: address.into(),
                ..Default::default()
            }),
        })
        .await
        .unwrap();
}

/// Reads `stream` until node `id` has address `address`.
async fn until_address(
    stream: &mut tonic::Streaming<curator::WatchEvent>,
    id: &NodeId,
    address: &str,
) {
    let found = tokio::time::timeout(Duration::from_secs(15), async {
        while let Some(event) = stream.next().await {
            let event = event.unwrap();
            if event.nodes.iter().any(|n| {
                n.id == id.as_str()
                    && n.status.as_ref().map(|s| s.external_address.as_str()) == Some(address)
            }) {
                return;
            }
        }
        panic!("the watch ended");
    })
    .await;
    assert!(found.is_ok(), "{id} never reported {address}");
}

async fn join_through_the_bundle(first: RuntimeKind, joining: RuntimeKind) {
    let etcd = Etcd::start();
    let dir = tempfile::tempdir().unwrap();
    let a = start_elected(&dir.path().join("a"), first, &etcd.urls(), &[]);

    // An instance with a CA of its own (a fresh data directory, no
    // --join) refuses to start, saying how to join.
    let stranger_dir = dir.path().join("stranger");
    let mut stranger = Daemon::spawn_with(
        &stranger_dir,
        format!("127.0.0.1:{}", free_port()),
        joining,
        &[
            "--etcd".into(),
            etcd.urls(),
            "--lease-ttl".into(),
            "2".into(),
        ],
    );
    let exit = stranger.wait_exit(Duration::from_secs(30));
    assert!(!exit.success(), "{exit:?}");
    let log = stranger.log();
    assert!(
        log.contains("is not the cluster's") && log.contains("--join"),
        "the refusal says what to do:\n{log}"
    );

    // The documented path: a bundle from the first instance's host, an
    // empty data directory with --join.
    let bundle = dir.path().join("bundle");
    let write_bundle = || {
        let out = bundle.to_str().unwrap();
        metroctl(&a.data_dir, &["node", "add", "--curator", "--out", out])
    };
    let out = write_bundle();
    assert!(
        out.status.success(),
        "metroctl node add --curator: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Never over an existing bundle.
    assert!(!write_bundle().status.success());
    let b = start_elected(
        &dir.path().join("b"),
        joining,
        &etcd.urls(),
        &["--join".into(), bundle.to_str().unwrap().into()],
    );

    // Each instance's own update is seen through the other: one of the two
    // is the follower, so one of the calls and one of the watches were
    // forwarded across the instances' mutual TLS.
    let mut through_a = watch_nodes(a.unix().await).await;
    let mut through_b = watch_nodes(b.unix().await).await;
    set_status(&b, "192.0.2.22").await;
    set_status(&a, "192.0.2.11").await;
    until_address(&mut through_a, &b.node_id(), "192.0.2.22").await;
    until_address(&mut through_b, &a.node_id(), "192.0.2.11").await;

    // A restart of the joined instance with the same flags is fine.
    drop(b);
    let _b = start_elected(
        &dir.path().join("b"),
        joining,
        &etcd.urls(),
        &["--join".into(), bundle.to_str().unwrap().into()],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokio_joins_through_the_bundle() {
    join_through_the_bundle(RuntimeKind::Tokio, RuntimeKind::Tokio).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smol_joins_a_tokio_instance_through_the_bundle() {
    join_through_the_bundle(RuntimeKind::Tokio, RuntimeKind::Smol).await
}
