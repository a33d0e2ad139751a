//! The `trace_pipe_lines` target: see `testkit/src/fuzz/lines.rs` for the input format and
//! what is checked.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| metropolis_testkit::fuzz::lines::run(data));
