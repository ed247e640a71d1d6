//! Sending one signed request to a receiver (docs/webhooks.md): the consumer's
//! attempts and the test ping. Signing is `postguard_core::webhooks::signature`.

use postguard_core::config::Config;
use postguard_core::webhooks::events::excerpt;
use postguard_core::webhooks::retry::AttemptResult;
use postguard_core::webhooks::signature;
use postguard_core::webhooks::{fanout, ops, trace};
use worker::wasm_bindgen::JsValue;
use worker::{web_sys, Result};

use crate::http;
use crate::runtime::within;

/// How much of a response body the log keeps.
pub const EXCERPT_CHARS: usize = 512;

/// A receiver's answer: status, Retry-After, its headers (as received)
/// and the start of its body.
pub struct Answer {
    pub status: u16,
    pub retry_after: Option<String>,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

/// POSTs one attempt; `None` when no answer came within `timeout_ms` (the
/// request is aborted).
pub async fn send(
    url: &str,
    body: &[u8],
    headers: &[(&str, &str)],
    timeout_ms: u64,
) -> Option<Result<Answer>> {
    let prepared = (|| {
        let h = web_sys::Headers::new()?;
        for (k, v) in headers {
            h.set(k, v)?;
        }
        let controller = web_sys::AbortController::new()?;
        let init = http::request_init("POST", body);
        init.set_headers(&h);
        init.set_redirect(web_sys::RequestRedirect::Manual);
        init.set_signal(Some(&controller.signal()));
        Ok::<_, JsValue>((controller, init))
    })();
    let (controller, init) = match prepared {
        Ok(p) => p,
        Err(e) => return Some(Err(e.into())),
    };
    let attempt = async {
        let resp = http::raw_fetch(&worker::js_sys::global(), url, &init).await?;
        let retry_after = resp.headers().get("Retry-After").ok().flatten();
        let headers = http::raw_header_pairs(&resp.headers());
        let bytes = http::read_prefix(&resp, fanout::MAX_RESPONSE_READ_BYTES)
            .await
            .unwrap_or_default();
        Ok(Answer {
            status: resp.status(),
            retry_after,
            headers,
            body: bytes,
        })
    };
    let out = within(timeout_ms, attempt).await;
    if out.is_none() {
        controller.abort();
    }
    out
}

/// A subscription's signing secrets.
pub struct Secrets<'a> {
    pub secret: Option<&'a str>,
    pub previous: Option<&'a str>,
    pub previous_until: Option<u64>,
}

/// One signed request to make: the event and where to.
pub struct Outgoing<'a> {
    pub event_id: &'a str,
    pub event_type: &'a str,
    pub payload: &'a [u8],
    pub secrets: Secrets<'a>,
}

/// What one signed attempt came to: its result, error text and response
/// excerpt, and what its record keeps of the headers (`webhooks::trace`).
pub struct Sent {
    pub result: AttemptResult,
    pub error: Option<String>,
    pub excerpt: Option<String>,
    /// The request's timestamp and redacted signature (`None`: not sent).
    pub signed: Option<trace::Signed>,
    /// The response's headers, bounded (`None`: no answer).
    pub response_headers: Option<Vec<(String, String)>>,
}

impl Sent {
    fn failed(result: AttemptResult, error: String, signed: Option<trace::Signed>) -> Sent {
        Sent {
            result,
            error: Some(error),
            excerpt: None,
            signed,
            response_headers: None,
        }
    }
}

/// Signs and POSTs attempt `number` with the headers of `trace::request_headers`.
pub async fn sign_and_send(
    cfg: &Config,
    t: &Outgoing<'_>,
    url: &str,
    number: u32,
    request_id: &str,
    now: u64,
) -> Result<Sent> {
    // The URL rules once more, right before the request goes out: whatever
    // accepted the URL earlier (a subscription, a redirect), the rules of the
    // configuration now — with only the configured public URL's capture URLs
    // exempt — decide. A refused URL is not sent: a failed attempt, on the
    // schedule like a network error.
    let policy = super::policy(cfg);
    if let Err(why) = ops::check_target_url(url, cfg.settings.public_origin(), &policy) {
        let error = format!("not sent: the URL rules refuse it ({})", &*why);
        return Ok(Sent::failed(AttemptResult::NetworkError, error, None));
    }
    let timestamp = now / 1000;
    let mut secrets: Vec<&str> = t.secrets.secret.into_iter().collect();
    if let (Some(prev), Some(until)) = (t.secrets.previous, t.secrets.previous_until) {
        if now < until {
            secrets.push(prev);
        }
    }
    let body = t.payload;
    let sig = signature::signature_header(&secrets, t.event_id, timestamp, body)
        .map_err(|e| worker::Error::RustError(e.to_string()))?;
    let timeout_ms = u64::from(cfg.settings.webhooks.timeout_ms);
    let request = trace::Request {
        event_id: t.event_id,
        event_type: t.event_type,
        attempt: number,
        request_id,
        timestamp,
    };
    let list = trace::request_headers(&request, &sig);
    let headers: Vec<(&str, &str)> = list.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let signed = Some(trace::signed(timestamp, &sig));
    Ok(match send(url, body, &headers, timeout_ms).await {
        None => Sent::failed(
            AttemptResult::Timeout,
            format!("no answer within {timeout_ms} ms"),
            signed,
        ),
        Some(Err(e)) => {
            let msg = e.to_string();
            let error = format!("network error: {}", msg.trim())
                .trim_end_matches(": ")
                .to_string();
            Sent::failed(AttemptResult::NetworkError, error, signed)
        }
        Some(Ok(answer)) => Sent {
            result: AttemptResult::Status {
                code: answer.status,
                retry_after: answer.retry_after,
            },
            error: None,
            excerpt: Some(excerpt(&answer.body, EXCERPT_CHARS)),
            signed,
            response_headers: Some(trace::response_headers(&answer.headers)),
        },
    })
}
