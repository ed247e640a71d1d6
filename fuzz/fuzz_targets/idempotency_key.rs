//! Idempotency-Key header parsing: never panics; every accepted key is
//! 1-255 visible ASCII characters and reads the same when quoted.
#![no_main]
use libfuzzer_sys::fuzz_target;
use postguard_core::idempotency::parse_key;

fuzz_target!(|data: &[u8]| {
    // Header values reach the worker as Latin-1 code points.
    let value: String = data.iter().map(|&b| char::from(b)).collect();
    if let Ok(key) = parse_key(&value) {
        assert!(!key.is_empty() && key.len() <= 255);
        assert!(key.bytes().all(|b| (0x21..=0x7e).contains(&b)));
        if !key.contains(['"', '\\']) {
            assert_eq!(parse_key(&format!("\"{key}\"")), Ok(key.clone()));
        }
    }
});
