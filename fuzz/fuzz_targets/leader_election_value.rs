//! The `leader_election_value` target: see `testkit/src/fuzz/election_value.rs` for the input format and
//! what is checked.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| metropolis_testkit::fuzz::election_value::run(data));
