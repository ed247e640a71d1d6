//! Asynchronous operations (docs/async-operations.md, ADR 0037): a request with `Prefer:
//! respond-async` on an `async.routes` route is claimed under its
//! Idempotency-Key, stored in its key's object and answered 202 at once; a
//! queue consumer runs it against the origin later.
//!
//! An operation moves through these states (times are epoch ms; every
//! transition is a pure function here, applied by the key's object with no
//! `await` between reading and writing):
//!
//! ```text
//!            accept                start (consumer)
//!  (none) ──────────▶ queued ─────────────────────────▶ running
//!                      ▲  │ due: the object's alarm        │  │ final answer (any status §4 stores)
//!                      │  └─ hands it to the queue again   │  └──────────────────────────────▶ succeeded
//!                      │                                   │ 5xx / 408 / 409 / 425 / 429 / no answer:
//!                      └── attempts left: not before ◀─────┤   the webhook schedule's next delay
//!                          now + delay                     │ the schedule spent
//!                                                          └──────────────────────────────▶ failed
//!            a running attempt whose lease ran out (a crashed consumer) is started again
//! ```
//!
//! `succeeded` and `failed` are final: nothing changes them, and their
//! completion event (`postguard.operation.completed`) is written once, with
//! the transition. A late final answer of a cut attempt still completes an
//! operation that is not done (a success always wins, as for deliveries);
//! a late failure changes nothing.

use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::config::Settings;
use crate::idempotency::StoredResponse;
use crate::pattern;
use crate::response_events::PendingEvent;
use crate::{ErrorCode, Problem};

/// The expiry of what does not expire yet (an operation not done, and its
/// key's record): the largest time SQLite's integers hold, so storage and
/// memory agree on it.
pub const NEVER: u64 = i64::MAX as u64;

/// The id of an operation: `op_` + the 26 characters of its key's ULID +
/// a ULID of its own, so the id names the object that holds it.
pub fn operation_id(key_id: &str, now_ms: u64, random: u128) -> Option<String> {
    let key = key_id.strip_prefix("key_").filter(|k| is_ulid(k))?;
    let own = ulid::Ulid::from_parts(now_ms, random);
    Some(format!("op_{key}{own}"))
}

fn is_ulid(s: &str) -> bool {
    s.len() == ulid::ULID_LEN
        && ulid::Ulid::from_string(s).is_ok()
        && s.bytes().all(|b| !b.is_ascii_lowercase())
}

/// The API key whose object holds operation `id`, if `id` is well formed.
pub fn key_id_of(id: &str) -> Option<String> {
    let rest = id.strip_prefix("op_")?;
    if rest.len() != 2 * ulid::ULID_LEN {
        return None;
    }
    let (key, own) = rest.split_at(ulid::ULID_LEN);
    (is_ulid(key) && is_ulid(own)).then(|| format!("key_{key}"))
}

/// Whether a `Prefer` header value holds the `respond-async` preference
/// (RFC 7240: comma-separated, case-insensitive, parameters after `;`).
pub fn prefers_async(prefer: Option<&str>) -> bool {
    prefer.is_some_and(|v| v.split(',').any(is_respond_async))
}

fn is_respond_async(pref: &str) -> bool {
    let token = pref.split([';', '=']).next().unwrap_or("").trim();
    token.eq_ignore_ascii_case("respond-async")
}

/// The request's headers without the `respond-async` preference: the
/// gateway applied it, and the origin must answer the request itself.
pub fn without_respond_async(headers: &[(String, String)]) -> Vec<(String, String)> {
    headers
        .iter()
        .filter_map(|(k, v)| {
            if !k.eq_ignore_ascii_case("prefer") {
                return Some((k.clone(), v.clone()));
            }
            let kept: Vec<&str> = v
                .split(',')
                .filter(|p| !is_respond_async(p))
                .map(str::trim)
                .collect();
            (!kept.is_empty()).then(|| (k.clone(), kept.join(", ")))
        })
        .collect()
}

/// Whether `method path` is one of `async.routes` (a mutating method: a
/// route given as `*` never makes a GET asynchronous).
pub fn is_async_route(settings: &Settings, method: &str, path: &str) -> bool {
    matches!(method, "POST" | "PUT" | "PATCH" | "DELETE")
        && settings
            .async_ops
            .routes
            .iter()
            .any(|r| (r.method == "*" || r.method == method) && pattern::matches(&r.path, path))
}

/// How long a started attempt holds the operation: the attempt's timeout
/// plus `idempotency.lease_s`, the margin a claim has over its timeout too.
/// An attempt cut by a crash is started again once it ran out.
pub fn lease_ms(settings: &Settings) -> u64 {
    u64::from(settings.async_ops.timeout_ms) + u64::from(settings.idempotency.lease_s) * 1000
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    Queued,
    Running,
    Succeeded,
    Failed,
}

impl State {
    pub fn is_done(self) -> bool {
        matches!(self, State::Succeeded | State::Failed)
    }

    pub fn parse(s: &str) -> Option<State> {
        match s {
            "queued" => Some(State::Queued),
            "running" => Some(State::Running),
            "succeeded" => Some(State::Succeeded),
            "failed" => Some(State::Failed),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            State::Queued => "queued",
            State::Running => "running",
            State::Succeeded => "succeeded",
            State::Failed => "failed",
        }
    }
}

/// The request an operation runs, as it is forwarded (docs/request-path.md): never
/// the client's `Authorization`, and without the `respond-async`
/// preference. Its body is stored beside it (in the object, or in R2 when
/// larger than the object keeps).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredRequest {
    pub method: String,
    pub path_and_query: String,
    pub headers: Vec<(String, String)>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_ip: Option<String>,
    pub project: String,
    pub key_prefix: String,
    pub plan: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub meta: Option<String>,
    pub idempotency_key: String,
    pub body_len: u64,
    /// The R2 object of a body larger than `idempotency.max_stored_body_bytes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body_object: Option<String>,
    /// The key's expiry when the operation was accepted (the object's
    /// profile, when the operator set one since, wins).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_expires_at: Option<u64>,
}

impl StoredRequest {
    /// The path without its query (listings and the audit never show it).
    pub fn path(&self) -> &str {
        let p = &self.path_and_query;
        &p[..p.find('?').unwrap_or(p.len())]
    }
}

/// Why an operation has no answer to keep: its last attempt got none
/// (`timeout`, `unreachable`), or it ended without one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NoAnswer {
    Timeout,
    Unreachable,
    /// The origin's final answer could not be kept (larger than
    /// `max_replay_bytes`, no R2, or its storage failed): the operation ran
    /// and is not run again.
    NotKept,
    /// Every attempt the schedule allows was started and none recorded an
    /// outcome (each was cut by a crash or a failed write).
    AttemptsSpent,
    /// The request body kept in R2 was gone: nothing was sent.
    BodyMissing,
    /// The key was revoked before the next attempt: nothing more is sent.
    KeyRevoked,
    /// The key expired before the next attempt: nothing more is sent.
    KeyExpired,
}

impl NoAnswer {
    pub fn as_str(self) -> &'static str {
        match self {
            NoAnswer::Timeout => "timeout",
            NoAnswer::Unreachable => "unreachable",
            NoAnswer::NotKept => "not_kept",
            NoAnswer::AttemptsSpent => "attempts_spent",
            NoAnswer::BodyMissing => "body_missing",
            NoAnswer::KeyRevoked => "key_revoked",
            NoAnswer::KeyExpired => "key_expired",
        }
    }
}

/// One operation, as its key's object stores it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Operation {
    pub id: String,
    pub request_id: String,
    pub state: State,
    pub created_at: u64,
    /// Attempts started (a cut attempt counts).
    pub attempts: u32,
    /// A queued operation starts no earlier (a retry's delay).
    pub not_before: u64,
    /// A running attempt holds the operation until then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_until: Option<u64>,
    /// When the object's alarm looks at it again (queued: hand it to the
    /// queue; running: its lease ran out); `None` once done.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub due_at: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<u64>,
    /// [`NEVER`] until done, then `completed_at` + the plan's TTL.
    pub expires_at: u64,
    pub ttl_ms: u64,
    /// The last answer's status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// Why there is no answer to keep (the last attempt's, or the end's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<NoAnswer>,
    /// The kept answer, once done (its body beside it or in R2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response: Option<StoredResponse>,
    pub request: StoredRequest,
}

/// What an operation looks like to its project (docs/async-operations.md).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct View {
    pub id: String,
    pub state: State,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    pub request_id: String,
    pub created_at: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<u64>,
    pub method: String,
    pub path: String,
    pub attempts: u32,
    /// Why a failed operation has no answer (`key_revoked`, `not_kept`…).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<NoAnswer>,
}

impl Operation {
    /// A new operation, queued; the object's alarm hands it to the queue
    /// again at `now + requeue_ms` if no consumer started it by then.
    pub fn new(
        id: String,
        request_id: String,
        request: StoredRequest,
        ttl_ms: u64,
        now_ms: u64,
        requeue_ms: u64,
    ) -> Operation {
        Operation {
            id,
            request_id,
            state: State::Queued,
            created_at: now_ms,
            attempts: 0,
            not_before: now_ms,
            lease_until: None,
            due_at: Some(now_ms.saturating_add(requeue_ms)),
            completed_at: None,
            expires_at: NEVER,
            ttl_ms,
            status: None,
            failure: None,
            response: None,
            request,
        }
    }

    pub fn view(&self) -> View {
        View {
            id: self.id.clone(),
            state: self.state,
            status: self.status.filter(|_| self.state.is_done()),
            request_id: self.request_id.clone(),
            created_at: self.created_at,
            completed_at: self.completed_at,
            method: self.request.method.clone(),
            path: self.request.path().to_string(),
            attempts: self.attempts,
            reason: self.failure.filter(|_| self.state == State::Failed),
        }
    }

    pub fn project(&self) -> &str {
        &self.request.project
    }
}

/// What [`start`] decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Start {
    /// Run attempt `op.attempts` (now `running` under a lease).
    Run(Operation),
    /// The operation ends here, `failed`: the schedule's attempts are all
    /// spent (each was cut), or the key can no longer send.
    End(Operation),
    /// Not now (a duplicate message, an early one, a done operation).
    Not,
}

/// `start`: the consumer's claim on the next attempt. A queued operation
/// whose delay has passed, or a running one whose lease ran out (its
/// consumer died), starts attempt `attempts + 1` — unless `max_attempts`
/// were started already (then it fails: nothing runs forever), or `gone`
/// says the key was revoked or has expired (then it fails before its next
/// origin call).
pub fn start(
    op: &Operation,
    now_ms: u64,
    lease_ms: u64,
    max_attempts: u32,
    gone: Option<NoAnswer>,
) -> Start {
    let startable = match op.state {
        State::Queued => now_ms >= op.not_before,
        State::Running => op.lease_until.is_none_or(|until| now_ms >= until),
        State::Succeeded | State::Failed => false,
    };
    if !startable {
        return Start::Not;
    }
    if let Some(why) = gone {
        return Start::End(ended(op, why, now_ms));
    }
    if op.attempts >= max_attempts {
        let why = op.failure.unwrap_or(NoAnswer::AttemptsSpent);
        let why = match op.state {
            State::Running => NoAnswer::AttemptsSpent,
            _ => why,
        };
        return Start::End(ended(op, why, now_ms));
    }
    let until = now_ms.saturating_add(lease_ms);
    Start::Run(Operation {
        state: State::Running,
        attempts: op.attempts.saturating_add(1),
        lease_until: Some(until),
        due_at: Some(until),
        ..op.clone()
    })
}

/// `op` ended `failed` at `now_ms` for `why`, keeping its last status.
fn ended(op: &Operation, why: NoAnswer, now_ms: u64) -> Operation {
    Operation {
        state: State::Failed,
        failure: Some(why),
        lease_until: None,
        due_at: None,
        completed_at: Some(now_ms),
        expires_at: now_ms.saturating_add(op.ttl_ms),
        response: None,
        ..op.clone()
    }
}

/// The attempts an operation may start: one, and one more per delay of
/// the retry schedule.
pub fn max_attempts(schedule_s: &[u32]) -> u32 {
    u32::try_from(schedule_s.len())
        .unwrap_or(u32::MAX)
        .saturating_add(1)
}

/// What one attempt came back with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The origin answered (its body travels beside).
    Answer(StoredResponse),
    NoAnswer(NoAnswer),
    /// The origin gave a final answer that could not be kept (too large,
    /// or its storage failed): the operation ran; it ends `failed` with
    /// this status and is never run again.
    NotKept {
        status: u16,
    },
}

impl Outcome {
    /// An outcome that ends the operation `failed` at once: an answer not
    /// kept (it ran), or a reason it can never be sent.
    pub fn is_final_failure(&self) -> bool {
        match self {
            Outcome::NotKept { .. } => true,
            Outcome::NoAnswer(why) => !matches!(why, NoAnswer::Timeout | NoAnswer::Unreachable),
            Outcome::Answer(_) => false,
        }
    }

    /// What is recorded when this outcome, with its body, could not be:
    /// a final answer as not kept (the origin ran it: it must never run
    /// again), anything else as it is.
    pub fn without_body(&self) -> Outcome {
        match self {
            Outcome::Answer(r) if crate::idempotency::is_storable_status(r.status) => {
                Outcome::NotKept { status: r.status }
            }
            other => other.clone(),
        }
    }
}

/// A transition [`settle`] decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settled {
    pub op: Operation,
    /// Now `succeeded` or `failed`: the answer (if any) is kept, and the
    /// completion event is published.
    pub done: bool,
}

/// `settle`: attempt `attempt` came back with `outcome`.
/// - a final answer (any status §4 stores) → `succeeded`, whichever attempt
///   brought it, unless the operation is already done;
/// - otherwise only the attempt that holds the operation moves it: with
///   attempts left, `queued` again after the schedule's next delay
///   (`schedule_s`, the webhook schedule: attempt n waits `schedule_s[n-1]`);
///   the schedule spent, `failed`, keeping the last answer.
pub fn settle(
    op: &Operation,
    attempt: u32,
    outcome: &Outcome,
    schedule_s: &[u32],
    now_ms: u64,
) -> Option<Settled> {
    if op.state.is_done() {
        return None;
    }
    let (status, failure) = match outcome {
        Outcome::Answer(r) => (Some(r.status), None),
        Outcome::NoAnswer(why) => (None, Some(*why)),
        Outcome::NotKept { status } => (Some(*status), Some(NoAnswer::NotKept)),
    };
    let done = |state: State| {
        let mut next = Operation {
            state,
            status,
            failure,
            lease_until: None,
            due_at: None,
            completed_at: Some(now_ms),
            expires_at: now_ms.saturating_add(op.ttl_ms),
            response: None,
            ..op.clone()
        };
        if let Outcome::Answer(r) = outcome {
            next.response = Some(r.clone());
        }
        Some(Settled {
            op: next,
            done: true,
        })
    };
    // The origin ran it (whichever attempt says so), or it cannot be sent:
    // never run again.
    if outcome.is_final_failure() {
        return done(State::Failed);
    }
    if status.is_some_and(crate::idempotency::is_storable_status) {
        return done(State::Succeeded);
    }
    if op.state != State::Running || op.attempts != attempt {
        return None;
    }
    let delay_s = usize::try_from(attempt)
        .ok()
        .and_then(|n| n.checked_sub(1))
        .and_then(|i| schedule_s.get(i));
    match delay_s {
        None => done(State::Failed),
        Some(d) => {
            let at = now_ms.saturating_add(u64::from(*d) * 1000);
            Some(Settled {
                op: Operation {
                    state: State::Queued,
                    status,
                    failure,
                    not_before: at,
                    lease_until: None,
                    due_at: Some(at),
                    ..op.clone()
                },
                done: false,
            })
        }
    }
}

/// After the object's alarm handed a due operation to the queue: look at it
/// again in `requeue_ms`, unless it changed meanwhile (`seen_due`).
pub fn requeued(op: &Operation, seen_due: u64, now_ms: u64, requeue_ms: u64) -> Option<Operation> {
    (op.due_at == Some(seen_due) && !op.state.is_done()).then(|| Operation {
        due_at: Some(now_ms.saturating_add(requeue_ms)),
        ..op.clone()
    })
}

/// Whether the alarm should hand `op` to the queue at `now_ms`.
pub fn is_due(op: &Operation, now_ms: u64) -> bool {
    op.due_at.is_some_and(|at| now_ms >= at) && !op.state.is_done()
}

/// The event a done operation publishes: `postguard.operation.completed`
/// `{id, state, status}`, its id derived from the operation's (one per
/// operation, however often the write is retried).
pub fn completed_event(op: &Operation) -> PendingEvent {
    PendingEvent {
        id: format!("evt_{}", op.id),
        project: op.project().to_string(),
        event_type: COMPLETED_EVENT.to_string(),
        data: json!({"id": op.id, "state": op.state, "status": op.status}),
        request_id: op.request_id.clone(),
    }
}

pub const COMPLETED_EVENT: &str = "postguard.operation.completed";

/// `Retry-After` for a client polling an operation that is not done: until
/// a delayed retry's start, else a second while it is queued and two while
/// it runs (a running origin call takes a while), at most a minute.
pub fn retry_after_s(op: &Operation, now_ms: u64) -> u64 {
    match op.state {
        State::Queued if op.not_before > now_ms => op
            .not_before
            .saturating_sub(now_ms)
            .div_ceil(1000)
            .clamp(1, 60),
        State::Queued => 1,
        _ => 2,
    }
}

/// What `GET …/operations/{id}/result` answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResultAnswer {
    /// The kept answer, byte for byte.
    Stored(StoredResponse),
    /// 409 `OPERATION_NOT_DONE`, or 502 for a failed operation that never
    /// got an answer.
    Problem(Problem),
}

pub fn result(op: &Operation, now_ms: u64, timeout_ms: u32) -> ResultAnswer {
    if !op.state.is_done() {
        return ResultAnswer::Problem(
            Problem::new(
                ErrorCode::OperationNotDone,
                format!(
                    "operation {} is {}; its result is kept once it is done",
                    op.id,
                    op.state.as_str()
                ),
            )
            .with_retry_after(retry_after_s(op, now_ms)),
        );
    }
    match (&op.response, op.failure) {
        (Some(r), _) => ResultAnswer::Stored(r.clone()),
        (
            None,
            Some(
                why @ (NoAnswer::NotKept
                | NoAnswer::AttemptsSpent
                | NoAnswer::BodyMissing
                | NoAnswer::KeyRevoked
                | NoAnswer::KeyExpired),
            ),
        ) => ResultAnswer::Problem(abandoned(op, why)),
        (None, Some(NoAnswer::Timeout)) => ResultAnswer::Problem(Problem::new(
            ErrorCode::OriginUnreachable,
            format!(
                "the origin did not answer the operation's last attempt within {timeout_ms} ms"
            ),
        )),
        (None, _) => ResultAnswer::Problem(Problem::new(
            ErrorCode::OriginUnreachable,
            "the origin could not be reached on the operation's last attempt",
        )),
    }
}

/// 410 `OPERATION_ABANDONED`: the operation ended without an answer it
/// keeps, and says why.
fn abandoned(op: &Operation, why: NoAnswer) -> Problem {
    let detail = match why {
        NoAnswer::NotKept => format!(
            "operation {} ran, and the origin's answer (status {}) was too large to keep or could not be stored; it is not run again",
            op.id,
            op.status.map_or_else(|| "unknown".to_string(), |s| s.to_string())
        ),
        NoAnswer::AttemptsSpent => format!(
            "every attempt of operation {} was cut before its outcome was recorded ({} attempts)",
            op.id, op.attempts
        ),
        NoAnswer::BodyMissing => format!(
            "operation {}'s stored request body is gone: it was not sent",
            op.id
        ),
        NoAnswer::KeyRevoked => format!(
            "operation {}'s API key was revoked before its next attempt: nothing more was sent",
            op.id
        ),
        NoAnswer::KeyExpired => format!(
            "operation {}'s API key expired before its next attempt: nothing more was sent",
            op.id
        ),
        NoAnswer::Timeout | NoAnswer::Unreachable => format!("operation {} failed", op.id),
    };
    Problem::new(ErrorCode::OperationAbandoned, detail)
}

/// A page of a project's operations, newest first: those created before
/// `before` (`created_at`, `id`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Page {
    pub project: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before: Option<(u64, String)>,
    pub limit: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<State>,
}

/// The most keys' objects one page of `GET /operations` reads: a project
/// whose operations live in more keys is listed one key at a time
/// (`key=`), as the audit log bounds its fan-out.
pub const MAX_LISTED_KEYS: usize = 32;

/// The KV entry that says `key_id` of `project` holds operations (written
/// when it creates one, at most hourly per isolate; it expires after
/// [`index_ttl_s`]): what `GET /operations` visits, rather than every key
/// of the project.
pub fn index_entry(project: &str, key_id: &str) -> String {
    format!("o:{project}:{key_id}")
}

/// The prefix of a project's [`index_entry`]s.
pub fn index_prefix(project: &str) -> String {
    format!("o:{project}:")
}

/// How long an index entry outlives the last operation its key created:
/// the longest an operation lives (its retries, then the longest TTL a
/// plan keeps it), and a day.
pub fn index_ttl_s(settings: &Settings) -> u64 {
    let retries: u64 = settings
        .webhooks
        .schedule_s
        .iter()
        .map(|s| u64::from(*s))
        .sum();
    let ttl = settings
        .plans
        .values()
        .map(|p| u64::from(p.ttl_s()))
        .max()
        .unwrap_or(0);
    retries + ttl + 86_400
}

/// The key id an index entry names.
pub fn indexed_key(entry: &str, project: &str) -> Option<String> {
    let id = entry.strip_prefix(&index_prefix(project))?;
    is_key_id(id).then(|| id.to_string())
}

/// Whether `id` is an API key's id (`key_` + a ULID).
pub fn is_key_id(id: &str) -> bool {
    id.strip_prefix("key_").is_some_and(is_ulid)
}

/// Merges the pages of several objects (each newest first) into one.
pub fn merge(mut pages: Vec<View>, limit: usize) -> (Vec<View>, bool) {
    pages.sort_by(|a, b| (b.created_at, &b.id).cmp(&(a.created_at, &a.id)));
    let more = pages.len() > limit;
    pages.truncate(limit);
    (pages, more)
}

#[cfg(test)]
mod tests;
