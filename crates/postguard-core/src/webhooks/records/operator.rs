//! What an operator or a background task does to records: a manual attempt
//! (retry, redirect, recover's re-send), recover's steps, the requeue of
//! overdue deliveries, a delivery's detail, the archive's pages, moving
//! legacy rows in and restoring them.

use serde::{Deserialize, Serialize};

use super::*;

/// Claims one manual attempt (retry, redirect, recover re-send) of a
/// delivery, within `max` per delivery.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "manual", rename_all = "snake_case")]
pub enum Manual {
    Queued { delivery: Box<DeliveryRecord> },
    LimitReached,
    NotFound,
}

pub fn manual<S: WebhookStore>(
    s: &mut S,
    delivery_id: &str,
    max: u32,
    now: u64,
) -> Result<Manual, S::Error> {
    let Some(mut d) = s.delivery(delivery_id)? else {
        return Ok(Manual::NotFound);
    };
    if d.manual >= max {
        return Ok(Manual::LimitReached);
    }
    d.manual += 1;
    d.updated_at = now;
    s.put_delivery(&d)?;
    let day = capacity::utc_day(now);
    let mut u = s.usage(day)?;
    u.bytes += capacity::MANUAL_ATTEMPT_BYTES;
    s.put_usage(day, &u)?;
    Ok(Manual::Queued {
        delivery: Box::new(d),
    })
}

/// One step of a recover task in this shard.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecoverStep {
    pub subscription_id: String,
    pub since: u64,
    pub until: u64,
    pub after: (u64, String),
    pub limit: u32,
    pub max_manual: u32,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recovered {
    /// Manual attempts claimed: queue one job each.
    pub queued: Vec<FirstJob>,
    /// Past their manual bound: counted as failed.
    pub skipped: u32,
    /// The cursor after the last delivery handled; `None`: none was.
    pub last: Option<(u64, String)>,
}

/// Re-sends up to `limit` recoverable deliveries after the cursor: a
/// manual attempt claimed for each, within the bound.
pub fn recover<S: WebhookStore>(
    s: &mut S,
    r: &RecoverStep,
    now: u64,
) -> Result<Recovered, S::Error> {
    let chunk = s.recoverable(
        &r.subscription_id,
        r.since,
        r.until,
        &r.after,
        r.limit as usize,
    )?;
    let mut out = Recovered::default();
    for d in chunk {
        out.last = Some((d.created_at, d.id.clone()));
        match manual(s, &d.id, r.max_manual, now)? {
            Manual::Queued { .. } => out.queued.push(FirstJob::of(&d, now)),
            _ => out.skipped += 1,
        }
    }
    Ok(out)
}

/// How many deliveries a recover over `[since, until]` would visit.
pub fn count_recoverable<S: WebhookStore>(
    s: &mut S,
    subscription_id: &str,
    since: u64,
    until: u64,
) -> Result<u64, S::Error> {
    let all = s.recoverable(
        subscription_id,
        since,
        until,
        &(0, String::new()),
        usize::MAX,
    )?;
    Ok(all.len() as u64)
}

/// The daily safety net: in-progress deliveries overdue since `before` are
/// re-planned due `now` (their message was lost); the jobs to queue. Day
/// counters older than `oldest_day` (retention) go too.
pub fn requeue<S: WebhookStore>(
    s: &mut S,
    before: u64,
    limit: usize,
    now: u64,
    oldest_day: u64,
) -> Result<Vec<FirstJob>, S::Error> {
    s.drop_usage_before(oldest_day)?;
    let mut out = Vec::new();
    for mut d in s.overdue(before, limit)? {
        d.next_attempt_at = Some(now);
        d.updated_at = now;
        s.put_delivery(&d)?;
        out.push(FirstJob::of(&d, now));
    }
    Ok(out)
}

/// One delivery with its attempts and its event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Detail {
    pub delivery: DeliveryRecord,
    pub event: Option<EventRecord>,
    pub attempts: Vec<AttemptRecord>,
}

pub fn detail<S: WebhookStore>(s: &mut S, delivery_id: &str) -> Result<Option<Detail>, S::Error> {
    let Some(d) = s.delivery(delivery_id)? else {
        return Ok(None);
    };
    let mut attempts = s.attempts(delivery_id)?;
    attempts.sort_by_key(|a| (a.at, a.attempt));
    Ok(Some(Detail {
        event: s.event(&d.event_id)?,
        delivery: d,
        attempts,
    }))
}

/// One delivery with its attempts, as the compliance archive
/// writes it (one NDJSON line each, `archive::delivery_line`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Archived {
    pub delivery: DeliveryRecord,
    pub attempts: Vec<AttemptRecord>,
}

/// A page of delivery records (one delivery with its attempts, CONTRACT
/// §15) created in `[since, until)` after `after`, oldest first: what the
/// archive and exports write, a page per call.
pub fn archive_page<S: WebhookStore>(
    s: &mut S,
    since: u64,
    until: u64,
    after: &(u64, String),
    limit: usize,
) -> Result<Vec<Archived>, S::Error> {
    let page = s.oldest(since, until, after, limit)?;
    let ids: Vec<&str> = page.iter().map(|d| d.id.as_str()).collect();
    let mut attempts: BTreeMap<String, Vec<AttemptRecord>> = BTreeMap::new();
    for a in s.attempts_of(&ids)? {
        attempts.entry(a.delivery_id.clone()).or_default().push(a);
    }
    Ok(page
        .into_iter()
        .map(|delivery| {
            let mut mine = attempts.remove(&delivery.id).unwrap_or_default();
            mine.sort_by_key(|a| (a.at, a.attempt));
            Archived {
                delivery,
                attempts: mine,
            }
        })
        .collect())
}

/// A whole event moved in from elsewhere (D1's legacy rows): its record,
/// deliveries and attempts, ids and states kept. Rows already present are
/// left as they are.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Imported {
    pub event: EventRecord,
    pub deliveries: Vec<DeliveryRecord>,
    pub attempts: Vec<AttemptRecord>,
}

pub fn import<S: WebhookStore>(s: &mut S, batch: &[Imported]) -> Result<u64, S::Error> {
    let event_ids: Vec<&str> = batch.iter().map(|i| i.event.id.as_str()).collect();
    let mut events: std::collections::BTreeSet<String> =
        s.events(&event_ids)?.into_iter().map(|e| e.id).collect();
    let delivery_ids: Vec<&str> = batch
        .iter()
        .flat_map(|i| i.deliveries.iter().map(|d| d.id.as_str()))
        .collect();
    let mut known: std::collections::BTreeSet<String> = s
        .deliveries(&delivery_ids)?
        .into_iter()
        .map(|d| d.id)
        .collect();
    let (mut new_events, mut new_deliveries, mut attempts) = (Vec::new(), Vec::new(), Vec::new());
    for imp in batch {
        if events.insert(imp.event.id.clone()) {
            new_events.push(imp.event.clone());
        }
        for d in &imp.deliveries {
            if known.insert(d.id.clone()) {
                new_deliveries.push(d.clone());
            }
        }
        // An attempt already stored is kept (its key is the delivery and request id).
        attempts.extend(imp.attempts.iter().cloned());
    }
    if !new_events.is_empty() {
        s.insert_events(&new_events)?;
    }
    if !new_deliveries.is_empty() {
        s.put_deliveries(&new_deliveries)?;
    }
    if !attempts.is_empty() {
        s.insert_attempts(&attempts)?;
    }
    Ok(new_deliveries.len() as u64)
}

/// Rows to write back as given: an operator's repair from a shard's dump
/// (tests set up states with it).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Restore {
    #[serde(default)]
    pub deliveries: Vec<DeliveryRecord>,
    /// `(day, counters)`; a day not listed is left as it is.
    #[serde(default)]
    pub usage: Vec<(u64, Usage)>,
}

/// Writes `r`'s rows as given; how many were written.
pub fn restore<S: WebhookStore>(s: &mut S, r: &Restore) -> Result<u64, S::Error> {
    for d in &r.deliveries {
        s.put_delivery(d)?;
    }
    for (day, u) in &r.usage {
        s.put_usage(*day, u)?;
    }
    Ok((r.deliveries.len() + r.usage.len()) as u64)
}
