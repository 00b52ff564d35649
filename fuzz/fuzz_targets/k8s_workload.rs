#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| signet_agent::fuzzing::k8s_workload(data));
