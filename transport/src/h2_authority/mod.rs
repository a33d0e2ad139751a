//! Makes the `:authority` of every gRPC stack acceptable to h2 on the
//! local UNIX socket.
//!
//! gRPC C-core (Python `grpcio`, C++, Ruby, PHP) sends the percent-encoded
//! socket path as `:authority` on a UNIX-socket channel
//! (`%2Ftmp%2Fx%2Fcurator.sock`), grpc-java and grpc-swift the raw path.
//! h2, under hyper, refuses both as malformed and resets each stream with
//! PROTOCOL_ERROR before the service sees it (hyperium/h2#487), and has no
//! option against it. grpc-go and grpc-js send `localhost`, which h2 takes.
//!
//! `RewriteAuthority` wraps a local-socket connection's IO in front of
//! hyper, and its sans-IO `Rewriter` edits what the client sends:
//!
//! - The preface and every frame pass through byte for byte, except
//!   header blocks (HEADERS plus CONTINUATION frames). Each block is
//!   collected and HPACK-decoded with a decoder that mirrors the client
//!   encoder's dynamic table (bounded by the 4096 bytes hyper's
//!   SETTINGS_HEADER_TABLE_SIZE leaves at the protocol default).
//! - A block whose `:authority` h2 would refuse (valid UTF-8, not an
//!   [`http::uri::Authority`]) is re-encoded with `localhost` in its place,
//!   as a HEADERS frame and CONTINUATION frames of at most 16384 bytes (the
//!   SETTINGS_MAX_FRAME_SIZE hyper announces, also the protocol's floor),
//!   keeping END_STREAM, dropping the padding and priority fields (h2 does
//!   not use priorities).
//! - Blocks with an acceptable `:authority` pass through unchanged, so a
//!   grpc-go or grpc-js client's bytes reach h2 exactly as sent, until a
//!   block of the connection was re-encoded.
//!
//! Why every block is re-encoded after the first one: h2 decodes with its
//! own copy of the dynamic table, which stays equal to the client's only
//! while h2 decodes exactly the client's bytes. A re-encoded block cannot
//! insert what the client's block inserted (the refused `:authority`
//! would enter h2's list too), and entries of another size would also
//! evict differently, so from then on the client's indices mean nothing
//! to h2. The re-encoded blocks therefore use no dynamic table at all:
//! indexed static entries, and literals without indexing (or never
//! indexed, as the client sent them), so h2's table stays empty (the
//! first re-encoded block starts with a size update to 0, which frees
//! it) and correct for every later block. Translating indices into a
//! table the rewriter would keep for h2 instead would save bytes on a
//! UNIX socket, where they are cheap, at the cost of an HPACK encoder.
//!
//! Anything malformed or over the bounds goes to h2 as it came, for h2 to
//! refuse as it would (the rewriter then stops following the stream):
//! a bad preface; a header frame over 16384 bytes, on stream 0, or a
//! block over `MAX_BLOCK` bytes; a CONTINUATION out of place; padding
//! longer than its frame; a PUSH_PROMISE; a block that does not decode or
//! whose header list exceeds [`MAX_LIST`] bytes. Once a block was
//! re-encoded, h2 could decode a client's broken block with its
//! diverged table, so such a block is replaced by one that cannot decode
//! (index 0), which ends the connection as the original would. One
//! difference remains: after a re-encoded block, a request whose header
//! list exceeds h2's 64 KiB limit may end the connection (h2 bounds the
//! CONTINUATION frames of a block) where h2 would only refuse the stream.
//!
//! Cost, per header block of a local-socket connection: the block is
//! copied once more (held until complete) and HPACK-decoded, Huffman
//! strings included, about 1 µs for a gRPC request of 8 fields; once
//! rewriting, it is also re-encoded, about 1.5 µs in all, and what h2
//! reads grows from the client's 8 to 15 bytes (fields indexed) to about
//! 150 (literals). (Measured over 200,000 requests on a loaded 2-core
//! machine, this crate at opt-level 3.) Other frames pass in place when
//! a read holds whole frames; bytes behind a held-back header block in
//! the same read are copied once more. Memory: the block under way, at
//! most `MAX_BLOCK` bytes and released after a large one, and the
//! mirrored dynamic table, at most 4 KiB.

mod hpack;
mod huffman;
mod io;
mod rewrite;

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod test_support;

// The decoder and the server's settings it assumes are public for the
// end-to-end test (tests/tests/h2_authority.rs), which reads h2's answers
// with it; the rewriter is this crate's own (`listen.rs`).
pub use hpack::{DecodeError, Decoder, Field};
pub(crate) use io::RewriteAuthority;

/// What replaces a refused `:authority`.
pub(crate) const REPLACEMENT: &[u8] = b"localhost";

/// The server's SETTINGS_HEADER_TABLE_SIZE: hyper sends none, so the
/// protocol default; the most a client's dynamic table may hold.
pub const HEADER_TABLE_SIZE: usize = 4096;

/// The largest frame payload a client may send and the rewriter writes:
/// hyper's SETTINGS_MAX_FRAME_SIZE (16384, also the protocol's minimum).
pub const MAX_FRAME_SIZE: usize = 16384;

/// The largest header block (its frames, heads included) the rewriter
/// collects: more than h2 takes (one HEADERS and at most six
/// CONTINUATION frames of 16384 bytes with the server's 64 KiB header
/// list limit).
pub(crate) const MAX_BLOCK: usize = 8 * (9 + MAX_FRAME_SIZE);

/// The largest decoded header list the rewriter handles: four times the
/// server's header list limit, where h2 ends the connection too.
pub const MAX_LIST: usize = 4 * 64 * 1024;
