//! The client's real retry loop on a fake clock, against a scripted local HTTP server:
//! the waits follow the rule (Retry-After as the floor), the Idempotency-Key is the same on
//! every attempt, final answers are not retried. Runs with a plain `cargo test`.

// Test code: a failed step should stop the test with its message.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use postguard_client::clock::{Clock, Random, Sleep};
use postguard_client::{
    Body, Client, Error, IdempotencyState, ImportKey, KeyUpdate, Method, NewKey, RequestOptions,
    RetryPolicy,
};
use serde_json::json;

/// Time moves only when the client sleeps; every sleep is recorded and returns at once.
#[derive(Default)]
struct FakeClock {
    now: Mutex<Duration>,
    sleeps: Mutex<Vec<Duration>>,
}
impl Clock for FakeClock {
    fn now(&self) -> Duration {
        *self.now.lock().unwrap()
    }
    fn unix_now(&self) -> Duration {
        Duration::from_secs(1_800_000_000) + self.now()
    }
    fn sleep(&self, d: Duration) -> Sleep {
        *self.now.lock().unwrap() += d;
        self.sleeps.lock().unwrap().push(d);
        Box::pin(std::future::ready(()))
    }
}

struct NoJitter;
impl Random for NoJitter {
    fn unit(&self) -> f64 {
        0.0
    }
}

/// One scripted answer: status (0 = close without answering), extra headers, body.
type Reply = (u16, Vec<(&'static str, String)>, String);

fn problem(status: u16, code: &str, retry_after: Option<u64>) -> Reply {
    let mut headers = vec![("content-type", "application/problem+json".to_owned())];
    if let Some(ra) = retry_after {
        headers.push(("retry-after", ra.to_string()));
    }
    let body = json!({"type": "about:blank", "title": code, "status": status, "detail": format!("{code} detail"),
                      "code": code, "request_id": "req_01JD0000000000000000000000"});
    (status, headers, body.to_string())
}

fn ok(status: u16) -> Reply {
    (
        status,
        vec![("content-type", "application/json".to_owned())],
        "{\"ok\":true}".to_owned(),
    )
}

/// A server answering each request with the next reply; returns its URL and the request
/// heads it saw (lower-cased header lines).
fn serve(replies: Vec<Reply>) -> (String, Arc<Mutex<Vec<Vec<String>>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&seen);
    std::thread::spawn(move || {
        for (stream, (status, headers, body)) in listener.incoming().zip(replies) {
            let mut stream = stream.unwrap();
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut head = Vec::new();
            let mut length = 0;
            loop {
                let mut line = String::new();
                reader.read_line(&mut line).unwrap();
                let line = line.trim_end().to_ascii_lowercase();
                if line.is_empty() {
                    break;
                }
                if let Some(v) = line.strip_prefix("content-length:") {
                    length = v.trim().parse().unwrap();
                }
                head.push(line);
            }
            let mut req_body = vec![0; length];
            reader.read_exact(&mut req_body).unwrap();
            log.lock().unwrap().push(head);
            if status == 0 {
                continue; // the answer is lost: the connection closes without one
            }
            let mut out = format!(
                "HTTP/1.1 {status} X\r\nconnection: close\r\ncontent-length: {}\r\n",
                body.len()
            );
            for (k, v) in headers {
                out.push_str(&format!("{k}: {v}\r\n"));
            }
            out.push_str("\r\n");
            out.push_str(&body);
            stream.write_all(out.as_bytes()).unwrap();
        }
    });
    (url, seen)
}

fn client(url: &str, clock: &Arc<FakeClock>, max_attempts: u32) -> Client {
    Client::builder(url)
        .token("pgk_test")
        .clock(Arc::clone(clock) as Arc<dyn Clock>)
        .random(Arc::new(NoJitter))
        .retry(RetryPolicy {
            max_attempts,
            base_delay: Duration::from_millis(100),
            ..RetryPolicy::default()
        })
        .build()
        .unwrap()
}

fn header<'a>(head: &'a [String], name: &str) -> Option<&'a str> {
    head.iter()
        .find_map(|l| l.strip_prefix(&format!("{name}:")).map(str::trim))
}

#[tokio::test]
async fn retries_keep_the_key_and_wait_at_least_retry_after() {
    let (url, seen) = serve(vec![
        (503, vec![], "busy".to_owned()),
        problem(429, "RATE_LIMIT_EXCEEDED", Some(2)),
        problem(409, "IDEMPOTENCY_KEY_IN_PROGRESS", Some(1)),
        ok(201),
    ]);
    let clock = Arc::new(FakeClock::default());
    let res = client(&url, &clock, 5)
        .request(
            Method::POST,
            "/payments",
            Body::from(json!({"a": 1})),
            RequestOptions::default(),
        )
        .await
        .unwrap();
    assert_eq!((res.status, res.attempts), (201, 4));
    let sleeps = clock.sleeps.lock().unwrap().clone();
    // 100 ms · 2^0; max(2 s, 100 ms) · 2^1; max(1 s, 100 ms) · 2^2 (no jitter drawn).
    assert_eq!(
        sleeps,
        [
            Duration::from_millis(100),
            Duration::from_secs(4),
            Duration::from_secs(4)
        ]
    );
    let seen = seen.lock().unwrap();
    let keys: Vec<_> = seen
        .iter()
        .map(|h| header(h, "idempotency-key").unwrap())
        .collect();
    assert_eq!(keys.len(), 4);
    assert!(
        keys.iter().all(|k| *k == keys[0]),
        "one key for the whole call: {keys:?}"
    );
    assert_eq!(res.idempotency_key.as_deref(), Some(keys[0]));
    assert!(uuid::Uuid::parse_str(keys[0]).is_ok_and(|u| u.get_version_num() == 4));
    assert!(header(&seen[0], "user-agent")
        .unwrap()
        .starts_with("postguard-client-rust/"));
    assert_eq!(header(&seen[0], "authorization"), Some("bearer pgk_test"));
}

#[tokio::test]
async fn final_answers_are_not_retried_and_carry_the_problem() {
    let (url, _) = serve(vec![problem(400, "VALIDATION_ERROR", None)]);
    let clock = Arc::new(FakeClock::default());
    let e = client(&url, &clock, 5)
        .request(Method::POST, "/x", Body::Empty, RequestOptions::default())
        .await
        .unwrap_err();
    assert_eq!((e.status(), e.code()), (Some(400), "VALIDATION_ERROR"));
    assert_eq!(e.request_id(), Some("req_01JD0000000000000000000000"));
    assert_eq!(
        e.problem().unwrap().detail.as_deref(),
        Some("VALIDATION_ERROR detail")
    );
    assert!(clock.sleeps.lock().unwrap().is_empty());

    let (url, _) = serve(vec![problem(422, "IDEMPOTENCY_KEY_REUSE_CONFLICT", None)]);
    let e = client(&url, &clock, 5)
        .request(
            Method::POST,
            "/x",
            Body::Empty,
            RequestOptions::default().idempotency_key("k-1"),
        )
        .await
        .unwrap_err();
    let Error::IdempotencyKeyReuseConflict(p) = e else {
        panic!("{e:?}")
    };
    assert_eq!(
        (p.status, p.attempts, p.idempotency_key.as_deref()),
        (422, 1, Some("k-1"))
    );
}

#[tokio::test]
async fn attempts_are_bounded_and_gets_carry_no_key() {
    let (url, seen) = serve(vec![
        (502, vec![], String::new()),
        (504, vec![], String::new()),
        (503, vec![], String::new()),
    ]);
    let clock = Arc::new(FakeClock::default());
    let e = client(&url, &clock, 3)
        .request(
            Method::GET,
            "/things",
            Body::Empty,
            RequestOptions::default(),
        )
        .await
        .unwrap_err();
    assert_eq!((e.status(), e.problem().unwrap().attempts), (Some(503), 3));
    assert_eq!(clock.sleeps.lock().unwrap().len(), 2);
    assert!(seen
        .lock()
        .unwrap()
        .iter()
        .all(|h| header(h, "idempotency-key").is_none()));
}

#[tokio::test]
async fn a_retry_after_beyond_the_cap_is_not_waited_for() {
    let (url, _) = serve(vec![problem(429, "RATE_LIMIT_EXCEEDED", Some(120))]);
    let clock = Arc::new(FakeClock::default());
    let e = client(&url, &clock, 5)
        .request(Method::POST, "/x", Body::Empty, RequestOptions::default())
        .await
        .unwrap_err();
    let p = e.problem().unwrap();
    assert_eq!(
        (p.status, p.attempts, p.retry_after),
        (429, 1, Some(Duration::from_secs(120)))
    );
    assert!(clock.sleeps.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_lost_answer_is_retried_with_the_same_key() {
    let (url, seen) = serve(vec![(0, vec![], String::new()), ok(201)]);
    let clock = Arc::new(FakeClock::default());
    let res = client(&url, &clock, 5)
        .request(
            Method::PUT,
            "/things/1",
            Body::from(json!({"a": 1})),
            RequestOptions::default(),
        )
        .await
        .unwrap();
    assert_eq!((res.status, res.attempts), (201, 2));
    let seen = seen.lock().unwrap();
    assert_eq!(
        header(&seen[0], "idempotency-key"),
        header(&seen[1], "idempotency-key")
    );
    assert_eq!(*clock.sleeps.lock().unwrap(), [Duration::from_millis(100)]);
}

#[tokio::test]
async fn a_path_cannot_send_the_token_elsewhere() {
    let clock = Arc::new(FakeClock::default());
    let c = client("http://127.0.0.1:9/api/", &clock, 1);
    // ("//host/x" and "http:x" resolve relative to the base URL: they stay on it.)
    for path in [
        "https://elsewhere.example/x",
        "ftp://127.0.0.1:9/api/",
        "HTTP://127.0.0.1:10/",
    ] {
        let e = c
            .request(Method::GET, path, Body::Empty, RequestOptions::default())
            .await
            .unwrap_err();
        assert!(matches!(e, Error::Invalid(_)), "{path}: {e:?}");
    }
}

// -------------------------------------------------------------------------------------------
// Issue 23 item 1: a mutating call is retried only when it carries an Idempotency-Key.

#[tokio::test]
async fn a_mutating_call_without_a_key_is_not_retried_after_a_lost_answer() {
    let clock = Arc::new(FakeClock::default());
    let (url, seen) = serve(vec![(0, vec![], String::new()), ok(200)]);
    let e = client(&url, &clock, 5)
        .request(
            Method::PATCH,
            "/orders/1",
            Body::from(json!({"a": 1})),
            RequestOptions::default().without_idempotency_key(),
        )
        .await
        .unwrap_err();
    let Error::Transport {
        attempts,
        idempotency_key,
        ..
    } = e
    else {
        panic!("{e:?}")
    };
    assert_eq!((attempts, idempotency_key), (1, None));
    assert_eq!(seen.lock().unwrap().len(), 1, "one attempt only");
    assert!(header(&seen.lock().unwrap()[0], "idempotency-key").is_none());

    let (url, seen) = serve(vec![problem(503, "ORIGIN_UNREACHABLE", None), ok(200)]);
    let e = client(&url, &clock, 5)
        .request(
            Method::DELETE,
            "/orders/1",
            Body::Empty,
            RequestOptions::default().without_idempotency_key(),
        )
        .await
        .unwrap_err();
    assert_eq!((e.status(), e.problem().unwrap().attempts), (Some(503), 1));
    assert_eq!(seen.lock().unwrap().len(), 1);

    // 429 was not executed: retried even without a key.
    let (url, _) = serve(vec![problem(429, "RATE_LIMIT_EXCEEDED", Some(1)), ok(200)]);
    let res = client(&url, &clock, 5)
        .request(
            Method::DELETE,
            "/orders/1",
            Body::Empty,
            RequestOptions::default().without_idempotency_key(),
        )
        .await
        .unwrap();
    assert_eq!(res.attempts, 2);
    assert!(res.idempotency_key.is_none(), "no key was sent");
}

/// A body every typed answer deserialises from (unknown fields are ignored).
fn any_resource() -> Reply {
    let body = json!({"id": "x_1", "prefix": "pgk_x", "project": "p", "plan": "trial", "name": null,
        "created_at": 1, "revoked_at": null, "key": "pgk_x", "url": "https://r.example/h", "events": ["*"],
        "description": null, "secret": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "expires_at": 2,
        "previous_expires_at": 3, "data": []});
    (
        201,
        vec![("content-type", "application/json".to_owned())],
        body.to_string(),
    )
}

#[tokio::test]
async fn every_mutating_gateway_call_carries_one_key_and_is_retried_after_a_lost_answer() {
    use postguard_client::api::NewSubscription;
    // A struct literal still works with the fields added since (`..Default::default()`).
    let sub = NewSubscription {
        url: "https://r.example/h".into(),
        events: vec!["*".into()],
        ..NewSubscription::default()
    };
    let names = [
        "create_key",
        "create_key_from",
        "import_keys",
        "update_key",
        "reroll_key",
        "revoke_key",
        "create_portal_link",
        "create_webhook",
        "delete_webhook",
        "rotate_webhook_secret",
        "retry_delivery",
        "redirect_delivery",
    ];
    for name in names {
        let (url, seen) = serve(vec![
            (0, vec![], String::new()),
            problem(502, "ORIGIN_UNREACHABLE", None),
            any_resource(),
        ]);
        let clock = Arc::new(FakeClock::default());
        let c = client(&url, &clock, 5);
        let done = match name {
            "create_key" => c.create_key("p", "trial", None).await.map(drop),
            "create_key_from" => c
                .create_key_from(&NewKey::new("p", "trial").expires_at(9))
                .await
                .map(drop),
            "import_keys" => c
                .import_keys(&[ImportKey::from_key(
                    "sk_live_4eC39HqLyjWDarjtT1zdp7dc",
                    "p",
                    "trial",
                )])
                .await
                .map(drop),
            "update_key" => c
                .update_key("key_1", &KeyUpdate::default().plan("pro"))
                .await
                .map(drop),
            "reroll_key" => c.reroll_key("key_1", Some(60)).await.map(drop),
            "revoke_key" => c.revoke_key("key_1").await,
            "create_portal_link" => c.create_portal_link("p", None).await.map(drop),
            "create_webhook" => c.create_webhook(&sub).await.map(drop),
            "delete_webhook" => c.delete_webhook("sub_1").await,
            "rotate_webhook_secret" => c.rotate_webhook_secret("sub_1").await.map(drop),
            "retry_delivery" => c.retry_delivery("dlv_1").await.map(drop),
            _ => c
                .redirect_delivery("dlv_1", "https://r.example/x")
                .await
                .map(drop),
        };
        done.unwrap_or_else(|e| panic!("{name}: {e}"));
        let seen = seen.lock().unwrap();
        assert_eq!(
            seen.len(),
            3,
            "{name}: retried after a lost answer and a 502"
        );
        let keys: Vec<_> = seen.iter().map(|h| header(h, "idempotency-key")).collect();
        assert!(keys[0].is_some(), "{name} sends a key");
        assert!(keys.iter().all(|k| *k == keys[0]), "{name}: {keys:?}");
    }
    // The caller's own key, through the `_with` twins.
    let (url, seen) = serve(vec![any_resource()]);
    let clock = Arc::new(FakeClock::default());
    let opts = RequestOptions::default().idempotency_key("onboard-p");
    client(&url, &clock, 5)
        .create_key_with("p", "trial", None, opts)
        .await
        .unwrap();
    assert_eq!(
        header(&seen.lock().unwrap()[0], "idempotency-key"),
        Some("onboard-p")
    );
}

#[tokio::test]
async fn a_key_given_as_a_header_is_the_calls_key_and_sent_once() {
    let (url, seen) = serve(vec![(0, vec![], String::new()), ok(201)]);
    let clock = Arc::new(FakeClock::default());
    let res = client(&url, &clock, 5)
        .request(
            Method::POST,
            "/orders",
            Body::from(json!({})),
            RequestOptions::default().header("Idempotency-Key", "order-42"),
        )
        .await
        .unwrap();
    assert_eq!(res.idempotency_key.as_deref(), Some("order-42"));
    let seen = seen.lock().unwrap();
    for head in seen.iter() {
        let keys: Vec<_> = head
            .iter()
            .filter(|l| l.starts_with("idempotency-key:"))
            .collect();
        assert_eq!(
            keys,
            ["idempotency-key: order-42"],
            "one key header per attempt"
        );
    }
    assert_eq!(seen.len(), 2);
}

// -------------------------------------------------------------------------------------------
// Issue 23 item 9: the client's Debug shows no secret.

#[test]
fn debug_of_the_client_and_its_builder_shows_no_token() {
    const TOKEN: &str = "pgk_Zx81mQv0Lr5Tn2Wc7Ye4Ua9Ib3Od6Pf1Gh8Jk0Sl5M";
    let builder = Client::builder("https://api.example.com").token(TOKEN);
    let shown_builder = [format!("{builder:?}"), format!("{builder:#?}")];
    let client = builder.build().unwrap();
    let shown = [
        format!("{client:?}"),
        format!("{client:#?}"),
        format!("{:?}", client.clone()),
    ];
    for text in shown_builder.iter().chain(&shown) {
        assert!(!text.contains(TOKEN), "{text}");
        assert!(!text.contains(&TOKEN[4..20]), "{text}");
        assert!(text.contains("api.example.com"), "{text}");
        assert!(text.contains("<redacted>"), "says a token is set: {text}");
    }
    let anonymous = Client::builder("https://api.example.com").build().unwrap();
    assert!(format!("{anonymous:?}").contains("token: None"));
}

// --- keys & limits (issue 25) ---------------------------------------------------------------

/// A 429 quota refusal as the gateway sends it: the draft's problem type, the violated
/// policies, `Retry-After` and the rate-limit lists.
fn quota(code: &str, violated: &[&str], retry_after: u64, ratelimit: &str) -> Reply {
    let body = json!({"type": "https://iana.org/assignments/http-problem-types#quota-exceeded",
        "title": "Too many", "status": 429, "code": code, "violated-policies": violated,
        "request_id": "req_01JD0000000000000000000000"});
    let headers = vec![
        ("content-type", "application/problem+json".to_owned()),
        ("retry-after", retry_after.to_string()),
        ("ratelimit", ratelimit.to_owned()),
        (
            "ratelimit-policy",
            "\"minute\";q=30;w=60, \"inflight\";q=1;qu=\"concurrent-requests\"".to_owned(),
        ),
    ];
    (429, headers, body.to_string())
}

#[tokio::test]
async fn an_expired_key_is_its_own_variant_and_not_retried() {
    let (url, seen) = serve(vec![problem(401, "API_KEY_EXPIRED", None), ok(200)]);
    let clock = Arc::new(FakeClock::default());
    let e = client(&url, &clock, 5)
        .request(Method::POST, "/x", Body::Empty, RequestOptions::default())
        .await
        .unwrap_err();
    let Error::ApiKeyExpired(p) = &e else {
        panic!("{e:?}")
    };
    assert_eq!((p.status, p.attempts), (401, 1));
    assert_eq!(e.code(), "API_KEY_EXPIRED");
    assert_eq!(seen.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn a_concurrency_refusal_is_rate_limited_and_retried_after_retry_after() {
    let refused = || {
        quota(
            "CONCURRENCY_LIMIT_EXCEEDED",
            &["inflight"],
            1,
            "\"inflight\";r=0, \"minute\";r=30;t=60",
        )
    };
    let (url, seen) = serve(vec![refused(), ok(201)]);
    let clock = Arc::new(FakeClock::default());
    let res = client(&url, &clock, 5)
        .request(
            Method::POST,
            "/slow",
            Body::from(json!({"n": 1})),
            RequestOptions::default(),
        )
        .await
        .unwrap();
    assert_eq!((res.status, res.attempts), (201, 2));
    assert_eq!(*clock.sleeps.lock().unwrap(), [Duration::from_secs(1)]);
    {
        let seen = seen.lock().unwrap();
        assert_eq!(
            header(&seen[0], "idempotency-key"),
            header(&seen[1], "idempotency-key")
        );
    }
    // Every attempt refused: the typed error names the policies.
    let (url, _) = serve(vec![refused(), refused()]);
    let e = client(&url, &Arc::new(FakeClock::default()), 2)
        .request(
            Method::POST,
            "/slow",
            Body::Empty,
            RequestOptions::default(),
        )
        .await
        .unwrap_err();
    let Error::RateLimited(p) = &e else {
        panic!("{e:?}")
    };
    assert_eq!(p.code.as_deref(), Some("CONCURRENCY_LIMIT_EXCEEDED"));
    assert_eq!(p.violated_policies, ["inflight"]);
    assert_eq!(p.policy.as_deref(), Some("inflight"));
    assert_eq!(
        (p.attempts, p.retry_after),
        (2, Some(Duration::from_secs(1)))
    );
}

#[tokio::test]
async fn a_window_refusal_names_the_binding_policy_and_the_limiter_waits_for_it() {
    let (url, _) = serve(vec![quota(
        "RATE_LIMIT_EXCEEDED",
        &["minute"],
        42,
        "\"minute\";r=0;t=42, \"burst\";r=3;t=1",
    )]);
    let clock = Arc::new(FakeClock::default());
    let c = client(&url, &clock, 1);
    let e = c
        .request(Method::GET, "/x", Body::Empty, RequestOptions::default())
        .await
        .unwrap_err();
    let p = e.problem().unwrap();
    assert!(matches!(e, Error::RateLimited(_)));
    assert_eq!(
        (p.violated_policies.as_slice(), p.policy.as_deref()),
        (&["minute".to_owned()][..], Some("minute"))
    );
    assert_eq!(
        c.limiter_state().available(),
        Some(0),
        "the window is spent"
    );
}

#[tokio::test]
async fn the_lookup_is_a_get_of_the_encoded_key_and_no_call_to_the_gateway_waits_for_the_api_budget(
) {
    let spent = || {
        (
            201,
            vec![
                ("content-type", "application/json".to_owned()),
                ("ratelimit", "\"default\";r=0;t=60".to_owned()),
                ("ratelimit-policy", "\"default\";q=10;w=60".to_owned()),
            ],
            "{}".to_owned(),
        )
    };
    let lookup = (
        200,
        vec![
            ("content-type", "application/json".to_owned()),
            ("ratelimit", "\"gateway\";r=119;t=60".to_owned()),
            ("ratelimit-policy", "\"gateway\";q=120;w=60".to_owned()),
        ],
        r#"{"state":"completed","status":201,"request_id":"req_1","created_at":1,"expires_at":2}"#
            .to_owned(),
    );
    let (url, seen) = serve(vec![spent(), lookup, spent()]);
    let clock = Arc::new(FakeClock::default());
    let c = Client::builder(&url)
        .token("pgk_test")
        .clock(Arc::clone(&clock) as Arc<dyn Clock>)
        .throttle(postguard_client::ThrottleConfig {
            threshold: Some(0),
            ..Default::default()
        })
        .build()
        .unwrap();
    c.request(
        Method::POST,
        "/orders",
        Body::Empty,
        RequestOptions::default(),
    )
    .await
    .unwrap();
    let status = c.status("a/b").await.unwrap();
    assert_eq!(status.state, IdempotencyState::Completed);
    assert_eq!(status.request_id.as_deref(), Some("req_1"));
    assert!(
        clock.sleeps.lock().unwrap().is_empty(),
        "the lookup did not wait for the API window"
    );
    {
        let seen = seen.lock().unwrap();
        assert!(
            seen[1][0].starts_with("get /_postguard/v1/idempotency/a%2fb "),
            "{:?}",
            seen[1][0]
        );
        assert!(header(&seen[1], "idempotency-key").is_none());
    }
    // The gateway policy's 119 did not refill the API budget: a proxied call waits.
    c.request(
        Method::POST,
        "/orders",
        Body::Empty,
        RequestOptions::default(),
    )
    .await
    .unwrap();
    let waited: Duration = clock.sleeps.lock().unwrap().iter().sum();
    assert!(waited >= Duration::from_secs(59), "{waited:?}");
}

#[tokio::test]
async fn import_keys_and_usage_send_what_they_say_and_return_the_data() {
    use postguard_client::{Granularity, ImportStatus, UsageQuery};
    let imported = json!({"data": [{"id": "key_1", "prefix": "sk_live_4eC3", "status": "created"},
                                   {"id": "key_2", "prefix": "sk_live_9f", "status": "exists"}]});
    let usage = json!({"data": [{"key_prefix": "sk_live_4eC3", "project": "acme", "period_start": 1_796_083_200_000_u64,
        "requests": 7, "admitted": 5, "billable": 3, "replays": 1, "refused": 0}]});
    let json_reply = |v: &serde_json::Value| {
        (
            200,
            vec![("content-type", "application/json".to_owned())],
            v.to_string(),
        )
    };
    let (url, seen) = serve(vec![json_reply(&imported), json_reply(&usage)]);
    let clock = Arc::new(FakeClock::default());
    let c = client(&url, &clock, 5);
    let got = c
        .import_keys(&[
            ImportKey::from_key("sk_live_4eC39HqLyjWDarjtT1zdp7dc", "acme", "business"),
            ImportKey::from_sha256("a".repeat(64), "sk_live_9f", "acme", "trial"),
        ])
        .await
        .unwrap();
    assert_eq!(
        got.iter()
            .map(|k| (k.id.as_str(), k.status))
            .collect::<Vec<_>>(),
        [
            ("key_1", ImportStatus::Created),
            ("key_2", ImportStatus::Exists)
        ]
    );
    let rows = c
        .usage(
            &UsageQuery::default()
                .since(1_796_083_200_000)
                .granularity(Granularity::Hour)
                .project("acme"),
        )
        .await
        .unwrap();
    assert_eq!((rows[0].billable, rows[0].replays), (3, 1));
    let seen = seen.lock().unwrap();
    assert_eq!(seen[0][0], "post /_postguard/v1/keys/import http/1.1");
    assert!(
        header(&seen[0], "idempotency-key").is_some(),
        "an import carries a key"
    );
    assert_eq!(
        seen[1][0],
        "get /_postguard/v1/usage?since=1796083200000&granularity=hour&project=acme http/1.1"
    );
    assert!(
        header(&seen[1], "idempotency-key").is_none(),
        "a read carries none"
    );
}
