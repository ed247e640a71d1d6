//! Keys not imported yet (docs/live-api.md, `auth.verify_unknown_keys`): a
//! key postguard does not know is asked about once, at the `default`
//! origin, and its answer decides whether the key becomes an imported one.
//!
//! "Once" is the key's own object's doing: it is named by the id the key
//! would have (`ids::imported_key_id`), and [`step`] tells each first
//! request there whether to ask the origin (the lead), wait for the lead's
//! outcome, or take a remembered one. Everything here is decided from
//! inputs; the shell (`src/verify.rs`) does the call.

use serde::{Deserialize, Serialize};

use crate::config::{Config, Settings};
use crate::headers::{origin_signature, Signed};
use crate::key_import::{self, ImportedKey};
use crate::keys::{validate_create, CreateKey};
use crate::problem::{ErrorCode, Problem};
use crate::proxy::OriginRequest;
use crate::{ids, Invalid};

/// The most of the origin's answer read: it is a small JSON object.
pub const MAX_ANSWER_BYTES: u64 = 16 * 1024;
/// How long past the origin's timeout a lead is waited for before another
/// request may lead (its worker may have died mid-call).
pub const LEAD_SLACK_MS: u64 = 5_000;

/// The request that asks the origin about `key`: `POST <ORIGIN_URL><path>`,
/// `{"key": …}`, signed as every forwarded request is (no identity fields:
/// there is no key yet).
pub fn request(
    cfg: &Config,
    path: &str,
    key: &str,
    request_id: &str,
    client_ip: Option<&str>,
    now_s: u64,
) -> OriginRequest {
    let origin = &cfg.origins.default;
    let base = origin.base.path().trim_end_matches('/');
    let origin_path = format!("{base}{path}");
    let body = serde_json::json!({ "key": key }).to_string().into_bytes();
    let content_type = "application/json";
    let signature = origin_signature(
        &cfg.origin_signing_secret,
        &Signed {
            t: now_s,
            request_id,
            method: "POST",
            path_and_query: &origin_path,
            body: &body,
            project: "",
            key_prefix: "",
            plan: "",
            idempotency_key: None,
            content_type: Some(content_type),
            client_ip,
            key_meta: None,
        },
    );
    let mut headers = vec![
        ("Content-Type".to_string(), content_type.to_string()),
        ("X-Request-Id".to_string(), request_id.to_string()),
        ("X-Postguard-Signature".to_string(), signature),
    ];
    if let Some(ip) = client_ip {
        headers.push(("X-Postguard-Client-IP".to_string(), ip.to_string()));
    }
    OriginRequest {
        url: format!(
            "{}{origin_path}",
            origin.base.origin().ascii_serialization()
        ),
        origin: origin.name.clone(),
        timeout_ms: origin.timeout_ms,
        method: "POST".to_string(),
        headers,
        body,
        buffer: true,
    }
}

/// What the origin's answer (or its absence) means.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The origin vouched for the key: store it as this record.
    Valid(Box<ImportedKey>),
    /// 401/403/404: not a key of the API's (the caller is told 401).
    Unknown,
    /// No usable answer: timeout (504), unreachable or an answer that is
    /// neither (502). Not remembered: the next request asks again.
    Failed { timeout: bool, detail: String },
}

/// The body of a 200: what the key is.
#[derive(Debug, Deserialize)]
struct Vouched {
    project: String,
    plan: String,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    meta: Option<serde_json::Value>,
    #[serde(default)]
    expires_at: Option<serde_json::Value>,
}

/// The origin answered `status` with `body` (read up to
/// [`MAX_ANSWER_BYTES`]; `None` when it was longer) about `key`.
pub fn outcome(
    status: u16,
    body: Option<&[u8]>,
    key: &str,
    settings: &Settings,
    id_secret: &[u8],
    now_ms: u64,
) -> Outcome {
    let failed = |detail: String| Outcome::Failed {
        timeout: false,
        detail,
    };
    match status {
        401 | 403 | 404 => return Outcome::Unknown,
        200 => {}
        other => return failed(format!("the origin's key verification answered {other}")),
    }
    let Some(body) = body else {
        return failed(format!(
            "the origin's key verification answered more than {MAX_ANSWER_BYTES} bytes"
        ));
    };
    let vouched = serde_json::from_slice::<Vouched>(body)
        .map_err(|e| {
            Invalid(format!(
                "not {{project, plan, name?, meta?, expires_at?}}: {e}"
            ))
        })
        .and_then(|v| {
            let create = CreateKey {
                project: v.project,
                plan: v.plan,
                name: v.name,
                expires_at: v.expires_at,
                meta: v.meta,
                overrides: None,
            };
            validate_create(create, settings, now_ms)
        });
    match vouched {
        Ok(k) => {
            let prefix = key.chars().take(key_import::MAX_PREFIX_LEN).collect();
            let record = key_import::record(ids::sha256_hex(key), prefix, k, id_secret, now_ms);
            Outcome::Valid(Box::new(record))
        }
        Err(e) => failed(format!(
            "the origin's key verification answer is unusable: {}",
            e.0
        )),
    }
}

impl Outcome {
    /// The problem a request is answered with when the key is not valid.
    pub fn problem(&self) -> Option<Problem> {
        match self {
            Outcome::Valid(_) => None,
            Outcome::Unknown => Some(Problem::new(
                ErrorCode::InvalidApiKey,
                "the API key is not known",
            )),
            Outcome::Failed {
                timeout: true,
                detail,
            } => Some(Problem::new(ErrorCode::OriginTimeout, detail.clone())),
            Outcome::Failed { detail, .. } => {
                Some(Problem::new(ErrorCode::OriginUnreachable, detail.clone()))
            }
        }
    }
}

/// What the key's object remembers about the ask.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Asked {
    /// The origin vouched for the key (kept: a request at another location,
    /// where KV does not show the key yet, is told this instead of asking).
    pub valid: Option<Box<ImportedKey>>,
    /// The origin refused the key: not asked again before this time.
    pub unknown_until: Option<u64>,
    /// A request is asking now; others wait until this time.
    pub lead_until: Option<u64>,
}

/// What one request with the unknown key does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Step {
    /// Ask the origin, then report the outcome (`Verified`).
    Lead,
    /// Another request is asking: wait for its outcome until then (then
    /// ask again).
    Wait { until: u64 },
    /// Already decided.
    Decided(Outcome),
}

/// The step of a request at `now`; a lead's lease is the origin's timeout
/// and [`LEAD_SLACK_MS`].
pub fn step(asked: &Asked, now_ms: u64) -> Step {
    if let Some(k) = &asked.valid {
        return Step::Decided(Outcome::Valid(k.clone()));
    }
    if asked.unknown_until.is_some_and(|t| now_ms < t) {
        return Step::Decided(Outcome::Unknown);
    }
    match asked.lead_until {
        Some(until) if now_ms < until => Step::Wait { until },
        _ => Step::Lead,
    }
}

/// The object's memory after the lead reported `outcome` at `now` (`None`:
/// it gave up before asking — its address was over its limit — and the
/// next request leads).
pub fn settle(asked: &Asked, outcome: Option<&Outcome>, negative_ms: u64, now_ms: u64) -> Asked {
    let Some(outcome) = outcome else {
        return Asked {
            lead_until: None,
            ..asked.clone()
        };
    };
    match outcome {
        Outcome::Valid(k) => Asked {
            valid: Some(k.clone()),
            ..Asked::default()
        },
        Outcome::Unknown => Asked {
            unknown_until: Some(now_ms.saturating_add(negative_ms)),
            ..Asked::default()
        },
        Outcome::Failed { .. } => Asked {
            lead_until: None,
            ..asked.clone()
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_800_000_000_000;
    const KEY: &str = "sk_live_0123456789abcdef";

    fn out(status: u16, body: &str) -> Outcome {
        outcome(
            status,
            Some(body.as_bytes()),
            KEY,
            &Settings::default(),
            b"s",
            NOW,
        )
    }

    #[test]
    fn the_answer_decides() {
        match out(200, r#"{"project":"acme","plan":"trial","name":"legacy"}"#) {
            Outcome::Valid(k) => {
                assert_eq!(k.hash, ids::sha256_hex(KEY));
                assert_eq!(
                    (k.record.prefix.as_str(), k.record.project.as_str()),
                    ("sk_live_0123", "acme")
                );
                assert_eq!(k.record.id, ids::imported_key_id(b"s", &k.hash));
            }
            other => panic!("{other:?}"),
        }
        for s in [401, 403, 404] {
            assert_eq!(out(s, ""), Outcome::Unknown);
        }
        for (status, body, says) in [
            (500, "", "answered 500"),
            (429, "", "answered 429"),
            (200, "not json", "unusable"),
            (200, r#"{"project":"acme","plan":"gold"}"#, "unknown plan"),
            (200, r#"{"project":"acme"}"#, "unusable"),
        ] {
            match out(status, body) {
                Outcome::Failed {
                    timeout: false,
                    detail,
                } => assert!(detail.contains(says), "{detail}"),
                other => panic!("{status} {body}: {other:?}"),
            }
        }
        let long = outcome(200, None, KEY, &Settings::default(), b"s", NOW);
        assert!(matches!(long, Outcome::Failed { .. }));
        let p = out(500, "").problem().unwrap();
        assert_eq!((p.code, p.status()), (ErrorCode::OriginUnreachable, 502));
        assert!(!p.detail.contains(KEY));
    }

    #[test]
    fn one_request_leads_others_wait_and_outcomes_are_remembered() {
        let mut asked = Asked::default();
        assert_eq!(step(&asked, NOW), Step::Lead);
        asked.lead_until = Some(NOW + 15_000);
        assert_eq!(
            step(&asked, NOW + 1),
            Step::Wait {
                until: NOW + 15_000
            }
        );
        // A lead that never reports is replaced after its lease.
        assert_eq!(step(&asked, NOW + 15_000), Step::Lead);
        // A lead that gave up, or failed, is not remembered: the next request leads.
        assert_eq!(step(&settle(&asked, None, 60_000, NOW), NOW), Step::Lead);
        let failed = Outcome::Failed {
            timeout: true,
            detail: "x".into(),
        };
        assert_eq!(
            step(&settle(&asked, Some(&failed), 60_000, NOW), NOW),
            Step::Lead
        );
        // A refusal is, for the negative cache's length.
        let refused = settle(&asked, Some(&Outcome::Unknown), 60_000, NOW);
        assert_eq!(
            step(&refused, NOW + 59_999),
            Step::Decided(Outcome::Unknown)
        );
        assert_eq!(step(&refused, NOW + 60_000), Step::Lead);
        // A valid key is remembered for good.
        let valid = out(200, r#"{"project":"acme","plan":"trial"}"#);
        let known = settle(&refused, Some(&valid), 60_000, NOW);
        assert_eq!(step(&known, u64::MAX), Step::Decided(valid));
    }
}
