//! The validator machine: archive bytes in, member outputs and a plan out.

use std::collections::VecDeque;

use bytes::Bytes;
use sha2::Digest as _;

use super::error::ArchiveError;
use super::layout;
use super::members::{self, FileInfo, Json, MemberKind, Members};
use super::plan::{Digest, ImportPlan};
use super::tar::{BLOCK, EntryHeader, Event, Kind, TarReader};

/// Names of the JSON documents that are always kept (and rejected at once
/// when over the cap), wherever they turn out to be needed.
const WELL_KNOWN_JSON: [&str; 4] = ["manifest.json", "repositories", "oci-layout", "index.json"];

/// The limits an archive must stay within.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArchiveLimits {
    /// Largest archive, in bytes, counting everything received (headers,
    /// padding, the end marker and any zero padding after it). Passing it
    /// is an error as soon as it is known: when a header declares a member
    /// that would end past it, or when the bytes received pass it.
    /// Default 8 GiB.
    pub max_total_size: u64,
    /// Largest JSON document (`manifest.json`, `index.json`, manifests,
    /// configs, `repositories`, `oci-layout`) in bytes. Default 4 MiB.
    pub max_json_size: usize,
    /// Bytes of candidate JSON documents kept at once. Which blobs are
    /// manifests or configs is only known once `index.json` or
    /// `manifest.json` has been read, which `docker save` writes after the
    /// blobs, so every member up to `max_json_size` that starts like JSON
    /// is kept until then. Default 64 MiB.
    pub max_json_total: usize,
    /// Most members (files, directories and links; extension headers do
    /// not count). Default 10,000.
    pub max_members: usize,
}

impl Default for ArchiveLimits {
    fn default() -> Self {
        ArchiveLimits {
            max_total_size: 8 << 30,
            max_json_size: 4 << 20,
            max_json_total: 64 << 20,
            max_members: 10_000,
        }
    }
}

/// What the validator emits while the archive streams in. For every
/// regular-file member, in archive order: one `MemberStart`, its data as
/// zero or more `MemberData`, then one `MemberEnd`. Directories and links
/// produce no output (links are resolved in the [`ImportPlan`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Output {
    /// A regular member begins.
    MemberStart {
        /// The member's index: its position among all members of the
        /// archive (regular files, directories and links, in archive
        /// order; extension headers and the root directory `./` do not
        /// count). [`BlobSource::member`](super::BlobSource::member)
        /// refers to it.
        index: usize,
        /// Its normalised path (no leading `./`, no trailing `/`).
        path: String,
    },
    /// The next bytes of the member: zero-copy slices of the input chunks
    /// (a member split across chunks comes in several pieces).
    MemberData {
        /// The member's index.
        index: usize,
        /// The bytes.
        data: Bytes,
    },
    /// The member is complete.
    MemberEnd {
        /// The member's index.
        index: usize,
        /// The sha256 of its bytes.
        sha256: [u8; 32],
        /// Its size in bytes.
        size: u64,
    },
}

/// JSON sniffing and buffering state of the member being read.
#[derive(Debug)]
enum JsonBuf {
    /// Not kept (the reason).
    Off(Json),
    /// Kept until the first non-blank byte says whether it is JSON.
    Sniffing(Vec<u8>),
    /// Kept (a well-known document, or it starts with `{` or `[`).
    Keeping(Vec<u8>),
}

/// The regular member being read.
#[derive(Debug)]
struct Current {
    index: usize,
    hasher: sha2::Sha256,
    size: u64,
    head: [u8; 4],
    head_len: u8,
    json: JsonBuf,
    /// Bytes reserved in the JSON budget for this member.
    reserved: usize,
}

/// Validates an image archive (Docker archive v1.1/v1.2 including Docker
/// 25+ output, or OCI image layout v1) streamed in as an uncompressed tar,
/// in chunks of any size.
///
/// # Driving contract
///
/// The owner feeds every chunk of the stream, in order, to
/// [`handle_data`](Self::handle_data), and after each call drains
/// [`poll_output`](Self::poll_output) until it returns `None`, passing the
/// [`Output`]s to the image store (which stages each regular member, e.g.
/// in a temporary file). When the stream ends, it calls
/// [`handle_eof`](Self::handle_eof), which checks the archive as a whole
/// and returns the [`ImportPlan`]: which staged members are blobs, the
/// blobs to add, the images. Only after `Ok(plan)` may the store commit
/// anything.
///
/// Errors are sticky: once `handle_data` has returned an error, the
/// machine is dead; every later `handle_data` and `handle_eof` returns the
/// same error, and `poll_output` returns `None` (outputs not yet polled
/// are dropped). On any error the store discards what it staged.
///
/// Per byte, the machine hashes once (sha256) and otherwise only slices
/// the input; it never buffers member data, except small members that may
/// be JSON documents (see [`ArchiveLimits`]). `handle_eof` produces no
/// outputs.
///
/// ```
/// use metropolis_archive::{ArchiveLimits, ArchiveValidator, Output};
/// # fn store(_: Output) {}
/// # fn run(chunks: Vec<bytes::Bytes>) -> Result<(), metropolis_archive::ArchiveError> {
/// let mut validator = ArchiveValidator::new(ArchiveLimits::default());
/// for chunk in chunks {
///     validator.handle_data(chunk)?;
///     while let Some(output) = validator.poll_output() {
///         store(output);
///     }
/// }
/// let plan = validator.handle_eof()?;
/// # let _ = plan; Ok(()) }
/// ```
#[derive(Debug)]
pub struct ArchiveValidator {
    limits: ArchiveLimits,
    reader: TarReader,
    received: u64,
    entries: usize,
    members: Members,
    current: Option<Current>,
    json_used: usize,
    outputs: VecDeque<Output>,
    error: Option<ArchiveError>,
}

impl ArchiveValidator {
    /// A validator expecting the start of an archive.
    pub fn new(limits: ArchiveLimits) -> ArchiveValidator {
        ArchiveValidator {
            limits,
            reader: TarReader::default(),
            received: 0,
            entries: 0,
            members: Members::default(),
            current: None,
            json_used: 0,
            outputs: VecDeque::new(),
            error: None,
        }
    }

    /// Bytes received so far.
    pub fn bytes_received(&self) -> u64 {
        self.received
    }

    /// The error the machine died of, if it did.
    pub fn error(&self) -> Option<&ArchiveError> {
        self.error.as_ref()
    }

    /// Feeds the next chunk of the archive (of any size, including empty).
    /// Queues the outputs it produces; drain them with
    /// [`poll_output`](Self::poll_output).
    pub fn handle_data(&mut self, data: Bytes) -> Result<(), ArchiveError> {
        if let Some(e) = &self.error {
            return Err(e.clone());
        }
        self.process(data).map_err(|e| self.fail(e))
    }

    /// The next output, if any.
    pub fn poll_output(&mut self) -> Option<Output> {
        self.outputs.pop_front()
    }

    /// Ends the stream: checks that the archive is complete and consistent
    /// and returns the plan for importing it.
    pub fn handle_eof(mut self) -> Result<ImportPlan, ArchiveError> {
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        self.reader.finish()?;
        layout::plan(&self.members, &self.limits)
    }

    fn fail(&mut self, e: ArchiveError) -> ArchiveError {
        self.outputs.clear();
        self.current = None;
        self.error = Some(e.clone());
        e
    }

    fn too_large(&self) -> ArchiveError {
        ArchiveError::ArchiveTooLarge {
            limit: self.limits.max_total_size,
        }
    }

    fn process(&mut self, mut data: Bytes) -> Result<(), ArchiveError> {
        self.received += data.len() as u64;
        if self.received > self.limits.max_total_size {
            return Err(self.too_large());
        }
        while let Some(event) = self.reader.next(&mut data)? {
            match event {
                Event::Entry(header) => self.on_entry(header)?,
                Event::Data(bytes) => self.on_data(bytes)?,
                Event::EntryEnd => self.on_entry_end()?,
                Event::End => {}
            }
        }
        Ok(())
    }

    fn on_entry(&mut self, header: EntryHeader) -> Result<(), ArchiveError> {
        self.entries += 1;
        if self.entries > self.limits.max_members {
            return Err(ArchiveError::TooManyMembers {
                limit: self.limits.max_members,
            });
        }
        // The member's data, its padding and the end marker must fit.
        let end = (header.offset + BLOCK as u64)
            .saturating_add(
                header
                    .size
                    .checked_next_multiple_of(BLOCK as u64)
                    .unwrap_or(u64::MAX),
            )
            .saturating_add(2 * BLOCK as u64);
        if end > self.limits.max_total_size {
            return Err(self.too_large());
        }
        if let Kind::Unsupported(kind) = header.kind {
            return Err(ArchiveError::UnsupportedMember {
                path: String::from_utf8_lossy(&header.path).into_owned(),
                kind,
            });
        }
        let Some(path) = members::normalize_member_path(&header.path)? else {
            if header.kind == Kind::Directory {
                return Ok(());
            }
            return Err(ArchiveError::InvalidPath {
                path: String::from_utf8_lossy(&header.path).into_owned(),
                reason: "names the archive root",
            });
        };
        if let Some(name) = path.strip_prefix("blobs/sha256/")
            && Digest::from_hex(name).is_none()
        {
            return Err(ArchiveError::InvalidPath {
                path,
                reason: "not a sha256 digest under blobs/sha256/",
            });
        }
        let kind = match header.kind {
            Kind::Directory => MemberKind::Dir,
            Kind::Regular => MemberKind::File(None),
            Kind::Symlink | Kind::Hardlink => {
                let symlink = header.kind == Kind::Symlink;
                let Ok(target) = std::str::from_utf8(&header.link) else {
                    return Err(ArchiveError::InvalidPath {
                        path,
                        reason: "link target is not UTF-8",
                    });
                };
                if target.is_empty() || target.len() > members::MAX_PATH {
                    return Err(ArchiveError::InvalidPath {
                        path,
                        reason: "link target empty or longer than 4096 bytes",
                    });
                }
                let base = if symlink { members::parent(&path) } else { "" };
                match members::normalize_link_target(base, target) {
                    Some(t) if symlink => MemberKind::Symlink(t),
                    Some(t) => MemberKind::Hardlink(t),
                    None => {
                        let (member, target) = (path, target.to_owned());
                        return Err(if symlink {
                            ArchiveError::SymlinkEscapes { member, target }
                        } else {
                            ArchiveError::HardlinkEscapes { member, target }
                        });
                    }
                }
            }
            // Rejected above.
            Kind::Unsupported(_) => unreachable!("unsupported members are rejected first"),
        };
        let regular = matches!(kind, MemberKind::File(_));
        let json = if regular {
            Some(self.json_policy(&path, header.size)?)
        } else {
            None
        };
        let index = self.members.push(path.clone(), kind)?;
        if let Some((json, reserved)) = json {
            self.outputs.push_back(Output::MemberStart { index, path });
            self.current = Some(Current {
                index,
                hasher: sha2::Sha256::new(),
                size: 0,
                head: [0; 4],
                head_len: 0,
                json,
                reserved,
            });
        }
        Ok(())
    }

    /// Whether (and how) to keep a regular member's bytes for JSON parsing,
    /// and how many bytes of the budget that reserves.
    fn json_policy(&mut self, path: &str, size: u64) -> Result<(JsonBuf, usize), ArchiveError> {
        let well_known = WELL_KNOWN_JSON.contains(&path);
        if size > self.limits.max_json_size as u64 {
            if well_known {
                return Err(ArchiveError::JsonTooLarge {
                    member: path.to_owned(),
                    size,
                    limit: self.limits.max_json_size,
                });
            }
            return Ok((JsonBuf::Off(Json::TooLarge), 0));
        }
        // Fits in usize: at most max_json_size.
        let size = size as usize;
        if self.json_used + size > self.limits.max_json_total {
            if well_known {
                return Err(ArchiveError::MetadataTooLarge {
                    member: path.to_owned(),
                    limit: self.limits.max_json_total,
                });
            }
            return Ok((JsonBuf::Off(Json::OverBudget), 0));
        }
        self.json_used += size;
        let buf = Vec::with_capacity(size);
        Ok(if well_known {
            (JsonBuf::Keeping(buf), size)
        } else {
            (JsonBuf::Sniffing(buf), size)
        })
    }

    fn on_data(&mut self, data: Bytes) -> Result<(), ArchiveError> {
        let current = self
            .current
            .as_mut()
            .expect("the tar reader sends data only inside a regular member");
        current.hasher.update(&data);
        current.size += data.len() as u64;
        let take = (4 - current.head_len as usize).min(data.len());
        if take > 0 {
            let at = current.head_len as usize;
            current.head[at..at + take].copy_from_slice(&data[..take]);
            current.head_len += take as u8;
        }
        match &mut current.json {
            JsonBuf::Off(_) => {}
            JsonBuf::Keeping(buf) => buf.extend_from_slice(&data),
            JsonBuf::Sniffing(buf) => {
                buf.extend_from_slice(&data);
                match buf.iter().find(|b| !b.is_ascii_whitespace()) {
                    None => {}
                    Some(b'{' | b'[') => current.json = JsonBuf::Keeping(std::mem::take(buf)),
                    Some(_) => {
                        current.json = JsonBuf::Off(Json::NotADocument);
                        self.json_used -= current.reserved;
                        current.reserved = 0;
                    }
                }
            }
        }
        self.outputs.push_back(Output::MemberData {
            index: current.index,
            data,
        });
        Ok(())
    }

    fn on_entry_end(&mut self) -> Result<(), ArchiveError> {
        let current = self
            .current
            .take()
            .expect("the tar reader ends only a regular member it started");
        let digest = Digest::from_sha256(current.hasher.finalize().into());
        let json = match current.json {
            JsonBuf::Off(reason) => reason,
            JsonBuf::Keeping(buf) => Json::Kept(Bytes::from(buf)),
            JsonBuf::Sniffing(_) => {
                self.json_used -= current.reserved;
                Json::NotADocument
            }
        };
        let path = &self.members.get(current.index).path;
        if let Some(name) = path.strip_prefix("blobs/sha256/") {
            let expected = Digest::from_hex(name).expect("blob names are checked at the header");
            if expected != digest {
                return Err(ArchiveError::BlobDigestMismatch {
                    member: path.clone(),
                    expected,
                    actual: digest,
                });
            }
        }
        self.outputs.push_back(Output::MemberEnd {
            index: current.index,
            sha256: *digest.sha256(),
            size: current.size,
        });
        self.members.complete(
            current.index,
            FileInfo {
                size: current.size,
                digest,
                head: current.head,
                head_len: current.head_len,
                json,
            },
        );
        Ok(())
    }
}
