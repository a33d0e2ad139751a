//! The `log_queries` target: see `testkit/src/fuzz/logs.rs` for the input format and
//! what is checked.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| metropolis_testkit::fuzz::logs::run(data));
