//! The `trace_session` target: see `harness/trace.rs` for the input format and
//! what is checked.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| metropolis_fuzz::harness::trace::run(data));
