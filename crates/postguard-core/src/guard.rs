//! The per-API-key guard: the decisions its Durable Object makes, as pure
//! functions over the object's state.
//!
//! One object per API key holds both the key's rate-limit window and its
//! Idempotency-Key records, so a fresh request costs one round trip before the
//! origin (`admit`: rate check + claim) and one after (`complete`/`release`);
//! a replay costs one (`admit` answers with the stored response).
//! See `docs/adr/0001-one-durable-object-per-api-key.md`.

use serde::{de::DeserializeOwned, Deserialize, Serialize};

use crate::frame::{self, FrameError};
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
    /// The answer layout the caller reads (absent: layout 1, a worker of a
    /// build before ADR 0029). The object of an earlier build ignores it
    /// and answers layout 1, which this build's worker reads too.
    #[serde(default)]
    pub v: AnswerLayout,
}

/// The layout of the admission answer (ADR 0029). Cloudflare rolls a deploy
/// out gradually, and an object keeps its version while workers of both
/// versions call it, so each side speaks both: the worker names the newest
/// layout it reads, the object answers in the newest one it writes that is
/// no newer, and the worker reads either.
/// - 1: [`Decision`] internally tagged (`{"kind":"execute"}`), which serde
///   buffers into its `Content` tree before decoding;
/// - 2: [`Decision`] externally tagged (`"execute"`), read directly.
///
/// A request naming a later layout (a worker of a later build) is answered
/// in layout 2; 0 or anything but an integer is a malformed frame.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "u64", into = "u64")]
pub enum AnswerLayout {
    #[default]
    V1 = 1,
    V2 = 2,
}

impl AnswerLayout {
    /// What this build's worker asks for and its object writes.
    pub const NEWEST: AnswerLayout = AnswerLayout::V2;
}

impl TryFrom<u64> for AnswerLayout {
    type Error = &'static str;

    fn try_from(v: u64) -> Result<Self, Self::Error> {
        match v {
            0 => Err("admission answer layout 0 does not exist"),
            1 => Ok(AnswerLayout::V1),
            _ => Ok(AnswerLayout::NEWEST),
        }
    }
}

impl From<AnswerLayout> for u64 {
    fn from(v: AnswerLayout) -> u64 {
        v as u64
    }
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

/// The framed reply to `admit`, in the layout the caller asked for.
pub fn encode_admit_reply(
    reply: &Reply<AdmitResponse>,
    layout: AnswerLayout,
    payload: &[u8],
) -> Result<Vec<u8>, FrameError> {
    match (layout, reply) {
        (AnswerLayout::V1, Ok(answer)) => {
            frame::encode(&Ok::<_, ()>(v1::AdmitResponse::from(answer)), payload)
        }
        _ => frame::encode(reply, payload),
    }
}

/// Layout 1 of the admission answer, written only for a worker of a build
/// before ADR 0029. Remove it, and layout 1's branch of `Decision`'s
/// reader, once no such build can run or be rolled back to (ADR 0029).
mod v1 {
    use serde::Serialize;

    use crate::idempotency::{self, StoredResponse};
    use crate::rate_limit::Verdict;

    #[derive(Serialize)]
    #[serde(rename_all = "snake_case")]
    pub enum AdmitResponse<'a> {
        Revoked,
        Limited {
            verdict: &'a Verdict,
        },
        Admitted {
            verdict: &'a Verdict,
            idempotency: Option<Decision>,
            replay: &'a Option<StoredResponse>,
        },
    }

    #[derive(Serialize)]
    #[serde(tag = "kind", rename_all = "snake_case")]
    pub enum Decision {
        Execute,
        InProgress { retry_after_s: u64 },
        Conflict,
        Replay,
    }

    impl From<&idempotency::Decision> for Decision {
        fn from(d: &idempotency::Decision) -> Decision {
            match *d {
                idempotency::Decision::Execute => Decision::Execute,
                idempotency::Decision::InProgress { retry_after_s } => {
                    Decision::InProgress { retry_after_s }
                }
                idempotency::Decision::Conflict => Decision::Conflict,
                idempotency::Decision::Replay => Decision::Replay,
            }
        }
    }

    impl<'a> From<&'a super::AdmitResponse> for AdmitResponse<'a> {
        fn from(r: &'a super::AdmitResponse) -> AdmitResponse<'a> {
            match r {
                super::AdmitResponse::Revoked => AdmitResponse::Revoked,
                super::AdmitResponse::Limited { verdict } => AdmitResponse::Limited { verdict },
                super::AdmitResponse::Admitted {
                    verdict,
                    idempotency,
                    replay,
                } => AdmitResponse::Admitted {
                    verdict,
                    idempotency: idempotency.as_ref().map(Decision::from),
                    replay,
                },
            }
        }
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
                v: AnswerLayout::NEWEST,
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
                v: AnswerLayout::NEWEST,
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
            v: AnswerLayout::NEWEST,
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
            v: AnswerLayout::NEWEST,
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
                v: AnswerLayout::NEWEST,
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
                v: AnswerLayout::NEWEST,
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

    /// The admission frame's layouts across a deploy (ADR 0029).
    mod layouts {
        use super::*;
        use crate::frame::{decode, encode, FrameError};
        use crate::rate_limit::Verdict;
        use proptest::prelude::*;

        /// The admission types as builds before ADR 0029 declare them: what
        /// an object or a worker of the previous deploy writes and reads.
        mod old {
            use super::*;

            #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
            #[serde(tag = "kind", rename_all = "snake_case")]
            pub enum Decision {
                Execute,
                InProgress { retry_after_s: u64 },
                Conflict,
                Replay,
            }

            #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
            #[serde(rename_all = "snake_case")]
            pub enum AdmitResponse {
                Revoked,
                Limited {
                    verdict: Verdict,
                },
                Admitted {
                    verdict: Verdict,
                    idempotency: Option<Decision>,
                    replay: Option<StoredResponse>,
                },
            }

            #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
            pub struct AdmitRequest {
                pub cost: u32,
                pub quota: Quota,
                pub claim: Option<Claim>,
            }

            pub fn decision(d: &super::Decision) -> Decision {
                match *d {
                    super::Decision::Execute => Decision::Execute,
                    super::Decision::InProgress { retry_after_s } => {
                        Decision::InProgress { retry_after_s }
                    }
                    super::Decision::Conflict => Decision::Conflict,
                    super::Decision::Replay => Decision::Replay,
                }
            }

            pub fn answer(a: &super::AdmitResponse) -> AdmitResponse {
                match a.clone() {
                    super::AdmitResponse::Revoked => AdmitResponse::Revoked,
                    super::AdmitResponse::Limited { verdict } => AdmitResponse::Limited { verdict },
                    super::AdmitResponse::Admitted {
                        verdict,
                        idempotency,
                        replay,
                    } => AdmitResponse::Admitted {
                        verdict,
                        idempotency: idempotency.as_ref().map(decision),
                        replay,
                    },
                }
            }
        }

        const VERDICT: Verdict = Verdict {
            admitted: true,
            limit: 10,
            remaining: 9,
            reset_ms: 60_000,
            reset_in_s: 60,
            reset_epoch_s: 60,
            window_s: 60,
        };

        fn decisions() -> Vec<Decision> {
            vec![
                Decision::Execute,
                Decision::InProgress { retry_after_s: 3 },
                Decision::Conflict,
                Decision::Replay,
            ]
        }

        /// Every admission answer: each variant, and each decision.
        fn answers() -> Vec<AdmitResponse> {
            let mut out = vec![
                AdmitResponse::Revoked,
                AdmitResponse::Limited {
                    verdict: Verdict {
                        admitted: false,
                        remaining: 0,
                        ..VERDICT
                    },
                },
                AdmitResponse::Admitted {
                    verdict: VERDICT,
                    idempotency: None,
                    replay: None,
                },
            ];
            out.extend(decisions().into_iter().map(|d| AdmitResponse::Admitted {
                replay: (d == Decision::Replay).then(stored),
                idempotency: Some(d),
                verdict: VERDICT,
            }));
            out
        }

        fn request(v: AnswerLayout) -> AdmitRequest {
            AdmitRequest {
                cost: 1,
                quota: Q,
                claim: claim("f", "r"),
                v,
            }
        }

        type Answer = Reply<AdmitResponse>;

        #[test]
        fn every_answer_round_trips_in_both_layouts() {
            for layout in [AnswerLayout::V1, AnswerLayout::V2] {
                for a in answers() {
                    let f = encode_admit_reply(&Ok(a.clone()), layout, b"body").unwrap();
                    let back: (Answer, Vec<u8>) = decode(f).unwrap();
                    assert_eq!(back, (Ok(a), b"body".to_vec()), "{layout:?}");
                }
                let err: Answer = Err(GuardError::Storage("disk".into()));
                let f = encode_admit_reply(&err, layout, b"").unwrap();
                assert_eq!(decode::<Answer>(f).unwrap().0, err);
            }
        }

        #[test]
        fn layout_1_is_what_the_previous_build_writes_and_reads() {
            for a in answers() {
                let mine = encode_admit_reply(&Ok(a.clone()), AnswerLayout::V1, b"x").unwrap();
                let theirs = encode(&Ok::<_, GuardError>(old::answer(&a)), b"x").unwrap();
                assert_eq!(mine, theirs, "byte for byte: {a:?}");
                // A worker of the previous build reads it.
                let (read, _): (Result<old::AdmitResponse, GuardError>, _) = decode(mine).unwrap();
                assert_eq!(read, Ok(old::answer(&a)));
            }
        }

        #[test]
        fn the_new_reader_reads_what_an_old_object_answers() {
            for a in answers() {
                let theirs = encode(&Ok::<_, GuardError>(old::answer(&a)), b"").unwrap();
                assert_eq!(decode::<Answer>(theirs).unwrap().0, Ok(a));
            }
            // As an object of the previous build writes it, and with its members swapped.
            for text in [
                r#"{"kind":"in_progress","retry_after_s":3}"#,
                r#"{"retry_after_s":3,"kind":"in_progress"}"#,
                r#"{"in_progress":{"retry_after_s":3}}"#,
            ] {
                let d: Decision = serde_json::from_str(text).unwrap();
                assert_eq!(d, Decision::InProgress { retry_after_s: 3 }, "{text}");
            }
        }

        #[test]
        fn layout_2_is_externally_tagged() {
            let text = |d: Decision| serde_json::to_string(&d).unwrap();
            assert_eq!(text(Decision::Execute), r#""execute""#);
            assert_eq!(text(Decision::Replay), r#""replay""#);
            assert_eq!(text(Decision::Conflict), r#""conflict""#);
            assert_eq!(
                text(Decision::InProgress { retry_after_s: 3 }),
                r#"{"in_progress":{"retry_after_s":3}}"#
            );
        }

        #[test]
        fn requests_name_their_layout_and_old_ones_read_as_layout_1() {
            // A request of this build, read by an object of the previous one
            // (which ignores `v` and answers layout 1).
            let f = encode(&request(AnswerLayout::NEWEST), b"").unwrap();
            let (theirs, _): (old::AdmitRequest, _) = decode(f.clone()).unwrap();
            assert_eq!(theirs.claim, claim("f", "r"));
            assert_eq!(decode::<AdmitRequest>(f).unwrap().0.v, AnswerLayout::V2);
            // A request of the previous build, read by this build's object.
            let old = old::AdmitRequest {
                cost: 1,
                quota: Q,
                claim: claim("f", "r"),
            };
            let (mine, _): (AdmitRequest, _) = decode(encode(&old, b"").unwrap()).unwrap();
            assert_eq!(mine, request(AnswerLayout::V1));
        }

        fn with_v(v: &str) -> Vec<u8> {
            let text = format!(
                r#"{{"cost":1,"quota":{{"limit":2,"window_ms":60000}},"claim":null,"v":{v}}}"#
            );
            let mut out = (text.len() as u32).to_be_bytes().to_vec();
            out.extend_from_slice(text.as_bytes());
            out
        }

        #[test]
        fn a_later_layout_is_answered_in_the_newest_and_malformed_ones_are_refused() {
            let read = |v| decode::<AdmitRequest>(with_v(v)).map(|(r, _)| r.v);
            assert_eq!(read("1"), Ok(AnswerLayout::V1));
            assert_eq!(read("2"), Ok(AnswerLayout::V2));
            assert_eq!(read("7"), Ok(AnswerLayout::NEWEST));
            for bad in ["0", "-1", "1.5", "\"2\"", "null", "[]"] {
                assert!(
                    matches!(read(bad), Err(FrameError::BadHeader(_))),
                    "v = {bad}: {:?}",
                    read(bad)
                );
            }
        }

        #[test]
        fn answers_in_no_known_layout_are_refused_with_the_frame_error() {
            for d in [
                r#""in_progress""#,
                r#""zzz""#,
                "42",
                "[]",
                "{}",
                r#"{"kind":"zzz"}"#,
                r#"{"kind":"in_progress"}"#,
                r#"{"in_progress":5}"#,
                r#"{"in_progress":{}}"#,
                r#"{"in_progress":{"retry_after_s":3},"kind":"replay"}"#,
            ] {
                let text = format!(
                    r#"{{"Ok":{{"admitted":{{"verdict":{},"idempotency":{d},"replay":null}}}}}}"#,
                    serde_json::to_string(&VERDICT).unwrap()
                );
                let res = decode::<Answer>(
                    encode(
                        &serde_json::from_str::<serde_json::Value>(&text).unwrap(),
                        b"",
                    )
                    .unwrap(),
                );
                assert!(matches!(res, Err(FrameError::BadHeader(_))), "{d}: {res:?}");
            }
        }

        proptest! {
            #[test]
            fn in_progress_round_trips_in_both_layouts(secs in any::<u64>()) {
                let a = AdmitResponse::Admitted {
                    verdict: VERDICT,
                    idempotency: Some(Decision::InProgress { retry_after_s: secs }),
                    replay: None,
                };
                for layout in [AnswerLayout::V1, AnswerLayout::V2] {
                    let f = encode_admit_reply(&Ok(a.clone()), layout, b"").unwrap();
                    prop_assert_eq!(decode::<Answer>(f).unwrap().0, Ok(a.clone()));
                }
            }

            #[test]
            fn garbage_answers_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..96)) {
                let _ = decode::<Answer>(bytes.clone());
                let _ = decode::<AdmitRequest>(bytes);
            }

            #[test]
            fn garbage_decisions_never_panic(text in "[{}\\[\\]\":,a-z_0-9 ]{0,48}") {
                let _ = serde_json::from_str::<Decision>(&text);
            }
        }
    }
}
