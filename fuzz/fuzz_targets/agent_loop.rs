//! The `agent_loop` target: see `testkit/src/fuzz/agent.rs` for the input format and
//! what is checked.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| metropolis_testkit::fuzz::agent::run(data));
