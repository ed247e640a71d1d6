//! The `rate_limit` section (what a route, `/audit`, `/stats`, a test ping
//! and a recover cost) and the `limits` section (the limit on requests that
//! carry no valid credential, and `limits.edge`: quota leased to the edge,
//! ADR 0040).

use std::num::NonZeroU32;

use serde::Deserialize;

use super::check::{range, validate_route, ConfigError};
use crate::lease::EdgeLimits;
use crate::pattern;
use crate::rate_limit::Quota;

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CostRule {
    pub method: String,
    pub path: String,
    pub cost: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RateLimitConfig {
    pub costs: Vec<CostRule>,
    /// What one `GET /_postguard/v1/audit` by an API key costs in its budget.
    pub audit_cost: u32,
    /// What one `GET /_postguard/v1/stats` by an API key costs in its budget.
    pub stats_cost: u32,
    /// What one `POST /webhooks/{id}/test` (a signed ping sent at once) costs.
    pub test_cost: u32,
    /// What one `POST /webhooks/{id}/recover` (a task re-sending a range of
    /// deliveries) costs.
    pub recover_cost: u32,
}

impl Default for RateLimitConfig {
    fn default() -> Self {
        RateLimitConfig {
            costs: Vec::new(),
            audit_cost: 1,
            stats_cost: 1,
            test_cost: 1,
            recover_cost: 5,
        }
    }
}

/// Limits on requests that carry no valid credential (docs/limits.md).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// Requests per client IP and minute that carry no valid credential —
    /// 401s, CORS preflights, unknown capture URLs — before 429.
    pub unauthenticated_per_minute: u32,
    /// Admission at the edge: blocks of a key's windows leased to an
    /// object per (key, location) (ADR 0040). Off by default.
    pub edge: EdgeLimits,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            unauthenticated_per_minute: 120,
            edge: EdgeLimits::default(),
        }
    }
}

impl LimitsConfig {
    /// The per-IP limiter's quota.
    pub fn unauthenticated_quota(&self) -> Quota {
        // `validate` holds it at 1 or more; settings that skipped validation
        // get the strictest quota there is rather than none.
        let per_minute =
            NonZeroU32::new(self.unauthenticated_per_minute).unwrap_or(NonZeroU32::MIN);
        Quota::per_minute(per_minute)
    }
}

impl RateLimitConfig {
    /// The rate-limit cost of a request: the first matching rule, else 1.
    pub fn cost(&self, method: &str, path: &str) -> u32 {
        self.costs
            .iter()
            .find(|r| (r.method == "*" || r.method == method) && pattern::matches(&r.path, path))
            .map_or(1, |r| r.cost)
    }
}

/// Checks both sections; a cost is bounded by `smallest_quota`, the
/// smallest quota of any plan, where it must be admitted in one window.
pub(super) fn validate(
    rl: &RateLimitConfig,
    limits: &LimitsConfig,
    smallest_quota: u32,
) -> Result<(), ConfigError> {
    for (i, rule) in rl.costs.iter().enumerate() {
        let f = format!("rate_limit.costs[{i}]");
        validate_route(&f, &rule.method, &rule.path)?;
        if rule.cost > smallest_quota {
            return Err(ConfigError::new(
                format!("{f}.cost"),
                format!("must not exceed the smallest plan quota ({smallest_quota}), or the route could never be admitted"),
            ));
        }
    }
    range("rate_limit.audit_cost", rl.audit_cost, 0, smallest_quota)?;
    range("rate_limit.stats_cost", rl.stats_cost, 0, smallest_quota)?;
    // A cost over a plan's quota charges that plan its whole window
    // (`Route::cost` is capped when charged), so these are not bounded by
    // the smallest plan as the audit's are.
    range("rate_limit.test_cost", rl.test_cost, 0, 1_000_000)?;
    range("rate_limit.recover_cost", rl.recover_cost, 0, 1_000_000)?;
    range(
        "limits.unauthenticated_per_minute",
        limits.unauthenticated_per_minute,
        1,
        1_000_000,
    )?;
    // Checked whether enabled or not: a switch turned on later must not
    // meet a bad value.
    limits
        .edge
        .validate()
        .map_err(|e| ConfigError::new(e.field, e.reason))
}

#[cfg(test)]
mod tests {
    use crate::config::tests::env;
    use crate::config::Config;

    #[test]
    fn route_costs() {
        let c = Config::load(&env(Some(r#"{"rate_limit":{"costs":[{"method":"POST","path":"/bulk/*","cost":5},{"method":"*","path":"/health","cost":0}]}}"#))).unwrap();
        assert_eq!(c.settings.cost("POST", "/bulk/items"), 5);
        assert_eq!(c.settings.cost("GET", "/bulk/items"), 1);
        assert_eq!(c.settings.cost("GET", "/health"), 0);
    }

    #[test]
    fn edge_limits_are_off_by_default_validated_and_named_by_leaf() {
        let c = Config::load(&env(None)).unwrap();
        assert!(!c.settings.limits.edge.enabled);
        let c = Config::load(&env(Some(
            r#"{"limits":{"edge":{"enabled":true,"max_block":200,"shards":4}}}"#,
        )))
        .unwrap();
        let e = c.settings.limits.edge;
        assert_eq!(
            (e.enabled, e.max_block, e.min_block, e.shards),
            (true, 200, 10, 4)
        );
        for (json, field) in [
            (r#"{"max_block":0}"#, "limits.edge.max_block"),
            (r#"{"min_block":2000}"#, "limits.edge.min_block"),
            (r#"{"prefetch_at_pct":100}"#, "limits.edge.prefetch_at_pct"),
            (r#"{"lease_ms":10}"#, "limits.edge.lease_ms"),
            (r#"{"shards":0}"#, "limits.edge.shards"),
            (r#"{"enabled":false,"shards":65}"#, "limits.edge.shards"),
            (r#"{"max_blocks":5}"#, "limits.edge.max_blocks"),
        ] {
            let raw = format!(r#"{{"limits":{{"edge":{json}}}}}"#);
            let err = Config::load(&env(Some(&raw))).unwrap_err();
            assert_eq!(err.field, field, "{json}: {err}");
        }
    }
}
