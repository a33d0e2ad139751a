//! Issue 18, item 6: the embedded store on a file system that fills up.
//! The data directory is a small tmpfs mounted here (the tests run as
//! root, as CI does); filled to ENOSPC, the write that needs space fails
//! Unavailable, the daemon stops serving and exits non-zero naming the
//! cause, and once space is freed a restart serves every acknowledged
//! write.

#![allow(clippy::unwrap_used)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use futures::StreamExt;
use metropolis_core::identity::NodeId;
use metropolis_proto::prelude::{common, curator};
use metropolis_tests::{Daemon, RuntimeKind, against_both_runtimes, status_seq, status_with};
use tonic::Code;

/// A tmpfs of `size` mounted at `at` for the test's lifetime.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(at).unwrap();
        let out = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(at)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "mounting a tmpfs (this test needs root, as CI runs it): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Tmpfs(at.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Writes zeros into `path` until the file system is full.
fn fill(path: &Path) {
    let mut file = std::fs::File::create(path).unwrap();
    let chunk = vec![0u8; 64 << 10];
    loop {
        match file.write(&chunk) {
            Ok(0) => break,
            Ok(_) => continue,
            Err(e) if e.raw_os_error() == Some(libc_enospc()) => break,
            Err(e) => panic!("filling {}: {e}", path.display()),
        }
    }
    // Also the last partial block.
    let _ = file.write(&[0u8; 512]);
}

/// ENOSPC on Linux.
fn libc_enospc() -> i32 {
    28
}

fn update(id: &NodeId, seq: i64) -> curator::UpdateNodeStatusRequest {
    curator::UpdateNodeStatusRequest {
        node_id: id.to_string(),
        status: Some(common::NodeStatus {
            external_address: "192.0.2.1".into(),
            ..status_with(seq).unwrap()
        }),
    }
}

/// The sequence number ([`metropolis_tests::status_seq`]) of node `id`'s
/// status as the daemon serves it; -1 without one.
async fn served_seq(d: &Daemon, id: &NodeId) -> i64 {
    let mut client = metropolis_tests::curator(d.unix().await);
    let mut stream = client
        .watch(curator::WatchRequest {
            kind: Some(curator::watch_request::Kind::NodeInCluster(
                curator::watch_request::NodeInCluster {
                    node_id: id.to_string(),
                },
            )),
        })
        .await
        .unwrap()
        .into_inner();
    let event = tokio::time::timeout(Duration::from_secs(5), stream.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    status_seq(event.nodes[0].status.as_ref()).unwrap_or(-1)
}

async fn a_full_disk_stops_the_daemon_and_a_restart_recovers(rt: RuntimeKind) {
    let dir = tempfile::tempdir().unwrap();
    // The data directory is the mount point: the daemon's log (beside it)
    // stays on the disk with room.
    let data = dir.path().join("d");
    let _mount = Tmpfs::mount(&data, "8m");
    let mut d = Daemon::start(&data, rt);
    let me = d.node_id();
    let mut client = metropolis_tests::curator(d.unix().await);
    client.update_node_status(update(&me, 1)).await.unwrap();

    fill(&data.join("filler"));
    // Writes go on while the WAL's preallocated space lasts; the first
    // that needs more fails, and is not acknowledged.
    let mut acknowledged = 1;
    let failure = loop {
        let seq = acknowledged + 1;
        match client.update_node_status(update(&me, seq)).await {
            Ok(_) => acknowledged = seq,
            Err(status) => break status,
        }
        assert!(acknowledged < 200_000, "the WAL never ran out of space");
    };
    assert_eq!(failure.code(), Code::Unavailable, "{failure:?}");

    // The daemon does not stay up refusing every write: it exits non-zero
    // and says why.
    let exit = d.wait_exit(Duration::from_secs(20));
    assert!(!exit.success(), "{exit:?}\n{}", d.log());
    let log = d.log();
    assert!(
        log.contains("No space left on device") && log.contains("embedded store failed"),
        "the exit names the cause:\n{log}"
    );

    // Space freed, a restart serves every acknowledged write (the one that
    // failed may or may not have reached the WAL: it was never
    // acknowledged).
    std::fs::remove_file(data.join("filler")).unwrap();
    let d = Daemon::start(&data, rt);
    let seq = served_seq(&d, &me).await;
    assert!(
        seq == acknowledged || seq == acknowledged + 1,
        "served {seq}, acknowledged up to {acknowledged}"
    );
    // And it takes writes again.
    let mut client = metropolis_tests::curator(d.unix().await);
    client
        .update_node_status(update(&me, acknowledged + 2))
        .await
        .unwrap();
    assert_eq!(served_seq(&d, &me).await, acknowledged + 2);
}

against_both_runtimes!(a_full_disk_stops_the_daemon_and_a_restart_recovers);
