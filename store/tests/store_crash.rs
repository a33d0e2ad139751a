//! Crash test: a child process commits transactions and reports each
//! acknowledged revision; it is killed with SIGKILL at a random moment; every
//! acknowledged transaction must be there after reopening.

#![allow(clippy::unwrap_used)]

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use metropolis_core::store::{KeyRange, Op, Txn};
use metropolis_store::{EmbeddedStore, StoreOptions};

const CHILD_DIR: &str = "METROPOLIS_STORE_CRASH_CHILD_DIR";
const CHILD_ROUND: &str = "METROPOLIS_STORE_CRASH_CHILD_ROUND";

fn options() -> StoreOptions {
    // Small snapshots, so that kills also land during rotations.
    StoreOptions::default()
        .with_snapshot_threshold(8 << 10)
        .with_history_revisions(100)
}

/// The child's body: runs only when started by the crash test.
#[test]
fn crash_child() {
    let (Ok(dir), Ok(round)) = (std::env::var(CHILD_DIR), std::env::var(CHILD_ROUND)) else {
        return;
    };
    let store = Arc::new(EmbeddedStore::open(Path::new(&dir), options()).unwrap());
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let store = store.clone();
            let round = round.clone();
            std::thread::spawn(move || {
                for i in 0.. {
                    let key = format!("r{round}/t{t}/{i}");
                    let txn = Txn {
                        success: vec![Op::Put {
                            key: Bytes::from(key.clone()),
                            value: Bytes::from(format!("value of {key}")),
                            lease: 0,
                        }],
                        ..Txn::default()
                    };
                    let rev = block_on(store.txn(txn)).unwrap().revision;
                    println!("ack {key} {rev}");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn acknowledged_txns_survive_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let mut total = 0;
    for round in 0..4 {
        let mut child = Command::new(&exe)
            .args(["crash_child", "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD_DIR, dir.path())
            .env(CHILD_ROUND, round.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        // Let it commit a varying number of transactions, then kill it.
        let wanted = 150 + round * 97;
        let mut acks = vec![];
        while acks.len() < wanted {
            match rx.recv_timeout(Duration::from_secs(60)) {
                Ok(line) if line.starts_with("ack ") => acks.push(line),
                Ok(_) => {}
                Err(e) => panic!("child stopped acknowledging: {e}"),
            }
        }
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        reader.join().unwrap();
        acks.extend(rx.try_iter().filter(|l| l.starts_with("ack ")));

        let store = EmbeddedStore::open(dir.path(), options()).unwrap();
        let mut checked = 0;
        for line in &acks {
            let mut parts = line.split(' ').skip(1);
            let (Some(key), Some(rev)) = (parts.next(), parts.next()) else {
                continue;
            };
            let Ok(rev) = rev.parse::<i64>() else {
                continue;
            }; // a line cut by the kill
            let r = block_on(store.txn(Txn {
                success: vec![Op::Range(KeyRange::Key(Bytes::from(key.to_string())))],
                ..Txn::default()
            }))
            .unwrap();
            let found = match &r.results[0] {
                metropolis_core::store::OpResult::Range(kvs) => kvs.first().cloned(),
                other => panic!("{other:?}"),
            };
            let kv = found.unwrap_or_else(|| panic!("acknowledged {key} at {rev} is lost"));
            assert_eq!(kv.mod_revision, rev, "{key}");
            assert_eq!(kv.value, Bytes::from(format!("value of {key}")));
            checked += 1;
        }
        assert!(checked >= wanted);
        total += checked;
        store.close().unwrap();
    }
    assert!(total >= 600);
}
