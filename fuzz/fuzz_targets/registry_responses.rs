//! The `registry_responses` target: see `agent/src/install/fuzz.rs` for the
//! input format and what is checked.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| bmaas_agent::fuzz::registry_responses(data));
