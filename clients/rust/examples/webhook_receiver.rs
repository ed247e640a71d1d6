//! Verifying a delivery in a receiver (any HTTP framework: hand over the raw body and the
//! headers), with rotated secrets and the dedupe hook.
//!
//! `cargo run --example webhook_receiver` signs a sample delivery itself to show the calls.

use postguard_client::{Dedupe, HeaderMap, MemoryDedupe, Verifier, VerifyError};

/// What a handler does with one request: 2xx for verified (or already handled) events,
/// 400 for anything that does not verify.
fn handle(verifier: &Verifier, seen: &dyn Dedupe, body: &[u8], headers: &HeaderMap) -> u16 {
    match verifier.verify_once(body, headers, seen) {
        Ok(Some(event)) => {
            println!(
                "new event {} ({}): {}",
                event.id, event.event_type, event.data
            );
            // If handling fails, `seen.forget(&event.id)` and answer 5xx: the gateway retries.
            200
        }
        Ok(None) => 200, // a redelivery of an event already handled
        Err(VerifyError::InvalidSignature | VerifyError::Timestamp | VerifyError::Header(_)) => 400,
        Err(_) => 400,
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // During a rotation, keep the old and the new secret for a day.
    let secrets = [
        "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD",
        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
    ];
    let verifier = Verifier::new(secrets)?;
    let seen = MemoryDedupe::new(10_000);

    // A sample delivery, signed the way the gateway does (Standard Webhooks).
    let body = br#"{"id":"evt_1","type":"payment.succeeded","timestamp":"2026-12-01T08:00:00Z","data":{"amount":100}}"#;
    let ts = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs() as i64;
    let sig = standardwebhooks::Webhook::new(secrets[0])?.sign("evt_1", ts, body)?;
    let mut headers = HeaderMap::new();
    headers.insert("webhook-id", "evt_1".parse()?);
    headers.insert("webhook-timestamp", ts.to_string().parse()?);
    headers.insert("webhook-signature", sig.parse()?);

    println!(
        "first delivery → {}",
        handle(&verifier, &seen, body, &headers)
    );
    println!(
        "redelivery     → {}",
        handle(&verifier, &seen, body, &headers)
    );
    println!(
        "tampered       → {}",
        handle(&verifier, &seen, b"{\"id\":\"evt_1\"}", &headers)
    );
    Ok(())
}
