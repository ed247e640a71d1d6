//! The one way an operation's completion and a response's event are
//! published: the gateway's one write path (`webhooks::write::store`, ADR
//! 0035), as `POST /events` stores an event — its deliveries and their
//! outbox in its shard's one transaction, then the queue. Called by the key's
//! object's alarm for each event it holds to publish. A repeat of a stored id
//! only sends what of it is unsent, so a retry after a failure or a crash
//! makes no second event.

use postguard_core::config::Config;
use postguard_core::response_events::PendingEvent;
use worker::Env;

use crate::webhooks::write::{self, Outcome, Publish};

/// Publishes `ev` (idempotent by its id); `Err` says why it is not yet.
pub async fn one(env: &Env, cfg: &Config, ev: &PendingEvent) -> Result<(), String> {
    let event = Publish {
        project: ev.project.clone(),
        id: ev.id.clone(),
        event_type: ev.event_type.clone(),
        data: ev.data.clone(),
        request_id: ev.request_id.clone(),
        deliver_at: None,
        exclude: None,
        ordering_key: None,
    };
    match write::store(env, cfg, vec![event]).await.pop() {
        Some(Outcome::Stored | Outcome::Known) => Ok(()),
        Some(Outcome::Refused(p)) => Err(format!("refused: {}", p.detail)),
        Some(Outcome::Failed(why)) => Err(why),
        None => Err("the write path answered nothing".into()),
    }
}
