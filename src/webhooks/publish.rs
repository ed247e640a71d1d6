//! `POST /_postguard/v1/events` (origin, `ORIGIN_TOKEN`): the event, its
//! deliveries and their outbox state are written in one transaction of the
//! project's current shard, the first attempts are handed to the queue, and
//! only then the answer is 202 (ADR 0035). The request joins the publishes
//! running beside it in this isolate (`super::group`, ADR 0024), which store
//! through the one write path (`super::write`).
//!
//! If the send fails the origin gets a 503 (`STORAGE_UNAVAILABLE`), and its
//! retry of the same event id (otherwise a no-op) enqueues what is still
//! unsent; the every-minute cron sweeps deliveries left unsent past
//! `webhooks.outbox_after_s` ([`sweep_outbox`]). A job sent twice is dropped
//! by the consumer: a scheduled job runs only while it matches the
//! delivery's `next_attempt_at`, once.

use crate::log;
use postguard_core::log::Line;
use postguard_core::webhooks::protocol as wire;
use postguard_core::webhooks::records::FirstJob;
use postguard_core::webhooks::{events, fanout};
use serde::Serialize;
use worker::{Env, Result};

use super::group::{self, Outcome};
use super::shards;
use super::{directory, new_id, write};
use crate::durable::webhook_shard::BeforeReq;
use crate::handler::{self, Ctx};
use crate::reject::{Handled, Reject};
use crate::runtime::{now_ms, RequestCtx};

#[derive(Serialize)]
struct Accepted<'a> {
    id: &'a str,
}

pub async fn publish(cx: &Ctx<'_>) -> Handled {
    let (env, cfg, rc) = (cx.env, cx.cfg, cx.rc);
    let body = &cx.body;
    let input = events::parse_publish_at(body, now_ms())?;
    rc.note(|f| f.project = Some(input.project.clone()));
    let event_id = input.id.clone().unwrap_or_else(|| new_id("evt_"));
    let ev = group::NewEvent {
        project: input.project,
        id: event_id.clone(),
        event_type: input.event_type,
        data: input.data,
        deliver_at: input.deliver_at,
        ordering_key: input.ordering_key,
        request_id: rc.request_id.clone(),
        bytes: body.len(),
    };
    match group::submit(env, cfg, ev).await {
        Outcome::Stored => {}
        Outcome::Refused(problem) => return Err(problem.into()),
        Outcome::Failed(why) => return Err(uncommitted(rc, &why)),
        Outcome::Lead => {
            return Err(uncommitted(
                rc,
                "a publish was handed the lead after its group",
            ))
        }
    }
    handler::json(rc, 202, &Accepted { id: &event_id }, &[])
}

/// 503 `STORAGE_UNAVAILABLE` with `Retry-After` for a publish whose commit or
/// send failed (transient: the retry of the same id is idempotent); the
/// cause goes to the log, not to the origin.
fn uncommitted(rc: &RequestCtx, why: &str) -> Reject {
    log::emit(log::of_request(Line::error("publish not committed"), rc).field("reason", why));
    fanout::uncommitted().into()
}

/// Shards the every-minute sweep visits: those that ended within the last
/// hour (unsent rows are recent; older ones were swept by earlier runs).
const SWEEP_WINDOW_MS: u64 = 3_600_000;
const SWEEP_SHARDS: u32 = 200;

/// The every-minute sweep: deliveries left unsent for `after_s` (their
/// publish's send failed and the origin did not retry) are enqueued.
pub async fn sweep_outbox(env: &Env, after_s: u32) -> Result<usize> {
    let now = now_ms();
    let before = now.saturating_sub(u64::from(after_s) * 1000);
    let mut n = 0;
    for key in
        directory::shards_since(env, now.saturating_sub(SWEEP_WINDOW_MS), SWEEP_SHARDS).await?
    {
        let req = BeforeReq {
            before,
            limit: 500,
            now,
            oldest_day: 0,
        };
        let jobs: Vec<FirstJob> = shards::call::<wire::Unsent>(env, &key, &req).await?;
        write::send_and_mark(env, &key, &jobs, false).await?;
        n += jobs.len();
    }
    Ok(n)
}
