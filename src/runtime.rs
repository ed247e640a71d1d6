//! The runtime's inputs the core never reads itself: clock, randomness and
//! the environment, plus the per-isolate configuration cache.

use std::cell::RefCell;
use std::rc::Rc;

use postguard_core::config::{Config, ConfigError, RawEnv};
use postguard_core::cors::CorsConfig;
use postguard_core::ids;
use worker::wasm_bindgen::JsValue;
use worker::Env;

use crate::bindings;

pub fn now_ms() -> u64 {
    // `Date.now()` itself: `worker::Date::now()` allocates a Date object.
    worker::js_sys::Date::now() as u64
}

/// Random bytes from the runtime's CSPRNG (`crypto.getRandomValues`).
pub fn random_bytes<const N: usize>() -> Result<[u8; N], getrandom::Error> {
    let mut buf = [0u8; N];
    getrandom::getrandom(&mut buf)?;
    Ok(buf)
}

/// Ids drawn per refill of [`ID_POOL`]: one `getRandomValues` call (a JS
/// crossing and a typed array) per 64 ids instead of one per request.
const IDS_PER_REFILL: usize = 64;

thread_local! {
    /// CSPRNG output not yet used, for ids (never for secrets: those call
    /// `random_bytes` afresh).
    static ID_POOL: RefCell<Vec<u128>> = const { RefCell::new(Vec::new()) };
}

fn random_u128() -> u128 {
    ID_POOL.with(|pool| {
        let mut pool = pool.borrow_mut();
        if pool.is_empty() {
            if let Ok(bytes) = random_bytes::<{ 16 * IDS_PER_REFILL }>() {
                pool.extend(
                    bytes
                        .chunks_exact(16)
                        .filter_map(|c| <[u8; 16]>::try_from(c).ok().map(u128::from_le_bytes)),
                );
            }
        }
        // An id needs uniqueness, not secrecy: fall back to the clock if the
        // CSPRNG is unavailable rather than failing the request.
        pool.pop()
            .unwrap_or_else(|| u128::from(now_ms()).wrapping_mul(0x9E37_79B9_7F4A_7C15))
    })
}

pub fn new_ulid_parts() -> (u64, u128) {
    (now_ms(), random_u128())
}

/// What the handlers learn about a request, for its audit row and its
/// metrics data point.
#[derive(Default)]
pub struct Facts {
    pub key_prefix: Option<String>,
    pub project: Option<String>,
    pub idempotency_key: Option<String>,
    pub replayed: bool,
    pub rate_limit_remaining: Option<u32>,
    pub response_bytes: Option<u64>,
    /// The problem's code, when postguard answered with an error itself.
    pub code: Option<&'static str>,
    /// On a quota 429: the policy that refused.
    pub policy: Option<String>,
    /// How long the origin took (set when the request was forwarded).
    pub origin_ms: Option<u64>,
    /// The gateway route's template (gateway endpoints).
    pub route: Option<&'static str>,
    /// The request showed a valid credential (of any kind): its misses are
    /// not counted by the limit on requests without one.
    pub credential: bool,
    /// The origin a proxied request was routed to (`default`, or a name).
    pub origin: Option<String>,
    /// Report-only limits: the policy (or `inflight`) that would have
    /// refused this forwarded request.
    pub would_refuse: Option<String>,
    /// No Idempotency-Key where the mode is `required` (counted in `/stats`).
    pub missing_idempotency_key: bool,
    /// The request was counted against its address already (a key sent to
    /// the origin's verification): a 401 after it is not counted again.
    pub address_charged: bool,
    /// Forwarded under an Idempotency-Key claim, and (`answer_stored`) its
    /// final answer recorded: what makes it billable (`usage::billable`).
    pub claimed: bool,
    pub answer_stored: bool,
    /// A key the origin vouched for, imported while answering this request
    /// (`auth.verify_unknown_keys`): its prefix and project, for the audit
    /// row of the import.
    pub imported_key: Option<(String, String)>,
}

/// What every request carries through the shell.
pub struct RequestCtx {
    pub request_id: String,
    pub started_ms: u64,
    pub facts: RefCell<Facts>,
    /// The request's `Origin` (a cross-origin browser call), and the
    /// gateway's CORS configuration: every answer gets its CORS headers.
    pub origin: Option<String>,
    pub cors: Option<CorsConfig>,
    /// The address the edge saw (`CF-Connecting-IP`): what the limit on
    /// requests without a valid credential counts by.
    pub client_ip: Option<String>,
}

impl RequestCtx {
    pub fn new() -> Self {
        let (now, rnd) = new_ulid_parts();
        RequestCtx {
            request_id: ids::request_id(now, rnd),
            started_ms: now,
            facts: RefCell::new(Facts::default()),
            origin: None,
            cors: None,
            client_ip: None,
        }
    }

    /// The CORS headers of an answer; `origin_allowed` is the origin's own
    /// `Access-Control-Allow-Origin` when the answer came from it.
    pub fn cors_headers(&self, origin_allowed: Option<&str>) -> Vec<(&'static str, String)> {
        postguard_core::cors::response_headers(
            self.cors.as_ref(),
            self.origin.as_deref(),
            origin_allowed,
        )
    }

    pub fn note(&self, f: impl FnOnce(&mut Facts)) {
        f(&mut self.facts.borrow_mut());
    }
}

fn read(env: &Env, name: &str) -> Option<String> {
    // Vars and secrets are both string bindings; `var` reads either.
    env.var(name).ok().map(|v| v.to_string())
}

type Loaded = Result<Rc<Config>, ConfigError>;

thread_local! {
    /// The env object last seen, what it held and what it parsed to.
    static CONFIG: RefCell<Option<(JsValue, RawEnv, Loaded)>> = const { RefCell::new(None) };
}

/// The validated configuration, parsed once per isolate. The runtime hands
/// every request of an isolate the same env object, so its identity is
/// checked first; a different object is read again and re-parsed only if its
/// values differ.
pub fn config(env: &Env) -> Result<Rc<Config>, ConfigError> {
    let this: &JsValue = env.as_ref();
    if let Some(hit) = CONFIG.with(|cell| {
        cell.borrow()
            .as_ref()
            .filter(|(seen, _, _)| seen == this)
            .map(|(_, _, result)| result.clone())
    }) {
        return hit;
    }
    let raw = RawEnv {
        origin_url: read(env, bindings::ORIGIN_URL),
        admin_token: read(env, bindings::ADMIN_TOKEN),
        origin_token: read(env, bindings::ORIGIN_TOKEN),
        origin_signing_secret: read(env, bindings::ORIGIN_SIGNING_SECRET),
        postguard_config: read(env, bindings::POSTGUARD_CONFIG),
    };
    CONFIG.with(|cell| {
        let mut slot = cell.borrow_mut();
        let result = match slot.as_ref() {
            Some((_, cached_raw, result)) if *cached_raw == raw => result.clone(),
            _ => Config::load(&raw).map(Rc::new),
        };
        *slot = Some((this.clone(), raw, result.clone()));
        result
    })
}

/// Runs `fut` for at most `ms` milliseconds; `None` when the time ran out.
pub async fn within<F: std::future::Future>(ms: u64, fut: F) -> Option<F::Output> {
    use futures_util::future::{select, Either};
    let timer = worker::Delay::from(std::time::Duration::from_millis(ms));
    match select(Box::pin(fut), timer).await {
        Either::Left((out, _)) => Some(out),
        Either::Right(_) => None,
    }
}
