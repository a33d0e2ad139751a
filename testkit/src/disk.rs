//! A simulated disk for the embedded store (`metropolis_store::Disk`): files
//! in memory, with what a power loss does to a real device.
//!
//! - A synchronous write (`SyncFile::write_at`, the WAL's `O_DSYNC` writes)
//!   is durable when it returns. One the crash interrupts keeps any subset
//!   of its 512-byte sectors; the others keep their old bytes.
//! - A file written and synced (`write_synced`) is durable when it returns;
//!   one the crash interrupts keeps any subset of its sectors.
//! - Creations, renames and removals are durable only once the directory
//!   is synced: a power loss before undoes them.
//! - Injected failures: any op fails with EIO and changes nothing (the
//!   process lives on, the disk too): writes, syncs, reads (a read error,
//!   as a bad sector gives), renames, removals, creations, locks. ENOSPC
//!   only where Linux gives it: writes and what makes a directory entry
//!   (creations, renames, `mkdir`); a sync armed with it fails with EIO.
//!   A fault armed at an op that cannot fail that way is spent and not
//!   counted.
//! - Read corruption: a read that returns wrong bytes (the disk keeps the
//!   right ones), as a failing cable, controller or memory does: one byte
//!   changed, up to the last non-zero one the read returns, or one sector
//!   that holds data returned as zeros.
//! - Latent sector corruption ([`SimDisk::corrupt`]): one byte of a file
//!   changed while the power was off, only where the fault atlas allows
//!   it: in a byte a finished write put there which no later write
//!   covered, and, in a log's last finished write, only where the change
//!   cannot read as sectors a torn write lost ([`Layout::Log`]). So a
//!   store must refuse to open over every corruption the atlas makes.
//!
//! Ops are counted; a test arms a fault at an op number
//! ([`SimDisk::arm`]), and after a crash every op fails until
//! [`SimDisk::power_cycle`] or [`SimDisk::restart`] brings the disk back.
//! Deterministic: a seeded generator picks the sectors a torn write keeps.
//! The simulator's storage world and the `store_open` fuzz harness run the
//! store over it.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use metropolis_store::disk::{Disk, LockGuard, SyncFile};

/// SplitMix64: which sectors a torn write keeps, which byte the atlas
/// corrupts.
#[derive(Debug)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn coin(&mut self) -> bool {
        self.next() & 1 == 1
    }
}

/// The sector size a torn write is torn at: the store's disk port's.
pub use metropolis_store::disk::SECTOR;

/// A fault armed at an op ([`SimDisk::arm`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DiskFault {
    /// Power is lost during the op: a write keeps a seeded subset of its
    /// sectors, and every later op fails until the disk is power-cycled.
    PowerLoss,
    /// The op (any) fails with EIO and changes nothing.
    Eio,
    /// The op (a write, a creation, a rename) fails with ENOSPC and changes
    /// nothing; a sync fails with EIO instead.
    NoSpace,
    /// The op, a read, returns one byte changed or a sector of zeros; the
    /// disk is unchanged.
    ReadCorruption,
}

/// What happened on the disk, for a campaign's counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DiskCounts {
    /// Ops carried out.
    pub ops: u64,
    /// Power losses.
    pub power_losses: u64,
    /// Power losses that interrupted a write (and kept part of it).
    pub torn_writes: u64,
    /// Renames, creations or removals a power loss undid.
    pub undone_names: u64,
    /// EIO failures injected (on any op).
    pub eio: u64,
    /// Of those, EIO failures of a read (a read error).
    pub read_errors: u64,
    /// ENOSPC failures injected.
    pub no_space: u64,
    /// Reads that returned a changed byte or a sector of zeros.
    pub read_corruptions: u64,
    /// Bytes corrupted by the fault atlas.
    pub corruptions: u64,
    /// Of those, bytes of a log's last finished write ([`Layout::Log`]).
    pub last_write_corruptions: u64,
}

/// One write of a file, for the fault atlas.
#[derive(Clone, Copy, Debug)]
struct Written {
    start: usize,
    end: usize,
    /// It returned (rather than being torn by a power loss).
    finished: bool,
    /// It wrote a byte other than zero.
    nonzero: bool,
}

#[derive(Debug, Default)]
struct Contents {
    /// What a read sees.
    current: Vec<u8>,
    /// What survives a power loss.
    durable: Vec<u8>,
    /// Every write since the file was created, in order.
    writes: Vec<Written>,
}

/// How a file is checked by what reads it, which decides where the fault
/// atlas may corrupt it ([`SimDisk::corrupt`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Appended by writes, the last of which may be torn (a WAL): only
    /// non-zero bytes of finished writes not covered by a later write. In
    /// the last finished write that wrote something other than zeros, only
    /// where the change cannot read as a torn write, which loses whole
    /// sectors: where no sector of that write, from its start to the end
    /// of the sector holding its last non-zero byte, is zeros but for the
    /// changed byte, and at least 16 bytes of that sector follow its last
    /// non-zero byte. This assumes what a WAL's reader relies on to tell a
    /// lost sector from a changed byte: each record starts with a non-zero
    /// byte (a magic) and ends at most 16 zero bytes after its last
    /// non-zero one.
    Log,
    /// Written once, whole, and checked whole (a snapshot): any byte.
    Whole,
}

/// A byte the fault atlas corrupted ([`SimDisk::corrupt`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Damage {
    /// The file.
    pub path: PathBuf,
    /// The byte's offset.
    pub offset: u64,
    /// The end of the 512-byte sector holding it: a reader that finds the
    /// damage names an offset before this.
    pub sector_end: u64,
    inode: u64,
    before: u8,
}

#[derive(Debug)]
struct State {
    /// Directory entries as a read sees them: path to inode.
    names: BTreeMap<PathBuf, u64>,
    /// Directory entries as of the last directory sync.
    durable_names: BTreeMap<PathBuf, u64>,
    inodes: BTreeMap<u64, Contents>,
    next_inode: u64,
    dirs: BTreeSet<PathBuf>,
    locked: BTreeSet<PathBuf>,
    ops: u64,
    armed: Option<(u64, DiskFault)>,
    /// Power is off: every op fails.
    dead: bool,
    rng: Rng,
    counts: DiskCounts,
}

/// The simulated disk; clones share it.
#[derive(Clone, Debug)]
pub struct SimDisk(Arc<Mutex<State>>);

fn eio() -> io::Error {
    io::Error::from_raw_os_error(5)
}

fn enospc() -> io::Error {
    io::Error::from_raw_os_error(28)
}

fn not_found(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("{}: no such file", path.display()),
    )
}

/// Writes `data` at `offset` of `into`, growing it with zeros, keeping only
/// the sectors `keep` says (by index within `data`).
fn put(into: &mut Vec<u8>, data: &[u8], offset: usize, keep: &mut dyn FnMut(usize) -> bool) {
    if into.len() < offset + data.len() {
        into.resize(offset + data.len(), 0);
    }
    for (i, chunk) in data.chunks(SECTOR).enumerate() {
        if keep(i) {
            let at = offset + i * SECTOR;
            into[at..at + chunk.len()].copy_from_slice(chunk);
        }
    }
}

impl SimDisk {
    /// An empty disk; `seed` picks the sectors torn writes keep.
    pub fn new(seed: u64) -> SimDisk {
        SimDisk(Arc::new(Mutex::new(State {
            names: BTreeMap::new(),
            durable_names: BTreeMap::new(),
            inodes: BTreeMap::new(),
            next_inode: 1,
            dirs: BTreeSet::new(),
            locked: BTreeSet::new(),
            ops: 0,
            armed: None,
            dead: false,
            rng: Rng(seed ^ 0xd15c),
            counts: DiskCounts::default(),
        })))
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Ops carried out so far.
    pub fn ops(&self) -> u64 {
        self.lock().ops
    }

    /// Arms `fault` at the op `after` ops from now (0: the next).
    pub fn arm(&self, after: u64, fault: DiskFault) {
        let mut s = self.lock();
        s.armed = Some((s.ops + after, fault));
    }

    /// Whether power was lost and not yet restored.
    pub fn is_dead(&self) -> bool {
        self.lock().dead
    }

    /// Power comes back after a loss (or the machine is reset): what was
    /// not durable is gone; locks are released; nothing is armed.
    pub fn power_cycle(&self) {
        let mut s = self.lock();
        let undone = s
            .names
            .iter()
            .filter(|(name, inode)| s.durable_names.get(*name) != Some(inode))
            .count()
            + s.durable_names
                .keys()
                .filter(|name| !s.names.contains_key(*name))
                .count();
        s.counts.undone_names += undone as u64;
        s.names = s.durable_names.clone();
        let live: BTreeSet<u64> = s.names.values().copied().collect();
        s.inodes.retain(|inode, _| live.contains(inode));
        for contents in s.inodes.values_mut() {
            contents.current = contents.durable.clone();
        }
        s.locked.clear();
        s.armed = None;
        s.dead = false;
    }

    /// The process restarts, the disk and its caches live on: only the
    /// locks are released and nothing is armed.
    pub fn restart(&self) {
        let mut s = self.lock();
        s.locked.clear();
        s.armed = None;
    }

    /// What happened so far.
    pub fn counts(&self) -> DiskCounts {
        self.lock().counts
    }

    /// Corrupts one byte of the file at `path`, read as `layout`, where the
    /// fault atlas allows it (see [`Layout`]), `pick` choosing which; none
    /// if the file has no such byte. The byte changes in what a read sees
    /// and in what survives; [`SimDisk::repair`] puts it back.
    pub fn corrupt(&self, path: &Path, layout: Layout, pick: u64) -> Option<Damage> {
        let mut s = self.lock();
        let inode = *s.names.get(path)?;
        let contents = s.inodes.get_mut(&inode)?;
        let mut rng = Rng(pick);
        let (offset, in_last) = match layout {
            Layout::Whole => {
                if contents.durable.is_empty() || contents.writes.iter().any(|w| !w.finished) {
                    return None;
                }
                ((rng.next() % contents.durable.len() as u64) as usize, false)
            }
            Layout::Log => log_byte(contents, &mut rng)?,
        };
        let before = contents.durable[offset];
        let after = before ^ ((rng.next() as u8) | 1);
        contents.durable[offset] = after;
        if let Some(b) = contents.current.get_mut(offset) {
            *b = after;
        }
        s.counts.corruptions += 1;
        s.counts.last_write_corruptions += u64::from(in_last);
        Some(Damage {
            path: path.to_path_buf(),
            offset: offset as u64,
            sector_end: (offset / SECTOR * SECTOR + SECTOR) as u64,
            inode,
            before,
        })
    }

    /// Undoes `damage`, if its file is still there.
    pub fn repair(&self, damage: &Damage) {
        let mut s = self.lock();
        if let Some(contents) = s.inodes.get_mut(&damage.inode) {
            let at = damage.offset as usize;
            for bytes in [&mut contents.durable, &mut contents.current] {
                if let Some(b) = bytes.get_mut(at) {
                    *b = damage.before;
                }
            }
        }
    }
}

/// A byte of a log the atlas may corrupt (see [`Layout::Log`]), and
/// whether it is in the last write: a few tries at a random byte of a
/// random eligible write.
fn log_byte(contents: &Contents, rng: &mut Rng) -> Option<(usize, bool)> {
    let last = contents
        .writes
        .iter()
        .rposition(|w| w.finished && w.nonzero)?;
    let eligible: Vec<usize> = (0..=last)
        .filter(|&i| contents.writes[i].finished && contents.writes[i].nonzero)
        .collect();
    for _ in 0..64 {
        let i = eligible[(rng.next() % eligible.len() as u64) as usize];
        let w = contents.writes[i];
        let offset = w.start + (rng.next() % (w.end - w.start) as u64) as usize;
        let covered_later = contents.writes[i + 1..]
            .iter()
            .any(|later| (later.start..later.end).contains(&offset));
        if !covered_later
            && contents.durable.get(offset).is_some_and(|&b| b != 0)
            && (i < last || no_sector_lost(&contents.durable, w, offset))
        {
            return Some((offset, i == last));
        }
    }
    None
}

/// Zero bytes a record of a log may end with, at most (see
/// [`Layout::Log`]).
const RECORD_TAIL_ZEROS: usize = 16;

/// Whether `w`, the last write of a log, reads as written to the end of
/// its records with any byte but the one at `offset`: no sector between
/// its start and the end of the sector holding its last non-zero byte is
/// zeros without that byte, and its records (ending at most
/// [`RECORD_TAIL_ZEROS`] zero bytes after that byte) end in that sector. Then a
/// change at `offset` cannot read as a sector the write lost.
fn no_sector_lost(durable: &[u8], w: Written, offset: usize) -> bool {
    let end = w.end.min(durable.len());
    let Some(last) = durable[w.start..end].iter().rposition(|&b| b != 0) else {
        return false;
    };
    let last = w.start + last;
    if last % SECTOR + RECORD_TAIL_ZEROS >= SECTOR {
        return false;
    }
    (w.start / SECTOR..=last / SECTOR).all(|sector| {
        let from = (sector * SECTOR).max(w.start);
        let to = ((sector + 1) * SECTOR).min(durable.len());
        (from..to).any(|i| i != offset && durable[i] != 0)
    })
}

impl State {
    /// Counts an op; the fault armed at it, if any. Fails if power is off.
    /// A power loss is counted here; EIO and ENOSPC where they fail an op
    /// ([`State::failed`]).
    fn op(&mut self) -> io::Result<Option<DiskFault>> {
        if self.dead {
            return Err(eio());
        }
        let this = self.ops;
        self.ops += 1;
        self.counts.ops += 1;
        match self.armed {
            Some((at, fault)) if at == this => {
                self.armed = None;
                if fault == DiskFault::PowerLoss {
                    self.dead = true;
                    self.counts.power_losses += 1;
                }
                Ok(Some(fault))
            }
            _ => Ok(None),
        }
    }

    /// The error an injected EIO or ENOSPC fails an op with, counted.
    fn failed(&mut self, fault: DiskFault) -> io::Error {
        match fault {
            DiskFault::NoSpace => {
                self.counts.no_space += 1;
                enospc()
            }
            DiskFault::Eio | DiskFault::PowerLoss | DiskFault::ReadCorruption => {
                self.counts.eio += u64::from(fault == DiskFault::Eio);
                eio()
            }
        }
    }

    /// A write of `data` at `offset` to `inode`, durable at return: whole,
    /// failed, or torn by a power loss.
    fn write(&mut self, inode: u64, data: &[u8], offset: usize) -> io::Result<()> {
        let fault = self.op()?.filter(|f| *f != DiskFault::ReadCorruption);
        let State {
            inodes,
            rng,
            counts,
            ..
        } = self;
        let Some(contents) = inodes.get_mut(&inode) else {
            return Err(eio());
        };
        let mut written = Written {
            start: offset,
            end: offset + data.len(),
            finished: true,
            nonzero: data.iter().any(|&b| b != 0),
        };
        match fault {
            None => {
                put(&mut contents.current, data, offset, &mut |_| true);
                put(&mut contents.durable, data, offset, &mut |_| true);
                if !data.is_empty() {
                    contents.writes.push(written);
                }
                Ok(())
            }
            Some(DiskFault::PowerLoss) => {
                counts.torn_writes += 1;
                put(&mut contents.durable, data, offset, &mut |_| rng.coin());
                written.finished = false;
                contents.writes.push(written);
                Err(eio())
            }
            Some(fault) => Err(self.failed(fault)),
        }
    }

    /// A sync of a file or directory: fails, or does what `then` does.
    fn sync(&mut self, then: impl FnOnce(&mut State)) -> io::Result<()> {
        match self.op()?.filter(|f| *f != DiskFault::ReadCorruption) {
            None => {
                then(self);
                Ok(())
            }
            // A sync here knows no ENOSPC: every failure is EIO.
            Some(DiskFault::NoSpace) => Err(self.failed(DiskFault::Eio)),
            Some(fault) => Err(self.failed(fault)),
        }
    }

    /// An op that reads or changes names, of `kind`: fails by power loss,
    /// by EIO, and by ENOSPC if it makes a directory entry.
    fn plain(&mut self, kind: OpKind) -> io::Result<()> {
        self.read_op(kind).map(|_| ())
    }

    /// [`plain`](Self::plain), and whether the bytes a read returns are to
    /// be corrupted ([`State::corrupt_read`]).
    fn read_op(&mut self, kind: OpKind) -> io::Result<bool> {
        match self.op()? {
            None => Ok(false),
            Some(DiskFault::ReadCorruption) => Ok(kind == OpKind::Read),
            Some(DiskFault::NoSpace) if kind != OpKind::Entry => Ok(false),
            Some(fault) => {
                if kind == OpKind::Read && fault == DiskFault::Eio {
                    self.counts.read_errors += 1;
                }
                Err(self.failed(fault))
            }
        }
    }

    /// Misreads `bytes`, a read's result from file offset `offset`: half
    /// the time one byte up to the last non-zero one changes, half the
    /// time a sector (aligned in the file, clipped to `bytes`) that holds a
    /// non-zero byte reads as zeros, as a sector lost in transfer would.
    /// Nothing changes if `bytes` is all zeros.
    fn corrupt_read(&mut self, bytes: &mut [u8], offset: usize) {
        let Some(last) = bytes.iter().rposition(|&b| b != 0) else {
            return;
        };
        let at = (self.rng.next() % (last as u64 + 1)) as usize;
        if self.rng.coin() {
            // The sector of `at`, or (if that one is zeros) of `last`.
            let len = bytes.len();
            let mut sector = sector_of(at, offset, len);
            if bytes[sector.clone()].iter().all(|&b| b == 0) {
                sector = sector_of(last, offset, len);
            }
            bytes[sector].fill(0);
        } else {
            bytes[at] ^= (self.rng.next() as u8) | 1;
        }
        self.counts.read_corruptions += 1;
    }

    fn new_inode(&mut self, path: &Path) -> u64 {
        let inode = self.next_inode;
        self.next_inode += 1;
        self.inodes.insert(inode, Contents::default());
        self.names.insert(path.to_path_buf(), inode);
        inode
    }
}

/// What an op that is neither a write nor a sync does, for the faults it
/// can fail with ([`State::plain`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OpKind {
    /// Reads a file's bytes or size.
    Read,
    /// May make a directory entry (a creation, a rename, `mkdir`).
    Entry,
    /// Anything else (a removal, opening an existing file).
    Other,
}

/// A held lock of a [`SimDisk`].
#[derive(Debug)]
struct SimLock(SimDisk, PathBuf);

impl LockGuard for SimLock {}

impl Drop for SimLock {
    fn drop(&mut self) {
        self.0.lock().locked.remove(&self.1);
    }
}

/// A file of a [`SimDisk`] open for synchronous writes.
#[derive(Debug)]
struct SimFile {
    disk: SimDisk,
    inode: u64,
    direct: bool,
}

/// The range, within a buffer of `len` bytes read from file offset
/// `offset`, of the file's sector that holds the buffer's byte `at`.
fn sector_of(at: usize, offset: usize, len: usize) -> std::ops::Range<usize> {
    let start = (offset + at) / SECTOR * SECTOR;
    start.saturating_sub(offset)..(start + SECTOR - offset).min(len)
}

impl SyncFile for SimFile {
    fn write_at(&mut self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.disk.lock().write(self.inode, buf, offset as usize)
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let mut s = self.disk.lock();
        let corrupt = s.read_op(OpKind::Read)?;
        let contents = s.inodes.get(&self.inode).ok_or_else(eio)?;
        let at = offset as usize;
        let bytes = contents
            .current
            .get(at..at + buf.len())
            .ok_or_else(|| io::Error::from(io::ErrorKind::UnexpectedEof))?;
        buf.copy_from_slice(bytes);
        if corrupt {
            s.corrupt_read(buf, at);
        }
        Ok(())
    }

    fn size(&self) -> io::Result<u64> {
        let mut s = self.disk.lock();
        s.plain(OpKind::Read)?;
        Ok(s.inodes.get(&self.inode).ok_or_else(eio)?.current.len() as u64)
    }

    fn sync(&self) -> io::Result<()> {
        let inode = self.inode;
        self.disk.lock().sync(|s| {
            if let Some(c) = s.inodes.get_mut(&inode) {
                c.durable = c.current.clone();
            }
        })
    }

    fn is_direct(&self) -> bool {
        self.direct
    }
}

impl Disk for SimDisk {
    fn create_dir(&self, dir: &Path) -> io::Result<()> {
        let mut s = self.lock();
        s.plain(OpKind::Entry)?;
        s.dirs.insert(dir.to_path_buf());
        Ok(())
    }

    fn lock(&self, path: &Path) -> io::Result<Option<Box<dyn LockGuard>>> {
        let mut s = SimDisk::lock(self);
        let exists = s.names.contains_key(path);
        s.plain(if exists { OpKind::Other } else { OpKind::Entry })?;
        if !exists {
            s.new_inode(path);
        }
        if !s.locked.insert(path.to_path_buf()) {
            return Ok(None);
        }
        Ok(Some(Box::new(SimLock(self.clone(), path.to_path_buf()))))
    }

    fn read(&self, path: &Path) -> io::Result<Option<Vec<u8>>> {
        let mut s = SimDisk::lock(self);
        let corrupt = s.read_op(OpKind::Read)?;
        let mut bytes = s
            .names
            .get(path)
            .and_then(|inode| s.inodes.get(inode))
            .map(|c| c.current.clone());
        if let Some(bytes) = bytes.as_mut().filter(|_| corrupt) {
            s.corrupt_read(bytes, 0);
        }
        Ok(bytes)
    }

    fn write_synced(&self, path: &Path, parts: &[&[u8]]) -> io::Result<()> {
        let mut s = SimDisk::lock(self);
        let data: Vec<u8> = parts.concat();
        let inode = s.new_inode(path);
        s.write(inode, &data, 0)?;
        Ok(())
    }

    fn open_synchronous(
        &self,
        path: &Path,
        create: bool,
        direct: bool,
    ) -> io::Result<Box<dyn SyncFile>> {
        let mut s = SimDisk::lock(self);
        s.plain(if create { OpKind::Entry } else { OpKind::Other })?;
        let inode = match s.names.get(path) {
            Some(&inode) if !create => inode,
            None if !create => return Err(not_found(path)),
            _ => s.new_inode(path),
        };
        Ok(Box::new(SimFile {
            disk: self.clone(),
            inode,
            direct,
        }))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut s = SimDisk::lock(self);
        s.plain(OpKind::Entry)?;
        let inode = s.names.remove(from).ok_or_else(|| not_found(from))?;
        s.names.insert(to.to_path_buf(), inode);
        Ok(())
    }

    fn remove(&self, path: &Path) -> io::Result<bool> {
        let mut s = SimDisk::lock(self);
        s.plain(OpKind::Other)?;
        Ok(s.names.remove(path).is_some())
    }

    fn sync_dir(&self, _dir: &Path) -> io::Result<()> {
        // One directory holds every file of the store.
        self.lock().sync(|s| s.durable_names = s.names.clone())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_power_loss_undoes_what_was_not_synced_and_tears_the_write_in_flight() {
        let disk = SimDisk::new(1);
        let (a, b) = (Path::new("/d/a"), Path::new("/d/b"));
        let mut f = disk.open_synchronous(a, true, true).unwrap();
        f.write_at(&[1; 4 * SECTOR], 0).unwrap();
        // The creation is not durable yet.
        disk.sync_dir(Path::new("/d")).unwrap();
        disk.write_synced(b, &[b"new"]).unwrap();
        disk.arm(0, DiskFault::PowerLoss);
        assert!(f.write_at(&[2; 4 * SECTOR], 0).is_err());
        assert!(disk.is_dead());
        assert!(disk.read(a).is_err(), "no op while the power is off");
        disk.power_cycle();
        assert_eq!(disk.read(b).unwrap(), None, "b's name was never synced");
        let after = disk.read(a).unwrap().unwrap();
        assert_eq!(after.len(), 4 * SECTOR);
        for sector in after.chunks(SECTOR) {
            assert!(sector.iter().all(|&x| x == 1) || sector.iter().all(|&x| x == 2));
        }
        let counts = disk.counts();
        assert_eq!(
            (counts.power_losses, counts.torn_writes, counts.undone_names),
            (1, 1, 1)
        );
    }

    #[test]
    fn the_atlas_corrupts_a_log_where_no_torn_write_explains_it_and_repairs() {
        let disk = SimDisk::new(3);
        let (log, whole) = (Path::new("/d/log"), Path::new("/d/whole"));
        let mut f = disk.open_synchronous(log, true, true).unwrap();
        disk.sync_dir(Path::new("/d")).unwrap();
        assert_eq!(disk.corrupt(log, Layout::Log, 1), None, "nothing written");
        f.write_at(&[7; 2 * SECTOR], 0).unwrap();
        assert_eq!(
            disk.corrupt(log, Layout::Log, 1),
            None,
            "one write, whose records may end in a next sector it lost"
        );
        // Zeros (preallocation) are not a later write that makes the first
        // one safe to damage.
        f.write_at(&[0; 4 * SECTOR], 2 * SECTOR as u64).unwrap();
        assert_eq!(disk.corrupt(log, Layout::Log, 1), None);
        // A later write covering the first one's second sector.
        f.write_at(&[9; 2 * SECTOR], SECTOR as u64).unwrap();
        for pick in 0..200 {
            let damage = disk.corrupt(log, Layout::Log, pick).unwrap();
            assert!(damage.offset < SECTOR as u64, "{damage:?}");
            assert_eq!(damage.sector_end, SECTOR as u64);
            let bytes = disk.read(log).unwrap().unwrap();
            assert_ne!(bytes[damage.offset as usize], 7);
            disk.power_cycle();
            assert_ne!(disk.read(log).unwrap().unwrap()[damage.offset as usize], 7);
            disk.repair(&damage);
            assert_eq!(
                disk.read(log).unwrap().unwrap(),
                bytes_before(&bytes, &damage)
            );
        }
        disk.write_synced(whole, &[b"snapshot"]).unwrap();
        let damage = disk.corrupt(whole, Layout::Whole, 5).unwrap();
        assert!(damage.offset < 8);
        assert_ne!(disk.read(whole).unwrap().unwrap(), b"snapshot");
        disk.repair(&damage);
        assert_eq!(disk.read(whole).unwrap().unwrap(), b"snapshot");
        assert_eq!(disk.counts().corruptions, 201);
    }

    #[test]
    fn the_atlas_corrupts_a_logs_last_write_only_where_no_lost_sector_explains_it() {
        let disk = SimDisk::new(4);
        let log = Path::new("/d/log");
        let mut f = disk.open_synchronous(log, true, true).unwrap();
        f.write_at(&[7; 100], 0).unwrap();
        // Damage after the first write lands in `range`, never outside
        // it; the offsets it hit there.
        let hits = |range: std::ops::Range<u64>| {
            let mut later = Vec::new();
            for pick in 0..300 {
                let damage = disk.corrupt(log, Layout::Log, pick).unwrap();
                let at = damage.offset;
                assert!(at < 100 || range.contains(&at), "{damage:?}");
                if at >= 100 {
                    later.push(at);
                }
                disk.repair(&damage);
            }
            later
        };
        // Sector 1 holds data, sector 2 only byte 1412: a change there
        // leaves sector 2 zeros, which a torn write can make.
        let mut w = vec![0; 2 * SECTOR];
        w[..300].fill(9);
        w[1412 - SECTOR] = 9;
        f.write_at(&w, SECTOR as u64).unwrap();
        assert!(hits(512..812).len() > 50);
        // A last write with a sector of zeros between its data: not there,
        // and the one before is no longer the last.
        let mut w2 = vec![0; 3 * SECTOR];
        w2[..10].fill(5);
        w2[1110..1120].fill(5);
        f.write_at(&w2, 3 * SECTOR as u64).unwrap();
        assert!(hits(512..1413).len() > 50);
        // A last write whose data ends within 16 bytes of a sector's end
        // (its records may end in the next sector, which a torn write can
        // lose): bytes 3088..3584, the last non-zero one the sector's last.
        f.write_at(&[6; SECTOR - 16], 6 * SECTOR as u64 + 16)
            .unwrap();
        assert!(hits(512..3072).len() > 50);
        // Bytes 3600..4080: the last non-zero one is 4079, and 16 follow it
        // in its sector.
        f.write_at(&[6; 480], 7 * SECTOR as u64 + 16).unwrap();
        assert!(hits(512..4080).iter().any(|at| *at >= 3600));
        // Bytes 4112..4593: 15 follow the last one.
        f.write_at(&[6; 481], 8 * SECTOR as u64 + 16).unwrap();
        assert!(!hits(512..4080).is_empty());
    }

    fn bytes_before(after: &[u8], damage: &Damage) -> Vec<u8> {
        let mut bytes = after.to_vec();
        bytes[damage.offset as usize] = damage.before;
        bytes
    }

    #[test]
    fn an_injected_failure_changes_nothing_and_the_disk_goes_on() {
        let disk = SimDisk::new(2);
        let a = Path::new("/d/a");
        let mut f = disk.open_synchronous(a, true, false).unwrap();
        f.write_at(b"abc", 0).unwrap();
        disk.arm(0, DiskFault::NoSpace);
        let e = f.write_at(b"xyz", 3).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(28));
        f.write_at(b"d", 3).unwrap();
        assert_eq!(disk.read(a).unwrap().unwrap(), b"abcd");
        // Renames are undone by a power loss unless the directory was synced.
        disk.sync_dir(Path::new("/d")).unwrap();
        disk.rename(a, Path::new("/d/b")).unwrap();
        disk.power_cycle();
        assert_eq!(disk.read(a).unwrap().unwrap(), b"abcd");
        assert_eq!(disk.read(Path::new("/d/b")).unwrap(), None);
    }

    #[test]
    fn reads_and_names_fail_with_what_linux_gives() {
        let disk = SimDisk::new(4);
        let (a, b) = (Path::new("/d/a"), Path::new("/d/b"));
        disk.write_synced(a, &[b"abc"]).unwrap();
        disk.arm(0, DiskFault::Eio);
        assert_eq!(disk.read(a).unwrap_err().raw_os_error(), Some(5));
        assert_eq!(
            disk.read(a).unwrap().unwrap(),
            b"abc",
            "a read error is spent"
        );
        let f = disk.open_synchronous(a, false, false).unwrap();
        disk.arm(0, DiskFault::Eio);
        assert!(f.read_at(&mut [0; 2], 1).is_err());
        // ENOSPC on a read is not a thing: spent, not counted.
        disk.arm(0, DiskFault::NoSpace);
        let mut buf = [0; 2];
        f.read_at(&mut buf, 1).unwrap();
        assert_eq!(&buf, b"bc");
        disk.arm(0, DiskFault::NoSpace);
        assert_eq!(disk.rename(a, b).unwrap_err().raw_os_error(), Some(28));
        disk.arm(0, DiskFault::Eio);
        assert!(disk.remove(a).is_err());
        assert_eq!(disk.read(a).unwrap().unwrap(), b"abc", "nothing changed");
        assert_eq!(disk.read(b).unwrap(), None);
        disk.arm(0, DiskFault::NoSpace);
        assert_eq!(f.sync().unwrap_err().raw_os_error(), Some(5));
        let counts = disk.counts();
        assert_eq!((counts.eio, counts.read_errors, counts.no_space), (4, 2, 1));
    }

    #[test]
    fn a_corrupted_read_changes_a_byte_or_zeroes_a_sector_of_data_and_not_the_disk() {
        let disk = SimDisk::new(5);
        let a = Path::new("/d/a");
        // Data in sectors 0 and 2 (bytes 0..6 and 1100..1110), zeros after.
        let mut data = vec![0; 2000];
        data[..6].copy_from_slice(b"abcdef");
        data[1100..1110].fill(7);
        disk.write_synced(a, &[&data]).unwrap();
        let (mut flips, mut zeroed) = (0, [0; 4]);
        for _ in 0..200 {
            disk.arm(0, DiskFault::ReadCorruption);
            let read = disk.read(a).unwrap().unwrap();
            let changed: Vec<usize> = (0..data.len()).filter(|&i| read[i] != data[i]).collect();
            assert!(!changed.is_empty());
            if changed.len() == 1 {
                assert!(changed[0] < 1110, "only up to the data's end: {changed:?}");
                flips += 1;
            } else {
                let sector = changed[0] / SECTOR;
                assert!(
                    sector == 0 || sector == 2,
                    "a sector with data: {changed:?}"
                );
                let range = sector * SECTOR..(sector + 1) * SECTOR;
                assert!(read[range].iter().all(|&b| b == 0), "{changed:?}");
                zeroed[sector] += 1;
            }
            assert_eq!(
                disk.read(a).unwrap().unwrap(),
                data,
                "the disk is unchanged"
            );
        }
        assert!(
            flips > 50 && zeroed[0] > 20 && zeroed[2] > 20,
            "{flips} {zeroed:?}"
        );
        // A read at an offset zeroes a sector aligned in the file: of
        // bytes 1000..1400, 1000..1024 or 1024..1400, never both.
        let b = Path::new("/d/b");
        let mut data = vec![0; 2000];
        data[1010..1015].fill(9);
        data[1100..1110].fill(7);
        disk.write_synced(b, &[&data]).unwrap();
        let f = disk.open_synchronous(b, false, false).unwrap();
        let mut buf = [0; 400];
        let mut zeroed = [0; 2];
        for _ in 0..100 {
            disk.arm(0, DiskFault::ReadCorruption);
            f.read_at(&mut buf, 1000).unwrap();
            let expect = &data[1000..1400];
            let changed: Vec<usize> = (0..400).filter(|&i| buf[i] != expect[i]).collect();
            match changed.len() {
                1 => {}
                5 => {
                    assert_eq!(changed, (10..15).collect::<Vec<_>>());
                    zeroed[0] += 1;
                }
                _ => {
                    assert_eq!(changed, (100..110).collect::<Vec<_>>());
                    zeroed[1] += 1;
                }
            }
        }
        assert!(zeroed[0] > 5 && zeroed[1] > 5, "{zeroed:?}");
        // At a write it is spent.
        let mut f = disk.open_synchronous(a, false, false).unwrap();
        disk.arm(0, DiskFault::ReadCorruption);
        f.write_at(b"x", 0).unwrap();
        let mut buf = [0; 2];
        disk.arm(0, DiskFault::ReadCorruption);
        f.read_at(&mut buf, 0).unwrap();
        assert_ne!(&buf, b"xb");
        assert_eq!(disk.counts().read_corruptions, 301);
    }
}
