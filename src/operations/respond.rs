//! Events from responses on the proxy path (docs/async-operations.md): the event a
//! stored response implies rides in its completion (`CompleteRequest.event`),
//! so the key's object writes it with the response or not at all, and its
//! alarm publishes it. A replay, a retry or a racing duplicate stores no
//! response, so it never publishes.

use postguard_core::config::Config;
use postguard_core::guard::{Claim, CompleteRequest};
use postguard_core::log::Line;
use postguard_core::proxy::Incoming;
use postguard_core::response_events::{self, Trace};

use crate::auth::Caller;
use crate::log;
use crate::runtime::RequestCtx;

/// What the response's event needs of the request, taken before it is
/// forwarded: `None` (nothing to keep) when no rule names its method.
pub struct Route {
    method: String,
    path: String,
}

pub fn route_of(cfg: &Config, incoming: &Incoming) -> Option<Route> {
    let rules = &cfg.settings.events_from_responses;
    rules
        .iter()
        .any(|r| r.method == "*" || r.method == incoming.method)
        .then(|| Route {
            method: incoming.method.clone(),
            path: incoming.path.clone(),
        })
}

/// Adds the event the stored response implies to its completion; `body` is
/// `None` when it was not read whole (kept in R2). A matching rule that
/// gives no event (a body that is not JSON, a pointer that does not
/// resolve) is logged; the response itself is stored all the same.
pub fn attach(
    cfg: &Config,
    rc: &RequestCtx,
    caller: &Caller,
    claim: &Claim,
    route: Option<&Route>,
    done: &mut CompleteRequest,
    body: Option<&[u8]>,
) {
    let Some(route) = route else { return };
    let trace = Trace {
        method: &route.method,
        path: &route.path,
        project: &caller.key.record.project,
        key_id: &caller.key.record.id,
        idempotency_key: &claim.key,
        request_id: &claim.request_id,
    };
    let rules = &cfg.settings.events_from_responses;
    match response_events::for_response(rules, &trace, done.response.status, body) {
        Ok(event) => done.event = event,
        Err(why) => log::emit(
            log::of_request(Line::warn("no event for the stored response"), rc)
                .field("reason", why.to_string()),
        ),
    }
}
