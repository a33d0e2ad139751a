//! The embedded store over a simulated disk ([`metropolis_testkit::disk`]), crashed in
//! the middle of its writes.
//!
//! One seed runs several lives of one store directory. In each, the store
//! opens (it must: the disk never damages an acknowledged byte), a client
//! writes keys one transaction at a time (each waited for, so the disk's
//! ops come in an order the seed alone decides), with a seeded fault armed
//! at one of the disk's next ops: a power loss (the write in flight torn
//! at sectors, what was not synced lost), or a write or sync failing with
//! EIO or ENOSPC. A small snapshot threshold makes the store write
//! snapshots and rotate its WAL, through the renames a power loss can undo.
//! Before an open, now and then, an EIO is armed at one of its ops (a
//! read error, or a failed lock, removal or repair): the open must fail
//! with an I/O error naming the file (never call it corruption, never
//! swallow it), and the next open must recover everything. Or a read of
//! the open returns one byte changed or a sector of zeros: the open may
//! fail (as an I/O error: the store reads a file again before it calls it
//! damaged or repairs a torn tail) or not, but an open store holds every
//! acknowledged write, and the next open recovers everything (a misread
//! must not make the store zero an acknowledged batch as a torn write).
//! Between lives, now and then, the disk's fault atlas corrupts a byte of
//! the WAL or the snapshot where it damages what the store acknowledged
//! ([`atlas`]): the next open must refuse, naming that file and
//! an offset before the end of the damaged sector; the byte is then put
//! back and the store must open with everything.
//!
//! Checked at every open, against every key the client sent: acknowledged
//! ⊆ recovered ⊆ issued, and what is recovered is a prefix of what was
//! issued (the log is one sequence); after an injected failure the store
//! acknowledges nothing more (its documented policy: it fails and accepts
//! no more requests) and the next open recovers every acknowledged write.
//!
//! The store's writer is stepped by the client ([`stepped_store`]) on a
//! clock that never moves: no thread, no host clock.

// The checks panic on what breaks an invariant, and what this module
// unwraps is the simulation's own.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use metropolis_core::store::{Op, StoreError, Txn};
use metropolis_store::{EmbeddedStore, OpenError, StoreOptions};

use crate::Outcome;
use crate::atlas;
use crate::hash::TraceHash;
use crate::rng::Rng;
use crate::stepped_store::{self, FrozenClock};
use metropolis_testkit::disk::{DiskFault, SimDisk};

/// The store's directory on the simulated disk.
const DIR: &str = "/data/store";
/// Lives of the store per seed.
const LIVES: usize = 6;
/// Writes a client tries per life.
const WRITES: u64 = 40;
/// A fault before an open (an EIO, a read corruption) is armed at one of
/// its next ops, below this: a few more than an open of the store takes,
/// so now and then none fires.
const OPEN_OPS: u64 = 14;

fn key(n: u64) -> Bytes {
    Bytes::from(format!("k/{n:06}"))
}

fn value(n: u64, len: usize) -> Bytes {
    let mut v = format!("v{n}:").into_bytes();
    v.resize(len.max(v.len()), b'a' + (n % 26) as u8);
    Bytes::from(v)
}

fn put(n: u64, len: usize) -> Txn {
    Txn {
        compares: Vec::new(),
        success: vec![Op::Put {
            key: key(n),
            value: value(n, len),
            lease: 0,
        }],
        failure: Vec::new(),
    }
}

/// What the client knows of a seed's writes.
#[derive(Default)]
struct History {
    /// Value length of every write issued, by key number.
    issued: BTreeMap<u64, usize>,
    /// Writes acknowledged.
    acknowledged: Vec<u64>,
}

impl History {
    /// Acknowledged ⊆ recovered ⊆ issued, and recovered is a prefix of
    /// issued.
    fn check(&self, seed: u64, life: usize, recovered: &BTreeMap<Bytes, Bytes>) {
        for &n in &self.acknowledged {
            assert!(
                recovered.get(&key(n)) == Some(&value(n, self.issued[&n])),
                "seed {seed}, life {life}: acknowledged write {n} lost"
            );
        }
        let mut prefix = true;
        for (&n, &len) in &self.issued {
            match recovered.get(&key(n)) {
                Some(v) => {
                    assert!(
                        prefix,
                        "seed {seed}, life {life}: write {n} recovered after a lost one"
                    );
                    assert_eq!(v, &value(n, len), "seed {seed}, life {life}: write {n}");
                }
                None => prefix = false,
            }
        }
        assert!(
            recovered.len() <= self.issued.len(),
            "seed {seed}, life {life}: a key never written was recovered"
        );
    }
}

/// One seeded run; panics on a broken invariant, naming the seed.
pub fn run(seed: u64) -> Outcome {
    let disk = SimDisk::new(seed);
    let mut rng = Rng::new(seed ^ 0x5707);
    let options = StoreOptions::default()
        .with_snapshot_threshold(16 << 10)
        .with_commit_delay(Duration::ZERO)
        .with_disk(Arc::new(disk.clone()))
        .with_clock(Arc::new(FrozenClock));
    let dir = Path::new(DIR);
    let mut history = History::default();
    let mut trace = TraceHash::default();
    let mut next = 0u64;
    let mut refused_after_failure = 0u64;
    let mut refused_as_corrupt = 0u64;
    let mut opens = FaultedOpens::default();
    for life in 0..=LIVES {
        if life > 0 && rng.chance(0.3) {
            refused_as_corrupt +=
                u64::from(atlas::damage_is_refused(seed, life, &disk, dir, &mut rng));
            trace.bytes(format!("corrupt {}", disk.counts().corruptions).as_bytes());
        }
        if rng.chance(0.25) {
            let fault = if rng.chance(0.5) {
                DiskFault::Eio
            } else {
                DiskFault::ReadCorruption
            };
            let at = (seed, life);
            open_under_fault(at, fault, &disk, &options, &history, &mut rng, &mut opens);
            trace.bytes(format!("open {fault:?} {}", opens.eio).as_bytes());
        }
        let (store, mut writer) = EmbeddedStore::open_stepped(dir, options.clone())
            .unwrap_or_else(|e| panic!("seed {seed}, life {life}: the store did not open: {e}"));
        let recovered = stepped_store::range(&store, b"k/");
        history.check(seed, life, &recovered);
        trace.bytes(format!("{life} {}", recovered.len()).as_bytes());
        // Forget what was lost for good: the next lives start after it.
        history
            .issued
            .retain(|n, _| recovered.contains_key(&key(*n)));
        history.acknowledged = history.issued.keys().copied().collect();
        if life == LIVES {
            break;
        }
        let fault = match rng.below(4) {
            0 => DiskFault::PowerLoss,
            1 => DiskFault::Eio,
            2 => DiskFault::NoSpace,
            _ => DiskFault::PowerLoss,
        };
        disk.arm(rng.range(0, 60), fault);
        let mut failed = false;
        for _ in 0..WRITES {
            let n = next;
            next += 1;
            // Now and then a record several blocks long.
            let len = if rng.chance(0.1) {
                rng.range(4096, 20_000) as usize
            } else {
                rng.range(1, 300) as usize
            };
            history.issued.insert(n, len);
            match stepped_store::commit(&store, &mut writer, put(n, len)) {
                Ok(_) => {
                    assert!(
                        !failed,
                        "seed {seed}, life {life}: write {n} acknowledged after the store failed"
                    );
                    history.acknowledged.push(n);
                    trace.bytes(&n.to_le_bytes());
                }
                Err(StoreError::Unavailable(_)) => {
                    if failed {
                        refused_after_failure += 1;
                    }
                    failed = true;
                }
                Err(other) => panic!("seed {seed}, life {life}: write {n}: {other:?}"),
            }
        }
        // Closed: the writer writes what is queued (nothing: each write
        // was waited for) and stops.
        drop(store);
        stepped_store::settle(&mut writer);
        drop(writer);
        if disk.is_dead() {
            disk.power_cycle();
        } else {
            disk.restart();
        }
    }
    let counts = disk.counts();
    Outcome {
        seed,
        trace: trace.value(),
        polls: counts.ops,
        simulated: Duration::ZERO,
        fired: vec![
            ("disk ops", counts.ops),
            ("power losses", counts.power_losses),
            ("torn writes", counts.torn_writes),
            ("names undone by a power loss", counts.undone_names),
            ("EIO injected", counts.eio),
            ("read errors injected", counts.read_errors),
            ("opens failed by an EIO", opens.eio),
            ("reads corrupted", counts.read_corruptions),
            (
                "opens failed as a file read back differently",
                opens.read_differently,
            ),
            ("ENOSPC injected", counts.no_space),
            ("writes refused after a failure", refused_after_failure),
            ("sector corruptions refused", refused_as_corrupt),
            (
                "of those, in the WAL's last write",
                counts.last_write_corruptions,
            ),
            ("writes acknowledged", history.acknowledged.len() as u64),
        ],
    }
}

/// What became of an open with a fault armed ([`open_under_fault`]).
#[derive(Default)]
struct FaultedOpens {
    /// Failed by an EIO.
    eio: u64,
    /// Failed because a file read back differently.
    read_differently: u64,
}

/// Opens the store with `fault` (an EIO or a read corruption) armed at
/// one of the open's ops. An EIO must fail the open with
/// [`OpenError::Io`] exactly when it fired (a read error is not
/// corruption, and no failure is swallowed). A changed byte may fail the
/// open, as an I/O error (the file read back differently), never as
/// corruption; if the store opens it holds every acknowledged write;
/// either way the disk is left as it was for the next open to recover
/// everything. Leaves the disk as a restarted process finds it.
fn open_under_fault(
    at: (u64, usize),
    fault: DiskFault,
    disk: &SimDisk,
    options: &StoreOptions,
    history: &History,
    rng: &mut Rng,
    opens: &mut FaultedOpens,
) {
    let (seed, life) = at;
    let before = disk.counts();
    disk.arm(rng.range(0, OPEN_OPS), fault);
    let opened = EmbeddedStore::open_stepped(Path::new(DIR), options.clone());
    let after = disk.counts();
    match fault {
        DiskFault::Eio => {
            let fired = after.eio > before.eio;
            let failed = match opened {
                // Dropped unstepped: the writer writes nothing, as in a crash.
                Ok(_) => false,
                Err(OpenError::Io { .. }) => true,
                Err(e) => panic!("seed {seed}, life {life}: an EIO made the open fail with: {e}"),
            };
            assert_eq!(
                failed, fired,
                "seed {seed}, life {life}: an EIO fired during the open: {fired}, the open failed: {failed}"
            );
            opens.eio += u64::from(failed);
        }
        _ => {
            let fired = after.read_corruptions > before.read_corruptions;
            match opened {
                Ok((store, _writer)) => {
                    history.check(seed, life, &stepped_store::range(&store, b"k/"))
                }
                Err(e) if !fired => {
                    panic!("seed {seed}, life {life}: the open failed with no fault: {e}")
                }
                Err(OpenError::Io { .. }) => opens.read_differently += 1,
                Err(e) => {
                    panic!("seed {seed}, life {life}: a misread made the open fail with: {e}")
                }
            }
        }
    }
    disk.restart();
}
