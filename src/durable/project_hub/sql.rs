//! The project object's table and its storage port: the core's
//! `LaneStore` (`webhooks::ordering`) in SQL, one row per lane with its
//! state as JSON. No function here decides anything.

use postguard_core::webhooks::ordering::{Lane, LaneState, LaneStore};
use serde::Deserialize;
use worker::{Result, SqlStorage, SqlStorageValue};

pub use crate::durable::err;

pub const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS lanes (subscription_id TEXT NOT NULL, ordering_key TEXT NOT NULL,
  state TEXT NOT NULL, last_at INTEGER NOT NULL, PRIMARY KEY (subscription_id, ordering_key)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS lanes_idle ON lanes (last_at);
";

fn text(v: &str) -> SqlStorageValue {
    SqlStorageValue::String(v.to_string())
}

fn int(v: u64) -> SqlStorageValue {
    SqlStorageValue::Integer(i64::try_from(v).unwrap_or(i64::MAX))
}

/// The storage port over the object's table.
pub struct Sql<'a>(pub &'a SqlStorage);

impl Sql<'_> {
    pub fn prepare(sql: &SqlStorage) -> Result<()> {
        sql.exec(SCHEMA, None)?;
        Ok(())
    }
}

impl LaneStore for Sql<'_> {
    type Error = worker::Error;

    fn lane(&mut self, lane: &Lane) -> Result<Option<LaneState>> {
        #[derive(Deserialize)]
        struct Row {
            state: String,
        }
        let rows: Vec<Row> = self
            .0
            .exec(
                "SELECT state FROM lanes WHERE subscription_id = ? AND ordering_key = ?",
                Some(vec![text(&lane.subscription_id), text(&lane.ordering_key)]),
            )?
            .to_array()?;
        rows.into_iter()
            .next()
            .map(|r| serde_json::from_str(&r.state).map_err(err))
            .transpose()
    }

    fn put_lane(&mut self, lane: &Lane, state: &LaneState) -> Result<()> {
        let json = serde_json::to_string(state).map_err(err)?;
        self.0.exec(
            "INSERT OR REPLACE INTO lanes (subscription_id, ordering_key, state, last_at) VALUES (?, ?, ?, ?)",
            Some(vec![
                text(&lane.subscription_id),
                text(&lane.ordering_key),
                text(&json),
                int(state.last_at),
            ]),
        )?;
        Ok(())
    }

    fn drop_lane(&mut self, lane: &Lane) -> Result<()> {
        self.0.exec(
            "DELETE FROM lanes WHERE subscription_id = ? AND ordering_key = ?",
            Some(vec![text(&lane.subscription_id), text(&lane.ordering_key)]),
        )?;
        Ok(())
    }

    fn lanes_of(&mut self, lanes: &[&Lane]) -> Result<Vec<(Lane, LaneState)>> {
        #[derive(Deserialize)]
        struct Row {
            subscription_id: String,
            ordering_key: String,
            state: String,
        }
        if lanes.is_empty() {
            return Ok(Vec::new());
        }
        let keys: Vec<(&str, &str)> = lanes
            .iter()
            .map(|l| (l.subscription_id.as_str(), l.ordering_key.as_str()))
            .collect();
        let rows: Vec<Row> = self
            .0
            .exec(
                "SELECT subscription_id, ordering_key, state FROM lanes WHERE (subscription_id, ordering_key) IN \
                 (SELECT value->>0, value->>1 FROM json_each(?))",
                Some(vec![text(&serde_json::to_string(&keys).map_err(err)?)]),
            )?
            .to_array()?;
        rows.into_iter()
            .map(|r| {
                let st = serde_json::from_str(&r.state).map_err(err)?;
                Ok((
                    Lane {
                        subscription_id: r.subscription_id,
                        ordering_key: r.ordering_key,
                    },
                    st,
                ))
            })
            .collect()
    }

    fn put_lanes(&mut self, lanes: &[(&Lane, &LaneState)]) -> Result<()> {
        if lanes.is_empty() {
            return Ok(());
        }
        let mut rows = Vec::with_capacity(lanes.len());
        for (lane, st) in lanes {
            let state = serde_json::to_string(st).map_err(err)?;
            rows.push((&lane.subscription_id, &lane.ordering_key, state, st.last_at));
        }
        self.0.exec(
            "INSERT OR REPLACE INTO lanes (subscription_id, ordering_key, state, last_at) \
             SELECT value->>0, value->>1, value->>2, value->>3 FROM json_each(?)",
            Some(vec![text(&serde_json::to_string(&rows).map_err(err)?)]),
        )?;
        Ok(())
    }

    fn idle_lanes(&mut self, before: u64, limit: usize) -> Result<Vec<Lane>> {
        self.0
            .exec(
                "SELECT subscription_id, ordering_key FROM lanes WHERE last_at < ? LIMIT ?",
                Some(vec![int(before), int(limit as u64)]),
            )?
            .to_array()
    }
}
