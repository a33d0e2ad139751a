//! The `agent_loop` target: see `harness/agent.rs` for the input format and
//! what is checked.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| metropolis_fuzz::harness::agent::run(data));
