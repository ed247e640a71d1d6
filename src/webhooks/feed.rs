//! `GET /_postguard/v1/events` (API key, own project): the events as
//! published, with their delivery summary, for reconciliation and for local
//! development without a public URL. Retention as deliveries.

use postguard_core::page::{encode_cursor, Page};
use postguard_core::webhooks::ops::{self, Order};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use worker::wasm_bindgen::JsValue;

use super::{num, text};
use crate::admin::Ctx;
use crate::reject::Handled;
use crate::request::query_pairs;
use crate::{bindings, http};

#[derive(Deserialize)]
struct Row {
    id: String,
    payload: String,
    created_at: u64,
    request_id: Option<String>,
    total: u32,
    delivered: u32,
    failed: u32,
    dead_letter: u32,
    pending: u32,
    paused: u32,
}

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
    deliveries: Summary,
    #[serde(skip)]
    created_at: u64,
}

impl From<Row> for FeedEvent {
    fn from(r: Row) -> Self {
        // The stored payload is the exact body delivered: {id, type, timestamp, data}.
        let mut p: Value = serde_json::from_slice(r.payload.as_bytes()).unwrap_or(Value::Null);
        FeedEvent {
            id: r.id,
            event_type: p["type"].take(),
            timestamp: p["timestamp"].take(),
            data: p["data"].take(),
            request_id: r.request_id,
            deliveries: Summary {
                total: r.total,
                delivered: r.delivered,
                failed: r.failed,
                dead_letter: r.dead_letter,
                pending: r.pending,
                paused: r.paused,
            },
            created_at: r.created_at,
        }
    }
}

const SELECT: &str = "SELECT e.id, e.payload, e.created_at, r.request_id, \
     (SELECT COUNT(*) FROM deliveries d WHERE d.project = e.project AND d.event_id = e.id) AS total, \
     (SELECT COUNT(*) FROM deliveries d WHERE d.project = e.project AND d.event_id = e.id AND d.status = 'delivered') AS delivered, \
     (SELECT COUNT(*) FROM deliveries d WHERE d.project = e.project AND d.event_id = e.id AND d.status = 'failed') AS failed, \
     (SELECT COUNT(*) FROM deliveries d WHERE d.project = e.project AND d.event_id = e.id AND d.status = 'dead_letter') AS dead_letter, \
     (SELECT COUNT(*) FROM deliveries d WHERE d.project = e.project AND d.event_id = e.id AND d.status = 'pending') AS pending, \
     (SELECT COUNT(*) FROM deliveries d WHERE d.project = e.project AND d.event_id = e.id AND d.status = 'paused') AS paused \
     FROM events e LEFT JOIN event_requests r ON r.project = e.project AND r.event_id = e.id \
     WHERE e.project = ?";

pub async fn list(cx: &Ctx<'_>) -> Handled {
    let (req, env, rc) = (&cx.req, cx.env, cx.rc);
    let project = cx.project()?;
    let q = ops::parse_feed(&query_pairs(req)?)?;
    let mut sql = SELECT.to_string();
    let mut args: Vec<JsValue> = vec![text(project)];
    if let Some(s) = q.since {
        sql.push_str(" AND e.created_at >= ?");
        args.push(num(s));
    }
    if let Some(u) = q.until {
        sql.push_str(" AND e.created_at <= ?");
        args.push(num(u));
    }
    if let Some(t) = &q.event_type {
        sql.push_str(" AND e.type = ?");
        args.push(text(t));
    }
    let (cmp, dir) = match q.order {
        Order::Asc => (">", "ASC"),
        Order::Desc => ("<", "DESC"),
    };
    if let Some((t, id)) = &q.cursor {
        sql.push_str(&format!(
            " AND (e.created_at {cmp} ? OR (e.created_at = ? AND e.id {cmp} ?))"
        ));
        args.extend([num(*t), num(*t), text(id)]);
    }
    sql.push_str(&format!(" ORDER BY e.created_at {dir}, e.id {dir} LIMIT ?"));
    args.push(num(u64::from(q.limit) + 1));
    let rows: Vec<Row> = env
        .d1(bindings::DB)?
        .prepare(sql)
        .bind(&args)?
        .all()
        .await?
        .results()?;
    let events: Vec<FeedEvent> = rows.into_iter().map(FeedEvent::from).collect();
    let page = Page::of(events, q.limit, |e| encode_cursor(e.created_at, &e.id));
    http::json(rc, 200, &page, &[])
}
