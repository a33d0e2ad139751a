//! An incremental tar reader: bytes in, members out, never more than one
//! header block (plus extension header data) buffered.
//!
//! Field parsing uses the `tar` crate's header accessors, which are pure
//! functions over a 512-byte block; the framing (what follows a header,
//! padding, extension headers, the end marker) is done here so the reader
//! can be fed chunks of any size.

use bytes::{Buf, Bytes};

use super::error::{ArchiveError, TruncatedAt};

/// Size of a tar block.
pub(crate) const BLOCK: usize = 512;

/// Largest extension header (GNU long name/link, PAX) accepted. Names are
/// at most 4 KiB; PAX headers may also carry other records (times, xattrs).
pub(crate) const MAX_EXTENSION: u64 = 1 << 20;

/// What a member is, as far as an image archive cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A regular file (types `0`, NUL, `7`).
    Regular,
    /// A directory (type `5`, or an old-style regular file whose name ends
    /// in `/`).
    Directory,
    /// A symbolic link (type `2`).
    Symlink,
    /// A hard link (type `1`).
    Hardlink,
    /// Anything else; the string says what.
    Unsupported(&'static str),
}

/// A member's header, with GNU long names and PAX records applied.
#[derive(Clone, Debug)]
pub(crate) struct EntryHeader {
    /// The path as stored (not normalised).
    pub path: Vec<u8>,
    /// The link target as stored (empty when none).
    pub link: Vec<u8>,
    /// The member's kind.
    pub kind: Kind,
    /// Size of the data that follows (0 for links and directories, whatever
    /// their header says).
    pub size: u64,
    /// Offset of the member's (last) header block in the archive.
    pub offset: u64,
}

/// What the reader found.
#[derive(Debug)]
pub(crate) enum Event {
    /// A member's header. For [`Kind::Regular`] members, [`Event::Data`]
    /// (zero or more) and [`Event::EntryEnd`] follow; other members have
    /// neither.
    Entry(EntryHeader),
    /// A slice of the current regular member's data (zero-copy from the
    /// input).
    Data(Bytes),
    /// The current regular member's data is complete.
    EntryEnd,
    /// The end-of-archive marker (two zero blocks).
    End,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ExtKind {
    LongName,
    LongLink,
    Pax,
}

#[derive(Debug)]
enum State {
    /// Expecting a header block.
    Header,
    /// One zero block seen; expecting the second.
    OneZero,
    /// Inside a regular member's data, followed by `pad` bytes of padding.
    Data { remaining: u64, pad: u64 },
    /// Skipping bytes (padding, ignored payloads); `member` says whether
    /// they belong to the last member (for truncation reports).
    Skip { remaining: u64, member: bool },
    /// Collecting an extension header's data.
    Ext {
        kind: ExtKind,
        remaining: u64,
        pad: u64,
    },
    /// After the end marker: only zero bytes may follow.
    End,
}

/// Overrides from extension headers, for the next member.
#[derive(Debug, Default)]
struct Pending {
    any: bool,
    path: Option<Vec<u8>>,
    link: Option<Vec<u8>>,
    size: Option<u64>,
    sparse: bool,
}

/// The incremental reader. Feed it with [`TarReader::next`] until it
/// returns `Ok(None)` (it needs more input), then call
/// [`TarReader::finish`] at end of input.
#[derive(Debug)]
pub(crate) struct TarReader {
    state: State,
    /// A header block being assembled across inputs.
    block: [u8; BLOCK],
    block_len: usize,
    /// Bytes consumed so far.
    offset: u64,
    pending: Pending,
    ext: Vec<u8>,
    /// Path of the last member (lossy), for truncation reports.
    last_path: String,
}

impl Default for TarReader {
    fn default() -> Self {
        TarReader {
            state: State::Header,
            block: [0; BLOCK],
            block_len: 0,
            offset: 0,
            pending: Pending::default(),
            ext: Vec::new(),
            last_path: String::new(),
        }
    }
}

fn padding(size: u64) -> u64 {
    (BLOCK as u64 - size % BLOCK as u64) % BLOCK as u64
}

impl TarReader {
    /// The next event, consuming from the front of `input`; `Ok(None)` once
    /// `input` is used up and more is needed. Never buffers member data:
    /// [`Event::Data`] slices `input`.
    pub(crate) fn next(&mut self, input: &mut Bytes) -> Result<Option<Event>, ArchiveError> {
        loop {
            match &mut self.state {
                State::Data { remaining, pad } => {
                    if *remaining == 0 {
                        self.state = State::Skip {
                            remaining: *pad,
                            member: true,
                        };
                        return Ok(Some(Event::EntryEnd));
                    }
                    if input.is_empty() {
                        return Ok(None);
                    }
                    let n = (*remaining).min(input.len() as u64) as usize;
                    *remaining -= n as u64;
                    self.offset += n as u64;
                    return Ok(Some(Event::Data(input.split_to(n))));
                }
                State::Skip { remaining, .. } => {
                    if *remaining == 0 {
                        self.state = State::Header;
                        continue;
                    }
                    if input.is_empty() {
                        return Ok(None);
                    }
                    let n = (*remaining).min(input.len() as u64) as usize;
                    *remaining -= n as u64;
                    self.offset += n as u64;
                    input.advance(n);
                }
                State::Ext {
                    kind,
                    remaining,
                    pad,
                } => {
                    if *remaining == 0 {
                        let (kind, pad) = (*kind, *pad);
                        self.state = State::Skip {
                            remaining: pad,
                            member: false,
                        };
                        self.apply_extension(kind)?;
                        continue;
                    }
                    if input.is_empty() {
                        return Ok(None);
                    }
                    let n = (*remaining).min(input.len() as u64) as usize;
                    *remaining -= n as u64;
                    self.offset += n as u64;
                    self.ext.extend_from_slice(&input[..n]);
                    input.advance(n);
                }
                State::Header | State::OneZero => {
                    if input.is_empty() {
                        return Ok(None);
                    }
                    let n = (BLOCK - self.block_len).min(input.len());
                    self.block[self.block_len..self.block_len + n].copy_from_slice(&input[..n]);
                    self.block_len += n;
                    self.offset += n as u64;
                    input.advance(n);
                    if self.block_len < BLOCK {
                        return Ok(None);
                    }
                    self.block_len = 0;
                    if let Some(event) = self.header()? {
                        return Ok(Some(event));
                    }
                }
                State::End => {
                    if input.is_empty() {
                        return Ok(None);
                    }
                    if let Some(pos) = input.iter().position(|&b| b != 0) {
                        return Err(ArchiveError::TrailingData {
                            offset: self.offset + pos as u64,
                        });
                    }
                    self.offset += input.len() as u64;
                    input.clear();
                    return Ok(None);
                }
            }
        }
    }

    /// Checks, at end of input, that the archive ended where it may: after
    /// the end-of-archive marker. A missing marker is truncation even when
    /// the last member is complete (see the module docs).
    pub(crate) fn finish(&self) -> Result<(), ArchiveError> {
        let at = match &self.state {
            State::End => return Ok(()),
            State::Header | State::OneZero if self.block_len > 0 => TruncatedAt::Header,
            State::Header if self.pending.any => TruncatedAt::Extension,
            State::Header | State::OneZero => TruncatedAt::EndMarker,
            State::Data { .. } | State::Skip { member: true, .. } => TruncatedAt::Member {
                path: self.last_path.clone(),
            },
            State::Ext { .. } | State::Skip { member: false, .. } => TruncatedAt::Extension,
        };
        Err(ArchiveError::Truncated {
            offset: self.offset,
            at,
        })
    }

    /// Handles a complete header block.
    fn header(&mut self) -> Result<Option<Event>, ArchiveError> {
        let offset = self.offset - BLOCK as u64;
        if self.block.iter().all(|&b| b == 0) {
            if self.pending.any {
                return Err(ArchiveError::BadHeader {
                    offset,
                    what: "extension header not followed by a member",
                });
            }
            return Ok(match self.state {
                State::OneZero => {
                    self.state = State::End;
                    Some(Event::End)
                }
                _ => {
                    self.state = State::OneZero;
                    None
                }
            });
        }
        if matches!(self.state, State::OneZero) {
            return Err(ArchiveError::BadHeader {
                offset,
                what: "a header follows a lone zero block",
            });
        }
        let header = ::tar::Header::from_byte_slice(&self.block);
        let stored = header.cksum().map_err(|_| ArchiveError::BadHeader {
            offset,
            what: "malformed checksum field",
        })?;
        let (unsigned, signed) = checksums(&self.block);
        if stored != unsigned && i64::from(stored) != signed {
            return Err(ArchiveError::BadChecksum {
                offset,
                stored,
                computed: unsigned,
            });
        }
        let header_size = header.entry_size().map_err(|_| ArchiveError::BadHeader {
            offset,
            what: "malformed size field",
        })?;
        let type_flag = self.block[156];
        let ext_kind = match type_flag {
            b'L' => Some(ExtKind::LongName),
            b'K' => Some(ExtKind::LongLink),
            b'x' | b'X' => Some(ExtKind::Pax),
            _ => None,
        };
        if let Some(kind) = ext_kind {
            if header_size > MAX_EXTENSION {
                return Err(ArchiveError::BadHeader {
                    offset,
                    what: "extension header larger than 1 MiB",
                });
            }
            self.pending.any = true;
            self.ext.clear();
            self.state = State::Ext {
                kind,
                remaining: header_size,
                pad: padding(header_size),
            };
            return Ok(None);
        }
        if type_flag == b'g' {
            // PAX global header: applies to all later members, but none of
            // its records matter here (paths and sizes are per member).
            self.state = State::Skip {
                remaining: header_size.saturating_add(padding(header_size)),
                member: false,
            };
            return Ok(None);
        }

        let pending = std::mem::take(&mut self.pending);
        let path = match pending.path {
            Some(p) => p,
            None => header.path_bytes().into_owned(),
        };
        let link = match pending.link {
            Some(l) => l,
            None => header
                .link_name_bytes()
                .map(|l| l.into_owned())
                .unwrap_or_default(),
        };
        let size = pending.size.unwrap_or(header_size);
        let mut kind = match type_flag {
            b'0' | b'7' => Kind::Regular,
            0 if path.last() == Some(&b'/') => Kind::Directory,
            0 => Kind::Regular,
            b'1' => Kind::Hardlink,
            b'2' => Kind::Symlink,
            b'5' => Kind::Directory,
            b'3' => Kind::Unsupported("character device"),
            b'4' => Kind::Unsupported("block device"),
            b'6' => Kind::Unsupported("FIFO"),
            b'S' => Kind::Unsupported("sparse file"),
            b'V' => Kind::Unsupported("volume label"),
            b'M' => Kind::Unsupported("multi-volume continuation"),
            b'D' => Kind::Unsupported("GNU dump directory"),
            _ => Kind::Unsupported("unknown type"),
        };
        if pending.sparse && kind == Kind::Regular {
            kind = Kind::Unsupported("sparse file");
        }
        self.last_path = String::from_utf8_lossy(&path).into_owned();
        // Like most readers, links, directories and devices carry no data
        // whatever their size field says; unknown types are skipped by size.
        let data = match kind {
            Kind::Regular | Kind::Unsupported(_) => size,
            Kind::Directory | Kind::Symlink | Kind::Hardlink => 0,
        };
        self.state = match kind {
            Kind::Regular => State::Data {
                remaining: data,
                pad: padding(data),
            },
            _ => State::Skip {
                remaining: data.saturating_add(padding(data)),
                member: true,
            },
        };
        Ok(Some(Event::Entry(EntryHeader {
            path,
            link,
            kind,
            size: data,
            offset,
        })))
    }

    /// Applies a complete extension header's data to the pending overrides.
    fn apply_extension(&mut self, kind: ExtKind) -> Result<(), ArchiveError> {
        let data = std::mem::take(&mut self.ext);
        let offset = self.offset - data.len() as u64;
        match kind {
            ExtKind::LongName | ExtKind::LongLink => {
                let end = data.iter().position(|&b| b == 0).unwrap_or(data.len());
                let value = data[..end].to_vec();
                if kind == ExtKind::LongName {
                    self.pending.path = Some(value);
                } else {
                    self.pending.link = Some(value);
                }
            }
            ExtKind::Pax => {
                for record in ::tar::PaxExtensions::new(&data) {
                    let record = record.map_err(|_| ArchiveError::BadHeader {
                        offset,
                        what: "malformed PAX record",
                    })?;
                    match record.key_bytes() {
                        b"path" => self.pending.path = Some(record.value_bytes().to_vec()),
                        b"linkpath" => self.pending.link = Some(record.value_bytes().to_vec()),
                        b"size" => {
                            let size = std::str::from_utf8(record.value_bytes())
                                .ok()
                                .and_then(|s| s.parse::<u64>().ok())
                                .ok_or(ArchiveError::BadHeader {
                                    offset,
                                    what: "malformed PAX size record",
                                })?;
                            self.pending.size = Some(size);
                        }
                        key if key.starts_with(b"GNU.sparse.") => self.pending.sparse = true,
                        _ => {}
                    }
                }
            }
        }
        self.ext = data;
        self.ext.clear();
        Ok(())
    }
}

/// The header checksum as the sum of its bytes with the checksum field
/// read as spaces: unsigned (POSIX) and signed (some old writers).
fn checksums(block: &[u8; BLOCK]) -> (u32, i64) {
    let mut unsigned = 0u32;
    let mut signed = 0i64;
    for (i, &b) in block.iter().enumerate() {
        let b = if (148..156).contains(&i) { b' ' } else { b };
        unsigned += u32::from(b);
        signed += i64::from(b as i8);
    }
    (unsigned, signed)
}
