//! Times as inputs give them: epoch milliseconds or RFC 3339, bounded. Every
//! module that reads a time (queries, bodies, the configuration) asks here.

use crate::Invalid;

/// The latest time any input may name: 9999-12-31T23:59:59.999Z (epoch ms).
/// Later values are refused where they are read: past 2^53 a time no longer
/// survives JavaScript (KV metadata, RPC, the dashboard), and nothing the
/// gateway keeps lives that long.
pub const MAX_EPOCH_MS: u64 = 253_402_300_799_999;

const TIME_FORMS: &str = "must be epoch milliseconds or an RFC 3339 timestamp, at most 9999-12-31";

/// Epoch milliseconds or RFC 3339, no later than [`MAX_EPOCH_MS`].
pub fn parse_time(field: &str, v: &str) -> Result<u64, Invalid> {
    let rfc3339 = &time::format_description::well_known::Rfc3339;
    let ms = match v.parse::<u64>() {
        Ok(ms) => Some(ms),
        Err(_) => time::OffsetDateTime::parse(v, rfc3339).ok().and_then(|t| {
            let s = u64::try_from(t.unix_timestamp()).ok()?;
            s.checked_mul(1000)?.checked_add(u64::from(t.millisecond()))
        }),
    };
    ms.filter(|ms| *ms <= MAX_EPOCH_MS)
        .ok_or_else(|| Invalid::field(field, TIME_FORMS))
}

/// A time given in a JSON body: epoch milliseconds (an integer) or an RFC
/// 3339 string, read as [`parse_time`] reads a query parameter.
pub fn time_value(field: &str, v: &serde_json::Value) -> Result<u64, Invalid> {
    match v {
        serde_json::Value::String(s) => parse_time(field, s),
        serde_json::Value::Number(n) => n
            .as_u64()
            .filter(|ms| *ms <= MAX_EPOCH_MS)
            .ok_or_else(|| Invalid::field(field, TIME_FORMS)),
        _ => Err(Invalid::field(field, TIME_FORMS)),
    }
}
