//! The proxy's branch for `Prefer: respond-async` on an `async.routes` route
//! (docs/async-operations.md): admitted and charged as usual, the operation created
//! with the claim of its Idempotency-Key — its request and body durable in
//! the key's object before anything is answered — handed to the
//! `OPERATIONS` queue, and answered 202 with its `Location`. The same
//! request again is told the same operation, whatever its state.

use postguard_core::config::Config;
use postguard_core::guard::{Admit, AdmitRequest, NewOperation};
use postguard_core::headers::forward_request_headers;
use postguard_core::limits::{self, Verdicts};
use postguard_core::log::Line;
use postguard_core::operations::{self, StoredRequest, View};
use postguard_core::proxy::{self, Admission, Incoming, Preflight};
use postguard_core::{ErrorCode, Problem};
use worker::{Context, Env};

use crate::auth::{self, Caller};
use crate::durable::client::Guard;
use crate::handler;
use crate::log;
use crate::reject::{Extra, Handled, Reject};
use crate::replays;
use crate::runtime::{new_ulid_parts, RequestCtx};

/// The branch point: whether `incoming` asks to run asynchronously on a
/// route that allows it. Any other request is proxied as it always was.
pub fn wanted(cfg: &Config, incoming: &Incoming) -> bool {
    let prefer = incoming
        .headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("prefer"))
        .map(|(_, v)| v.as_str());
    operations::prefers_async(prefer)
        && operations::is_async_route(&cfg.settings, &incoming.method, &incoming.path)
}

/// Creates the operation (or is told the existing one) and answers 202.
/// Without an Idempotency-Key the answer is 400 `IDEMPOTENCY_KEY_REQUIRED`
/// (after the charge, like every preflight problem): an operation without
/// one could not be told apart from its own retry.
pub async fn accept(
    env: &Env,
    cfg: &Config,
    rc: &RequestCtx,
    ctx: &Context,
    caller: &Caller,
    incoming: Incoming,
    mut pre: Preflight,
) -> Handled {
    let key_id = caller.key.record.id.as_str();
    if pre.claim.is_none() && pre.early.is_none() {
        pre.early = Some(Problem::new(
            ErrorCode::IdempotencyKeyRequired,
            "Prefer: respond-async needs an Idempotency-Key: it names the operation, so a retry is told the same one",
        ));
    }
    let (now, rnd) = new_ulid_parts();
    let id = operations::operation_id(key_id, now, rnd)
        .ok_or_else(|| worker::Error::RustError(format!("no operation id for key {key_id}")))?;
    let max_inline = cfg.settings.idempotency.max_stored_body_bytes;
    let large = incoming.body.len() as u64 > max_inline && pre.early.is_none();
    let guard = Guard::of(env, key_id)?;
    let mut cost = cfg.settings.cost(&incoming.method, &incoming.path);
    // A body larger than the object keeps goes to R2 first: durable before
    // the 202 like the rest of the request (deleted again if no operation
    // is created). It is charged first, so a refused request uploads nothing.
    let body_object = match large {
        true => {
            if let Some(refused) = charge_first(&guard, rc, caller, cost).await? {
                return Err(refused);
            }
            cost = 0;
            Some(store_body(env, key_id, &id, &incoming, max_inline).await?)
        }
        false => None,
    };
    let new = pre.claim.as_ref().map(|c| NewOperation {
        id: id.clone(),
        request: stored_request(caller, &incoming, &c.key, body_object.clone()),
        ttl_ms: u64::from(caller.plan.ttl_s()) * 1000,
        requeue_ms: u64::from(cfg.settings.async_ops.requeue_after_s) * 1000,
    });
    let req = AdmitRequest {
        claim: pre.claim.clone(),
        caller: Some(caller.view()),
        notices: caller.notice_to(&rc.request_id),
        operation: new.map(Box::new),
        ..AdmitRequest::charge(cost, caller.plan.limits())
    };
    let payload: &[u8] = match body_object {
        Some(_) => &[],
        None => &incoming.body,
    };
    let answered = guard.call::<Admit>(&req, payload).await;
    let created = matches!(&answered, Ok((a, _)) if created_here(a, &id));
    if let (Some(object), false) = (&body_object, created) {
        forget_body(env, ctx, object.clone());
    }
    let (reply, replayed) = answered?;
    let next = proxy::admission(reply, pre.early.clone())
        .map_err(|e| worker::Error::RustError(e.to_string()))?;
    match next {
        Admission::Revoked => Err(auth::revoked(&caller.key).into()),
        Admission::Expired => Err(auth::expired(&caller.key).into()),
        Admission::Refused { problem, verdicts } => {
            Err(Reject::from(problem).with(&limit_headers(rc, &verdicts)))
        }
        // The key answered synchronously before: its stored response.
        Admission::Replay { verdicts, stored } => {
            let rl = limit_headers(rc, &verdicts);
            crate::replays::replay(env, rc, stored, replayed, &rl).await
        }
        Admission::Accepted {
            verdicts,
            operation,
            again,
        } => {
            if !again {
                hand_on(env, rc, &operation.id).await;
                index(env, cfg, ctx, &caller.key.record);
            }
            answer(rc, &operation, again, true, &limit_headers(rc, &verdicts))
        }
        Admission::Forward { .. } => Err(worker::Error::RustError(
            "the key's object forwarded an asynchronous request instead of accepting it".into(),
        )
        .into()),
    }
}

/// Charges a request whose body goes to R2 before it is uploaded: the
/// refusal (429, a revoked or expired key) to answer, if any.
async fn charge_first(
    guard: &Guard,
    rc: &RequestCtx,
    caller: &Caller,
    cost: u32,
) -> Handled<Option<Reject>> {
    let req = AdmitRequest {
        caller: Some(caller.view()),
        notices: caller.notice_to(&rc.request_id),
        ..AdmitRequest::charge(cost, caller.plan.limits())
    };
    let (reply, _) = guard.call::<Admit>(&req, &[]).await?;
    let next =
        proxy::admission(reply, None).map_err(|e| worker::Error::RustError(e.to_string()))?;
    Ok(match next {
        Admission::Revoked => Some(auth::revoked(&caller.key).into()),
        Admission::Expired => Some(auth::expired(&caller.key).into()),
        Admission::Refused { problem, verdicts } => {
            Some(Reject::from(problem).with(&limit_headers(rc, &verdicts)))
        }
        _ => None,
    })
}

/// Whether the object's answer is the operation this request created.
fn created_here(answer: &postguard_core::guard::AdmitResponse, id: &str) -> bool {
    use postguard_core::guard::AdmitResponse;
    use postguard_core::idempotency::Decision;
    matches!(answer, AdmitResponse::Admitted {
        idempotency: Some(Decision::Execute),
        operation: Some(op),
        would_refuse: None,
        ..
    } if op.id == id)
}

/// The request as the consumer will forward it: what §5 forwards (never
/// the client's `Authorization`), without the `respond-async` preference,
/// and who sent it.
fn stored_request(
    caller: &Caller,
    incoming: &Incoming,
    idempotency_key: &str,
    body_object: Option<String>,
) -> StoredRequest {
    let rec = &caller.key.record;
    let client_ip = incoming
        .headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("cf-connecting-ip"))
        .map(|(_, v)| v.clone());
    StoredRequest {
        method: incoming.method.clone(),
        path_and_query: incoming.path_and_query.clone(),
        headers: forward_request_headers(&operations::without_respond_async(&incoming.headers)),
        client_ip,
        project: rec.project.clone(),
        key_prefix: rec.prefix.clone(),
        plan: rec.plan.clone(),
        meta: rec.meta_header(),
        idempotency_key: idempotency_key.to_string(),
        body_len: incoming.body.len() as u64,
        body_object,
        key_expires_at: rec.expires_at,
    }
}

/// Stores a request body larger than the object keeps in R2. Without the
/// bucket such a request cannot run asynchronously: 413, nothing charged
/// or claimed (the problem is the operator's configuration, said in the detail).
async fn store_body(
    env: &Env,
    key_id: &str,
    op_id: &str,
    incoming: &Incoming,
    max_inline: u64,
) -> Handled<String> {
    let Some(bucket) = replays::bucket(env) else {
        return Err(Problem::new(
            ErrorCode::PayloadTooLarge,
            format!("an asynchronous request's body is kept in R2 above {max_inline} bytes, and the gateway has no REPLAYS bucket"),
        )
        .into());
    };
    let object = super::object_key(key_id, op_id, "request");
    replays::put_bytes(&bucket, &object, incoming.body.clone()).await?;
    Ok(object)
}

/// Deletes an uploaded body no operation refers to (after the answer).
fn forget_body(env: &Env, ctx: &Context, object: String) {
    let env = env.clone();
    ctx.wait_until(async move { replays::delete(&env, vec![object]).await });
}

thread_local! {
    /// Keys whose index entry this isolate wrote, and when.
    static INDEXED: std::cell::RefCell<std::collections::HashMap<String, u64>> =
        std::cell::RefCell::new(std::collections::HashMap::new());
}

/// How often an isolate writes a key's index entry again (its expiry moves
/// on each write); KV takes one write a second per entry.
const INDEX_EVERY_MS: u64 = 3_600_000;
const INDEXED_MAX: usize = 10_000;

/// Notes that the key holds operations (`operations::index_entry`), which
/// `GET /operations` visits — after the answer, at most hourly per isolate;
/// a failed write is logged and written again by the key's next operation.
fn index(env: &Env, cfg: &Config, ctx: &Context, key: &postguard_core::keys::KeyRecord) {
    let now = crate::runtime::now_ms();
    let fresh = INDEXED.with(|m| {
        m.borrow()
            .get(&key.id)
            .is_some_and(|at| now.saturating_sub(*at) < INDEX_EVERY_MS)
    });
    if fresh {
        return;
    }
    let (env, id) = (env.clone(), key.id.clone());
    let entry = operations::index_entry(&key.project, &key.id);
    let ttl_s = operations::index_ttl_s(&cfg.settings);
    ctx.wait_until(async move {
        let put = async {
            env.kv(crate::bindings::API_KEYS)?
                .put(&entry, "")?
                .expiration_ttl(ttl_s)
                .execute()
                .await?;
            Ok::<_, worker::Error>(())
        };
        match put.await {
            Ok(()) => INDEXED.with(|m| {
                let mut m = m.borrow_mut();
                if m.len() >= INDEXED_MAX {
                    m.clear();
                }
                m.insert(id, now);
            }),
            Err(e) => log::emit(Line::warn("indexing the key's operations failed").err(e)),
        }
    });
}

/// Hands a new operation to the queue. If that fails the operation is
/// still there: its object's alarm hands it on after
/// `async.requeue_after_s` (logged, never an error to the client).
async fn hand_on(env: &Env, rc: &RequestCtx, id: &str) {
    if let Err(e) = super::queue::send(env, &[id]).await {
        log::emit(
            log::of_request(
                Line::warn("handing the operation to the queue failed; its object will"),
                rc,
            )
            .field("operation_id", id)
            .err(e),
        );
    }
}

fn limit_headers(rc: &RequestCtx, verdicts: &Verdicts) -> Extra {
    rc.note(|f| f.rate_limit_remaining = Some(verdicts.binding_verdict().remaining));
    limits::headers(verdicts)
}

/// The 202 of an operation: `Location` (a path), the operation as `GET`
/// shows it, `Retry-After` (when to look), `Preference-Applied` when the
/// request asked for it; a request told an existing operation carries
/// `Idempotent-Replayed: true`.
pub fn answer(rc: &RequestCtx, op: &View, again: bool, preferred: bool, rl: &Extra) -> Handled {
    let mut extra = rl.clone();
    extra.push(("Location", format!("/_postguard/v1/operations/{}", op.id)));
    extra.push(("Retry-After", "1".into()));
    if preferred {
        extra.push(("Preference-Applied", "respond-async".into()));
    }
    if again {
        extra.push(("Idempotent-Replayed", "true".into()));
        rc.note(|f| f.replayed = true);
    } else {
        // A new operation: billed once, here (its attempts run in the queue).
        rc.note(|f| {
            f.claimed = true;
            f.answer_stored = true;
        });
    }
    handler::json(rc, 202, op, &extra)
}
