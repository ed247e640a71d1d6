//! Every write to a webhook record, over a synchronous storage port
//! (ADR 0035). A `WebhookShard` object (`src/durable/webhook_shard.rs`)
//! implements [`WebhookStore`] over its SQLite tables and runs each of these
//! functions inside one `transactionSync`; [`MemoryStore`] implements it for
//! the property tests, which drive these same functions. The object's single
//! thread runs one call at a time, with no `await` between reading and
//! writing, so every compare-and-set here is atomic by construction.
//!
//! The delivery state machine itself is [`super::delivery`]: these functions
//! load a record, ask it ([`delivery::plan`], [`delivery::settle`],
//! [`delivery::release`], …), and store what it answered. Status values
//! appear only as [`Status`].

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::capacity::{self, Usage};
use super::delivery::{self, Attempted, Claim, Delivery, Plan, Status, Transition};
use crate::problem::{ErrorCode, Problem};

/// A stored event: the exact body delivered and its trace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventRecord {
    pub id: String,
    pub event_type: String,
    pub payload: String,
    pub created_at: u64,
    /// The X-Request-Id of the publish request.
    pub request_id: Option<String>,
    /// Its `ordering_key` ([`super::ordering`]), if published with one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ordering_key: Option<String>,
}

/// A stored delivery.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeliveryRecord {
    pub id: String,
    pub event_id: String,
    pub event_type: String,
    pub subscription_id: String,
    pub url: String,
    pub status: Status,
    pub attempts_made: u32,
    pub next_attempt_at: Option<u64>,
    pub created_at: u64,
    pub updated_at: u64,
    /// When its first attempt was handed to the queue (`None`: the outbox
    /// still holds it; a held delivery is never in the outbox).
    pub queued_at: Option<u64>,
    /// Manual attempts (retries, redirects, recover re-sends) queued.
    pub manual: u32,
    /// The X-Request-Id of the publish (its event's), filled in by a list;
    /// not a column of the delivery.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
    /// A scheduled attempt claimed and not settled is in flight until then
    /// (`delivery::Claim::in_flight_until`); never shown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claimed_until: Option<u64>,
    /// Its lane's key ([`super::ordering`]); `None`: not ordered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ordering_key: Option<String>,
    /// Its place in its lane (1, 2, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ordering_seq: Option<u64>,
    /// The delivery before it in its lane, until its gate opens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocked_by: Option<String>,
}

impl DeliveryRecord {
    /// What the state machine sees, given the subscription's state.
    pub fn snapshot(&self, sub: SubView) -> Delivery {
        Delivery {
            status: self.status,
            attempts_made: self.attempts_made,
            next_attempt_at: self.next_attempt_at,
            subscribed: sub.subscribed,
            held: sub.held,
            in_flight_until: self.claimed_until,
        }
    }

    /// A status write (settle, hold, release): no attempt is in flight after it.
    fn apply(&mut self, w: &delivery::Write, now: u64) -> bool {
        if self.status != w.expect.status || self.attempts_made != w.expect.attempts_made {
            return false;
        }
        self.status = w.status;
        self.next_attempt_at = w.next_attempt_at;
        self.claimed_until = None;
        self.updated_at = now;
        true
    }
}

/// A delivery as the log shows it (`GET /deliveries`): the record without
/// what only the state machine reads, with its event's `request_id`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeliveryView {
    pub id: String,
    pub event_id: String,
    pub event_type: String,
    pub subscription_id: String,
    pub url: String,
    pub status: Status,
    pub attempts_made: u32,
    pub next_attempt_at: Option<u64>,
    pub created_at: u64,
    /// The X-Request-Id of the publish request that created it (trace).
    pub request_id: Option<String>,
    /// Its event's `ordering_key`, if any.
    pub ordering_key: Option<String>,
    /// The delivery it waits for in its lane (its first attempt does not
    /// start before that one is `delivered` or `dead_letter`).
    pub blocked_by: Option<String>,
}

impl DeliveryRecord {
    /// How the log shows it, with its event's `request_id` (a list fills
    /// the record's own; a detail reads it from the event).
    pub fn view(self, request_id: Option<String>) -> DeliveryView {
        DeliveryView {
            request_id: request_id.or(self.request_id),
            id: self.id,
            event_id: self.event_id,
            event_type: self.event_type,
            subscription_id: self.subscription_id,
            url: self.url,
            status: self.status,
            attempts_made: self.attempts_made,
            next_attempt_at: self.next_attempt_at,
            created_at: self.created_at,
            ordering_key: self.ordering_key,
            blocked_by: self.blocked_by,
        }
    }
}

/// One attempt as the delivery log shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptRecord {
    pub delivery_id: String,
    pub request_id: String,
    pub attempt: u32,
    pub url: String,
    pub status_code: Option<u16>,
    pub error: Option<String>,
    pub response_excerpt: Option<String>,
    pub duration_ms: u64,
    pub at: u64,
    pub next_retry_at: Option<u64>,
    /// What the request's headers do not say of themselves: its
    /// `webhook-timestamp` and its `webhook-signature`, redacted
    /// ([`super::trace`]); `None` for attempts recorded before 0.4 and
    /// attempts never sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signed: Option<super::trace::Signed>,
    /// The receiver's response headers, bounded ([`super::trace::response_headers`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_headers: Option<Vec<(String, String)>>,
}

/// The subscription as the shell read it (D1): whether it still exists and
/// whether it is paused or disabled.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubView {
    pub subscribed: bool,
    pub held: bool,
}

/// What one shard stores. Synchronous: see the module doc.
pub trait WebhookStore {
    type Error;
    fn event(&mut self, id: &str) -> Result<Option<EventRecord>, Self::Error>;
    /// Inserts the event (its id is new in this shard).
    fn insert_event(&mut self, e: &EventRecord) -> Result<(), Self::Error>;
    fn delivery(&mut self, id: &str) -> Result<Option<DeliveryRecord>, Self::Error>;
    /// Inserts or replaces the delivery row.
    fn put_delivery(&mut self, d: &DeliveryRecord) -> Result<(), Self::Error>;
    fn deliveries_of(&mut self, event_id: &str) -> Result<Vec<DeliveryRecord>, Self::Error>;
    /// Inserts the attempt; one already stored (same delivery and request id) stays.
    fn insert_attempt(&mut self, a: &AttemptRecord) -> Result<(), Self::Error>;
    fn attempts(&mut self, delivery_id: &str) -> Result<Vec<AttemptRecord>, Self::Error>;
    /// The attempts at or after `since` of these subscriptions, counted per
    /// subscription and URL ([`super::health::TALLY_SQL`]).
    fn health(
        &mut self,
        subscription_ids: &[&str],
        since: u64,
    ) -> Result<Vec<super::health::Tally>, Self::Error>;
    /// Deliveries never queued, created at or before `before`, oldest first.
    fn unsent(&mut self, before: u64, limit: usize) -> Result<Vec<DeliveryRecord>, Self::Error>;
    /// `paused` deliveries of a subscription, in creation order.
    fn held(
        &mut self,
        subscription_id: &str,
        limit: usize,
    ) -> Result<Vec<DeliveryRecord>, Self::Error>;
    /// Deliveries whose `blocked_by` is `id` (its lane's next), at most `limit`.
    fn blocked_on(&mut self, id: &str, limit: usize) -> Result<Vec<DeliveryRecord>, Self::Error>;
    /// In-progress deliveries whose next attempt is before `before`.
    fn overdue(&mut self, before: u64, limit: usize) -> Result<Vec<DeliveryRecord>, Self::Error>;
    /// Failed or dead-lettered deliveries of a subscription created in
    /// `[since, until]` after `(created_at, id)`, oldest first.
    fn recoverable(
        &mut self,
        subscription_id: &str,
        since: u64,
        until: u64,
        after: &(u64, String),
        limit: usize,
    ) -> Result<Vec<DeliveryRecord>, Self::Error>;
    /// Newest first, each with its event's `request_id`.
    fn list(&mut self, q: &DeliveryQuery, limit: usize)
        -> Result<Vec<DeliveryRecord>, Self::Error>;
    fn feed(&mut self, q: &EventQuery, limit: usize) -> Result<Vec<FeedRow>, Self::Error>;
    fn usage(&mut self, day: u64) -> Result<Usage, Self::Error>;
    fn put_usage(&mut self, day: u64, u: &Usage) -> Result<(), Self::Error>;
    /// Drops the day counters before `day` (retention).
    fn drop_usage_before(&mut self, day: u64) -> Result<(), Self::Error>;
    /// The shard's storage size (bytes).
    fn size(&mut self) -> Result<u64, Self::Error>;
    /// The in-progress delivery whose next attempt is the earliest:
    /// `(next_attempt_at, id)` (the alerts' queue lag). One waiting for its
    /// lane's predecessor is not late: it keeps its time in the past.
    fn oldest_due(&mut self) -> Result<Option<(u64, String)>, Self::Error>;
    /// Deliveries created in `[since, until)` after `(created_at, id)`,
    /// oldest first, each with its event's `request_id` (the archive).
    fn oldest(
        &mut self,
        since: u64,
        until: u64,
        after: &(u64, String),
        limit: usize,
    ) -> Result<Vec<DeliveryRecord>, Self::Error>;

    // Batched forms of the above, for the hot paths (publish, claim,
    // settle, marks): an adapter answers each with one statement; these
    // defaults loop over the single-row forms.

    /// The stored events among `ids`.
    fn events(&mut self, ids: &[&str]) -> Result<Vec<EventRecord>, Self::Error> {
        gather(ids, |id| self.event(id))
    }
    fn insert_events(&mut self, es: &[EventRecord]) -> Result<(), Self::Error> {
        es.iter().try_for_each(|e| self.insert_event(e))
    }
    /// The stored deliveries among `ids`.
    fn deliveries(&mut self, ids: &[&str]) -> Result<Vec<DeliveryRecord>, Self::Error> {
        gather(ids, |id| self.delivery(id))
    }
    fn put_deliveries(&mut self, ds: &[DeliveryRecord]) -> Result<(), Self::Error> {
        ds.iter().try_for_each(|d| self.put_delivery(d))
    }
    fn insert_attempts(&mut self, rows: &[AttemptRecord]) -> Result<(), Self::Error> {
        rows.iter().try_for_each(|a| self.insert_attempt(a))
    }
    /// The attempts of these deliveries (any order).
    fn attempts_of(&mut self, ids: &[&str]) -> Result<Vec<AttemptRecord>, Self::Error> {
        gather(ids, |id| self.attempts(id))
    }
}

/// Each id's rows from a single-row read, gathered: the default of every
/// batched read above (an adapter answers each with one statement).
fn gather<T, I, E>(ids: &[&str], mut one: impl FnMut(&str) -> Result<I, E>) -> Result<Vec<T>, E>
where
    I: IntoIterator<Item = T>,
{
    let mut out = Vec::new();
    for id in ids {
        out.extend(one(id)?);
    }
    Ok(out)
}

/// Deliveries read once for a call, changed in memory, written once: the
/// batched form of read-modify-write that the single-threaded shard allows.
struct Loaded {
    rows: BTreeMap<String, DeliveryRecord>,
    changed: Vec<String>,
}

impl Loaded {
    fn of<S: WebhookStore>(s: &mut S, ids: &[&str]) -> Result<Loaded, S::Error> {
        let rows = s
            .deliveries(ids)?
            .into_iter()
            .map(|d| (d.id.clone(), d))
            .collect();
        Ok(Loaded {
            rows,
            changed: Vec::new(),
        })
    }

    fn get(&self, id: &str) -> Option<DeliveryRecord> {
        self.rows.get(id).cloned()
    }

    fn put(&mut self, d: DeliveryRecord) {
        if !self.changed.contains(&d.id) {
            self.changed.push(d.id.clone());
        }
        self.rows.insert(d.id.clone(), d);
    }

    fn write<S: WebhookStore>(self, s: &mut S) -> Result<(), S::Error> {
        let rows: Vec<DeliveryRecord> = self
            .changed
            .iter()
            .filter_map(|id| self.rows.get(id).cloned())
            .collect();
        if rows.is_empty() {
            return Ok(());
        }
        s.put_deliveries(&rows)
    }
}

/// The limits a shard admits a publish against (from the settings).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    pub events_per_day: u64,
    pub deliveries_per_day: u64,
    pub bytes_per_day: u64,
    /// A shard at this size refuses its project's publishes.
    pub high_water_bytes: u64,
    /// Bytes charged per delivery ([`capacity::delivery_bytes`]).
    pub delivery_bytes: u64,
    /// Bytes the project was charged today outside its shards (inspectors
    /// and their captures, in D1): the bytes quota is the project's.
    #[serde(default)]
    pub bytes_elsewhere: u64,
}

/// Why a shard refused to store an event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "refused", rename_all = "snake_case")]
pub enum Refusal {
    Quota { what: String, n: u64, quota: u64 },
    Full { bytes: u64, high_water: u64 },
}

impl Refusal {
    /// 429 `EVENT_QUOTA_EXCEEDED` or 503 `STORAGE_FULL`, with Retry-After.
    pub fn problem(&self, project: &str, now: u64) -> Problem {
        let shown: String = project.chars().take(64).collect();
        match self {
            Refusal::Quota { what, n, quota } => Problem::new(
                ErrorCode::EventQuotaExceeded,
                format!("project {shown} reached its daily quota of {quota} {what} ({n} today, UTC); it resets at 00:00 UTC"),
            )
            .with_retry_after(capacity::until_next_day_s(now)),
            Refusal::Full { bytes, high_water } => Problem::new(
                ErrorCode::StorageFull,
                format!("project {shown}'s webhook storage for this period is full ({bytes} of {high_water} bytes); no event of this project is accepted until retention frees space"),
            )
            .with_retry_after(capacity::until_next_sweep_s(now)),
        }
    }
}

/// One event to store, planned by the shell ([`super::fanout`] rules):
/// the payload and one delivery per matching subscription.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewEvent {
    pub event: EventRecord,
    pub deliveries: Vec<NewDelivery>,
    /// No attempt before this time (epoch ms, already bounded by
    /// [`super::schedule::deliver_at`]): the deliveries' `next_attempt_at`
    /// and their first job's time ([`super::schedule::first_attempt_at`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deliver_at: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewDelivery {
    pub id: String,
    pub subscription_id: String,
    pub url: String,
    /// Its subscription is paused or disabled: created `paused`, not queued.
    pub held: bool,
    /// Its lane and place ([`super::ordering::chain`]), when the event has
    /// an `ordering_key`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lane: Option<Placed>,
}

/// A keyed delivery's place in its lane, as the project's object chained it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placed {
    pub ordering_key: String,
    pub seq: u64,
    pub blocked_by: Option<String>,
}

/// A scheduled attempt to queue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FirstJob {
    pub delivery_id: String,
    pub subscription_id: String,
    /// Its planned time (`next_attempt_at`).
    pub at: u64,
}

impl FirstJob {
    fn of(d: &DeliveryRecord, at: u64) -> FirstJob {
        FirstJob {
            delivery_id: d.id.clone(),
            subscription_id: d.subscription_id.clone(),
            at,
        }
    }
}

/// What storing one event came to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Stored {
    /// Stored now; queue these.
    Stored {
        jobs: Vec<FirstJob>,
    },
    /// The id was stored before; these of its jobs are still unsent.
    Known {
        jobs: Vec<FirstJob>,
    },
    Refused {
        refusal: Refusal,
    },
}

/// Stores each event with its deliveries and outbox entries (in the one
/// transaction the caller runs this in), each admitted against the shard's
/// day counters as the ones before it left them. The one write path of
/// every event: HTTP publishes, operational events (ADR 0035).
pub fn publish<S: WebhookStore>(
    s: &mut S,
    events: &[NewEvent],
    limits: &Limits,
    now: u64,
) -> Result<Vec<Stored>, S::Error> {
    let day = capacity::utc_day(now);
    let mut usage = s.usage(day)?;
    let size = s.size()?;
    let ids: Vec<&str> = events.iter().map(|e| e.event.id.as_str()).collect();
    let mut known: BTreeMap<String, Vec<FirstJob>> = BTreeMap::new();
    for e in s.events(&ids)? {
        let jobs = unsent_of(s, &e.id)?;
        known.insert(e.id, jobs);
    }
    let mut out = Vec::with_capacity(events.len());
    let (mut new_events, mut new_deliveries) = (Vec::new(), Vec::new());
    for ev in events {
        if let Some(jobs) = known.get(&ev.event.id) {
            out.push(Stored::Known { jobs: jobs.clone() });
            continue;
        }
        if let Some(refusal) = admit(usage, size, limits) {
            out.push(Stored::Refused { refusal });
            continue;
        }
        let mut jobs = Vec::new();
        let first_at = super::schedule::first_attempt_at(ev.event.created_at, ev.deliver_at);
        for d in &ev.deliveries {
            // A held subscription's delivery due later is queued for its
            // time like any other and held then if still held: created
            // `paused` it would lose its time and a resume before it would
            // send it early.
            let (status, next) = if d.held && first_at <= ev.event.created_at {
                (Status::Paused, None)
            } else {
                (Status::Pending, Some(first_at))
            };
            let record = DeliveryRecord {
                id: d.id.clone(),
                event_id: ev.event.id.clone(),
                event_type: ev.event.event_type.clone(),
                subscription_id: d.subscription_id.clone(),
                url: d.url.clone(),
                status,
                attempts_made: 0,
                next_attempt_at: next,
                created_at: ev.event.created_at,
                updated_at: ev.event.created_at,
                queued_at: None,
                manual: 0,
                request_id: None,
                claimed_until: None,
                ordering_key: d.lane.as_ref().map(|l| l.ordering_key.clone()),
                ordering_seq: d.lane.as_ref().map(|l| l.seq),
                blocked_by: d.lane.as_ref().and_then(|l| l.blocked_by.clone()),
            };
            if let Some(at) = next {
                jobs.push(FirstJob::of(&record, at));
            }
            new_deliveries.push(record);
        }
        let n = ev.deliveries.len() as u64;
        usage = Usage {
            events: usage.events + 1,
            deliveries: usage.deliveries + n,
            bytes: usage.bytes
                + ev.event.payload.len() as u64
                + capacity::measured::EVENT_OVERHEAD
                + capacity::measured::EVENT_REQUEST
                + n * limits.delivery_bytes,
        };
        // The same id again later in this call is a repeat of this one.
        known.insert(ev.event.id.clone(), jobs.clone());
        new_events.push(ev.event.clone());
        out.push(Stored::Stored { jobs });
    }
    if !new_events.is_empty() {
        s.insert_events(&new_events)?;
        s.put_deliveries(&new_deliveries)?;
        s.put_usage(day, &usage)?;
    }
    Ok(out)
}

/// The first refusal of the shard's day counters or size, if any.
fn admit(u: Usage, size: u64, l: &Limits) -> Option<Refusal> {
    if size >= l.high_water_bytes {
        return Some(Refusal::Full {
            bytes: size,
            high_water: l.high_water_bytes,
        });
    }
    [
        ("events", u.events, l.events_per_day),
        ("deliveries", u.deliveries, l.deliveries_per_day),
        (
            "bytes",
            u.bytes.saturating_add(l.bytes_elsewhere),
            l.bytes_per_day,
        ),
    ]
    .into_iter()
    .find(|(_, n, quota)| n >= quota)
    .map(|(what, n, quota)| Refusal::Quota {
        what: what.to_string(),
        n,
        quota,
    })
}

fn unsent_of<S: WebhookStore>(s: &mut S, event_id: &str) -> Result<Vec<FirstJob>, S::Error> {
    Ok(s.deliveries_of(event_id)?
        .into_iter()
        .filter(|d| d.queued_at.is_none())
        .filter_map(|d| d.next_attempt_at.map(|at| FirstJob::of(&d, at)))
        .collect())
}

/// Records first attempts handed to the queue (the outbox drains).
pub fn mark_sent<S: WebhookStore>(s: &mut S, ids: &[String], now: u64) -> Result<(), S::Error> {
    if ids.is_empty() {
        return Ok(());
    }
    let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    let mut loaded = Loaded::of(s, &refs)?;
    for id in ids {
        if let Some(mut d) = loaded.get(id).filter(|d| d.queued_at.is_none()) {
            d.queued_at = Some(now);
            loaded.put(d);
        }
    }
    loaded.write(s)
}

/// The outbox sweep: deliveries left unsent since `before`; they are marked
/// sent by the caller once queued.
pub fn unsent<S: WebhookStore>(
    s: &mut S,
    before: u64,
    limit: usize,
) -> Result<Vec<FirstJob>, S::Error> {
    Ok(s.unsent(before, limit)?
        .into_iter()
        .map(|d| FirstJob::of(&d, d.next_attempt_at.unwrap_or(d.created_at)))
        .collect())
}

/// One queue job to plan: the delivery, what the message asks, and the
/// subscription as the shell read it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimJob {
    pub delivery_id: String,
    pub job: JobKind,
    pub sub: SubView,
    /// Its lane's predecessor as the consumer read it elsewhere (after a
    /// [`Claimed::Read`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predecessor: Option<PredRead>,
}

/// [`delivery::Job`] on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum JobKind {
    Scheduled { at: u64 },
    ManualRetry,
    Redirect,
    DeadLetterQueue { scheduled_at: Option<u64> },
}

impl From<delivery::Job> for JobKind {
    fn from(j: delivery::Job) -> Self {
        match j {
            delivery::Job::Scheduled { at } => JobKind::Scheduled { at },
            delivery::Job::ManualRetry => JobKind::ManualRetry,
            delivery::Job::Redirect => JobKind::Redirect,
            delivery::Job::DeadLetterQueue { scheduled_at } => {
                JobKind::DeadLetterQueue { scheduled_at }
            }
        }
    }
}

impl From<JobKind> for delivery::Job {
    fn from(j: JobKind) -> Self {
        match j {
            JobKind::Scheduled { at } => delivery::Job::Scheduled { at },
            JobKind::ManualRetry => delivery::Job::ManualRetry,
            JobKind::Redirect => delivery::Job::Redirect,
            JobKind::DeadLetterQueue { scheduled_at } => {
                delivery::Job::DeadLetterQueue { scheduled_at }
            }
        }
    }
}

/// What a job may do, decided and claimed in one step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "claimed", rename_all = "snake_case")]
pub enum Claimed {
    /// Send attempt `claim.attempt.number` (claimed), or record it as given
    /// up (`gave_up`), with what the attempt needs.
    Send {
        claim: ClaimWire,
        gave_up: Option<GiveUpWire>,
        delivery: Box<DeliveryRecord>,
        payload: String,
    },
    /// Not due: send the job again after `delay_s`.
    Wait { delay_s: u64 },
    /// Now `paused` (its subscription is not active).
    Held,
    /// Nothing to do (superseded, finished, gone).
    Dropped,
    /// No such delivery in this shard (it may be a legacy row not moved yet).
    Missing,
    /// Its lane's predecessor `by` is not settled: send the job again after
    /// `delay_s`. Nothing claimed, no attempt number used.
    Blocked { by: String, delay_s: u64 },
    /// Read its lane's predecessor (in its shard, else its reservation in
    /// the project's object), then claim again with it.
    Read {
        predecessor: String,
        ordering_key: String,
    },
}

/// Plans each job ([`delivery::plan`]) and applies the claim or the hold at
/// once: the shard runs one call at a time, so no other attempt can move
/// the delivery between the plan and its write — a compare-and-set on
/// (delivery, attempt number). A scheduled attempt claimed is in flight
/// for `lease_ms`: another copy of its job meanwhile waits and sends
/// nothing.
pub fn claim<S: WebhookStore>(
    s: &mut S,
    jobs: &[ClaimJob],
    now: u64,
    lease_ms: u64,
) -> Result<Vec<Claimed>, S::Error> {
    let ids: Vec<&str> = jobs.iter().map(|j| j.delivery_id.as_str()).collect();
    let mut loaded = Loaded::of(s, &ids)?;
    loaded.add_predecessors(s)?;
    let mut out = Vec::with_capacity(jobs.len());
    for j in jobs {
        out.push(claim_one(&mut loaded, j, now, lease_ms));
    }
    loaded.write(s)?;
    // The payloads the claimed attempts send, in one read.
    let mut wanted: Vec<&str> = out
        .iter()
        .filter_map(|c| match c {
            Claimed::Send { delivery, .. } => Some(delivery.event_id.as_str()),
            _ => None,
        })
        .collect();
    wanted.sort_unstable();
    wanted.dedup();
    let payloads: BTreeMap<String, String> = s
        .events(&wanted)?
        .into_iter()
        .map(|e| (e.id, e.payload))
        .collect();
    for c in &mut out {
        if let Claimed::Send {
            delivery, payload, ..
        } = c
        {
            payload.clone_from(payloads.get(&delivery.event_id).unwrap_or(&String::new()));
        }
    }
    Ok(out)
}

/// One job against the deliveries as this call has left them; the claim
/// (or hold) is written to `loaded`, the payload filled in by [`claim`].
fn claim_one(loaded: &mut Loaded, j: &ClaimJob, now: u64, lease_ms: u64) -> Claimed {
    let Some(mut d) = loaded.get(&j.delivery_id) else {
        return Claimed::Missing;
    };
    let plan = match lanes::gate(loaded, &mut d, j, now, lease_ms) {
        Ok(plan) => plan,
        Err(waits) => return waits,
    };
    let (claim, gave_up) = match plan {
        Plan::Send(c) => (c, None),
        Plan::GiveUp(c, why) => (c, Some(why)),
        Plan::Wait { delay_s } => return Claimed::Wait { delay_s },
        Plan::Hold(w) => {
            return if d.apply(&w, now) {
                loaded.put(d);
                Claimed::Held
            } else {
                Claimed::Dropped
            }
        }
        Plan::Drop(_) => return Claimed::Dropped,
    };
    let claimed = claim.claimed(&d.snapshot(j.sub));
    d.attempts_made = claimed.attempts_made;
    d.claimed_until = claimed.in_flight_until;
    d.updated_at = now;
    loaded.put(d.clone());
    Claimed::Send {
        claim: claim.into(),
        gave_up: gave_up.map(Into::into),
        delivery: Box::new(d),
        payload: String::new(),
    }
}

/// Attempt `number` of the delivery was claimed but not sent (the consumer
/// failed before sending, and the queue will hand its job over again): it
/// is no longer in flight, so that job claims the next attempt at once
/// rather than wait for the lease. `false`: a later attempt was claimed
/// meanwhile, or none is in flight (nothing changes).
pub fn unclaim<S: WebhookStore>(
    s: &mut S,
    delivery_id: &str,
    number: u32,
    now: u64,
) -> Result<bool, S::Error> {
    let Some(mut d) = s.delivery(delivery_id)? else {
        return Ok(false);
    };
    if d.attempts_made != number || d.claimed_until.is_none() {
        return Ok(false);
    }
    d.claimed_until = None;
    d.updated_at = now;
    s.put_delivery(&d)?;
    Ok(true)
}

/// An attempt's outcome to record and settle.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Settle {
    pub claim: ClaimWire,
    pub result: AttemptedWire,
    pub row: AttemptRecord,
    pub sub: SubView,
}

/// Records each attempt and settles it ([`delivery::settle`]) on the
/// delivery as it is now, at the time the attempt ended (`at` +
/// `duration_ms`: the same time the consumer computed its follow-up at, so
/// an unchanged delivery settles to the very job already queued); the
/// follow-up jobs to queue (a retry's next attempt), per attempt.
pub fn settle<S: WebhookStore>(
    s: &mut S,
    attempts: &[Settle],
    schedule: &[u32],
    now: u64,
) -> Result<Settled, S::Error> {
    let ids: Vec<&str> = attempts
        .iter()
        .map(|a| a.row.delivery_id.as_str())
        .collect();
    let mut loaded = Loaded::of(s, &ids)?;
    let mut rows = Vec::with_capacity(attempts.len());
    let mut out = Vec::with_capacity(attempts.len());
    let mut settled = Vec::new();
    for a in attempts {
        let claim: Claim = a.claim.into();
        let result: Attempted = a.result.clone().into();
        let Some(mut d) = loaded.get(&a.row.delivery_id) else {
            out.push(None);
            continue;
        };
        let ended = a.row.at.saturating_add(a.row.duration_ms);
        let t: Transition =
            delivery::settle(&d.snapshot(a.sub), &claim.attempt, &result, schedule, ended);
        if let Some(w) = &t.write {
            let before = d.status;
            if d.apply(w, now) {
                if super::ordering::wakes(before, d.status) {
                    settled.push(d.id.clone());
                }
                loaded.put(d);
            }
        }
        let mut row = a.row.clone();
        row.next_retry_at = t.follow_up.map(|f| f.at);
        rows.push(row);
        out.push(t.follow_up);
    }
    loaded.write(s)?;
    if !rows.is_empty() {
        s.insert_attempts(&rows)?;
    }
    Ok(Settled {
        follow_ups: out,
        wakes: lanes::woken(s, &settled)?,
    })
}

/// What [`settle`] came to: each attempt's follow-up, and the first jobs
/// of the deliveries its settled deliveries were blocking (to send at once:
/// their gate opens).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settled {
    pub follow_ups: Vec<Option<delivery::FollowUp>>,
    pub wakes: Vec<FirstJob>,
}

/// Resume: up to `limit` of the subscription's `paused` deliveries back to
/// `pending`, due at `now` ([`delivery::release`]), in creation order; the
/// jobs released (to queue, in order).
pub fn release<S: WebhookStore>(
    s: &mut S,
    subscription_id: &str,
    limit: usize,
    now: u64,
) -> Result<Vec<FirstJob>, S::Error> {
    let mut out = Vec::new();
    for mut d in s.held(subscription_id, limit)? {
        let view = SubView {
            subscribed: true,
            held: false,
        };
        if let Some(w) = delivery::release(&d.snapshot(view), now) {
            if d.apply(&w, now) {
                s.put_delivery(&d)?;
                out.push(FirstJob::of(&d, now));
            }
        }
    }
    Ok(out)
}

mod lanes;
mod memory;
mod operator;
mod query;
#[cfg(test)]
mod tests;
mod wire;

pub use lanes::{peek, PredRead};
pub use memory::MemoryStore;
pub use operator::*;
pub use query::*;
pub use wire::*;
