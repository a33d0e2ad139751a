//! Test helpers: frames, a client HPACK encoder with a dynamic table (as
//! gRPC C-core uses it), and a model of h2's side of the connection.

use std::collections::VecDeque;

use super::hpack::{Decoder, ENTRY_OVERHEAD, STATIC, put_integer};
use super::huffman;
use super::rewrite::Rewriter;
use super::{HEADER_TABLE_SIZE, MAX_FRAME_SIZE, MAX_LIST};

pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
pub const DATA: u8 = 0x0;
pub const HEADERS: u8 = 0x1;
pub const SETTINGS: u8 = 0x4;
pub const CONTINUATION: u8 = 0x9;
pub const END_STREAM: u8 = 0x1;
pub const END_HEADERS: u8 = 0x4;
pub const PADDED: u8 = 0x8;
pub const PRIORITY: u8 = 0x20;

/// A frame.
pub fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = (payload.len() as u32).to_be_bytes();
    let mut f = vec![len[1], len[2], len[3], kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// `block` as a HEADERS frame with `flags` and CONTINUATION frames of at
/// most 16384 bytes.
pub fn headers(stream: u32, flags: u8, block: &[u8]) -> Vec<u8> {
    let chunks: Vec<&[u8]> = block.chunks(MAX_FRAME_SIZE).collect();
    let mut out = Vec::new();
    for (i, chunk) in chunks.iter().enumerate() {
        let kind = if i == 0 { HEADERS } else { CONTINUATION };
        let mut f = if i == 0 { flags } else { 0 };
        if i + 1 == chunks.len() {
            f |= END_HEADERS;
        }
        out.extend(frame(kind, f, stream, chunk));
    }
    out
}

/// The preface and an empty SETTINGS frame.
pub fn start() -> Vec<u8> {
    let mut s = PREFACE.to_vec();
    s.extend(frame(SETTINGS, 0, 0, &[]));
    s
}

/// How the test client encodes a field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Repr {
    /// Indexed when a table has it, else a literal with incremental
    /// indexing.
    Index,
    /// A literal with incremental indexing.
    Incremental,
    /// A literal without indexing.
    Without,
    /// A literal never indexed.
    Never,
}

/// A client's HPACK encoder.
pub struct Encoder {
    table: VecDeque<(Vec<u8>, Vec<u8>)>,
    size: usize,
    max: usize,
}

impl Encoder {
    pub fn new() -> Self {
        Encoder {
            table: VecDeque::new(),
            size: 0,
            max: HEADER_TABLE_SIZE,
        }
    }

    /// Encodes `fields` as C-core does: indexing everything, Huffman.
    pub fn block(&mut self, fields: &[(&str, &str)]) -> Vec<u8> {
        let mut out = Vec::new();
        for (n, v) in fields {
            self.field(&mut out, n.as_bytes(), v.as_bytes(), Repr::Index, true);
        }
        out
    }

    /// A dynamic table size update (only at a block's start).
    pub fn size_update(&mut self, out: &mut Vec<u8>, max: usize) {
        put_integer(out, 0x20, 5, max);
        self.max = max;
        self.evict_to(max);
    }

    pub fn field(&mut self, out: &mut Vec<u8>, name: &[u8], value: &[u8], repr: Repr, huff: bool) {
        let (exact, name_index) = self.find(name, value);
        if repr == Repr::Index
            && let Some(i) = exact
        {
            put_integer(out, 0x80, 7, i);
            return;
        }
        let (flags, prefix) = match repr {
            Repr::Index | Repr::Incremental => (0x40, 6),
            Repr::Without => (0x00, 4),
            Repr::Never => (0x10, 4),
        };
        put_integer(out, flags, prefix, name_index.unwrap_or(0));
        if name_index.is_none() {
            string(out, name, huff);
        }
        string(out, value, huff);
        if flags == 0x40 {
            let size = name.len() + value.len() + ENTRY_OVERHEAD;
            if size > self.max {
                self.evict_to(0);
            } else {
                self.evict_to(self.max - size);
                self.size += size;
                self.table.push_front((name.to_vec(), value.to_vec()));
            }
        }
    }

    fn find(&self, name: &[u8], value: &[u8]) -> (Option<usize>, Option<usize>) {
        let entries = STATIC
            .iter()
            .map(|(n, v)| (n.as_bytes(), v.as_bytes()))
            .chain(self.table.iter().map(|(n, v)| (&n[..], &v[..])));
        let (mut exact, mut by_name) = (None, None);
        for (i, (n, v)) in entries.enumerate() {
            if n == name {
                by_name = by_name.or(Some(i + 1));
                if v == value {
                    exact = exact.or(Some(i + 1));
                }
            }
        }
        (exact, by_name)
    }

    fn evict_to(&mut self, size: usize) {
        while self.size > size {
            let Some((n, v)) = self.table.pop_back() else {
                break;
            };
            self.size -= n.len() + v.len() + ENTRY_OVERHEAD;
        }
    }
}

fn string(out: &mut Vec<u8>, s: &[u8], huff: bool) {
    if huff {
        put_integer(out, 0x80, 7, huffman::encoded_len(s));
        huffman::encode(s, out);
    } else {
        put_integer(out, 0x00, 7, s.len());
        out.extend_from_slice(s);
    }
}

/// What h2 sees: header blocks decoded with its own table, other frames.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Seen {
    Block {
        stream: u32,
        end_stream: bool,
        fields: Vec<(Vec<u8>, Vec<u8>, bool)>,
    },
    Frame(Vec<u8>),
}

/// Parses `bytes` (the preface, then frames) as h2 reads them; header
/// blocks decode with one decoder for the connection, as h2's does.
/// Checks every frame's size and that blocks are contiguous.
pub fn h2_side(bytes: &[u8]) -> Result<Vec<Seen>, String> {
    let rest = bytes.strip_prefix(PREFACE).ok_or("no preface")?;
    let mut decoder = Decoder::new(HEADER_TABLE_SIZE);
    let mut seen = Vec::new();
    let mut at = 0;
    let mut block: Option<(u32, bool, Vec<u8>)> = None;
    while at < rest.len() {
        let head = rest.get(at..at + 9).ok_or("truncated head")?;
        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let (kind, flags) = (head[3], head[4]);
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]);
        let payload = rest.get(at + 9..at + 9 + len).ok_or("truncated payload")?;
        if len > MAX_FRAME_SIZE {
            return Err(format!("frame of {len} bytes"));
        }
        let whole = &rest[at..at + 9 + len];
        at += 9 + len;
        let fragment = match (kind, &mut block) {
            (HEADERS, None) => {
                let mut p = payload;
                let mut pad = 0;
                if flags & PADDED != 0 {
                    pad = p[0] as usize;
                    p = &p[1..];
                }
                if flags & PRIORITY != 0 {
                    p = &p[5..];
                }
                let fragment = p[..p.len() - pad].to_vec();
                block = Some((stream, flags & END_STREAM != 0, fragment));
                flags & END_HEADERS != 0
            }
            (CONTINUATION, Some((s, _, fragment))) if *s == stream => {
                fragment.extend_from_slice(payload);
                flags & END_HEADERS != 0
            }
            (HEADERS | CONTINUATION, _) => return Err("misplaced header frame".into()),
            (_, Some(_)) => return Err("frame inside a header block".into()),
            (_, None) => {
                seen.push(Seen::Frame(whole.to_vec()));
                false
            }
        };
        if fragment {
            let (stream, end_stream, fragment) = block.take().ok_or("no block")?;
            let mut fields = Vec::new();
            decoder
                .decode(&fragment, MAX_LIST, &mut fields)
                .map_err(|e| format!("h2 cannot decode: {e}"))?;
            let fields = fields
                .into_iter()
                .map(|f| (f.name.to_vec(), f.value.to_vec(), f.never_indexed))
                .collect();
            seen.push(Seen::Block {
                stream,
                end_stream,
                fields,
            });
        }
    }
    Ok(seen)
}

/// Runs `input` through a fresh rewriter in reads of `chunk` bytes;
/// returns h2's bytes and how many went through in place.
pub fn rewrite_in(input: &[u8], chunk: usize) -> (Vec<u8>, usize) {
    let mut r = Rewriter::new();
    let mut out = Vec::new();
    let mut in_place = 0;
    for piece in input.chunks(chunk.max(1)) {
        let passed = r.scan(piece);
        in_place += passed;
        out.extend_from_slice(&piece[..passed]);
        out.extend_from_slice(r.pending());
        r.consume(r.pending().len());
    }
    r.finish();
    out.extend_from_slice(r.pending());
    (out, in_place)
}

/// Runs `input` through a fresh rewriter in one read.
pub fn rewrite(input: &[u8]) -> Vec<u8> {
    rewrite_in(input, input.len()).0
}

/// The test client's gRPC request headers with `authority`.
pub fn request<'a>(path: &'a str, authority: &'a str) -> Vec<(&'a str, &'a str)> {
    vec![
        (":scheme", "http"),
        (":method", "POST"),
        (":authority", authority),
        (":path", path),
        ("te", "trailers"),
        ("content-type", "application/grpc"),
        (
            "user-agent",
            "grpc-python/1.76.0 grpc-c/51.0.0 (linux; chttp2)",
        ),
        ("grpc-accept-encoding", "identity, deflate, gzip"),
    ]
}

/// `fields` as h2 should see them.
pub fn owned(fields: &[(&str, &str)]) -> Vec<(Vec<u8>, Vec<u8>, bool)> {
    fields
        .iter()
        .map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec(), false))
        .collect()
}

/// A connection as C-core opens it on a UNIX socket: two requests with
/// the percent-encoded path (the second's `:authority` indexed), each
/// with a DATA frame, the second block split over CONTINUATION frames.
pub fn sample_stream() -> (Vec<u8>, Vec<u8>) {
    let authority = "%2Ftmp%2Fx%2Fcurator.sock";
    let mut enc = Encoder::new();
    let mut input = start();
    let b1 = enc.block(&request("/a.B/C", authority));
    input.extend(frame(HEADERS, END_HEADERS, 1, &b1));
    input.extend(frame(DATA, END_STREAM, 1, &[0, 0, 0, 0, 0]));
    let b3 = enc.block(&request("/a.B/D", authority));
    let (x, y) = b3.split_at(b3.len() / 2);
    input.extend(frame(HEADERS, 0, 3, &x[..4]));
    input.extend(frame(CONTINUATION, 0, 3, &x[4..]));
    input.extend(frame(CONTINUATION, END_HEADERS, 3, y));
    input.extend(frame(DATA, END_STREAM, 3, &[0, 0, 0, 0, 0]));
    let want = rewrite(&input);
    (input, want)
}
