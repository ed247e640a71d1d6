//! Writes the data points `postguard_core::metrics` decides to Workers
//! Analytics Engine (binding `METRICS`, docs/observability.md). `writeDataPoint` is
//! fire-and-forget: it neither delays nor fails a request, and without the
//! binding (a deployment that did not add it) nothing is written.

use crate::log;
use postguard_core::log::Line;
use postguard_core::metrics::{self, DataPoint, Kind, RequestFacts};
use worker::{AnalyticsEngineDataPointBuilder, Env};

use crate::bindings;
use crate::runtime::{now_ms, RequestCtx};

/// The request's data point, from what the shell learnt while answering it.
pub fn request(env: &Env, rc: &RequestCtx, gateway: bool, method: &str, route: &str, status: u16) {
    let f = rc.facts.borrow();
    let point = metrics::request_point(&RequestFacts {
        kind: if gateway {
            Kind::Gateway
        } else {
            Kind::Proxied
        },
        route: f.route.unwrap_or(route),
        method,
        status,
        code: f.code,
        policy: f.policy.as_deref(),
        replayed: f.replayed,
        project: f.project.as_deref(),
        key_prefix: f.key_prefix.as_deref(),
        latency_ms: now_ms().saturating_sub(rc.started_ms),
        origin_ms: f.origin_ms,
        would_refuse: f.would_refuse.as_deref(),
        origin: f.origin.as_deref(),
    });
    write(env, &point);
}

/// Writes one point; a missing binding or a refused write is not the
/// request's problem (logged, never raised).
pub fn write(env: &Env, point: &DataPoint) {
    let Ok(dataset) = env.analytics_engine(bindings::METRICS) else {
        return;
    };
    let built = AnalyticsEngineDataPointBuilder::new()
        .indexes([point.index.as_str()])
        .blobs(point.blobs.iter().map(String::as_str))
        .doubles(point.doubles.iter().copied())
        .build();
    if let Err(e) = dataset.write_data_point(&built) {
        log::emit(Line::error("metrics: writing a data point failed").err(e));
    }
}
