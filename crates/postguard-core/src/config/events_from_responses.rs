//! The `events_from_responses` section's validation: each rule's route, the
//! status it matches, the event type and where its data comes from (the
//! rule itself, [`ResponseEventRule`], and the matching live in
//! `crate::response_events`).

use super::check::{validate_rule_route, ConfigError};
use crate::response_events::{is_valid_data, ResponseEventRule, StatusMatch};
// The event types a publish accepts, so a derived event is one a
// subscriber's filter can name: a leaf of `webhooks/` that imports no config.
use crate::ids::is_valid_type;

/// At most 100 rules, each fully valid.
pub(super) fn validate(rules: &[ResponseEventRule]) -> Result<(), ConfigError> {
    if rules.len() > 100 {
        return Err(ConfigError::new(
            "events_from_responses",
            "must list at most 100 rules",
        ));
    }
    for (i, r) in rules.iter().enumerate() {
        let f = format!("events_from_responses[{i}]");
        validate_rule_route(&f, &r.method, &r.path)?;
        if StatusMatch::parse(&r.status).is_none() {
            return Err(ConfigError::new(
                format!("{f}.status"),
                "must be a status (\"201\") or a class (\"2xx\")",
            ));
        }
        if !is_valid_type(&r.event_type) || r.event_type.starts_with("postguard.") {
            return Err(ConfigError::new(
                format!("{f}.type"),
                "must be 1-128 of [A-Za-z0-9._:-], not under the reserved `postguard.` prefix",
            ));
        }
        if !is_valid_data(&r.data) {
            return Err(ConfigError::new(
                format!("{f}.data"),
                "must be \"body\" or a JSON Pointer (\"/order\", RFC 6901)",
            ));
        }
    }
    Ok(())
}
