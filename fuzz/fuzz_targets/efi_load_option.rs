//! The `efi_load_option` target: any bytes through the agent's
//! `EFI_LOAD_OPTION` decoder (`bmaas_agent::efivars::decode_load_option`),
//! which must not panic, and whatever it accepts must encode back to
//! exactly the input. Seeds: the golden Metropolis entry of the agent's
//! unit tests and variations of it (`fuzz/corpus/efi_load_option/`).

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| bmaas_agent::fuzz::efi_load_option(data));
