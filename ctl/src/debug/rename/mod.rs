//! `metroctl load-image --name REF`: names the images of an OCI layout
//! tarball that its `index.json` leaves unnamed (an
//! `org.opencontainers.image.ref.name` that is a bare tag such as `v2`,
//! as `skopeo copy … oci-archive:FILE:v2` writes, or none), by giving
//! them the `io.containerd.image.name` annotation the node reads, as
//! `ctr images import --base-name` does. The archive is rewritten while
//! it streams: every member passes through untouched except
//! `index.json`, whose header (size, checksum) and bytes are replaced.
//! NodeDebugService's `LoadImage` carries only the archive, so the name
//! has to be in it; any node that reads containerd's annotation (the
//! reference's as well) imports it under that name.

use serde_json::Value;

use crate::CliError;
use crate::exit::usage;

const BLOCK: usize = 512;
/// The largest `index.json` rewritten.
const MAX_INDEX_BYTES: u64 = 1 << 20;
/// The most bytes held back after the end marker (record padding).
const MAX_TRAILER_BYTES: usize = 1 << 20;
const REF_NAME: &str = "org.opencontainers.image.ref.name";
const CONTAINERD_NAME: &str = "io.containerd.image.name";

/// What `--name` gives: a repository, each unnamed image getting its
/// bare tag (or `latest`), or a whole reference for the one unnamed
/// image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NameArg {
    /// `REPOSITORY`: `REPOSITORY:<bare tag>` for each unnamed image.
    Repository(String),
    /// `REPOSITORY:TAG`: the one unnamed image.
    Reference(String),
}

impl NameArg {
    /// Parses `--name`: a repository with an optional tag, no digest.
    pub fn parse(text: &str) -> Result<NameArg, CliError> {
        let shown = metropolis_core::quote::quoted(text);
        if text.contains('@') {
            return Err(usage(format!(
                "--name {shown}: a name is REPOSITORY or REPOSITORY:TAG, without a digest"
            )));
        }
        if let Err(why) = metropolis_archive::normalize_reference(text) {
            return Err(usage(format!("--name {shown}: {why}")));
        }
        let last = text.rsplit('/').next().unwrap_or(text);
        Ok(if last.contains(':') {
            NameArg::Reference(text.to_owned())
        } else {
            NameArg::Repository(text.to_owned())
        })
    }
}

/// `index.json` with every image it leaves unnamed named after `name`;
/// how many were named.
pub fn rename_index(index: &[u8], name: &NameArg) -> Result<(Vec<u8>, usize), CliError> {
    let bad = |why: String| usage(format!("--name: the archive's index.json {why}"));
    let mut value: Value =
        serde_json::from_slice(index).map_err(|e| bad(format!("is not JSON: {e}")))?;
    let Some(manifests) = value.get_mut("manifests").and_then(Value::as_array_mut) else {
        return Err(bad("has no manifests list".to_owned()));
    };
    let mut unnamed = Vec::new();
    for (i, entry) in manifests.iter().enumerate() {
        let annotations = entry.get("annotations");
        let get = |key| annotations.and_then(|a| a.get(key)).and_then(Value::as_str);
        let full = get(REF_NAME).is_some_and(|r| r.contains(['/', ':', '@']));
        if get(CONTAINERD_NAME).is_none() && !full {
            unnamed.push((i, get(REF_NAME).map(str::to_owned)));
        }
    }
    if let (NameArg::Reference(r), n @ 2..) = (name, unnamed.len()) {
        return Err(usage(format!(
            "--name {}: the archive has {n} unnamed images, and one name names one; give a \
             repository without a tag to name each after its tag",
            metropolis_core::quote::quoted(r)
        )));
    }
    for (i, tag) in &unnamed {
        let full = match (name, tag) {
            (NameArg::Reference(r), _) => r.clone(),
            (NameArg::Repository(r), Some(tag)) => format!("{r}:{tag}"),
            (NameArg::Repository(r), None) => r.clone(),
        };
        let normal = metropolis_archive::normalize_reference(&full).map_err(|why| {
            usage(format!(
                "--name: {} (from index.json's tag {}) is not a reference: {why}",
                metropolis_core::quote::quoted(&full),
                metropolis_core::quote::quoted(tag.as_deref().unwrap_or(""))
            ))
        })?;
        let entry = &mut manifests[*i];
        if !entry.get("annotations").is_some_and(Value::is_object) {
            entry["annotations"] = Value::Object(Default::default());
        }
        entry["annotations"][CONTAINERD_NAME] = Value::String(normal);
    }
    let bytes = serde_json::to_vec(&value).map_err(|e| bad(format!("cannot be written: {e}")))?;
    Ok((bytes, unnamed.len()))
}

/// Where the rewriter is in the tar stream.
enum State {
    /// At a header block.
    Header,
    /// Passing `left` bytes of a member (padding included) through.
    Data { left: u64 },
    /// Gathering `index.json`: its header, its size, what came so far.
    Index { header: Vec<u8>, size: u64 },
    /// After the end marker: everything passes.
    End,
}

/// The tar stream rewriter (see the module docs).
pub struct Renamer {
    name: NameArg,
    state: State,
    pending: Vec<u8>,
    /// The last PAX header set a `size` (it then overrides the header's).
    pax_size: bool,
    /// A GNU long name or PAX path for the next member.
    long_name: Option<String>,
    /// How many images were named, once `index.json` went by.
    pub named: Option<usize>,
}

fn octal(field: &[u8]) -> Option<u64> {
    if field.first().is_some_and(|b| b & 0x80 != 0) {
        // Base-256, big-endian, for sizes beyond 8 GiB.
        return field[1..]
            .iter()
            .try_fold(0u64, |n, &b| n.checked_mul(256)?.checked_add(u64::from(b)));
    }
    let text = std::str::from_utf8(field).ok()?;
    let text = text.trim_matches(|c: char| c == '\0' || c == ' ');
    if text.is_empty() {
        return Some(0);
    }
    u64::from_str_radix(text, 8).ok()
}

fn padded(size: u64) -> u64 {
    size.div_ceil(BLOCK as u64) * BLOCK as u64
}

/// The member name of a ustar header (prefix joined), `./` stripped.
fn header_name(h: &[u8]) -> String {
    let field = |r: std::ops::Range<usize>| {
        let f = &h[r];
        let end = f.iter().position(|&b| b == 0).unwrap_or(f.len());
        String::from_utf8_lossy(&f[..end]).into_owned()
    };
    let name = field(0..100);
    // POSIX ustar only: GNU headers keep times where ustar has a prefix.
    let prefix = if &h[257..263] == b"ustar\0" {
        field(345..500)
    } else {
        String::new()
    };
    if prefix.is_empty() {
        name
    } else {
        format!("{prefix}/{name}")
    }
}

fn is_index(name: &str) -> bool {
    name.trim_start_matches("./") == "index.json"
}

/// The `path` and whether a `size` is among PAX records.
fn pax_records(data: &[u8]) -> (Option<String>, bool) {
    let text = String::from_utf8_lossy(data);
    let (mut path, mut size) = (None, false);
    for record in text.lines() {
        let Some((_, kv)) = record.split_once(' ') else {
            continue;
        };
        match kv.split_once('=') {
            Some(("path", p)) => path = Some(p.to_owned()),
            Some(("size", _)) => size = true,
            _ => {}
        }
    }
    (path, size)
}

impl Renamer {
    /// A rewriter naming unnamed images after `name`.
    pub fn new(name: NameArg) -> Renamer {
        Renamer {
            name,
            state: State::Header,
            pending: Vec::new(),
            pax_size: false,
            long_name: None,
            named: None,
        }
    }

    /// The next bytes of the archive in; what to send on out.
    pub fn feed(&mut self, input: &[u8]) -> Result<Vec<u8>, CliError> {
        self.pending.extend_from_slice(input);
        let mut out = Vec::with_capacity(self.pending.len());
        let mut at = 0;
        loop {
            let rest = &self.pending[at..];
            match &mut self.state {
                State::End => {
                    // Held back until `finish`: without index.json the
                    // node gets no end marker, so imports nothing.
                    if rest.len() > MAX_TRAILER_BYTES {
                        return Err(usage(format!(
                            "FILE: more than {MAX_TRAILER_BYTES} bytes after the archive's end \
                             marker: not a tar archive"
                        )));
                    }
                    break;
                }
                State::Data { left } => {
                    let n = (*left).min(rest.len() as u64) as usize;
                    out.extend_from_slice(&rest[..n]);
                    at += n;
                    *left -= n as u64;
                    if *left > 0 {
                        break;
                    }
                    self.state = State::Header;
                }
                State::Index { header, size } => {
                    let whole = padded(*size) as usize;
                    if rest.len() < whole {
                        break;
                    }
                    let (header, size) = (std::mem::take(header), *size);
                    let (bytes, named) = rewrite(&self.name, &header, &rest[..size as usize])?;
                    self.named = Some(named);
                    out.extend(bytes);
                    at += whole;
                    self.state = State::Header;
                }
                State::Header => {
                    if rest.len() < BLOCK {
                        break;
                    }
                    let h = &rest[..BLOCK];
                    at += BLOCK;
                    if h.iter().all(|&b| b == 0) {
                        at -= BLOCK;
                        self.state = State::End;
                        continue;
                    }
                    let size = octal(&h[124..136]).ok_or_else(|| {
                        usage("FILE: a tar header's size is not a number: not a tar archive")
                    })?;
                    let kind = h[156];
                    let data = &rest[BLOCK..];
                    // Extended headers are read whole, and passed on as
                    // they are.
                    if matches!(kind, b'x' | b'L') && (data.len() as u64) < padded(size) {
                        at -= BLOCK;
                        break;
                    }
                    match kind {
                        b'x' => {
                            let (path, has_size) = pax_records(&data[..size as usize]);
                            self.long_name = path;
                            self.pax_size = has_size;
                        }
                        b'L' => {
                            let raw = &data[..size as usize];
                            let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
                            self.long_name = Some(String::from_utf8_lossy(&raw[..end]).into());
                        }
                        _ if matches!(kind, b'0' | 0 | b'7')
                            && is_index(
                                &self.long_name.take().unwrap_or_else(|| header_name(h)),
                            ) =>
                        {
                            if self.pax_size {
                                return Err(usage(
                                    "--name: the archive's index.json has its size in a PAX \
                                     header, which --name cannot rewrite; name the images in \
                                     index.json (io.containerd.image.name) instead",
                                ));
                            }
                            if size > MAX_INDEX_BYTES {
                                return Err(usage(format!(
                                    "--name: the archive's index.json is larger than \
                                     {MAX_INDEX_BYTES} bytes"
                                )));
                            }
                            self.state = State::Index {
                                header: h.to_vec(),
                                size,
                            };
                            continue;
                        }
                        _ => {
                            self.long_name = None;
                            self.pax_size = false;
                        }
                    }
                    out.extend_from_slice(h);
                    self.state = State::Data { left: padded(size) };
                }
            }
        }
        self.pending.drain(..at);
        Ok(out)
    }

    /// The end of the input: the archive's end marker (and whatever
    /// follows it), to send last; an error if `index.json` never came
    /// (the archive is not an OCI layout, or it was cut short), and then
    /// the node never gets the end marker and imports nothing.
    pub fn finish(&mut self) -> Result<Vec<u8>, CliError> {
        if self.named.is_none() {
            return Err(usage(
                "--name: the archive has no index.json: --name names the images of an OCI \
                 layout (a Docker archive names them in manifest.json's RepoTags); nothing \
                 was imported",
            ));
        }
        Ok(std::mem::take(&mut self.pending))
    }
}

/// The new header and bytes of `index.json`.
fn rewrite(name: &NameArg, header: &[u8], index: &[u8]) -> Result<(Vec<u8>, usize), CliError> {
    let (json, named) = rename_index(index, name)?;
    let mut h = header.to_vec();
    let size = format!("{:011o}\0", json.len());
    h[124..136].copy_from_slice(size.as_bytes());
    h[148..156].fill(b' ');
    let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
    h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    let mut out = h;
    out.extend_from_slice(&json);
    out.resize(
        out.len() + (padded(json.len() as u64) as usize - json.len()),
        0,
    );
    Ok((out, named))
}

#[cfg(test)]
mod tests;
