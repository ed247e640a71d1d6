//! Configuration: `ORIGIN_URL`, the `ADMIN_TOKEN`/`ORIGIN_TOKEN` secrets and the
//! `POSTGUARD_CONFIG` JSON string, parsed and validated into typed values.
//!
//! Every problem is reported as a [`ConfigError`] naming the offending leaf
//! field (`plans.trial.window_s`, `ORIGIN_URL`, …); nothing falls back to a
//! silent default.
//!
//! This file holds the whole: the raw inputs ([`RawEnv`]), [`Settings`] (every
//! section), [`Config`] and the order in which the sections are checked. Each
//! section is a file of its own with its types, their defaults and its
//! validation (`plans.rs`, `limits.rs` for `rate_limit` and `limits`,
//! `idempotency.rs`, `origin.rs`, `cors.rs`, `retention.rs` for `retention`,
//! `audit` and `archive`, `alerts.rs`, `async_ops.rs`,
//! `events_from_responses.rs`); the `webhooks` section stands beside the
//! decisions it configures, in `webhooks/config.rs`. Every name is
//! re-exported here, so `config::Plan` or `config::WebhooksConfig` resolve as
//! before. The sections import only the two leaves `check.rs` and `named.rs`,
//! never this file: nothing imports in a circle.

mod alerts;
mod async_ops;
mod auth;
pub(crate) mod check;
mod cors;
mod events_from_responses;
mod idempotency;
mod limits;
mod named;
mod origin;
mod plans;
mod retention;
#[cfg(test)]
pub(crate) mod tests;

use serde::Deserialize;
use url::Url;

use crate::idempotency::Mode;
use check::range;

pub use crate::response_events::ResponseEventRule;
pub use crate::webhooks::config::{
    OnKeyRevoked, WebhooksConfig, D1_MAX_BYTES, DO_MAX_BYTES, MAX_SUBSCRIPTIONS_CAP,
};
pub use alerts::AlertsConfig;
pub use async_ops::{AsyncConfig, AsyncRoute, MAX_ASYNC_TIMEOUT_MS};
pub use auth::{AuthConfig, KeySource, VerifyConfig};
pub use check::ConfigError;
pub use idempotency::{
    IdempotencyConfig, RouteRule, DEFAULT_REPLAY_BYTES, MAX_REPLAY_CAP, MAX_STORED_BODY_CAP,
};
pub use limits::{CostRule, LimitsConfig, RateLimitConfig};
pub use named::Named;
pub use origin::{NamedOrigin, OriginConfig, OriginRoute, DEFAULT_ORIGIN};
pub use plans::{validate_plan, GatewaySpec, Plan, PolicySpec, DEFAULT_GATEWAY};
pub use retention::{
    ArchiveConfig, AuditConfig, RetentionConfig, DEFAULT_BUCKET_MS, MAX_BUCKET_MS, MIN_BUCKET_MS,
};

/// The raw inputs, as the runtime hands them over (all strings, all optional).
#[derive(Debug, Default, Clone, PartialEq, Eq, Hash)]
pub struct RawEnv {
    pub origin_url: Option<String>,
    pub admin_token: Option<String>,
    pub origin_token: Option<String>,
    /// Signs every request forwarded to the origin (`X-Postguard-Signature`).
    pub origin_signing_secret: Option<String>,
    pub postguard_config: Option<String>,
}

/// `POSTGUARD_CONFIG` as written by the operator.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    pub plans: Named<Plan>,
    pub rate_limit: RateLimitConfig,
    pub idempotency: IdempotencyConfig,
    pub origin: OriginConfig,
    pub webhooks: WebhooksConfig,
    pub retention: RetentionConfig,
    pub audit: AuditConfig,
    pub archive: ArchiveConfig,
    pub alerts: AlertsConfig,
    pub max_body_bytes: u64,
    /// `None`: preflights are forwarded to the origin.
    pub cors: Option<crate::cors::CorsConfig>,
    /// The gateway's own public origin (`https://api.example.com`): the base
    /// of the URLs it hands out (portal links, capture URLs) and the only
    /// origin whose capture URLs a redirect or a delivery may target without
    /// the URL rules. Never taken from a request's `Host`. Unset: those URLs
    /// are relative (`/_postguard/…`) and no URL is exempt.
    pub public_url: Option<String>,
    pub limits: LimitsConfig,
    /// `async` in the JSON (a Rust keyword).
    #[serde(rename = "async")]
    pub async_ops: AsyncConfig,
    pub events_from_responses: Vec<ResponseEventRule>,
    /// Named origins besides `ORIGIN_URL` (`default`), for `origin.routes`.
    pub origins: Named<NamedOrigin>,
    /// Where an API key is read, and the verification of unknown keys.
    pub auth: AuthConfig,
}

impl Default for Settings {
    fn default() -> Self {
        let plans = [("trial", 30u32), ("business", 2_000u32)]
            .into_iter()
            .map(|(name, n)| (name.to_string(), Plan::single(n, 60)))
            .collect();
        Settings {
            plans,
            rate_limit: RateLimitConfig::default(),
            idempotency: IdempotencyConfig::default(),
            origin: OriginConfig::default(),
            webhooks: WebhooksConfig::default(),
            retention: RetentionConfig::default(),
            audit: AuditConfig::default(),
            archive: ArchiveConfig::default(),
            alerts: AlertsConfig::default(),
            max_body_bytes: 10 << 20,
            cors: None,
            public_url: None,
            limits: LimitsConfig::default(),
            async_ops: AsyncConfig::default(),
            events_from_responses: Vec::new(),
            origins: Named::default(),
            auth: AuthConfig::default(),
        }
    }
}

/// The validated configuration the gateway runs with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub origin_url: Url,
    pub admin_token: String,
    pub origin_token: String,
    pub origin_signing_secret: String,
    /// The digests the credential of every request is compared with.
    pub secrets: crate::credential::Secrets,
    /// Every origin requests are routed to (`default` = `origin_url`).
    pub origins: crate::routing::Origins,
    pub settings: Settings,
}

impl Config {
    /// Where a request goes: its origin and forwarded path
    /// (`routing::route` over the origins and `origin.routes`).
    pub fn route<'a>(&'a self, method: &str, path: &'a str) -> crate::routing::Routed<'a> {
        crate::routing::route(&self.origins, &self.settings.origin.routes, method, path)
    }
}

/// The shortest secret accepted (`ADMIN_TOKEN`, `ORIGIN_TOKEN`,
/// `ORIGIN_SIGNING_SECRET`): 32 characters, e.g. 16 random bytes in hex.
pub const MIN_SECRET_LEN: usize = 32;

/// Largest `max_body_bytes` accepted: 32 MiB. A proxied body is held up to
/// three times at once (the runtime's ArrayBuffer, the wasm copy, the copy
/// handed to the origin fetch) = 96 MiB, which leaves room under an isolate's
/// 128 MB for the runtime itself and a buffered replay (≤ 16 MiB,
/// [`MAX_STORED_BODY_CAP`]). Cloudflare's own 100–500 MB request ceiling
/// would not fit in one isolate.
pub const MAX_BODY_CAP: u64 = 32 << 20;

impl Config {
    /// Parses and validates everything. The first problem found is returned.
    pub fn load(env: &RawEnv) -> Result<Config, ConfigError> {
        let origin_url = origin::parse_origin_url(env.origin_url.as_deref())?;
        let admin_token = required_secret("ADMIN_TOKEN", env.admin_token.as_deref())?;
        let origin_token = required_secret("ORIGIN_TOKEN", env.origin_token.as_deref())?;
        let origin_signing_secret = required_secret(
            "ORIGIN_SIGNING_SECRET",
            env.origin_signing_secret.as_deref(),
        )?;
        distinct_secrets(&admin_token, &origin_token, &origin_signing_secret)?;
        // An absent variable means every default; a present one must be a JSON object.
        let settings = match env.postguard_config.as_deref() {
            None => Settings::default(),
            Some(text) => parse_settings(text)?,
        };
        validate(&settings)?;
        let origins = resolve_origins(&origin_url, &settings)?;
        Ok(Config {
            secrets: crate::credential::Secrets::of(&admin_token, &origin_token),
            origins,
            origin_url,
            admin_token,
            origin_token,
            origin_signing_secret,
            settings,
        })
    }
}

/// The origins table: `default` (`ORIGIN_URL`, `origin.timeout_ms`) and
/// each named origin, its URL parsed (validated already) and its timeout.
fn resolve_origins(default: &Url, s: &Settings) -> Result<crate::routing::Origins, ConfigError> {
    use crate::routing::{Origin, Origins};
    let timeout = s.origin.timeout_ms;
    let mut named = Vec::new();
    for (name, o) in &s.origins {
        named.push(Origin {
            name: name.clone(),
            base: origin::parse_base_url(&format!("origins.{name}.url"), Some(&o.url))?,
            timeout_ms: o.timeout_ms.unwrap_or(timeout),
        });
    }
    Ok(Origins {
        default: Origin {
            name: DEFAULT_ORIGIN.to_string(),
            base: default.clone(),
            timeout_ms: timeout,
        },
        named,
    })
}

fn required_secret(name: &str, value: Option<&str>) -> Result<String, ConfigError> {
    match value {
        Some(v) if v.trim().chars().count() >= MIN_SECRET_LEN => Ok(v.to_string()),
        Some(v) if !v.trim().is_empty() => Err(ConfigError::new(
            name,
            format!("must be at least {MIN_SECRET_LEN} characters (e.g. `openssl rand -hex 24`)"),
        )),
        _ => Err(ConfigError::new(
            name,
            "is required (set it with `wrangler secret put`, or in .dev.vars locally)",
        )),
    }
}

/// Each credential must be its own: an `ORIGIN_TOKEN` equal to `ADMIN_TOKEN`
/// would hand the origin operator rights, and a signing secret shared with
/// either would let its holder forge what the origin trusts.
fn distinct_secrets(admin: &str, origin: &str, signing: &str) -> Result<(), ConfigError> {
    if admin == origin {
        return Err(ConfigError::new(
            "ORIGIN_TOKEN",
            "must differ from ADMIN_TOKEN (the origin would get operator rights)",
        ));
    }
    if signing == admin || signing == origin {
        return Err(ConfigError::new(
            "ORIGIN_SIGNING_SECRET",
            "must differ from ADMIN_TOKEN and ORIGIN_TOKEN",
        ));
    }
    Ok(())
}

/// Parses the JSON text. Unknown fields, wrong types and missing required
/// members are reported with the path of the offending field.
pub fn parse_settings(text: &str) -> Result<Settings, ConfigError> {
    // serde would also read a struct from a JSON array; only an object is valid.
    if !text.trim_start().starts_with('{') {
        return Err(ConfigError::new(
            "POSTGUARD_CONFIG",
            "must be a JSON object",
        ));
    }
    let de = &mut serde_json::Deserializer::from_slice(text.as_bytes());
    let err = match serde_path_to_error::deserialize::<_, Settings>(&mut *de) {
        Ok(s) => {
            // Trailing bytes after the object (`{…} junk`) make the text invalid.
            return match de.end() {
                Ok(()) => Ok(s),
                Err(e) => Err(ConfigError::new(
                    "POSTGUARD_CONFIG",
                    format!("must be a valid JSON object ({e})"),
                )),
            };
        }
        Err(err) => err,
    };
    let path = err.path().to_string();
    let inner = err.into_inner();
    let whole = || {
        ConfigError::new(
            "POSTGUARD_CONFIG",
            format!("must be a valid JSON object ({inner})"),
        )
    };
    if inner.is_syntax() || inner.is_eof() {
        return Err(whole());
    }
    let msg = inner.to_string();
    // Unknown and missing members are reported on their parent: name the member.
    let field = match named_member(&msg) {
        Some(name) if path == "." => name.to_string(),
        Some(name) if !path.ends_with(name) => format!("{path}.{name}"),
        _ => path,
    };
    if field == "." || field.is_empty() {
        return Err(whole());
    }
    Err(ConfigError::new(field, msg))
}

fn named_member(msg: &str) -> Option<&str> {
    let rest = msg
        .strip_prefix("unknown field `")
        .or_else(|| msg.strip_prefix("missing field `"))?;
    rest.split('`').next()
}

/// Checks every section, in the order the checks have always run: the
/// first error is the one reported, so this order is part of the contract
/// (`CONFIG_INVALID` names the same leaf field for every input). Where two
/// sections' checks interleave, a section's validation is split in steps.
fn validate(s: &Settings) -> Result<(), ConfigError> {
    plans::validate(&s.plans)?;
    limits::validate(&s.rate_limit, &s.limits, plans::smallest_quota(&s.plans))?;
    if let Some(u) = &s.public_url {
        origin::validate_public_url(u)?;
    }
    idempotency::validate_rules(&s.idempotency)?;
    origin::validate(&s.origin)?;
    idempotency::validate_records(&s.idempotency, s.origin.timeout_ms)?;
    range("max_body_bytes", s.max_body_bytes, 1, MAX_BODY_CAP)?;
    idempotency::validate_replay(&s.idempotency)?;
    if let Some(c) = &s.cors {
        cors::validate(c)?;
    }
    crate::webhooks::config::validate(&s.webhooks)?;
    retention::validate(&s.retention, &s.audit, &s.archive)?;
    alerts::validate(&s.alerts)?;
    async_ops::validate(&s.async_ops)?;
    events_from_responses::validate(&s.events_from_responses)?;
    origin::validate_routing(&s.origins, &s.origin.routes)?;
    auth::validate(&s.auth)
}

impl Settings {
    /// The gateway's public origin, without a trailing slash; `""` when
    /// unset (the URLs it builds are then relative).
    pub fn public_origin(&self) -> &str {
        self.public_url
            .as_deref()
            .map_or("", |u| u.trim_end_matches('/'))
    }

    /// The idempotency mode for a request: the first matching route rule,
    /// else the method table; methods not in the table are never idempotent.
    pub fn idempotency_mode(&self, method: &str, path: &str) -> Mode {
        self.idempotency.mode(method, path)
    }

    /// The rate-limit cost of a request: the first matching rule, else 1.
    pub fn cost(&self, method: &str, path: &str) -> u32 {
        self.rate_limit.cost(method, path)
    }

    /// A proxied request's route as metrics name it: the pattern of the
    /// first configured rule it matches (`idempotency.routes`, then
    /// `rate_limit.costs`), or `*` — never the raw path, whose ids would make
    /// every request a group of its own.
    pub fn route_label(&self, method: &str, path: &str) -> &str {
        let matches =
            |m: &str, p: &str| (m == "*" || m == method) && crate::pattern::matches(p, path);
        let idem = self.idempotency.routes.iter().map(|r| (&r.method, &r.path));
        let costs = self.rate_limit.costs.iter().map(|r| (&r.method, &r.path));
        idem.chain(costs)
            .find(|(m, p)| matches(m, p))
            .map_or("*", |(_, p)| p.as_str())
    }
}
