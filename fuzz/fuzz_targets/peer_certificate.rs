//! The `peer_certificate` target: see `testkit/src/fuzz/certificate.rs` for the input format and
//! what is checked.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| metropolis_testkit::fuzz::certificate::run(data));
