#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| crc_fuzz::targets::ccm_configs(data));
