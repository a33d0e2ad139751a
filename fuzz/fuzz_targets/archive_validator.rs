//! The `archive_validator` target: see `harness/archive.rs` for the input format and
//! what is checked.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| metropolis_fuzz::harness::archive::run(data));
