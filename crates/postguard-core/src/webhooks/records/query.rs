//! What the delivery log and the event feed are asked: `GET /deliveries`'
//! and `GET /events`' filters, parsed here and turned into SQL conditions
//! once (the shard and the legacy D1 rows read the same conditions).

use serde::{Deserialize, Serialize};

use super::super::delivery::Status;
use super::{DeliveryRecord, EventRecord};
use crate::audit::Arg;

/// `GET /deliveries` filters (newest first).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeliveryQuery {
    pub status: Option<Status>,
    pub event_type: Option<String>,
    /// One subscription's deliveries (the dashboard's endpoint filter).
    #[serde(default)]
    pub subscription_id: Option<String>,
    /// One event's deliveries (one per matching subscription).
    #[serde(default)]
    pub event_id: Option<String>,
    pub since: Option<u64>,
    pub until: Option<u64>,
    /// Rows strictly after this `(created_at, id)` in newest-first order.
    pub before: Option<(u64, String)>,
}

/// A filter value of `GET /deliveries`: 1-128 visible ASCII characters
/// (what an event id or a subscription id can be).
fn filter_value(name: &str, v: &str) -> Result<String, crate::Invalid> {
    if v.is_empty()
        || v.len() > crate::webhooks::events::MAX_TYPE_LEN
        || !v.bytes().all(|b| b.is_ascii_graphic())
    {
        return Err(crate::Invalid::field(
            name,
            "must be 1-128 visible ASCII characters",
        ));
    }
    Ok(v.to_string())
}

impl DeliveryQuery {
    /// `GET /deliveries`' query parameters (`project` already taken out by
    /// the router's reader rule): the filters and the page size. Unknown
    /// parameters and malformed values are refused (400).
    pub fn parse(pairs: &[(String, String)]) -> Result<(DeliveryQuery, u32), crate::Invalid> {
        use crate::audit::{decode_cursor, parse_time};
        let mut q = DeliveryQuery::default();
        let mut limit = crate::page::parse_limit(None)?;
        for (k, v) in pairs {
            match k.as_str() {
                "status" => {
                    q.status = Some(Status::parse(v).ok_or_else(|| {
                        crate::Invalid::field(
                            "status",
                            &format!("must be one of {}", Status::list()),
                        )
                    })?);
                }
                "event_type" => q.event_type = Some(filter_value("event_type", v)?),
                "subscription_id" => q.subscription_id = Some(filter_value("subscription_id", v)?),
                "event_id" => q.event_id = Some(filter_value("event_id", v)?),
                "since" => q.since = Some(parse_time("since", v)?),
                "until" => q.until = Some(parse_time("until", v)?),
                "limit" => limit = crate::page::parse_limit(Some(v))?,
                "cursor" => q.before = Some(decode_cursor(v)?),
                other => {
                    let name: String = other.chars().take(64).collect();
                    return Err(crate::Invalid::field(&name, "unknown parameter"));
                }
            }
        }
        Ok((q, limit))
    }

    /// The query in SQL over a `deliveries` table aliased `d`: ` AND …`
    /// conditions, newest first, at most `limit` rows, with their arguments.
    /// The shard's SQLite and D1's legacy rows run the same text.
    pub fn sql_conditions(&self, limit: u64) -> (String, Vec<Arg>) {
        let int = |v: u64| Arg::Int(i64::try_from(v).unwrap_or(i64::MAX));
        let mut sql = String::new();
        let mut args = Vec::new();
        if let Some(s) = self.status {
            sql.push_str(" AND d.status = ?");
            args.push(Arg::Text(s.as_str().to_string()));
        }
        if let Some(t) = &self.event_type {
            sql.push_str(" AND d.event_type = ?");
            args.push(Arg::Text(t.clone()));
        }
        if let Some(t) = &self.subscription_id {
            sql.push_str(" AND d.subscription_id = ?");
            args.push(Arg::Text(t.clone()));
        }
        if let Some(t) = &self.event_id {
            sql.push_str(" AND d.event_id = ?");
            args.push(Arg::Text(t.clone()));
        }
        if let Some(s) = self.since {
            sql.push_str(" AND d.created_at >= ?");
            args.push(int(s));
        }
        if let Some(u) = self.until {
            sql.push_str(" AND d.created_at <= ?");
            args.push(int(u));
        }
        if let Some((t, id)) = &self.before {
            sql.push_str(" AND (d.created_at < ? OR (d.created_at = ? AND d.id < ?))");
            args.extend([int(*t), int(*t), Arg::Text(id.clone())]);
        }
        sql.push_str(" ORDER BY d.created_at DESC, d.id DESC LIMIT ?");
        args.push(int(limit));
        (sql, args)
    }

    pub fn matches(&self, d: &DeliveryRecord) -> bool {
        self.status.is_none_or(|s| d.status == s)
            && self.event_type.as_ref().is_none_or(|t| *t == d.event_type)
            && self
                .subscription_id
                .as_ref()
                .is_none_or(|t| *t == d.subscription_id)
            && self.event_id.as_ref().is_none_or(|t| *t == d.event_id)
            && self.since.is_none_or(|s| d.created_at >= s)
            && self.until.is_none_or(|u| d.created_at <= u)
            && self
                .before
                .as_ref()
                .is_none_or(|(t, id)| d.created_at < *t || (d.created_at == *t && d.id < *id))
    }
}

/// `GET /events` filters; `desc` orders newest first.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventQuery {
    pub since: Option<u64>,
    pub until: Option<u64>,
    pub event_type: Option<String>,
    pub desc: bool,
    /// Rows strictly after this `(created_at, id)` in the page's order.
    pub after: Option<(u64, String)>,
}

/// Where a table keeps an event's fields: the shard's `events` and the
/// legacy D1 table name them differently.
#[derive(Debug, Clone, Copy)]
pub struct EventColumns {
    pub created_at: &'static str,
    pub id: &'static str,
    pub event_type: &'static str,
}

impl EventQuery {
    /// The conditions after a `WHERE` that selects something (`AND …`), the
    /// page's order and its `LIMIT`, with their arguments: the one
    /// translation of the feed's filters, for the shard and the legacy rows.
    pub fn sql_conditions(&self, c: EventColumns, limit: u64) -> (String, Vec<Arg>) {
        let int = |v: u64| Arg::Int(i64::try_from(v).unwrap_or(i64::MAX));
        let (at, id) = (c.created_at, c.id);
        let mut sql = String::new();
        let mut args = Vec::new();
        if let Some(s) = self.since {
            sql.push_str(&format!(" AND {at} >= ?"));
            args.push(int(s));
        }
        if let Some(u) = self.until {
            sql.push_str(&format!(" AND {at} <= ?"));
            args.push(int(u));
        }
        if let Some(t) = &self.event_type {
            sql.push_str(&format!(" AND {} = ?", c.event_type));
            args.push(Arg::Text(t.clone()));
        }
        let (cmp, dir) = if self.desc {
            ("<", "DESC")
        } else {
            (">", "ASC")
        };
        if let Some((t, after)) = &self.after {
            sql.push_str(&format!(
                " AND ({at} {cmp} ? OR ({at} = ? AND {id} {cmp} ?))"
            ));
            args.extend([int(*t), int(*t), Arg::Text(after.clone())]);
        }
        sql.push_str(&format!(" ORDER BY {at} {dir}, {id} {dir} LIMIT ?"));
        args.push(int(limit));
        (sql, args)
    }

    pub fn matches(&self, e: &EventRecord) -> bool {
        let key = (e.created_at, e.id.as_str());
        self.since.is_none_or(|s| e.created_at >= s)
            && self.until.is_none_or(|u| e.created_at <= u)
            && self.event_type.as_ref().is_none_or(|t| *t == e.event_type)
            && self.after.as_ref().is_none_or(|(t, id)| {
                let c = key.cmp(&(*t, id.as_str()));
                if self.desc {
                    c.is_lt()
                } else {
                    c.is_gt()
                }
            })
    }
}

/// How many deliveries of an event are in each status.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Summary {
    pub total: u32,
    pub delivered: u32,
    pub failed: u32,
    pub dead_letter: u32,
    pub pending: u32,
    pub paused: u32,
}

impl Summary {
    pub fn count(&mut self, s: Status) {
        self.total += 1;
        match s {
            Status::Delivered => self.delivered += 1,
            Status::Failed => self.failed += 1,
            Status::DeadLetter => self.dead_letter += 1,
            Status::Pending => self.pending += 1,
            Status::Paused => self.paused += 1,
        }
    }
}

/// An event of the feed with its delivery summary.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FeedRow {
    pub event: EventRecord,
    pub summary: Summary,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_feed_filters_read_the_same_against_either_table() {
        let q = EventQuery {
            since: Some(5),
            until: Some(9),
            event_type: Some("order.paid".into()),
            desc: true,
            after: Some((7, "evt_1".into())),
        };
        let legacy = EventColumns {
            created_at: "e.created_at",
            id: "e.id",
            event_type: "e.type",
        };
        let (sql, args) = q.sql_conditions(legacy, 20);
        assert_eq!(
            sql,
            " AND e.created_at >= ? AND e.created_at <= ? AND e.type = ? \
AND (e.created_at < ? OR (e.created_at = ? AND e.id < ?)) ORDER BY e.created_at DESC, e.id DESC LIMIT ?"
        );
        assert_eq!(args.len(), sql.matches('?').count());
        let oldest_first = EventQuery {
            desc: false,
            ..EventQuery::default()
        };
        let shard = EventColumns {
            created_at: "created_at",
            id: "id",
            event_type: "event_type",
        };
        let (sql, args) = oldest_first.sql_conditions(shard, 3);
        assert_eq!(sql, " ORDER BY created_at ASC, id ASC LIMIT ?");
        assert_eq!(args, [Arg::Int(3)]);
    }
}
