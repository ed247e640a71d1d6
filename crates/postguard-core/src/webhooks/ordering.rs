//! Ordering keys (issue 36, ADR 0043): for each subscription and
//! `ordering_key` — a *lane* — deliveries are attempted in publish order. A
//! delivery's first send waits until the delivery before it in its lane is
//! `delivered` or `dead_letter`; other lanes, and deliveries without a key,
//! are not held by it.
//!
//! Two halves, both pure:
//!
//! - **Publish: who is before me.** A lane's tail lives in one place per
//!   project, the [`LaneStore`] port (the project's object implements it;
//!   [`MemoryLanes`] is the tests' backend), not in the shards: two
//!   consecutive events of a key may fall in different shards (a shard is a
//!   project's time bucket), and only a record that outlives a bucket can
//!   name the delivery before a bucket's first one. [`chain`] reserves each
//!   new delivery's place — its `seq` and `blocked_by`, the tail it
//!   replaces — before the shard commit; [`committed`] reports afterwards
//!   which were stored (confirmed: forgotten) and which not (abandoned: the
//!   lane remembers whom they followed, so that a delivery chained behind a
//!   delivery that never came to exist waits on that one's predecessor
//!   instead).
//! - **Consumer: may I go.** [`plan`] wraps [`delivery::plan`]: a send to the
//!   subscription (a scheduled attempt, a manual retry; not a redirect,
//!   which leaves the status alone, nor a give-up, which sends nothing) of a
//!   delivery still `blocked_by` its predecessor asks [`gate`] about the
//!   predecessor as read ([`Predecessor`]). Settled → go, and the claim
//!   clears `blocked_by` for good (a settled delivery stays settled, so the
//!   gate never closes again); not settled → the job waits a queue hop,
//!   claims nothing and so uses no attempt number; never stored → wait on
//!   its predecessor instead ([`Ordered::Rechain`]).
//!
//! A delivery id names its shard ([`super::shard`]), so "the delivery
//! before me" is read without a lookup: in the same shard inside the claim's
//! transaction, in another shard (across a bucket's boundary) by one call
//! there ([`predecessor_shard`]). When a delivery becomes final its shard
//! wakes the deliveries blocked by it ([`wakes`]) by sending their jobs at
//! once; a blocked job also rechecks on its own ([`gate`]'s delay), so a
//! lost wake-up or a predecessor in another shard delays, never strands.
//!
//! Why the gate is only on the first send: once the predecessor is seen
//! settled it stays settled (`delivered` and `dead_letter` only ever become
//! `delivered`), so every later attempt of the delivery is after it too.
//! And a settled predecessor that never passed its own gate (given up while
//! blocked: a dead-letter-queue job) hands its own `blocked_by` on, so a
//! lane is never overtaken through a delivery that skipped its turn.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::delivery::{self, Delivery, Job, Mode, Plan, Status};
use super::retry;
use super::shard::ShardKey;

/// The longest ordering key (bytes; visible ASCII, so characters too).
pub const MAX_KEY_LEN: usize = 128;

/// `ordering_key`: 1-128 visible ASCII characters (0x21-0x7E), as an event
/// id: an entity id (`order_42`, `cus:9/invoices`) fits, and the key can be
/// stored, indexed and shown without escaping.
pub fn is_valid_key(key: &str) -> bool {
    !key.is_empty() && key.len() <= MAX_KEY_LEN && key.bytes().all(|b| b.is_ascii_graphic())
}

/// A lane: one subscription's deliveries of one ordering key. The project
/// is implied: a [`LaneStore`] holds one project's lanes.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Lane {
    pub subscription_id: String,
    pub ordering_key: String,
}

/// A delivery's place in its lane, reserved before its shard commit and
/// kept until the commit is reported ([`committed`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reservation {
    pub delivery_id: String,
    /// Its position in the lane (1, 2, …): publish order.
    pub seq: u64,
    /// The delivery before it (the tail it replaced), if any.
    pub prev: Option<String>,
    /// When it was reserved (epoch ms): its commit lands within
    /// [`COMMIT_WINDOW_MS`] of this, or never.
    pub at: u64,
    /// Reported not stored (the shard refused it, its transaction failed,
    /// or the event was known and stored earlier under other delivery ids).
    pub abandoned: bool,
}

/// One lane's record in the [`LaneStore`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaneState {
    /// The last delivery reserved (and not abandoned while last): the next
    /// one published waits on it.
    pub tail: Option<String>,
    /// Reservations made so far: the last `seq`.
    pub seq: u64,
    /// The last reservation's time: a lane idle for the retention period is
    /// forgotten ([`prune`]).
    pub last_at: u64,
    /// Reservations whose commit was not reported stored yet, oldest first,
    /// at most [`MAX_OPEN`].
    pub open: Vec<Reservation>,
}

/// The most reservations a lane keeps unconfirmed. In steady state only
/// the last publish group's are (the shell reports each group's outcome
/// with its next call); the bound only stops a shell that never reports
/// from growing a lane without end. The oldest is forgotten first.
pub const MAX_OPEN: usize = 256;

/// Where a project's lanes live: one place per project (its Durable
/// Object), so the tail of a lane outlives the time buckets its deliveries
/// fall in. Synchronous, like [`super::records::WebhookStore`]: the object
/// runs each function here in one transaction, one call at a time.
pub trait LaneStore {
    type Error;
    fn lane(&mut self, lane: &Lane) -> Result<Option<LaneState>, Self::Error>;
    /// Inserts or replaces the lane's record.
    fn put_lane(&mut self, lane: &Lane, state: &LaneState) -> Result<(), Self::Error>;
    fn drop_lane(&mut self, lane: &Lane) -> Result<(), Self::Error>;
    /// Up to `limit` lanes whose `last_at` is before `before`.
    fn idle_lanes(&mut self, before: u64, limit: usize) -> Result<Vec<Lane>, Self::Error>;
    /// The records of those of `lanes` that exist: one read where the
    /// store can (a publish group touches many lanes at once).
    fn lanes_of(&mut self, lanes: &[&Lane]) -> Result<Vec<(Lane, LaneState)>, Self::Error> {
        let mut out = Vec::new();
        for lane in lanes {
            if let Some(st) = self.lane(lane)? {
                out.push(((*lane).clone(), st));
            }
        }
        Ok(out)
    }
    /// Inserts or replaces each lane's record: one write where the store can.
    fn put_lanes(&mut self, lanes: &[(&Lane, &LaneState)]) -> Result<(), Self::Error> {
        for (lane, st) in lanes {
            self.put_lane(lane, st)?;
        }
        Ok(())
    }
}

/// The records of the lanes `wanted` names (each once), read in one call.
fn load<'a, S: LaneStore>(
    s: &mut S,
    wanted: impl Iterator<Item = &'a Lane>,
) -> Result<BTreeMap<&'a Lane, Option<LaneState>>, S::Error> {
    let mut lanes: BTreeMap<&Lane, Option<LaneState>> = wanted.map(|l| (l, None)).collect();
    let keys: Vec<&Lane> = lanes.keys().copied().collect();
    for (lane, st) in s.lanes_of(&keys)? {
        if let Some(slot) = lanes.get_mut(&lane) {
            *slot = Some(st);
        }
    }
    Ok(lanes)
}

/// The in-memory [`LaneStore`] of the host tests (and a reference for the
/// object's SQL adapter: one row per lane).
#[derive(Debug, Clone, Default)]
pub struct MemoryLanes {
    pub lanes: BTreeMap<Lane, LaneState>,
}

impl LaneStore for MemoryLanes {
    type Error = std::convert::Infallible;

    fn lane(&mut self, lane: &Lane) -> Result<Option<LaneState>, Self::Error> {
        Ok(self.lanes.get(lane).cloned())
    }

    fn put_lane(&mut self, lane: &Lane, state: &LaneState) -> Result<(), Self::Error> {
        self.lanes.insert(lane.clone(), state.clone());
        Ok(())
    }

    fn drop_lane(&mut self, lane: &Lane) -> Result<(), Self::Error> {
        self.lanes.remove(lane);
        Ok(())
    }

    fn idle_lanes(&mut self, before: u64, limit: usize) -> Result<Vec<Lane>, Self::Error> {
        Ok(self
            .lanes
            .iter()
            .filter(|(_, s)| s.last_at < before)
            .map(|(l, _)| l.clone())
            .take(limit)
            .collect())
    }
}

/// A new keyed delivery to place in its lane.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewLink {
    pub lane: Lane,
    pub delivery_id: String,
}

/// Where it was placed: stored with the delivery (`ordering_seq`,
/// `blocked_by`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Link {
    pub seq: u64,
    /// The delivery before it in its lane; `None`: the lane was empty.
    pub blocked_by: Option<String>,
}

/// Places each new delivery at the end of its lane, in the order given
/// (the publish order: a group's events in their order, each event's
/// deliveries in any order — they are in different lanes). Run before the
/// shard commit, with `now` the publish time the deliveries are stored with
/// (`created_at`): [`gate`] bounds how long a missing predecessor may still
/// appear by it. A delivery id already reserved and not yet reported gets
/// its first answer again (a repeated call).
pub fn chain<S: LaneStore>(s: &mut S, new: &[NewLink], now: u64) -> Result<Vec<Link>, S::Error> {
    let mut lanes: BTreeMap<&Lane, LaneState> = load(s, new.iter().map(|n| &n.lane))?
        .into_iter()
        .map(|(l, st)| (l, st.unwrap_or_default()))
        .collect();
    let mut out = Vec::with_capacity(new.len());
    for n in new {
        let Some(st) = lanes.get_mut(&n.lane) else {
            continue;
        };
        if let Some(r) = st.open.iter().find(|r| r.delivery_id == n.delivery_id) {
            out.push(Link {
                seq: r.seq,
                blocked_by: r.prev.clone(),
            });
            continue;
        }
        st.seq = st.seq.saturating_add(1);
        let prev = st.tail.replace(n.delivery_id.clone());
        st.open.push(Reservation {
            delivery_id: n.delivery_id.clone(),
            seq: st.seq,
            prev: prev.clone(),
            at: now,
            abandoned: false,
        });
        if st.open.len() > MAX_OPEN {
            st.open.remove(0);
        }
        st.last_at = st.last_at.max(now);
        out.push(Link {
            seq: st.seq,
            blocked_by: prev,
        });
    }
    let all: Vec<(&Lane, &LaneState)> = lanes.iter().map(|(l, st)| (*l, st)).collect();
    s.put_lanes(&all)?;
    Ok(out)
}

/// A reserved delivery's commit, as its shard answered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Committed {
    pub lane: Lane,
    pub delivery_id: String,
    /// `true`: stored. `false`: certainly not stored — refused, its
    /// transaction failed, or the event id was known (the shard kept the
    /// earlier deliveries). An outcome the shell does not know (a group whose
    /// leader vanished, a wait that timed out) is not reported: the
    /// reservation stays open and [`gate`] waits out [`COMMIT_WINDOW_MS`].
    pub stored: bool,
}

/// Reports commits ([`Committed`]): a stored reservation is forgotten (its
/// delivery is in its shard now, found there by id); one not stored is
/// marked abandoned, and if it is still the lane's tail the tail goes back
/// to the delivery before it, so the next publish does not chain behind a
/// delivery that does not exist. The shell may send these with its next
/// call to the project's object (the next publish group's), as it already
/// piggybacks the outbox marks.
pub fn committed<S: LaneStore>(s: &mut S, outcomes: &[Committed]) -> Result<(), S::Error> {
    let mut lanes = load(s, outcomes.iter().map(|c| &c.lane))?;
    for c in outcomes {
        let Some(Some(st)) = lanes.get_mut(&c.lane) else {
            continue;
        };
        let Some(i) = st.open.iter().position(|r| r.delivery_id == c.delivery_id) else {
            continue;
        };
        if c.stored {
            st.open.remove(i);
            continue;
        }
        st.open[i].abandoned = true;
        if st.tail.as_deref() == Some(c.delivery_id.as_str()) {
            st.tail = st.open[i].prev.clone();
        }
    }
    let all: Vec<(&Lane, &LaneState)> = lanes
        .iter()
        .filter_map(|(l, st)| st.as_ref().map(|st| (*l, st)))
        .collect();
    if !all.is_empty() {
        s.put_lanes(&all)?;
    }
    Ok(())
}

/// The lane's record of a reservation (`None`: confirmed stored, forgotten
/// with an idle lane, or never made): what the consumer asks the project's
/// object when a delivery's predecessor is not in its shard.
pub fn reservation<S: LaneStore>(
    s: &mut S,
    lane: &Lane,
    delivery_id: &str,
) -> Result<Option<Reservation>, S::Error> {
    Ok(s.lane(lane)?
        .and_then(|st| st.open.into_iter().find(|r| r.delivery_id == delivery_id)))
}

/// Forgets up to `limit` lanes idle since before `idle_before` (the shell
/// passes `now` minus the deliveries' retention): their deliveries' shards
/// are dropped by then, and a delivery whose predecessor is gone with its
/// shard goes ([`gate`]), so the record decides nothing any more. The
/// number forgotten (the shell calls again while it is `limit`).
pub fn prune<S: LaneStore>(s: &mut S, idle_before: u64, limit: usize) -> Result<usize, S::Error> {
    let idle = s.idle_lanes(idle_before, limit)?;
    for lane in &idle {
        s.drop_lane(lane)?;
    }
    Ok(idle.len())
}

/// How long after its reservation a delivery's commit can still land: a
/// publish waits at most 20 s for its group and the group's shard call is
/// one transaction, so 5 minutes is far beyond any commit that will ever
/// land. A predecessor not in its shard this long after its successor was
/// published never will be.
pub const COMMIT_WINDOW_MS: u64 = 300_000;

/// The longest a blocked job waits before it looks again on its own
/// (seconds) while its predecessor is due, in flight or may still be
/// committed. The wake-up from the predecessor's shard is what normally
/// moves it; this bounds the delay when there is none (a predecessor in
/// another shard, a lost wake-up).
pub const RECHECK_S: u64 = 30;

/// How long a blocked job waits before it looks again when its predecessor
/// is itself blocked (seconds): it cannot go before that one goes, whose
/// settling wakes it, so it looks rarely — a lane stalled behind a failing
/// head costs each waiting delivery one queue message per 10 minutes, not
/// one per [`RECHECK_S`]; the look is only the net under a lost wake-up.
pub const RECHECK_BEHIND_S: u64 = 600;

/// After a predecessor's next attempt is due, how long its successor lets
/// it run before looking (ms): the attempt is claimed by then, so the look
/// finds it in flight rather than still due.
pub const RECHECK_MARGIN_MS: u64 = 5_000;

/// What the gate needs of a predecessor that was found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PredView {
    pub status: Status,
    pub next_attempt_at: Option<u64>,
    pub in_flight_until: Option<u64>,
    /// Its own `blocked_by`: a settled predecessor that never passed its
    /// gate hands it on.
    pub blocked_by: Option<String>,
}

impl PredView {
    /// A stored delivery as the gate sees it.
    pub fn of(d: &Delivery, blocked_by: Option<&str>) -> PredView {
        PredView {
            status: d.status,
            next_attempt_at: d.next_attempt_at,
            in_flight_until: d.in_flight_until,
            blocked_by: blocked_by.map(str::to_owned),
        }
    }
}

/// The predecessor as read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "read", rename_all = "snake_case")]
pub enum Predecessor {
    /// In its shard.
    Found(PredView),
    /// Not in its shard when read at `read_at` (epoch ms), with the lane's
    /// record of its reservation ([`reservation`]).
    Missing {
        read_at: u64,
        reservation: Option<Reservation>,
    },
}

/// What a predecessor means for its successor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gate {
    /// Settled in its turn: the successor may go.
    Open,
    /// Not settled (or it may still appear): look again after `delay_s`.
    Blocked { delay_s: u64 },
    /// Never stored, or settled without its turn: wait on this one instead.
    Rechain { blocked_by: String },
}

/// The gate of a delivery published at `created_at` whose predecessor
/// reads `pred`, at `now`:
///
/// - found settled (`delivered`, `dead_letter`) and not blocked itself →
///   [`Gate::Open`]; settled but still blocked (given up before its turn) →
///   wait on what it waited on;
/// - found unsettled (pending, failed, paused) → blocked, looking again when
///   it has had a chance to settle: its in-flight attempt's lease (at most
///   [`RECHECK_S`]), its next attempt (plus [`RECHECK_MARGIN_MS`]),
///   [`RECHECK_BEHIND_S`] when it is blocked itself, else [`RECHECK_S`];
/// - missing and reported abandoned → wait on its own predecessor (none:
///   open); missing and read at least [`COMMIT_WINDOW_MS`] after both the
///   successor's publish and the reservation → it never will be stored (or
///   retention dropped it): likewise; missing earlier → blocked, it may
///   still be committed.
pub fn gate(created_at: u64, pred: &Predecessor, now: u64) -> Gate {
    let follow = |prev: Option<&String>| {
        prev.map_or(Gate::Open, |p| Gate::Rechain {
            blocked_by: p.clone(),
        })
    };
    match pred {
        Predecessor::Found(p) if p.status.is_final() => follow(p.blocked_by.as_ref()),
        Predecessor::Found(p) => Gate::Blocked {
            delay_s: recheck_s(p, now),
        },
        Predecessor::Missing {
            reservation: Some(r),
            ..
        } if r.abandoned => follow(r.prev.as_ref()),
        Predecessor::Missing {
            read_at,
            reservation,
        } => {
            let reserved = reservation.as_ref().map_or(0, |r| r.at);
            let settled_by = created_at.max(reserved).saturating_add(COMMIT_WINDOW_MS);
            if *read_at >= settled_by {
                follow(reservation.as_ref().and_then(|r| r.prev.as_ref()))
            } else {
                Gate::Blocked {
                    delay_s: wait_s(settled_by, now).min(RECHECK_S),
                }
            }
        }
    }
}

/// Seconds from `now` to `until`, at least 1, at most one queue hop.
fn wait_s(until: u64, now: u64) -> u64 {
    retry::next_hop(until.saturating_sub(now).div_ceil(1_000).max(1))
}

/// When a blocked successor looks again at an unsettled predecessor.
fn recheck_s(p: &PredView, now: u64) -> u64 {
    if let Some(until) = p.in_flight_until.filter(|u| *u > now) {
        return wait_s(until, now).min(RECHECK_S);
    }
    if p.blocked_by.is_some() {
        return RECHECK_BEHIND_S;
    }
    match p.next_attempt_at {
        Some(at) if p.status.in_progress() && at > now => {
            wait_s(at.saturating_add(RECHECK_MARGIN_MS), now)
        }
        _ => RECHECK_S,
    }
}

/// What the consumer knows of a delivery's place in its lane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Order<'a> {
    /// Its stored `blocked_by`: `None` for a delivery without a key, the
    /// first of its lane, or one whose gate has opened.
    pub blocked_by: Option<&'a str>,
    /// Its publish time.
    pub created_at: u64,
    /// The predecessor as read (`None`: not read yet).
    pub predecessor: Option<&'a Predecessor>,
}

/// What a job may do to a delivery in a lane.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ordered {
    /// [`delivery::plan`]'s answer, to apply as before; `unblock`: the gate
    /// has just opened, so the claim also writes `blocked_by = NULL`.
    Plan { plan: Plan, unblock: bool },
    /// Its predecessor `by` is not settled: send the job again after
    /// `delay_s` (a queue hop, like [`Plan::Wait`]). Nothing is claimed, no
    /// attempt number used, nothing recorded as failed.
    Blocked { by: String, delay_s: u64 },
    /// Its predecessor `from` never came to be (or settled out of turn):
    /// write `blocked_by = to` (compare-and-set on `from`), then plan the job
    /// again on `to`, read afresh.
    Rechain { from: String, to: String },
    /// Read the predecessor first (in [`predecessor_shard`]; when it is not
    /// there, also its [`reservation`]), then plan again with it.
    Read { predecessor: String },
}

/// Whether the order governs what `plan` does: a send to the
/// subscription's URL. A redirect goes elsewhere and leaves the status
/// alone; a give-up, a wait, a hold or a drop sends nothing.
pub fn gated(plan: &Plan) -> bool {
    matches!(plan, Plan::Send(c) if c.attempt.mode != Mode::Redirect)
}

/// [`delivery::plan`], then the lane's gate: what the shard's claim runs
/// for a delivery that may have a `blocked_by` (for one without, this is
/// `delivery::plan` exactly).
pub fn plan(job: Job, d: &Delivery, order: &Order<'_>, now: u64, lease_ms: u64) -> Ordered {
    let plan = delivery::plan(job, d, now, lease_ms);
    let Some(by) = order.blocked_by.filter(|_| gated(&plan)) else {
        return Ordered::Plan {
            plan,
            unblock: false,
        };
    };
    let Some(pred) = order.predecessor else {
        return Ordered::Read {
            predecessor: by.to_owned(),
        };
    };
    match gate(order.created_at, pred, now) {
        Gate::Open => Ordered::Plan {
            plan,
            unblock: true,
        },
        Gate::Blocked { delay_s } => Ordered::Blocked {
            by: by.to_owned(),
            delay_s,
        },
        Gate::Rechain { blocked_by } => Ordered::Rechain {
            from: by.to_owned(),
            to: blocked_by,
        },
    }
}

/// The shard that holds the predecessor `blocked_by` of a delivery of
/// `project` (its id names it): the claim's own shard — read it in the same
/// transaction — or another bucket's, which the consumer calls first.
/// `None` for an id that is not the gateway's (then treat it as missing).
pub fn predecessor_shard(project: &str, blocked_by: &str) -> Option<ShardKey> {
    ShardKey::of_delivery(project, blocked_by)
}

/// Whether a status write from `before` to `after` settles a delivery,
/// so the deliveries blocked by it should be woken: its shard returns the
/// jobs of its deliveries with `blocked_by` = it, to send at once (each
/// its scheduled job, `at` = its `next_attempt_at`; a duplicate is dropped
/// as any duplicate is).
pub fn wakes(before: Status, after: Status) -> bool {
    !before.is_final() && after.is_final()
}

#[cfg(test)]
mod tests;
