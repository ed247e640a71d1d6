//! The delivery state machine (ADR 0009): what a queue job may do to a
//! delivery, and what an attempt's result does to it. Pure: the shell loads
//! the delivery, asks [`plan`], claims the attempt number with a
//! compare-and-set write, sends, asks [`settle`], and applies the
//! [`Transition`] with another compare-and-set write.
//!
//! | from              | event                                                        | to            |
//! |-------------------|--------------------------------------------------------------|---------------|
//! | (publish)         |                                                              | `pending`     |
//! | `pending`/`failed`| 2xx                                                          | `delivered`   |
//! | `pending`/`failed`| 5xx, 3xx, timeout, network error, 429 — attempts left        | `failed` + the next attempt |
//! | `pending`/`failed`| other 4xx; the last attempt failed; subscription deleted; dead-letter queue | `dead_letter` |
//! | `dead_letter`     | manual retry, 2xx                                            | `delivered`   |
//! | `delivered`       | anything (a redirect still sends)                            | `delivered`   |
//! | (publish)         | the subscription is paused or disabled                       | `paused`      |
//! | `pending`/`failed`| its scheduled job runs while the subscription is paused or disabled | `paused` |
//! | `paused`          | resume (the subscription is active again)                    | `pending`, due now |
//! | `paused`          | manual retry, 2xx                                            | `delivered`   |
//!
//! Rules the property tests hold for any interleaving of jobs and results:
//! - `delivered` never changes again and is never sent again, except by an
//!   explicit redirect (which leaves the status alone);
//! - a final status (`delivered`, `dead_letter`) only ever becomes
//!   `delivered`;
//! - an attempt number is claimed before sending, one above the last one
//!   claimed, so numbers strictly increase and are never reused;
//! - scheduled attempts follow the configured schedule ([`retry::classify`]).
//!
//! - `paused` is held, not attempted and never lost: it has no next attempt,
//!   exists only while its subscription is not active (the hold is a
//!   compare-and-set that also requires that), and resume ([`release`]) puts
//!   it back on its schedule, due at once, in creation order (ADR 0014).

use serde::{Deserialize, Serialize};

use super::retry::{self, AttemptResult, Outcome};

/// A delivery's status, as stored and as the delivery log shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Published, no attempt recorded yet.
    Pending,
    /// The receiver accepted it (2xx). Final.
    Delivered,
    /// The last attempt failed; the next one is due at `next_attempt_at`.
    Failed,
    /// Given up: refused (4xx), out of attempts, subscription deleted, or the
    /// gateway failed on it repeatedly. Final, except for a manual retry.
    DeadLetter,
    /// Held while its subscription is paused or disabled: no attempt is due;
    /// resume puts it back to `pending`.
    Paused,
}

impl Status {
    pub const ALL: [Status; 5] = [
        Status::Pending,
        Status::Delivered,
        Status::Failed,
        Status::DeadLetter,
        Status::Paused,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pending => "pending",
            Status::Delivered => "delivered",
            Status::Failed => "failed",
            Status::DeadLetter => "dead_letter",
            Status::Paused => "paused",
        }
    }

    pub fn parse(s: &str) -> Option<Status> {
        Status::ALL.into_iter().find(|x| x.as_str() == s)
    }

    /// Still on its schedule: a scheduled attempt may run.
    pub fn in_progress(self) -> bool {
        matches!(self, Status::Pending | Status::Failed)
    }

    /// Finished: no scheduled attempt runs any more, and none will.
    pub fn is_final(self) -> bool {
        matches!(self, Status::Delivered | Status::DeadLetter)
    }

    /// `pending, delivered, failed, dead_letter, paused` (for validation messages).
    pub fn list() -> String {
        Status::ALL.map(Status::as_str).join(", ")
    }
}

/// What the consumer knows of a delivery when it decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivery {
    pub status: Status,
    /// The last attempt number claimed (attempts started, sent or not).
    pub attempts_made: u32,
    /// When the scheduled attempt is due (epoch ms); the identity of the one
    /// live scheduled job.
    pub next_attempt_at: Option<u64>,
    /// The subscription still exists (it holds the signing secret).
    pub subscribed: bool,
    /// The subscription is paused or disabled: scheduled attempts are held.
    pub held: bool,
    /// A scheduled attempt claimed and not settled yet is in flight until
    /// then (its lease): another copy of its job waits rather than sends.
    pub in_flight_until: Option<u64>,
}

/// What a queue message asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Job {
    /// The attempt planned for `at` (epoch ms).
    Scheduled { at: u64 },
    /// `POST /deliveries/{id}/retry`.
    ManualRetry,
    /// `POST /deliveries/{id}/redirect`: send once elsewhere.
    Redirect,
    /// A message the main queue's consumer failed on repeatedly, from the
    /// dead-letter queue; `scheduled_at` is set when it was a scheduled job.
    DeadLetterQueue { scheduled_at: Option<u64> },
}

impl Job {
    /// The job a queue message carries (`not_before`, `manual`, a redirect
    /// URL), or `None` when it asks for nothing: a redirect that reached the
    /// dead-letter queue never changes a status, and a non-manual message
    /// without a planned time matches no schedule.
    pub fn from_message(
        not_before: Option<u64>,
        manual: bool,
        redirect: bool,
        from_dead_letter_queue: bool,
    ) -> Option<Job> {
        match (from_dead_letter_queue, redirect, manual, not_before) {
            (true, true, _, _) => None,
            (true, false, true, _) => Some(Job::DeadLetterQueue { scheduled_at: None }),
            (true, false, false, at) => at.map(|at| Job::DeadLetterQueue {
                scheduled_at: Some(at),
            }),
            (false, true, _, _) => Some(Job::Redirect),
            (false, false, true, _) => Some(Job::ManualRetry),
            (false, false, false, at) => at.map(|at| Job::Scheduled { at }),
        }
    }
}

/// How an attempt's result counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Drives the schedule: failure → `failed` with the next attempt, or
    /// `dead_letter`.
    Schedule,
    /// A manual retry of a dead-lettered delivery: success → `delivered`,
    /// failure leaves it `dead_letter`.
    Final,
    /// A redirect: recorded, the status stays.
    Redirect,
}

/// The compare-and-set condition of a write: the delivery is still as seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expect {
    pub status: Status,
    pub attempts_made: u32,
}

impl Expect {
    pub fn of(d: &Delivery) -> Expect {
        Expect {
            status: d.status,
            attempts_made: d.attempts_made,
        }
    }
}

/// Claim attempt `attempt.number`: `attempts_made = number` where the
/// delivery is still `expect`. Whoever loses sends nothing. A scheduled
/// attempt also marks the delivery in flight until its lease ends
/// (`in_flight_until`), so no other copy of its job sends meanwhile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claim {
    pub expect: Expect,
    pub attempt: Attempt,
    pub in_flight_until: Option<u64>,
}

impl Claim {
    /// The delivery once the claim is written.
    pub fn claimed(&self, d: &Delivery) -> Delivery {
        Delivery {
            attempts_made: self.attempt.number,
            in_flight_until: self.in_flight_until.or(d.in_flight_until),
            ..*d
        }
    }
}

/// One claimed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attempt {
    pub number: u32,
    pub mode: Mode,
    /// `next_attempt_at` when it was claimed: while it is unchanged, no other
    /// attempt has moved the schedule since.
    pub planned_next: Option<u64>,
}

/// Why an attempt is recorded without sending.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GiveUp {
    SubscriptionDeleted,
    /// The consumer failed on the message `max_retries` times.
    GatewayFailure,
}

impl GiveUp {
    pub fn reason(self) -> &'static str {
        match self {
            GiveUp::SubscriptionDeleted => "the subscription was deleted",
            GiveUp::GatewayFailure => {
                "the delivery job failed repeatedly inside the gateway (dead-letter queue)"
            }
        }
    }
}

/// Why a job does nothing (acknowledged).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dropped {
    /// A scheduled job that is no longer the delivery's next attempt
    /// (a duplicate, or one a manual retry took over).
    Superseded,
    /// `delivered` is never sent again (but by a redirect).
    AlreadyDelivered,
    /// A dead-letter-queue job for a delivery that already finished.
    Finished,
    /// A manual retry or redirect after the subscription (and its secret) went.
    NoSubscription,
    /// A dead-letter-queue job for a delivery held as `paused`.
    Held,
}

/// What to do with one job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// Claim, then send.
    Send(Claim),
    /// Claim, then record the attempt as not sent and settle it
    /// ([`Attempted::GaveUp`]).
    GiveUp(Claim, GiveUp),
    /// Not due yet: send the job again with this delay (one queue hop).
    Wait {
        delay_s: u64,
    },
    /// The subscription is paused or disabled: write `paused` (compare-and-set,
    /// which also requires the subscription still not active; a lost one runs
    /// again on a fresh read). Nothing is sent.
    Hold(Write),
    Drop(Dropped),
}

/// How long a claimed scheduled attempt is in flight: the receiver's
/// timeout (`webhooks.timeout_ms`) and 30 s for the consumer to record
/// what it got. Past it the attempt counts as lost with its consumer, and
/// another copy of its job claims the next attempt.
pub fn attempt_lease_ms(timeout_ms: u32) -> u64 {
    u64::from(timeout_ms).saturating_add(30_000)
}

/// The delay after which a job that lost its claim (or met another job of
/// its delivery in the same batch) runs again, on a fresh snapshot.
pub const CONTENDED_DELAY_S: u64 = 1;

/// Where a job of one queue batch goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// Runs in this batch.
    Run,
    /// A copy of a scheduled job already running in this batch (a duplicate
    /// message): acknowledged, nothing more.
    Copy,
    /// Another job of a delivery that runs in this batch: sent again
    /// [`CONTENDED_DELAY_S`] later, planned on what that one leaves.
    Later,
}

/// The places of a batch's jobs, in the batch's order: the first job of
/// each delivery runs; a repeat of a scheduled job that runs is a copy
/// (manual jobs are distinct requests, never copies); any other job of a
/// delivery that runs waits.
pub fn place_batch<J: PartialEq>(
    jobs: &[J],
    delivery_of: impl Fn(&J) -> &str,
    manual: impl Fn(&J) -> bool,
) -> Vec<Place> {
    let mut places: Vec<Place> = Vec::with_capacity(jobs.len());
    for (i, job) in jobs.iter().enumerate() {
        let running = || {
            jobs[..i]
                .iter()
                .zip(&places)
                .filter(|(_, p)| **p == Place::Run)
                .map(|(j, _)| j)
        };
        let place = if !manual(job) && running().any(|j| j == job) {
            Place::Copy
        } else if running().any(|j| delivery_of(j) == delivery_of(job)) {
            Place::Later
        } else {
            Place::Run
        };
        places.push(place);
    }
    places
}

/// What `job` does to `d` at `now` (epoch ms). A scheduled attempt it
/// claims is in flight for `lease_ms` (the attempt's timeout and a margin):
/// until then another copy of the job — a duplicate message, a batch
/// redelivered, a second consumer — waits for the lease instead of sending
/// the next attempt, and then finds the schedule moved on (or, if the
/// attempt was lost with its consumer, claims the next one).
pub fn plan(job: Job, d: &Delivery, now: u64, lease_ms: u64) -> Plan {
    let claim = |mode| Claim {
        expect: Expect::of(d),
        attempt: Attempt {
            number: d.attempts_made.saturating_add(1),
            mode,
            planned_next: d.next_attempt_at,
        },
        in_flight_until: None,
    };
    let scheduled = || Claim {
        in_flight_until: Some(now.saturating_add(lease_ms)),
        ..claim(Mode::Schedule)
    };
    let mine = |at| d.status.in_progress() && d.next_attempt_at == Some(at);
    let in_flight = d.in_flight_until.filter(|until| *until > now);
    match job {
        Job::Redirect if !d.subscribed => Plan::Drop(Dropped::NoSubscription),
        Job::Redirect => Plan::Send(claim(Mode::Redirect)),
        Job::ManualRetry if d.status == Status::Delivered => Plan::Drop(Dropped::AlreadyDelivered),
        Job::ManualRetry if !d.subscribed => Plan::Drop(Dropped::NoSubscription),
        Job::ManualRetry if d.status.in_progress() => Plan::Send(claim(Mode::Schedule)),
        Job::ManualRetry => Plan::Send(claim(Mode::Final)),
        Job::Scheduled { at } if !mine(at) => Plan::Drop(Dropped::Superseded),
        // Delays past the queue's maximum arrive early: wait another hop.
        Job::Scheduled { at } if at > now.saturating_add(1_000) => Plan::Wait {
            delay_s: retry::next_hop((at - now).div_ceil(1_000)),
        },
        // Another copy of a job whose attempt is in flight: it waits for the
        // attempt's lease, sends nothing and claims nothing.
        Job::Scheduled { .. } if in_flight.is_some() => Plan::Wait {
            delay_s: in_flight.map_or(CONTENDED_DELAY_S, |until| {
                until.saturating_sub(now).div_ceil(1_000).max(1)
            }),
        },
        Job::Scheduled { .. } if !d.subscribed => {
            Plan::GiveUp(claim(Mode::Schedule), GiveUp::SubscriptionDeleted)
        }
        Job::Scheduled { .. } if d.held => Plan::Hold(hold(d)),
        Job::Scheduled { .. } => Plan::Send(scheduled()),
        Job::DeadLetterQueue { .. } if d.status.is_final() => Plan::Drop(Dropped::Finished),
        Job::DeadLetterQueue { .. } if d.status == Status::Paused => Plan::Drop(Dropped::Held),
        Job::DeadLetterQueue {
            scheduled_at: Some(at),
        } if !mine(at) => Plan::Drop(Dropped::Superseded),
        Job::DeadLetterQueue { .. } => Plan::GiveUp(claim(Mode::Schedule), GiveUp::GatewayFailure),
    }
}

/// The hold of an in-progress delivery whose subscription is not active.
fn hold(d: &Delivery) -> Write {
    Write {
        expect: Expect::of(d),
        status: Status::Paused,
        next_attempt_at: None,
    }
}

/// Resume: a `paused` delivery goes back on its schedule, due at `now`
/// (compare-and-set, after the subscription is active again); anything else
/// is left alone.
pub fn release(d: &Delivery, now: u64) -> Option<Write> {
    (d.status == Status::Paused).then(|| Write {
        expect: Expect::of(d),
        status: Status::Pending,
        next_attempt_at: Some(now),
    })
}

/// What a claimed attempt came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempted {
    Sent(AttemptResult),
    GaveUp(GiveUp),
}

/// A compare-and-set status write: where the delivery is still `expect`,
/// set `status` and `next_attempt_at`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Write {
    pub expect: Expect,
    pub status: Status,
    pub next_attempt_at: Option<u64>,
}

/// The scheduled job to enqueue, before the write is applied (a crash in
/// between repeats an attempt rather than losing the delivery).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FollowUp {
    /// The job's planned time, [`Job::Scheduled`]'s `at`.
    pub at: u64,
    /// Its first queue hop.
    pub delay_s: u64,
}

/// What an attempt does to its delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transition {
    /// `None`: the status stays (a redirect; `delivered`; a later attempt
    /// owns the schedule).
    pub write: Option<Write>,
    pub follow_up: Option<FollowUp>,
}

impl Transition {
    const NONE: Transition = Transition {
        write: None,
        follow_up: None,
    };
}

/// What `result` of `attempt` does to `d` — the delivery as last read: right
/// after the claim, or re-read when a write lost its compare-and-set (then
/// settled again on the fresh value).
///
/// A success always wins (but over `delivered`, which never changes). A
/// failure moves the schedule only when no other attempt has: its attempt is
/// the last claimed, or the schedule is still the one it was claimed under.
pub fn settle(
    d: &Delivery,
    attempt: &Attempt,
    result: &Attempted,
    schedule: &[u32],
    now: u64,
) -> Transition {
    if d.status == Status::Delivered || attempt.mode == Mode::Redirect {
        return Transition::NONE;
    }
    let outcome = match result {
        Attempted::Sent(r) => retry::classify(r, attempt.number, schedule, now),
        Attempted::GaveUp(_) => Outcome::DeadLetter,
    };
    let write = |status, next_attempt_at| Write {
        expect: Expect::of(d),
        status,
        next_attempt_at,
    };
    let owns_schedule =
        d.attempts_made == attempt.number || d.next_attempt_at == attempt.planned_next;
    match outcome {
        Outcome::Delivered => Transition {
            write: Some(write(Status::Delivered, None)),
            follow_up: None,
        },
        // A held delivery keeps its hold: only a success changes it.
        _ if d.status.is_final()
            || d.status == Status::Paused
            || attempt.mode == Mode::Final
            || !owns_schedule =>
        {
            Transition::NONE
        }
        Outcome::DeadLetter => Transition {
            write: Some(write(Status::DeadLetter, None)),
            follow_up: None,
        },
        Outcome::Retry { delay_s } => {
            let at = now.saturating_add(delay_s.saturating_mul(1_000));
            Transition {
                write: Some(write(Status::Failed, Some(at))),
                follow_up: Some(FollowUp {
                    at,
                    delay_s: retry::next_hop(delay_s),
                }),
            }
        }
    }
}

#[cfg(test)]
mod tests;
