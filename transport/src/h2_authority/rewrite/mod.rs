//! The sans-IO rewriter of a client's HTTP/2 byte stream: frames pass
//! through as they are, except header blocks with an `:authority` that h2
//! would refuse, which are re-encoded with `localhost` in its place; and,
//! once one was, every later header block (see the module doc of
//! [`super`] for why).

use super::hpack::{Decoder, Field, put_field};
use super::{HEADER_TABLE_SIZE, MAX_BLOCK, MAX_FRAME_SIZE, MAX_LIST, REPLACEMENT};

/// The client connection preface (RFC 9113, section 3.4).
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Frame types and flags (RFC 9113, section 6).
const HEADERS: u8 = 0x1;
const PUSH_PROMISE: u8 = 0x5;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;

/// Where the rewriter is in the byte stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Inside the connection preface, this many bytes of it seen.
    Preface(usize),
    /// Reading a frame head (`Rewriter::head` holds what came so far).
    Head,
    /// Passing this many more payload bytes of a frame through.
    Skip(usize),
    /// Collecting this many more payload bytes of a HEADERS (or
    /// CONTINUATION) frame of `len` bytes with `flags`.
    Collect {
        remaining: usize,
        len: usize,
        continuation: bool,
        flags: u8,
    },
    /// Passing everything through: the stream is not one this rewriter
    /// follows (malformed, or over its bounds), and h2 will deal with it.
    Blind,
}

/// The header block being collected.
#[derive(Clone, Copy, Debug)]
struct Block {
    stream_id: u32,
    end_stream: bool,
    /// The HEADERS frame depends on its own stream: h2 resets the stream
    /// without decoding the block, so it goes through as it came.
    self_dependent: bool,
}

/// Rewrites the client-to-server half of one HTTP/2 connection. Feed it
/// what the client sent with [`Rewriter::scan`]; what h2 should read is
/// the leading bytes `scan` passes, then [`Rewriter::pending`].
#[derive(Debug)]
pub(crate) struct Rewriter {
    state: State,
    /// A frame head under way, and how many of its bytes came.
    head: [u8; 9],
    head_len: usize,
    /// The frames of the header block under way, as they came.
    held: Vec<u8>,
    /// The HPACK fragments of the header block under way.
    fragment: Vec<u8>,
    block: Option<Block>,
    /// The client's dynamic table, mirrored.
    decoder: Decoder,
    /// Decoded fields of the current block (kept for its allocation).
    fields: Vec<Field>,
    /// Whether a block was re-encoded: h2's dynamic table no longer
    /// follows the client's, so every block is re-encoded from now on.
    rewriting: bool,
    /// Output after the passed prefix, from `pending_from` on.
    pending: Vec<u8>,
    pending_from: usize,
}

impl Default for Rewriter {
    fn default() -> Self {
        Self::new()
    }
}

impl Rewriter {
    /// A rewriter at the start of a connection.
    pub fn new() -> Self {
        Rewriter {
            state: State::Preface(0),
            head: [0; 9],
            head_len: 0,
            held: Vec::new(),
            fragment: Vec::new(),
            block: None,
            decoder: Decoder::new(HEADER_TABLE_SIZE),
            fields: Vec::new(),
            rewriting: false,
            pending: Vec::new(),
            pending_from: 0,
        }
    }

    /// Whether a header block was re-encoded on this connection.
    #[cfg(test)]
    pub fn has_rewritten(&self) -> bool {
        self.rewriting
    }

    /// Takes in `input`, the next bytes from the client. Returns how many
    /// of its leading bytes go to h2 unchanged, in place; the rest were
    /// taken in, and what h2 reads after those leading bytes is
    /// [`Rewriter::pending`] (now or once more input completes a block).
    pub fn scan(&mut self, input: &[u8]) -> usize {
        let mut out = Out {
            prefix: 0,
            absorbing: !self.pending().is_empty() || self.holding(),
        };
        let mut i = 0;
        while i < input.len() {
            let rest = &input[i..];
            match self.state {
                State::Blind => {
                    self.pass(&mut out, rest);
                    i = input.len();
                }
                State::Preface(seen) => {
                    let take = rest.len().min(PREFACE.len() - seen);
                    if rest[..take] != PREFACE[seen..seen + take] {
                        self.state = State::Blind;
                        continue;
                    }
                    self.pass(&mut out, &rest[..take]);
                    i += take;
                    let seen = seen + take;
                    self.state = if seen == PREFACE.len() {
                        State::Head
                    } else {
                        State::Preface(seen)
                    };
                }
                State::Head => {
                    let take = rest.len().min(9 - self.head_len);
                    self.head[self.head_len..self.head_len + take].copy_from_slice(&rest[..take]);
                    self.head_len += take;
                    i += take;
                    // A partial head ends the input; it is held (not in
                    // the prefix) and the next scan starts absorbing.
                    if self.head_len == 9 {
                        self.head_len = 0;
                        self.on_head(&mut out);
                    }
                }
                State::Skip(remaining) => {
                    let take = rest.len().min(remaining);
                    self.pass(&mut out, &rest[..take]);
                    i += take;
                    self.state = if take == remaining {
                        State::Head
                    } else {
                        State::Skip(remaining - take)
                    };
                }
                State::Collect {
                    remaining,
                    len,
                    continuation,
                    flags,
                } => {
                    let take = rest.len().min(remaining);
                    self.held.extend_from_slice(&rest[..take]);
                    i += take;
                    if take == remaining {
                        self.on_frame(len, continuation, flags);
                    } else {
                        self.state = State::Collect {
                            remaining: remaining - take,
                            len,
                            continuation,
                            flags,
                        };
                    }
                }
            }
        }
        out.prefix
    }

    /// The client's stream ended: what was held goes to h2 as it came.
    pub fn finish(&mut self) {
        self.go_blind();
    }

    /// Output waiting for h2 after the bytes [`Rewriter::scan`] passed.
    pub fn pending(&self) -> &[u8] {
        &self.pending[self.pending_from..]
    }

    /// Marks the first `n` bytes of [`Rewriter::pending`] as read by h2.
    pub fn consume(&mut self, n: usize) {
        self.pending_from = (self.pending_from + n).min(self.pending.len());
        if self.pending_from == self.pending.len() {
            self.pending.clear();
            self.pending_from = 0;
            if self.pending.capacity() > 4 * MAX_FRAME_SIZE {
                self.pending = Vec::new();
            }
        }
    }

    /// Whether bytes that came are held back (a frame head or header
    /// block under way).
    fn holding(&self) -> bool {
        self.head_len > 0 || matches!(self.state, State::Collect { .. }) || self.block.is_some()
    }

    /// Passes `bytes` (the next input bytes, or copies of held ones) on.
    fn pass(&mut self, out: &mut Out, bytes: &[u8]) {
        if out.absorbing {
            self.pending.extend_from_slice(bytes);
        } else {
            out.prefix += bytes.len();
        }
    }

    /// A frame head is complete in `self.head`.
    fn on_head(&mut self, out: &mut Out) {
        let head = self.head;
        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let (kind, flags) = (head[3], head[4]);
        let stream_id = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        let fits = len <= MAX_FRAME_SIZE && self.held.len() + 9 + len <= MAX_BLOCK;
        let starts = match self.block {
            Some(block) => kind == CONTINUATION && stream_id == block.stream_id && fits,
            None if kind == HEADERS && stream_id != 0 && fits => {
                self.block = Some(Block {
                    stream_id,
                    end_stream: flags & END_STREAM != 0,
                    self_dependent: false,
                });
                true
            }
            None if matches!(kind, HEADERS | CONTINUATION | PUSH_PROMISE) => false,
            None => {
                self.pass(out, &head);
                self.state = if len == 0 {
                    State::Head
                } else {
                    State::Skip(len)
                };
                return;
            }
        };
        if !starts {
            // Malformed or over the bounds: h2 refuses it.
            self.go_blind();
            self.pass(out, &head);
            return;
        }
        out.absorbing = true;
        self.held.extend_from_slice(&head);
        self.state = State::Collect {
            remaining: len,
            len,
            continuation: kind == CONTINUATION,
            flags,
        };
        if len == 0 {
            self.on_frame(0, kind == CONTINUATION, flags);
        }
    }

    /// A frame of the header block under way is complete (its payload is
    /// the last `len` bytes held).
    fn on_frame(&mut self, len: usize, continuation: bool, flags: u8) {
        self.state = State::Head;
        let payload = &self.held[self.held.len() - len..];
        let fragment = if continuation {
            Some(payload)
        } else {
            headers_fragment(payload, flags)
        };
        let Some(fragment) = fragment else {
            self.go_blind();
            return;
        };
        self.fragment.extend_from_slice(fragment);
        if !continuation
            && flags & PRIORITY != 0
            && let Some(block) = self.block.as_mut()
        {
            let at = usize::from(flags & PADDED != 0);
            let dep = u32::from_be_bytes([
                payload[at],
                payload[at + 1],
                payload[at + 2],
                payload[at + 3],
            ]);
            block.self_dependent = dep & 0x7fff_ffff == block.stream_id;
        }
        if flags & END_HEADERS != 0 {
            self.finish_block();
        }
    }

    /// The header block under way is complete: passes it on as it came,
    /// or re-encoded.
    fn finish_block(&mut self) {
        let Some(block) = self.block.take() else {
            return;
        };
        self.fields.clear();
        let decoded = self
            .decoder
            .decode(&self.fragment, MAX_LIST, &mut self.fields);
        if decoded.is_err() {
            if self.rewriting {
                // h2's table is not the client's: the raw block could
                // decode there. A block h2 cannot decode ends the
                // connection as the client's would.
                put_frames(
                    &mut self.pending,
                    block.stream_id,
                    block.end_stream,
                    &[0x80],
                );
                self.held.clear();
            }
            self.go_blind();
            return;
        }
        let refused = self.fields.iter().any(refused_authority);
        if block.self_dependent || (!self.rewriting && !refused) {
            self.pending.extend_from_slice(&self.held);
        } else {
            let mut encoded = std::mem::take(&mut self.fragment);
            encoded.clear();
            if !self.rewriting {
                // Empties h2's table, which nothing refers to any more.
                encoded.push(0x20);
                self.rewriting = true;
            }
            for field in &self.fields {
                let value = if refused_authority(field) {
                    REPLACEMENT
                } else {
                    &field.value[..]
                };
                put_field(&mut encoded, &field.name, value, field.never_indexed);
            }
            put_frames(
                &mut self.pending,
                block.stream_id,
                block.end_stream,
                &encoded,
            );
            self.fragment = encoded;
        }
        self.held.clear();
        self.fragment.clear();
        if self.held.capacity() > 2 * MAX_FRAME_SIZE {
            self.held = Vec::new();
            self.fragment = Vec::new();
        }
        self.fields.clear();
    }

    /// Stops following the stream: what was held goes on as it came.
    fn go_blind(&mut self) {
        self.pending.extend_from_slice(&self.held);
        self.pending.extend_from_slice(&self.head[..self.head_len]);
        self.held = Vec::new();
        self.fragment = Vec::new();
        self.head_len = 0;
        self.block = None;
        self.state = State::Blind;
    }
}

/// How the bytes of one [`Rewriter::scan`] go out.
struct Out {
    /// Leading input bytes passed in place.
    prefix: usize,
    /// Whether output now goes to `pending` (a byte was held back).
    absorbing: bool,
}

/// The HPACK fragment of a HEADERS frame's payload: without its padding
/// and priority fields; `None` when those do not fit.
fn headers_fragment(payload: &[u8], flags: u8) -> Option<&[u8]> {
    let mut start = 0;
    let mut pad = 0;
    if flags & PADDED != 0 {
        pad = usize::from(*payload.first()?);
        start = 1;
    }
    if flags & PRIORITY != 0 {
        start += 5;
    }
    let end = payload.len().checked_sub(pad)?;
    payload.get(start..end)
}

/// Whether `field` is an `:authority` h2 would refuse (and UTF-8: one that
/// is not ends the connection in h2's decoder, and still should).
fn refused_authority(field: &Field) -> bool {
    field.name == ":authority"
        && std::str::from_utf8(&field.value).is_ok()
        && http::uri::Authority::try_from(&field.value[..]).is_err()
}

/// Appends `block` as a HEADERS frame on `stream_id`, continued in
/// CONTINUATION frames when it does not fit one frame.
fn put_frames(out: &mut Vec<u8>, stream_id: u32, end_stream: bool, block: &[u8]) {
    let mut chunks = block.chunks(MAX_FRAME_SIZE).peekable();
    let mut kind = HEADERS;
    let mut flags = if end_stream { END_STREAM } else { 0 };
    loop {
        let chunk = chunks.next().unwrap_or(&[]);
        let last = chunks.peek().is_none();
        if last {
            flags |= END_HEADERS;
        }
        let len = (chunk.len() as u32).to_be_bytes();
        out.extend_from_slice(&[len[1], len[2], len[3], kind, flags]);
        out.extend_from_slice(&stream_id.to_be_bytes());
        out.extend_from_slice(chunk);
        if last {
            return;
        }
        kind = CONTINUATION;
        flags = 0;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
