//! Backup and restore of the embedded store with `metroctl snapshot`, as
//! an operator runs them: saved from a running daemon under write load,
//! restored into an empty data directory, and served by a new daemon,
//! which holds every write acknowledged before the save began; on both
//! runtimes. A node's credential may not save one, nor may a restore go
//! over a data directory with a store.

#![allow(clippy::unwrap_used)]

use std::process::{Command, Output};

use metropolis_tests::outcome::stderr;
use metropolis_tests::{
    Daemon, RuntimeKind, StatusWriters, against_both_runtimes, daemon_bin, status_seqs,
};

fn metroctl(args: &[&str]) -> Output {
    Command::new(daemon_bin().with_file_name("metroctl-under-test"))
        .args(args)
        .output()
        .unwrap()
}

/// metroctl on data directory `data`, over TLS to `endpoint`, as its
/// owner unless `args` name other credentials.
fn over_tls(data: &str, endpoint: &str, args: &[&str]) -> Output {
    let all: Vec<&str> = ["--data-dir", data, "--endpoints", endpoint]
        .into_iter()
        .chain(args.iter().copied())
        .collect();
    metroctl(&all)
}

async fn saved_under_load_and_restored(runtime: RuntimeKind) {
    let dir = tempfile::tempdir().unwrap();
    let old = dir.path().join("old");
    let d = Daemon::start(&old, runtime);
    let data = old.to_str().unwrap();
    let machine = "3b241101-e2bb-4255-8caf-4136c566a962";
    let key = dir.path().join("agent.key");
    let key = key.to_str().unwrap();
    let out = over_tls(
        data,
        &d.addr,
        &["machine", "add", machine, "--generate-key", key],
    );
    assert!(out.status.success(), "{}", stderr(&out));

    // Two nodes update their status as fast as the daemon acknowledges.
    let writers = StatusWriters::start(&d, dir.path(), 2).await;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;

    // A node's credential may not take a backup.
    let node_dir = dir.path().join("n0");
    let node = ["--credentials", node_dir.to_str().unwrap()];
    let out = over_tls(
        data,
        &d.addr,
        &[&node[..], &["snapshot", "save", "/dev/null/x"]].concat(),
    );
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));

    let before = writers.acked();
    let file = dir.path().join("backup.snap");
    let out = tokio::task::spawn_blocking({
        let (data, addr, file) = (data.to_owned(), d.addr.clone(), file.clone());
        move || {
            over_tls(
                &data,
                &addr,
                &["snapshot", "save", file.to_str().unwrap(), "--json"],
            )
        }
    })
    .await
    .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let saved: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(saved["bytes"].as_u64().unwrap() > 0 && saved["revision"].as_i64().unwrap() > 0);
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    let during: Vec<i64> = writers.acked().into_iter().map(|(_, last)| last).collect();
    drop(d);
    writers.join().await;

    // Restore into an empty data directory, with the old one's PKI and
    // owner credential so the cluster keeps its CA and this node its name.
    let new = dir.path().join("new");
    std::fs::create_dir_all(&new).unwrap();
    for sub in ["pki", "owner"] {
        let status = Command::new("cp")
            .args(["-a"])
            .arg(old.join(sub))
            .arg(new.join(sub))
            .status()
            .unwrap();
        assert!(status.success());
    }
    let out = metroctl(&[
        "--data-dir",
        new.to_str().unwrap(),
        "snapshot",
        "restore",
        file.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("restored revision"), "{text}");
    // Not twice.
    let out = metroctl(&[
        "--data-dir",
        new.to_str().unwrap(),
        "snapshot",
        "restore",
        file.to_str().unwrap(),
    ]);
    assert!(
        !out.status.success() && stderr(&out).contains("empty data directory"),
        "{}",
        stderr(&out)
    );

    let d = Daemon::start(&new, runtime);
    let restored = status_seqs(&d).await;
    for ((id, was), now) in before.iter().zip(&during) {
        let got = restored[id];
        assert!(
            got >= *was && got <= *now + 1,
            "node {id}: acknowledged {was} before the save, {now} after it; restored {got}"
        );
    }
    let out = over_tls(
        new.to_str().unwrap(),
        &d.addr,
        &["machine", "list", "--json"],
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(machine),
        "{}",
        stderr(&out)
    );
    // And it takes writes.
    let out = metroctl(&[
        "--data-dir",
        new.to_str().unwrap(),
        "status",
        "set",
        "--external-address",
        "192.0.2.9",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
}

/// A damaged or foreign file is refused before anything is written.
#[test]
fn a_damaged_backup_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("junk.snap");
    std::fs::write(&file, b"MTRPSNAP but not really a snapshot file at all").unwrap();
    let data = dir.path().join("d");
    let out = metroctl(&[
        "--data-dir",
        data.to_str().unwrap(),
        "snapshot",
        "restore",
        file.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("not a backup this build restores"),
        "{}",
        stderr(&out)
    );
    assert!(!data.join("store/wal").exists());
}

against_both_runtimes!(saved_under_load_and_restored);
