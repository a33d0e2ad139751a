//! Reading and checking a WAL file at open: where the acknowledged log
//! ends, and whether what follows is a torn final write or damage.
//!
//! # Torn write or damage (version 2)
//!
//! Batches are written one at a time, each acknowledged only after its
//! synchronous write returned, into a file preallocated with zeros. So a
//! crash can leave at most the last batch incomplete, and in any pattern:
//! a direct write of several blocks may persist any subset of them (its
//! header's block missing and a later one present, or the reverse). The
//! reader therefore checks batch after batch; at the first batch that does
//! not check out, it looks at everything after it:
//!
//! - only zeros: the clean end of the log;
//! - what a torn final batch can look like: a torn write keeps or loses
//!   each 512-byte sector whole, and a lost one reads as it was before,
//!   zeros past the end of the log. So where the batch does not check out
//!   (its header, or, under a header that checks out, its frames) some
//!   sector reads as zeros from the batch's start on, and nothing follows
//!   it: no byte after the extent a sound header declares, and no batch
//!   that checks out (batch magic, header checksum, frames within the
//!   file, frames checksum) after a header that does not. Never
//!   acknowledged, it is reported in [`WalContents::torn_len`] for the
//!   opener to zero;
//! - anything else is damage to an acknowledged batch (a batch written
//!   after it, or a byte changed where no sector was lost): the open fails
//!   naming the offset. Under a sound header the frames are walked, and
//!   each frame that fails its own checksum must overlap a lost sector. So
//!   damage to the last batch is found too, unless it is in a record
//!   whose data holds a whole sector of zeros, which a lost sector could
//!   explain.
//!
//! The frames of a torn batch under a sound header (user data) are never
//! searched for a batch. Inside a batch whose checksum matches, any frame
//! that does not check out is damage.
//!
//! Version 1 files (frames without batches) keep their rules: a final
//! frame cut short or a zero-filled tail is torn, anything else damage.

use std::path::Path;

use metropolis_core::store::{Record, decode_record};

use super::crc::crc32c;
use super::disk::SECTOR;
use super::error::{Corruption, OpenError};
use super::wal::{
    BATCH_HEADER_LEN, BATCH_MAGIC, FORMAT_VERSION, FORMAT_VERSION_1, FRAME_HEADER_LEN, HEADER_LEN,
    MAGIC, MAX_BATCH_LEN, MAX_RECORD_LEN,
};

/// What [`read`] found in a WAL file.
#[derive(Debug)]
pub(crate) struct WalContents {
    /// The file's format version.
    pub(crate) version: u32,
    /// Sequence number of the first record.
    pub(crate) first_seq: u64,
    /// The records, with the byte offset of their frame.
    pub(crate) records: Vec<(u64, Record)>,
    /// Bytes of header and whole, valid frames (or batches).
    pub(crate) valid_len: u64,
    /// Bytes after them up to the last non-zero byte: a torn final write.
    pub(crate) torn_len: u64,
}

/// A problem at a byte offset.
type Damage = (u64, Corruption);

/// Checks the whole WAL file `data`, read from `path`. A torn final write
/// is reported in `torn_len`; any other damage is an error naming the
/// offset.
pub(crate) fn read(path: &Path, data: &[u8]) -> Result<WalContents, OpenError> {
    parse(data).map_err(|(offset, problem)| OpenError::Corrupt {
        path: path.to_path_buf(),
        offset,
        problem,
    })
}

/// [`read`] on the file's bytes.
fn parse(data: &[u8]) -> Result<WalContents, Damage> {
    let (version, first_seq) = parse_header(data)?;
    let mut records = Vec::new();
    let valid_len = if version == FORMAT_VERSION_1 {
        parse_v1(data, &mut records)?
    } else {
        parse_v2(data, &mut records)?
    };
    let dirty_end = data.iter().rposition(|b| *b != 0).map_or(0, |p| p + 1);
    Ok(WalContents {
        version,
        first_seq,
        records,
        valid_len: valid_len as u64,
        torn_len: dirty_end.saturating_sub(valid_len) as u64,
    })
}

fn u32_at(data: &[u8], pos: usize) -> u32 {
    u32::from_le_bytes([data[pos], data[pos + 1], data[pos + 2], data[pos + 3]])
}

/// Checks the header; returns the format version and the first record's
/// sequence number.
fn parse_header(data: &[u8]) -> Result<(u32, u64), Damage> {
    if data.len() < HEADER_LEN as usize {
        // A header is written whole to a temporary file before the WAL
        // exists under its name, so a short one is damage.
        if !MAGIC.starts_with(&data[..data.len().min(8)]) {
            return Err((0, Corruption::BadMagic));
        }
        return Err((0, Corruption::ShortHeader));
    }
    if data[..8] != MAGIC {
        return Err((0, Corruption::BadMagic));
    }
    let version = u32_at(data, 8);
    if version != FORMAT_VERSION && version != FORMAT_VERSION_1 {
        return Err((
            8,
            Corruption::UnsupportedVersion {
                found: version,
                supported: FORMAT_VERSION,
            },
        ));
    }
    let stored = u32_at(data, 20);
    let computed = crc32c(&data[..20]);
    if stored != computed {
        return Err((20, Corruption::ChecksumMismatch { stored, computed }));
    }
    let mut seq = [0u8; 8];
    seq.copy_from_slice(&data[12..20]);
    Ok((version, u64::from_le_bytes(seq)))
}

/// Version 2: batches. Returns the length of the valid log.
fn parse_v2(data: &[u8], records: &mut Vec<(u64, Record)>) -> Result<usize, Damage> {
    let mut pos = HEADER_LEN as usize;
    loop {
        match check_batch(data, pos) {
            Ok(end) => {
                parse_frames(data, pos + BATCH_HEADER_LEN, end, records)?;
                pos = end;
            }
            Err((extent, problem)) => {
                if data[pos..].iter().all(|b| *b == 0)
                    || can_be_torn(data, pos, extent, &problem)
                    || canary_planted!(DamageReadAsTorn)
                {
                    return Ok(pos);
                }
                return Err((pos as u64, problem));
            }
        }
    }
}

/// Whether what starts at `pos`, a batch that did not check out for
/// `problem` (`extent`: where it ends, if its header checked out), can be
/// a final write torn by a crash rather than damage.
///
/// A torn write kept each of its sectors or left it as it was: past the
/// end of the log that is zeros (the file is preallocated with them), and
/// in the sector holding `pos` the earlier bytes are the same either way.
/// So it lost a sector that reads as zeros from `pos` on, somewhere in the
/// part that does not check out; and nothing after the batch was written.
fn can_be_torn(data: &[u8], pos: usize, extent: Option<usize>, problem: &Corruption) -> bool {
    match (extent, problem) {
        // The header checks out, the frames do not.
        (Some(end), _) => {
            torn_frames(data, pos, end)
                && data
                    .get(end..)
                    .is_none_or(|rest| rest.iter().all(|b| *b == 0))
        }
        // A header whose own checksum does not match.
        (None, Corruption::BadBatchHeader) => {
            LostSectors::new(data, pos, pos + BATCH_HEADER_LEN).any(pos, pos + BATCH_HEADER_LEN)
                && find_batch(data, pos + 1).is_none()
        }
        // A sound header whose batch runs past the end of the file (or a
        // file that ends inside a header): cut short, unless a whole batch
        // follows.
        (None, _) => find_batch(data, pos + 1).is_none(),
    }
}

/// Whether the frames of the batch at `pos`, whose header checks out and
/// whose frames `[pos + BATCH_HEADER_LEN, end)` do not, are what a torn
/// write leaves: some frame fails, and every one that fails overlaps a
/// lost sector ([`LostSectors`]). Frames are walked by their lengths while
/// no frame header lies in a lost sector (a header outside one is as
/// written, so its length is); one inside one ends the walk, explained.
/// So a zero sector inside one record does not hide a changed byte in
/// another.
fn torn_frames(data: &[u8], pos: usize, end: usize) -> bool {
    let lost = LostSectors::new(data, pos, end);
    let mut frame = pos + BATCH_HEADER_LEN;
    let mut failed = false;
    while frame < end {
        if lost.any(frame, (frame + FRAME_HEADER_LEN).min(end)) {
            return true;
        }
        if end - frame < FRAME_HEADER_LEN {
            return false;
        }
        let len = u32_at(data, frame) as usize;
        let payload = frame + FRAME_HEADER_LEN;
        if len == 0 || len > MAX_RECORD_LEN || len > end - payload {
            return false;
        }
        if !payload_checks_out(data, frame, len) {
            if !lost.any(payload, payload + len) {
                return false;
            }
            failed = true;
        }
        frame = payload + len;
    }
    failed
}

/// The sectors a write starting at `pos` may have lost, up to `to`: those
/// that read as zeros from `pos` (or their start) to their end (or the
/// file's). Each sector is looked at once.
struct LostSectors {
    /// The sector holding `pos`.
    first: usize,
    /// From `first` on, whether each is lost.
    lost: Vec<bool>,
}

impl LostSectors {
    fn new(data: &[u8], pos: usize, to: usize) -> Self {
        let first = pos / SECTOR;
        let lost = (first..to.min(data.len()).div_ceil(SECTOR))
            .map(|sector| {
                let start = (sector * SECTOR).max(pos);
                let end = ((sector + 1) * SECTOR).min(data.len());
                data[start..end].iter().all(|b| *b == 0)
            })
            .collect();
        LostSectors { first, lost }
    }

    /// Whether one of the sectors overlapping `[from, to)` (at or after
    /// `pos`) is lost.
    fn any(&self, from: usize, to: usize) -> bool {
        let from = from / SECTOR - self.first;
        let to = (to.div_ceil(SECTOR) - self.first).min(self.lost.len());
        self.lost
            .get(from..to)
            .is_some_and(|sectors| sectors.contains(&true))
    }
}

/// Checks the batch at `pos`: returns where it ends, or what is wrong with
/// it and, if its header checks out, where it would end.
fn check_batch(data: &[u8], pos: usize) -> Result<usize, (Option<usize>, Corruption)> {
    let rest = &data[pos..];
    if rest.len() < BATCH_HEADER_LEN {
        return Err((
            None,
            Corruption::BadLength {
                declared: BATCH_HEADER_LEN as u64,
                present: rest.len() as u64,
            },
        ));
    }
    if rest[..4] != BATCH_MAGIC {
        return Err((None, Corruption::BadBatchHeader));
    }
    let header_crc = u32_at(rest, 12);
    if crc32c(&rest[..12]) != header_crc {
        return Err((None, Corruption::BadBatchHeader));
    }
    let len = u32_at(rest, 4) as usize;
    if len > MAX_BATCH_LEN {
        return Err((None, Corruption::BadBatchHeader));
    }
    let end = pos + BATCH_HEADER_LEN + len;
    if end > data.len() {
        return Err((
            None,
            Corruption::BadLength {
                declared: len as u64,
                present: (rest.len() - BATCH_HEADER_LEN) as u64,
            },
        ));
    }
    let stored = u32_at(rest, 8);
    let computed = crc32c(&rest[BATCH_HEADER_LEN..BATCH_HEADER_LEN + len]);
    if stored != computed {
        return Err((Some(end), Corruption::ChecksumMismatch { stored, computed }));
    }
    Ok(end)
}

/// The offset of the first batch that checks out at or after `from`.
fn find_batch(data: &[u8], from: usize) -> Option<usize> {
    let last = data.len().checked_sub(BATCH_HEADER_LEN)?;
    (from..=last).find(|&p| data[p..p + 4] == BATCH_MAGIC && check_batch(data, p).is_ok())
}

/// The frames of a batch whose checksum matched, filling `[start, end)`
/// exactly: anything that does not check out is damage.
fn parse_frames(
    data: &[u8],
    start: usize,
    end: usize,
    records: &mut Vec<(u64, Record)>,
) -> Result<(), Damage> {
    let mut pos = start;
    while pos < end {
        let rest = &data[pos..end];
        if rest.len() < FRAME_HEADER_LEN {
            return Err((
                pos as u64,
                Corruption::BadLength {
                    declared: FRAME_HEADER_LEN as u64,
                    present: rest.len() as u64,
                },
            ));
        }
        let len = u32_at(rest, 0) as usize;
        if len == 0 {
            return Err((pos as u64, Corruption::EmptyRecord));
        }
        if len > MAX_RECORD_LEN || len > rest.len() - FRAME_HEADER_LEN {
            return Err((
                pos as u64,
                Corruption::BadLength {
                    declared: len as u64,
                    present: (rest.len() - FRAME_HEADER_LEN) as u64,
                },
            ));
        }
        let record = check_frame(rest, pos, len)?;
        records.push((pos as u64, record));
        pos += FRAME_HEADER_LEN + len;
    }
    Ok(())
}

/// Whether the payload of the frame at `frame`, `len` bytes that fit in
/// `data`, matches the checksum in its header.
fn payload_checks_out(data: &[u8], frame: usize, len: usize) -> bool {
    let payload = frame + FRAME_HEADER_LEN;
    crc32c(&data[payload..payload + len]) == u32_at(data, frame + 4)
}

/// Checks and decodes the frame at the start of `rest` (at `pos` in the
/// file) with payload length `len`, which fits in `rest`.
fn check_frame(rest: &[u8], pos: usize, len: usize) -> Result<Record, Damage> {
    let stored = u32_at(rest, 4);
    let payload = &rest[FRAME_HEADER_LEN..FRAME_HEADER_LEN + len];
    let computed = crc32c(payload);
    if computed != stored {
        return Err((
            pos as u64,
            Corruption::ChecksumMismatch { stored, computed },
        ));
    }
    decode_record(payload).map_err(|e| (pos as u64, Corruption::Undecodable(e)))
}

/// Version 1: frames straight after the header. Returns the length of the
/// valid log.
fn parse_v1(data: &[u8], records: &mut Vec<(u64, Record)>) -> Result<usize, Damage> {
    let mut pos = HEADER_LEN as usize;
    loop {
        let rest = &data[pos..];
        if rest.is_empty() || rest.len() < FRAME_HEADER_LEN {
            return Ok(pos);
        }
        let len = u32_at(rest, 0) as usize;
        if len == 0 {
            if rest.iter().all(|b| *b == 0) {
                return Ok(pos);
            }
            return Err((pos as u64, Corruption::EmptyRecord));
        }
        if len > MAX_RECORD_LEN {
            return Err((
                pos as u64,
                Corruption::BadLength {
                    declared: len as u64,
                    present: (rest.len() - FRAME_HEADER_LEN) as u64,
                },
            ));
        }
        if rest.len() - FRAME_HEADER_LEN < len {
            // The frame runs past the end of the file: a torn final write,
            // unless a whole valid frame follows its header, which proves
            // the length field itself is damaged.
            if let Some(next) = find_frame(data, pos + FRAME_HEADER_LEN) {
                return Err((
                    pos as u64,
                    Corruption::BadLength {
                        declared: len as u64,
                        present: (next - pos - FRAME_HEADER_LEN) as u64,
                    },
                ));
            }
            return Ok(pos);
        }
        let record = check_frame(rest, pos, len)?;
        records.push((pos as u64, record));
        pos += FRAME_HEADER_LEN + len;
    }
}

/// The offset of the first whole frame with a matching checksum starting
/// at or after `from`, if any. A torn final write has no frame after it;
/// random bytes match a checksum once in 2^32 tries.
fn find_frame(data: &[u8], from: usize) -> Option<usize> {
    (from..data.len().saturating_sub(FRAME_HEADER_LEN)).find(|&p| {
        let len = u32_at(data, p) as usize;
        let start = p + FRAME_HEADER_LEN;
        len != 0
            && len <= MAX_RECORD_LEN
            && len <= data.len() - start
            && payload_checks_out(data, p, len)
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use metropolis_core::store::encode_record;

    use super::super::wal::{file_header, frame, seal_batch};
    use super::*;

    /// A frame holding a record that decodes (a compaction to `n`).
    fn record_frame(n: i64) -> Vec<u8> {
        frame(&encode_record(&Record::Compact(n)))
    }

    /// A batch of the records `from..to`.
    fn batch(from: i64, to: i64) -> Vec<u8> {
        let mut b = vec![0; BATCH_HEADER_LEN];
        for n in from..to {
            b.extend_from_slice(&record_frame(n));
        }
        seal_batch(&mut b);
        b
    }

    /// A version 2 file of batches of 1, 2, 3 … records, zero-padded;
    /// returns it and the offsets of its batches.
    fn file(batches: usize) -> (Vec<u8>, Vec<usize>) {
        let mut data = file_header(FORMAT_VERSION, 1).to_vec();
        let mut offsets = Vec::new();
        let mut n = 0;
        for i in 1..=batches as i64 {
            offsets.push(data.len());
            data.extend_from_slice(&batch(n, n + i));
            n += i;
        }
        data.resize(data.len() + 5000, 0);
        (data, offsets)
    }

    fn compactions(contents: &WalContents) -> Vec<i64> {
        contents
            .records
            .iter()
            .map(|(_, r)| match r {
                Record::Compact(n) => *n,
                other => panic!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn batches_then_zeros_read_whole() {
        let (data, offsets) = file(4);
        let contents = parse(&data).unwrap();
        assert_eq!(contents.version, FORMAT_VERSION);
        assert_eq!(compactions(&contents), (0..10).collect::<Vec<_>>());
        assert_eq!(contents.torn_len, 0);
        assert_eq!(
            contents.records[0].0,
            offsets[0] as u64 + BATCH_HEADER_LEN as u64
        );
        assert_eq!(contents.valid_len, (data.len() - 5000) as u64);
    }

    /// `file(4)` and a last batch of 200 records, several sectors long;
    /// returns it, the last batch's offset and its end.
    fn long_last_batch() -> (Vec<u8>, usize, usize) {
        let (mut data, _) = file(4);
        let last = data.len() - 5000;
        data.truncate(last);
        data.extend_from_slice(&batch(10, 210));
        let end = data.len();
        data.resize(end + 5000, 0);
        assert!(end - last > 4 * SECTOR);
        (data, last, end)
    }

    /// Whatever whole sectors of the last batch a crash lost (they read as
    /// zeros), the batch is dropped and the ones before are kept.
    #[test]
    fn any_tear_of_the_last_batch_drops_only_it() {
        let (data, last, end) = long_last_batch();
        let first = last / SECTOR;
        let sectors = end.div_ceil(SECTOR) - first;
        let tears: [(&str, Vec<usize>); 5] = [
            ("the header's sector", vec![0]),
            ("all but the header's", (1..sectors).collect()),
            ("one in the middle", vec![2]),
            ("the last", vec![sectors - 1]),
            ("every other", (0..sectors).step_by(2).collect()),
        ];
        for (what, lost) in tears {
            let mut torn = data.clone();
            for i in lost {
                let from = ((first + i) * SECTOR).max(last);
                torn[from..(first + i + 1) * SECTOR].fill(0);
            }
            let contents = parse(&torn).unwrap_or_else(|e| panic!("{what}: {e:?}"));
            assert_eq!(
                compactions(&contents),
                (0..10).collect::<Vec<_>>(),
                "{what}"
            );
            assert_eq!(contents.valid_len, last as u64, "{what}");
            assert!(contents.torn_len > 0 && last as u64 + contents.torn_len <= end as u64);
        }
        // Cut short by the end of the file.
        let contents = parse(&data[..end - 7]).unwrap();
        assert_eq!(contents.valid_len, last as u64);
    }

    /// A change to the last batch that no lost sector explains is damage
    /// to an acknowledged batch, refused at its offset: bytes zeroed inside
    /// a sector, a flipped bit, a header changed; or a lost sector with a
    /// byte written after the batch, which a torn final write cannot leave.
    #[test]
    fn a_change_to_the_last_batch_no_lost_sector_explains_is_refused() {
        /// Bytes `from..to` zeroed (`None`) or XORed with a mask.
        type Edit = (usize, usize, Option<u8>);
        let (data, last, end) = long_last_batch();
        let sector = (last / SECTOR + 2) * SECTOR;
        let changes: [(&str, &[Edit]); 5] = [
            ("a hole in a sector", &[(last + 600, last + 610, None)]),
            ("the very last byte", &[(end - 1, end, None)]),
            ("a flipped bit", &[(last + 1500, last + 1501, Some(0x10))]),
            ("a header byte", &[(last + 1, last + 2, Some(0x01))]),
            (
                "a byte after a torn batch",
                &[
                    (sector, sector + SECTOR, None),
                    (end + 700, end + 701, Some(1)),
                ],
            ),
        ];
        for (what, edits) in changes {
            let mut changed = data.clone();
            for &(from, to, flip) in edits {
                for b in &mut changed[from..to] {
                    *b = flip.map_or(0, |bit| *b ^ bit);
                }
            }
            let (offset, _) = parse(&changed).map(|c| c.valid_len).expect_err(what);
            assert_eq!(offset, last as u64, "{what}");
        }
        // The lost sector alone is a torn write.
        let mut torn = data.clone();
        torn[sector..sector + SECTOR].fill(0);
        assert_eq!(parse(&torn).unwrap().valid_len, last as u64);
    }

    /// A last batch whose middle record holds a value of 1,500 zero bytes
    /// (two whole sectors of zeros): a change to another record is still
    /// refused; one to that record reads as torn, since a lost sector could
    /// explain it; a lost sector is a tear.
    #[test]
    fn a_zero_sector_in_one_record_hides_damage_to_that_record_only() {
        use bytes::Bytes;
        use metropolis_core::store::{Op, Txn};

        let (mut data, _) = file(4);
        let last = data.len() - 5000;
        data.truncate(last);
        let mut b = vec![0; BATCH_HEADER_LEN];
        for n in 10..30 {
            b.extend_from_slice(&record_frame(n));
        }
        let zeros_frame = last + b.len();
        let put = Record::Txn(Txn {
            compares: Vec::new(),
            success: vec![Op::Put {
                key: Bytes::from_static(b"k"),
                value: Bytes::from(vec![0; 1500]),
                lease: 0,
            }],
            failure: Vec::new(),
        });
        b.extend_from_slice(&frame(&encode_record(&put)));
        let after = last + b.len();
        for n in 30..130 {
            b.extend_from_slice(&record_frame(n));
        }
        seal_batch(&mut b);
        data.extend_from_slice(&b);
        let end = data.len();
        data.resize(end + 5000, 0);
        assert_eq!(parse(&data).unwrap().records.len(), 10 + 121);

        let flipped = |at: usize| {
            let mut d = data.clone();
            d[at] ^= 0x08;
            parse(&d)
        };
        for (what, at) in [
            ("a record before", last + BATCH_HEADER_LEN + 10),
            ("a record after", after + 10),
            ("the last byte", end - 1),
        ] {
            let (offset, _) = flipped(at).map(|c| c.valid_len).expect_err(what);
            assert_eq!(offset, last as u64, "{what}");
        }
        // The zero record's checksum: its frame overlaps a zero sector.
        assert_eq!(flipped(zeros_frame + 4).unwrap().valid_len, last as u64);
        // A lost sector among the records after it.
        let sector = after.div_ceil(SECTOR) * SECTOR;
        assert!(sector + SECTOR < end);
        let mut torn = data.clone();
        torn[sector..sector + SECTOR].fill(0);
        assert_eq!(parse(&torn).unwrap().valid_len, last as u64);
    }

    /// Damage to a batch followed by a valid one is refused, at the
    /// damaged batch's offset.
    #[test]
    fn damage_before_a_valid_batch_is_refused() {
        let (data, offsets) = file(5);
        let mut flipped = data.clone();
        flipped[offsets[2] + BATCH_HEADER_LEN + 5] ^= 1;
        let (offset, problem) = parse(&flipped).unwrap_err();
        assert_eq!(offset, offsets[2] as u64);
        assert!(
            matches!(problem, Corruption::ChecksumMismatch { .. }),
            "{problem:?}"
        );

        let mut header = data.clone();
        header[offsets[1] + 1] ^= 1;
        let (offset, problem) = parse(&header).unwrap_err();
        assert_eq!(offset, offsets[1] as u64);
        assert!(matches!(problem, Corruption::BadBatchHeader), "{problem:?}");

        let mut zeroed = data.clone();
        zeroed[offsets[3]..offsets[3] + BATCH_HEADER_LEN].fill(0);
        let (offset, _) = parse(&zeroed).unwrap_err();
        assert_eq!(offset, offsets[3] as u64);

        // A length field pointing past the file, with batches after it.
        let mut long = data.clone();
        long[offsets[0] + 4..offsets[0] + 8].copy_from_slice(&(1u32 << 20).to_le_bytes());
        let crc = crc32c(&long[offsets[0]..offsets[0] + 12]);
        long[offsets[0] + 12..offsets[0] + 16].copy_from_slice(&crc.to_le_bytes());
        let (offset, problem) = parse(&long).unwrap_err();
        assert_eq!(offset, offsets[0] as u64);
        assert!(
            matches!(problem, Corruption::BadLength { .. }),
            "{problem:?}"
        );
    }

    /// Inside a batch whose checksum matches, a bad frame is damage even
    /// at the end of the log.
    #[test]
    fn a_bad_frame_in_a_sound_batch_is_refused() {
        let mut data = file_header(FORMAT_VERSION, 1).to_vec();
        let mut b = vec![0; BATCH_HEADER_LEN];
        b.extend_from_slice(&record_frame(1));
        let bad = b.len();
        let mut f = record_frame(2);
        f[FRAME_HEADER_LEN] ^= 0xFF;
        b.extend_from_slice(&f);
        seal_batch(&mut b);
        data.extend_from_slice(&b);
        let (offset, problem) = parse(&data).unwrap_err();
        assert_eq!(offset, (HEADER_LEN as usize + bad) as u64);
        assert!(
            matches!(problem, Corruption::ChecksumMismatch { .. }),
            "{problem:?}"
        );
    }

    /// A torn batch's frames are user data: even a well-formed batch inside
    /// them is not taken for a later, acknowledged batch.
    #[test]
    fn a_batch_inside_a_torn_batch_is_not_trusted() {
        let (mut data, offsets) = file(2);
        let inner = batch(100, 101);
        let mut outer = vec![0; BATCH_HEADER_LEN];
        let mut payload = vec![0x55u8; 1100];
        payload.extend_from_slice(&inner);
        outer.extend_from_slice(&frame(&payload));
        seal_batch(&mut outer);
        let at = data.len() - 5000;
        data.splice(at..at, outer.iter().copied());
        // A sector of the outer batch's frames, before the inner batch,
        // never reached the disk.
        let lost = (at + BATCH_HEADER_LEN + FRAME_HEADER_LEN).div_ceil(SECTOR) * SECTOR;
        assert!(lost + SECTOR < at + BATCH_HEADER_LEN + FRAME_HEADER_LEN + 1100);
        data[lost..lost + SECTOR].fill(0);
        let contents = parse(&data).unwrap();
        assert_eq!(contents.valid_len, at as u64);
        assert_eq!(compactions(&contents), vec![0, 1, 2]);
        assert_eq!(offsets.len(), 2);
    }

    /// Version 1 files still read: frames after the header, a zero or cut
    /// tail torn.
    #[test]
    fn version_1_files_still_read() {
        let mut data = file_header(FORMAT_VERSION_1, 3).to_vec();
        for n in 0..4 {
            data.extend_from_slice(&record_frame(n));
        }
        let valid = data.len();
        data.extend_from_slice(&[0; 100]);
        let contents = parse(&data).unwrap();
        assert_eq!(contents.version, FORMAT_VERSION_1);
        assert_eq!(contents.first_seq, 3);
        assert_eq!(compactions(&contents), vec![0, 1, 2, 3]);
        assert_eq!(contents.valid_len, valid as u64);
        let contents = parse(&data[..valid - 2]).unwrap();
        assert_eq!(compactions(&contents), vec![0, 1, 2]);
    }

    #[test]
    fn headers_are_checked() {
        let (data, _) = file(1);
        let mut future = data.clone();
        future[8] = 9;
        let crc = crc32c(&future[..20]);
        future[20..24].copy_from_slice(&crc.to_le_bytes());
        assert!(matches!(
            parse(&future).unwrap_err(),
            (
                8,
                Corruption::UnsupportedVersion {
                    found: 9,
                    supported: 2
                }
            )
        ));
        assert!(matches!(
            parse(&data[..10]).unwrap_err(),
            (0, Corruption::ShortHeader)
        ));
        assert!(matches!(
            parse(b"not a wal at all, no").unwrap_err(),
            (0, Corruption::BadMagic)
        ));
    }

    mod properties {
        use proptest::prelude::*;

        use super::*;

        /// A file of batches holding `sizes[i]` records each; returns it
        /// (zero-padded) and each batch's extent.
        fn layout(sizes: &[usize]) -> (Vec<u8>, Vec<(usize, usize)>) {
            let mut data = file_header(FORMAT_VERSION, 1).to_vec();
            let mut extents = Vec::new();
            let mut n = 0;
            for &k in sizes {
                let start = data.len();
                data.extend_from_slice(&batch(n, n + k as i64));
                extents.push((start, data.len()));
                n += k as i64;
            }
            data.resize(data.len() + 3000, 0);
            (data, extents)
        }

        proptest! {
            /// Whatever subset of the last batch's 512-byte sectors reached
            /// the disk, the open keeps exactly the batches before it (or
            /// all of them, if every sector did).
            #[test]
            fn a_torn_last_batch_never_costs_an_earlier_one(
                sizes in prop::collection::vec(1usize..40, 1..8),
                lost in prop::collection::vec(any::<bool>(), 64),
            ) {
                let (mut data, extents) = layout(&sizes);
                let (last, end) = *extents.last().unwrap();
                let mut sector = last / 512;
                while sector * 512 < end {
                    if lost[sector % lost.len()] {
                        let from = (sector * 512).max(last);
                        let to = ((sector + 1) * 512).min(end);
                        data[from..to].fill(0);
                    }
                    sector += 1;
                }
                let contents = parse(&data).unwrap();
                let before: usize = sizes[..sizes.len() - 1].iter().sum();
                let all: usize = sizes.iter().sum();
                if contents.valid_len == last as u64 {
                    prop_assert_eq!(contents.records.len(), before);
                } else {
                    prop_assert_eq!(contents.valid_len, end as u64);
                    prop_assert_eq!(contents.records.len(), all);
                }
            }

            /// A flipped bit in any batch but the last is refused, at that
            /// batch's offset.
            #[test]
            fn damage_to_an_earlier_batch_is_always_refused(
                sizes in prop::collection::vec(1usize..20, 2..8),
                which in any::<prop::sample::Index>(),
                at in any::<prop::sample::Index>(),
                bit in 0u8..8,
            ) {
                let (mut data, extents) = layout(&sizes);
                let (start, end) = extents[which.index(extents.len() - 1)];
                data[start + at.index(end - start)] ^= 1 << bit;
                let (offset, _) = parse(&data).unwrap_err();
                prop_assert_eq!(offset, start as u64);
            }

            /// A flipped bit in the last batch is refused too, at its
            /// offset, when no sector of it reads as zeros (which a torn
            /// write could explain).
            #[test]
            fn damage_to_the_last_batch_is_refused_where_no_sector_is_zeros(
                sizes in prop::collection::vec(1usize..200, 1..6),
                at in any::<prop::sample::Index>(),
                bit in 0u8..8,
            ) {
                let (mut data, extents) = layout(&sizes);
                let (start, end) = *extents.last().unwrap();
                data[start + at.index(end - start)] ^= 1 << bit;
                let zeros = (start / SECTOR..end.div_ceil(SECTOR)).any(|sector| {
                    let from = (sector * SECTOR).max(start);
                    data[from..(sector + 1) * SECTOR].iter().all(|b| *b == 0)
                });
                prop_assume!(!zeros);
                let (offset, _) = parse(&data).unwrap_err();
                prop_assert_eq!(offset, start as u64);
            }
        }
    }
}
