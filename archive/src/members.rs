//! The member table: normalised paths, links, and lookups through links.
//!
//! Paths are normalised lexically: a leading `./`, `.` components and
//! repeated or trailing slashes are dropped; absolute paths and `..`
//! components are rejected. Link targets are normalised the same way,
//! relative to the link's directory (symlinks) or to the archive root
//! (hard links); there `..` is allowed as long as the target stays inside
//! the archive. Nothing is ever extracted, so lexical resolution is the
//! whole meaning of a link here.

use std::collections::HashMap;

use bytes::Bytes;

use super::error::ArchiveError;
use super::plan::Digest;

/// Longest member path or link target accepted (Linux `PATH_MAX`).
pub(crate) const MAX_PATH: usize = 4096;

/// Links followed at most while looking a path up (as Linux's `ELOOP`).
const MAX_HOPS: u32 = 40;

/// What became of a regular member's bytes, for parsing as JSON later.
#[derive(Clone, Debug)]
pub(crate) enum Json {
    /// Kept in full.
    Kept(Bytes),
    /// Larger than the JSON cap.
    TooLarge,
    /// Not kept: the budget for buffered JSON was spent.
    OverBudget,
    /// Its first non-blank byte is not `{` or `[`: not a JSON document.
    NotADocument,
}

/// A complete regular member.
#[derive(Clone, Debug)]
pub(crate) struct FileInfo {
    /// Its size.
    pub size: u64,
    /// Its sha256.
    pub digest: Digest,
    /// Its first bytes (up to 4), for compression magic.
    pub head: [u8; 4],
    /// How many of `head` are valid.
    pub head_len: u8,
    /// Its bytes, if they might be JSON.
    pub json: Json,
}

/// A member's kind and what the table keeps of it.
#[derive(Clone, Debug)]
pub(crate) enum MemberKind {
    /// A regular file; `None` while its data is still arriving.
    File(Option<FileInfo>),
    /// A directory.
    Dir,
    /// A symbolic link to this normalised archive path.
    Symlink(String),
    /// A hard link to this normalised archive path.
    Hardlink(String),
}

/// A member of the archive.
#[derive(Clone, Debug)]
pub(crate) struct Member {
    /// Normalised path.
    pub path: String,
    /// Kind.
    pub kind: MemberKind,
}

/// Why a lookup failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LookupError {
    /// No member at the path (after following links).
    Missing,
    /// The path leads to a directory.
    NotAFile,
    /// Too many links.
    Loop,
}

/// All members, in archive order, by path.
#[derive(Debug, Default)]
pub(crate) struct Members {
    list: Vec<Member>,
    by_path: HashMap<String, usize>,
}

impl Members {
    /// Adds a member; its index is its position. Fails on a duplicate path.
    pub(crate) fn push(&mut self, path: String, kind: MemberKind) -> Result<usize, ArchiveError> {
        let index = self.list.len();
        if self.by_path.contains_key(&path) {
            return Err(ArchiveError::DuplicateMember { path });
        }
        self.by_path.insert(path.clone(), index);
        self.list.push(Member { path, kind });
        Ok(index)
    }

    /// The member at `index`.
    pub(crate) fn get(&self, index: usize) -> &Member {
        &self.list[index]
    }

    /// Sets a regular member's information once its data is complete.
    pub(crate) fn complete(&mut self, index: usize, info: FileInfo) {
        self.list[index].kind = MemberKind::File(Some(info));
    }

    /// Whether a member (of any kind) has exactly this normalised path.
    pub(crate) fn contains(&self, path: &str) -> bool {
        self.by_path.contains_key(path)
    }

    /// Looks a path up, following symlinks (in any component) and hard
    /// links, to a regular member; returns its index.
    pub(crate) fn resolve(&self, path: &str) -> Result<usize, LookupError> {
        let mut current = path.to_owned();
        let mut hops = 0;
        'restart: loop {
            let mut ends: Vec<usize> = current.match_indices('/').map(|(i, _)| i).collect();
            ends.push(current.len());
            for end in ends {
                let prefix = &current[..end];
                let last = end == current.len();
                let Some(&index) = self.by_path.get(prefix) else {
                    if last {
                        return Err(LookupError::Missing);
                    }
                    // Tar archives need not list directories.
                    continue;
                };
                match &self.list[index].kind {
                    MemberKind::Symlink(target) => {
                        hops += 1;
                        if hops > MAX_HOPS {
                            return Err(LookupError::Loop);
                        }
                        let rest = &current[end..];
                        current = if target.is_empty() {
                            rest.trim_start_matches('/').to_owned()
                        } else {
                            format!("{target}{rest}")
                        };
                        continue 'restart;
                    }
                    MemberKind::Hardlink(target) if last => {
                        hops += 1;
                        if hops > MAX_HOPS {
                            return Err(LookupError::Loop);
                        }
                        current = target.clone();
                        continue 'restart;
                    }
                    MemberKind::File(_) if last => return Ok(index),
                    MemberKind::Dir if last => return Err(LookupError::NotAFile),
                    MemberKind::Dir => {}
                    // A file (or hard link) used as a directory.
                    MemberKind::File(_) | MemberKind::Hardlink(_) => {
                        return Err(LookupError::Missing);
                    }
                }
            }
            // `ends` always has the full path last, which returns above.
            return Err(LookupError::Missing);
        }
    }
}

/// Normalises a member path as written in the archive. `Ok(None)` is the
/// archive root (`.`, `./`).
pub(crate) fn normalize_member_path(raw: &[u8]) -> Result<Option<String>, ArchiveError> {
    let lossy = || String::from_utf8_lossy(raw).into_owned();
    let Ok(text) = std::str::from_utf8(raw) else {
        return Err(ArchiveError::InvalidPath {
            path: lossy(),
            reason: "not UTF-8",
        });
    };
    if text.is_empty() {
        return Err(ArchiveError::InvalidPath {
            path: String::new(),
            reason: "empty",
        });
    }
    if text.len() > MAX_PATH {
        return Err(ArchiveError::InvalidPath {
            path: lossy(),
            reason: "longer than 4096 bytes",
        });
    }
    if text.starts_with('/') {
        return Err(ArchiveError::AbsolutePath { path: lossy() });
    }
    let mut out = String::with_capacity(text.len());
    for component in text.split('/') {
        match component {
            "" | "." => {}
            ".." => return Err(ArchiveError::ParentComponent { path: lossy() }),
            c => {
                if !out.is_empty() {
                    out.push('/');
                }
                out.push_str(c);
            }
        }
    }
    Ok(if out.is_empty() { None } else { Some(out) })
}

/// Normalises a path referenced from a JSON document (`manifest.json`
/// `Config`/`Layers`) like a member path; `None` if it cannot name a member
/// (absolute, `..`, empty, the root).
pub(crate) fn normalize_reference(path: &str) -> Option<String> {
    normalize_member_path(path.as_bytes()).ok().flatten()
}

/// Normalises a link target: relative to `base` (the link's directory for
/// a symlink, the root for a hard link). `None` if the target is absolute
/// or leaves the archive. The root itself is the empty string.
pub(crate) fn normalize_link_target(base: &str, target: &str) -> Option<String> {
    if target.starts_with('/') {
        return None;
    }
    let mut parts: Vec<&str> = base.split('/').filter(|c| !c.is_empty()).collect();
    for component in target.split('/') {
        match component {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            c => parts.push(c),
        }
    }
    Some(parts.join("/"))
}

/// The directory part of a normalised path (`""` at the root).
pub(crate) fn parent(path: &str) -> &str {
    path.rsplit_once('/').map_or("", |(dir, _)| dir)
}
