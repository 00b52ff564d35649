#![no_main]

// The grammar (signet_types::Selector, which the server validates and the agent matches with),
// then the agent's passwd lookup behind `unix:user:`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    signet_types::fuzzing::selector(data);
    signet_agent::fuzzing::selector(data);
});
