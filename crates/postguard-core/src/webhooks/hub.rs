//! The project's own object (`ProjectHub`, ADR 0046): what every publish
//! of a project reads, kept in one place per project instead of the D1
//! that every tenant shares (issue 36 #0), and the project's ordering lanes
//! ([`super::ordering`], ADR 0043). A publish asks it once ([`Prepare`]):
//! the object plans each event's deliveries from its subscribers
//! ([`prepare`]: filters, the excluded subscription, held ones) and
//! chains the keyed ones in their lanes, in one call.
//!
//! The subscribers are a copy of D1's rows ([`Subscriber`]), loaded on the
//! first publish and again after any change to them ([`Invalidate`], sent by
//! every write that changes what a publish reads) or after
//! [`SUBSCRIBERS_TTL_MS`] — the bound on how long a change whose
//! invalidation was lost can go unseen.

use serde::{Deserialize, Serialize};

use super::events;
use super::ordering::{self, Committed, Lane, LaneStore, NewLink, Reservation};
use super::protocol::{operations, Done, Operation};
use super::records::{NewDelivery, Placed};
use super::shard::{delivery_id, ShardKey};

/// How long the object trusts its copy of the subscribers without an
/// invalidation (ms): a lost one (the object unreachable just after a
/// change) is healed this long after; the publish path reads D1 once per
/// project per this period at most.
pub const SUBSCRIBERS_TTL_MS: u64 = 60_000;

/// Lanes idle past retention forgotten per publish: the pruning rides on
/// the publishes, a few at a time, so no sweep visits every project.
pub const PRUNE_PER_CALL: usize = 8;

/// A subscription as the publish path needs it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Subscriber {
    pub id: String,
    pub url: String,
    /// Its event-type filters (`events::matches`).
    pub events: Vec<String>,
    /// Paused or disabled: its deliveries are created `paused`.
    pub held: bool,
}

/// The object's copy of what the publish path reads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    pub subscribers: Vec<Subscriber>,
    /// Bytes the project was charged today in D1 (inspectors, captures).
    pub bytes_today: u64,
    /// The UTC day `bytes_today` is of.
    pub day: u64,
    pub loaded_at: u64,
    /// D1's size as the load saw it (its size guard).
    #[serde(default)]
    pub d1_bytes: Option<u64>,
}

impl Snapshot {
    /// Whether the copy may answer a publish at `now` (of UTC day `day`).
    pub fn fresh(&self, now: u64, day: u64) -> bool {
        self.day == day && now >= self.loaded_at && now - self.loaded_at < SUBSCRIBERS_TTL_MS
    }
}

/// An event of a publish, as far as its deliveries depend on it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Draft {
    pub event_type: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ordering_key: Option<String>,
    /// A subscription that gets no delivery (the one an operational event is about).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exclude: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrepareReq {
    /// The shard the events go to (their deliveries' ids name it).
    pub shard: ShardKey,
    pub drafts: Vec<Draft>,
    /// Earlier publishes' commits of keyed deliveries ([`ordering::committed`]).
    #[serde(default)]
    pub committed: Vec<Committed>,
    /// Lanes idle since before this are forgotten (now − retention).
    pub idle_before: u64,
    pub now: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Prepared {
    /// Each draft's deliveries, keyed ones placed in their lanes.
    pub deliveries: Vec<Vec<NewDelivery>>,
    pub bytes_today: u64,
    /// D1's size as the object's last load saw it (the publish path reads
    /// D1 itself only while that says D1 is full).
    #[serde(default)]
    pub d1_bytes: Option<u64>,
    /// When that load was (epoch ms).
    #[serde(default)]
    pub loaded_at: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReservationReq {
    pub lane: Lane,
    pub delivery_id: String,
}

operations! {
    /// Plan a publish's deliveries and chain the keyed ones.
    Prepare, "/prepare", PrepareReq => Prepared;
    /// The subscribers changed: read them again on the next publish.
    Invalidate, "/invalidate", Done => Done;
    /// A missing predecessor's reservation ([`ordering::reservation`]).
    ReservationOf, "/reservation", ReservationReq => Option<Reservation>;
}

/// Each draft's deliveries: one per subscriber whose filters match its type
/// (but the excluded one), ids from `random` naming `req.shard`; the keyed
/// ones chained in their lanes after the reported commits are applied, and
/// a few idle lanes pruned — all in the caller's one transaction.
pub fn prepare<S: LaneStore>(
    s: &mut S,
    subscribers: &[Subscriber],
    req: &PrepareReq,
    mut random: impl FnMut() -> u128,
) -> Result<Vec<Vec<NewDelivery>>, S::Error> {
    ordering::committed(s, &req.committed)?;
    let mut out: Vec<Vec<NewDelivery>> = Vec::with_capacity(req.drafts.len());
    let mut links: Vec<(usize, usize, NewLink)> = Vec::new();
    for (i, draft) in req.drafts.iter().enumerate() {
        let mut planned = Vec::new();
        for sub in subscribers {
            if !events::matches(&sub.events, &draft.event_type)
                || draft.exclude.as_deref() == Some(sub.id.as_str())
            {
                continue;
            }
            let id = delivery_id(&req.shard, random());
            if let Some(key) = &draft.ordering_key {
                let lane = Lane {
                    subscription_id: sub.id.clone(),
                    ordering_key: key.clone(),
                };
                links.push((
                    i,
                    planned.len(),
                    NewLink {
                        lane,
                        delivery_id: id.clone(),
                    },
                ));
            }
            planned.push(NewDelivery {
                id,
                subscription_id: sub.id.clone(),
                url: sub.url.clone(),
                held: sub.held,
                lane: None,
            });
        }
        out.push(planned);
    }
    if !links.is_empty() {
        let new: Vec<NewLink> = links.iter().map(|(_, _, l)| l.clone()).collect();
        let placed = ordering::chain(s, &new, req.now)?;
        for ((i, j, link), p) in links.into_iter().zip(placed) {
            out[i][j].lane = Some(Placed {
                ordering_key: link.lane.ordering_key,
                seq: p.seq,
                blocked_by: p.blocked_by,
            });
        }
    }
    ordering::prune(s, req.idle_before, PRUNE_PER_CALL)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::webhooks::ordering::MemoryLanes;

    fn sub(id: &str, events: &[&str], held: bool) -> Subscriber {
        Subscriber {
            id: id.into(),
            url: format!("https://r.test/{id}"),
            events: events.iter().map(|e| (*e).to_string()).collect(),
            held,
        }
    }

    #[test]
    fn a_publish_is_planned_per_subscriber_and_keyed_deliveries_are_chained() {
        let mut lanes = MemoryLanes::default();
        let subs = [
            sub("a", &["*"], false),
            sub("b", &["order.*"], true),
            sub("c", &["user.*"], false),
        ];
        let draft = |key: Option<&str>, exclude: Option<&str>| Draft {
            event_type: "order.paid".into(),
            ordering_key: key.map(str::to_owned),
            exclude: exclude.map(str::to_owned),
        };
        let req = PrepareReq {
            shard: ShardKey {
                project: "p".into(),
                start_ms: 0,
            },
            drafts: vec![
                draft(Some("K"), None),
                draft(None, Some("a")),
                draft(Some("K"), None),
            ],
            committed: Vec::new(),
            idle_before: 0,
            now: 10,
        };
        let mut n = 0u128;
        let out = prepare(&mut lanes, &subs, &req, || {
            n += 1;
            n
        })
        .unwrap();
        let subs_of = |ds: &Vec<NewDelivery>| {
            ds.iter()
                .map(|d| d.subscription_id.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(subs_of(&out[0]), ["a", "b"], "c's filter does not match");
        assert_eq!(subs_of(&out[1]), ["b"], "a is excluded");
        assert!(out[0][1].held, "b is paused");
        assert_eq!(out[1][0].lane, None, "no key, no lane");
        // The second K event of each subscription waits for the first's delivery.
        for (first, second) in out[0].iter().zip(&out[2]) {
            let (l1, l2) = (first.lane.clone().unwrap(), second.lane.clone().unwrap());
            assert_eq!((l1.seq, l1.blocked_by), (1, None));
            assert_eq!(
                (l2.seq, l2.blocked_by.as_deref()),
                (2, Some(first.id.as_str()))
            );
        }
    }

    #[test]
    fn a_copy_is_fresh_for_its_day_and_ttl_only() {
        let s = Snapshot {
            subscribers: Vec::new(),
            bytes_today: 0,
            day: 3,
            loaded_at: 1_000,
            d1_bytes: None,
        };
        assert!(s.fresh(1_000, 3));
        assert!(s.fresh(1_000 + SUBSCRIBERS_TTL_MS - 1, 3));
        assert!(!s.fresh(1_000 + SUBSCRIBERS_TTL_MS, 3));
        assert!(!s.fresh(2_000, 4), "another day's bytes");
        assert!(!s.fresh(999, 3), "a clock that went back");
    }
}
