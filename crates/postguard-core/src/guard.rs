//! The per-API-key guard: the decisions its Durable Object makes, as pure
//! functions over the object's state.
//!
//! One object per credential — an API key (ADR 0001), a portal session, a
//! deployment secret, a client address — holds that credential's rate-limit
//! windows, its revoked flag, its Idempotency-Key records and, for an API
//! key, what the operator last set for it (its [`Profile`]: limits, expiry,
//! metadata, the keys of a reroll still in their grace). A fresh request
//! costs one round trip before the origin (`admit`: limits, a concurrency
//! slot and the claim) and one after (`complete`/`release`); a replay costs
//! one (`admit` answers with the stored response).

use serde::{de::DeserializeOwned, Deserialize, Serialize};

use crate::frame::{self, FrameError};
use crate::idempotency::{decide, Decision, Record, StoredResponse};
use crate::limits::{self, Inflight, Limits, Policy, Verdicts, Windows};
use crate::operations::{self, Outcome, StoredRequest};
use crate::rate_limit::{Quota, Verdict};
use crate::response_events::PendingEvent;

/// A claim attempt under an Idempotency-Key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claim {
    pub key: String,
    pub fingerprint: String,
    pub request_id: String,
    pub lease_ms: u64,
}

/// Which of a key's limits an admission is charged to (docs/limits.md): the
/// API's policies, or the gateway endpoints' own policy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    #[default]
    Api,
    Gateway,
}

/// A concurrency slot to take while the request is at the origin: freed by
/// `complete`, `release` or `finish`, or when its lease runs out (a crashed
/// isolate's slot is freed like its claim).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Slot {
    pub id: String,
    pub lease_ms: u64,
}

/// What the calling worker knows of the key (its cached record): the
/// version of what the operator set, the key's expiry, and which of the
/// key's secrets called (the first 8 hex of its SHA-256: a rerolled key's
/// predecessor expires on its own).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Caller {
    #[serde(default)]
    pub version: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<u64>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub key: String,
    /// When the calling secret stops working, if a reroll replaced it (its
    /// record says so): refused from then on, whatever the profile says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_until: Option<u64>,
}

/// A key of a reroll still working until `until` (epoch ms).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Previous {
    pub key: String,
    pub until: u64,
}

/// What the operator last set for an API key, as its object holds it (the
/// authority over a worker's cached record: a change applies from the key's
/// next request in every isolate, as revocation does).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Profile {
    /// When it was set (epoch ms); a worker's record of an older version
    /// is stale.
    pub version: u64,
    pub plan: String,
    pub limits: Limits,
    pub gateway: Limits,
    pub ttl_s: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub previous: Vec<Previous>,
    /// The key's metadata as forwarded (`X-Postguard-Key-Meta`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub meta: Option<String>,
}

/// `admit`: charge `cost` to the limits, take a concurrency slot, then (if
/// admitted) try `claim`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdmitRequest {
    pub cost: u32,
    /// The single policy a build before several policies sends (and reads
    /// back); ignored when `limits` is given.
    pub quota: Quota,
    pub claim: Option<Claim>,
    /// The answer layout the caller reads (absent: layout 1, a worker of a
    /// build before ADR 0029). The object of an earlier build ignores it
    /// and answers layout 1, which this build's worker reads too.
    #[serde(default)]
    pub v: AnswerLayout,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<Limits>,
    #[serde(default)]
    pub scope: Scope,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slot: Option<Slot>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caller: Option<Caller>,
    /// An Idempotency-Key whose record to report (`GET /idempotency/{key}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lookup: Option<String>,
    /// An asynchronous operation to create under `claim` (ADR 0037); the
    /// request body travels as the frame's payload when the object keeps it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation: Option<Box<NewOperation>>,
    /// The object exists only for its windows (a client address's counter
    /// of requests without a credential): it forgets everything once they
    /// are over (`store::Done::forget_at`), so no object is left behind.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub transient: bool,
}

/// An operation to create if the claim is taken.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewOperation {
    pub id: String,
    pub request: StoredRequest,
    /// The plan's idempotency TTL: how long the done operation is kept.
    pub ttl_ms: u64,
    /// `async.requeue_after_s` in ms.
    pub requeue_ms: u64,
}

impl AdmitRequest {
    /// A charge of `cost` against `limits`, nothing else.
    pub fn charge(cost: u32, limits: Limits) -> AdmitRequest {
        AdmitRequest {
            cost,
            quota: (limits.policies.first())
                .and_then(Policy::quota)
                .unwrap_or(Quota::PLACEHOLDER),
            claim: None,
            v: AnswerLayout::NEWEST,
            limits: Some(limits),
            scope: Scope::Api,
            slot: None,
            caller: None,
            lookup: None,
            operation: None,
            transient: false,
        }
    }

    /// Whether the answer reports the slots in use without taking one: a
    /// peek (`/me`, `GET /keys/{id}`) of a key whose plan has a concurrency
    /// quota. The object then counts its slots, which it cannot do in memory.
    pub fn reports_inflight(&self) -> bool {
        self.slot.is_none()
            && self.scope == Scope::Api
            && self
                .limits
                .as_ref()
                .is_some_and(|l| l.concurrency.is_some())
    }

    /// The limits to enforce when the object holds no fresher profile.
    fn requested_limits(&self) -> Limits {
        self.limits.clone().unwrap_or_else(|| Limits {
            policies: vec![Policy::single(self.quota)],
            concurrency: None,
        })
    }
}

/// The layout of the admission answer (ADR 0029). Cloudflare rolls a deploy
/// out gradually, and an object keeps its version while workers of both
/// versions call it, so each side speaks both: the worker names the newest
/// layout it reads, the object answers in the newest one it writes that is
/// no newer, and the worker reads either.
/// - 1: [`Decision`] internally tagged (`{"kind":"execute"}`), which serde
///   buffers into its `Content` tree before decoding;
/// - 2: [`Decision`] externally tagged (`"execute"`), read directly;
/// - 3: layout 2 with the `expired` answer (ADR 0032); a layout-2 reader is
///   told `revoked` instead (either is a refused key).
/// - 4: layout 3 with the `accepted` decision (an asynchronous operation,
///   ADR 0037); an older reader is told `in_progress` instead (its retry,
///   on a worker of this build, gets the operation's 202).
///
/// Members a reader does not know (every policy's verdict, a fresher
/// profile, an idempotency lookup) are ignored by older readers.
/// A request naming a later layout (a worker of a later build) is answered
/// in the newest; 0 or anything but an integer is a malformed frame.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "u64", into = "u64")]
pub enum AnswerLayout {
    #[default]
    V1 = 1,
    V2 = 2,
    V3 = 3,
    V4 = 4,
}

impl AnswerLayout {
    /// What this build's worker asks for and its object writes.
    pub const NEWEST: AnswerLayout = AnswerLayout::V4;
}

impl TryFrom<u64> for AnswerLayout {
    type Error = &'static str;

    fn try_from(v: u64) -> Result<Self, Self::Error> {
        match v {
            0 => Err("admission answer layout 0 does not exist"),
            1 => Ok(AnswerLayout::V1),
            2 => Ok(AnswerLayout::V2),
            3 => Ok(AnswerLayout::V3),
            _ => Ok(AnswerLayout::NEWEST),
        }
    }
}

impl From<AnswerLayout> for u64 {
    fn from(v: AnswerLayout) -> u64 {
        v as u64
    }
}

/// An Idempotency-Key's record as `GET /idempotency/{key}` reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lookup {
    pub state: LookupState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LookupState {
    InProgress,
    Completed,
    Expired,
    Unknown,
}

/// What the record of a key says at `now_ms`: a claim still leased runs; a
/// completed one within its TTL is replayed; one past either has expired
/// (the key starts a new operation); no record is unknown.
pub fn lookup(record: Option<&Record>, now_ms: u64) -> Lookup {
    let mut out = Lookup {
        state: LookupState::Unknown,
        status: None,
        request_id: None,
        created_at: None,
        expires_at: None,
    };
    match record {
        None => {}
        Some(Record::InFlight {
            request_id,
            claimed_at_ms,
            lease_until_ms,
            ..
        }) => {
            out.state = match now_ms < *lease_until_ms {
                true => LookupState::InProgress,
                false => LookupState::Expired,
            };
            out.request_id = Some(request_id.clone());
            out.created_at = Some(*claimed_at_ms);
            out.expires_at = Some(*lease_until_ms);
        }
        Some(Record::Completed {
            request_id,
            completed_at_ms,
            expires_at_ms,
            response,
            ..
        }) => {
            out.state = match now_ms < *expires_at_ms {
                true => LookupState::Completed,
                false => LookupState::Expired,
            };
            out.status = Some(response.status);
            out.request_id = Some(request_id.clone());
            out.created_at = Some(*completed_at_ms);
            out.expires_at = Some(*expires_at_ms);
        }
        // An operation: in progress until done, then completed like an answer.
        Some(Record::Accepted {
            request_id,
            claimed_at_ms,
            expires_at_ms,
            completed_at_ms,
            status,
            ..
        }) => {
            out.state = match (completed_at_ms, now_ms < *expires_at_ms) {
                (_, false) => LookupState::Expired,
                (None, true) => LookupState::InProgress,
                (Some(_), true) => LookupState::Completed,
            };
            out.status = *status;
            out.request_id = Some(request_id.clone());
            out.created_at = Some(completed_at_ms.unwrap_or(*claimed_at_ms));
            out.expires_at = Some(*expires_at_ms).filter(|at| *at < operations::NEVER);
        }
    }
    out
}

/// Externally tagged on the wire (`{"limited":{…}}`): an internally tagged
/// enum is buffered whole by serde before it is decoded, which showed in the
/// profile of every proxied request (ADR 0021). It only travels between the
/// worker and the object of one deployment, never stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AdmitResponse {
    /// The API key was revoked (or the session ended): authentication fails.
    Revoked,
    /// Over a limit; the request must not be forwarded. `verdict` is the
    /// binding policy's (what a build before several policies reads).
    Limited {
        verdict: Verdict,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        verdicts: Option<Verdicts>,
    },
    /// Within the limits. `idempotency` is `None` when no claim was asked for.
    /// For `Replay`, `replay` holds the stored response (its body travels as
    /// the frame payload).
    Admitted {
        verdict: Verdict,
        idempotency: Option<Decision>,
        replay: Option<StoredResponse>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        verdicts: Option<Verdicts>,
        /// What the operator set since the caller's record: use it, and drop
        /// the cached record.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        refresh: Option<Box<Profile>>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        lookup: Option<Box<Lookup>>,
        /// The operation the request created (`execute` with an operation)
        /// or is told again (`accepted`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        operation: Option<Box<operations::View>>,
    },
    /// The API key (or this secret of a rerolled one) has expired (layout 3).
    Expired,
}

impl AdmitResponse {
    /// Every policy's verdict: the answer's own, or (from an object of a
    /// build before several policies) its one verdict as the `default`
    /// policy's.
    pub fn verdicts(&self) -> Option<Verdicts> {
        match self {
            AdmitResponse::Limited { verdict, verdicts }
            | AdmitResponse::Admitted {
                verdict, verdicts, ..
            } => Some(
                verdicts
                    .clone()
                    .unwrap_or_else(|| Verdicts::single(limits::DEFAULT_POLICY, *verdict)),
            ),
            _ => None,
        }
    }
}

/// The object's state an admission reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GuardState {
    pub revoked: bool,
    pub windows: Windows,
    pub profile: Option<Profile>,
}

/// What the object must persist, and what it answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdmitPlan {
    /// `Some` when the windows changed and must be written.
    pub windows: Option<Windows>,
    /// `Some` when a new in-flight claim must be written.
    pub claim: Option<Record>,
    /// A concurrency slot to take until this time (epoch ms).
    pub slot: Option<(String, u64)>,
    /// A new operation to write with the claim (its body with it).
    pub operation: Option<operations::Operation>,
    pub response: AdmitResponse,
}

impl AdmitPlan {
    fn answer(response: AdmitResponse) -> AdmitPlan {
        AdmitPlan {
            windows: None,
            claim: None,
            slot: None,
            operation: None,
            response,
        }
    }
}

/// Whether the calling secret has expired: for a secret a reroll replaced,
/// the end of its grace (as its own record says, and as the object's
/// marker says — either suffices, so neither a stale cache nor a record KV
/// still serves brings it back); else the key's own expiry (the object's
/// fresher profile, else the caller's record).
fn expired(state: &GuardState, fresher: Option<&Profile>, req: &AdmitRequest, now_ms: u64) -> bool {
    let caller = req.caller.as_ref();
    if caller
        .and_then(|c| c.secret_until)
        .is_some_and(|at| now_ms >= at)
    {
        return true;
    }
    let expires_at = match fresher {
        Some(p) => p.expires_at,
        None => caller.and_then(|c| c.expires_at),
    };
    if expires_at.is_some_and(|at| now_ms >= at) {
        return true;
    }
    let key = caller.map_or("", |c| c.key.as_str());
    let previous = state.profile.as_ref().map_or(&[][..], |p| &p.previous[..]);
    !key.is_empty() && previous.iter().any(|p| p.key == key && now_ms >= p.until)
}

/// The `admit` decision. The caller runs it with no `await` between reading
/// the state and persisting the plan, which makes check-and-claim (and
/// check-and-slot) atomic. `in_use` is how many concurrency slots are taken.
pub fn admit(
    state: &GuardState,
    in_use: u32,
    record: Option<&Record>,
    req: &AdmitRequest,
    now_ms: u64,
) -> AdmitPlan {
    if state.revoked {
        return AdmitPlan::answer(AdmitResponse::Revoked);
    }
    let seen = req.caller.as_ref().map_or(0, |c| c.version);
    let fresher = state.profile.as_ref().filter(|p| p.version > seen);
    if expired(state, fresher, req, now_ms) {
        return AdmitPlan::answer(AdmitResponse::Expired);
    }
    let limits = match (fresher, req.scope) {
        (Some(p), Scope::Api) => p.limits.clone(),
        (Some(p), Scope::Gateway) => p.gateway.clone(),
        (None, _) => req.requested_limits(),
    };
    let slot_limit = limits.concurrency.filter(|_| req.slot.is_some());
    let no_slot = slot_limit.is_some_and(|n| !limits::slot_free(in_use, n));
    // Without a slot nothing is charged: the windows are only read.
    let cost = if no_slot { 0 } else { req.cost };
    let checked = limits::check_all(&state.windows, &limits.policies, now_ms, cost);
    let mut verdicts = checked.verdicts;
    if let Some(n) = slot_limit {
        verdicts.inflight = Some(Inflight {
            limit: n,
            in_use: if no_slot { in_use } else { in_use + 1 },
            refused: no_slot,
        });
    } else if let (Some(n), true) = (limits.concurrency, req.reports_inflight()) {
        verdicts.inflight = Some(Inflight {
            limit: n,
            in_use,
            refused: false,
        });
    }
    let verdict = verdicts.binding_verdict();
    if !verdicts.admitted() {
        // A refusal changes the windows only when one from the future was
        // pinned to now (it must not stay in the future).
        return AdmitPlan {
            windows: checked.windows,
            claim: None,
            slot: None,
            operation: None,
            response: AdmitResponse::Limited {
                verdict,
                verdicts: Some(verdicts),
            },
        };
    }
    let decision = req
        .claim
        .as_ref()
        .map(|c| decide(record, &c.fingerprint, now_ms));
    let (claim_record, operation) = match (&req.claim, &decision, &req.operation) {
        (Some(c), Some(Decision::Execute), Some(new)) => accept(c, new, now_ms),
        (Some(c), Some(Decision::Execute), None) => (
            Some(Record::InFlight {
                fingerprint: c.fingerprint.clone(),
                request_id: c.request_id.clone(),
                claimed_at_ms: now_ms,
                lease_until_ms: now_ms.saturating_add(c.lease_ms),
            }),
            None,
        ),
        _ => (None, None),
    };
    let replay = match (&decision, record) {
        (Some(Decision::Replay), Some(Record::Completed { response, .. })) => {
            Some(response.clone())
        }
        _ => None,
    };
    // Only a request that goes to the origin holds a slot.
    let forwarded = matches!(decision, None | Some(Decision::Execute));
    let slot = match (&req.slot, slot_limit, forwarded) {
        (Some(s), Some(_), true) => Some((s.id.clone(), now_ms.saturating_add(s.lease_ms))),
        _ => None,
    };
    if slot.is_none() {
        if let Some(i) = verdicts.inflight.as_mut() {
            i.in_use = in_use;
        }
    }
    AdmitPlan {
        windows: checked.windows,
        claim: claim_record,
        slot,
        response: AdmitResponse::Admitted {
            verdict,
            idempotency: decision,
            replay,
            verdicts: Some(verdicts),
            refresh: fresher.cloned().map(Box::new),
            lookup: req
                .lookup
                .as_ref()
                .map(|_| Box::new(lookup(record, now_ms))),
            operation: operation.as_ref().map(|op| Box::new(op.view())),
        },
        operation,
    }
}

/// The claim of an asynchronous request: the key's record names the
/// operation (every later request with the key is told it), which is
/// written queued with it.
fn accept(
    c: &Claim,
    new: &NewOperation,
    now_ms: u64,
) -> (Option<Record>, Option<operations::Operation>) {
    let record = Record::Accepted {
        fingerprint: c.fingerprint.clone(),
        request_id: c.request_id.clone(),
        operation_id: new.id.clone(),
        claimed_at_ms: now_ms,
        expires_at_ms: operations::NEVER,
        completed_at_ms: None,
        status: None,
    };
    let op = operations::Operation::new(
        new.id.clone(),
        c.request_id.clone(),
        new.request.clone(),
        new.ttl_ms,
        now_ms,
        new.requeue_ms,
    );
    (Some(record), Some(op))
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
        // A reader of layout 2 knows no `expired`: a refused key all the same.
        (AnswerLayout::V2, Ok(AdmitResponse::Expired)) => {
            frame::encode(&Ok::<_, ()>(AdmitResponse::Revoked), payload)
        }
        // A reader before layout 4 knows no `accepted`: in progress, and its
        // retry (on a worker of this build) is told the operation.
        (AnswerLayout::V2 | AnswerLayout::V3, Ok(answer)) if is_accepted(answer) => {
            frame::encode(&Ok::<_, ()>(before_operations(answer)), payload)
        }
        _ => frame::encode(reply, payload),
    }
}

fn is_accepted(answer: &AdmitResponse) -> bool {
    matches!(
        answer,
        AdmitResponse::Admitted {
            idempotency: Some(Decision::Accepted),
            ..
        }
    )
}

/// `answer` as a reader before layout 4 reads it.
fn before_operations(answer: &AdmitResponse) -> AdmitResponse {
    match answer.clone() {
        AdmitResponse::Admitted {
            verdict,
            replay,
            verdicts,
            refresh,
            lookup,
            ..
        } => AdmitResponse::Admitted {
            verdict,
            idempotency: Some(Decision::InProgress { retry_after_s: 1 }),
            replay,
            verdicts,
            refresh,
            lookup,
            operation: None,
        },
        other => other,
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
                // Layout 1 has no `accepted` (ADR 0037): in progress.
                idempotency::Decision::Accepted => Decision::InProgress { retry_after_s: 1 },
            }
        }
    }

    impl<'a> From<&'a super::AdmitResponse> for AdmitResponse<'a> {
        fn from(r: &'a super::AdmitResponse) -> AdmitResponse<'a> {
            match r {
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
    /// The request held a concurrency slot (its id): free it too.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub slot: bool,
    /// The event the response implies (`events_from_responses`): written to
    /// publish in the same transaction as the record, only if it is stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<PendingEvent>,
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
    /// The request held a concurrency slot (its id): free it too.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub slot: bool,
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
/// Free the concurrency slot of a request without a claim.
pub struct Finish;
/// Keep what the operator set for the key (`PATCH`, reroll).
pub struct Update;
/// Start an operation's next attempt (payload of the answer: its request body).
pub struct StartOp;
/// Settle an operation's attempt (payload of the request: the answer's body).
pub struct FinishOp;
/// Read an operation (payload of the answer: its result body, if asked).
pub struct GetOp;
/// A page of the project's operations held by this object.
pub struct ListOps;

/// `start`: the consumer's claim on an operation's next attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StartOpRequest {
    pub id: String,
    /// How long the attempt holds the operation (`operations::lease_ms`).
    pub lease_ms: u64,
    /// The attempts the retry schedule allows (`operations::max_attempts`);
    /// absent (a worker of an earlier build): unbounded, as it was.
    #[serde(default = "unbounded")]
    pub max_attempts: u32,
}

fn unbounded() -> u32 {
    u32::MAX
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StartOpReply {
    /// Run this attempt (`op.attempts`), as the key is now (its plan and
    /// metadata from the object's profile); the request body is the payload.
    Started { op: Box<operations::Operation> },
    /// Not now: no such operation, or not startable (`state`) — or it has
    /// just ended (`failed`: its attempts spent, its key revoked or expired).
    NotStarted { state: Option<operations::State> },
}

/// `finish`: what attempt `attempt` came back with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FinishOpRequest {
    pub id: String,
    pub attempt: u32,
    pub outcome: Outcome,
    /// The retry schedule (`webhooks.schedule_s`).
    pub schedule_s: Vec<u32>,
    /// The event the answer implies (`events_from_responses`), published
    /// only if the operation succeeds with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<PendingEvent>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FinishOpReply {
    /// The outcome moved the operation.
    pub applied: bool,
    /// The operation is done and keeps this answer (its body was written,
    /// or its R2 object is now referenced: otherwise the caller deletes it).
    pub kept: bool,
}

/// `get`: operation `id`, if it belongs to `project`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GetOpRequest {
    pub id: String,
    pub project: String,
    /// Send the kept result body (kept in the object) as the payload.
    #[serde(default)]
    pub body: bool,
}

/// `finish`: the slot to free (the request's id).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FinishRequest {
    pub slot: String,
}

/// `update`: the key's new profile.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UpdateRequest {
    pub profile: Profile,
}

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
operation!(Finish, "/finish", FinishRequest => Ack);
operation!(Update, "/update", UpdateRequest => Ack);
operation!(StartOp, "/op/start", StartOpRequest => StartOpReply);
operation!(FinishOp, "/op/finish", FinishOpRequest => FinishOpReply);
operation!(GetOp, "/op/get", GetOpRequest => Option<Box<operations::Operation>>);
operation!(ListOps, "/op/list", operations::Page => Vec<operations::View>);

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
        }
    }

    fn state(window: Option<Window>) -> GuardState {
        GuardState {
            revoked: false,
            windows: window
                .map(|w| vec![(limits::DEFAULT_POLICY.to_string(), w)])
                .unwrap_or_default(),
            profile: None,
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
                policies: vec![Policy {
                    name: "default".into(),
                    limit: 7,
                    window_ms: 60_000,
                }],
                concurrency: None,
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
                    super::AdmitResponse::Limited { verdict, .. } => {
                        AdmitResponse::Limited { verdict }
                    }
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
}
