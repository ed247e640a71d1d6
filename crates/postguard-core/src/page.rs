//! Cursor pagination shared by every list endpoint: `?limit=` (default 50),
//! opaque cursors over `(time, id)`, and the `{data, next_cursor}` page.

use base64::Engine;
use serde::Serialize;

use crate::Invalid;

/// The page size when `?limit=` is absent.
pub const DEFAULT_LIMIT: u32 = 50;
pub const MAX_LIMIT: u32 = 200;

/// Parses `?limit=`: default 50, 1..=200.
pub fn parse_limit(raw: Option<&str>) -> Result<u32, Invalid> {
    match raw {
        None => Ok(DEFAULT_LIMIT),
        Some(s) => match s.parse::<u32>() {
            Ok(n) if (1..=MAX_LIMIT).contains(&n) => Ok(n),
            _ => Err("limit: must be an integer between 1 and 200".into()),
        },
    }
}

/// Encodes a cursor for the row `(time, id)`.
pub fn encode_cursor(time: u64, id: &str) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!("{time}:{id}"))
}

/// The `(time, id)` of a cursor this API returned.
pub fn decode_cursor(c: &str) -> Result<(u64, String), Invalid> {
    let err = || Invalid::field("cursor", "not a cursor this API returned");
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(c)
        .map_err(|_| err())?;
    let s = String::from_utf8(raw).map_err(|_| err())?;
    let (t, id) = s.split_once(':').ok_or_else(err)?;
    let time = t.parse().map_err(|_| err())?;
    if id.is_empty() || id.len() > 64 {
        return Err(err());
    }
    Ok((time, id.to_string()))
}

/// One page of a list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Page<T> {
    pub data: Vec<T>,
    pub next_cursor: Option<String>,
}

impl<T> Page<T> {
    /// A page from up to `limit + 1` rows (the query asks for one more than
    /// it shows, to know whether a next page exists); the cursor points after
    /// the last row shown.
    pub fn of(mut rows: Vec<T>, limit: u32, cursor_of: impl Fn(&T) -> String) -> Page<T> {
        let limit = limit as usize;
        let next_cursor = if rows.len() > limit {
            rows.truncate(limit);
            rows.last().map(cursor_of)
        } else {
            None
        };
        Page {
            data: rows,
            next_cursor,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits() {
        assert_eq!(parse_limit(None), Ok(50));
        assert_eq!(parse_limit(Some("200")), Ok(200));
        for bad in ["201", "0", "-1", "x", ""] {
            assert!(parse_limit(Some(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn cursor_round_trips_and_rejects_garbage() {
        let c = encode_cursor(1_700_000_000_123, "req_01ABC");
        assert_eq!(
            decode_cursor(&c),
            Ok((1_700_000_000_123, "req_01ABC".to_string()))
        );
        assert!(decode_cursor("").is_err());
        assert!(decode_cursor(&encode_cursor(1, "")).is_err());
        assert!(decode_cursor("bm90LWEtY3Vyc29y").is_err()); // "not-a-cursor"
    }

    #[test]
    fn pages_show_limit_rows_and_point_after_the_last() {
        let p = Page::of(vec![1, 2, 3], 2, |n| n.to_string());
        assert_eq!(p.data, vec![1, 2]);
        assert_eq!(p.next_cursor.as_deref(), Some("2"));
        let p = Page::of(vec![1, 2], 2, |n| n.to_string());
        assert_eq!(p.next_cursor, None);
    }
}
