//! The outbox of a key's object (ADR 0037), run by its alarm: the object's
//! JS class (`src/entry.mjs`) hands the alarm here, so the object itself
//! never calls up into publishing, the queue or R2. In order, each step its
//! own call into the object (`postguard_core::guard::{DueWork, Published,
//! Requeued, Sweep}`), each failure logged and left to a later alarm:
//!
//! 1. what is due (`DueWork`): events to publish, operations to hand to the
//!    `OPERATIONS` queue;
//! 2. each event published through the one write path, then recorded
//!    (`Published`: forgotten, or tried again later, dropped after a day);
//! 3. the operations sent, then recorded (`Requeued`: looked at again after
//!    `async.requeue_after_s`, or in a few seconds if the send failed);
//! 4. the sweep (`Sweep`): expired records deleted, the object's next alarm
//!    set (`store::next_alarm`); then the R2 objects of what expired deleted
//!    here, after the object's commit (an object never replayed).

use postguard_core::config::Config;
use postguard_core::guard::{
    DueWork, DueWorkRequest, Published, PublishedRequest, Requeued, RequeuedRequest, Sweep,
    SweepRequest,
};
use postguard_core::log::Line;
use wasm_bindgen::prelude::wasm_bindgen;
use worker::wasm_bindgen::{JsCast, JsValue};
use worker::Env;

use crate::durable::client::{CallError, Guard};
use crate::log;
use crate::replays;

/// Operations handed to the queue, and events published, per alarm run.
const WORK_BATCH: u32 = 50;
/// Records deleted per alarm run; more are left to an immediate next run.
const SWEEP_BATCH: u32 = 500;
/// An operation the queue refused is handed on again after this long (ms).
const SEND_RETRY_MS: u64 = 5_000;

/// A key object's alarm: `object` is the object's JS class (its `run`),
/// `env` the object's bindings. Rejects only when the sweep fails (the
/// runtime then runs the alarm again).
#[wasm_bindgen(
    js_name = keyGuardAlarm,
    wasm_bindgen = ::worker::wasm_bindgen,
    wasm_bindgen_futures = ::worker::wasm_bindgen_futures,
    js_sys = ::worker::js_sys
)]
pub async fn key_guard_alarm(object: JsValue, env: JsValue) -> Result<(), JsValue> {
    let guard = Guard::itself(object);
    let env: Env = env.unchecked_into();
    let cfg = crate::runtime::config(&env).ok();
    if let Some(cfg) = &cfg {
        if let Err(e) = work(&guard, &env, cfg).await {
            log::emit(Line::error("the outbox's work failed").err(e));
        }
    }
    let sweep = SweepRequest {
        grace_ms: cfg.as_ref().map_or(0, |c| {
            u64::from(c.settings.idempotency.lookup_grace_s) * 1000
        }),
        batch: SWEEP_BATCH,
        worked: cfg.is_some(),
    };
    let (swept, _) = guard
        .call::<Sweep>(&sweep, &[])
        .await
        .map_err(|e| JsValue::from_str(&e.to_string()))?;
    // After the object's commit: an object whose record is gone is never replayed.
    replays::delete(&env, swept.objects).await;
    Ok(())
}

/// Steps 1–3: publish the events due and hand the operations due to the
/// queue, recording each result in the object.
async fn work(guard: &Guard, env: &Env, cfg: &Config) -> Result<(), CallError> {
    let (due, _) = guard
        .call::<DueWork>(&DueWorkRequest { batch: WORK_BATCH }, &[])
        .await?;
    for p in due.publishes {
        let ok = match super::publish::one(env, cfg, &p.event).await {
            Ok(()) => true,
            Err(e) => {
                log::emit(
                    Line::warn("publishing an event failed; retried later")
                        .field("event_id", p.event.id.as_str())
                        .field("request_id", p.event.request_id.as_str())
                        .err(e),
                );
                false
            }
        };
        let (ev, rid) = (p.event.id.clone(), p.event.request_id.clone());
        let req = PublishedRequest { pending: p, ok };
        match guard.call::<Published>(&req, &[]).await {
            Ok((true, _)) => log::emit(
                Line::error("an event could not be published for a day and is dropped")
                    .field("event_id", ev.as_str())
                    .field("request_id", rid.as_str()),
            ),
            Ok((false, _)) => {}
            Err(e) => log::emit(Line::error("recording a publish failed").err(e)),
        }
    }
    if due.sends.is_empty() {
        return Ok(());
    }
    let ids: Vec<&str> = due.sends.iter().map(|(id, _)| id.as_str()).collect();
    // Handed on: looked at again after `requeue_after_s`; not handed on:
    // tried again in a few seconds.
    let requeue_ms = match super::queue::send(env, &ids).await {
        Ok(()) => u64::from(cfg.settings.async_ops.requeue_after_s) * 1000,
        Err(e) => {
            log::emit(Line::error("handing operations to the queue failed").err(e));
            SEND_RETRY_MS
        }
    };
    let req = RequeuedRequest {
        sends: due.sends,
        requeue_ms,
    };
    guard.call::<Requeued>(&req, &[]).await?;
    Ok(())
}
