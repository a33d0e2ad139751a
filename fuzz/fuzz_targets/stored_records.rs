//! The `stored_records` target: see `testkit/src/fuzz/records.rs` for the input format and
//! what is checked.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| metropolis_testkit::fuzz::records::run(data));
