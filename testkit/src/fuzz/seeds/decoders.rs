//! Seeds of the decoder targets: election values, stored records and
//! trace pipe reads. (`peer_certificate`'s are real certificates, which
//! the PKI's tests write: the test kit does not depend on the PKI.)

use metropolis_core::provisioning::MachineRecord;
use metropolis_proto::prelude::storage::{LeaderElectionValue, NodeRecord};
use metropolis_proto::prelude::{agent, common};
use prost::Message;

use super::super::input::Writer;
use super::super::records::{NODE_KEY, valid_request};
use super::Seeds;

fn value(node: &str, address: &str) -> Vec<u8> {
    LeaderElectionValue {
        node_id: node.into(),
        ttl: 60,
        curator_address: address.into(),
        schema_version: 1,
    }
    .encode_to_vec()
}

fn put(w: &mut Writer, k: u8, value: &[u8]) {
    w.u8(0).u8(k).lp(value);
}

/// `leader_election_value` seeds: a usable leader, this node's own value,
/// no address, garbage, a value replaced, a leader deleted with a
/// successor, compaction and a broken watch in between.
pub fn election() -> Seeds {
    let other = value("node-b", "10.0.0.2:7835");
    let mut out = Vec::new();
    let mut w = Writer::new();
    w.short_string("node-a");
    put(&mut w, 0, &other);
    out.push(("follow".to_string(), w.finish()));

    w.short_string("node-a");
    put(&mut w, 1, &value("node-a", "10.0.0.1:7835"));
    put(&mut w, 2, &other);
    w.u8(1).u8(1);
    out.push(("own-then-other".to_string(), w.finish()));

    w.short_string("");
    put(&mut w, 0, &value("node-b", ""));
    put(&mut w, 0, b"\xff\xff\xff");
    put(&mut w, 0, &other);
    out.push(("unusable-then-usable".to_string(), w.finish()));

    w.short_string("node-c");
    put(&mut w, 0, &other);
    put(&mut w, 1, &value("node-d", "[::1]:7835"));
    w.u8(2);
    w.u8(1).u8(0);
    w.u8(3);
    put(&mut w, 1, &value("node-d", "[::1]:7836"));
    w.u8(1).u8(1);
    put(&mut w, 3, &[]);
    out.push(("succession".to_string(), w.finish()));

    // Unknown fields, a repeated field and a truncated one.
    let mut odd = other.clone();
    odd.extend_from_slice(&[0x2a, 0x03, b'x', b'y', b'z', 0x1a, 0x01, b'q']);
    w.short_string("node-a");
    put(&mut w, 0, &odd);
    put(&mut w, 0, &odd[..odd.len() - 1]);
    out.push(("odd-encodings".to_string(), w.finish()));
    out
}

fn heartbeat(generation: Option<(i64, bool)>) -> agent::HeartbeatRequest {
    use agent::os_installation_report::{Error, Result as R, Success};
    agent::HeartbeatRequest {
        machine_id: "m".into(),
        hardware_report: Some(agent::AgentHardwareReport::default()),
        installation_report: generation.map(|(generation, ok)| agent::OsInstallationReport {
            generation,
            result: Some(if ok {
                R::Success(Success {})
            } else {
                R::Error(Error {
                    error: "disk full".into(),
                })
            }),
        }),
    }
}

fn machine_seed(now: i64, record: &MachineRecord) -> Vec<u8> {
    let mut w = Writer::new();
    w.u8(0).u64(now as u64).bytes(&record.encode());
    w.finish()
}

fn node_seed(record: &NodeRecord) -> Vec<u8> {
    let mut w = Writer::new();
    w.u8(1).bytes(&record.encode_to_vec());
    w.finish()
}

/// `stored_records` seeds: machine records fresh, with a request, with
/// reports of several generations; node records with and without status,
/// of a future schema, and not a record at all.
pub fn records() -> Seeds {
    let now = 1_700_000_000_000;
    let mut out = Vec::new();
    let mut record = MachineRecord::new("3f5c2c1e-0000-4000-8000-000000000001", [7; 32]);
    out.push(("machine-new".to_string(), machine_seed(now, &record)));
    if record.submit_request(&valid_request(), now).is_ok() {
        let _ = record.handle_heartbeat(&heartbeat(None), now + 1);
        out.push(("machine-requested".to_string(), machine_seed(now, &record)));
    }
    for g in 2..20 {
        let _ = record.submit_request(&valid_request(), now + g);
        let _ = record.handle_heartbeat(&heartbeat(Some((g, g % 3 == 0))), now + g);
    }
    out.push(("machine-history".to_string(), machine_seed(-1, &record)));
    let node = NodeRecord {
        schema_version: 1,
        id: NODE_KEY.into(),
        public_key: vec![1; 32].into(),
        roles: Some(common::NodeRoles::default()),
        status: Some(common::NodeStatus {
            external_address: "10.0.0.5".into(),
            ..Default::default()
        }),
        state: common::NodeState::Up as i32,
    };
    out.push(("node".to_string(), node_seed(&node)));
    let bare = NodeRecord {
        status: None,
        roles: None,
        ..node.clone()
    };
    out.push(("node-bare".to_string(), node_seed(&bare)));
    let future = NodeRecord {
        schema_version: 2,
        ..node
    };
    out.push(("node-future".to_string(), node_seed(&future)));
    out.push(("node-garbage".to_string(), vec![1, 0xff, 0xff, 0x01]));
    out
}

/// `trace_pipe_lines` seeds: lines split across reads, empty lines, a
/// character split between reads, invalid UTF-8, a line just over the
/// limit, an end of stream with a partial line, reuse after it; limits
/// of 0, 16, 64 and the largest the harness allows.
pub fn lines() -> Seeds {
    let mut out = Vec::new();
    let mut w = Writer::new();
    w.u16(64);
    w.u8(0)
        .lp(b"  <idle>-0  [000] d.h1 12.345: irq_handler_entry: irq=1\n  bash-1");
    w.u8(0).lp(b"2 [001] ..s. 12.4: sched_switch\n\n\nx");
    w.u8(3);
    out.push(("reads".to_string(), w.finish()));
    w.u16(16);
    w.u8(0).lp("caf\u{e9} \u{1f600}".as_bytes().split_at(4).0);
    w.u8(1).lp(&"caf\u{e9} \u{1f600}\n".as_bytes()[4..]);
    w.u8(0).lp(b"\xff\xfe\xc3\n\xe2\x82");
    w.u8(3);
    out.push(("utf8".to_string(), w.finish()));
    let limit = crate::fuzz::lines::MAX_LINE_LIMIT - 1;
    let max = u32::from(limit);
    w.u16(limit);
    w.u8(2).u8(b'a');
    w.bytes(&(max + 1).to_le_bytes());
    w.u8(0).lp(b"tail\n");
    w.u8(2).u8(b'b');
    w.bytes(&(max - 2).to_le_bytes());
    w.u8(0).lp(b"cd");
    w.u8(2).u8(b'\n');
    w.bytes(&3u32.to_le_bytes());
    w.u8(3).u8(3);
    out.push(("long-lines".to_string(), w.finish()));
    w.u16(0);
    w.u8(1).lp(b"a\nbc");
    w.u8(0).lp(b"\n");
    w.u8(3);
    out.push(("no-wait".to_string(), w.finish()));
    out
}

/// `loader_state` seeds: files the node's OS writes, and a few it must
/// not (an invalid slot, a group).
pub fn loader_state() -> Seeds {
    [
        ("empty", &b""[..]),
        ("active-b", b"\x08\x02"),
        ("active-a-next-b", b"\x08\x01\x10\x02"),
        ("next-invalid", b"\x10\xff\xff\xff\xff\x0f"),
        ("group", b"\x0b\x0c"),
    ]
    .into_iter()
    .map(|(name, bytes)| (name.to_string(), bytes.to_vec()))
    .collect()
}
