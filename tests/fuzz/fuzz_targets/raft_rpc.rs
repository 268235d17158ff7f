#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    shoal_agent::consensus::fuzz::raft_rpc(data);
});
