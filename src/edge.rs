//! The proxy's admission at the edge (ADR 0040). With `limits.edge` on, a
//! request's admission goes to the key's edge object for the location the
//! request arrived at (`request.cf.colo`, plus a shard chosen once per
//! isolate), which answers from its leases or forwards to the key's own
//! object; off, or without a location, it goes to the key's object as
//! before. The answer reads the same either way; what differs is where the
//! request's concurrency slot is held, which [`Admitted::slot`] says so
//! that it is freed there.

use std::cell::Cell;

use postguard_core::guard::{
    Admit, AdmitRequest, AdmitResponse, EdgeAdmit, EdgeAdmitRequest, EdgeEnd, EdgeEndRequest,
    SlotAt,
};
use postguard_core::lease::EdgeLimits;
use postguard_core::log::Line;
use worker::wasm_bindgen::JsValue;
use worker::{js_sys, web_sys, Context, Env};

use crate::durable::client::{CallError, Guard};
use crate::log;
use crate::reject::Handled;
use crate::runtime::random_bytes;

/// Where the request arrived (`request.cf.colo`, e.g. `LHR`) when edges are
/// on: `None` when they are off (the `cf` object, which the runtime builds
/// on first read, is then never read) or the runtime gave no location.
pub fn location(raw: &web_sys::Request, settings: &EdgeLimits) -> Option<String> {
    if !settings.enabled {
        return None;
    }
    let cf = js_sys::Reflect::get(raw, &JsValue::from_str("cf")).ok()?;
    let colo = js_sys::Reflect::get(&cf, &JsValue::from_str("colo"))
        .ok()?
        .as_string()?;
    // A name part: a data centre's code is three letters; keep it tame.
    let colo: String = colo
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(16)
        .collect();
    (!colo.is_empty()).then_some(colo)
}

thread_local! {
    /// This isolate's shard of every location (`limits.edge.shards`): its
    /// requests of a key stay on one edge object.
    static SHARD: Cell<Option<u32>> = const { Cell::new(None) };
}

fn shard(shards: u32) -> u32 {
    let n = SHARD.with(|s| {
        s.get().unwrap_or_else(|| {
            let n = random_bytes::<4>().map_or(0, u32::from_le_bytes);
            s.set(Some(n));
            n
        })
    });
    n % shards.max(1)
}

/// Where a request's concurrency slot is held.
pub enum Held {
    Home(Guard),
    Edge(Guard, u64),
}

/// The admission's answer, its payload (a replay's body) and the slot.
pub struct Admitted {
    pub answer: AdmitResponse,
    pub payload: Vec<u8>,
    pub slot: Option<Held>,
}

/// Admits `req` for the key whose object is `home` (named `key_id`): at the
/// edge of `colo` if given, else at the home. An edge object that cannot
/// be reached is passed by (the home decides, exactly).
pub async fn admit(
    env: &Env,
    home: &Guard,
    key_id: &str,
    colo: Option<&str>,
    (req, settings, request_ms): (AdmitRequest, &EdgeLimits, u64),
) -> Handled<Admitted> {
    let slot = req.slot.is_some();
    let Some(colo) = colo else {
        return at_home(home, &req, slot).await;
    };
    let edge = format!("{colo}.{}", shard(settings.shards));
    let object = Guard::of(env, &format!("edge:{key_id}:{edge}"))?;
    let asked = EdgeAdmitRequest {
        home: key_id.to_string(),
        edge,
        admit: req,
        settings: *settings,
        request_ms,
    };
    match object.call::<EdgeAdmit>(&asked, &[]).await {
        Ok((reply, payload)) => Ok(Admitted {
            answer: reply.answer,
            payload,
            slot: reply.slot.map(|at| match at {
                SlotAt::Home => Held::Home(home.clone()),
                SlotAt::Edge { life } => Held::Edge(object, life),
            }),
        }),
        Err(CallError::Transport(e)) => {
            log::emit(Line::warn("the edge object is unreachable: admitted at home").err(e));
            at_home(home, &asked.admit, slot).await
        }
        Err(e) => Err(e.into()),
    }
}

async fn at_home(home: &Guard, req: &AdmitRequest, slot: bool) -> Handled<Admitted> {
    let (answer, payload) = home.call::<Admit>(req, &[]).await?;
    Ok(Admitted {
        answer,
        payload,
        slot: slot.then(|| Held::Home(home.clone())),
    })
}

/// Frees the concurrency slot of a request without a claim where it is
/// held, after the answer (`waitUntil`: it never delays the client). If the
/// call is lost, the slot's lease frees it.
pub fn free_slot(held: Option<Held>, request_id: &str, ctx: &Context) {
    let Some(held) = held else {
        return;
    };
    let rid = request_id.to_string();
    ctx.wait_until(async move {
        let freed = match held {
            Held::Home(g) => {
                let req = postguard_core::guard::FinishRequest { slot: rid.clone() };
                g.call::<postguard_core::guard::Finish>(&req, &[])
                    .await
                    .map(|_| ())
            }
            Held::Edge(g, life) => g
                .call::<EdgeEnd>(&EdgeEndRequest { life }, &[])
                .await
                .map(|_| ()),
        };
        if let Err(e) = freed {
            log::emit(
                Line::error("freeing the concurrency slot failed")
                    .field("request_id", rid)
                    .err(e),
            );
        }
    });
}
