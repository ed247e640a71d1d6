//! What a handler of a gateway operation (`admin::route`'s phase 5) is
//! given, and the answers it gives: a JSON resource or 204. The admin
//! router and the webhooks handlers both depend on this module, so neither
//! imports the other for it.

use postguard_core::config::Config;
use serde::Serialize;
use worker::{Env, Request};

use crate::auth::Principal;
use crate::http::respond;
use crate::reject::Handled;
use crate::runtime::RequestCtx;

/// What a handler of a gateway operation is given: the request, its caller
/// as the router authenticated it, its body (read under the limit) and the
/// runtime's handles.
pub struct Ctx<'a> {
    pub req: Request,
    pub env: &'a Env,
    pub cfg: &'a Config,
    pub rc: &'a RequestCtx,
    pub who: Principal,
    pub body: Vec<u8>,
    /// What the caller's budget said when the router charged it (a key's or
    /// a session's; `None` for a caller without one).
    pub verdicts: Option<postguard_core::limits::Verdicts>,
    /// The record of the Idempotency-Key a lookup route asked about.
    pub lookup: Option<Box<postguard_core::guard::Lookup>>,
}

/// The project an `Access::Project` operation acts in, extracted once by
/// the router from the key or session that called it (an axum-style
/// extractor): a handler that needs a project takes one as an argument, so
/// none can run without it. A caller without a project is answered 403.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Project(String);

impl Project {
    pub fn of(cx: &Ctx<'_>) -> Handled<Project> {
        match cx.who.project() {
            Some(p) => Ok(Project(p.to_string())),
            None => Err(postguard_core::Problem::new(
                postguard_core::ErrorCode::Forbidden,
                "this endpoint belongs to a project: call it with one of the project's API keys",
            )
            .into()),
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Project {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl Ctx<'_> {
    /// The project an `Access::Reader` read of a project's records is about
    /// (`routes::reader_project`: a key's or session's own, or the one the
    /// operator names with `project=`), and the other query parameters.
    pub fn reader_project(&self) -> Handled<(String, Vec<(String, String)>)> {
        let mut pairs = crate::request::query_pairs(&self.req)?;
        let asked = pairs
            .iter()
            .position(|(k, _)| k == "project")
            .map(|i| pairs.remove(i).1);
        let project = postguard_core::routes::reader_project(self.who.project(), asked.as_deref())?;
        Ok((project, pairs))
    }
}

/// A JSON resource.
pub fn json<T: Serialize>(
    rc: &RequestCtx,
    status: u16,
    value: &T,
    extra: &[(&str, String)],
) -> Handled {
    let body = serde_json::to_vec(value)?;
    let mut all: Vec<(&str, String)> = extra.to_vec();
    all.push(("Content-Type", "application/json".to_string()));
    all.push(("Cache-Control", "no-store".to_string()));
    Ok(respond(rc, status, &[], &all, Some(body))?)
}

/// 204 with no body.
pub fn no_content(rc: &RequestCtx) -> Handled {
    Ok(respond(rc, 204, &[], &[], None)?)
}
