//! Latent sector corruption between two lives of the embedded store: the
//! simulated disk's fault atlas ([`SimDisk::corrupt`]) damages a byte of
//! the WAL or the snapshot only where it hurts what the store
//! acknowledged, so the right outcome is known: the store must refuse to
//! open, naming that file and an offset before the end of the damaged
//! sector. The byte is then put back, and the caller's next open must
//! recover everything as if nothing had happened.
//!
//! In the WAL's last batch the atlas damages only where no sector a torn
//! write lost could explain the change (see `Layout::Log`): a torn final
//! write is never acknowledged and is discarded, and where a sector of
//! the batch reads as zeros a store cannot tell the two apart (see
//! `metropolis-store`'s `wal_read`).

// What this module unwraps is the simulation's own.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::sync::Arc;

use metropolis_store::{EmbeddedStore, OpenError, StoreOptions};
use metropolis_testkit::disk::{Layout, SimDisk};

use crate::rng::Rng;
use crate::stepped_store::FrozenClock;

/// The store's files the atlas may damage, and how the store reads them.
const FILES: [(&str, Layout); 2] = [("wal", Layout::Log), ("snapshot", Layout::Whole)];

/// Lets the atlas corrupt the WAL or the snapshot of the store in `dir`,
/// checks that an open refuses naming the damage, and repairs it; false
/// if the atlas found nothing it may corrupt. Panics, naming `seed` and
/// `life`, if the store opened or refused for another reason.
pub fn damage_is_refused(
    seed: u64,
    life: usize,
    disk: &SimDisk,
    dir: &Path,
    rng: &mut Rng,
) -> bool {
    let (name, layout) = if rng.chance(0.7) { FILES[0] } else { FILES[1] };
    let Some(damage) = disk.corrupt(&dir.join(name), layout, rng.next_u64()) else {
        return false;
    };
    let options = StoreOptions::default()
        .with_disk(Arc::new(disk.clone()))
        .with_clock(Arc::new(FrozenClock));
    match EmbeddedStore::open_stepped(dir, options) {
        Err(OpenError::Corrupt { path, offset, .. })
            if path == damage.path && offset < damage.sector_end => {}
        Err(other) => panic!(
            "seed {seed}, life {life}: over {damage:?} the store refused with another error: {other}"
        ),
        Ok(_) => panic!("seed {seed}, life {life}: the store opened over {damage:?}"),
    }
    disk.repair(&damage);
    disk.restart();
    true
}
