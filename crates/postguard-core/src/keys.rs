//! API-key resources and the validation of the operator's requests: create,
//! PATCH and reroll (docs/operator-api.md, docs/limits.md), and what a key's object is told
//! about it ([`profile`]).

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde::{Deserialize, Serialize};

use crate::config::{validate_plan, Plan, Settings};
use crate::guard::{Previous, Profile};
use crate::ids::is_valid_name;
use crate::Invalid;

/// An API key as stored (by hash) and listed. Never holds the key itself.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyRecord {
    pub id: String,
    pub prefix: String,
    pub project: String,
    pub plan: String,
    pub name: Option<String>,
    pub created_at: u64,
    pub revoked_at: Option<u64>,
    /// When this key stops working (epoch ms); `None`: never. The record
    /// stored under a rerolled key's old secret carries that secret's end.
    #[serde(default)]
    pub expires_at: Option<u64>,
    /// The operator's metadata, forwarded to the origin.
    #[serde(default)]
    pub meta: Option<serde_json::Value>,
    /// Per-key replacements of the plan's numbers.
    #[serde(default)]
    pub overrides: Option<Plan>,
    /// When the operator last changed the key (epoch ms; `created_at` when
    /// it was made — 0 for keys made before 0.4, until their first change):
    /// the version its object compares with a worker's cached record.
    #[serde(default)]
    pub updated_at: u64,
    /// Set only on the record of a secret a reroll replaced: when that
    /// secret stops working (epoch ms), whatever the key's own expiry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_expires_at: Option<u64>,
}

/// A key in `GET /keys`: its record without metadata and overrides, and
/// whether it has each (entries written before these flags read `false`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListedKey {
    #[serde(flatten)]
    pub record: KeyRecord,
    #[serde(default)]
    pub has_meta: bool,
    #[serde(default)]
    pub has_overrides: bool,
}

impl KeyRecord {
    /// The record as the listing's index entries carry it (KV metadata is
    /// bounded at 1 KiB): without its metadata and overrides, which
    /// `GET /keys/{id}` shows, but saying whether it has them.
    pub fn listed(&self) -> ListedKey {
        ListedKey {
            has_meta: self.meta.is_some(),
            has_overrides: self.overrides.is_some(),
            record: KeyRecord {
                meta: None,
                overrides: None,
                ..self.clone()
            },
        }
    }

    /// The plan the key runs on: its plan with its overrides laid over it.
    pub fn effective_plan(&self, settings: &Settings) -> Option<Plan> {
        let plan = settings.plans.get(&self.plan)?;
        Some(match &self.overrides {
            Some(o) => plan.overlaid(o),
            None => plan.clone(),
        })
    }

    /// `X-Postguard-Key-Meta`: base64url of the metadata's JSON.
    pub fn meta_header(&self) -> Option<String> {
        let meta = self.meta.as_ref()?;
        let json = serde_json::to_vec(meta).ok()?;
        Some(URL_SAFE_NO_PAD.encode(json))
    }
}

/// The largest `meta` accepted: 1 KiB of JSON.
pub const MAX_META_BYTES: usize = 1024;
pub const MAX_NAME_LEN: usize = 200;
/// A reroll's grace: by default a day, at most a week.
pub const DEFAULT_GRACE_S: u64 = 86_400;
pub const MAX_GRACE_S: u64 = 7 * 86_400;

/// `POST /_postguard/v1/keys` body.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateKey {
    pub project: String,
    pub plan: String,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub expires_at: Option<serde_json::Value>,
    #[serde(default)]
    pub meta: Option<serde_json::Value>,
    #[serde(default)]
    pub overrides: Option<Plan>,
}

/// What a create request sets, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewKey {
    pub project: String,
    pub plan: String,
    pub name: Option<String>,
    pub expires_at: Option<u64>,
    pub meta: Option<serde_json::Value>,
    pub overrides: Option<Plan>,
}

/// Parses and validates a create request at `now_ms`; the error is a
/// client-facing detail.
pub fn parse_create(body: &[u8], settings: &Settings, now_ms: u64) -> Result<NewKey, Invalid> {
    let req: CreateKey = Invalid::json_object(
        body,
        "{project, plan, name?, expires_at?, meta?, overrides?}",
    )?;
    validate_create(req, settings, now_ms)
}

/// A create request's members checked (`POST /keys`, each entry of an
/// import, a key the origin verified).
pub fn validate_create(
    req: CreateKey,
    settings: &Settings,
    now_ms: u64,
) -> Result<NewKey, Invalid> {
    if !is_valid_name(&req.project) {
        return Err("project: must be 1-64 characters of [A-Za-z0-9._-]".into());
    }
    check_plan(&req.plan, settings)?;
    check_name(req.name.as_deref())?;
    let expires_at = expiry(req.expires_at.as_ref(), now_ms)?;
    check_meta(req.meta.as_ref())?;
    check_overrides(&req.plan, req.overrides.as_ref(), settings)?;
    Ok(NewKey {
        project: req.project,
        plan: req.plan,
        name: req.name,
        expires_at,
        meta: req.meta,
        overrides: req.overrides,
    })
}

/// `PATCH /_postguard/v1/keys/{id}` body: each member given replaces the
/// key's (`null` clears `name`, `meta`, `overrides` and `expires_at`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PatchKey {
    #[serde(default, deserialize_with = "present")]
    pub name: Option<Option<String>>,
    #[serde(default)]
    pub plan: Option<String>,
    #[serde(default, deserialize_with = "present")]
    pub meta: Option<Option<serde_json::Value>>,
    #[serde(default, deserialize_with = "present")]
    pub overrides: Option<Option<Plan>>,
    #[serde(default, deserialize_with = "present")]
    pub expires_at: Option<Option<serde_json::Value>>,
}

/// A member that is present, `null` included (`Some(None)`), as opposed to
/// one left out (`None`, by `default`).
fn present<'de, D, T>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Some)
}

/// Applies a PATCH body to `current` at `now_ms`: the record as it becomes.
pub fn apply_patch(
    current: &KeyRecord,
    body: &[u8],
    settings: &Settings,
    now_ms: u64,
) -> Result<KeyRecord, Invalid> {
    let p: PatchKey = Invalid::json_object(body, "{name?, plan?, meta?, overrides?, expires_at?}")?;
    let mut next = current.clone();
    if let Some(name) = p.name {
        check_name(name.as_deref())?;
        next.name = name;
    }
    if let Some(plan) = p.plan {
        check_plan(&plan, settings)?;
        next.plan = plan;
    }
    if let Some(meta) = p.meta {
        check_meta(meta.as_ref())?;
        next.meta = meta;
    }
    if let Some(overrides) = p.overrides {
        next.overrides = overrides;
    }
    check_overrides(&next.plan, next.overrides.as_ref(), settings)?;
    if let Some(at) = p.expires_at {
        next.expires_at = expiry(at.as_ref(), now_ms)?;
    }
    next.updated_at = now_ms.max(current.updated_at + 1);
    Ok(next)
}

/// `POST /_postguard/v1/keys/{id}/reroll` body: how long the old secret
/// keeps working (s); an empty body means the default day.
pub fn parse_reroll(body: &[u8]) -> Result<u64, Invalid> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Reroll {
        #[serde(default)]
        grace_s: Option<u64>,
    }
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(DEFAULT_GRACE_S);
    }
    let r: Reroll = Invalid::json_object(body, "{grace_s?}")?;
    let grace = r.grace_s.unwrap_or(DEFAULT_GRACE_S);
    if grace > MAX_GRACE_S {
        return Err(Invalid::field(
            "grace_s",
            &format!("must be an integer from 0 to {MAX_GRACE_S} (7 days)"),
        ));
    }
    Ok(grace)
}

/// A reroll's new secret: the key's public prefix kept (so the audit log and
/// the dashboards see one key), the rest from `random`. 35 random base64url
/// characters (210 bits) remain secret.
pub fn rerolled_key(prefix: &str, random: &[u8; 32]) -> String {
    let fresh = crate::ids::new_api_key(random);
    let keep = prefix.len().min(crate::ids::KEY_PREFIX_LEN);
    format!("{}{}", &prefix[..keep], &fresh[keep..])
}

/// A secret a reroll replaced: its SHA-256 and when it stops (stopped)
/// working (epoch ms). Kept after its end as well: the key's object refuses
/// it by this marker for good, whatever KV or a cache still holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Retired {
    pub hash: String,
    pub until: u64,
}

/// How many replaced secrets a key remembers (the oldest is forgotten
/// first; its KV record has long expired by then).
pub const MAX_RETIRED: usize = 16;

/// How long past its end the record of an ended secret stays in KV, so a
/// client still using it is told `API_KEY_EXPIRED` rather than that the key
/// is unknown; KV then deletes it.
pub const ENDED_RECORD_KEPT_MS: u64 = 3_600_000;
/// KV's shortest expiry (s from now).
const KV_MIN_EXPIRY_S: u64 = 60;

/// Adds `old` to the key's replaced secrets, newest last, at most
/// [`MAX_RETIRED`].
pub fn retire(retired: &mut Vec<Retired>, old: Retired) {
    retired.retain(|r| r.hash != old.hash);
    retired.push(old);
    let over = retired.len().saturating_sub(MAX_RETIRED);
    retired.drain(..over);
}

/// The markers the key's object keeps of its replaced secrets.
pub fn markers(retired: &[Retired]) -> Vec<Previous> {
    retired
        .iter()
        .map(|r| Previous {
            key: secret_tag(&r.hash),
            until: r.until,
        })
        .collect()
}

/// What becomes of the KV record of a secret that ends at `ends_at`
/// (`None`: never): kept without an expiry, kept until an expiry (epoch
/// s, [`ENDED_RECORD_KEPT_MS`] past its end), or deleted now (that time
/// has passed: writing it again would bring an ended secret back).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SecretRecord {
    Keep,
    KeepUntil { epoch_s: u64 },
    Delete,
}

pub fn secret_record(ends_at: Option<u64>, now_ms: u64) -> SecretRecord {
    let Some(end) = ends_at else {
        return SecretRecord::Keep;
    };
    let drop_at = end.saturating_add(ENDED_RECORD_KEPT_MS);
    if drop_at <= now_ms {
        return SecretRecord::Delete;
    }
    let epoch_s = (drop_at / 1000).max(now_ms / 1000 + KV_MIN_EXPIRY_S);
    if epoch_s > KV_MAX_EXPIRATION_S {
        // KV takes an expiration only up to 2^31 - 1 s (2038-01-19); a key that ends
        // later keeps its record without one, and admission refuses it by its own end.
        return SecretRecord::Keep;
    }
    SecretRecord::KeepUntil { epoch_s }
}

/// The latest expiration (epoch s) KV accepts: a signed 32-bit value.
const KV_MAX_EXPIRATION_S: u64 = i32::MAX as u64;

/// The record stored under a replaced secret: the key's, saying when this
/// secret ends.
pub fn retired_record(record: &KeyRecord, r: &Retired) -> KeyRecord {
    KeyRecord {
        secret_expires_at: Some(r.until),
        ..record.clone()
    }
}

/// When a secret of the key ends: its own end if a reroll replaced it,
/// the key's expiry otherwise (whichever is first).
pub fn secret_end(record: &KeyRecord) -> Option<u64> {
    match (record.secret_expires_at, record.expires_at) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// What the key's object holds of it (`guard::Profile`): resolved limits,
/// expiry, metadata and the markers of its replaced secrets.
pub fn profile(
    record: &KeyRecord,
    settings: &Settings,
    previous: Vec<Previous>,
) -> Option<Profile> {
    let plan = record.effective_plan(settings)?;
    Some(Profile {
        version: record.updated_at,
        plan: record.plan.clone(),
        limits: plan.limits(),
        gateway: plan.gateway_limits(),
        ttl_s: plan.ttl_s(),
        expires_at: record.expires_at,
        previous,
        meta: record.meta_header(),
    })
}

/// The first 8 hex characters of a key's SHA-256: which secret of a key
/// called (not a secret itself: it names a hash).
pub fn secret_tag(hash_hex: &str) -> String {
    hash_hex.chars().take(8).collect()
}

fn check_plan(plan: &str, settings: &Settings) -> Result<(), Invalid> {
    if settings.plans.contains_key(plan) {
        return Ok(());
    }
    let known: Vec<&str> = settings.plans.keys().map(String::as_str).collect();
    Err(format!(
        "plan: unknown plan '{}' (configured: {})",
        truncate(plan, 64),
        known.join(", ")
    )
    .into())
}

fn check_name(name: Option<&str>) -> Result<(), Invalid> {
    match name {
        Some(n) if n.chars().count() > MAX_NAME_LEN || n.chars().any(char::is_control) => {
            Err(format!("name: at most {MAX_NAME_LEN} characters, no control characters").into())
        }
        _ => Ok(()),
    }
}

/// `expires_at`: epoch ms or RFC 3339, in the future.
fn expiry(value: Option<&serde_json::Value>, now_ms: u64) -> Result<Option<u64>, Invalid> {
    let at = match value {
        None | Some(serde_json::Value::Null) => return Ok(None),
        Some(v) => crate::audit::time_value("expires_at", v)?,
    };
    if at <= now_ms {
        return Err(Invalid::field("expires_at", "must be in the future"));
    }
    Ok(Some(at))
}

fn check_meta(meta: Option<&serde_json::Value>) -> Result<(), Invalid> {
    let Some(meta) = meta else { return Ok(()) };
    if !meta.is_object() {
        return Err(Invalid::field("meta", "must be a JSON object"));
    }
    let len = serde_json::to_vec(meta).map_or(usize::MAX, |v| v.len());
    if len > MAX_META_BYTES {
        return Err(Invalid::field(
            "meta",
            &format!("must be at most {MAX_META_BYTES} bytes of JSON (it is {len})"),
        ));
    }
    Ok(())
}

/// Overrides must leave a valid plan when laid over the key's plan.
fn check_overrides(plan: &str, o: Option<&Plan>, settings: &Settings) -> Result<(), Invalid> {
    let (Some(o), Some(base)) = (o, settings.plans.get(plan)) else {
        return Ok(());
    };
    validate_plan("overrides", &base.overlaid(o)).map_err(|e| Invalid(e.to_string()))
}

fn truncate(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}

/// The list order key: newest first, then by id.
pub fn reverse_time(created_at_ms: u64) -> String {
    format!("{:016x}", u64::MAX - created_at_ms)
}

pub use crate::page::parse_limit;

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_800_000_000_000;

    #[test]
    fn create_validation() {
        let s = Settings::default();
        let ok = |b: &[u8]| parse_create(b, &s, NOW);
        assert!(ok(br#"{"project":"acme","plan":"trial"}"#).is_ok());
        assert!(ok(br#"{"project":"acme","plan":"trial","name":"ci"}"#).is_ok());
        assert!(ok(br#"{"project":"acme","plan":"gold"}"#)
            .unwrap_err()
            .starts_with("plan:"));
        assert!(ok(br#"{"project":"a b","plan":"trial"}"#)
            .unwrap_err()
            .starts_with("project:"));
        assert!(ok(br#"{"project":"","plan":"trial"}"#).is_err());
        assert!(ok(br#"{"plan":"trial"}"#).is_err());
        assert!(ok(br#"{"project":"a","plan":"trial","x":1}"#).is_err());
        assert!(ok(b"not json").is_err());
        assert!(ok(b"[]").is_err());
        assert!(ok(br#"{"project":1,"plan":"trial"}"#).is_err());
        let long = format!(
            r#"{{"project":"a","plan":"trial","name":"{}"}}"#,
            "n".repeat(201)
        );
        assert!(ok(long.as_bytes()).unwrap_err().starts_with("name:"));
    }

    #[test]
    fn expiry_meta_and_overrides_are_checked() {
        let s = Settings::default();
        let ok = |b: &str| parse_create(b.as_bytes(), &s, NOW);
        let k =
            ok(r#"{"project":"a","plan":"trial","expires_at":"2027-01-15T09:00:00Z"}"#).unwrap();
        assert_eq!(k.expires_at, Some(1_800_000_000_000 + 3_600_000));
        assert!(
            ok(r#"{"project":"a","plan":"trial","expires_at":1700000000000}"#)
                .unwrap_err()
                .contains("future")
        );
        assert!(ok(r#"{"project":"a","plan":"trial","expires_at":"soon"}"#).is_err());
        assert!(ok(r#"{"project":"a","plan":"trial","meta":{"tier":"gold"}}"#).is_ok());
        assert!(ok(r#"{"project":"a","plan":"trial","meta":[1]}"#).is_err());
        let big = format!(
            r#"{{"project":"a","plan":"trial","meta":{{"x":"{}"}}}}"#,
            "y".repeat(1100)
        );
        assert!(ok(&big).unwrap_err().starts_with("meta:"));
        let o =
            ok(r#"{"project":"a","plan":"trial","overrides":{"requests_per_window":7}}"#).unwrap();
        assert_eq!(o.overrides.map(|p| p.requests_per_window), Some(Some(7)));
        let bad = ok(r#"{"project":"a","plan":"trial","overrides":{"requests_per_window":0}}"#);
        assert!(bad.unwrap_err().contains("overrides.requests_per_window"));
        assert!(ok(r#"{"project":"a","plan":"trial","overrides":{"colour":1}}"#).is_err());
    }

    #[test]
    fn patches_replace_what_they_name_and_null_clears() {
        let s = Settings::default();
        let rec = KeyRecord {
            id: "key_1".into(),
            plan: "trial".into(),
            name: Some("ci".into()),
            meta: Some(serde_json::json!({"a": 1})),
            ..KeyRecord::default()
        };
        let p = apply_patch(&rec, br#"{"plan":"business","meta":null}"#, &s, NOW).unwrap();
        assert_eq!(
            (p.plan.as_str(), p.meta.clone(), p.name.clone()),
            ("business", None, Some("ci".into()))
        );
        assert_eq!(p.updated_at, NOW);
        let q = apply_patch(&p, br#"{"name":null,"expires_at":1900000000000}"#, &s, NOW).unwrap();
        assert_eq!((q.name, q.expires_at), (None, Some(1_900_000_000_000)));
        assert!(q.updated_at > p.updated_at, "versions only grow");
        assert!(apply_patch(&rec, br#"{"plan":"gold"}"#, &s, NOW).is_err());
        assert!(apply_patch(&rec, br#"{"id":"x"}"#, &s, NOW).is_err());
        assert!(apply_patch(&rec, b"[]", &s, NOW).is_err());
    }

    #[test]
    fn rerolls_keep_the_prefix_and_bound_the_grace() {
        let old = crate::ids::new_api_key(&[1; 32]);
        let new = rerolled_key(&crate::ids::key_prefix(&old), &[2; 32]);
        assert_eq!(crate::ids::key_prefix(&new), crate::ids::key_prefix(&old));
        assert_ne!(new, old);
        assert!(crate::ids::is_well_formed_api_key(&new));
        assert_eq!(parse_reroll(b""), Ok(DEFAULT_GRACE_S));
        assert_eq!(parse_reroll(br#"{"grace_s":60}"#), Ok(60));
        assert!(parse_reroll(br#"{"grace_s":604801}"#).is_err());
        assert!(parse_reroll(br#"{"grace":1}"#).is_err());
    }

    #[test]
    fn a_body_that_is_not_an_object_is_refused_even_when_every_field_is_optional() {
        // serde reads a struct from a JSON array: `[]` would be a valid reroll.
        for body in [&b"[]"[..], b" [60]", b"null", b"1"] {
            let e = parse_reroll(body).unwrap_err();
            assert!(e.starts_with("body must be a JSON object"), "{e}");
        }
    }

    #[test]
    fn the_profile_resolves_the_plan_and_its_overrides() {
        let s = Settings::default();
        let rec = KeyRecord {
            plan: "trial".into(),
            overrides: Some(Plan {
                concurrency: Some(2),
                ..Plan::default()
            }),
            meta: Some(serde_json::json!({"t":1})),
            updated_at: 5,
            ..KeyRecord::default()
        };
        let p = profile(&rec, &s, Vec::new()).unwrap();
        assert_eq!((p.version, p.limits.concurrency), (5, Some(2)));
        assert_eq!(p.limits.policies[0].limit, 30);
        assert_eq!(p.meta.as_deref(), Some("eyJ0IjoxfQ"));
        let listed = rec.listed();
        assert_eq!(
            (listed.record.meta, listed.has_meta, listed.has_overrides),
            (None, true, true)
        );
        let stored = serde_json::to_value(rec.listed()).unwrap_or_default();
        let back: ListedKey = serde_json::from_value(stored).unwrap_or_default();
        assert!(
            back.has_meta && back.record.id == rec.id,
            "the listing's entry reads back"
        );
        assert_eq!(secret_tag("abcdef0123456789"), "abcdef01");
    }

    #[test]
    fn replaced_secrets_are_remembered_for_good_and_their_records_expire() {
        let mut retired = Vec::new();
        for i in 0..(MAX_RETIRED as u64 + 3) {
            retire(
                &mut retired,
                Retired {
                    hash: format!("{i:064x}"),
                    until: i,
                },
            );
        }
        assert_eq!(retired.len(), MAX_RETIRED);
        assert_eq!(
            retired.last().map(|r| r.until),
            Some(MAX_RETIRED as u64 + 2)
        );
        // An ended secret keeps its marker (the object refuses it by that).
        assert!(markers(&retired).iter().all(|m| m.key.len() == 8));
        const NOW: u64 = 1_800_000_000_000;
        assert_eq!(secret_record(None, NOW), SecretRecord::Keep);
        // Grace 0: ended now, told API_KEY_EXPIRED for an hour, then gone.
        assert_eq!(
            secret_record(Some(NOW), NOW),
            SecretRecord::KeepUntil {
                epoch_s: (NOW + ENDED_RECORD_KEPT_MS) / 1000
            }
        );
        assert_eq!(
            secret_record(Some(NOW - ENDED_RECORD_KEPT_MS), NOW),
            SecretRecord::Delete
        );
        // KV takes no expiration past 2038 (2^31 - 1 s): a later end keeps the record.
        let year_2443 = 14_998_468_408_591;
        assert_eq!(secret_record(Some(year_2443), NOW), SecretRecord::Keep);
        assert_eq!(
            secret_record(Some(KV_MAX_EXPIRATION_S * 1000 - ENDED_RECORD_KEPT_MS), NOW),
            SecretRecord::KeepUntil {
                epoch_s: KV_MAX_EXPIRATION_S
            }
        );
        // KV never takes an expiry under a minute away.
        assert_eq!(
            secret_record(Some(NOW - ENDED_RECORD_KEPT_MS + 1_000), NOW),
            SecretRecord::KeepUntil {
                epoch_s: NOW / 1000 + 60
            }
        );
        let rec = KeyRecord {
            expires_at: Some(NOW + 5),
            ..KeyRecord::default()
        };
        let theirs = retired_record(
            &rec,
            &Retired {
                hash: "ab".into(),
                until: NOW + 9,
            },
        );
        assert_eq!(
            (theirs.expires_at, theirs.secret_expires_at),
            (Some(NOW + 5), Some(NOW + 9))
        );
        assert_eq!(secret_end(&theirs), Some(NOW + 5));
        assert_eq!(secret_end(&rec), Some(NOW + 5));
    }

    #[test]
    fn times_past_9999_are_refused_naming_the_field() {
        const NOW: u64 = 1_800_000_000_000;
        for body in [
            r#"{"project":"a","plan":"trial","expires_at":18446744073709551615}"#,
            r#"{"project":"a","plan":"trial","expires_at":9007199254740993}"#,
            r#"{"project":"a","plan":"trial","expires_at":1e300}"#,
            r#"{"project":"a","plan":"trial","expires_at":-1}"#,
            r#"{"project":"a","plan":"trial","expires_at":"10000-01-01T00:00:00Z"}"#,
        ] {
            let e = parse_create(body.as_bytes(), &Settings::default(), NOW).unwrap_err();
            assert!(e.0.starts_with("expires_at:"), "{body}: {}", e.0);
        }
        assert!(parse_create(
            br#"{"project":"a","plan":"trial","expires_at":253402300799999}"#,
            &Settings::default(),
            NOW
        )
        .is_ok());
    }

    #[test]
    fn reverse_time_sorts_newest_first() {
        assert!(reverse_time(2) < reverse_time(1));
        assert_eq!(reverse_time(0).len(), 16);
    }
}
