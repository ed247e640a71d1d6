//! What the project's object reads of D1 (the record of the subscriptions,
//! ADR 0046): one batch when its copy is stale. The only SQL of the object
//! outside its own table.

use postguard_core::webhooks::hub::{Snapshot, Subscriber};
use postguard_core::webhooks::ops::SubState;
use serde::Deserialize;
use worker::wasm_bindgen::JsValue;
use worker::{Env, Result};

use crate::bindings;

#[derive(Deserialize)]
struct Row {
    id: String,
    url: String,
    events: String,
    state: Option<SubState>,
}

#[derive(Deserialize)]
struct Bytes {
    bytes: u64,
}

/// `project`'s subscriptions that can receive events (not those of a
/// revoked key, ADR 0015), its bytes charged today in D1 (inspectors), and
/// D1's size as this read saw it (the size guard).
pub async fn load(env: &Env, project: &str, day: u64, now: u64) -> Result<Snapshot> {
    let d = env.d1(bindings::DB)?;
    let p = JsValue::from_str(project);
    let results = d
        .batch(vec![
            d.prepare(
                "SELECT s.id, s.url, s.events, o.state FROM subscriptions s \
                 LEFT JOIN subscription_ops o ON o.subscription_id = s.id \
                 LEFT JOIN subscription_owners w ON w.subscription_id = s.id \
                 WHERE s.project = ? AND w.key_revoked_at IS NULL",
            )
            .bind(std::slice::from_ref(&p))?,
            d.prepare("SELECT bytes FROM webhook_usage WHERE day = ? AND project = ?")
                .bind(&[JsValue::from_f64(day as f64), p])?,
        ])
        .await?;
    let mut snap = Snapshot {
        subscribers: Vec::new(),
        bytes_today: 0,
        day,
        loaded_at: now,
        d1_bytes: None,
    };
    if let Some(r) = results.first() {
        snap.d1_bytes = r.meta()?.and_then(|m| m.size_after).map(|b| b as u64);
        snap.subscribers = r.results::<Row>()?.into_iter().map(subscriber).collect();
    }
    if let Some(r) = results.get(1) {
        snap.bytes_today = r.results::<Bytes>()?.first().map_or(0, |b| b.bytes);
    }
    Ok(snap)
}

/// Filters that do not parse match nothing, as before the copy.
fn subscriber(r: Row) -> Subscriber {
    Subscriber {
        events: serde_json::from_str(&r.events).unwrap_or_default(),
        held: r.state.is_some_and(SubState::holds),
        id: r.id,
        url: r.url,
    }
}
