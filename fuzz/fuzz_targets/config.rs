//! POSTGUARD_CONFIG parsing: never panics; every rejection names a field.
#![no_main]
use libfuzzer_sys::fuzz_target;
use postguard_core::config::{Config, RawEnv};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let env = RawEnv {
        origin_url: Some("https://api.example.com".into()),
        admin_token: Some("a".repeat(32)),
        origin_token: Some("o".repeat(32)),
        origin_signing_secret: Some("s".repeat(32)),
        postguard_config: Some(text.to_string()),
    };
    if let Err(e) = Config::load(&env) {
        assert!(!e.field.is_empty());
    }
});
