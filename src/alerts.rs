//! Operational alerts (issue 27 item 5, ADR 0038), checked by the
//! every-minute trigger: what the webhook shards and D1 report is handed to
//! `postguard_core::alerts::evaluate`; each alert it calls for is claimed in
//! D1 (at most one per condition and `alerts.period_s`, whatever the number
//! of isolates or runs) and published through the one write path to the
//! subscriptions of its audience, like `postguard.subscription.disabled`.

use postguard_core::alerts::{self, Alert, Observed, ShardVitals, MAX_SHARDS};
use postguard_core::config::Config;
use postguard_core::log::Line;
use postguard_core::webhooks::protocol::{self as wire, Done};
use worker::{Env, Result};

use crate::d1::{num, text};
use crate::runtime::now_ms;
use crate::webhooks::shards;
use crate::webhooks::{directory, new_id, write};
use crate::{bindings, log};
use postguard_core::webhooks::protocol::Vitals;

/// Observes, evaluates and publishes; how many alerts were published.
pub async fn check(env: &Env, cfg: &Config) -> Result<u32> {
    let now = now_ms();
    let s = &cfg.settings;
    let observed = observe(env, cfg, now).await?;
    let mut sent = 0;
    for alert in alerts::evaluate(&observed, s, now) {
        let period_ms = u64::from(s.alerts.period_s) * 1_000;
        if !claim(env, &alert.condition, now, period_ms).await? {
            continue;
        }
        publish(env, cfg, &alert).await?;
        sent += 1;
    }
    Ok(sent)
}

/// The shards that can hold due deliveries (those of the retry schedule's
/// span and a day, newest first, at most [`MAX_SHARDS`]) and D1's size.
async fn observe(env: &Env, cfg: &Config, now: u64) -> Result<Observed> {
    let since = now.saturating_sub(alerts::lag_window_ms(&cfg.settings));
    let mut shards_seen = Vec::new();
    for key in directory::shards_since(env, since, MAX_SHARDS).await? {
        let v: Vitals = shards::call::<wire::VitalsOf>(env, &key, &Done {}).await?;
        shards_seen.push(ShardVitals {
            project: key.project,
            start_ms: key.start_ms,
            bytes: v.bytes,
            oldest_due: v.oldest_due,
        });
    }
    Ok(Observed {
        d1_bytes: d1_size(env).await?,
        shards: shards_seen,
    })
}

/// D1's size, as a statement's result reports it.
async fn d1_size(env: &Env) -> Result<Option<u64>> {
    let res = env.d1(bindings::DB)?.prepare("SELECT 1").run().await?;
    Ok(res
        .meta()?
        .and_then(|m| m.size_after)
        .map(|s| s as u64)
        .or_else(directory::last_size))
}

/// Claims `condition` for this period (a compare-and-set on its row):
/// whether this run is the one to publish it.
async fn claim(env: &Env, condition: &str, now: u64, period_ms: u64) -> Result<bool> {
    let res = env
        .d1(bindings::DB)?
        .prepare(
            "INSERT INTO alerts (condition, fired_at) VALUES (?1, ?2) \
             ON CONFLICT (condition) DO UPDATE SET fired_at = excluded.fired_at \
             WHERE alerts.fired_at <= ?3",
        )
        .bind(&[
            text(condition),
            num(now),
            num(now.saturating_sub(period_ms)),
        ])?
        .run()
        .await?;
    Ok(res.meta()?.and_then(|m| m.changes).unwrap_or(0) > 0)
}

/// Logs the alert and publishes it to each project of its audience.
async fn publish(env: &Env, cfg: &Config, a: &Alert) -> Result<()> {
    let audience = a.audience(cfg.settings.alerts.project.as_deref());
    log::emit(
        Line::warn("operational alert")
            .field("type", a.event_type)
            .field("condition", a.condition.as_str())
            .field("projects", audience.len()),
    );
    let request_id = new_id("req_");
    let events = audience
        .into_iter()
        .map(|project| write::Publish {
            project,
            id: new_id("evt_"),
            event_type: a.event_type.to_string(),
            data: a.data.clone(),
            request_id: request_id.clone(),
            deliver_at: None,
            exclude: None,
            ordering_key: None,
        })
        .collect();
    for outcome in write::store(env, cfg, events).await {
        if let write::Outcome::Failed(why) = outcome {
            return Err(worker::Error::RustError(why));
        }
    }
    Ok(())
}
