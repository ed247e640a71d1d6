//! The in-memory [`WebhookStore`]: the backend of the host and property
//! tests, which drive the same functions the shard runs.

use std::collections::BTreeMap;

use super::super::capacity::Usage;
use super::*;

/// The in-memory backend of the property tests.
#[derive(Debug, Default, Clone)]
pub struct MemoryStore {
    pub events: BTreeMap<String, EventRecord>,
    pub deliveries: BTreeMap<String, DeliveryRecord>,
    pub attempts: Vec<AttemptRecord>,
    pub usage: BTreeMap<u64, Usage>,
    /// What [`WebhookStore::size`] answers.
    pub size: u64,
}

impl WebhookStore for MemoryStore {
    type Error = std::convert::Infallible;

    fn event(&mut self, id: &str) -> Result<Option<EventRecord>, Self::Error> {
        Ok(self.events.get(id).cloned())
    }
    fn insert_event(&mut self, e: &EventRecord) -> Result<(), Self::Error> {
        self.events.insert(e.id.clone(), e.clone());
        Ok(())
    }
    fn delivery(&mut self, id: &str) -> Result<Option<DeliveryRecord>, Self::Error> {
        Ok(self.deliveries.get(id).cloned())
    }
    fn put_delivery(&mut self, d: &DeliveryRecord) -> Result<(), Self::Error> {
        self.deliveries.insert(d.id.clone(), d.clone());
        Ok(())
    }
    fn deliveries_of(&mut self, event_id: &str) -> Result<Vec<DeliveryRecord>, Self::Error> {
        Ok(self
            .deliveries
            .values()
            .filter(|d| d.event_id == event_id)
            .cloned()
            .collect())
    }
    fn insert_attempt(&mut self, a: &AttemptRecord) -> Result<(), Self::Error> {
        // As the shard's INSERT OR IGNORE: one row per (delivery, request id).
        let known = self
            .attempts
            .iter()
            .any(|x| x.delivery_id == a.delivery_id && x.request_id == a.request_id);
        if !known {
            self.attempts.push(a.clone());
        }
        Ok(())
    }
    fn attempts(&mut self, delivery_id: &str) -> Result<Vec<AttemptRecord>, Self::Error> {
        Ok(self
            .attempts
            .iter()
            .filter(|a| a.delivery_id == delivery_id)
            .cloned()
            .collect())
    }
    fn health(
        &mut self,
        subscription_ids: &[&str],
        since: u64,
    ) -> Result<Vec<crate::webhooks::health::Tally>, Self::Error> {
        let of = |a: &AttemptRecord| {
            self.deliveries
                .get(&a.delivery_id)
                .map(|d| d.subscription_id.as_str())
                .filter(|s| subscription_ids.contains(s))
        };
        let seen = self.attempts.iter().filter_map(|a| {
            of(a).map(|s| crate::webhooks::health::Seen {
                subscription_id: s,
                url: &a.url,
                at: a.at,
                status_code: a.status_code,
                error: a.error.as_deref(),
            })
        });
        Ok(crate::webhooks::health::tally(seen, since))
    }
    fn unsent(&mut self, before: u64, limit: usize) -> Result<Vec<DeliveryRecord>, Self::Error> {
        let mut v: Vec<_> = self
            .deliveries
            .values()
            .filter(|d| {
                d.queued_at.is_none() && d.next_attempt_at.is_some() && d.created_at <= before
            })
            .cloned()
            .collect();
        v.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        v.truncate(limit);
        Ok(v)
    }
    fn held(&mut self, sub: &str, limit: usize) -> Result<Vec<DeliveryRecord>, Self::Error> {
        let mut v: Vec<_> = self
            .deliveries
            .values()
            .filter(|d| d.subscription_id == sub && d.status == Status::Paused)
            .cloned()
            .collect();
        v.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        v.truncate(limit);
        Ok(v)
    }
    fn blocked_on(&mut self, id: &str, limit: usize) -> Result<Vec<DeliveryRecord>, Self::Error> {
        Ok(self
            .deliveries
            .values()
            .filter(|d| d.blocked_by.as_deref() == Some(id))
            .take(limit)
            .cloned()
            .collect())
    }
    fn overdue(&mut self, before: u64, limit: usize) -> Result<Vec<DeliveryRecord>, Self::Error> {
        let mut v: Vec<_> = self
            .deliveries
            .values()
            .filter(|d| d.status.in_progress() && d.next_attempt_at.is_some_and(|n| n < before))
            .cloned()
            .collect();
        v.truncate(limit);
        Ok(v)
    }
    fn recoverable(
        &mut self,
        sub: &str,
        since: u64,
        until: u64,
        after: &(u64, String),
        limit: usize,
    ) -> Result<Vec<DeliveryRecord>, Self::Error> {
        let mut v: Vec<_> = self
            .deliveries
            .values()
            .filter(|d| {
                d.subscription_id == sub
                    && matches!(d.status, Status::Failed | Status::DeadLetter)
                    && d.created_at >= since
                    && d.created_at <= until
                    && (d.created_at, &d.id) > (after.0, &after.1)
            })
            .cloned()
            .collect();
        v.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        v.truncate(limit);
        Ok(v)
    }
    fn list(
        &mut self,
        q: &DeliveryQuery,
        limit: usize,
    ) -> Result<Vec<DeliveryRecord>, Self::Error> {
        let mut v: Vec<_> = self
            .deliveries
            .values()
            .filter(|d| q.matches(d))
            .cloned()
            .collect();
        v.sort_by(|a, b| (b.created_at, &b.id).cmp(&(a.created_at, &a.id)));
        v.truncate(limit);
        Ok(v)
    }
    fn feed(&mut self, q: &EventQuery, limit: usize) -> Result<Vec<FeedRow>, Self::Error> {
        let mut v: Vec<_> = self
            .events
            .values()
            .filter(|e| q.matches(e))
            .cloned()
            .collect();
        v.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        if q.desc {
            v.reverse();
        }
        v.truncate(limit);
        Ok(v.into_iter()
            .map(|event| {
                let mut summary = Summary::default();
                for d in self.deliveries.values().filter(|d| d.event_id == event.id) {
                    summary.count(d.status);
                }
                FeedRow { event, summary }
            })
            .collect())
    }
    fn usage(&mut self, day: u64) -> Result<Usage, Self::Error> {
        Ok(self.usage.get(&day).copied().unwrap_or_default())
    }
    fn put_usage(&mut self, day: u64, u: &Usage) -> Result<(), Self::Error> {
        self.usage.insert(day, *u);
        Ok(())
    }
    fn drop_usage_before(&mut self, day: u64) -> Result<(), Self::Error> {
        self.usage.retain(|d, _| *d >= day);
        Ok(())
    }
    fn size(&mut self) -> Result<u64, Self::Error> {
        Ok(self.size)
    }
    fn oldest_due(&mut self) -> Result<Option<(u64, String)>, Self::Error> {
        Ok(self
            .deliveries
            .values()
            .filter(|d| d.status.in_progress() && d.blocked_by.is_none())
            .filter_map(|d| d.next_attempt_at.map(|t| (t, d.id.clone())))
            .min())
    }
    fn oldest(
        &mut self,
        since: u64,
        until: u64,
        after: &(u64, String),
        limit: usize,
    ) -> Result<Vec<DeliveryRecord>, Self::Error> {
        let mut v: Vec<_> = self
            .deliveries
            .values()
            .filter(|d| {
                d.created_at >= since
                    && d.created_at < until
                    && (d.created_at, &d.id) > (after.0, &after.1)
            })
            .cloned()
            .map(|mut d| {
                d.request_id = self
                    .events
                    .get(&d.event_id)
                    .and_then(|e| e.request_id.clone());
                d
            })
            .collect();
        v.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        v.truncate(limit);
        Ok(v)
    }
}
