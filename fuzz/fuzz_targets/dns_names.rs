#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| signet_types::fuzzing::dns_names(data));
