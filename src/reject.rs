//! The one error type of the request handlers, and the one place that renders
//! it. A handler returns `Handled` and uses `?` on everything: a client error
//! is a [`Problem`] (plus headers it carries, such as the rate-limit ones), an
//! internal one is a `worker::Error`, logged and answered 500.

use crate::log;
use postguard_core::log::Line;
use postguard_core::problem::PROBLEM_CONTENT_TYPE;
use postguard_core::{ErrorCode, Problem};
use worker::Response;

use crate::http;
use crate::runtime::RequestCtx;

/// Extra response headers of a rejection.
pub type Extra = Vec<(&'static str, String)>;

#[derive(Debug)]
pub enum Reject {
    /// Answered with this problem and these extra headers.
    Client(Problem, Extra),
    /// A failure of the gateway or a store: logged, answered 500.
    Internal(worker::Error),
}

/// What a handler returns.
pub type Handled<T = Response> = Result<T, Reject>;

impl Reject {
    /// The same rejection with `extra` headers added (a client error only:
    /// an internal error is answered without them, as before).
    pub fn with(self, extra: &[(&'static str, String)]) -> Reject {
        match self {
            Reject::Client(p, mut h) => {
                h.extend_from_slice(extra);
                Reject::Client(p, h)
            }
            internal => internal,
        }
    }
}

impl From<Problem> for Reject {
    fn from(p: Problem) -> Self {
        Reject::Client(p, Vec::new())
    }
}

impl From<worker::Error> for Reject {
    fn from(e: worker::Error) -> Self {
        Reject::Internal(e)
    }
}

impl From<crate::durable::client::CallError> for Reject {
    fn from(e: crate::durable::client::CallError) -> Self {
        Reject::Internal(worker::Error::RustError(e.to_string()))
    }
}

impl From<worker::wasm_bindgen::JsValue> for Reject {
    fn from(e: worker::wasm_bindgen::JsValue) -> Self {
        Reject::Internal(e.into())
    }
}

impl From<serde_json::Error> for Reject {
    fn from(e: serde_json::Error) -> Self {
        Reject::Internal(e.into())
    }
}

impl From<worker::KvError> for Reject {
    fn from(e: worker::KvError) -> Self {
        Reject::Internal(worker::Error::RustError(format!("KV: {e}")))
    }
}

impl From<postguard_core::Invalid> for Reject {
    fn from(e: postguard_core::Invalid) -> Self {
        Problem::new(ErrorCode::ValidationError, e.to_string()).into()
    }
}

/// The response for a handler's outcome: the only place a problem is rendered.
pub fn render(rc: &RequestCtx, outcome: Handled) -> worker::Result<Response> {
    let (p, extra) = match outcome {
        Ok(resp) => return Ok(resp),
        Err(Reject::Client(p, extra)) => (p, extra),
        Err(Reject::Internal(e)) => {
            log::emit(log::of_request(Line::error("internal error"), rc).err(e));
            let p = Problem::new(
                ErrorCode::Internal,
                "the gateway failed to handle this request; it is safe to retry with the same Idempotency-Key",
            );
            (p, Vec::new())
        }
    };
    {
        let mut f = rc.facts.borrow_mut();
        f.code = Some(p.code.as_str());
        f.policy = p
            .ext
            .as_ref()
            .and_then(|e| e.violated_policies.first().cloned());
    }
    let mut all = extra;
    all.push(("Content-Type", PROBLEM_CONTENT_TYPE.to_string()));
    all.push(("Cache-Control", "no-store".to_string()));
    if let Some(s) = p.retry_after_s {
        all.push(("Retry-After", s.to_string()));
    }
    if let Some(allow) = p.allow {
        all.push(("Allow", allow.to_string()));
    }
    let body = p.to_json(&rc.request_id).into_bytes();
    http::respond(rc, p.status(), &[], &all, Some(body))
}
