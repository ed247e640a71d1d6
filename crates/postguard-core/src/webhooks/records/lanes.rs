//! Ordering keys in the shard's claim and settle (ADR 0043): the gate of
//! [`super::super::ordering`] applied to stored deliveries. The claim asks
//! it before every send; a settle that makes a delivery final returns the
//! jobs of the deliveries it was blocking.

use serde::{Deserialize, Serialize};

use super::{ClaimJob, Claimed, DeliveryRecord, FirstJob, Loaded, SubView, WebhookStore};
use crate::webhooks::delivery::Plan;
use crate::webhooks::ordering::{self, Order, Ordered, PredView, Predecessor};

/// A lane's predecessor as the consumer read it outside the claiming shard
/// (its own shard, or its reservation in the project's object).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PredRead {
    pub id: String,
    pub read: Predecessor,
}

/// How many times one claim follows a predecessor that never came to be
/// before it answers "read again": each step is one link back in the lane.
const MAX_RECHAIN: usize = 8;

/// The most blocked deliveries one settled delivery wakes: a lane has one
/// successor per subscription and key, so more is a repeated publish only.
const MAX_WAKES: usize = 64;

/// The plan of `j` for `d` after its lane's gate: `Ok` — what
/// [`super::delivery::plan`] answered, to apply as before (the gate open,
/// `d.blocked_by` cleared); `Err` — the job waits ([`Claimed::Blocked`]) or
/// its predecessor must be read elsewhere first ([`Claimed::Read`]). A
/// rechain writes `d.blocked_by` into `loaded` (this call's transaction).
pub(super) fn gate(
    loaded: &mut Loaded,
    d: &mut DeliveryRecord,
    j: &ClaimJob,
    now: u64,
    lease_ms: u64,
) -> Result<Plan, Claimed> {
    for _ in 0..MAX_RECHAIN {
        let pred = d
            .blocked_by
            .as_deref()
            .and_then(|by| predecessor(loaded, by, j));
        let order = Order {
            blocked_by: d.blocked_by.as_deref(),
            created_at: d.created_at,
            predecessor: pred.as_ref(),
        };
        match ordering::plan(j.job.into(), &d.snapshot(j.sub), &order, now, lease_ms) {
            Ordered::Plan { plan, unblock } => {
                if unblock {
                    d.blocked_by = None;
                    loaded.put(d.clone());
                }
                return Ok(plan);
            }
            Ordered::Blocked { by, delay_s } => return Err(Claimed::Blocked { by, delay_s }),
            Ordered::Read { predecessor } => {
                return Err(Claimed::Read {
                    predecessor,
                    ordering_key: d.ordering_key.clone().unwrap_or_default(),
                })
            }
            Ordered::Rechain { to, .. } => {
                d.blocked_by = Some(to);
                d.updated_at = now;
                loaded.put(d.clone());
            }
        }
    }
    Err(Claimed::Blocked {
        by: d.blocked_by.clone().unwrap_or_default(),
        delay_s: ordering::RECHECK_S,
    })
}

/// The predecessor `by` as this call sees it: in this shard, or as the
/// consumer read it elsewhere; `None`: not known here.
fn predecessor(loaded: &Loaded, by: &str, j: &ClaimJob) -> Option<Predecessor> {
    if let Some(p) = loaded.get(by) {
        return Some(Predecessor::Found(view(&p)));
    }
    j.predecessor
        .as_ref()
        .filter(|p| p.id == by)
        .map(|p| p.read.clone())
}

fn view(d: &DeliveryRecord) -> PredView {
    // The gate reads the status and times only: the subscription's state
    // does not matter to a predecessor.
    PredView::of(&d.snapshot(SubView::default()), d.blocked_by.as_deref())
}

/// The deliveries with these ids in this shard, as a successor's gate sees
/// them (`None`: not here).
pub fn peek<S: WebhookStore>(s: &mut S, ids: &[String]) -> Result<Vec<Option<PredView>>, S::Error> {
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        out.push(s.delivery(id)?.as_ref().map(view));
    }
    Ok(out)
}

impl Loaded {
    /// Also loads the lane predecessors of the deliveries loaded, so the
    /// gate reads one in this shard without another query.
    pub(super) fn add_predecessors<S: WebhookStore>(&mut self, s: &mut S) -> Result<(), S::Error> {
        let mut ids: Vec<String> = self
            .rows
            .values()
            .filter_map(|d| d.blocked_by.clone())
            .filter(|id| !self.rows.contains_key(id))
            .collect();
        if ids.is_empty() {
            return Ok(());
        }
        ids.sort_unstable();
        ids.dedup();
        let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
        for d in s.deliveries(&refs)? {
            self.rows.insert(d.id.clone(), d);
        }
        Ok(())
    }
}

/// The jobs of the in-progress deliveries blocked by the `settled` ones:
/// their gate may open now, so they are sent at once (each its scheduled
/// job; a duplicate is dropped as any duplicate is).
pub(super) fn woken<S: WebhookStore>(
    s: &mut S,
    settled: &[String],
) -> Result<Vec<FirstJob>, S::Error> {
    let mut out = Vec::new();
    for id in settled {
        for d in s.blocked_on(id, MAX_WAKES)? {
            if let Some(at) = d.next_attempt_at.filter(|_| d.status.in_progress()) {
                out.push(FirstJob::of(&d, at));
            }
        }
    }
    Ok(out)
}
