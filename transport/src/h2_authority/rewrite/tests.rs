//! The rewriter on hand-built frames, and against random header lists.

use proptest::prelude::*;

use super::Rewriter;
use crate::grpc::ServeOptions;
use crate::h2_authority::test_support::*;
use crate::h2_authority::{MAX_FRAME_SIZE, MAX_LIST};

const PERCENT: &str = "%2Ftmp%2Fx%2Fcurator.sock";
const RAW: &str = "/tmp/x/curator.sock";

/// `fields` with every refused `:authority` made `localhost`.
fn replaced(fields: &[(&str, &str)]) -> Vec<(Vec<u8>, Vec<u8>, bool)> {
    let fields: Vec<_> = fields
        .iter()
        .map(|&(n, v)| match (n, v) {
            (":authority", PERCENT | RAW) => (n, "localhost"),
            other => other,
        })
        .collect();
    owned(&fields)
}

fn block(stream: u32, end_stream: bool, fields: Vec<(Vec<u8>, Vec<u8>, bool)>) -> Seen {
    Seen::Block {
        stream,
        end_stream,
        fields,
    }
}

#[test]
fn percent_encoded_and_raw_paths_become_localhost() {
    for authority in [PERCENT, RAW] {
        let fields = request("/a.B/C", authority);
        let mut input = start();
        input.extend(frame(
            HEADERS,
            END_HEADERS,
            1,
            &Encoder::new().block(&fields),
        ));
        let out = rewrite(&input);
        let seen = h2_side(&out).unwrap();
        assert_eq!(seen[0], Seen::Frame(frame(SETTINGS, 0, 0, &[])));
        assert_eq!(seen[1], block(1, false, replaced(&fields)), "{authority}");
        // The block starts by emptying h2's table.
        assert_eq!(out[start().len() + 9], 0x20);
    }
}

/// grpc-go's and grpc-js's `localhost`, hyper's `metropolis`, host:port:
/// the bytes reach h2 exactly as sent, in place.
#[test]
fn acceptable_authorities_pass_byte_for_byte() {
    let mut enc = Encoder::new();
    let mut input = start();
    for (i, authority) in ["localhost", "metropolis", "127.0.0.1:7835", "localhost"]
        .into_iter()
        .enumerate()
    {
        let stream = 2 * i as u32 + 1;
        input.extend(frame(
            HEADERS,
            END_HEADERS,
            stream,
            &enc.block(&request("/a.B/C", authority)),
        ));
        input.extend(frame(DATA, END_STREAM, stream, &[0; 5]));
    }
    let (out, in_place) = rewrite_in(&input, input.len());
    assert_eq!(out, input);
    // Header blocks are held back until complete, the rest goes in place.
    assert!(in_place > 0 && in_place < input.len());
    for chunk in [1, 5, 9, 13, 100] {
        assert_eq!(rewrite_in(&input, chunk).0, input, "chunks of {chunk}");
    }
}

/// The second request names the `:authority` the first one entered into
/// the dynamic table; the third names other entries the first entered
/// (after a rewrite, h2's table no longer has them).
#[test]
fn indexed_authority_and_later_blocks_decode_right_in_h2() {
    let mut enc = Encoder::new();
    let first = request("/a.B/C", PERCENT);
    let second = request("/a.B/D", PERCENT);
    let third = request("/a.B/E", "localhost");
    let (b1, b2, b3) = (enc.block(&first), enc.block(&second), enc.block(&third));
    // The second block refers to `:authority` by index (62 and up).
    assert!(b2.len() < 20 && b2.iter().any(|&b| b >= 0x80 + 62));
    let mut input = start();
    input.extend(frame(HEADERS, END_HEADERS | END_STREAM, 1, &b1));
    input.extend(frame(HEADERS, END_HEADERS | END_STREAM, 3, &b2));
    input.extend(frame(HEADERS, END_HEADERS | END_STREAM, 5, &b3));
    let seen = h2_side(&rewrite(&input)).unwrap();
    assert_eq!(
        seen[1..],
        [
            block(1, true, replaced(&first)),
            block(3, true, replaced(&second)),
            block(5, true, replaced(&third)),
        ]
    );
}

#[test]
fn continuation_frames_in_and_out() {
    // In: HEADERS + two CONTINUATIONs.
    let (input, want) = sample_stream();
    let seen = h2_side(&want).unwrap();
    assert_eq!(
        seen[1],
        block(1, false, replaced(&request("/a.B/C", PERCENT)))
    );
    assert_eq!(seen[2], Seen::Frame(frame(DATA, END_STREAM, 1, &[0; 5])));
    assert_eq!(
        seen[3],
        block(3, false, replaced(&request("/a.B/D", PERCENT)))
    );
    assert_eq!(seen.len(), 5);
    assert_ne!(input, want);
    // Out: a block that re-encodes to more than one frame.
    // (Huffman-coded, 'a' takes 5 bits: two frames in, three out.)
    let big = "a".repeat(40_000);
    let mut fields = request("/a.B/C", RAW);
    fields.push(("x-big", &big));
    let mut input = start();
    input.extend(headers(1, END_STREAM, &Encoder::new().block(&fields)));
    assert_eq!(frames(&input[PREFACE.len()..]).len(), 3);
    let out = rewrite(&input);
    let seen = h2_side(&out).unwrap();
    assert_eq!(seen[1], block(1, true, replaced(&fields)));
    // HEADERS (END_STREAM) + CONTINUATION + CONTINUATION (END_HEADERS).
    let heads: Vec<(u8, u8)> = frames(&out[PREFACE.len()..])
        .into_iter()
        .map(|f| (f[3], f[4]))
        .collect();
    assert_eq!(
        heads,
        [
            (SETTINGS, 0),
            (HEADERS, END_STREAM),
            (CONTINUATION, 0),
            (CONTINUATION, END_HEADERS)
        ]
    );
}

/// The frames in `bytes`.
fn frames(mut bytes: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    while bytes.len() >= 9 {
        let len = u32::from_be_bytes([0, bytes[0], bytes[1], bytes[2]]) as usize;
        out.push(bytes[..9 + len].to_vec());
        bytes = &bytes[9 + len..];
    }
    out
}

#[test]
fn padding_and_priority_are_dropped() {
    let fields = request("/a.B/C", PERCENT);
    let fragment = Encoder::new().block(&fields);
    let mut payload = vec![7];
    payload.extend_from_slice(&[0, 0, 0, 0, 16]);
    payload.extend_from_slice(&fragment);
    payload.extend_from_slice(&[0; 7]);
    let flags = END_HEADERS | END_STREAM | PADDED | PRIORITY;
    let mut input = start();
    input.extend(frame(HEADERS, flags, 1, &payload));
    let out = rewrite(&input);
    let head = &out[start().len()..][..9];
    assert_eq!(head[4], END_HEADERS | END_STREAM);
    assert_eq!(h2_side(&out).unwrap()[1], block(1, true, replaced(&fields)));
    // With an acceptable authority, the padded frame passes as it came.
    let fields = request("/a.B/C", "localhost");
    let fragment = Encoder::new().block(&fields);
    let mut payload = vec![3];
    payload.extend_from_slice(&fragment);
    payload.extend_from_slice(&[0; 3]);
    let mut input = start();
    input.extend(frame(HEADERS, END_HEADERS | PADDED, 1, &payload));
    assert_eq!(rewrite(&input), input);
}

/// Split in two at every byte, and fed byte by byte, the output is the
/// same as fed whole.
#[test]
fn any_split_of_the_reads_gives_the_same_output() {
    let (input, want) = sample_stream();
    for cut in 0..=input.len() {
        let mut r = Rewriter::new();
        let mut out = Vec::new();
        for piece in [&input[..cut], &input[cut..]] {
            let passed = r.scan(piece);
            out.extend_from_slice(&piece[..passed]);
            out.extend_from_slice(r.pending());
            r.consume(r.pending().len());
        }
        assert_eq!(out, want, "cut at {cut}");
    }
    assert_eq!(rewrite_in(&input, 1).0, want);
}

#[test]
fn malformed_streams_pass_as_they_came() {
    let good = Encoder::new().block(&request("/a.B/C", PERCENT));
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("bad preface", b"GET / HTTP/1.1\r\n\r\n".to_vec()),
        (
            "padding over the frame",
            frame(HEADERS, END_HEADERS | PADDED, 1, &[200, 0x82]),
        ),
        ("stream 0", frame(HEADERS, END_HEADERS, 0, &good)),
        (
            "lone CONTINUATION",
            frame(CONTINUATION, END_HEADERS, 1, &good),
        ),
        ("bad HPACK", frame(HEADERS, END_HEADERS, 1, &[0x80])),
        (
            "frame too large",
            frame(HEADERS, END_HEADERS, 1, &vec![0x82; MAX_FRAME_SIZE + 1]),
        ),
        ("PUSH_PROMISE", frame(0x5, END_HEADERS, 1, &good)),
        ("DATA inside a block", {
            let mut f = frame(HEADERS, 0, 1, &good);
            f.extend(frame(DATA, 0, 1, &[1]));
            f.extend(frame(CONTINUATION, END_HEADERS, 1, &[]));
            f
        }),
        ("CONTINUATION on another stream", {
            let mut f = frame(HEADERS, 0, 1, &good);
            f.extend(frame(CONTINUATION, END_HEADERS, 3, &[]));
            f
        }),
    ];
    for (what, bytes) in cases {
        let mut input = if what == "bad preface" {
            Vec::new()
        } else {
            start()
        };
        input.extend(bytes);
        // Anything after it passes too, even a block to rewrite.
        input.extend(frame(HEADERS, END_HEADERS, 5, &good));
        for chunk in [1, 10, input.len()] {
            assert_eq!(
                rewrite_in(&input, chunk).0,
                input,
                "{what}, chunks of {chunk}"
            );
        }
    }
}

/// Once h2's table diverged, a block the client broke must not reach h2
/// as it came: h2 might decode it with its own table.
#[test]
fn after_a_rewrite_a_broken_block_is_made_undecodable() {
    let mut enc = Encoder::new();
    let mut input = start();
    input.extend(frame(
        HEADERS,
        END_HEADERS,
        1,
        &enc.block(&request("/a.B/C", PERCENT)),
    ));
    // Index 70 exists in no table of this connection: h2 must not see it.
    input.extend(frame(HEADERS, END_HEADERS, 3, &[0x82, 0x80 | 70]));
    input.extend(frame(DATA, 0, 3, &[1, 2, 3]));
    let out = rewrite(&input);
    let tail = frame(HEADERS, END_HEADERS, 3, &[0x80]);
    let mut after = tail.clone();
    after.extend(frame(DATA, 0, 3, &[1, 2, 3]));
    assert!(out.ends_with(&after), "{out:02x?}");
}

/// A self-dependent HEADERS frame: h2 resets the stream without decoding
/// its block, so it goes through as it came (and the table still follows
/// the client).
#[test]
fn self_dependent_headers_pass_as_they_came() {
    let mut enc = Encoder::new();
    let fields = request("/a.B/C", PERCENT);
    let mut payload = vec![0, 0, 0, 1, 16];
    payload.extend(enc.block(&fields));
    let mut input = start();
    let raw = frame(HEADERS, END_HEADERS | PRIORITY, 1, &payload);
    input.extend(raw.clone());
    input.extend(frame(
        HEADERS,
        END_HEADERS,
        3,
        &enc.block(&request("/a.B/D", PERCENT)),
    ));
    let out = rewrite(&input);
    assert_eq!(&out[start().len()..][..raw.len()], &raw[..]);
    let rest = &out[start().len() + raw.len()..];
    let mut model = PREFACE.to_vec();
    model.extend_from_slice(rest);
    assert_eq!(
        h2_side(&model).unwrap()[0],
        block(3, false, replaced(&request("/a.B/D", PERCENT)))
    );
}

#[test]
fn bounds_cover_what_the_server_accepts() {
    let serve = ServeOptions::default();
    assert!(MAX_LIST >= 4 * serve.limits.max_header_list_size as usize);
}

/// One field of a random request: name, value, representation, Huffman.
fn field() -> impl Strategy<Value = (String, String, Repr, bool)> {
    let name = prop_oneof![
        Just("content-type".to_string()),
        Just("user-agent".to_string()),
        Just("grpc-timeout".to_string()),
        Just("authorization".to_string()),
        "x-[a-z]{1,6}",
    ];
    let value = prop_oneof![
        Just("application/grpc".to_string()),
        "[ -~]{0,40}",
        "[a-z]{0,300}"
    ];
    let repr = prop_oneof![
        Just(Repr::Index),
        Just(Repr::Incremental),
        Just(Repr::Without),
        Just(Repr::Never)
    ];
    (name, value, repr, any::<bool>())
}

/// A random request: an authority (or none), up to 12 other fields, how
/// many bytes the HEADERS frame carries, whether to pad it, and a dynamic
/// table size update to start the block with.
type Request = (
    Option<String>,
    Vec<(String, String, Repr, bool)>,
    usize,
    bool,
    Option<usize>,
);

fn request_strategy() -> impl Strategy<Value = Request> {
    let authority = prop_oneof![
        Just(Some(PERCENT.to_string())),
        Just(Some(RAW.to_string())),
        Just(Some("localhost".to_string())),
        Just(Some("metropolis:7835".to_string())),
        Just(None),
    ];
    let size_update = prop_oneof![
        6 => Just(None),
        1 => Just(Some(0)),
        1 => Just(Some(200)),
        1 => Just(Some(4096)),
    ];
    (
        authority,
        prop::collection::vec(field(), 0..12),
        1usize..64,
        any::<bool>(),
        size_update,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// For random requests on one connection, h2 decodes (with its own
    /// table) exactly what the client encoded, with only each refused
    /// `:authority` replaced; a connection without one passes unchanged.
    #[test]
    fn h2_decodes_the_client_list_with_only_the_authority_replaced(
        requests in prop::collection::vec(request_strategy(), 1..6),
        chunk in 1usize..200,
    ) {
        let mut enc = Encoder::new();
        let mut input = start();
        let mut want = vec![Seen::Frame(frame(SETTINGS, 0, 0, &[]))];
        let mut refused = false;
        for (i, (authority, fields, first_len, pad, update)) in requests.iter().enumerate() {
            let stream = 2 * i as u32 + 1;
            let mut list: Vec<(Vec<u8>, Vec<u8>, bool)> = Vec::new();
            let mut fragment = Vec::new();
            if let Some(size) = update {
                enc.size_update(&mut fragment, *size);
            }
            enc.field(&mut fragment, b":method", b"POST", Repr::Index, true);
            list.push((b":method".to_vec(), b"POST".to_vec(), false));
            if let Some(a) = authority {
                enc.field(&mut fragment, b":authority", a.as_bytes(), Repr::Index, i % 2 == 0);
                let bad = a == PERCENT || a == RAW;
                refused |= bad;
                let seen = if bad { "localhost" } else { a.as_str() };
                list.push((b":authority".to_vec(), seen.as_bytes().to_vec(), false));
            }
            for (n, v, repr, huff) in fields {
                enc.field(&mut fragment, n.as_bytes(), v.as_bytes(), *repr, *huff);
                list.push((n.as_bytes().to_vec(), v.as_bytes().to_vec(), *repr == Repr::Never));
            }
            let end_stream = i % 3 == 0;
            let cut = (*first_len).min(fragment.len());
            let (x, y) = fragment.split_at(cut);
            let mut payload = Vec::new();
            let mut flags = if end_stream { END_STREAM } else { 0 };
            if *pad {
                payload.push(2);
                flags |= PADDED;
            }
            payload.extend_from_slice(x);
            if *pad {
                payload.extend_from_slice(&[0, 0]);
            }
            if y.is_empty() {
                input.extend(frame(HEADERS, flags | END_HEADERS, stream, &payload));
            } else {
                input.extend(frame(HEADERS, flags, stream, &payload));
                input.extend(frame(CONTINUATION, END_HEADERS, stream, y));
            }
            input.extend(frame(DATA, END_STREAM, stream, &[0, 0, 0, 0, 0]));
            want.push(Seen::Block { stream, end_stream, fields: list });
            want.push(Seen::Frame(frame(DATA, END_STREAM, stream, &[0, 0, 0, 0, 0])));
        }
        let (out, _) = rewrite_in(&input, chunk);
        prop_assert_eq!(h2_side(&out).unwrap(), want);
        if !refused {
            prop_assert_eq!(out, input);
        }
    }
}
