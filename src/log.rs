//! Writes the core's log lines (`postguard_core::log::Line`, one JSON object
//! each) to the console at their level; `wrangler tail --format json` and
//! Workers Logs read them as they are.

use postguard_core::log::{Level, Line};

use crate::runtime::RequestCtx;

pub fn emit(line: Line) {
    let json = line.to_json();
    match line.level {
        Level::Info => worker::console_log!("{}", json),
        Level::Warn => worker::console_warn!("{}", json),
        Level::Error => worker::console_error!("{}", json),
    }
}

/// `line` with the request's `request_id`, `project` and `key_prefix`.
pub fn of_request(line: Line, rc: &RequestCtx) -> Line {
    let f = rc.facts.borrow();
    line.field("request_id", rc.request_id.as_str())
        .maybe("project", f.project.as_deref())
        .maybe("key_prefix", f.key_prefix.as_deref())
}
