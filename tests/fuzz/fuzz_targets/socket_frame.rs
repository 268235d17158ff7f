#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    shoal_agent_api::fuzz::socket_frame(data);
});
