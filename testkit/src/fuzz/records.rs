//! `stored_records`: the machine and node records as the services read
//! them back from the store: [`MachineRecord::decode`] (AgentCallback and
//! the machine management calls) and the curator's
//! [`decode_record`]/[`cached_node`] (node status updates, the watch
//! cache).
//!
//! Input: a selector byte, then the stored value (the rest). Selector
//! bit 0 clear: a machine record; then a wall-clock instant for the
//! record's views (the `i64` of bytes 1..9), the value after it. Set: a
//! node record under `/nodes/<id>`, the value right after the selector.
//!
//! Checked: decoding never panics and fails only with the decoders' own
//! errors, whose messages stay short (at most [`MAX_MESSAGE`] bytes). A
//! decoded machine record keeps its invariants (at most
//! [`MAX_REPORTS`] reports, every generation issued, the request's bytes
//! decoding to its generation), answers its queries at any instant, and
//! re-encodes to a record that decodes equal; a request submitted to it
//! gets its next generation (or the typed exhaustion error) and the
//! record still round-trips. A decoded node record has a schema version
//! this build reads, re-encodes to a value that decodes equal, and its
//! cache entry is the record's API view.

use std::time::Duration;

use bytes::Bytes;
use metropolis_core::curator::{
    NODE_RECORD_SCHEMA, NODES_PREFIX, RecordError as NodeRecordError, api_node, cached_node,
    decode_record,
};
use metropolis_core::provisioning::{
    MAX_REPORTS, MachineRecord, RecordError as MachineRecordError, RequestError,
};
use metropolis_core::store::KeyValue;
use metropolis_proto::prelude::{agent, curator};
use prost::Message;

use super::input::Input;

/// The longest error message accepted (they quote no stored bytes but
/// the key, and decoder errors).
pub const MAX_MESSAGE: usize = 1024;

/// The node key the node records are read from.
pub const NODE_KEY: &str = "metropolis-000102030405060708090a0b0c0d0e0f";

/// A valid installation request, as an operator submits it.
pub fn valid_request() -> Vec<u8> {
    agent::OsInstallationRequest {
        generation: 0,
        r#type: Some(agent::os_installation_request::Type::Metropolis(
            agent::MetropolisInstallationRequest {
                root_device: "/dev/vda".into(),
                ..Default::default()
            },
        )),
    }
    .encode_to_vec()
}

fn check_machine_invariants(record: &MachineRecord) {
    assert!(
        record.reports.len() <= MAX_REPORTS,
        "{} reports",
        record.reports.len()
    );
    let next = record.next_generation();
    assert!(next >= 1, "next generation {next}");
    for (generation, report) in &record.reports {
        assert_eq!(
            *generation, report.generation,
            "a report filed under another generation"
        );
        assert!(
            (1..next).contains(generation),
            "report of generation {generation} never issued"
        );
    }
    if let Some(request) = &record.request {
        assert!(
            (1..next).contains(&request.generation),
            "request never issued"
        );
        let decoded = agent::OsInstallationRequest::decode(request.encoded.as_ref());
        assert_eq!(
            decoded.map(|r| r.generation).ok(),
            Some(request.generation),
            "the request's bytes carry another generation"
        );
    }
}

fn round_trip(record: &MachineRecord) {
    match MachineRecord::decode(&record.encode()) {
        Ok(again) => assert_eq!(&again, record, "a re-encoded record decodes otherwise"),
        Err(e) => panic!("a re-encoded record does not decode: {e}"),
    }
}

fn machine(now_unix_ms: i64, value: &[u8]) {
    let mut record = match MachineRecord::decode(value) {
        Ok(record) => record,
        Err(e) => {
            assert!(
                matches!(
                    e,
                    MachineRecordError::Malformed(_)
                        | MachineRecordError::SchemaVersion { .. }
                        | MachineRecordError::Field { .. }
                ),
                "{e:?}"
            );
            let message = e.to_string();
            assert!(
                message.len() <= MAX_MESSAGE,
                "a {}-byte error",
                message.len()
            );
            return;
        }
    };
    check_machine_invariants(&record);
    round_trip(&record);
    // The queries the services make, at any instant.
    let _ = record.is_lost(now_unix_ms, Duration::from_secs(60));
    let _ = record.is_lost(now_unix_ms, Duration::MAX);
    if let Some(pending) = record.pending_request() {
        assert!(
            !record.reports.contains_key(&pending.generation),
            "pending yet reported"
        );
    }
    if let Some(latest) = record.latest_report() {
        assert_eq!(record.reports.keys().next_back(), Some(&latest.generation));
    }
    let next = record.next_generation();
    match record.submit_request(&valid_request(), now_unix_ms) {
        Ok(request) => {
            assert_eq!(request.generation, next, "a request got another generation");
            assert_eq!(record.current_generation(), Some(next));
            check_machine_invariants(&record);
            round_trip(&record);
        }
        Err(RequestError::GenerationExhausted) => assert_eq!(next, i64::MAX),
        Err(e) => panic!("a valid request was refused: {e}"),
    }
}

fn node(value: &[u8]) {
    let mut key = NODES_PREFIX.to_vec();
    key.extend_from_slice(NODE_KEY.as_bytes());
    let kv = KeyValue {
        key: Bytes::from(key),
        value: Bytes::copy_from_slice(value),
        create_revision: 1,
        mod_revision: 2,
        version: 1,
        lease: 0,
    };
    let decoded = decode_record(&kv);
    let cached = cached_node(&kv);
    let record = match decoded {
        Ok(record) => record,
        Err(e) => {
            assert!(
                matches!(
                    e,
                    NodeRecordError::Decode { .. } | NodeRecordError::UnknownSchema { .. }
                ),
                "{e:?}"
            );
            assert_eq!(cached.err(), Some(e.clone()), "the cache read it otherwise");
            let message = e.to_string();
            assert!(
                message.len() <= MAX_MESSAGE,
                "a {}-byte error",
                message.len()
            );
            return;
        }
    };
    assert!(
        record.schema_version <= NODE_RECORD_SCHEMA,
        "schema {}",
        record.schema_version
    );
    let again = Bytes::from(record.encode_to_vec());
    let kv2 = KeyValue {
        value: again,
        ..kv.clone()
    };
    assert_eq!(
        decode_record(&kv2).ok(),
        Some(record.clone()),
        "no round trip"
    );
    let Ok(cached) = cached else {
        panic!("the record decodes, its cache entry does not");
    };
    assert_eq!(&*cached.id, record.id.as_str());
    assert_eq!(cached.revision, kv.mod_revision);
    assert_eq!(
        curator::Node::decode(cached.encoded.as_ref()).ok(),
        Some(api_node(&record)),
        "the cache entry is not the record's view"
    );
}

/// Runs one input.
pub fn run(data: &[u8]) {
    let mut input = Input::new(data);
    if input.u8() & 1 == 0 {
        let now = input.u64() as i64;
        machine(now, input.rest());
    } else {
        node(input.rest());
    }
}
