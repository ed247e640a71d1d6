//! Keys not imported yet (`auth.verify_unknown_keys`, docs/live-api.md): a
//! presented key postguard does not know is asked about once at the
//! `default` origin. The first requests with the key meet in the object
//! named by the id it would have (`KeyGuard`'s rendezvous), where one leads
//! and the rest wait for its outcome. The lead — the only request that
//! reaches the origin — is first counted against its address (the limit on
//! requests without a valid credential), so a flood of made-up keys reaches
//! the origin at most that often per address, while an integrator's burst of
//! first requests with its one key is not refused for it. A key the origin
//! vouches for is stored as an imported key.

use postguard_core::config::{Config, VerifyConfig};
use postguard_core::guard::{Verified, VerifiedRequest, Verify, VerifyRequest};
use postguard_core::key_verify::{self, Outcome, Step};
use postguard_core::keys::KeyRecord;
use postguard_core::log::Line;
use postguard_core::{credential, ids, ErrorCode, Problem};
use worker::Env;

use crate::durable::client::call;
use crate::http::{self, AnswerBody, NoAnswer};
use crate::reject::Handled;
use crate::runtime::{now_ms, RequestCtx};
use crate::{ip_limit, keystore, log};

/// The record of the unknown key `hash` once the origin vouched for it, or
/// the problem the request is answered with.
pub async fn unknown_key(
    verify: &VerifyConfig,
    headers: &[(String, String)],
    hash: &str,
    env: &Env,
    cfg: &Config,
    rc: &RequestCtx,
) -> Handled<KeyRecord> {
    let sources = cfg.settings.auth.sources();
    let Some(key) = credential::presented_key(headers, &sources) else {
        return Err(Problem::new(ErrorCode::InvalidApiKey, "the API key is not known").into());
    };
    let secret = cfg.origin_signing_secret.as_bytes();
    let id = ids::imported_key_id(secret, hash);
    let lease_ms = u64::from(cfg.origins.default.timeout_ms) + key_verify::LEAD_SLACK_MS;
    let (step, _) = call::<Verify>(env, &id, &VerifyRequest { lease_ms }, &[]).await?;
    let outcome = match step {
        Step::Decided(o) => o,
        Step::Lead | Step::Wait { .. } => lead(verify, &key, &id, env, cfg, rc).await?,
    };
    match outcome {
        Outcome::Valid(k) => Ok(k.record),
        other => Err(other
            .problem()
            .unwrap_or_else(|| Problem::new(ErrorCode::InvalidApiKey, "the API key is not known"))
            .into()),
    }
}

/// The lead's part: count the ask against the address (the only request
/// of the key that reaches the origin; over the limit, 429 and the next
/// request leads), ask, store a vouched-for key, tell the others.
async fn lead(
    verify: &VerifyConfig,
    key: &str,
    id: &str,
    env: &Env,
    cfg: &Config,
    rc: &RequestCtx,
) -> Handled<Outcome> {
    let negative_ms = u64::from(verify.negative_cache_s) * 1000;
    if let Err(refused) = ip_limit::charge(env, cfg, rc).await {
        tell(env, id, None, negative_ms, rc).await;
        return Err(refused);
    }
    // Counted now: a 401 after it is not counted again.
    rc.note(|f| f.address_charged = true);
    let mut outcome = ask(verify, key, cfg, rc).await;
    if let Outcome::Valid(k) = &mut outcome {
        // The stored record (another import may have stored it first).
        k.record = keystore::store_new(env, (**k).clone()).await?;
        let (prefix, project) = (k.record.prefix.clone(), k.record.project.clone());
        rc.note(|f| f.imported_key = Some((prefix, project)));
        log::emit(
            log::of_request(Line::info("key verified by the origin and imported"), rc)
                .field("key_id", k.record.id.clone())
                .field("key_prefix", k.record.prefix.clone())
                .field("project", k.record.project.clone()),
        );
    }
    tell(env, id, Some(outcome.clone()), negative_ms, rc).await;
    Ok(outcome)
}

/// Tells the key's object the lead's outcome (none: it gave up).
async fn tell(env: &Env, id: &str, outcome: Option<Outcome>, negative_ms: u64, rc: &RequestCtx) {
    let told = VerifiedRequest {
        outcome,
        negative_ms,
    };
    if let Err(e) = call::<Verified>(env, id, &told, &[]).await {
        // The waiting requests end their wait at the lease and step again.
        log::emit(log::of_request(Line::error("telling a key's verification failed"), rc).err(e));
    }
}

/// The origin's answer about `key`, read up to `key_verify::MAX_ANSWER_BYTES`.
async fn ask(verify: &VerifyConfig, key: &str, cfg: &Config, rc: &RequestCtx) -> Outcome {
    let req = key_verify::request(
        cfg,
        &verify.path,
        key,
        &rc.request_id,
        rc.client_ip.as_deref(),
        now_ms() / 1000,
    );
    let timeout_ms = u64::from(req.timeout_ms);
    let secret = cfg.origin_signing_secret.as_bytes();
    match http::fetch_within(&req, timeout_ms, Some(key_verify::MAX_ANSWER_BYTES)).await {
        Ok(answer) => {
            let body = match &answer.body {
                AnswerBody::Read(b) => Some(b.as_slice()),
                _ => None,
            };
            key_verify::outcome(answer.status, body, key, &cfg.settings, secret, now_ms())
        }
        Err(NoAnswer::Timeout) => Outcome::Failed {
            timeout: true,
            detail: format!("the origin's key verification did not answer within {timeout_ms} ms"),
        },
        Err(NoAnswer::Unreachable(_)) => Outcome::Failed {
            timeout: false,
            detail: "the origin's key verification could not be reached".into(),
        },
    }
}
