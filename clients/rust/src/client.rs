//! The client: one Idempotency-Key per logical call, the retry loop, the shared limiter.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use reqwest::{Method, Url};

use crate::clock::{Clock, FastRandom, Random, SystemClock};
use crate::error::{Error, Problem};
use crate::retry::{decide, replay_safe, Decision, Outcome, RetryPolicy};
use crate::throttle::{binding_policy, Limiter, LimiterState, RateInfo, ThrottleConfig};

/// The user agent every request carries.
pub const USER_AGENT: &str = concat!("postguard-client-rust/", env!("CARGO_PKG_VERSION"));

/// A request body, serialised once so that every retry sends the same bytes (the
/// gateway's fingerprint covers the body).
#[derive(Debug, Clone, Default, PartialEq)]
pub enum Body {
    #[default]
    Empty,
    /// Bytes with their content type.
    Bytes { data: Vec<u8>, content_type: String },
}

impl Body {
    /// A JSON body.
    pub fn json<T: serde::Serialize + ?Sized>(value: &T) -> Result<Self, Error> {
        Ok(Body::Bytes {
            data: serde_json::to_vec(value)?,
            content_type: "application/json".to_owned(),
        })
    }
}

impl From<serde_json::Value> for Body {
    fn from(v: serde_json::Value) -> Self {
        Body::Bytes {
            data: v.to_string().into_bytes(),
            content_type: "application/json".to_owned(),
        }
    }
}

/// Per-call options.
#[derive(Debug, Clone, Default)]
pub struct RequestOptions {
    /// The Idempotency-Key of this logical operation; generated (UUIDv4) when absent
    /// for POST, PUT, PATCH and DELETE. Pass your own to make a retry *across*
    /// process restarts land on the same operation.
    pub idempotency_key: Option<String>,
    /// Send no Idempotency-Key (e.g. a route the gateway runs with idempotency `off`).
    /// A mutating call without one is not retried after a lost answer or 502/503/504,
    /// since it may have run; 429 and 409 in progress are still retried.
    pub without_idempotency_key: bool,
    /// Extra headers.
    pub headers: Vec<(String, String)>,
    /// Overrides the client's per-attempt timeout.
    pub timeout: Option<Duration>,
    /// Overrides the client's retry policy.
    pub retry: Option<RetryPolicy>,
}

impl RequestOptions {
    pub fn idempotency_key(mut self, key: impl Into<String>) -> Self {
        self.idempotency_key = Some(key.into());
        self
    }
    /// See [`RequestOptions::without_idempotency_key`].
    pub fn without_idempotency_key(mut self) -> Self {
        self.without_idempotency_key = true;
        self
    }
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = Some(policy);
        self
    }
}

/// A successful (1xx–3xx) answer, read in full.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
    /// Attempts made, the first included.
    pub attempts: u32,
    /// The Idempotency-Key the call was sent with (for mutating methods).
    pub idempotency_key: Option<String>,
}

impl Response {
    /// `Idempotent-Replayed: true`: the gateway answered from its store, the origin did
    /// not run again (typically after a retry whose first answer was lost).
    pub fn replayed(&self) -> bool {
        self.header("idempotent-replayed")
            .is_some_and(|v| v.eq_ignore_ascii_case("true"))
    }
    pub fn request_id(&self) -> Option<&str> {
        self.header("x-request-id")
    }
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T, Error> {
        Ok(serde_json::from_slice(&self.body)?)
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// What the response hook sees after every attempt.
#[derive(Debug, Clone)]
pub struct AttemptEvent {
    pub method: Method,
    pub path: String,
    /// 1 for the first attempt.
    pub attempt: u32,
    /// `None` when no answer came (transport error).
    pub status: Option<u16>,
    pub code: Option<String>,
    pub replayed: bool,
    pub idempotency_key: Option<String>,
    /// The wait before the next attempt, if there is one.
    pub retry_in: Option<Duration>,
}

/// Called after every attempt (metrics, logs, tests counting 429s).
pub type ResponseHook = Arc<dyn Fn(&AttemptEvent) + Send + Sync>;

/// Counters of one client.
#[derive(Debug, Default)]
struct Counters {
    attempts: AtomicU64,
    retries: AtomicU64,
    rejected_429: AtomicU64,
    throttle_waits: AtomicU64,
}

impl Counters {
    fn count(&self, waited: bool, attempt: u32) {
        if waited {
            self.throttle_waits.fetch_add(1, Ordering::Relaxed);
        }
        self.attempts.fetch_add(1, Ordering::Relaxed);
        if attempt > 0 {
            self.retries.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A snapshot of a client's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Metrics {
    /// HTTP attempts sent.
    pub attempts: u64,
    /// Attempts that were retries.
    pub retries: u64,
    /// 429 answers received.
    pub rejected_429: u64,
    /// Calls the limiter held back before sending.
    pub throttle_waits: u64,
}

/// Builds a [`Client`]. Its `Debug` shows whether a token is set, never the token.
pub struct ClientBuilder {
    base_url: String,
    token: Option<String>,
    timeout: Duration,
    connect_timeout: Duration,
    retry: RetryPolicy,
    throttle: ThrottleConfig,
    max_response_bytes: usize,
    hook: Option<ResponseHook>,
    clock: Arc<dyn Clock>,
    random: Arc<dyn Random>,
}

impl std::fmt::Debug for ClientBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientBuilder")
            .field("base_url", &self.base_url)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("timeout", &self.timeout)
            .field("retry", &self.retry)
            .field("throttle", &self.throttle)
            .finish_non_exhaustive()
    }
}

impl ClientBuilder {
    /// The credential sent as `Authorization: Bearer`: an API key for the project
    /// endpoints and the proxied API, `ADMIN_TOKEN` for the operator endpoints,
    /// `ORIGIN_TOKEN` for publishing events.
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }
    /// Per-attempt timeout (default 40 s: above the gateway's 30 s origin timeout, so
    /// a slow origin surfaces as its 504 rather than a client timeout).
    pub fn timeout(mut self, d: Duration) -> Self {
        self.timeout = d;
        self
    }
    pub fn connect_timeout(mut self, d: Duration) -> Self {
        self.connect_timeout = d;
        self
    }
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = policy;
        self
    }
    pub fn throttle(mut self, config: ThrottleConfig) -> Self {
        self.throttle = config;
        self
    }
    /// Answers larger than this fail with [`Error::ResponseTooLarge`] (default 16 MiB).
    pub fn max_response_bytes(mut self, n: usize) -> Self {
        self.max_response_bytes = n;
        self
    }
    pub fn on_response(mut self, hook: impl Fn(&AttemptEvent) + Send + Sync + 'static) -> Self {
        self.hook = Some(Arc::new(hook));
        self
    }
    /// Replaces the clock (tests).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }
    /// Replaces the jitter's random source (tests).
    pub fn random(mut self, random: Arc<dyn Random>) -> Self {
        self.random = random;
        self
    }

    pub fn build(self) -> Result<Client, Error> {
        let mut base =
            Url::parse(&self.base_url).map_err(|e| Error::Invalid(format!("base URL: {e}")))?;
        if !base.path().ends_with('/') {
            let p = format!("{}/", base.path());
            base.set_path(&p);
        }
        install_crypto_provider();
        let http = reqwest::Client::builder()
            .user_agent(USER_AGENT)
            .connect_timeout(self.connect_timeout)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| Error::Invalid(format!("HTTP client: {e}")))?;
        let auth = match self.token {
            Some(t) => Some(
                HeaderValue::from_str(&format!("Bearer {t}"))
                    .map(|mut v| {
                        v.set_sensitive(true);
                        v
                    })
                    .map_err(|_| Error::Invalid("token is not a valid header value".into()))?,
            ),
            None => None,
        };
        Ok(Client {
            inner: Arc::new(Inner {
                http,
                base,
                auth,
                timeout: self.timeout,
                retry: self.retry,
                max_response_bytes: self.max_response_bytes,
                limiter: Limiter::new(self.throttle),
                hook: self.hook,
                clock: self.clock,
                random: self.random,
                counters: Counters::default(),
            }),
        })
    }
}

/// reqwest is built without a bundled crypto provider (see Cargo.toml); use ring unless
/// the application installed one of its own first.
fn install_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Err means another thread installed one meanwhile: fine either way.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

struct Inner {
    http: reqwest::Client,
    base: Url,
    auth: Option<HeaderValue>,
    timeout: Duration,
    retry: RetryPolicy,
    max_response_bytes: usize,
    limiter: Arc<Limiter>,
    hook: Option<ResponseHook>,
    clock: Arc<dyn Clock>,
    random: Arc<dyn Random>,
    counters: Counters,
}

/// A postguard client. Cheap to clone; clones share the connection pool and the
/// limiter, so all concurrent calls of one client count against one budget.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Whether a token is set, never the token (a manual impl: a derive would print it).
        f.debug_struct("Client")
            .field("base_url", &self.inner.base.as_str())
            .field("token", &self.inner.auth.as_ref().map(|_| "<redacted>"))
            .finish_non_exhaustive()
    }
}

/// A raw answer of one attempt.
struct Answer {
    status: u16,
    headers: HeaderMap,
    body: Vec<u8>,
}

enum AttemptError {
    Transport(reqwest::Error),
    Fatal(Error),
}

/// Everything that stays the same across the attempts of one call.
struct Call<'a> {
    method: Method,
    path: &'a str,
    url: Url,
    headers: HeaderMap,
    body: Body,
    key: Option<String>,
    /// Whether a lost answer may be retried ([`replay_safe`]).
    replay_safe: bool,
    /// Whether the call spends the API's budget, so the limiter holds it back and learns
    /// from its answer ([`is_gateway_path`]).
    throttled: bool,
    timeout: Duration,
}

enum Attempt {
    Done(Box<Response>),
    /// Retryable or not, the retry rule decides.
    Failed(Failure, AttemptEvent),
    /// Not an answer to retry (too large, a bad request that could not be built).
    Fatal(Error),
}

enum Failure {
    Transport(reqwest::Error),
    Answer(Box<Problem>),
}

impl Failure {
    fn outcome(&self) -> Outcome<'_> {
        match self {
            Failure::Transport(_) => Outcome::Transport,
            Failure::Answer(p) => Outcome::Status {
                status: p.status,
                code: p.code.as_deref(),
            },
        }
    }

    fn retry_after(&self) -> Option<Duration> {
        match self {
            Failure::Transport(_) => None,
            Failure::Answer(p) => p.retry_after,
        }
    }

    fn into_error(self, attempts: u32, idempotency_key: Option<String>) -> Error {
        match self {
            Failure::Answer(mut p) => {
                p.attempts = attempts;
                Error::from_problem(*p)
            }
            Failure::Transport(source) => Error::Transport {
                source,
                attempts,
                idempotency_key,
            },
        }
    }
}

/// A gateway endpoint (`/_postguard/…`): charged to the key's gateway policy, or free (`/me`,
/// the idempotency lookup) — never to the API's budget, so the limiter neither holds it back
/// (a lookup must not wait for the API's window) nor reads its answer (whose headers may
/// describe that other budget).
fn is_gateway_path(path: &str) -> bool {
    let p = path.trim_start_matches('/');
    p == "_postguard" || p.starts_with("_postguard/")
}

fn is_mutating(m: &Method) -> bool {
    matches!(
        *m,
        Method::POST | Method::PUT | Method::PATCH | Method::DELETE
    )
}

impl Client {
    pub fn builder(base_url: impl Into<String>) -> ClientBuilder {
        ClientBuilder {
            base_url: base_url.into(),
            token: None,
            timeout: Duration::from_secs(40),
            connect_timeout: Duration::from_secs(10),
            retry: RetryPolicy::default(),
            throttle: ThrottleConfig::default(),
            max_response_bytes: 16 << 20,
            hook: None,
            clock: Arc::new(SystemClock::default()),
            random: Arc::new(FastRandom),
        }
    }

    /// The client's counters so far.
    pub fn metrics(&self) -> Metrics {
        let c = &self.inner.counters;
        Metrics {
            attempts: c.attempts.load(Ordering::Relaxed),
            retries: c.retries.load(Ordering::Relaxed),
            rejected_429: c.rejected_429.load(Ordering::Relaxed),
            throttle_waits: c.throttle_waits.load(Ordering::Relaxed),
        }
    }

    /// The client's clock (for polling an operation).
    pub(crate) fn clock(&self) -> Arc<dyn Clock> {
        self.inner.clock.clone()
    }

    /// Wall-clock time since the Unix epoch, as the client's clock says.
    pub(crate) fn unix_now(&self) -> Duration {
        self.inner.clock.unix_now()
    }

    /// What the shared limiter currently knows (diagnostics).
    pub fn limiter_state(&self) -> LimiterState {
        self.inner.limiter.snapshot()
    }

    fn url(&self, path: &str) -> Result<Url, Error> {
        // Paths are relative to the base URL (which may itself have a path prefix).
        let base = &self.inner.base;
        let url = base
            .join(path.trim_start_matches('/'))
            .map_err(|e| Error::Invalid(format!("path {path:?}: {e}")))?;
        // An absolute URL as "path" would carry the token to another host.
        if url.origin() != base.origin() {
            return Err(Error::Invalid(format!("path {path:?} leaves the base URL")));
        }
        Ok(url)
    }

    /// Any call through the gateway: the origin's own API or a gateway endpoint.
    ///
    /// Mutating methods get one Idempotency-Key for the whole call (generated or from
    /// `opts`), sent unchanged on every retry. Network errors, 502/503/504, 429 and 409
    /// `IDEMPOTENCY_KEY_IN_PROGRESS` are retried (GETs too); a mutating call sent
    /// [`without_idempotency_key`](RequestOptions::without_idempotency_key) only after
    /// 429 and 409. Other answers ≥ 400 are returned as errors at once.
    pub async fn request(
        &self,
        method: Method,
        path: &str,
        body: Body,
        opts: RequestOptions,
    ) -> Result<Response, Error> {
        // A key given as an `Idempotency-Key` header counts as the caller's own.
        let given = opts.idempotency_key.clone().or_else(|| {
            opts.headers
                .iter()
                .find(|(name, _)| name.eq_ignore_ascii_case("idempotency-key"))
                .map(|(_, value)| value.clone())
        });
        let key = (is_mutating(&method) && !opts.without_idempotency_key)
            .then(|| given.unwrap_or_else(|| uuid::Uuid::new_v4().to_string()));
        let call = Call {
            url: self.url(path)?,
            headers: self.headers(&body, key.as_deref(), &opts)?,
            timeout: opts.timeout.unwrap_or(self.inner.timeout),
            replay_safe: replay_safe(&method, key.is_some()),
            throttled: !is_gateway_path(path),
            method,
            path,
            body,
            key,
        };
        let policy = opts.retry.as_ref().unwrap_or(&self.inner.retry);
        let mut attempt: u32 = 0;
        loop {
            let (failure, mut event) = match self.attempt(&call, attempt).await {
                Attempt::Done(response) => return Ok(*response),
                Attempt::Fatal(e) => return Err(e),
                Attempt::Failed(failure, event) => (failure, event),
            };
            let decision = decide(
                policy,
                attempt,
                failure.outcome(),
                failure.retry_after(),
                call.replay_safe,
                &*self.inner.random,
            );
            let Decision::RetryAfter(wait) = decision else {
                self.emit(&event);
                return Err(failure.into_error(attempt + 1, call.key));
            };
            event.retry_in = Some(wait);
            self.emit(&event);
            self.inner.clock.sleep(wait).await;
            attempt += 1;
        }
    }

    /// One attempt: wait for the limiter, send, feed the answer's rate-limit headers back.
    async fn attempt(&self, call: &Call<'_>, attempt: u32) -> Attempt {
        let inner = &self.inner;
        let (permit, waited) = match call.throttled {
            true => {
                let (permit, waited) = inner.limiter.acquire(&*inner.clock).await;
                (Some(permit), waited)
            }
            false => (None, false),
        };
        inner.counters.count(waited, attempt);
        let sent = self.send_once(call).await;
        let mut event = AttemptEvent {
            method: call.method.clone(),
            path: call.path.to_owned(),
            attempt: attempt + 1,
            status: None,
            code: None,
            replayed: false,
            idempotency_key: call.key.clone(),
            retry_in: None,
        };
        let answer = match sent {
            Ok(answer) => answer,
            Err(AttemptError::Transport(e)) => {
                drop(permit); // lost: the limiter assumes it was counted
                return Attempt::Failed(Failure::Transport(e), event);
            }
            Err(AttemptError::Fatal(e)) => {
                drop(permit);
                self.emit(&event);
                return Attempt::Fatal(e);
            }
        };
        let info = RateInfo::from_headers(&answer.headers, answer.status, inner.clock.unix_now());
        if let Some(permit) = permit {
            permit.answered(inner.clock.now(), &info);
        }
        if answer.status == 429 {
            inner.counters.rejected_429.fetch_add(1, Ordering::Relaxed);
        }
        event.status = Some(answer.status);
        if answer.status < 400 {
            let response = Response {
                status: answer.status,
                headers: answer.headers,
                body: answer.body,
                attempts: attempt + 1,
                idempotency_key: call.key.clone(),
            };
            event.replayed = response.replayed();
            self.emit(&event);
            return Attempt::Done(Box::new(response));
        }
        let mut problem = Problem::from_answer(
            answer.status,
            answer
                .headers
                .get("content-type")
                .and_then(|v| v.to_str().ok()),
            answer
                .headers
                .get("x-request-id")
                .and_then(|v| v.to_str().ok()),
            &answer.body,
        );
        problem.retry_after = info.retry_after;
        problem.idempotency_key = call.key.clone();
        if answer.status == 429 {
            problem.policy = binding_policy(&answer.headers)
                .or_else(|| problem.violated_policies.first().cloned());
        }
        event.code = problem.code.clone();
        Attempt::Failed(Failure::Answer(Box::new(problem)), event)
    }

    fn emit(&self, event: &AttemptEvent) {
        if let Some(hook) = &self.inner.hook {
            hook(event);
        }
    }

    fn headers(
        &self,
        body: &Body,
        key: Option<&str>,
        opts: &RequestOptions,
    ) -> Result<HeaderMap, Error> {
        let mut h = HeaderMap::new();
        h.insert("accept", HeaderValue::from_static("application/json"));
        if let Some(auth) = &self.inner.auth {
            h.insert("authorization", auth.clone());
        }
        let invalid = |what: &str| Error::Invalid(format!("{what} is not a valid header value"));
        if let Some(k) = key {
            h.insert(
                "idempotency-key",
                HeaderValue::from_str(k).map_err(|_| invalid("Idempotency-Key"))?,
            );
        }
        if let Body::Bytes { content_type, .. } = body {
            h.insert(
                "content-type",
                HeaderValue::from_str(content_type).map_err(|_| invalid("content type"))?,
            );
        }
        for (name, value) in &opts.headers {
            if name.eq_ignore_ascii_case("idempotency-key") {
                continue; // the call's key, inserted above once
            }
            let n = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| Error::Invalid(format!("header name {name:?}")))?;
            h.append(n, HeaderValue::from_str(value).map_err(|_| invalid(name))?);
        }
        Ok(h)
    }

    async fn send_once(&self, call: &Call<'_>) -> Result<Answer, AttemptError> {
        let mut req = self
            .inner
            .http
            .request(call.method.clone(), call.url.clone())
            .headers(call.headers.clone())
            .timeout(call.timeout);
        if let Body::Bytes { data, .. } = &call.body {
            req = req.body(data.clone());
        }
        let mut res = req.send().await.map_err(classify)?;
        let status = res.status().as_u16();
        let headers = std::mem::take(res.headers_mut());
        let limit = self.inner.max_response_bytes;
        let mut out = Vec::new();
        // Read chunk by chunk so a huge body is refused before it is buffered.
        while let Some(chunk) = res.chunk().await.map_err(classify)? {
            if out.len() + chunk.len() > limit {
                return Err(AttemptError::Fatal(Error::ResponseTooLarge { limit }));
            }
            out.extend_from_slice(&chunk);
        }
        Ok(Answer {
            status,
            headers,
            body: out,
        })
    }
}

fn classify(e: reqwest::Error) -> AttemptError {
    if e.is_builder() {
        AttemptError::Fatal(Error::Invalid(e.to_string()))
    } else {
        AttemptError::Transport(e)
    }
}
