//! The worker ↔ Durable Object frame: arbitrary bytes never panic the decoder.
#![no_main]
use libfuzzer_sys::fuzz_target;
use postguard_core::guard::AdmitRequest;

fuzz_target!(|data: &[u8]| {
    let _ = postguard_core::frame::decode::<AdmitRequest>(data.to_vec());
});
