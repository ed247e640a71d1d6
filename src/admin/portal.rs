//! Portal links and sessions (CONTRACT §12, ADR 0010): the operator mints a
//! single-use dashboard link for one project; the page exchanges it for a
//! session that works wherever that project's API key does (audit, stats,
//! webhooks, deliveries, /me), and nowhere else.
//!
//! Tokens are signed and checked in `postguard_core::portal`; this module
//! reads the clock, draws the nonces and remembers consumed links in KV.

use postguard_core::config::Config;
use postguard_core::portal::{self, Claims, Kind, Rejected, Signer};
use postguard_core::{ErrorCode, Problem};
use serde::Serialize;
use worker::{Env, Request};

use crate::auth;
use crate::bindings;
use crate::http;
use crate::reject::Handled;
use crate::request;
use crate::runtime::{now_ms, random_bytes, RequestCtx};

fn signer(cfg: &Config) -> Signer {
    Signer::from_admin_token(&cfg.admin_token)
}

fn nonce() -> Handled<[u8; 16]> {
    Ok(random_bytes::<16>().map_err(|e| worker::Error::RustError(format!("random: {e}")))?)
}

fn unauthorized(detail: &str) -> Problem {
    Problem::new(ErrorCode::Unauthorized, detail)
}

#[derive(Serialize)]
struct Link {
    url: String,
    expires_at: u64,
}

/// `POST /_postguard/v1/portal-links {project, ttl_s?}` (operator) → 201.
pub async fn create_link(mut req: Request, env: &Env, cfg: &Config, rc: &RequestCtx) -> Handled {
    auth::operator(&req, env, cfg).await?;
    let (project, ttl_s) = portal::parse_link_request(&request::body(&mut req, cfg).await?)?;
    let claims = portal::link_claims(project, ttl_s, now_ms(), &nonce()?);
    let token = signer(cfg).issue(Kind::Link, &claims);
    let origin = req.url()?.origin().ascii_serialization();
    let link = Link {
        url: portal::link_url(&origin, &token),
        expires_at: claims.exp,
    };
    http::json(rc, 201, &link, &[])
}

#[derive(Serialize)]
struct Session<'a> {
    session: String,
    project: &'a str,
    expires_at: u64,
}

/// `POST /_postguard/v1/portal-sessions {token}` (no credential) → 201: the
/// link is consumed; a second exchange of the same link is refused.
pub async fn create_session(mut req: Request, env: &Env, cfg: &Config, rc: &RequestCtx) -> Handled {
    let token = portal::parse_session_request(&request::body(&mut req, cfg).await?)?;
    let now = now_ms();
    let link = signer(cfg).verify(Kind::Link, &token, now).map_err(|r| {
        unauthorized(match r {
            Rejected::Expired => "the portal link has expired: ask for a new one",
            Rejected::Malformed | Rejected::BadSignature => "the portal link is not valid",
        })
    })?;
    // Single use. KV is not transactional: two exchanges racing within its
    // propagation delay could both pass (ADR 0010); any later one is refused.
    let kv = env.kv(bindings::API_KEYS)?;
    let entry = portal::consumed_entry(&token);
    if kv.get(&entry).text().await?.is_some() {
        return Err(
            unauthorized("the portal link has already been used: ask for a new one").into(),
        );
    }
    kv.put(&entry, "1")?
        .expiration_ttl(portal::consumed_ttl_s(link.exp, now))
        .execute()
        .await?;
    let session = portal::session_claims(&link, &nonce()?);
    let out = Session {
        session: signer(cfg).issue(Kind::Session, &session),
        project: &session.project,
        expires_at: session.exp,
    };
    http::json(rc, 201, &out, &[])
}

/// A portal session's claims, or 401 `UNAUTHORIZED` when it is forged or has
/// expired. A valid session's project is noted for the audit row (no key
/// prefix: no key was used).
pub fn session(token: &str, cfg: &Config, rc: &RequestCtx) -> Handled<Claims> {
    match signer(cfg).verify(Kind::Session, token, now_ms()) {
        Ok(claims) => {
            rc.note(|f| f.project = Some(claims.project.clone()));
            Ok(claims)
        }
        Err(Rejected::Expired) => {
            Err(unauthorized("the portal session has expired: open a new portal link").into())
        }
        Err(_) => Err(unauthorized("the portal session is not valid").into()),
    }
}

/// Whether `token` is a valid portal session (the endpoints that answer 403
/// to a valid credential of another kind ask this).
pub fn is_session(token: &str, cfg: &Config) -> bool {
    signer(cfg).verify(Kind::Session, token, now_ms()).is_ok()
}

#[derive(Serialize)]
struct SessionMe<'a> {
    project: &'a str,
    expires_at: u64,
}

/// `GET /me` with a session: the project and when the session ends (a
/// session has no key, plan or limit of its own).
pub fn me(rc: &RequestCtx, claims: &Claims) -> Handled {
    let me = SessionMe {
        project: &claims.project,
        expires_at: claims.exp,
    };
    http::json(rc, 200, &me, &[])
}
