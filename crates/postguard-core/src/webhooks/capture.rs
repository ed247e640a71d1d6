//! What an inspector's capture URL accepts (docs/operating-webhooks.md, issue 23): a
//! capture URL takes requests from anyone who knows it, so it has a budget of
//! its own — captures and bytes per minute and per UTC day — and nothing a
//! sender does there is charged to the project's webhook quotas. Credentials
//! a sender put in its headers are never stored.

use serde::{Deserialize, Serialize};

use super::capacity::{until_next_day_s, utc_day};
use super::config::WebhooksConfig;

/// Headers stored as [`REDACTED`]: a capture is shown to the project, and a
/// sender's credentials are not the project's to see (nor to keep).
pub const SECRET_HEADERS: [&str; 3] = ["authorization", "cookie", "proxy-authorization"];
pub const REDACTED: &str = "[redacted]";

/// A captured header's value as it is stored.
pub fn stored_value<'a>(name: &str, value: &'a str) -> &'a str {
    match SECRET_HEADERS
        .iter()
        .any(|h| h.eq_ignore_ascii_case(name.trim()))
    {
        true => REDACTED,
        false => value,
    }
}

/// What one inspector's senders used: in the minute and the UTC day that
/// `minute` and `day` number (minutes and days since the epoch).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub minute: u64,
    pub minute_count: u32,
    pub minute_bytes: u64,
    pub day: u64,
    pub day_count: u32,
    pub day_bytes: u64,
}

/// Refused: over the budget until `retry_after_s` from now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Over {
    pub retry_after_s: u64,
    /// The minute's budget (`false`: the day's).
    pub per_minute: bool,
}

const MINUTE_MS: u64 = 60_000;

/// Charges one capture of `bytes` to `used` at `now_ms`: the usage to store,
/// or why not. Counters of an earlier minute or day start again from zero;
/// a clock that steps back keeps the current ones.
pub fn charge(
    used: Usage,
    bytes: u64,
    limits: &WebhooksConfig,
    now_ms: u64,
) -> Result<Usage, Over> {
    let (minute, day) = (now_ms / MINUTE_MS, utc_day(now_ms));
    let mut next = used;
    if minute > used.minute {
        (next.minute, next.minute_count, next.minute_bytes) = (minute, 0, 0);
    }
    if day > used.day {
        (next.day, next.day_count, next.day_bytes) = (day, 0, 0);
    }
    next.minute_count = next.minute_count.saturating_add(1);
    next.minute_bytes = next.minute_bytes.saturating_add(bytes);
    next.day_count = next.day_count.saturating_add(1);
    next.day_bytes = next.day_bytes.saturating_add(bytes);
    if next.day_count > limits.inspector_captures_per_day
        || next.day_bytes > limits.inspector_bytes_per_day
    {
        return Err(Over {
            retry_after_s: until_next_day_s(now_ms),
            per_minute: false,
        });
    }
    if next.minute_count > limits.inspector_captures_per_minute
        || next.minute_bytes > limits.inspector_bytes_per_minute
    {
        let next_minute = (next.minute + 1) * MINUTE_MS;
        return Err(Over {
            retry_after_s: next_minute.saturating_sub(now_ms).div_ceil(1000).max(1),
            per_minute: true,
        });
    }
    Ok(next)
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: u64 = 1_800_000_000_000; // a minute boundary

    fn limits() -> WebhooksConfig {
        WebhooksConfig {
            inspector_captures_per_minute: 3,
            inspector_bytes_per_minute: 1_000,
            inspector_captures_per_day: 5,
            inspector_bytes_per_day: 10_000,
            ..WebhooksConfig::default()
        }
    }

    #[test]
    fn a_minute_admits_its_captures_then_refuses_until_the_next_minute() {
        let mut u = Usage::default();
        for i in 0..3 {
            u = charge(u, 10, &limits(), T + i).unwrap_or_default();
        }
        assert_eq!((u.minute_count, u.day_count), (3, 3));
        let over = charge(u, 10, &limits(), T + 1_500);
        assert_eq!(
            over,
            Err(Over {
                retry_after_s: 59,
                per_minute: true
            })
        );
        // The next minute starts again; the day keeps counting.
        let u = charge(u, 10, &limits(), T + 60_000).unwrap_or_default();
        assert_eq!((u.minute_count, u.day_count), (1, 4));
    }

    #[test]
    fn bytes_count_as_well_as_captures_and_the_day_bounds_the_minutes() {
        let first = charge(Usage::default(), 900, &limits(), T);
        assert!(first.is_ok());
        let u = first.unwrap_or_default();
        assert!(matches!(
            charge(u, 200, &limits(), T + 1),
            Err(Over {
                per_minute: true,
                ..
            })
        ));
        let mut u = u;
        for m in 1..5 {
            u = charge(u, 10, &limits(), T + m * 60_000).unwrap_or_default();
        }
        assert_eq!(u.day_count, 5);
        let over = charge(u, 10, &limits(), T + 10 * 60_000);
        assert!(matches!(
            over,
            Err(Over {
                per_minute: false,
                ..
            })
        ));
        assert!(
            charge(u, 10, &limits(), T + 86_400_000).is_ok(),
            "a new day"
        );
    }

    #[test]
    fn a_clock_that_steps_back_keeps_the_current_window() {
        let u = charge(Usage::default(), 1, &limits(), T + 120_000).unwrap_or_default();
        let back = charge(u, 1, &limits(), T).unwrap_or_default();
        assert_eq!((back.minute, back.minute_count), (u.minute, 2));
    }

    #[test]
    fn credentials_are_redacted_whatever_their_case() {
        assert_eq!(stored_value("Authorization", "Bearer x"), REDACTED);
        assert_eq!(stored_value("COOKIE", "a=b"), REDACTED);
        assert_eq!(stored_value("proxy-authorization", "x"), REDACTED);
        assert_eq!(stored_value("webhook-signature", "v1,x"), "v1,x");
    }
}
