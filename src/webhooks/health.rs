//! A subscription's health after its attempts (docs/operating-webhooks.md):
//! the failure clock reset or started, or the subscription disabled — only
//! the changes `ops::health_change` names are written (D1) — and the
//! `postguard.subscription.disabled` event published.

use postguard_core::config::Config;
use postguard_core::webhooks::delivery::Attempted as AttemptResult;
use postguard_core::webhooks::ops::{self, Health};
use worker::{Env, Result};

use super::{directory, write};
use crate::runtime::now_ms;

/// An attempt sent to a subscription's own URL (a redirect says nothing
/// about it), as the health check reads it.
pub struct Attempted<'a> {
    pub project: &'a str,
    pub subscription_id: &'a str,
    pub url: &'a str,
    pub failing_since: Option<u64>,
    pub result: &'a AttemptResult,
    pub request_id: &'a str,
}

/// The failure clock of each attempted subscription (a redirect says nothing
/// about it): a success resets it, a failure starts it, and 410 or failing
/// for `webhooks.disable_after_s` disables the subscription — its pending
/// deliveries are then held — and publishes `postguard.subscription.disabled`
/// to the project's other matching subscriptions. A healthy subscription
/// costs no write.
pub async fn update(env: &Env, cfg: &Config, attempted: &[Attempted<'_>]) -> Result<()> {
    let after_s = cfg.settings.webhooks.disable_after_s;
    let now = now_ms();
    let changes: Vec<(&Attempted, Health)> = attempted
        .iter()
        .filter_map(|a| {
            Some((
                a,
                ops::health_change(a.failing_since, a.result, now, after_s)?,
            ))
        })
        .collect();
    let list: Vec<(&str, &str, Health)> = changes
        .iter()
        .map(|(r, h)| (r.subscription_id, r.project, *h))
        .collect();
    let applied = directory::health(env, &list, now).await?;
    for ((r, h), ok) in changes.iter().zip(applied) {
        if let (Health::Disable { reason, .. }, true) = (h, ok) {
            announce_disabled(env, cfg, r, reason.as_str(), now).await?;
        }
    }
    Ok(())
}

/// Publishes `postguard.subscription.disabled` {id, url, reason, since}
/// through the one write path.
async fn announce_disabled(
    env: &Env,
    cfg: &Config,
    r: &Attempted<'_>,
    reason: &str,
    at: u64,
) -> Result<()> {
    let data = serde_json::json!({
        "id": r.subscription_id,
        "url": r.url,
        "reason": reason,
        "since": postguard_core::webhooks::events::rfc3339_ms(at),
    });
    let event = write::Publish {
        project: r.project.to_string(),
        id: super::new_id("evt_"),
        event_type: ops::DISABLED_EVENT.to_string(),
        data,
        request_id: r.request_id.to_string(),
        deliver_at: None,
        exclude: Some(r.subscription_id.to_string()),
        ordering_key: None,
    };
    for outcome in write::store(env, cfg, vec![event]).await {
        if let write::Outcome::Failed(why) = outcome {
            return Err(worker::Error::RustError(why));
        }
    }
    Ok(())
}
