//! The `image_config` target: any bytes through the OS image config's
//! parser (`bmaas_agent::install::image_config::ImageConfig::parse`); the
//! properties are in `bmaas_agent::fuzz::image_config`. Seeds: configs as
//! `metroctl osimage build` writes them and hostile variations
//! (`fuzz/corpus/image_config/`).

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| bmaas_agent::fuzz::image_config(data));
