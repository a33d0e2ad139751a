//! HPACK (RFC 7541) as the rewriter needs it: a decoder that mirrors the
//! dynamic table of a client's encoder, and an encoder that never touches
//! the dynamic table (indexed static entries and literals without
//! indexing only), so what it writes leaves the peer's table as it was.

use std::collections::VecDeque;

use bytes::Bytes;

use super::huffman::{self, HuffmanError};

/// The static table (RFC 7541, Appendix A); index `i` is `STATIC[i - 1]`.
#[rustfmt::skip]
pub(crate) const STATIC: [(&str, &str); 61] = [
    (":authority", ""), (":method", "GET"), (":method", "POST"), (":path", "/"),
    (":path", "/index.html"), (":scheme", "http"), (":scheme", "https"),
    (":status", "200"), (":status", "204"), (":status", "206"), (":status", "304"),
    (":status", "400"), (":status", "404"), (":status", "500"), ("accept-charset", ""),
    ("accept-encoding", "gzip, deflate"), ("accept-language", ""), ("accept-ranges", ""),
    ("accept", ""), ("access-control-allow-origin", ""), ("age", ""), ("allow", ""),
    ("authorization", ""), ("cache-control", ""), ("content-disposition", ""),
    ("content-encoding", ""), ("content-language", ""), ("content-length", ""),
    ("content-location", ""), ("content-range", ""), ("content-type", ""), ("cookie", ""),
    ("date", ""), ("etag", ""), ("expect", ""), ("expires", ""), ("from", ""), ("host", ""),
    ("if-match", ""), ("if-modified-since", ""), ("if-none-match", ""), ("if-range", ""),
    ("if-unmodified-since", ""), ("last-modified", ""), ("link", ""), ("location", ""),
    ("max-forwards", ""), ("proxy-authenticate", ""), ("proxy-authorization", ""),
    ("range", ""), ("referer", ""), ("refresh", ""), ("retry-after", ""), ("server", ""),
    ("set-cookie", ""), ("strict-transport-security", ""), ("transfer-encoding", ""),
    ("user-agent", ""), ("vary", ""), ("via", ""), ("www-authenticate", ""),
];

/// What an entry costs in the dynamic table beyond its name and value
/// (RFC 7541, section 4.1); also the per-field overhead of a header list's
/// size (RFC 9113, section 6.5.2).
pub const ENTRY_OVERHEAD: usize = 32;

/// Integers longer than this many octets are refused (as h2 does: the
/// value stays below 2^28 + 2^8).
const MAX_INTEGER_OCTETS: usize = 5;

/// One decoded header field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Field {
    /// Its name, as sent (HPACK does not check it).
    pub name: Bytes,
    /// Its value, as sent.
    pub value: Bytes,
    /// Sent as a literal "never indexed" (RFC 7541, section 6.2.3): whoever
    /// re-encodes it must keep that.
    pub never_indexed: bool,
}

impl Field {
    /// Its size in a header list or the dynamic table.
    pub fn size(&self) -> usize {
        self.name.len() + self.value.len() + ENTRY_OVERHEAD
    }
}

/// Why a header block does not decode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// The block ends inside a representation.
    Truncated,
    /// An integer longer than 5 octets.
    IntegerTooLong,
    /// An index that is 0 or past the end of both tables.
    BadIndex,
    /// A Huffman-coded string that does not decode.
    Huffman(HuffmanError),
    /// A dynamic table size update after a field, or above the limit the
    /// decoder's side announced.
    BadSizeUpdate,
    /// The decoded header list is larger than the caller's limit.
    ListTooLarge,
}

impl From<HuffmanError> for DecodeError {
    fn from(e: HuffmanError) -> Self {
        DecodeError::Huffman(e)
    }
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match self {
            DecodeError::Truncated => "header block ends inside a representation",
            DecodeError::IntegerTooLong => "integer longer than 5 octets",
            DecodeError::BadIndex => "table index out of range",
            DecodeError::Huffman(HuffmanError::Eos) => "EOS in a Huffman-coded string",
            DecodeError::Huffman(HuffmanError::Padding) => "bad Huffman padding",
            DecodeError::BadSizeUpdate => "misplaced or too large table size update",
            DecodeError::ListTooLarge => "header list over the limit",
        };
        f.write_str(what)
    }
}

impl std::error::Error for DecodeError {}

/// An HPACK decoder: decodes whole header blocks in order, keeping the
/// dynamic table the encoder on the other side keeps.
#[derive(Debug)]
pub struct Decoder {
    /// Newest entry first.
    table: VecDeque<(Bytes, Bytes)>,
    /// The sum of the entries' sizes.
    size: usize,
    /// The table's current maximum size (the encoder's last size update).
    max_size: usize,
    /// The most a size update may set: SETTINGS_HEADER_TABLE_SIZE as the
    /// decoder's side announced it.
    limit: usize,
}

impl Decoder {
    /// A decoder whose side announced `limit` as its
    /// SETTINGS_HEADER_TABLE_SIZE (4096 unless it sent one).
    pub fn new(limit: usize) -> Self {
        Decoder {
            table: VecDeque::new(),
            size: 0,
            max_size: limit,
            limit,
        }
    }

    /// The dynamic table's size now (the sum of its entries' sizes).
    pub fn table_size(&self) -> usize {
        self.size
    }

    /// Decodes the complete header block `block`, appending its fields to
    /// `fields` and updating the dynamic table. Fails when the block is
    /// malformed or its header list exceeds `list_limit` bytes; the table
    /// is then left part-updated (the connection cannot go on anyway).
    pub fn decode(
        &mut self,
        block: &[u8],
        list_limit: usize,
        fields: &mut Vec<Field>,
    ) -> Result<(), DecodeError> {
        let mut pos = 0;
        let mut list_size = 0usize;
        let mut any_field = false;
        while let Some(&first) = block.get(pos) {
            let field = if first & 0x80 != 0 {
                let index = integer(block, &mut pos, 7)?;
                let (name, value) = self.entry(index)?;
                Field {
                    name,
                    value,
                    never_indexed: false,
                }
            } else if first & 0x40 != 0 {
                let field = self.literal(block, &mut pos, 6, false)?;
                self.insert(field.name.clone(), field.value.clone());
                field
            } else if first & 0x20 != 0 {
                let size = integer(block, &mut pos, 5)?;
                if any_field || size > self.limit {
                    return Err(DecodeError::BadSizeUpdate);
                }
                self.max_size = size;
                self.evict_to(size);
                continue;
            } else {
                self.literal(block, &mut pos, 4, first & 0x10 != 0)?
            };
            any_field = true;
            list_size += field.size();
            if list_size > list_limit {
                return Err(DecodeError::ListTooLarge);
            }
            fields.push(field);
        }
        Ok(())
    }

    /// The entry at `index` of the static then dynamic table.
    fn entry(&self, index: usize) -> Result<(Bytes, Bytes), DecodeError> {
        match index {
            0 => Err(DecodeError::BadIndex),
            1..=61 => {
                let (name, value) = STATIC[index - 1];
                Ok((
                    Bytes::from_static(name.as_bytes()),
                    Bytes::from_static(value.as_bytes()),
                ))
            }
            _ => self
                .table
                .get(index - 62)
                .cloned()
                .ok_or(DecodeError::BadIndex),
        }
    }

    /// A literal field whose name index has a `prefix`-bit prefix.
    fn literal(
        &self,
        block: &[u8],
        pos: &mut usize,
        prefix: u8,
        never_indexed: bool,
    ) -> Result<Field, DecodeError> {
        let index = integer(block, pos, prefix)?;
        let name = if index == 0 {
            string(block, pos)?
        } else {
            self.entry(index)?.0
        };
        let value = string(block, pos)?;
        Ok(Field {
            name,
            value,
            never_indexed,
        })
    }

    /// Adds an entry, evicting the oldest ones to make room; an entry
    /// larger than the table empties it and is not added (section 4.4).
    fn insert(&mut self, name: Bytes, value: Bytes) {
        let size = name.len() + value.len() + ENTRY_OVERHEAD;
        if size > self.max_size {
            self.evict_to(0);
            return;
        }
        self.evict_to(self.max_size - size);
        self.size += size;
        self.table.push_front((name, value));
    }

    /// Evicts the oldest entries until the table's size is at most `size`.
    fn evict_to(&mut self, size: usize) {
        while self.size > size {
            match self.table.pop_back() {
                Some((n, v)) => self.size -= n.len() + v.len() + ENTRY_OVERHEAD,
                None => break,
            }
        }
    }
}

/// Decodes an integer with a `prefix`-bit prefix at `block[*pos]`
/// (section 5.1), advancing `pos`.
fn integer(block: &[u8], pos: &mut usize, prefix: u8) -> Result<usize, DecodeError> {
    let mask = (1u8 << prefix) - 1;
    let first = *block.get(*pos).ok_or(DecodeError::Truncated)? & mask;
    *pos += 1;
    if first < mask {
        return Ok(usize::from(first));
    }
    let mut value = usize::from(mask);
    for octet in 1..MAX_INTEGER_OCTETS {
        let b = *block.get(*pos).ok_or(DecodeError::Truncated)?;
        *pos += 1;
        value += usize::from(b & 0x7f) << (7 * (octet - 1));
        if b & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(DecodeError::IntegerTooLong)
}

/// Decodes a string literal at `block[*pos]` (section 5.2), advancing `pos`.
fn string(block: &[u8], pos: &mut usize) -> Result<Bytes, DecodeError> {
    let huffman = block.get(*pos).is_some_and(|b| b & 0x80 != 0);
    let len = integer(block, pos, 7)?;
    let end = pos.checked_add(len).ok_or(DecodeError::Truncated)?;
    let raw = block.get(*pos..end).ok_or(DecodeError::Truncated)?;
    *pos = end;
    if huffman {
        let mut out = Vec::new();
        huffman::decode(raw, &mut out)?;
        Ok(out.into())
    } else {
        Ok(Bytes::copy_from_slice(raw))
    }
}

/// Appends `value` with a `prefix`-bit prefix whose first octet carries
/// the representation bits `flags` (section 5.1).
pub(crate) fn put_integer(out: &mut Vec<u8>, flags: u8, prefix: u8, value: usize) {
    let mask = (1usize << prefix) - 1;
    if value < mask {
        out.push(flags | value as u8);
        return;
    }
    out.push(flags | mask as u8);
    let mut rest = value - mask;
    while rest >= 0x80 {
        out.push(0x80 | (rest & 0x7f) as u8);
        rest >>= 7;
    }
    out.push(rest as u8);
}

/// Appends a raw (not Huffman-coded) string literal.
fn put_string(out: &mut Vec<u8>, s: &[u8]) {
    put_integer(out, 0x00, 7, s.len());
    out.extend_from_slice(s);
}

/// Appends `name: value` without touching the dynamic table: as an indexed
/// static entry when one matches exactly, else as a literal without
/// indexing ("never indexed" when `never_indexed`), naming a static entry
/// when one has the name. At most `name + value + 9` bytes for fields
/// under 16 KiB, so never more than the field's list size.
pub(crate) fn put_field(out: &mut Vec<u8>, name: &[u8], value: &[u8], never_indexed: bool) {
    let mut name_index = 0;
    for (i, (n, v)) in STATIC.iter().enumerate() {
        if n.as_bytes() == name {
            if !never_indexed && v.as_bytes() == value {
                put_integer(out, 0x80, 7, i + 1);
                return;
            }
            if name_index == 0 {
                name_index = i + 1;
            }
        }
    }
    let flags = if never_indexed { 0x10 } else { 0x00 };
    put_integer(out, flags, 4, name_index);
    if name_index == 0 {
        put_string(out, name);
    }
    put_string(out, value);
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
