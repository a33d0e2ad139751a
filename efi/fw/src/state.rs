//! `\EFI\metropolis\loader_state.pb` and the choice of the slot to boot.
//!
//! The file is a protobuf `ABLoaderData { Slot active_slot = 1; Slot
//! next_slot = 2; }` with `enum Slot { SLOT_NONE = 0; SLOT_A = 1; SLOT_B =
//! 2; }` (docs: docs/spec/metropolis-install.md, section 3).
//! Decoded by hand: two varint fields, unknown fields skipped, anything
//! malformed treated as a missing file. Plain Rust, tested on the host.

/// The path of the state file on the ESP.
pub const STATE_PATH: &str = "\\EFI\\metropolis\\loader_state.pb";

/// The largest state file read; a longer one counts as undecodable.
pub const MAX_STATE_LEN: usize = 4096;

/// The wire value of `SLOT_NONE`.
pub const SLOT_NONE: i32 = 0;
/// The wire value of `SLOT_A`.
pub const SLOT_A: i32 = 1;
/// The wire value of `SLOT_B`.
pub const SLOT_B: i32 = 2;

/// One of the two system slots.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slot {
    /// Slot A, `\EFI\metropolis\boot-a.efi`.
    A,
    /// Slot B, `\EFI\metropolis\boot-b.efi`.
    B,
}

impl Slot {
    /// The slot a wire value names, if any (`SLOT_NONE` and unknown values
    /// name none).
    pub fn from_wire(value: i32) -> Option<Slot> {
        match value {
            SLOT_A => Some(Slot::A),
            SLOT_B => Some(Slot::B),
            _ => None,
        }
    }

    /// The other slot.
    pub fn other(self) -> Slot {
        match self {
            Slot::A => Slot::B,
            Slot::B => Slot::A,
        }
    }

    /// `"A"` or `"B"`.
    pub fn name(self) -> &'static str {
        match self {
            Slot::A => "A",
            Slot::B => "B",
        }
    }

    /// The slot's EFI program on the ESP.
    pub fn path(self) -> &'static str {
        match self {
            Slot::A => "\\EFI\\metropolis\\boot-a.efi",
            Slot::B => "\\EFI\\metropolis\\boot-b.efi",
        }
    }
}

/// The decoded `ABLoaderData`, enum values as they are on the wire
/// (proto3 enums are open: an unknown value is kept, not an error).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoaderData {
    /// `active_slot`, field 1.
    pub active_slot: i32,
    /// `next_slot`, field 2.
    pub next_slot: i32,
}

/// Reads a base-128 varint at `*pos`, advancing it; `None` when truncated
/// or longer than 10 bytes.
fn varint(bytes: &[u8], pos: &mut usize) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..70).step_by(7) {
        let byte = *bytes.get(*pos)?;
        *pos += 1;
        // The tenth byte holds the 64th bit alone: more overflows, and
        // protobuf (prost, as the reference's loader) refuses it.
        if shift == 63 && byte > 1 {
            return None;
        }
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

/// Skips `n` bytes at `*pos`; `None` when fewer are left.
fn skip(bytes: &[u8], pos: &mut usize, n: u64) -> Option<()> {
    let left = (bytes.len() - *pos) as u64;
    if n > left {
        return None;
    }
    *pos += n as usize;
    Some(())
}

impl LoaderData {
    /// Decodes the file's bytes; `None` when they are not a well-formed
    /// message (a known field with another wire type, a truncated field,
    /// a group, field number 0). Unknown fields are skipped; of repeated
    /// occurrences of a field the last wins, as in protobuf.
    pub fn decode(bytes: &[u8]) -> Option<LoaderData> {
        let mut data = LoaderData::default();
        let mut pos = 0;
        while pos < bytes.len() {
            let key = varint(bytes, &mut pos)?;
            let field = key >> 3;
            if field == 0 || field > u64::from(u32::MAX >> 3) {
                return None;
            }
            match (field, key & 7) {
                // An int32 enum: the low 32 bits of the varint.
                (1, 0) => data.active_slot = varint(bytes, &mut pos)? as u32 as i32,
                (2, 0) => data.next_slot = varint(bytes, &mut pos)? as u32 as i32,
                (1 | 2, _) => return None,
                (_, 0) => {
                    varint(bytes, &mut pos)?;
                }
                (_, 1) => skip(bytes, &mut pos, 8)?,
                (_, 2) => {
                    let len = varint(bytes, &mut pos)?;
                    skip(bytes, &mut pos, len)?;
                }
                (_, 5) => skip(bytes, &mut pos, 4)?,
                _ => return None,
            }
        }
        Some(data)
    }

    /// Encodes the message into `buf`, returning the bytes written. Fields
    /// holding 0 are left out (proto3); a negative value takes ten bytes,
    /// as protobuf encodes negative int32s.
    pub fn encode(self, buf: &mut [u8; ENCODED_MAX]) -> &[u8] {
        let mut len = 0;
        for (key, value) in [(0x08u8, self.active_slot), (0x10u8, self.next_slot)] {
            if value == 0 {
                continue;
            }
            buf[len] = key;
            len += 1;
            let mut v = i64::from(value) as u64;
            loop {
                let low = (v & 0x7f) as u8;
                v >>= 7;
                if v == 0 {
                    buf[len] = low;
                    len += 1;
                    break;
                }
                buf[len] = low | 0x80;
                len += 1;
            }
        }
        &buf[..len]
    }
}

/// The longest encoding of a [`LoaderData`]: two keys and two ten-byte
/// varints.
pub const ENCODED_MAX: usize = 22;

/// What the loader found at [`STATE_PATH`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Found {
    /// No file (or no readable one).
    Missing,
    /// A file that is not a well-formed `ABLoaderData`, or too long.
    Undecodable,
    /// A decoded file.
    Data(LoaderData),
}

impl Found {
    /// Classifies the bytes of a file that was read (`None`: longer than
    /// [`MAX_STATE_LEN`]).
    pub fn from_bytes(bytes: Option<&[u8]>) -> Found {
        match bytes.and_then(LoaderData::decode) {
            Some(data) => Found::Data(data),
            None => Found::Undecodable,
        }
    }
}

/// Which slot to boot and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    /// The slot to start first (the other one is the fallback).
    pub slot: Slot,
    /// When `next_slot` asked for a one-time boot: the state to write
    /// before booting, `next_slot` cleared and `active_slot` kept.
    pub rewrite: Option<LoaderData>,
    /// Why this slot, for the console.
    pub reason: &'static str,
}

impl Plan {
    /// The contract: a missing or undecodable file, or an invalid slot,
    /// means slot A (so does `active_slot` NONE); a `next_slot` other than
    /// NONE is booted once (an invalid one meaning A), after the file is
    /// rewritten without it.
    pub fn choose(found: Found) -> Plan {
        let data = match found {
            Found::Missing => {
                return Plan {
                    slot: Slot::A,
                    rewrite: None,
                    reason: "no loader_state.pb",
                };
            }
            Found::Undecodable => {
                return Plan {
                    slot: Slot::A,
                    rewrite: None,
                    reason: "loader_state.pb undecodable",
                };
            }
            Found::Data(data) => data,
        };
        if data.next_slot != SLOT_NONE {
            let (slot, reason) = match Slot::from_wire(data.next_slot) {
                Some(slot) => (slot, "next_slot, once"),
                None => (Slot::A, "next_slot invalid, once"),
            };
            return Plan {
                slot,
                rewrite: Some(LoaderData {
                    active_slot: data.active_slot,
                    next_slot: SLOT_NONE,
                }),
                reason,
            };
        }
        Plan::active(data)
    }

    /// The plan ignoring `next_slot`: the active slot (when the one-time
    /// boot cannot be recorded, the loader falls back to this).
    pub fn active(data: LoaderData) -> Plan {
        match (data.active_slot, Slot::from_wire(data.active_slot)) {
            (_, Some(slot)) => Plan {
                slot,
                rewrite: None,
                reason: "active_slot",
            },
            (SLOT_NONE, None) => Plan {
                slot: Slot::A,
                rewrite: None,
                reason: "active_slot NONE",
            },
            (_, None) => Plan {
                slot: Slot::A,
                rewrite: None,
                reason: "active_slot invalid",
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(active_slot: i32, next_slot: i32) -> LoaderData {
        LoaderData {
            active_slot,
            next_slot,
        }
    }

    #[test]
    fn decodes_the_fields_and_skips_unknown_ones() {
        assert_eq!(LoaderData::decode(&[]), Some(data(0, 0)));
        assert_eq!(LoaderData::decode(&[0x08, 2]), Some(data(2, 0)));
        assert_eq!(LoaderData::decode(&[0x08, 1, 0x10, 2]), Some(data(1, 2)));
        assert_eq!(LoaderData::decode(&[0x10, 2, 0x08, 1]), Some(data(1, 2)));
        // The last occurrence wins.
        assert_eq!(LoaderData::decode(&[0x08, 1, 0x08, 2]), Some(data(2, 0)));
        // Unknown fields of every wire type but groups.
        let unknown = [
            0x18, 0xff, 0x01, // 3: varint
            0x21, 1, 2, 3, 4, 5, 6, 7, 8, // 4: fixed64
            0x2a, 3, b'a', b'b', b'c', // 5: bytes
            0x35, 1, 2, 3, 4, // 6: fixed32
            0x08, 2, // active_slot B
            0x80, 0x01, 0x05, // 16: varint, two-byte key
        ];
        assert_eq!(LoaderData::decode(&unknown), Some(data(2, 0)));
        // An unknown enum value is kept; a negative one too.
        assert_eq!(LoaderData::decode(&[0x10, 7]), Some(data(0, 7)));
        let minus_one = [
            0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
        ];
        assert_eq!(LoaderData::decode(&minus_one), Some(data(-1, 0)));
        // A value beyond 32 bits keeps its low 32 bits, as int32 does.
        let wide = [0x08, 0x81, 0x80, 0x80, 0x80, 0x10];
        assert_eq!(LoaderData::decode(&wide), Some(data(1, 0)));
    }

    #[test]
    fn malformed_is_none() {
        for bad in [
            &[0x08][..],         // value missing
            &[0x08, 0x80],       // truncated varint
            &[0x80],             // truncated key
            &[0x00, 0x01],       // field 0
            &[0x0a, 0x01, 0x02], // field 1 as bytes
            &[0x15, 1, 2, 3, 4], // field 2 as fixed32
            &[0x1a, 0x05, 1, 2], // bytes past the end
            &[0x21, 1, 2, 3],    // fixed64 past the end
            &[0x1b, 0x1c],       // a group
            &[0x1f],             // wire type 7
            &[
                0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
            ], // 11-byte varint
            &[
                0x1a, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
            ], // huge length
            // Found by the `loader_state` fuzz target: a tenth varint byte
            // over 1 overflows 64 bits; prost refuses it.
            &[
                0x10, 0xbf, 0x98, 0xe2, 0x98, 0xe2, 0x98, 0xe2, 0xef, 0xef, 0x30,
            ],
        ] {
            assert_eq!(LoaderData::decode(bad), None, "{bad:02x?}");
        }
    }

    #[test]
    fn encode_round_trips() {
        for d in [
            data(0, 0),
            data(1, 0),
            data(2, 0),
            data(1, 2),
            data(0, 2),
            data(7, 0),
            data(-1, i32::MIN),
            data(i32::MAX, 1),
        ] {
            let mut buf = [0; ENCODED_MAX];
            let bytes = d.encode(&mut buf);
            assert_eq!(LoaderData::decode(bytes), Some(d), "{bytes:02x?}");
        }
        let mut buf = [0; ENCODED_MAX];
        assert_eq!(data(0, 0).encode(&mut buf), &[] as &[u8]);
        assert_eq!(data(1, 0).encode(&mut buf), &[0x08, 1]);
        assert_eq!(data(2, 1).encode(&mut buf), &[0x08, 2, 0x10, 1]);
        assert_eq!(data(-1, -1).encode(&mut buf).len(), ENCODED_MAX);
    }

    #[test]
    fn the_plan_follows_the_contract() {
        let plan = Plan::choose;
        let boots = |found| {
            let p = plan(found);
            (p.slot, p.rewrite)
        };
        assert_eq!(boots(Found::Missing), (Slot::A, None));
        assert_eq!(boots(Found::Undecodable), (Slot::A, None));
        assert_eq!(boots(Found::from_bytes(None)), (Slot::A, None));
        assert_eq!(boots(Found::from_bytes(Some(&[0x08]))), (Slot::A, None));
        assert_eq!(boots(Found::Data(data(0, 0))), (Slot::A, None));
        assert_eq!(boots(Found::Data(data(1, 0))), (Slot::A, None));
        assert_eq!(boots(Found::Data(data(2, 0))), (Slot::B, None));
        assert_eq!(boots(Found::Data(data(3, 0))), (Slot::A, None));
        assert_eq!(boots(Found::Data(data(-2, 0))), (Slot::A, None));
        // next_slot: once, cleared first, active_slot kept as it was.
        assert_eq!(boots(Found::Data(data(1, 2))), (Slot::B, Some(data(1, 0))));
        assert_eq!(boots(Found::Data(data(2, 1))), (Slot::A, Some(data(2, 0))));
        assert_eq!(boots(Found::Data(data(0, 2))), (Slot::B, Some(data(0, 0))));
        assert_eq!(boots(Found::Data(data(9, 2))), (Slot::B, Some(data(9, 0))));
        // An invalid next_slot means A, once.
        assert_eq!(boots(Found::Data(data(2, 5))), (Slot::A, Some(data(2, 0))));
        assert_eq!(Plan::active(data(2, 1)).slot, Slot::B);
        assert_eq!(Plan::active(data(0, 2)).slot, Slot::A);
    }

    #[test]
    fn slots() {
        assert_eq!(Slot::A.other(), Slot::B);
        assert_eq!(Slot::B.other(), Slot::A);
        assert_eq!(Slot::B.path(), "\\EFI\\metropolis\\boot-b.efi");
        assert_eq!(Slot::from_wire(SLOT_NONE), None);
    }
}
