//! The `loader_state` target: see `testkit/src/fuzz/loader_state.rs` for
//! what is checked of the A/B loader's `loader_state.pb` codec.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| metropolis_testkit::fuzz::loader_state::run(data));
