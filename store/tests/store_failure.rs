//! A failed write fails the store: the child process runs the store under a
//! file size limit (`ulimit -f`, with SIGXFSZ ignored, so writes past it fail
//! with EFBIG), and must never acknowledge a transaction that is not on
//! disk; every request after the failure fails; the directory reopens with
//! every acknowledged transaction.

#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Wake, Waker};

use bytes::Bytes;
use common::*;
use metropolis_core::ports::Readiness;
use metropolis_core::store::{KeyRange, Op, OpResult, StoreError, Txn};
use metropolis_store::{EmbeddedStore, StoreOptions};

const CHILD_DIR: &str = "METROPOLIS_STORE_FAILURE_CHILD_DIR";

fn put_padded(key: &str) -> Txn {
    Txn {
        success: vec![Op::Put {
            key: Bytes::copy_from_slice(key.as_bytes()),
            value: Bytes::from(vec![b'v'; 200]),
            lease: 0,
        }],
        ..Txn::default()
    }
}

/// Counts its wake-ups.
#[derive(Default)]
struct Wakes(AtomicUsize);

impl Wake for Wakes {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// The child's body: runs only when started by the test below.
#[test]
fn write_failure_child() {
    let Ok(dir) = std::env::var(CHILD_DIR) else {
        return;
    };
    let store = EmbeddedStore::open(Path::new(&dir), StoreOptions::default()).unwrap();
    let health = store.health();
    let wakes = Arc::new(Wakes::default());
    health.subscribe(Waker::from(wakes.clone()));
    println!("ready-before {}", health.unready().is_none());
    for i in 0..100_000 {
        let key = format!("k{i}");
        match block_on(store.txn(put_padded(&key))) {
            Ok(r) => println!("ack {key} {}", r.revision),
            Err(StoreError::Unavailable(why)) => {
                println!("failed {why}");
                break;
            }
            Err(e) => panic!("{e}"),
        }
    }
    println!("health-woken {}", wakes.0.load(Ordering::SeqCst) > 0);
    println!("unready {}", health.unready().unwrap_or_default());
    let later = block_on(store.txn(put_padded("later")));
    println!(
        "later-fails {}",
        matches!(later, Err(StoreError::Unavailable(_)))
    );
    let read = block_on(store.txn(Txn::default()));
    println!(
        "read-fails {}",
        matches!(read, Err(StoreError::Unavailable(_)))
    );
    println!("close-fails {}", store.close().is_err());
}

#[test]
fn failed_write_fails_the_store_and_acknowledges_nothing_lost() {
    let dir = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let output = Command::new("sh")
        .arg("-c")
        .arg("trap '' XFSZ; ulimit -f 64 || exit 99; exec \"$0\" \"$@\"")
        .arg(&exe)
        .args([
            "write_failure_child",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_DIR, dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "child failed: {output:?}");
    let acks: Vec<(&str, i64)> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("ack "))
        .map(|l| {
            let (key, rev) = l.split_once(' ').unwrap();
            (key, rev.parse().unwrap())
        })
        .collect();
    assert!(acks.len() > 10, "{stdout}");
    let failed = stdout
        .lines()
        .find_map(|l| l.strip_prefix("failed "))
        .expect("no failure");
    assert!(
        failed.contains("File too large") && failed.contains("wal"),
        "{failed}"
    );
    assert!(stdout.contains("ready-before true"), "{stdout}");
    assert!(stdout.contains("health-woken true"), "{stdout}");
    assert!(
        stdout.contains("unready the embedded store failed and accepts no more requests"),
        "{stdout}"
    );
    assert!(stdout.contains("later-fails true"), "{stdout}");
    assert!(stdout.contains("read-fails true"), "{stdout}");
    assert!(stdout.contains("close-fails true"), "{stdout}");

    let store = EmbeddedStore::open(dir.path(), StoreOptions::default()).unwrap();
    for (key, rev) in &acks {
        let r = block_on(store.txn(Txn {
            success: vec![Op::Range(KeyRange::Key(Bytes::copy_from_slice(
                key.as_bytes(),
            )))],
            ..Txn::default()
        }))
        .unwrap();
        match &r.results[0] {
            OpResult::Range(kvs) => {
                assert_eq!(kvs.len(), 1, "acknowledged {key} is lost");
                assert_eq!(kvs[0].mod_revision, *rev);
            }
            other => panic!("{other:?}"),
        }
    }
    // And the store works again.
    block_on(store.txn(put_padded("again"))).unwrap();
    // Healthy until closed.
    let health = store.health();
    assert_eq!(health.unready(), None);
    store.close().unwrap();
    assert!(health.unready().unwrap().contains("closed"));
}
