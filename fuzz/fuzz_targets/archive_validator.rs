//! The `archive_validator` target: see `testkit/src/fuzz/archive.rs` for the input format and
//! what is checked.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| metropolis_testkit::fuzz::archive::run(data));
