//! The one way an operation's completion and a response's event are
//! published: through the gateway's publish path, as `POST /events` stores
//! an event (its deliveries and their outbox in one transaction, then the
//! queue). Called by the key's object's alarm for each event it holds to
//! publish; publishing an id again is a no-op, so a retry after a failure or
//! a crash never makes a second event.

use postguard_core::config::Config;
use postguard_core::response_events::PendingEvent;
use worker::Env;

use crate::webhooks::publish::{fan_out, Event};

/// Publishes `ev` (idempotent by its id).
pub async fn one(env: &Env, cfg: &Config, ev: &PendingEvent) -> worker::Result<()> {
    let event = Event {
        project: &ev.project,
        id: &ev.id,
        event_type: &ev.event_type,
        data: &ev.data,
        request_id: &ev.request_id,
    };
    fan_out(env, cfg, &event, None).await.map(|_| ())
}
