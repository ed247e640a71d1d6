//! Verifying the gateway's webhook deliveries, on the `standardwebhooks` crate (the
//! Standard Webhooks reference library), plus a dedupe hook for at-least-once delivery.
//!
//! The library checks the signature and fixes the accepted clock skew at ±5 minutes;
//! [`Verifier`] adds several secrets (during a rotation the gateway signs with the old
//! and the new one, a receiver may hold either) and an optional tighter tolerance.

use std::collections::{HashSet, VecDeque};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use reqwest::header::HeaderMap;
use serde::Deserialize;
use serde_json::Value;
use standardwebhooks::{Webhook, WebhookError};

/// The widest tolerance: the library's own, fixed window.
pub const MAX_TOLERANCE: Duration = Duration::from_secs(5 * 60);

/// Why a delivery was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VerifyError {
    /// No secret signed this body with these headers (tampered, or the wrong secret).
    #[error("webhook signature invalid")]
    InvalidSignature,
    /// `webhook-timestamp` is outside the tolerance (a replay, or a skewed clock).
    #[error("webhook timestamp outside the tolerance")]
    Timestamp,
    /// A `webhook-*` header is missing or malformed.
    #[error("webhook header missing or malformed: {0}")]
    Header(&'static str),
    /// The body verified but is not the gateway's event JSON.
    #[error("webhook body is not an event: {0}")]
    Body(#[from] serde_json::Error),
    /// A secret that is not `whsec_<base64>`, a tolerance over 5 minutes, no secret.
    #[error("invalid webhook verifier configuration: {0}")]
    Config(String),
}

/// A verified delivery: `{"id", "type", "timestamp", "data"}`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Event {
    pub id: String,
    #[serde(rename = "type")]
    pub event_type: String,
    pub timestamp: String,
    pub data: Value,
}

/// Verifies deliveries against one or more secrets.
pub struct Verifier {
    secrets: Vec<Webhook>,
    tolerance: Duration,
}

impl std::fmt::Debug for Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Verifier")
            .field("secrets", &self.secrets.len())
            .field("tolerance", &self.tolerance)
            .finish()
    }
}

impl Verifier {
    /// A verifier accepting a delivery signed by any of `secrets` (`whsec_…`).
    pub fn new<I, S>(secrets: I) -> Result<Self, VerifyError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let secrets = secrets
            .into_iter()
            .map(|s| {
                Webhook::new(s.as_ref())
                    .map_err(|_| VerifyError::Config("a secret is not whsec_<base64>".into()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        if secrets.is_empty() {
            return Err(VerifyError::Config("no secret".into()));
        }
        Ok(Verifier {
            secrets,
            tolerance: MAX_TOLERANCE,
        })
    }

    /// Accept timestamps at most `tolerance` away from now (at most 5 minutes).
    pub fn with_tolerance(mut self, tolerance: Duration) -> Result<Self, VerifyError> {
        if tolerance > MAX_TOLERANCE {
            return Err(VerifyError::Config(
                "tolerance over 5 minutes (the Standard Webhooks window)".into(),
            ));
        }
        self.tolerance = tolerance;
        Ok(self)
    }

    /// Verifies the raw `body` (exactly as received) with the delivery's headers.
    pub fn verify(&self, body: &[u8], headers: &HeaderMap) -> Result<Event, VerifyError> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        self.verify_at(body, headers, now)
    }

    /// [`Verifier::verify`] at a given Unix time (the tolerance check; the library's
    /// own ±5-minute check always uses the system clock).
    pub fn verify_at(
        &self,
        body: &[u8],
        headers: &HeaderMap,
        unix_now: Duration,
    ) -> Result<Event, VerifyError> {
        let ts = headers
            .get("webhook-timestamp")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .ok_or(VerifyError::Header("webhook-timestamp"))?;
        if Duration::from_secs(ts).abs_diff(unix_now) > self.tolerance {
            return Err(VerifyError::Timestamp);
        }
        let mut last = VerifyError::InvalidSignature;
        for secret in &self.secrets {
            match secret.verify(body, headers) {
                Ok(()) => return Ok(serde_json::from_slice(body)?),
                Err(e) => last = map_error(e),
            }
        }
        Err(last)
    }

    /// Verifies, then asks `dedupe` whether this event id was seen: `Ok(None)` for a
    /// repeat (answer 2xx and do nothing), `Ok(Some(event))` the first time.
    pub fn verify_once(
        &self,
        body: &[u8],
        headers: &HeaderMap,
        dedupe: &dyn Dedupe,
    ) -> Result<Option<Event>, VerifyError> {
        let event = self.verify(body, headers)?;
        Ok(dedupe.first_time(&event.id).then_some(event))
    }
}

fn map_error(e: WebhookError) -> VerifyError {
    match e {
        WebhookError::TimestampTooOldError | WebhookError::FutureTimestampError => {
            VerifyError::Timestamp
        }
        WebhookError::MissingHeader(h) | WebhookError::InvalidHeader(h) => VerifyError::Header(h),
        WebhookError::InvalidTimestamp => VerifyError::Header("timestamp"),
        _ => VerifyError::InvalidSignature,
    }
}

/// One-shot verification with several (rotated) secrets and the default tolerance.
pub fn verify<S: AsRef<str>>(
    body: &[u8],
    headers: &HeaderMap,
    secrets: &[S],
) -> Result<Event, VerifyError> {
    Verifier::new(secrets)?.verify(body, headers)
}

/// The dedupe hook: deliveries are at-least-once (a receiver that answered 2xx too late
/// gets the same event again, same `webhook-id`). Back it with your database for
/// durability; [`MemoryDedupe`] suits one process.
pub trait Dedupe: Send + Sync {
    /// Records `event_id`; `true` if it was not seen before.
    fn first_time(&self, event_id: &str) -> bool;
    /// Forgets `event_id`, e.g. when handling it failed and the redelivery should run.
    fn forget(&self, event_id: &str);
}

/// In-memory dedupe of the last `capacity` event ids.
#[derive(Debug)]
pub struct MemoryDedupe {
    capacity: usize,
    seen: Mutex<(HashSet<String>, VecDeque<String>)>,
}

impl MemoryDedupe {
    pub fn new(capacity: usize) -> Self {
        MemoryDedupe {
            capacity: capacity.max(1),
            seen: Mutex::new((HashSet::new(), VecDeque::new())),
        }
    }
}

impl Dedupe for MemoryDedupe {
    fn first_time(&self, event_id: &str) -> bool {
        let mut guard = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        let (set, order) = &mut *guard;
        if !set.insert(event_id.to_owned()) {
            return false;
        }
        order.push_back(event_id.to_owned());
        while order.len() > self.capacity {
            if let Some(old) = order.pop_front() {
                set.remove(&old);
            }
        }
        true
    }

    fn forget(&self, event_id: &str) {
        let mut guard = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        let (set, order) = &mut *guard;
        if set.remove(event_id) {
            order.retain(|id| id != event_id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S1: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";
    const S2: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

    fn now() -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap()
    }

    fn signed(secrets: &[&str], ts: i64, body: &str) -> HeaderMap {
        let sigs: Vec<String> = secrets
            .iter()
            .map(|s| {
                Webhook::new(s)
                    .unwrap()
                    .sign("evt_1", ts, body.as_bytes())
                    .unwrap()
            })
            .collect();
        let mut h = HeaderMap::new();
        h.insert("webhook-id", "evt_1".parse().unwrap());
        h.insert("webhook-timestamp", ts.to_string().parse().unwrap());
        h.insert("webhook-signature", sigs.join(" ").parse().unwrap());
        h
    }

    const BODY: &str = r#"{"id":"evt_1","type":"payment.succeeded","timestamp":"2026-12-01T08:00:00Z","data":{"amount":100}}"#;

    #[test]
    fn verifies_with_any_of_the_rotated_secrets() {
        let h = signed(&[S2, S1], now(), BODY);
        for set in [vec![S1], vec![S2], vec![S1, S2]] {
            let e = verify(BODY.as_bytes(), &h, &set).unwrap();
            assert_eq!(e.id, "evt_1");
            assert_eq!(e.event_type, "payment.succeeded");
            assert_eq!(e.data["amount"], 100);
        }
        let only_old = signed(&[S1], now(), BODY);
        assert!(verify(BODY.as_bytes(), &only_old, &[S2, S1]).is_ok());
        assert!(matches!(
            verify(BODY.as_bytes(), &only_old, &[S2]),
            Err(VerifyError::InvalidSignature)
        ));
    }

    #[test]
    fn refuses_tampering_and_stale_timestamps() {
        let h = signed(&[S1], now(), BODY);
        let tampered = BODY.replace("100", "1000");
        assert!(matches!(
            verify(tampered.as_bytes(), &h, &[S1]),
            Err(VerifyError::InvalidSignature)
        ));
        let old = signed(&[S1], now() - 301, BODY);
        assert!(matches!(
            verify(BODY.as_bytes(), &old, &[S1]),
            Err(VerifyError::Timestamp)
        ));
        let v = Verifier::new([S1])
            .unwrap()
            .with_tolerance(Duration::from_secs(30))
            .unwrap();
        let a_minute = signed(&[S1], now() - 60, BODY);
        assert!(matches!(
            v.verify(BODY.as_bytes(), &a_minute),
            Err(VerifyError::Timestamp)
        ));
        assert!(Verifier::new([S1])
            .unwrap()
            .with_tolerance(Duration::from_secs(301))
            .is_err());
        let mut missing = h.clone();
        missing.remove("webhook-signature");
        assert!(matches!(
            verify(BODY.as_bytes(), &missing, &[S1]),
            Err(VerifyError::Header(_))
        ));
        assert!(Verifier::new(["not base64!"]).is_err());
        assert!(Verifier::new(Vec::<String>::new()).is_err());
    }

    #[test]
    fn dedupe_hook_sees_each_event_once() {
        let v = Verifier::new([S1]).unwrap();
        let d = MemoryDedupe::new(2);
        let h = signed(&[S1], now(), BODY);
        assert!(v.verify_once(BODY.as_bytes(), &h, &d).unwrap().is_some());
        assert!(v.verify_once(BODY.as_bytes(), &h, &d).unwrap().is_none());
        d.forget("evt_1");
        assert!(v.verify_once(BODY.as_bytes(), &h, &d).unwrap().is_some());
        // Bounded: the oldest id is dropped past the capacity.
        assert!(d.first_time("a") && d.first_time("b"));
        assert!(d.first_time("evt_1"));
    }
}
