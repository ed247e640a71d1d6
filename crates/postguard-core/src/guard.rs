//! The per-API-key guard: the decisions its Durable Object makes, as pure
//! functions over the object's state.
//!
//! One object per API key holds both the key's rate-limit window and its
//! Idempotency-Key records, so a fresh request costs one round trip before the
//! origin (`admit`: rate check + claim) and one after (`complete`/`release`);
//! a replay costs one (`admit` answers with the stored response).
//! See `docs/adr/0001-one-durable-object-per-api-key.md`.

use serde::{de::DeserializeOwned, Deserialize, Serialize};

use crate::idempotency::{decide, Decision, Record, StoredResponse};
use crate::rate_limit::{check, Quota, Verdict, Window};

/// A claim attempt under an Idempotency-Key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claim {
    pub key: String,
    pub fingerprint: String,
    pub request_id: String,
    pub lease_ms: u64,
}

/// `admit`: charge `cost` against `quota`, then (if admitted) try `claim`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdmitRequest {
    pub cost: u32,
    pub quota: Quota,
    pub claim: Option<Claim>,
}

/// Externally tagged on the wire (`{"limited":{…}}`): an internally tagged
/// enum is buffered whole by serde before it is decoded, which showed in the
/// profile of every proxied request (ADR 0021). It only travels between the
/// worker and the object of one deployment, never stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AdmitResponse {
    /// The API key was revoked: authentication fails.
    Revoked,
    /// Over the limit; the request must not be forwarded.
    Limited { verdict: Verdict },
    /// Within the limit. `idempotency` is `None` when no claim was asked for.
    /// For `Replay`, `replay` holds the stored response (its body travels as
    /// the frame payload).
    Admitted {
        verdict: Verdict,
        idempotency: Option<Decision>,
        replay: Option<StoredResponse>,
    },
}

/// What the object must persist, and what it answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdmitPlan {
    /// `Some` when the window changed and must be written.
    pub window: Option<Window>,
    /// `Some` when a new in-flight claim must be written.
    pub claim: Option<Record>,
    pub response: AdmitResponse,
}

/// The `admit` decision. The caller runs it with no `await` between reading
/// the state and persisting the plan, which makes check-and-claim atomic.
pub fn admit(
    revoked: bool,
    window: Option<Window>,
    record: Option<&Record>,
    req: &AdmitRequest,
    now_ms: u64,
) -> AdmitPlan {
    if revoked {
        return AdmitPlan {
            window: None,
            claim: None,
            response: AdmitResponse::Revoked,
        };
    }
    let (new_window, verdict) = check(window, req.quota, now_ms, req.cost);
    let window_update = (new_window != window).then_some(new_window).flatten();
    if !verdict.admitted {
        // A rejection changes the window only when one from the future was
        // pinned to now (it must not stay in the future).
        return AdmitPlan {
            window: window_update,
            claim: None,
            response: AdmitResponse::Limited { verdict },
        };
    }
    let Some(claim) = &req.claim else {
        return AdmitPlan {
            window: window_update,
            claim: None,
            response: AdmitResponse::Admitted {
                verdict,
                idempotency: None,
                replay: None,
            },
        };
    };
    let decision = decide(record, &claim.fingerprint, now_ms);
    let (claim_record, replay) = match (&decision, record) {
        (Decision::Execute, _) => (
            Some(Record::InFlight {
                fingerprint: claim.fingerprint.clone(),
                request_id: claim.request_id.clone(),
                claimed_at_ms: now_ms,
                lease_until_ms: now_ms.saturating_add(claim.lease_ms),
            }),
            None,
        ),
        (Decision::Replay, Some(Record::Completed { response, .. })) => {
            (None, Some(response.clone()))
        }
        _ => (None, None),
    };
    AdmitPlan {
        window: window_update,
        claim: claim_record,
        response: AdmitResponse::Admitted {
            verdict,
            idempotency: Some(decision),
            replay,
        },
    }
}

/// `complete`: store the origin's final response under the key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompleteRequest {
    pub key: String,
    pub request_id: String,
    pub ttl_ms: u64,
    pub response: StoredResponse,
}

/// The completed record to write, or `None` when the claim is no longer held
/// by this request (its lease ran out and another request took the key): a
/// late completion never overwrites someone else's claim.
pub fn complete(record: Option<&Record>, req: &CompleteRequest, now_ms: u64) -> Option<Record> {
    match record {
        Some(Record::InFlight {
            fingerprint,
            request_id,
            ..
        }) if *request_id == req.request_id => Some(Record::Completed {
            fingerprint: fingerprint.clone(),
            request_id: request_id.clone(),
            completed_at_ms: now_ms,
            expires_at_ms: now_ms.saturating_add(req.ttl_ms),
            response: req.response.clone(),
        }),
        _ => None,
    }
}

/// The object's answer to `complete`, `release` and `revoke`: whether the
/// write applied (a late completion of a lost claim does not).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ack {
    pub applied: bool,
}

/// `release`: drop the claim so a retry runs again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReleaseRequest {
    pub key: String,
    pub request_id: String,
}

/// Whether the record is this request's claim and should be deleted.
pub fn should_release(record: Option<&Record>, req: &ReleaseRequest) -> bool {
    matches!(record, Some(Record::InFlight { request_id, .. }) if *request_id == req.request_id)
}

/// The object protocol: each operation of the key's object tied to its path
/// and its request and response types, so the caller (`src/durable/client.rs`)
/// and the object (`src/durable/key_guard.rs`) cannot disagree. Both travel
/// in a `frame` (JSON header + raw payload); the object answers a [`Reply`].
pub trait Operation {
    const PATH: &'static str;
    type Request: Serialize + DeserializeOwned;
    type Response: Serialize + DeserializeOwned;
}

/// Rate check + claim (payload of the answer: a replay's body).
pub struct Admit;
/// Store the origin's response (payload of the request: its body).
pub struct Complete;
/// Drop a claim.
pub struct Release;
/// Flag the key as revoked.
pub struct Revoke;

/// `revoke` carries nothing but its path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RevokeRequest {}

macro_rules! operation {
    ($op:ty, $path:literal, $req:ty => $resp:ty) => {
        impl Operation for $op {
            const PATH: &'static str = $path;
            type Request = $req;
            type Response = $resp;
        }
    };
}
operation!(Admit, "/admit", AdmitRequest => AdmitResponse);
operation!(Complete, "/complete", CompleteRequest => Ack);
operation!(Release, "/release", ReleaseRequest => Ack);
operation!(Revoke, "/revoke", RevokeRequest => Ack);

/// Why the object could not run an operation, as it crosses back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(tag = "error", content = "detail", rename_all = "snake_case")]
pub enum GuardError {
    #[error("unknown key-guard operation {0}")]
    UnknownOperation(String),
    #[error("malformed request frame: {0}")]
    BadRequest(String),
    #[error("key-guard storage failed: {0}")]
    Storage(String),
}

/// The object's answer to every operation (the frame's JSON header).
pub type Reply<T> = Result<T, GuardError>;

#[cfg(test)]
mod tests {
    use super::*;

    const Q: Quota = Quota {
        limit: 2,
        window_ms: 60_000,
    };

    fn claim(fp: &str, rid: &str) -> Option<Claim> {
        Some(Claim {
            key: "k".into(),
            fingerprint: fp.into(),
            request_id: rid.into(),
            lease_ms: 60_000,
        })
    }

    fn stored() -> StoredResponse {
        StoredResponse {
            status: 201,
            headers: vec![("content-type".into(), "application/json".into())],
            body_omitted: false,
            body_object: None,
            body_len: 2,
        }
    }

    #[test]
    fn revoked_wins_over_everything() {
        let p = admit(
            true,
            None,
            None,
            &AdmitRequest {
                cost: 1,
                quota: Q,
                claim: claim("f", "r"),
            },
            0,
        );
        assert_eq!(p.response, AdmitResponse::Revoked);
        assert_eq!(p.window, None);
        assert_eq!(p.claim, None);
    }

    #[test]
    fn limited_requests_claim_nothing() {
        let full = Some(Window {
            start_ms: 0,
            used: 2,
        });
        let p = admit(
            false,
            full,
            None,
            &AdmitRequest {
                cost: 1,
                quota: Q,
                claim: claim("f", "r"),
            },
            10,
        );
        assert!(matches!(p.response, AdmitResponse::Limited { .. }));
        assert_eq!(p.claim, None);
        assert_eq!(p.window, None);
    }

    #[test]
    fn fresh_claim_then_in_progress_then_replay_then_conflict() {
        let req = AdmitRequest {
            cost: 1,
            quota: Q,
            claim: claim("f", "r1"),
        };
        let p = admit(false, None, None, &req, 0);
        let Some(rec) = p.claim.clone() else {
            panic!("no claim")
        };
        assert!(matches!(
            p.response,
            AdmitResponse::Admitted {
                idempotency: Some(Decision::Execute),
                ..
            }
        ));
        assert_eq!(
            p.window,
            Some(Window {
                start_ms: 0,
                used: 1
            })
        );

        let req2 = AdmitRequest {
            cost: 1,
            quota: Q,
            claim: claim("f", "r2"),
        };
        let p2 = admit(false, p.window, Some(&rec), &req2, 1_500);
        assert!(matches!(
            p2.response,
            AdmitResponse::Admitted {
                idempotency: Some(Decision::InProgress { retry_after_s: 2 }),
                ..
            }
        ));
        assert_eq!(p2.claim, None);

        // Only the holder completes.
        let c_other = CompleteRequest {
            key: "k".into(),
            request_id: "r2".into(),
            ttl_ms: 1000,
            response: stored(),
        };
        assert_eq!(complete(Some(&rec), &c_other, 2_000), None);
        let c = CompleteRequest {
            key: "k".into(),
            request_id: "r1".into(),
            ttl_ms: 1000,
            response: stored(),
        };
        let done = complete(Some(&rec), &c, 2_000).unwrap();
        assert_eq!(done.expires_at_ms(), 3_000);

        let p3 = admit(false, None, Some(&done), &req2, 2_500);
        match p3.response {
            AdmitResponse::Admitted {
                idempotency: Some(Decision::Replay),
                replay: Some(r),
                ..
            } => assert_eq!(r, stored()),
            other => panic!("{other:?}"),
        }
        let p4 = admit(
            false,
            None,
            Some(&done),
            &AdmitRequest {
                cost: 1,
                quota: Q,
                claim: claim("g", "r3"),
            },
            2_500,
        );
        assert!(matches!(
            p4.response,
            AdmitResponse::Admitted {
                idempotency: Some(Decision::Conflict),
                ..
            }
        ));
        // After the TTL the key starts a new operation.
        let p5 = admit(false, None, Some(&done), &req2, 3_000);
        assert!(matches!(
            p5.response,
            AdmitResponse::Admitted {
                idempotency: Some(Decision::Execute),
                ..
            }
        ));
        assert!(p5.claim.is_some());
    }

    #[test]
    fn release_only_by_holder() {
        let rec = Record::InFlight {
            fingerprint: "f".into(),
            request_id: "r1".into(),
            claimed_at_ms: 0,
            lease_until_ms: 10,
        };
        assert!(should_release(
            Some(&rec),
            &ReleaseRequest {
                key: "k".into(),
                request_id: "r1".into()
            }
        ));
        assert!(!should_release(
            Some(&rec),
            &ReleaseRequest {
                key: "k".into(),
                request_id: "r2".into()
            }
        ));
        assert!(!should_release(
            None,
            &ReleaseRequest {
                key: "k".into(),
                request_id: "r1".into()
            }
        ));
    }

    #[test]
    fn zero_cost_peek_changes_nothing() {
        let w = Some(Window {
            start_ms: 0,
            used: 1,
        });
        let p = admit(
            false,
            w,
            None,
            &AdmitRequest {
                cost: 0,
                quota: Q,
                claim: None,
            },
            5,
        );
        assert_eq!(p.window, None);
        match p.response {
            AdmitResponse::Admitted { verdict, .. } => assert_eq!(verdict.remaining, 1),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn replies_cross_as_typed_values() {
        let err: Reply<Ack> = Err(GuardError::Storage("disk".into()));
        let f = crate::frame::encode(&err, b"").unwrap();
        let (back, _): (Reply<Ack>, Vec<u8>) = crate::frame::decode(f).unwrap();
        assert_eq!(back, err);
        let ok: Reply<Ack> = Ok(Ack { applied: true });
        let f = crate::frame::encode(&ok, b"x").unwrap();
        let (back, p): (Reply<<Complete as Operation>::Response>, Vec<u8>) =
            crate::frame::decode(f).unwrap();
        assert_eq!((back, p), (ok, b"x".to_vec()));
        let paths = [Admit::PATH, Complete::PATH, Release::PATH, Revoke::PATH];
        assert_eq!(
            paths.len(),
            paths.iter().collect::<std::collections::HashSet<_>>().len()
        );
    }
}
