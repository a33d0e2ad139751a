//! Writing a [`Layout`]'s GPT: protective MBR, primary header and array,
//! backup array and header, in the order the spec asks for.
//!
//! The tables are built by the `gpt` crate (headers, entries, both
//! CRC32s) and its protective MBR record, but not written by it onto the
//! device: its `GptDisk::write` writes the arrays, then the backup
//! header, then the primary header, without a sync in between, and never
//! the MBR. The crate writes instead into `Tables`, an in-memory
//! stand-in for the disk holding only the two table regions (it refuses
//! any write elsewhere, so nothing the crate does can slip past the
//! order below), which [`write()`] then copies onto the device: the backup
//! region, sync, then LBA 0 to the end of the primary array, sync. A
//! crash in between leaves either no valid GPT or a valid backup, never a
//! primary whose backup is missing.

use std::collections::BTreeMap;
use std::fmt;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;

use super::layout::Layout;

/// Why the GPT could not be written.
#[derive(Debug)]
#[non_exhaustive]
pub enum TableError {
    /// The `gpt` crate refused to build the tables (a bug: the layout
    /// was planned to fit).
    Build(String),
    /// Writing or syncing one of the two tables failed.
    Write {
        /// `"backup GPT"` or `"protective MBR and primary GPT"`.
        table: &'static str,
        /// The device's error.
        source: io::Error,
    },
}

impl fmt::Display for TableError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TableError::Build(reason) => write!(f, "cannot build the partition table: {reason}"),
            TableError::Write { table, source } => write!(f, "writing the {table}: {source}"),
        }
    }
}

impl std::error::Error for TableError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            TableError::Build(_) => None,
            TableError::Write { source, .. } => Some(source),
        }
    }
}

/// Where the tables go: a file or block device, or a test's recorder.
pub(crate) trait Device {
    /// Writes all of `buf` at `offset`.
    fn write_region(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Makes what was written durable.
    fn sync(&self) -> io::Result<()>;
}

impl Device for std::fs::File {
    fn write_region(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.write_all_at(buf, offset)
    }

    fn sync(&self) -> io::Result<()> {
        self.sync_data()
    }
}

/// Writes `layout`'s GPT onto `device` (the whole disk): the backup array
/// and header, `sync_data`, then the protective MBR, primary header and
/// array, `sync_data`. Nothing else on the device is touched; the old
/// table is never read.
pub fn write(device: &std::fs::File, layout: &Layout) -> Result<(), TableError> {
    write_to(device, layout)
}

pub(crate) fn write_to(device: &impl Device, layout: &Layout) -> Result<(), TableError> {
    let tables = Tables::build(layout)?;
    let backup = "backup GPT";
    device
        .write_region(&tables.tail, tables.tail_offset)
        .and_then(|()| device.sync())
        .map_err(|source| TableError::Write {
            table: backup,
            source,
        })?;
    let primary = "protective MBR and primary GPT";
    device
        .write_region(&tables.head, 0)
        .and_then(|()| device.sync())
        .map_err(|source| TableError::Write {
            table: primary,
            source,
        })
}

/// The two table regions of a disk, in memory, as `Read + Write + Seek`
/// for the `gpt` crate: `head` is LBA 0 up to the first usable LBA
/// (MBR, primary header, primary array), `tail` the backup array and
/// header at the end. Reads elsewhere give zeros; writes elsewhere fail.
#[derive(Debug)]
pub(crate) struct Tables {
    pub(crate) head: Vec<u8>,
    pub(crate) tail: Vec<u8>,
    pub(crate) tail_offset: u64,
    len: u64,
    pos: u64,
}

impl Tables {
    /// The tables of `layout`, built by the `gpt` crate, with the
    /// protective MBR in LBA 0.
    pub(crate) fn build(layout: &Layout) -> Result<Tables, TableError> {
        let block = u64::from(layout.block_size());
        let head_len = layout.first_usable_lba() * block;
        let tail_offset = (layout.last_usable_lba() + 1) * block;
        let len = layout.total_blocks() * block;
        let tables = Tables {
            head: vec![0; to_usize(head_len)?],
            tail: vec![0; to_usize(len - tail_offset)?],
            tail_offset,
            len,
            pos: 0,
        };
        let block_size = ::gpt::disk::LogicalBlockSize::try_from(block)
            .map_err(|e| TableError::Build(e.to_string()))?;
        let build = |e: ::gpt::GptError| TableError::Build(e.to_string());
        let mut disk = ::gpt::GptConfig::new()
            .writable(true)
            .logical_block_size(block_size)
            .create_from_device(tables, Some(layout.disk_guid()))
            .map_err(build)?;
        let entries: BTreeMap<u32, ::gpt::partition::Partition> = layout
            .partitions()
            .iter()
            .map(|p| {
                let entry = ::gpt::partition::Partition {
                    part_type_guid: ::gpt::partition_types::Type {
                        guid: p.type_guid,
                        os: ::gpt::partition_types::OperatingSystem::None,
                    },
                    part_guid: p.unique_guid,
                    first_lba: p.first_lba,
                    last_lba: p.last_lba,
                    flags: 0,
                    name: p.name.to_string(),
                };
                (p.number, entry)
            })
            .collect();
        disk.update_partitions(entries).map_err(build)?;
        let mut tables = disk.write().map_err(build)?;
        // One 0xEE record from LBA 1 over the disk, capped at 32 bits
        // (the spec's min(N, 2^32 - 1) - 1).
        let size = layout.total_blocks().min(u64::from(u32::MAX)) - 1;
        let mbr = ::gpt::mbr::ProtectiveMBR::with_lb_size(size as u32).to_bytes();
        tables.head[..mbr.len()].copy_from_slice(&mbr);
        Ok(tables)
    }

    /// The region holding `[pos, pos + n)` and the offset in it, if any.
    fn region(&mut self, n: usize) -> Option<(&mut Vec<u8>, usize)> {
        let end = self.pos.checked_add(n as u64)?;
        if end <= self.head.len() as u64 {
            Some((&mut self.head, self.pos as usize))
        } else if self.pos >= self.tail_offset && end <= self.len {
            Some((&mut self.tail, (self.pos - self.tail_offset) as usize))
        } else {
            None
        }
    }
}

fn to_usize(n: u64) -> Result<usize, TableError> {
    usize::try_from(n).map_err(|_| TableError::Build(format!("{n} bytes of tables")))
}

impl Read for Tables {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let head = self.head.len() as u64;
        let (limit, source) = if self.pos < head {
            (head, Some((&self.head, self.pos as usize)))
        } else if self.pos < self.tail_offset {
            (self.tail_offset, None)
        } else {
            let at = (self.pos - self.tail_offset) as usize;
            (self.len, Some((&self.tail, at)))
        };
        let n = buf.len().min(limit.saturating_sub(self.pos) as usize);
        if n == 0 {
            return Ok(0);
        }
        match source {
            Some((region, at)) => buf[..n].copy_from_slice(&region[at..at + n]),
            None => buf[..n].fill(0),
        }
        self.pos += n as u64;
        Ok(n)
    }
}

impl Write for Tables {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let pos = self.pos;
        let Some((region, at)) = self.region(buf.len()) else {
            return Err(io::Error::other(format!(
                "{} bytes at {pos} are outside the GPT regions",
                buf.len()
            )));
        };
        region[at..at + buf.len()].copy_from_slice(buf);
        self.pos += buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Seek for Tables {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let pos = match to {
            SeekFrom::Start(n) => Some(n),
            SeekFrom::End(d) => self.len.checked_add_signed(d),
            SeekFrom::Current(d) => self.pos.checked_add_signed(d),
        };
        self.pos = pos.ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
        Ok(self.pos)
    }
}
