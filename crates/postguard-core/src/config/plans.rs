//! The `plans` section: each plan's policies (the single-policy form or
//! named `policies`), its concurrency quota, its gateway policy and its
//! idempotency TTL; what they resolve to ([`Plan::limits`]) and
//! [`validate_plan`], which also checks a key's overrides laid over its plan.

use serde::{Deserialize, Serialize};

use super::check::{range, ConfigError};
use super::named::Named;
use crate::ids::is_valid_name;

/// A plan as written (docs/configuration.md, docs/limits.md): the single-policy form
/// (`requests_per_window` per `window_s`) or several named `policies`, an
/// optional `concurrency` (requests of a key in flight at the origin), the
/// gateway endpoints' own `gateway` policy and how long idempotency records
/// live. The same shape, every field optional, is a key's `overrides`
/// ([`Plan::overlaid`]). `validate` checks it; [`Plan::limits`] resolves it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Plan {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_per_window: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_s: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policies: Option<Vec<PolicySpec>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<GatewaySpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_ttl_s: Option<u32>,
    /// `false`: report-only — every policy and the concurrency quota are
    /// counted and advertised, but a request they would refuse is forwarded
    /// (its audit row says `would_refuse`). Absent: enforced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enforce: Option<bool>,
    /// Quota notices (docs/webhooks.md): the percentages of each policy's
    /// limit at which `postguard.quota.threshold` is published to the key's
    /// project, once per window. Absent: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notify_at: Option<Vec<u32>>,
}

/// One named policy of a plan.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PolicySpec {
    pub name: String,
    pub requests: u32,
    pub window_s: u32,
}

/// The gateway endpoints' policy of a plan: what `/audit`, `/stats`, a test
/// ping or a recover cost is charged to, apart from the API's policies, so a
/// key that spent its API budget can still find out what happened.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct GatewaySpec {
    pub requests: u32,
    #[serde(default = "default_window_s")]
    pub window_s: u32,
}

/// The gateway policy of a plan that names none: 120 per minute.
pub const DEFAULT_GATEWAY: GatewaySpec = GatewaySpec {
    requests: 120,
    window_s: 60,
};

impl Plan {
    /// The single-policy form.
    pub fn single(requests_per_window: u32, window_s: u32) -> Plan {
        Plan {
            requests_per_window: Some(requests_per_window),
            window_s: Some(window_s),
            ..Plan::default()
        }
    }

    /// The API's limits: the named policies, or the single-policy form's
    /// `"default"` (the window defaults to 60 s), and the concurrency quota.
    pub fn limits(&self) -> crate::limits::Limits {
        use crate::limits::{Limits, Policy, DEFAULT_POLICY};
        let policies = match &self.policies {
            Some(list) => list
                .iter()
                .map(|p| Policy {
                    name: p.name.clone(),
                    limit: p.requests,
                    window_ms: u64::from(p.window_s) * 1000,
                })
                .collect(),
            None => vec![Policy {
                name: DEFAULT_POLICY.to_string(),
                limit: self.requests_per_window.unwrap_or(0),
                window_ms: u64::from(self.window_s.unwrap_or(default_window_s())) * 1000,
            }],
        };
        Limits {
            policies,
            concurrency: self.concurrency,
            report_only: self.enforce == Some(false),
            notify_at: self.notify_at_percent(),
        }
    }

    /// The gateway endpoints' limits: the one `gateway` policy.
    pub fn gateway_limits(&self) -> crate::limits::Limits {
        let g = self.gateway.as_ref().unwrap_or(&DEFAULT_GATEWAY);
        crate::limits::Limits {
            policies: vec![crate::limits::Policy {
                name: crate::limits::GATEWAY_POLICY.to_string(),
                limit: g.requests,
                window_ms: u64::from(g.window_s) * 1000,
            }],
            concurrency: None,
            report_only: false,
            notify_at: Vec::new(),
        }
    }

    /// `notify_at` as percentages (a validated plan's are 1–100; anything
    /// else is left out).
    fn notify_at_percent(&self) -> Vec<u8> {
        self.notify_at
            .iter()
            .flatten()
            .filter_map(|p| u8::try_from(*p).ok())
            .collect()
    }

    /// How long a stored response is replayed (s).
    pub fn ttl_s(&self) -> u32 {
        self.idempotency_ttl_s.unwrap_or(default_ttl_s())
    }

    /// The smallest quota of its API policies (what a route cost must fit).
    pub fn smallest_quota(&self) -> u32 {
        self.limits()
            .policies
            .iter()
            .map(|p| p.limit)
            .min()
            .unwrap_or(0)
    }

    /// This plan with a key's `overrides` laid over it: each field given
    /// replaces the plan's, and either form of the API's policies replaces
    /// the other (`{"requests_per_window": 7}` over a plan of `policies`
    /// leaves one policy).
    pub fn overlaid(&self, o: &Plan) -> Plan {
        let mut out = self.clone();
        if o.policies.is_some() {
            out.requests_per_window = None;
            out.window_s = None;
            out.policies.clone_from(&o.policies);
        }
        if o.requests_per_window.is_some() || o.window_s.is_some() {
            if out.policies.is_some() && o.policies.is_none() {
                out.policies = None;
            }
            out.requests_per_window = o.requests_per_window.or(out.requests_per_window);
            out.window_s = o.window_s.or(out.window_s);
        }
        out.concurrency = o.concurrency.or(out.concurrency);
        out.enforce = o.enforce.or(out.enforce);
        out.notify_at = o.notify_at.clone().or(out.notify_at);
        out.gateway = o.gateway.clone().or(out.gateway);
        out.idempotency_ttl_s = o.idempotency_ttl_s.or(out.idempotency_ttl_s);
        out
    }
}

fn default_window_s() -> u32 {
    60
}
fn default_ttl_s() -> u32 {
    86_400
}

/// The longest `idempotency_ttl_s`: 30 days.
const MAX_TTL_S: u32 = 30 * 86_400;

/// Checks a plan — or a key's overrides laid over its plan — naming any bad
/// field under `at`.
pub fn validate_plan(at: &str, plan: &Plan) -> Result<(), ConfigError> {
    if plan.policies.is_some() {
        if plan.requests_per_window.is_some() {
            return Err(ConfigError::new(
                format!("{at}.requests_per_window"),
                "give either requests_per_window (one policy) or policies, not both",
            ));
        }
        if plan.window_s.is_some() {
            return Err(ConfigError::new(
                format!("{at}.window_s"),
                "belongs to the single-policy form: each of `policies` has its own window_s",
            ));
        }
    } else {
        match plan.requests_per_window {
            Some(n) => range(format!("{at}.requests_per_window"), n, 1, 10_000_000)?,
            None => {
                return Err(ConfigError::new(
                    format!("{at}.requests_per_window"),
                    "is required (or `policies`, a list of {name, requests, window_s})",
                ))
            }
        }
    }
    if let Some(w) = plan.window_s {
        range(format!("{at}.window_s"), w, 1, 86_400)?;
    }
    if let Some(list) = &plan.policies {
        if list.is_empty() || list.len() > 8 {
            return Err(ConfigError::new(
                format!("{at}.policies"),
                "must list 1 to 8 policies",
            ));
        }
        for (i, p) in list.iter().enumerate() {
            let f = format!("{at}.policies[{i}]");
            let reserved = [
                crate::limits::INFLIGHT_POLICY,
                crate::limits::GATEWAY_POLICY,
            ];
            if !is_valid_name(&p.name) || reserved.contains(&p.name.as_str()) {
                return Err(ConfigError::new(
                    format!("{f}.name"),
                    "policy names are 1-64 of [A-Za-z0-9._-], not `inflight` or `gateway`",
                ));
            }
            if list[..i].iter().any(|q| q.name == p.name) {
                return Err(ConfigError::new(
                    format!("{f}.name"),
                    "names a policy twice",
                ));
            }
            range(format!("{f}.requests"), p.requests, 1, 10_000_000)?;
            range(format!("{f}.window_s"), p.window_s, 1, 31 * 86_400)?;
        }
    }
    if let Some(c) = plan.concurrency {
        range(format!("{at}.concurrency"), c, 1, 10_000)?;
    }
    if let Some(g) = &plan.gateway {
        range(format!("{at}.gateway.requests"), g.requests, 1, 10_000_000)?;
        range(format!("{at}.gateway.window_s"), g.window_s, 1, 86_400)?;
    }
    if let Some(t) = plan.idempotency_ttl_s {
        range(format!("{at}.idempotency_ttl_s"), t, 1, MAX_TTL_S)?;
    }
    if let Some(list) = &plan.notify_at {
        for (i, p) in list.iter().enumerate() {
            range(format!("{at}.notify_at[{i}]"), *p, 1, 100)?;
        }
        check_notify_at(&plan.notify_at_percent())
            .map_err(|why| ConfigError::new(format!("{at}.notify_at"), why))?;
    }
    Ok(())
}

/// Most thresholds a plan's `notify_at` may list.
const MAX_NOTIFY_AT: usize = 10;

/// `notify_at` as a plan gives it: 1–10 distinct percentages of 1–100.
fn check_notify_at(notify_at: &[u8]) -> Result<(), String> {
    if notify_at.is_empty() || notify_at.len() > MAX_NOTIFY_AT {
        return Err(format!("must list 1 to {MAX_NOTIFY_AT} percentages"));
    }
    if notify_at.iter().any(|p| !(1..=100).contains(p)) {
        return Err("each must be a percentage from 1 to 100".into());
    }
    let mut sorted = notify_at.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    if sorted.len() != notify_at.len() {
        return Err("must not list a percentage twice".into());
    }
    Ok(())
}

/// At least one plan, each validly named and valid.
pub(super) fn validate(plans: &Named<Plan>) -> Result<(), ConfigError> {
    if plans.is_empty() {
        return Err(ConfigError::new("plans", "must define at least one plan"));
    }
    for (name, plan) in plans {
        if !is_valid_name(name) {
            return Err(ConfigError::new(
                format!("plans.{name}"),
                "plan names are 1-64 of [A-Za-z0-9._-]",
            ));
        }
        validate_plan(&format!("plans.{name}"), plan)?;
    }
    Ok(())
}

/// The smallest quota of any plan's API policies: what a route's cost must
/// fit, or some key could never be admitted on it.
pub(super) fn smallest_quota(plans: &Named<Plan>) -> u32 {
    plans.values().map(Plan::smallest_quota).min().unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use crate::config::tests::env;
    use crate::config::Config;

    #[test]
    fn given_plans_replace_defaults() {
        let c = Config::load(&env(Some(
            r#"{"plans":{"gold":{"requests_per_window":5}}}"#,
        )))
        .unwrap();
        assert_eq!(c.settings.plans.len(), 1);
        assert_eq!(
            c.settings.plans["gold"].limits().policies[0].window_ms,
            60_000
        );
    }

    fn field_of(text: &str) -> String {
        match Config::load(&env(Some(text))) {
            Ok(_) => String::new(),
            Err(e) => e.field,
        }
    }

    #[test]
    fn notify_at_is_a_plans_list_of_percentages() {
        let c = Config::load(&env(Some(
            r#"{"plans":{"gold":{"requests_per_window":10,"notify_at":[80,100]},"free":{"requests_per_window":5}}}"#,
        )))
        .unwrap();
        assert_eq!(c.settings.plans["gold"].limits().notify_at, [80, 100]);
        assert!(
            c.settings.plans["free"].limits().notify_at.is_empty(),
            "none by default"
        );
        assert!(c.settings.plans["gold"]
            .gateway_limits()
            .notify_at
            .is_empty());
        let plan = |n: &str| {
            format!(r#"{{"plans":{{"p":{{"requests_per_window":10,"notify_at":{n}}}}}}}"#)
        };
        assert_eq!(field_of(&plan("[0]")), "plans.p.notify_at[0]");
        assert_eq!(field_of(&plan("[50, 101]")), "plans.p.notify_at[1]");
        assert_eq!(field_of(&plan("[-5]")), "plans.p.notify_at[0]");
        assert_eq!(field_of(&plan(r#"["80"]"#)), "plans.p.notify_at[0]");
        assert_eq!(field_of(&plan("[]")), "plans.p.notify_at");
        assert_eq!(field_of(&plan("[80, 80]")), "plans.p.notify_at");
        assert_eq!(
            field_of(&plan("[1,2,3,4,5,6,7,8,9,10,11]")),
            "plans.p.notify_at"
        );
        assert_eq!(field_of(&plan("80")), "plans.p.notify_at");
        assert_eq!(field_of(&plan("[1, 100]")), "");
    }

    #[test]
    fn thresholds_are_checked() {
        use super::check_notify_at as check;
        assert!(check(&[80, 100]).is_ok());
        assert!(check(&[]).is_err());
        assert!(check(&[0]).is_err());
        assert!(check(&[101]).is_err());
        assert!(check(&[50, 50]).is_err());
    }

    #[test]
    fn a_keys_overrides_may_set_notify_at() {
        use crate::config::Plan;
        let plan = Plan {
            notify_at: Some(vec![50]),
            ..Plan::single(10, 60)
        };
        let none = plan.overlaid(&Plan::default());
        assert_eq!(none.limits().notify_at, [50]);
        let o = Plan {
            notify_at: Some(vec![90, 100]),
            ..Plan::default()
        };
        assert_eq!(plan.overlaid(&o).limits().notify_at, [90, 100]);
        let bad = Plan {
            notify_at: Some(vec![0]),
            ..Plan::default()
        };
        let e = super::validate_plan("overrides", &plan.overlaid(&bad)).unwrap_err();
        assert_eq!(e.field, "overrides.notify_at[0]");
    }

    proptest::proptest! {
        /// Numbers anywhere in a plan are either accepted or rejected by name.
        #[test]
        fn plan_numbers_are_range_checked(n in proptest::num::i64::ANY, w in 0u64..200_000, t in 0u64..5_000_000) {
            let text = format!(r#"{{"plans":{{"p":{{"requests_per_window":{n},"window_s":{w},"idempotency_ttl_s":{t}}}}}}}"#);
            match Config::load(&env(Some(&text))) {
                Ok(c) => {
                    let p = &c.settings.plans["p"];
                    proptest::prop_assert!(p.requests_per_window.is_some_and(|n| n >= 1) && p.window_s.is_some_and(|w| (1..=86_400).contains(&w)));
                }
                Err(e) => proptest::prop_assert!(e.field.starts_with("plans.p."), "{}", e.field),
            }
        }
    }
}
