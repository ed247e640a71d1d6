//! `GET /_postguard/v1/events` (API key or session: its own project; the
//! operator: `project=`): the events as
//! published, with their delivery summary, for reconciliation and for local
//! development without a public URL, paged across the project's shards and
//! the legacy rows (ADR 0035). Retention as deliveries.

use super::shards;
use crate::handler::{self, Ctx};
use crate::reject::Handled;
use postguard_core::page::{encode_cursor, Page};
use postguard_core::webhooks::ops::{self, Order};
use postguard_core::webhooks::records::{EventQuery, FeedRow};
use serde::Serialize;
use serde_json::Value;

#[derive(Serialize)]
struct Summary {
    total: u32,
    delivered: u32,
    failed: u32,
    dead_letter: u32,
    pending: u32,
    paused: u32,
}

#[derive(Serialize)]
struct FeedEvent {
    id: String,
    #[serde(rename = "type")]
    event_type: Value,
    timestamp: Value,
    data: Value,
    request_id: Option<String>,
    ordering_key: Option<String>,
    deliveries: Summary,
    #[serde(skip)]
    created_at: u64,
}

impl From<FeedRow> for FeedEvent {
    fn from(r: FeedRow) -> Self {
        // The stored payload is the exact body delivered: {id, type, timestamp, data}.
        let mut p: Value =
            serde_json::from_slice(r.event.payload.as_bytes()).unwrap_or(Value::Null);
        let c = r.summary;
        FeedEvent {
            id: r.event.id,
            event_type: p["type"].take(),
            timestamp: p["timestamp"].take(),
            data: p["data"].take(),
            request_id: r.event.request_id,
            ordering_key: r.event.ordering_key,
            deliveries: Summary {
                total: c.total,
                delivered: c.delivered,
                failed: c.failed,
                dead_letter: c.dead_letter,
                pending: c.pending,
                paused: c.paused,
            },
            created_at: r.event.created_at,
        }
    }
}

pub async fn list(cx: &Ctx<'_>) -> Handled {
    let (env, rc) = (cx.env, cx.rc);
    let (project, pairs) = cx.reader_project()?;
    let q = ops::parse_feed(&pairs)?;
    let query = EventQuery {
        since: q.since,
        until: q.until,
        event_type: q.event_type.clone(),
        desc: q.order == Order::Desc,
        after: q.cursor.clone(),
    };
    let rows = shards::page_events(env, &project, &query, q.limit + 1).await?;
    let events: Vec<FeedEvent> = rows.into_iter().map(FeedEvent::from).collect();
    let page = Page::of(events, q.limit, |e| encode_cursor(e.created_at, &e.id));
    handler::json(rc, 200, &page, &[])
}
