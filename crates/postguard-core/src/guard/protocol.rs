//! The typed protocol between the worker and a key's object: each
//! operation tied to its path and its request and reply types
//! ([`Operation`]), carried in a `frame` (JSON header + raw payload), and
//! the admission answer's layouts across a deploy (ADR 0029).

use serde::{de::DeserializeOwned, Deserialize, Serialize};

use crate::frame::{self, FrameError};
use crate::idempotency::{Decision, StoredResponse};
use crate::lease::{Ask, EdgeLimits, Grant};
use crate::limits::{self, Limits, Policy, Verdicts};
use crate::operations::{self, Outcome, StoredRequest};
use crate::rate_limit::{Quota, Verdict};
use crate::response_events::PendingEvent;

use super::{Caller, Claim, Profile, Scope, Slot};

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
    /// Where the key's quota notices go (`quota_notice::NoticeTo`): sent
    /// with every admission of an API key charged to its API policies, so
    /// a threshold this admission crosses is written to the object's outbox
    /// with the charge. Absent: no notice (an object of an earlier build
    /// ignores it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notices: Option<Box<crate::quota_notice::NoticeTo>>,
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
            notices: None,
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
    pub(super) fn requested_limits(&self) -> Limits {
        self.limits.clone().unwrap_or_else(|| Limits {
            policies: vec![Policy::single(self.quota)],
            ..Limits::default()
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
        /// Report-only limits: what would have refused this request (a
        /// policy's name, or `inflight`); it was admitted all the same.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        would_refuse: Option<String>,
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
            would_refuse,
            ..
        } => AdmitResponse::Admitted {
            verdict,
            idempotency: Some(Decision::InProgress { retry_after_s: 1 }),
            replay,
            verdicts,
            refresh,
            lookup,
            operation: None,
            would_refuse,
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
/// Store a chunk of imported keys in KV (not the object's own state: a call
/// of its own, with its own KV operations; ADR 0041).
pub struct ImportKeys;
/// A request with a key not known yet: lead the ask at the origin, or take
/// the outcome of the one that does (`key_verify::step`).
pub struct Verify;
/// The lead's outcome, for the requests waiting on it and the next ones.
pub struct Verified;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerifyRequest {
    /// How long a lead may take before another request leads.
    pub lease_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerifiedRequest {
    /// `None`: the lead gave up before asking (its address was over its limit).
    pub outcome: Option<crate::key_verify::Outcome>,
    /// `auth.verify_unknown_keys.negative_cache_s`, in ms.
    pub negative_ms: u64,
}

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
operation!(ImportKeys, "/keys/import", Vec<crate::key_import::ImportedKey> => Vec<crate::key_import::Imported>);
operation!(Verify, "/keys/verify", VerifyRequest => crate::key_verify::Step);
operation!(Verified, "/keys/verified", VerifiedRequest => Ack);
operation!(Lease, "/lease", LeaseRequest => LeaseReply);
operation!(EdgeAdmit, "/edge/admit", EdgeAdmitRequest => EdgeAdmitReply);
operation!(EdgeEnd, "/edge/end", EdgeEndRequest => Ack);
operation!(DueWork, "/outbox/due", DueWorkRequest => Work);
operation!(Published, "/outbox/published", PublishedRequest => bool);
operation!(Requeued, "/outbox/requeued", RequeuedRequest => Ack);
operation!(Sweep, "/outbox/sweep", SweepRequest => SweepReply);

/// An edge's call to the key's object (its home, ADR 0040): a request the
/// edge forwards, or a prefetch, with the edge's ask for blocks.
pub struct Lease;
/// The worker's call to an edge object (a key in one location): admit
/// from the leases, or forward to the home (payload of the answer: a
/// replay's body, when the home answered).
pub struct EdgeAdmit;
/// A request that took a slot leased to an edge has ended.
pub struct EdgeEnd;

/// `lease`: `admit` as the home runs it for any caller (a prefetch sends a
/// cost-0 peek), then, if `ask` is given and the key is neither revoked nor
/// expired, a grant of blocks charged to the same windows in the same
/// transaction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseRequest {
    pub admit: AdmitRequest,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ask: Option<Ask>,
    pub settings: EdgeLimits,
    /// How long one request may hold a slot (`idempotency.lease_s`), in ms.
    pub request_ms: u64,
}

/// The home's answer to an edge: the admission's, the grant, and the key's
/// profile when the home holds one newer than the caller's record (an
/// expiry, a reroll or limits the edge must apply from now on).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseReply {
    pub answer: AdmitResponse,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grant: Option<Grant>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<Box<Profile>>,
}

/// `edge/admit`: a request to admit in the edge object `edge` of the key
/// whose own object is `home`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EdgeAdmitRequest {
    /// The key's own object (its name: the key's id).
    pub home: String,
    /// This edge as the home's ledger names it: location and shard (`LHR.0`).
    pub edge: String,
    /// The admission as the home would be asked it.
    pub admit: AdmitRequest,
    pub settings: EdgeLimits,
    /// How long one request may hold a slot (`idempotency.lease_s`), in ms.
    pub request_ms: u64,
}

/// Where an admitted request's concurrency slot is held, for the shell to
/// free it there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SlotAt {
    /// The key's own object (`Finish`, or with the claim's `Complete`).
    Home,
    /// The edge object, on a slot leased to its life `life` (`EdgeEnd`).
    Edge { life: u64 },
}

/// The edge object's answer: the admission (as the home's would read) and
/// where the request's slot is held.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EdgeAdmitReply {
    pub answer: AdmitResponse,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slot: Option<SlotAt>,
}

/// `edge/end`: the request on a slot of `life` ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct EdgeEndRequest {
    pub life: u64,
}

/// The alarm's outbox (ADR 0037), driven by the shell (`src/operations/outbox.rs`),
/// never by the object itself: what is due, what was done of it, then the
/// sweep, which also sets the object's next alarm.
pub struct DueWork;
/// After the shell tried to publish one event: forget it, or try later.
pub struct Published;
/// After the shell handed operations to the queue.
pub struct Requeued;
/// Delete what expired and set the next alarm.
pub struct Sweep;

/// `due`: at most `batch` operations and events due now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DueWorkRequest {
    pub batch: u32,
}

/// An event the object still has to publish.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pending {
    pub event: PendingEvent,
    /// Failed tries so far.
    pub attempts: u32,
    /// When it was written (epoch ms).
    pub first_at: u64,
}

/// What is due: operations to hand to the queue (with the due time seen)
/// and events to publish.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Work {
    pub sends: Vec<(String, u64)>,
    pub publishes: Vec<Pending>,
}

/// `published`: the shell's try of `pending`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublishedRequest {
    pub pending: Pending,
    pub ok: bool,
}

/// `requeued`: `sends` went to the queue (or did not: `requeue_ms` says
/// when to look again).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequeuedRequest {
    pub sends: Vec<(String, u64)>,
    pub requeue_ms: u64,
}

/// `sweep`: records expire `grace_ms` past their TTL (`idempotency.lookup_grace_s`);
/// `worked` says whether the shell could do the work (its configuration read).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SweepRequest {
    pub grace_ms: u64,
    pub batch: u32,
    pub worked: bool,
}

/// The R2 objects of what expired, for the shell to delete, and the
/// object's next alarm (`None`: nothing left to do; `forgotten`: a transient
/// object deleted everything).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SweepReply {
    pub objects: Vec<String>,
    pub next_alarm: Option<u64>,
    #[serde(default)]
    pub forgotten: bool,
}

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
