//! The local socket takes the `:authority` of every gRPC stack: the
//! percent-encoded socket path (gRPC C-core), the raw path (grpc-java),
//! one indexed from the dynamic table, and `localhost` (grpc-go), in
//! hand-built HTTP/2 over a real UNIX socket to a real daemon. Without the
//! rewriter, h2 resets the first three streams with PROTOCOL_ERROR.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use metropolis_tests::{Daemon, RuntimeKind, against_both_runtimes};
use metropolis_transport::h2_authority::{self, Decoder};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const GOAWAY: u8 = 0x7;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const WATCH: &str = "/metropolis.node.core.curator.proto.api.Curator/Watch";

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = (payload.len() as u32).to_be_bytes();
    let mut f = vec![len[1], len[2], len[3], kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// An HPACK string literal, not Huffman-coded (lengths under 127).
fn string(out: &mut Vec<u8>, s: &str) {
    assert!(s.len() < 127);
    out.push(s.len() as u8);
    out.extend_from_slice(s.as_bytes());
}

/// How a request names its `:authority`.
enum Authority<'a> {
    /// A literal entered into the dynamic table (as C-core sends it).
    Indexing(&'a str),
    /// A literal without indexing.
    Literal(&'a str),
    /// The dynamic table's newest entry (index 62).
    Indexed,
}

/// The header block of a `Watch` request.
fn watch_block(authority: Authority) -> Vec<u8> {
    let mut b = vec![0x83, 0x86]; // :method POST, :scheme http
    b.push(0x04); // :path, without indexing
    string(&mut b, WATCH);
    match authority {
        Authority::Indexing(a) => {
            b.push(0x41);
            string(&mut b, a);
        }
        Authority::Literal(a) => {
            b.push(0x01);
            string(&mut b, a);
        }
        Authority::Indexed => b.push(0x80 | 62),
    }
    b.push(0x00);
    string(&mut b, "te");
    string(&mut b, "trailers");
    b.push(0x0f); // content-type (31), without indexing
    b.push(31 - 15);
    string(&mut b, "application/grpc");
    b
}

/// A gRPC message: `WatchRequest { nodes_in_cluster: {} }`.
const WATCH_NODES: [u8; 7] = [0, 0, 0, 0, 2, 0x12, 0x00];

/// What the server said on one stream.
#[derive(Default, Debug)]
struct Reply {
    headers: Vec<(String, String)>,
    data: usize,
    reset: Option<u32>,
}

/// Sends `requests` (stream id, header block) on one connection and reads
/// until each stream got its response headers and a message, or a reset.
async fn exchange(socket: &std::path::Path, requests: &[(u32, Vec<u8>)]) -> BTreeMap<u32, Reply> {
    let mut s = UnixStream::connect(socket).await.unwrap();
    let mut out = PREFACE.to_vec();
    out.extend(frame(SETTINGS, 0, 0, &[]));
    for (stream, block) in requests {
        out.extend(frame(HEADERS, END_HEADERS, *stream, block));
        out.extend(frame(DATA, END_STREAM, *stream, &WATCH_NODES));
    }
    s.write_all(&out).await.unwrap();

    let mut decoder = Decoder::new(4096);
    let mut replies: BTreeMap<u32, Reply> = BTreeMap::new();
    let done = |r: &BTreeMap<u32, Reply>| {
        requests.iter().all(|(id, _)| {
            r.get(id)
                .is_some_and(|r| r.reset.is_some() || (!r.headers.is_empty() && r.data > 0))
        })
    };
    let mut saw_settings = false;
    while !done(&replies) {
        let mut head = [0u8; 9];
        s.read_exact(&mut head).await.unwrap();
        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        let mut payload = vec![0; len];
        s.read_exact(&mut payload).await.unwrap();
        match head[3] {
            SETTINGS if head[4] & 1 == 0 => {
                check_server_settings(&payload);
                saw_settings = true;
                s.write_all(&frame(SETTINGS, 1, 0, &[])).await.unwrap();
            }
            HEADERS => {
                assert_eq!(head[4] & 0x28, 0, "no padding or priority from h2");
                assert_ne!(head[4] & END_HEADERS, 0, "small headers fit one frame");
                let mut fields = Vec::new();
                decoder.decode(&payload, 1 << 20, &mut fields).unwrap();
                let reply = replies.entry(stream).or_default();
                for f in fields {
                    let name = String::from_utf8(f.name.to_vec()).unwrap();
                    let value = String::from_utf8(f.value.to_vec()).unwrap();
                    reply.headers.push((name, value));
                }
            }
            DATA => replies.entry(stream).or_default().data += len,
            RST_STREAM => {
                let code = u32::from_be_bytes(payload[..4].try_into().unwrap());
                replies.entry(stream).or_default().reset = Some(code);
            }
            GOAWAY => panic!("GOAWAY: {payload:02x?}"),
            _ => {}
        }
    }
    assert!(saw_settings);
    replies
}

/// The server's SETTINGS agree with what the rewriter assumes.
fn check_server_settings(payload: &[u8]) {
    for setting in payload.chunks(6) {
        let id = u16::from_be_bytes([setting[0], setting[1]]);
        let value = u32::from_be_bytes(setting[2..6].try_into().unwrap()) as usize;
        match id {
            0x1 => assert_eq!(value, h2_authority::HEADER_TABLE_SIZE, "HEADER_TABLE_SIZE"),
            0x5 => assert_eq!(value, h2_authority::MAX_FRAME_SIZE, "MAX_FRAME_SIZE"),
            0x6 => assert!(
                4 * value <= h2_authority::MAX_LIST,
                "MAX_HEADER_LIST_SIZE {value}"
            ),
            _ => {}
        }
    }
}

/// Each stream was answered: `:status` 200, gRPC's content type, and a
/// WatchEvent (not a reset).
fn assert_served(replies: &BTreeMap<u32, Reply>, what: &[(u32, &str)]) {
    for (id, what) in what {
        let reply = &replies[id];
        assert_eq!(reply.reset, None, "{what}: stream {id} reset");
        let has = |n: &str, v: &str| reply.headers.iter().any(|(a, b)| a == n && b == v);
        assert!(has(":status", "200"), "{what}: {:?}", reply.headers);
        assert!(
            has("content-type", "application/grpc"),
            "{what}: {:?}",
            reply.headers
        );
        assert!(reply.data > 5, "{what}: no WatchEvent");
    }
}

async fn every_stacks_authority_is_served(rt: RuntimeKind) {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("d"), rt);
    let path = d.socket.to_str().unwrap().to_string();
    let percent = path.replace('/', "%2F");
    let requests = [
        (1, watch_block(Authority::Indexing(&percent))),
        (3, watch_block(Authority::Indexed)),
        (5, watch_block(Authority::Literal(&path))),
        (7, watch_block(Authority::Literal("localhost"))),
    ];
    let replies = tokio::time::timeout(Duration::from_secs(20), exchange(&d.socket, &requests))
        .await
        .expect("replies within 20 s");
    assert_served(
        &replies,
        &[
            (1, "percent-encoded path"),
            (3, "indexed percent-encoded path"),
            (5, "raw path"),
            (7, "localhost after a rewrite"),
        ],
    );

    // A connection that never needs a rewrite (grpc-go's `localhost`).
    let requests = [
        (1, watch_block(Authority::Indexing("localhost"))),
        (3, watch_block(Authority::Indexed)),
    ];
    let replies = tokio::time::timeout(Duration::from_secs(20), exchange(&d.socket, &requests))
        .await
        .expect("replies within 20 s");
    assert_served(&replies, &[(1, "localhost"), (3, "indexed localhost")]);
}

against_both_runtimes!(every_stacks_authority_is_served);
