use super::*;
use crate::idempotency::{Decision, Record, StoredResponse};
use crate::limits::{self, Inflight, Limits, Policy, Verdicts};
use crate::rate_limit::Quota;
use crate::rate_limit::Window;

const Q: Quota = Quota::new(2, 60_000).unwrap();

fn claim(fp: &str, rid: &str) -> Option<Claim> {
    Some(Claim {
        key: "k".into(),
        fingerprint: fp.into(),
        request_id: rid.into(),
        lease_ms: 60_000,
    })
}

/// A request as a build before several policies sends it.
fn req(cost: u32, claim: Option<Claim>) -> AdmitRequest {
    AdmitRequest {
        cost,
        quota: Q,
        claim,
        v: AnswerLayout::NEWEST,
        limits: None,
        scope: Scope::Api,
        slot: None,
        caller: None,
        lookup: None,
        operation: None,
        transient: false,
        notices: None,
    }
}

fn state(window: Option<Window>) -> GuardState {
    GuardState {
        revoked: false,
        windows: window
            .map(|w| vec![(limits::DEFAULT_POLICY.to_string(), w)])
            .unwrap_or_default(),
        profile: None,
        ledger: Default::default(),
    }
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

fn decision(p: &AdmitPlan) -> Option<Decision> {
    match &p.response {
        AdmitResponse::Admitted { idempotency, .. } => idempotency.clone(),
        _ => None,
    }
}

fn default_window(p: &AdmitPlan) -> Option<Window> {
    p.windows
        .as_ref()
        .and_then(|w| limits::window_of(w, limits::DEFAULT_POLICY).copied())
}

#[test]
fn revoked_wins_over_everything() {
    let mut st = state(None);
    st.revoked = true;
    let p = admit(&st, 0, None, &req(1, claim("f", "r")), 0);
    assert_eq!(p.response, AdmitResponse::Revoked);
    assert_eq!((p.windows, p.claim, p.slot), (None, None, None));
}

#[test]
fn limited_requests_claim_nothing() {
    let full = state(Some(Window {
        start_ms: 0,
        used: 2,
    }));
    let p = admit(&full, 0, None, &req(1, claim("f", "r")), 10);
    assert!(matches!(p.response, AdmitResponse::Limited { .. }));
    assert_eq!((p.claim, p.windows), (None, None));
}

#[test]
fn fresh_claim_then_in_progress_then_replay_then_conflict() {
    let p = admit(&state(None), 0, None, &req(1, claim("f", "r1")), 0);
    let Some(rec) = p.claim.clone() else {
        panic!("no claim")
    };
    assert_eq!(decision(&p), Some(Decision::Execute));
    assert_eq!(
        default_window(&p),
        Some(Window {
            start_ms: 0,
            used: 1
        })
    );
    let after = state(default_window(&p));
    let req2 = req(1, claim("f", "r2"));
    let p2 = admit(&after, 0, Some(&rec), &req2, 1_500);
    assert_eq!(
        decision(&p2),
        Some(Decision::InProgress { retry_after_s: 2 })
    );
    assert_eq!(p2.claim, None);

    // Only the holder completes.
    let c_other = CompleteRequest {
        key: "k".into(),
        request_id: "r2".into(),
        ttl_ms: 1000,
        response: stored(),
        slot: false,
        event: None,
    };
    assert_eq!(complete(Some(&rec), &c_other, 2_000), None);
    let c = CompleteRequest {
        key: "k".into(),
        request_id: "r1".into(),
        ttl_ms: 1000,
        response: stored(),
        slot: false,
        event: None,
    };
    let done = complete(Some(&rec), &c, 2_000).unwrap();
    assert_eq!(done.expires_at_ms(), 3_000);

    let p3 = admit(&state(None), 0, Some(&done), &req2, 2_500);
    match p3.response {
        AdmitResponse::Admitted {
            idempotency: Some(Decision::Replay),
            replay: Some(r),
            ..
        } => assert_eq!(r, stored()),
        other => panic!("{other:?}"),
    }
    let p4 = admit(
        &state(None),
        0,
        Some(&done),
        &req(1, claim("g", "r3")),
        2_500,
    );
    assert_eq!(decision(&p4), Some(Decision::Conflict));
    // After the TTL the key starts a new operation.
    let p5 = admit(&state(None), 0, Some(&done), &req2, 3_000);
    assert_eq!(decision(&p5), Some(Decision::Execute));
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
    let rel = |rid: &str| ReleaseRequest {
        key: "k".into(),
        request_id: rid.into(),
        slot: false,
    };
    assert!(should_release(Some(&rec), &rel("r1")));
    assert!(!should_release(Some(&rec), &rel("r2")));
    assert!(!should_release(None, &rel("r1")));
}

#[test]
fn zero_cost_peek_changes_nothing() {
    let st = state(Some(Window {
        start_ms: 0,
        used: 1,
    }));
    let p = admit(&st, 0, None, &req(0, None), 5);
    assert_eq!(p.windows, None);
    match p.response {
        AdmitResponse::Admitted { verdict, .. } => assert_eq!(verdict.remaining, 1),
        other => panic!("{other:?}"),
    }
}

fn policies() -> Limits {
    Limits {
        notify_at: Vec::new(),
        policies: vec![
            Policy {
                name: "burst".into(),
                limit: 2,
                window_ms: 1_000,
            },
            Policy {
                name: "minute".into(),
                limit: 3,
                window_ms: 60_000,
            },
        ],
        concurrency: Some(1),
        report_only: false,
    }
}

#[test]
fn a_refusal_by_one_policy_charges_none() {
    let mut st = state(None);
    for t in [0, 1] {
        let p = admit(&st, 0, None, &AdmitRequest::charge(1, policies()), t);
        st.windows = p.windows.unwrap_or_default();
    }
    let p = admit(&st, 0, None, &AdmitRequest::charge(1, policies()), 2);
    let v = p.response.verdicts().unwrap_or_default();
    assert_eq!(v.violated(), ["burst"]);
    assert_eq!(
        p.windows, None,
        "minute is not charged by the refused request"
    );
    // A second later burst admits again; minute has one left.
    let p = admit(&st, 0, None, &AdmitRequest::charge(1, policies()), 1_000);
    let v = p.response.verdicts().unwrap_or_default();
    assert!(v.admitted());
    assert_eq!(v.said[v.binding].name, "minute");
    assert_eq!(v.binding_verdict().remaining, 0);
}

#[test]
fn a_slot_is_taken_while_forwarded_and_refused_when_none_is_free() {
    let slotted = |id: &str| AdmitRequest {
        slot: Some(Slot {
            id: id.into(),
            lease_ms: 60_000,
        }),
        ..AdmitRequest::charge(1, policies())
    };
    let p = admit(&state(None), 0, None, &slotted("r1"), 0);
    assert_eq!(p.slot, Some(("r1".to_string(), 60_000)));
    let st = state(None);
    let full = admit(&st, 1, None, &slotted("r2"), 10);
    let v = full.response.verdicts().unwrap_or_default();
    assert_eq!(v.violated(), ["inflight"]);
    assert_eq!(full.windows, None, "no policy charged");
    assert_eq!(full.slot, None);
    assert!(matches!(
        crate::proxy::limited(&v).code,
        crate::ErrorCode::ConcurrencyLimitExceeded
    ));
    // A replay goes nowhere near the origin: it takes no slot.
    let done = Record::Completed {
        fingerprint: "f".into(),
        request_id: "r0".into(),
        completed_at_ms: 0,
        expires_at_ms: 10_000,
        response: stored(),
    };
    let mut replay = slotted("r3");
    replay.claim = claim("f", "r3");
    let p = admit(&state(None), 0, Some(&done), &replay, 20);
    assert_eq!(p.slot, None);
}

fn profile(version: u64) -> Profile {
    Profile {
        version,
        plan: "gold".into(),
        limits: Limits {
            notify_at: Vec::new(),
            policies: vec![Policy {
                name: "default".into(),
                limit: 7,
                window_ms: 60_000,
            }],
            concurrency: None,
            report_only: false,
        },
        gateway: Limits::default(),
        ttl_s: 60,
        expires_at: None,
        previous: vec![Previous {
            key: "oldkey01".into(),
            until: 1_000,
        }],
        meta: Some("e30".into()),
    }
}

#[test]
fn the_object_s_fresher_profile_overrules_a_stale_record() {
    let mut st = state(None);
    st.profile = Some(profile(5));
    let stale = AdmitRequest {
        caller: Some(Caller {
            version: 3,
            key: "newkey01".into(),
            ..Caller::default()
        }),
        ..req(1, None)
    };
    let p = admit(&st, 0, None, &stale, 0);
    match &p.response {
        AdmitResponse::Admitted {
            verdict, refresh, ..
        } => {
            assert_eq!(verdict.limit, 7, "the profile's limits, not the request's");
            assert_eq!(refresh.as_ref().map(|r| r.version), Some(5));
        }
        other => panic!("{other:?}"),
    }
    let fresh = AdmitRequest {
        caller: Some(Caller {
            version: 5,
            ..Caller::default()
        }),
        ..req(1, None)
    };
    assert!(matches!(
        admit(&st, 0, None, &fresh, 0).response,
        AdmitResponse::Admitted { refresh: None, .. }
    ));
}

#[test]
fn keys_expire_at_the_millisecond_and_a_rerolled_secret_after_its_grace() {
    let mut st = state(None);
    st.profile = Some(profile(5));
    let at = |key: &str, expires: Option<u64>| AdmitRequest {
        caller: Some(Caller {
            version: 5,
            expires_at: expires,
            key: key.into(),
            secret_until: None,
        }),
        ..req(1, None)
    };
    assert!(matches!(
        admit(&st, 0, None, &at("newkey01", Some(500)), 499).response,
        AdmitResponse::Admitted { .. }
    ));
    assert_eq!(
        admit(&st, 0, None, &at("newkey01", Some(500)), 500).response,
        AdmitResponse::Expired
    );
    assert!(matches!(
        admit(&st, 0, None, &at("oldkey01", None), 999).response,
        AdmitResponse::Admitted { .. }
    ));
    assert_eq!(
        admit(&st, 0, None, &at("oldkey01", None), 1_000).response,
        AdmitResponse::Expired
    );
    assert!(matches!(
        admit(&st, 0, None, &at("newkey01", None), 1_000).response,
        AdmitResponse::Admitted { .. }
    ));
    // A fresher profile's expiry wins over the record's.
    let mut later = profile(9);
    later.expires_at = Some(100);
    st.profile = Some(later);
    assert_eq!(
        admit(&st, 0, None, &at("newkey01", None), 100).response,
        AdmitResponse::Expired
    );
}

/// Issue 32 #1: a secret rerolled away came back once a second reroll
/// had dropped it from the profile, because a fresher profile's expiry
/// was the only one read. Its own record's end now binds whatever the
/// profile holds.
#[test]
fn a_replaced_secret_stays_refused_whatever_profile_the_object_holds() {
    let mut st = state(None);
    let mut later = profile(9);
    later.previous.clear();
    st.profile = Some(later);
    let old = |now| {
        let req = AdmitRequest {
            caller: Some(Caller {
                version: 4,
                expires_at: None,
                key: "gone0001".into(),
                secret_until: Some(2_000),
            }),
            ..req(1, None)
        };
        admit(&st, 0, None, &req, now).response
    };
    assert!(matches!(old(1_999), AdmitResponse::Admitted { .. }));
    for now in [2_000, 65_000, u64::MAX] {
        assert_eq!(old(now), AdmitResponse::Expired, "at {now}");
    }
}

#[test]
fn lookups_report_each_state() {
    let inflight = Record::InFlight {
        fingerprint: "f".into(),
        request_id: "r1".into(),
        claimed_at_ms: 10,
        lease_until_ms: 100,
    };
    assert_eq!(lookup(Some(&inflight), 50).state, LookupState::InProgress);
    assert_eq!(lookup(Some(&inflight), 100).state, LookupState::Expired);
    let done = Record::Completed {
        fingerprint: "f".into(),
        request_id: "r1".into(),
        completed_at_ms: 20,
        expires_at_ms: 200,
        response: stored(),
    };
    let l = lookup(Some(&done), 150);
    assert_eq!(
        (l.state, l.status, l.created_at, l.expires_at),
        (LookupState::Completed, Some(201), Some(20), Some(200))
    );
    assert_eq!(lookup(Some(&done), 200).state, LookupState::Expired);
    assert_eq!(lookup(None, 0).state, LookupState::Unknown);
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
    let paths = [
        Admit::PATH,
        Complete::PATH,
        Release::PATH,
        Revoke::PATH,
        Finish::PATH,
        Update::PATH,
        StartOp::PATH,
        FinishOp::PATH,
        GetOp::PATH,
        ListOps::PATH,
        DueWork::PATH,
        Published::PATH,
        Requeued::PATH,
        Sweep::PATH,
    ];
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
                super::Decision::Accepted => Decision::InProgress { retry_after_s: 1 },
            }
        }

        pub fn answer(a: &super::AdmitResponse) -> AdmitResponse {
            match a.clone() {
                super::AdmitResponse::Revoked | super::AdmitResponse::Expired => {
                    AdmitResponse::Revoked
                }
                super::AdmitResponse::Limited { verdict, .. } => AdmitResponse::Limited { verdict },
                super::AdmitResponse::Admitted {
                    verdict,
                    idempotency,
                    replay,
                    ..
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
                verdicts: None,
            },
            admitted(VERDICT, None, None),
        ];
        out.extend(
            decisions()
                .into_iter()
                .map(|d| admitted(VERDICT, (d == Decision::Replay).then(stored), Some(d))),
        );
        out
    }

    fn admitted(
        verdict: Verdict,
        replay: Option<StoredResponse>,
        idempotency: Option<Decision>,
    ) -> AdmitResponse {
        AdmitResponse::Admitted {
            verdict,
            idempotency,
            replay,
            verdicts: None,
            refresh: None,
            lookup: None,
            operation: None,
            would_refuse: None,
        }
    }

    fn request(v: AnswerLayout) -> AdmitRequest {
        AdmitRequest {
            v,
            ..req(1, claim("f", "r"))
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
    fn layout_3_adds_expired_and_older_readers_are_told_revoked() {
        let expired: Answer = Ok(AdmitResponse::Expired);
        let f = encode_admit_reply(&expired, AnswerLayout::V3, b"").unwrap();
        assert_eq!(decode::<Answer>(f).unwrap().0, expired);
        for layout in [AnswerLayout::V1, AnswerLayout::V2] {
            let f = encode_admit_reply(&expired, layout, b"").unwrap();
            assert_eq!(
                decode::<Answer>(f).unwrap().0,
                Ok(AdmitResponse::Revoked),
                "{layout:?}"
            );
        }
        // The members a layout-2 reader does not know are ignored by it.
        let mut v = Verdicts::single("minute", VERDICT);
        v.inflight = Some(Inflight {
            limit: 2,
            in_use: 1,
            refused: false,
        });
        let rich = AdmitResponse::Admitted {
            verdict: VERDICT,
            idempotency: None,
            replay: None,
            verdicts: Some(v),
            refresh: None,
            lookup: Some(Box::new(lookup(None, 0))),
            operation: None,
            would_refuse: None,
        };
        let f = encode_admit_reply(&Ok(rich.clone()), AnswerLayout::V3, b"").unwrap();
        assert_eq!(decode::<Answer>(f.clone()).unwrap().0, Ok(rich));
        let (old, _): (Result<old::AdmitResponse, GuardError>, _) = decode(f).unwrap();
        assert_eq!(
            old,
            Ok(old::AdmitResponse::Admitted {
                verdict: VERDICT,
                idempotency: None,
                replay: None
            })
        );
    }

    #[test]
    fn layout_4_adds_accepted_and_older_readers_are_told_in_progress() {
        let accepted: Answer = Ok(admitted(VERDICT, None, Some(Decision::Accepted)));
        let f = encode_admit_reply(&accepted, AnswerLayout::V4, b"").unwrap();
        assert_eq!(decode::<Answer>(f).unwrap().0, accepted);
        let told = Ok(admitted(
            VERDICT,
            None,
            Some(Decision::InProgress { retry_after_s: 1 }),
        ));
        for layout in [AnswerLayout::V2, AnswerLayout::V3] {
            let f = encode_admit_reply(&accepted, layout, b"").unwrap();
            assert_eq!(decode::<Answer>(f).unwrap().0, told, "{layout:?}");
        }
        let f = encode_admit_reply(&accepted, AnswerLayout::V1, b"").unwrap();
        let (old, _): (Result<old::AdmitResponse, GuardError>, _) = decode(f).unwrap();
        assert_eq!(
            old,
            Ok(old::AdmitResponse::Admitted {
                verdict: VERDICT,
                idempotency: Some(old::Decision::InProgress { retry_after_s: 1 }),
                replay: None
            })
        );
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
        assert_eq!(decode::<AdmitRequest>(f).unwrap().0.v, AnswerLayout::V4);
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
        let text =
            format!(r#"{{"cost":1,"quota":{{"limit":2,"window_ms":60000}},"claim":null,"v":{v}}}"#);
        let mut out = (text.len() as u32).to_be_bytes().to_vec();
        out.extend_from_slice(text.as_bytes());
        out
    }

    #[test]
    fn a_later_layout_is_answered_in_the_newest_and_malformed_ones_are_refused() {
        let read = |v| decode::<AdmitRequest>(with_v(v)).map(|(r, _)| r.v);
        assert_eq!(read("1"), Ok(AnswerLayout::V1));
        assert_eq!(read("2"), Ok(AnswerLayout::V2));
        assert_eq!(read("3"), Ok(AnswerLayout::V3));
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
            let a = admitted(VERDICT, None, Some(Decision::InProgress { retry_after_s: secs }));
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

#[test]
fn report_only_limits_admit_what_they_would_refuse_and_name_it() {
    let report_only = || Limits {
        report_only: true,
        ..policies()
    };
    let mut st = state(None);
    for t in [0, 1] {
        let p = admit(&st, 0, None, &AdmitRequest::charge(1, report_only()), t);
        st.windows = p.windows.unwrap_or_default();
    }
    let p = admit(&st, 0, None, &AdmitRequest::charge(1, report_only()), 2);
    match &p.response {
        AdmitResponse::Admitted {
            would_refuse,
            verdict,
            ..
        } => {
            assert_eq!(would_refuse.as_deref(), Some("burst"));
            assert!(!verdict.admitted, "the headers say what enforcement would");
            assert_eq!(verdict.remaining, 0);
        }
        other => panic!("{other:?}"),
    }
    // Over the concurrency quota: admitted, named, and holding no slot.
    let slotted = AdmitRequest {
        slot: Some(Slot {
            id: "r9".into(),
            lease_ms: 60_000,
        }),
        ..AdmitRequest::charge(1, report_only())
    };
    let p = admit(&state(None), 1, None, &slotted, 10);
    assert_eq!(p.slot, None);
    match &p.response {
        AdmitResponse::Admitted { would_refuse, .. } => {
            assert_eq!(would_refuse.as_deref(), Some("inflight"))
        }
        other => panic!("{other:?}"),
    }
    // Within the limits nothing is named.
    let p = admit(&state(None), 0, None, &slotted, 20);
    assert!(matches!(
        p.response,
        AdmitResponse::Admitted {
            would_refuse: None,
            ..
        }
    ));
}
