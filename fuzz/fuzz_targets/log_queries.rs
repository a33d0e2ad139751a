//! The `log_queries` target: see `harness/logs.rs` for the input format and
//! what is checked.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| metropolis_fuzz::harness::logs::run(data));
