//! The `store_open` target: see `testkit/src/fuzz/store_open.rs` for the input format and
//! what is checked.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| metropolis_testkit::fuzz::store_open::run(data));
