//! Integration tests against the real gateway (the built worker under Miniflare), the real
//! demo origin, the TCP fault proxy and a webhook receiver, all started by
//! `tests/sdk-rust.test.mjs`, which passes their URLs in the environment and runs
//! `cargo test -- --include-ignored`. A plain `cargo test` skips them (`#[ignore]`).
//!
//! Lines starting with `FIGURE` are the measured figures the driver reports.

// Test code: a failed step should stop the test with its message.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::TryStreamExt;
use postguard_client::api::{NewEvent, NewSubscription};
use postguard_client::webhook::{self, VerifyError};
use postguard_client::{
    AttemptEvent, Body, Client, Error, Granularity, HeaderMap, IdempotencyState, ImportKey,
    ImportStatus, KeyUpdate, MemoryDedupe, Method, NewKey, RequestOptions, RetryPolicy,
    ThrottleConfig, Usage, UsageQuery, Verifier,
};
use serde_json::{json, Value};

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: these tests run from tests/sdk-rust.test.mjs (node --test), which starts the gateway")
    })
}

/// A client without throttling or retries, for the test harness's control endpoints.
fn plain(url: &str) -> Client {
    Client::builder(url)
        .retry(RetryPolicy::none())
        .throttle(ThrottleConfig {
            enabled: false,
            ..ThrottleConfig::default()
        })
        .build()
        .unwrap()
}

fn admin() -> Client {
    Client::builder(env("POSTGUARD_GATEWAY_URL"))
        .token(env("POSTGUARD_ADMIN_TOKEN"))
        .build()
        .unwrap()
}

/// A new API key on `plan` (created with the SDK's operator method).
async fn new_key(plan: &str) -> String {
    let key = admin()
        .create_key(&env("POSTGUARD_PROJECT"), plan, Some("rust-sdk-test"))
        .await
        .unwrap();
    assert!(key.prefix.starts_with("pgk_"));
    key.key.expect("the key is shown on create")
}

async fn origin_executions(key: &str) -> u64 {
    let stats: Value = plain(&env("POSTGUARD_ORIGIN_URL"))
        .request(
            Method::GET,
            "/__demo/stats",
            Body::Empty,
            RequestOptions::default(),
        )
        .await
        .unwrap()
        .json()
        .unwrap();
    stats["byKey"][key].as_u64().unwrap_or(0)
}

/// Collects every attempt a client reports through its response hook.
#[derive(Clone, Default)]
struct Events(Arc<Mutex<Vec<AttemptEvent>>>);
impl Events {
    fn hook(&self) -> impl Fn(&AttemptEvent) + Send + Sync + 'static {
        let me = self.clone();
        move |e| me.0.lock().unwrap().push(e.clone())
    }
    fn all(&self) -> Vec<AttemptEvent> {
        self.0.lock().unwrap().clone()
    }
}

async fn poll<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

// -------------------------------------------------------------------------------------------
// 1. A fault proxy loses answers after the gateway executed the request.

#[tokio::test]
#[ignore = "needs the gateway: run from tests/sdk-rust.test.mjs"]
async fn fault_proxy_every_operation_succeeds_and_runs_once() {
    const OPS: usize = 50;
    let control = plain(&env("POSTGUARD_PROXY_CONTROL_URL"));
    let key = new_key("big").await;
    let client = Client::builder(env("POSTGUARD_PROXY_URL"))
        .token(&key)
        .retry(RetryPolicy {
            // 0.3^10: an operation cut ten times in a row is not a realistic concern.
            max_attempts: 10,
            base_delay: Duration::from_millis(50),
            ..RetryPolicy::default()
        })
        .build()
        .unwrap();
    control
        .request(
            Method::POST,
            "/reset",
            Body::Empty,
            RequestOptions::default(),
        )
        .await
        .unwrap();
    control
        .request(
            Method::POST,
            "/cut-rate?value=0.3",
            Body::Empty,
            RequestOptions::default(),
        )
        .await
        .unwrap();
    let mut results = Vec::new();
    for i in 0..OPS {
        let body = Body::from(json!({ "order": i, "amount": 100 + i }));
        let res = client
            .request(
                Method::POST,
                &format!("/orders/{i}"),
                body,
                RequestOptions::default(),
            )
            .await
            .unwrap_or_else(|e| panic!("operation {i} failed: {e}"));
        assert_eq!(res.status, 201, "operation {i}");
        results.push(res);
    }
    control
        .request(
            Method::POST,
            "/cut-rate?value=0",
            Body::Empty,
            RequestOptions::default(),
        )
        .await
        .unwrap();
    let stats: Value = control
        .request(
            Method::GET,
            "/stats",
            Body::Empty,
            RequestOptions::default(),
        )
        .await
        .unwrap()
        .json()
        .unwrap();
    let cuts = stats["cuts"].as_u64().unwrap();
    let retries: u32 = results.iter().map(|r| r.attempts - 1).sum();
    let replays = results.iter().filter(|r| r.replayed()).count();
    let mut executions = 0;
    for (i, r) in results.iter().enumerate() {
        let k = r.idempotency_key.as_deref().unwrap();
        let n = origin_executions(k).await;
        assert_eq!(n, 1, "operation {i} (key {k}) executed {n} times");
        executions += n;
        // A retried operation got the stored answer; a first-time answer is not a replay.
        assert_eq!(
            r.replayed(),
            r.attempts > 1,
            "operation {i}: attempts {}",
            r.attempts
        );
        let execution = r.json::<Value>().unwrap()["execution"].clone();
        assert_eq!(
            execution,
            json!(1),
            "operation {i}: the answer of the one execution"
        );
    }
    assert!(cuts > 0, "the proxy cut nothing: the test proves nothing");
    assert!(
        retries as u64 >= cuts,
        "every cut answer was retried ({retries} retries, {cuts} cuts)"
    );
    // The gateway saw the same Idempotency-Key on every attempt of a retried operation.
    let retried = results
        .iter()
        .find(|r| r.attempts > 2)
        .or_else(|| results.iter().find(|r| r.attempts > 1));
    if let Some(r) = retried {
        let k = r.idempotency_key.clone().unwrap();
        let rows = poll(
            "the audit rows of a retried operation",
            Duration::from_secs(20),
            || {
                let (client, k) = (client.clone(), k.clone());
                async move {
                    let rows: Vec<_> = client
                        .audit(&[("idempotency_key", k.as_str())])
                        .try_collect()
                        .await
                        .ok()?;
                    (rows.len() as u32 >= r.attempts).then_some(rows)
                }
            },
        )
        .await;
        assert_eq!(
            rows.len() as u32,
            r.attempts,
            "one audit row per attempt, all with key {k}"
        );
        assert_eq!(rows.iter().filter(|row| !row.replayed).count(), 1);
    }
    println!(
        "FIGURE fault-proxy: operations={OPS} cuts={cuts} retries={retries} replays={replays} origin_executions={executions} connections={}",
        stats["connections"]
    );
}

// -------------------------------------------------------------------------------------------
// 1b. The gateway's own mutating calls lose their first answer (issue 23 item 1).

/// POSTs to the cut proxy's control endpoint.
async fn control(path: &str) {
    plain(&env("POSTGUARD_CUT_PROXY_CONTROL_URL"))
        .request(Method::POST, path, Body::Empty, RequestOptions::default())
        .await
        .unwrap();
}

async fn cuts_so_far() -> u64 {
    let stats: Value = plain(&env("POSTGUARD_CUT_PROXY_CONTROL_URL"))
        .request(
            Method::GET,
            "/stats",
            Body::Empty,
            RequestOptions::default(),
        )
        .await
        .unwrap()
        .json()
        .unwrap();
    stats["cuts"].as_u64().unwrap()
}

/// Runs one logical call whose first answer the proxy cuts, with its own Idempotency-Key,
/// and checks that it ended in a replay of that first execution. Returns the call's output
/// and its attempts.
async fn cut_once<T, F, Fut>(name: &str, events: &Events, call: F) -> (T, u32)
where
    F: FnOnce(RequestOptions) -> Fut,
    Fut: std::future::Future<Output = Result<T, Error>>,
{
    let key = format!("rs-{name}-{}", uuid_like());
    let before = cuts_so_far().await;
    control("/cut-next?count=1").await;
    let out = call(RequestOptions::default().idempotency_key(&key))
        .await
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(
        cuts_so_far().await,
        before + 1,
        "{name}: its first answer was cut"
    );
    let seen: Vec<_> = events
        .all()
        .into_iter()
        .filter(|e| e.idempotency_key.as_deref() == Some(key.as_str()))
        .collect();
    assert_eq!(
        seen[0].status, None,
        "{name}: the first attempt lost its answer"
    );
    let last = seen.last().unwrap();
    assert!(last.attempt >= 2 && last.status.is_some_and(|s| s < 300));
    assert!(
        last.replayed,
        "{name}: the retry got the stored answer, not a second execution ({:?})",
        seen.iter().map(|e| e.status).collect::<Vec<_>>()
    );
    (out, last.attempt)
}

#[tokio::test]
#[ignore = "needs the gateway: run from tests/sdk-rust.test.mjs"]
async fn gateway_calls_whose_first_answer_is_cut_take_effect_once() {
    let events = Events::default();
    let through_proxy = |token: &str| {
        Client::builder(env("POSTGUARD_CUT_PROXY_URL"))
            .token(token)
            .retry(RetryPolicy {
                max_attempts: 8,
                base_delay: Duration::from_millis(50),
                ..RetryPolicy::default()
            })
            .on_response(events.hook())
            .build()
            .unwrap()
    };
    control("/reset").await;
    let project = format!("rust-cut-{}", &uuid_like()[..8]);
    let operator = through_proxy(&env("POSTGUARD_ADMIN_TOKEN"));

    // create_key: one live key for the project.
    let (created, a_key) = cut_once("create_key", &events, |o| {
        operator.create_key_with(&project, "big", None, o)
    })
    .await;
    let keys = admin()
        .list_keys(&[("project", &project)], None)
        .await
        .unwrap();
    let ids: Vec<_> = keys.data.iter().map(|k| k.id.as_str()).collect();
    assert_eq!(ids, [created.id.as_str()], "one live key per call");
    let token = created.key.clone().unwrap();
    let client = through_proxy(&token);
    assert_eq!(client.me().await.unwrap().project, project, "the key works");

    // create_webhook: one subscription.
    let new = NewSubscription::new(
        format!("{}/reject/{project}", env("POSTGUARD_RECEIVER_URL")),
        ["*"],
    );
    let (sub, a_sub) = cut_once("create_webhook", &events, |o| {
        client.create_webhook_with(&new, o)
    })
    .await;
    let subs = client.list_webhooks(&[]).await.unwrap();
    let ids: Vec<_> = subs.data.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(ids, [sub.id.as_str()], "one subscription per call");

    // A delivery the receiver refuses (400): dead-lettered after its first attempt.
    let publisher = Client::builder(env("POSTGUARD_GATEWAY_URL"))
        .token(env("POSTGUARD_ORIGIN_TOKEN"))
        .build()
        .unwrap();
    let first = publisher
        .publish_event(&project, "rust.cut", &json!({ "n": 1 }), None)
        .await
        .unwrap();
    let dead = poll(
        "the delivery dead-lettered",
        Duration::from_secs(20),
        || {
            let (client, first) = (client.clone(), first.clone());
            async move {
                let page = client
                    .list_deliveries(&[("status", "dead_letter")], None)
                    .await
                    .ok()?;
                page.data.into_iter().find(|d| d.event_id == first)
            }
        },
    )
    .await;
    assert_eq!(dead.attempts_made, 1);

    // rotate_secret: one rotation, so the original secret still signs during the overlap.
    let (fresh, a_rot) = cut_once("rotate_secret", &events, |o| {
        client.rotate_webhook_secret_with(&sub.id, o)
    })
    .await;
    let second = publisher
        .publish_event(&project, "rust.cut", &json!({ "n": 2 }), None)
        .await
        .unwrap();
    let (body, headers) = captured(&second, 1).await;
    let sigs = headers["webhook-signature"]
        .to_str()
        .unwrap()
        .split(' ')
        .count();
    assert_eq!(sigs, 2, "the original secret and one new one sign");
    let original = sub.secret.clone().unwrap();
    assert!(
        webhook::verify(&body, &headers, &[&original]).is_ok(),
        "the predecessor still verifies"
    );
    assert!(webhook::verify(&body, &headers, &[&fresh]).is_ok());

    // retry and redirect: one more attempt each in the delivery's log. A last, uncut retry
    // goes through the same queue after them: the log is complete once it shows.
    let (_, a_retry) = cut_once("retry", &events, |o| {
        client.retry_delivery_with(&dead.id, o)
    })
    .await;
    let target = format!("{}/redirected/{project}", env("POSTGUARD_RECEIVER_URL"));
    let (_, a_redirect) = cut_once("redirect", &events, |o| {
        client.redirect_delivery_with(&dead.id, &target, o)
    })
    .await;
    Client::builder(env("POSTGUARD_GATEWAY_URL"))
        .token(&token)
        .build()
        .unwrap()
        .retry_delivery(&dead.id)
        .await
        .unwrap();
    let count = |urls: &[String], part: &str| urls.iter().filter(|u| u.contains(part)).count();
    let urls = poll(
        "the retries and the redirect in the log",
        Duration::from_secs(20),
        || {
            let (client, id) = (client.clone(), dead.id.clone());
            async move {
                let d = client.get_delivery(&id).await.ok()?;
                let urls: Vec<String> = d.attempts.into_iter().map(|a| a.url).collect();
                (count(&urls, "/reject/") >= 3 && count(&urls, "/redirected/") >= 1).then_some(urls)
            }
        },
    )
    .await;
    assert_eq!(
        count(&urls, "/reject/"),
        3,
        "one attempt per retry call: {urls:?}"
    );
    assert_eq!(
        count(&urls, "/redirected/"),
        1,
        "one redirect per call: {urls:?}"
    );

    // portal_link: the replayed link exchanges for a session.
    let (link, a_link) = cut_once("portal_link", &events, |o| {
        operator.create_portal_link_with(&project, None, o)
    })
    .await;
    let (_, token) = link.url.split_once("#portal=").unwrap();
    let session: Value = plain(&env("POSTGUARD_GATEWAY_URL"))
        .request(
            Method::POST,
            "/_postguard/v1/portal-sessions",
            Body::from(json!({ "token": token })),
            RequestOptions::default(),
        )
        .await
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(session["project"], json!(project));
    println!(
        "FIGURE gateway-calls-cut-once: attempts create_key={a_key} create_webhook={a_sub} rotate_secret={a_rot} retry={a_retry} redirect={a_redirect} portal_link={a_link}, each a replay"
    );
}

// -------------------------------------------------------------------------------------------
// 2. Retries of failed executions; a second call while the first runs.

/// `request_async` on an async route (`/reports/*`): a 202 handle, the same operation for a
/// resend with the same key, `wait` polling no sooner than each `Retry-After`, the result;
/// a synchronous route gives a done handle; a failed operation is `Error::OperationFailed`.
#[tokio::test]
#[ignore = "needs the gateway: run from tests/sdk-rust.test.mjs"]
async fn an_operation_runs_once_and_wait_polls_after_retry_after() {
    let events = Events::default();
    let client = Client::builder(env("POSTGUARD_GATEWAY_URL"))
        .token(new_key("big").await)
        .on_response(events.hook())
        .build()
        .unwrap();
    let key = format!("rs-op-{}", uuid_like());
    let opts = RequestOptions::default()
        .idempotency_key(&key)
        .header("x-demo-delay-ms", "2500");
    let body = json!({ "q": 1 });
    let mut op = client
        .request_async(
            Method::POST,
            "/reports/q1",
            Body::from(body.clone()),
            opts.clone(),
        )
        .await
        .unwrap();
    let id = op.id().expect("an operation").to_owned();
    assert!(id.starts_with("op_") && id.len() == 55, "{id}");
    assert_eq!(op.state(), postguard_client::OperationState::Queued);
    let again = client
        .request_async(Method::POST, "/reports/q1", Body::from(body), opts)
        .await
        .unwrap();
    assert_eq!(again.id(), Some(id.as_str()), "the same operation");
    let started = Instant::now();
    let res = op
        .wait(postguard_client::WaitOptions {
            timeout: Some(Duration::from_secs(60)),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(res.status, 201);
    assert_eq!(res.json::<Value>().unwrap()["execution"], 1);
    assert!(op.is_done());
    assert_eq!(origin_executions(&key).await, 1, "executed once");
    let polls: Vec<AttemptEvent> = events
        .0
        .lock()
        .unwrap()
        .iter()
        .filter(|e| e.path == format!("/_postguard/v1/operations/{id}"))
        .cloned()
        .collect();
    assert!(!polls.is_empty());
    // With at least a second between polls (the gateway's Retry-After is at least 1 s),
    // n polls take at least n - 1 seconds.
    assert!(started.elapsed() >= Duration::from_secs(polls.len() as u64 - 1));
    assert_eq!(
        client.get_operation(&id).await.unwrap().state,
        postguard_client::OperationState::Succeeded
    );
    let listed = client
        .list_operations(&[("limit", "50")], None)
        .await
        .unwrap();
    assert!(listed.data.iter().any(|o| o.id == id));
    let rebuilt = client.operation(&id).await.unwrap();
    assert_eq!(rebuilt.result().await.unwrap().body, res.body);
    // A route the gateway runs synchronously: a done handle.
    let mut sync = client
        .request_async(
            Method::POST,
            "/payments",
            Body::from(json!({ "n": 1 })),
            RequestOptions::default(),
        )
        .await
        .unwrap();
    assert!(sync.id().is_none() && sync.is_done());
    assert_eq!(sync.wait(Default::default()).await.unwrap().status, 201);
    // A failed operation: its last answer as `Error::OperationFailed`.
    let failing = format!("rs-op-fail-{}", uuid_like());
    plain(&env("POSTGUARD_ORIGIN_URL"))
        .request(
            Method::POST,
            "/__demo/script",
            Body::from(json!({ "key": failing, "statuses": [503, 503, 503, 503, 503] })),
            RequestOptions::default(),
        )
        .await
        .unwrap();
    let mut bad = client
        .request_async(
            Method::POST,
            "/reports/bad",
            Body::from(json!({ "q": 2 })),
            RequestOptions::default().idempotency_key(&failing),
        )
        .await
        .unwrap();
    match bad.wait(Default::default()).await {
        Err(Error::OperationFailed(p)) => assert_eq!(p.status, 503),
        other => panic!("expected OperationFailed, got {other:?}"),
    }
}

#[tokio::test]
#[ignore = "needs the gateway: run from tests/sdk-rust.test.mjs"]
async fn origin_503_twice_then_201_is_one_successful_call() {
    let client = Client::builder(env("POSTGUARD_GATEWAY_URL"))
        .token(new_key("big").await)
        .retry(RetryPolicy {
            base_delay: Duration::from_millis(100),
            ..RetryPolicy::default()
        })
        .build()
        .unwrap();
    let key = format!("rs-503-{}", uuid_like());
    plain(&env("POSTGUARD_ORIGIN_URL"))
        .request(
            Method::POST,
            "/__demo/script",
            Body::from(json!({ "key": key, "statuses": [503, 503] })),
            RequestOptions::default(),
        )
        .await
        .unwrap();
    let body = json!({ "amount": 100 });
    let opts = RequestOptions::default().idempotency_key(&key);
    let res = client
        .request(
            Method::POST,
            "/payments",
            Body::from(body.clone()),
            opts.clone(),
        )
        .await
        .unwrap();
    assert_eq!((res.status, res.attempts, res.replayed()), (201, 3, false));
    assert_eq!(res.json::<Value>().unwrap()["execution"], 3);
    assert_eq!(
        origin_executions(&key).await,
        3,
        "two failed executions, then the third"
    );
    // The failures were not stored, the 201 was: the same call again is its replay.
    let again = client
        .request(Method::POST, "/payments", Body::from(body), opts)
        .await
        .unwrap();
    assert_eq!((again.status, again.replayed()), (201, true));
    assert_eq!(again.body, res.body);
    assert_eq!(origin_executions(&key).await, 3);
    println!(
        "FIGURE 503-503-201: attempts={} origin_executions=3",
        res.attempts
    );
}

#[tokio::test]
#[ignore = "needs the gateway: run from tests/sdk-rust.test.mjs"]
async fn a_call_while_the_first_is_in_progress_waits_for_its_result() {
    let token = new_key("big").await;
    let events = Events::default();
    let first_client = Client::builder(env("POSTGUARD_GATEWAY_URL"))
        .token(&token)
        .build()
        .unwrap();
    let second_client = Client::builder(env("POSTGUARD_GATEWAY_URL"))
        .token(&token)
        .on_response(events.hook())
        .build()
        .unwrap();
    let key = format!("rs-409-{}", uuid_like());
    let opts = RequestOptions::default()
        .idempotency_key(&key)
        .header("x-demo-delay-ms", "1500");
    let body = json!({ "amount": 7 });
    let first = tokio::spawn({
        let (c, b, o) = (first_client.clone(), body.clone(), opts.clone());
        async move { c.request(Method::POST, "/slow", Body::from(b), o).await }
    });
    poll(
        "the origin to start the first execution",
        Duration::from_secs(10),
        || {
            let k = key.clone();
            async move { (origin_executions(&k).await == 1).then_some(()) }
        },
    )
    .await;
    let second = second_client
        .request(Method::POST, "/slow", Body::from(body), opts)
        .await
        .unwrap();
    let first = first.await.unwrap().unwrap();
    assert_eq!((first.status, first.replayed()), (201, false));
    assert_eq!((second.status, second.replayed()), (201, true));
    assert_eq!(
        second.body, first.body,
        "the second call returns the first result"
    );
    assert_eq!(origin_executions(&key).await, 1);
    let seen = events.all();
    assert_eq!(seen[0].status, Some(409));
    assert_eq!(seen[0].code.as_deref(), Some("IDEMPOTENCY_KEY_IN_PROGRESS"));
    assert!(
        seen[0].retry_in.unwrap() >= Duration::from_secs(1),
        "Retry-After (≥ 1 s) is the floor"
    );
    println!(
        "FIGURE in-progress: second call attempts={} (409 then replay) origin_executions=1",
        second.attempts
    );
}

// -------------------------------------------------------------------------------------------
// 3. Proactive throttling: 8 tasks, 40 calls, a plan of 10 per 5 s.

/// 40 calls from 8 tasks; returns the time, the 429s, the client, and the lowest
/// `X-RateLimit-Remaining` an answer reported.
async fn forty_calls(throttle: ThrottleConfig, retry: RetryPolicy) -> (Duration, u64, Client, u64) {
    let client = Client::builder(env("POSTGUARD_GATEWAY_URL"))
        .token(new_key("small").await)
        .throttle(throttle)
        .retry(retry)
        .build()
        .unwrap();
    let started = Instant::now();
    let tasks: Vec<_> = (0..8)
        .map(|t| {
            let c = client.clone();
            tokio::spawn(async move {
                let mut lowest = u64::MAX;
                for i in 0..5 {
                    let body = Body::from(json!({ "task": t, "call": i }));
                    let res = c
                        .request(Method::POST, "/items", body, RequestOptions::default())
                        .await
                        .unwrap_or_else(|e| panic!("task {t} call {i}: {e}"));
                    assert_eq!(res.status, 201);
                    let left = res
                        .header("x-ratelimit-remaining")
                        .unwrap()
                        .parse()
                        .unwrap();
                    lowest = lowest.min(left);
                }
                lowest
            })
        })
        .collect();
    let mut lowest = u64::MAX;
    for t in tasks {
        lowest = lowest.min(t.await.unwrap());
    }
    let elapsed = started.elapsed();
    let m = client.metrics();
    (elapsed, m.rejected_429, client, lowest)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the gateway: run from tests/sdk-rust.test.mjs"]
async fn proactive_default_reserve_receives_no_429() {
    let (elapsed, rejected, client, lowest) =
        forty_calls(ThrottleConfig::default(), RetryPolicy::default()).await;
    let m = client.metrics();
    println!(
        "FIGURE proactive default reserve (1 of 10): calls=40 429s={rejected} elapsed={:.2}s throttle_waits={} lowest_remaining={lowest}",
        elapsed.as_secs_f64(),
        m.throttle_waits
    );
    assert_eq!(rejected, 0);
    assert_eq!(m.attempts, 40, "no retries were needed");
    assert!(lowest >= 1, "one of ten kept in reserve (lowest {lowest})");
}

/// Issue 25 item 7: on a 5-per-5 s plan the old fixed reserve of 5 (capped at 4) let one
/// call through per window; the default now keeps one. The old setting and the new
/// default side by side, six sequential calls each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the gateway: run from tests/sdk-rust.test.mjs"]
async fn six_calls_on_a_five_per_window_plan_before_and_after() {
    async fn six(threshold: Option<u32>) -> (Duration, Vec<u64>, u64) {
        let client = Client::builder(env("POSTGUARD_GATEWAY_URL"))
            .token(new_key("tiny").await)
            .throttle(ThrottleConfig {
                threshold,
                ..ThrottleConfig::default()
            })
            .build()
            .unwrap();
        let started = Instant::now();
        let mut remaining = Vec::new();
        for i in 0..6 {
            let body = Body::from(json!({ "i": i }));
            let res = client
                .request(Method::POST, "/six", body, RequestOptions::default())
                .await
                .unwrap();
            remaining.push(
                res.header("x-ratelimit-remaining")
                    .unwrap()
                    .parse()
                    .unwrap(),
            );
        }
        (started.elapsed(), remaining, client.metrics().rejected_429)
    }
    let ((after_t, after, after_429), (before_t, before, before_429)) =
        tokio::join!(six(None), six(Some(5)));
    println!(
        "FIGURE six calls on 5 per 5 s: before (threshold 5) {:.2}s remaining={before:?}; after (default) {:.2}s remaining={after:?}",
        before_t.as_secs_f64(),
        after_t.as_secs_f64()
    );
    assert_eq!((after_429, before_429), (0, 0));
    assert_eq!(
        before, [4; 6],
        "the old reserve: every call alone in its window"
    );
    assert!(
        after.iter().any(|&r| r <= 3),
        "several calls in one window: {after:?}"
    );
    assert!(
        after.iter().all(|&r| r >= 1),
        "one unit always kept: {after:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the gateway: run from tests/sdk-rust.test.mjs"]
async fn proactive_threshold_zero_uses_the_whole_budget_without_a_429() {
    let throttle = ThrottleConfig {
        threshold: Some(0),
        ..ThrottleConfig::default()
    };
    let (elapsed, rejected, client, lowest) = forty_calls(throttle, RetryPolicy::default()).await;
    let secs = elapsed.as_secs_f64();
    println!(
        "FIGURE proactive threshold=0: calls=40 429s={rejected} elapsed={secs:.2}s ideal=15s deviation={:+.1}%",
        (secs / 15.0 - 1.0) * 100.0
    );
    assert_eq!(rejected, 0);
    assert_eq!(client.metrics().attempts, 40);
    // What the SDK promises: the whole budget (an answer reports 0 left), no 429. 40 calls at
    // 10 per 5 s need four windows (15 s at least); how far above the time lies measures the
    // machine (issue 28), so it is printed, not bounded.
    assert_eq!(lowest, 0, "the whole budget was used");
    assert!(secs >= 14.0, "four windows are needed: {secs:.2}s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the gateway: run from tests/sdk-rust.test.mjs"]
async fn proactive_off_absorbs_429s_through_retry_after() {
    let off = ThrottleConfig {
        enabled: false,
        ..ThrottleConfig::default()
    };
    // Eight tasks racing for ten slots: a call may lose several rounds.
    let retry = RetryPolicy {
        max_attempts: 12,
        ..RetryPolicy::default()
    };
    let (elapsed, rejected, client, _) = forty_calls(off, retry).await;
    let m = client.metrics();
    println!(
        "FIGURE proactive off: calls=40 429s={rejected} retries={} elapsed={:.2}s",
        m.retries,
        elapsed.as_secs_f64()
    );
    assert!(
        rejected > 0,
        "without throttling the plan must have pushed back"
    );
    assert_eq!(m.retries, rejected, "every retry was a 429 absorbed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the gateway: run from tests/sdk-rust.test.mjs"]
async fn pacing_spreads_the_calls_over_the_window() {
    let client = Client::builder(env("POSTGUARD_GATEWAY_URL"))
        .token(new_key("small").await)
        .throttle(ThrottleConfig {
            threshold: Some(0),
            pacing: true,
            ..ThrottleConfig::default()
        })
        .build()
        .unwrap();
    let started = Instant::now();
    let tasks: Vec<_> = (0..4)
        .map(|t| {
            let c = client.clone();
            tokio::spawn(async move {
                for i in 0..5 {
                    let body = Body::from(json!({ "task": t, "call": i }));
                    c.request(Method::POST, "/paced", body, RequestOptions::default())
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let secs = started.elapsed().as_secs_f64();
    let m = client.metrics();
    println!(
        "FIGURE pacing: calls=20 429s={} elapsed={secs:.2}s (one per 0.5 s: at least 9.5 s)",
        m.rejected_429
    );
    assert_eq!(m.rejected_429, 0);
    // Bursting would finish in two windows' first instants (~5 s); pacing cannot.
    assert!(secs >= 9.5, "elapsed {secs:.2}s");
}

// -------------------------------------------------------------------------------------------
// 4. Webhooks: a real delivery verified, a tampered one refused, rotated secrets.

async fn captured(id: &str, min_signatures: usize) -> (Vec<u8>, HeaderMap) {
    let capture = plain(&env("POSTGUARD_CAPTURE_URL"));
    poll(
        &format!("the delivery of {id}"),
        Duration::from_secs(30),
        || {
            let capture = capture.clone();
            async move {
                let list: Vec<Value> = capture
                    .request(Method::GET, "/", Body::Empty, RequestOptions::default())
                    .await
                    .ok()?
                    .json()
                    .ok()?;
                let r = list.into_iter().find(|r| {
                    r["headers"]["webhook-id"] == id
                        && r["headers"]["webhook-signature"]
                            .as_str()
                            .is_some_and(|s| s.split(' ').count() >= min_signatures)
                })?;
                let mut headers = HeaderMap::new();
                for (k, v) in r["headers"].as_object()? {
                    let name: postguard_client::HeaderName = k.parse().ok()?;
                    headers.insert(name, v.as_str()?.parse().ok()?);
                }
                Some((r["body"].as_str()?.as_bytes().to_vec(), headers))
            }
        },
    )
    .await
}

#[tokio::test]
#[ignore = "needs the gateway: run from tests/sdk-rust.test.mjs"]
async fn webhook_deliveries_verify_and_tampering_is_refused() {
    let project = env("POSTGUARD_PROJECT");
    let client = Client::builder(env("POSTGUARD_GATEWAY_URL"))
        .token(new_key("big").await)
        .build()
        .unwrap();
    let publisher = Client::builder(env("POSTGUARD_GATEWAY_URL"))
        .token(env("POSTGUARD_ORIGIN_TOKEN"))
        .build()
        .unwrap();
    let sub = client
        .create_webhook(
            &NewSubscription::new(
                format!("{}/rust-sdk", env("POSTGUARD_RECEIVER_URL")),
                ["rust.*"],
            )
            .description("rust sdk test"),
        )
        .await
        .unwrap();
    let old = sub.secret.clone().unwrap();
    let id = publisher
        .publish_event(&project, "rust.paid", &json!({ "amount": 100 }), None)
        .await
        .unwrap();
    let (body, headers) = captured(&id, 1).await;
    let event = webhook::verify(&body, &headers, &[&old]).unwrap();
    assert_eq!(
        (event.id.as_str(), event.event_type.as_str()),
        (id.as_str(), "rust.paid")
    );
    assert_eq!(event.data["amount"], 100);
    let tampered = String::from_utf8(body.clone())
        .unwrap()
        .replace("100", "1000");
    assert!(matches!(
        webhook::verify(tampered.as_bytes(), &headers, &[&old]),
        Err(VerifyError::InvalidSignature)
    ));
    let wrong = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    assert!(webhook::verify(&body, &headers, &[wrong]).is_err());
    // At-least-once: the dedupe hook lets the handler run once per event id.
    let verifier = Verifier::new([&old]).unwrap();
    let seen = MemoryDedupe::new(1000);
    assert!(verifier
        .verify_once(&body, &headers, &seen)
        .unwrap()
        .is_some());
    assert!(verifier
        .verify_once(&body, &headers, &seen)
        .unwrap()
        .is_none());

    // Rotation: for a while both secrets sign; a receiver holding either one verifies.
    let new = client.rotate_webhook_secret(&sub.id).await.unwrap();
    assert_ne!(new, old);
    let id2 = publisher
        .publish_event(&project, "rust.paid", &json!({ "amount": 5 }), None)
        .await
        .unwrap();
    let (body2, headers2) = captured(&id2, 2).await;
    for secrets in [
        vec![new.as_str()],
        vec![old.as_str()],
        vec![wrong, new.as_str()],
    ] {
        assert!(
            webhook::verify(&body2, &headers2, &secrets).is_ok(),
            "{secrets:?}"
        );
    }
    assert!(webhook::verify(&body2, &headers2, &[wrong]).is_err());
    let deliveries: Vec<_> = client
        .deliveries(&[("event_type", "rust.paid")])
        .try_collect()
        .await
        .unwrap();
    let first = deliveries
        .iter()
        .find(|d| d.event_id == id)
        .expect("the delivery is listed");
    let detail = client.get_delivery(&first.id).await.unwrap();
    assert!(
        !detail.attempts.is_empty(),
        "the delivery shows its attempts"
    );
    let subs = client.list_webhooks(&[]).await.unwrap();
    assert!(subs
        .data
        .iter()
        .any(|s| s.id == sub.id && s.secret.is_none()));
    assert_eq!(client.get_webhook(&sub.id).await.unwrap().url, sub.url);
    client.delete_webhook(&sub.id).await.unwrap();
    let gone = client.get_webhook(&sub.id).await.unwrap_err();
    assert_eq!((gone.status(), gone.code()), (Some(404), "NOT_FOUND"));
    println!("FIGURE webhooks: delivery verified, tampered refused, rotated secrets verified");
}

// -------------------------------------------------------------------------------------------
// Errors and the typed endpoints.

#[tokio::test]
#[ignore = "needs the gateway: run from tests/sdk-rust.test.mjs"]
async fn errors_carry_the_problem_and_are_not_retried() {
    let url = env("POSTGUARD_GATEWAY_URL");
    let bad = Client::builder(&url)
        .token("pgk_not-a-key")
        .build()
        .unwrap();
    let e = bad.me().await.unwrap_err();
    assert_eq!((e.status(), e.code()), (Some(401), "INVALID_API_KEY"));
    assert!(e.request_id().unwrap().starts_with("req_"));
    assert_eq!(e.problem().unwrap().attempts, 1, "401 is not retried");

    let client = Client::builder(&url)
        .token(new_key("big").await)
        .build()
        .unwrap();
    let key = format!("rs-422-{}", uuid_like());
    let opts = RequestOptions::default().idempotency_key(&key);
    client
        .request(
            Method::POST,
            "/orders",
            Body::from(json!({ "a": 1 })),
            opts.clone(),
        )
        .await
        .unwrap();
    let e = client
        .request(Method::POST, "/orders", Body::from(json!({ "a": 2 })), opts)
        .await
        .unwrap_err();
    let Error::IdempotencyKeyReuseConflict(p) = &e else {
        panic!("expected IdempotencyKeyReuseConflict, got {e:?}");
    };
    assert_eq!((p.status, p.attempts), (422, 1));
    assert_eq!(p.idempotency_key.as_deref(), Some(key.as_str()));
    assert!(p.request_id.as_deref().unwrap().starts_with("req_"));

    let me = client.me().await.unwrap();
    assert_eq!(
        (me.plan.as_str(), me.project),
        ("big", env("POSTGUARD_PROJECT"))
    );
    let stats = client.stats(1).await.unwrap();
    assert!(stats.days.iter().map(|d| d.requests).sum::<u64>() >= 1);
    let keys = admin()
        .list_keys(&[("project", &env("POSTGUARD_PROJECT"))], None)
        .await
        .unwrap();
    assert!(keys.data.iter().any(|k| k.prefix == me.prefix));
    assert!(
        keys.data.iter().all(|k| k.key.is_none()),
        "full keys are never listed"
    );
    let victim = admin()
        .create_key(&env("POSTGUARD_PROJECT"), "big", None)
        .await
        .unwrap();
    admin().revoke_key(&victim.id).await.unwrap();
    assert!(admin()
        .get_key(&victim.id)
        .await
        .unwrap()
        .revoked_at
        .is_some());
    let revoked = Client::builder(&url)
        .token(victim.key.unwrap())
        .build()
        .unwrap();
    assert_eq!(revoked.me().await.unwrap_err().code(), "INVALID_API_KEY");
}

// -------------------------------------------------------------------------------------------
// 6. Keys and limits (issue 25): the idempotency lookup, the key lifecycle, expiry, concurrency.

fn key_client(token: &str) -> Client {
    Client::builder(env("POSTGUARD_GATEWAY_URL"))
        .token(token)
        .build()
        .unwrap()
}

fn unique_project(tag: &str) -> String {
    format!("rs-{tag}-{}", &uuid_like()[..8])
}

#[tokio::test]
#[ignore = "needs the gateway: run from tests/sdk-rust.test.mjs"]
async fn status_is_unknown_then_in_progress_then_completed_like_the_answer() {
    let client = key_client(&new_key("big").await);
    // A `/` in the key: percent-encoded into the path.
    let key = format!("rs-status/{}", uuid_like());
    let unknown = client.status(&key).await.unwrap();
    assert_eq!(
        (unknown.state, unknown.status, unknown.request_id),
        (IdempotencyState::Unknown, None, None)
    );
    let opts = RequestOptions::default()
        .idempotency_key(&key)
        .header("x-demo-delay-ms", "3000");
    let sent = tokio::spawn({
        let (c, o) = (client.clone(), opts.clone());
        async move {
            c.request(Method::POST, "/status", Body::from(json!({"n": 1})), o)
                .await
        }
    });
    let running = poll("in_progress", Duration::from_secs(15), || {
        let (c, k) = (client.clone(), key.clone());
        async move {
            let s = c.status(&k).await.unwrap();
            (s.state == IdempotencyState::InProgress).then_some(s)
        }
    })
    .await;
    assert!(running.expires_at.unwrap() > running.created_at.unwrap());
    let answer = sent.await.unwrap().unwrap();
    assert_eq!(answer.status, 201);
    let done = poll("the record written", Duration::from_secs(10), || {
        let (c, k) = (client.clone(), key.clone());
        async move {
            let s = c.status(&k).await.unwrap();
            (s.state != IdempotencyState::InProgress).then_some(s)
        }
    })
    .await;
    assert_eq!(done.state, IdempotencyState::Completed);
    assert_eq!(done.status, Some(201));
    assert_eq!(done.request_id.as_deref(), answer.request_id());
    // The recipe: completed → the same key again gets the stored answer.
    let again = client
        .request(
            Method::POST,
            "/status",
            Body::from(json!({"n": 1})),
            RequestOptions::default().idempotency_key(&key),
        )
        .await
        .unwrap();
    assert!(again.replayed());
    assert_eq!(again.body, answer.body);
    assert_eq!(origin_executions(&key).await, 1);
    assert_eq!(
        client.status("..").await.unwrap().state,
        IdempotencyState::Unknown,
        "a `..` key is looked up, not resolved away"
    );
}

#[tokio::test]
#[ignore = "needs the gateway: run from tests/sdk-rust.test.mjs"]
async fn update_key_changes_the_plan_from_the_next_request() {
    let created = admin()
        .create_key_from(
            &NewKey::new(unique_project("update"), "big").meta(json!({"tier": "gold"})),
        )
        .await
        .unwrap();
    let client = key_client(created.key.as_deref().unwrap());
    let policy_of = |r: &postguard_client::Response| {
        r.header("ratelimit-policy").unwrap_or_default().to_owned()
    };
    let opts = RequestOptions::default;
    let before = client
        .request(Method::GET, "/plan-before", Body::Empty, opts())
        .await
        .unwrap();
    assert_eq!(policy_of(&before), "\"default\";q=100000;w=60");
    let updated = admin()
        .update_key(&created.id, &KeyUpdate::default().plan("tiered"))
        .await
        .unwrap();
    assert_eq!(
        (updated.id.as_str(), updated.plan.as_str()),
        (created.id.as_str(), "tiered")
    );
    let after = client
        .request(Method::GET, "/plan-after", Body::Empty, opts())
        .await
        .unwrap();
    assert_eq!(
        policy_of(&after),
        "\"burst\";q=20;w=1, \"minute\";q=200;w=60, \"inflight\";q=2;qu=\"concurrent-requests\""
    );
    let me = client.me().await.unwrap();
    assert_eq!(me.plan, "tiered");
    let policies: Vec<_> = me
        .policies
        .iter()
        .map(|p| (p.name.as_str(), p.limit, p.window_s))
        .collect();
    assert_eq!(policies, [("burst", 20, 1), ("minute", 200, 60)]);
    let inflight = me.inflight.expect("the concurrency quota in /me");
    assert_eq!(
        (inflight.limit, inflight.in_use),
        (2, 0),
        "nothing in flight"
    );
    let detail = admin().get_key(&created.id).await.unwrap();
    assert_eq!(
        detail.meta,
        Some(json!({"tier": "gold"})),
        "kept by a PATCH that did not name it"
    );
}

#[tokio::test]
#[ignore = "needs the gateway: run from tests/sdk-rust.test.mjs"]
async fn reroll_key_keeps_the_id_and_both_secrets_work() {
    let project = unique_project("reroll");
    let created = admin()
        .create_key_from(&NewKey::new(&project, "big"))
        .await
        .unwrap();
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let rolled = admin().reroll_key(&created.id, Some(600)).await.unwrap();
    assert_eq!(
        (rolled.id.as_str(), rolled.prefix.as_str()),
        (created.id.as_str(), created.prefix.as_str())
    );
    let old = created.key.unwrap();
    assert_ne!(rolled.key, old);
    assert!((rolled.previous_expires_at - (before + 600_000)).abs() < 5_000);
    for secret in [&old, &rolled.key] {
        let c = key_client(secret);
        let r = c
            .request(
                Method::POST,
                "/rerolled",
                Body::from(json!({})),
                RequestOptions::default(),
            )
            .await
            .unwrap();
        assert_eq!(r.status, 201);
        assert_eq!(c.me().await.unwrap().prefix, created.prefix, "the same key");
    }
    let listed = admin()
        .list_keys(&[("project", &project)], None)
        .await
        .unwrap();
    let ids: Vec<_> = listed.data.iter().map(|k| k.id.as_str()).collect();
    assert_eq!(ids, [created.id.as_str()], "still one key");
}

#[tokio::test]
#[ignore = "needs the gateway: run from tests/sdk-rust.test.mjs"]
async fn an_expiring_key_fails_with_api_key_expired() {
    let now_ms = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64
    };
    // Ten seconds ahead: on a loaded machine creating the key and the first call can take
    // several seconds, and the first call must land before the expiry.
    let expires_at = now_ms() + 10_000;
    let created = admin()
        .create_key_from(&NewKey::new(unique_project("expiry"), "big").expires_at(expires_at))
        .await
        .unwrap();
    assert_eq!(created.expires_at, Some(expires_at as i64));
    let client = key_client(created.key.as_deref().unwrap());
    let alive = || {
        client.request(
            Method::GET,
            "/still-alive",
            Body::Empty,
            RequestOptions::default(),
        )
    };
    assert_eq!(alive().await.unwrap().status, 200);
    let err = poll(
        "the key refused after expires_at",
        Duration::from_secs(40),
        || async { alive().await.err() },
    )
    .await;
    let Error::ApiKeyExpired(p) = &err else {
        panic!("expected ApiKeyExpired, got {err:?}");
    };
    assert_eq!(
        (p.status, p.code.as_deref(), p.attempts),
        (401, Some("API_KEY_EXPIRED"), 1)
    );
    assert!(now_ms() >= expires_at, "not before expires_at");
    assert!(matches!(client.me().await, Err(Error::ApiKeyExpired(_))));
}

#[tokio::test]
#[ignore = "needs the gateway: run from tests/sdk-rust.test.mjs"]
async fn a_concurrency_refusal_is_retried_after_retry_after() {
    let events = Events::default();
    let client = Client::builder(env("POSTGUARD_GATEWAY_URL"))
        .token(new_key("single").await)
        .on_response(events.hook())
        .build()
        .unwrap();
    // The limiter learns the budget: both calls then go at once.
    client
        .request(
            Method::GET,
            "/warm-up",
            Body::Empty,
            RequestOptions::default(),
        )
        .await
        .unwrap();
    let call = |n: u32| {
        let c = client.clone();
        async move {
            let opts = RequestOptions::default().header("x-demo-delay-ms", "3000");
            c.request(
                Method::POST,
                "/one-at-a-time",
                Body::from(json!({ "n": n })),
                opts,
            )
            .await
        }
    };
    let (a, b) = tokio::join!(call(0), call(1));
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!((a.status, b.status), (201, 201));
    let refusals: Vec<_> = events
        .all()
        .into_iter()
        .filter(|e| e.status == Some(429))
        .collect();
    assert!(!refusals.is_empty(), "one call met the other in flight");
    for e in &refusals {
        assert_eq!(e.code.as_deref(), Some("CONCURRENCY_LIMIT_EXCEEDED"));
        assert!(
            e.retry_in.unwrap() >= Duration::from_secs(1),
            "not before Retry-After"
        );
    }
    assert_eq!(a.attempts + b.attempts, 2 + refusals.len() as u32);
    println!(
        "FIGURE concurrency-1: attempts=[{}, {}] refusals={}",
        a.attempts,
        b.attempts,
        refusals.len()
    );
}

fn uuid_like() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

// -------------------------------------------------------------------------------------------
// 7. Moving an existing API (issue 34): imported keys, usage, a subscription's moved secret.

fn sums(rows: &[Usage]) -> [u64; 5] {
    rows.iter().fold([0; 5], |a, u| {
        [
            a[0] + u.requests,
            a[1] + u.admitted,
            a[2] + u.billable,
            a[3] + u.replays,
            a[4] + u.refused,
        ]
    })
}

#[tokio::test]
#[ignore = "needs the gateway: run from tests/sdk-rust.test.mjs"]
async fn imported_keys_work_a_rerun_says_exists_and_usage_counts_each_operation_once() {
    let project = unique_project("import");
    let legacy = format!("sk_live_{}", &uuid_like()[..24]);
    let hashed = format!("sk_live_{}", &uuid_like()[..24]);
    let sha256: String = hmac_sha256::Hash::hash(hashed.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let entries = [
        ImportKey::from_key(&legacy, &project, "big")
            .name("legacy")
            .meta(json!({ "customer": "cus_42" })),
        ImportKey::from_sha256(sha256, &hashed[..10], &project, "big"),
    ];
    let first = admin().import_keys(&entries).await.unwrap();
    assert_eq!(
        first
            .iter()
            .map(|k| (k.prefix.as_str(), k.status))
            .collect::<Vec<_>>(),
        [
            (&legacy[..12], ImportStatus::Created),
            (&hashed[..10], ImportStatus::Created)
        ]
    );

    // The integrator keeps its key: it works through the gateway from the answer on.
    let c = key_client(&legacy);
    let me = c.me().await.unwrap();
    assert_eq!(
        (me.project.as_str(), me.prefix.as_str()),
        (project.as_str(), &legacy[..12])
    );
    let ik = format!("rs-order-{}", uuid_like());
    let order = || {
        c.request(
            Method::POST,
            "/rs/orders",
            Body::from(json!({ "n": 1 })),
            RequestOptions::default().idempotency_key(&ik),
        )
    };
    let (made, again) = (order().await.unwrap(), order().await.unwrap());
    assert_eq!(
        (made.status, made.replayed(), again.status, again.replayed()),
        (201, false, 201, true)
    );
    let get = c
        .request(
            Method::GET,
            "/rs/items/1",
            Body::Empty,
            RequestOptions::default(),
        )
        .await
        .unwrap();
    assert_eq!(get.status, 200);
    // An old client sending no key: forwarded until idempotency.required_from, and told so.
    let keyless = c
        .request(
            Method::POST,
            "/rs/orders",
            Body::from(json!({ "n": 2 })),
            RequestOptions::default().without_idempotency_key(),
        )
        .await
        .unwrap();
    assert_eq!(keyless.status, 201);
    assert_eq!(
        keyless.header("postguard-idempotency-key-required-from"),
        Some(env("POSTGUARD_REQUIRED_FROM").as_str())
    );
    let by_hash = key_client(&hashed)
        .request(
            Method::GET,
            "/rs/items/2",
            Body::Empty,
            RequestOptions::default(),
        )
        .await
        .unwrap();
    assert_eq!(
        by_hash.status, 200,
        "the key imported by its hash works too"
    );

    // The export re-run (after a timeout, say): nothing changes, the same ids.
    let rerun = admin().import_keys(&entries).await.unwrap();
    assert!(rerun.iter().all(|k| k.status == ImportStatus::Exists));
    assert_eq!(
        rerun.iter().map(|k| &k.id).collect::<Vec<_>>(),
        first.iter().map(|k| &k.id).collect::<Vec<_>>()
    );

    // POST 201, its replay, GET 200, keyless POST 201: 4 requests, 3 forwarded, 3 billable,
    // 1 replay. The audit rows are written after each answer: poll.
    let hourly = UsageQuery::default().granularity(Granularity::Hour);
    let mine = poll(
        "the usage of four requests",
        Duration::from_secs(20),
        || {
            let (c, q, prefix) = (&c, &hourly, &me.prefix);
            async move {
                let rows: Vec<Usage> = c
                    .usage(q)
                    .await
                    .ok()?
                    .into_iter()
                    .filter(|u| &u.key_prefix == prefix)
                    .collect();
                (sums(&rows)[0] == 4).then_some(rows)
            }
        },
    )
    .await;
    assert_eq!(sums(&mine), [4, 3, 3, 1, 0]);
    assert!(mine
        .iter()
        .all(|u| u.project == project && u.period_start % 3_600_000 == 0));
    let stats = poll("keys_missing_idempotency", Duration::from_secs(20), || {
        let c = &c;
        async move {
            let s = c.stats(1).await.ok()?;
            (!s.keys_missing_idempotency.is_empty()).then_some(s)
        }
    })
    .await;
    assert_eq!(
        stats
            .keys_missing_idempotency
            .iter()
            .map(|k| (k.key_prefix.as_str(), k.requests))
            .collect::<Vec<_>>(),
        [(me.prefix.as_str(), 1)]
    );
    assert_eq!(
        stats
            .days
            .iter()
            .map(|d| d.missing_idempotency_key)
            .sum::<u64>(),
        1
    );
    let rows: Vec<_> = c
        .audit(&[("idempotency_key", ik.as_str())])
        .try_collect()
        .await
        .unwrap();
    let row = rows
        .iter()
        .find(|r| !r.replayed)
        .expect("the order's audit row (written before its replay was answered)");
    assert_eq!(
        (row.origin.as_deref(), row.would_refuse.as_deref()),
        (Some("default"), None)
    );

    // The operator: the project's keys by day, both imported keys.
    let daily = UsageQuery::default()
        .project(&project)
        .granularity(Granularity::Day);
    let by_day = poll(
        "both keys in the operator's usage",
        Duration::from_secs(20),
        || {
            let q = &daily;
            async move {
                let rows = admin().usage(q).await.ok()?;
                (sums(&rows)[0] == 5).then_some(rows)
            }
        },
    )
    .await;
    let mut prefixes: Vec<_> = by_day.iter().map(|u| u.key_prefix.as_str()).collect();
    prefixes.sort_unstable();
    prefixes.dedup();
    let mut want = [&legacy[..12], &hashed[..10]];
    want.sort_unstable();
    assert_eq!(prefixes, want);
    assert!(by_day.iter().all(|u| u.period_start % 86_400_000 == 0));
    println!("FIGURE import-usage: 2 keys imported then exists; usage {:?} (requests, admitted, billable, replays, refused)", sums(&mine));
}

#[tokio::test]
#[ignore = "needs the gateway: run from tests/sdk-rust.test.mjs"]
async fn a_subscription_created_with_a_moved_secret_delivers_signed_with_it() {
    // The secret a receiver already verifies with (whsec_ + base64 of 32 bytes).
    const MOVED: &str = "whsec_i6NNLHpPlCDS0PeER094/ryR5ZFTBSGLpUNuM1uU9N4=";
    let client = key_client(&new_key("big").await);
    let publisher = key_client(&env("POSTGUARD_ORIGIN_TOKEN"));
    let sub = client
        .create_webhook(
            &NewSubscription::new(
                format!("{}/rust-moved", env("POSTGUARD_RECEIVER_URL")),
                ["rust.moved"],
            )
            .secret(MOVED),
        )
        .await
        .unwrap();
    assert_eq!(
        sub.secret.as_deref(),
        Some(MOVED),
        "the answer shows the secret it was given"
    );
    let id = publisher
        .publish_event(
            &env("POSTGUARD_PROJECT"),
            "rust.moved",
            &json!({ "n": 1 }),
            None,
        )
        .await
        .unwrap();
    let (body, headers) = captured(&id, 1).await;
    assert_eq!(webhook::verify(&body, &headers, &[MOVED]).unwrap().id, id);
    let other = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    assert!(webhook::verify(&body, &headers, &[other]).is_err());
    client.delete_webhook(&sub.id).await.unwrap();
}

// -------------------------------------------------------------------------------------------
// 8. Ordering keys. Needs the server side: the delivery log must show `ordering_key`.

#[tokio::test]
#[ignore = "needs the gateway: run from tests/sdk-rust.test.mjs"]
async fn ordering_key_publishes_and_the_deliveries_show_it() {
    let project = unique_project("ordering");
    let token = admin()
        .create_key(&project, "big", Some("rust-sdk-ordering"))
        .await
        .unwrap()
        .key
        .expect("the key is shown on create");
    let client = key_client(&token);
    let publisher = key_client(&env("POSTGUARD_ORIGIN_TOKEN"));
    client
        .create_webhook(&NewSubscription::new(
            format!("{}/rust-ordering/{project}", env("POSTGUARD_RECEIVER_URL")),
            ["order.*"],
        ))
        .await
        .unwrap();
    let key = format!("order-{}", &uuid_like()[..8]);
    let mut ids = Vec::new();
    for (event_type, n) in [("order.created", 1), ("order.paid", 2)] {
        let event = NewEvent::new(&project, event_type, json!({ "n": n })).ordering_key(&key);
        ids.push(publisher.publish(&event).await.unwrap());
    }
    assert!(ids.iter().all(|id| id.starts_with("evt_")), "{ids:?}");
    assert_ne!(ids[0], ids[1]);
    // The deliveries are stored before the 202: listed at once, one per event.
    for id in &ids {
        let page = client
            .list_deliveries(&[("event_id", id.as_str())], None)
            .await
            .unwrap();
        assert_eq!(page.data.len(), 1, "one delivery of {id}: {:?}", page.data);
        let d = &page.data[0];
        assert_eq!(d.ordering_key.as_deref(), Some(key.as_str()), "{d:?}");
        assert!(
            d.blocked_by
                .as_deref()
                .is_none_or(|b| b.starts_with("dlv_")),
            "{d:?}"
        );
    }
}
