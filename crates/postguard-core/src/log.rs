//! One log line: a JSON object with `level`, `msg` and the fields that
//! locate it (`request_id`, `project`, `key_prefix`, `code`, …) (docs/observability.md).
//! The message is a fixed text (`&'static str`): what varies goes in
//! fields, so lines group by message and nothing a client sent is ever
//! formatted into one. No secret is ever a field: callers pass identifiers
//! (request ids, key prefixes, delivery ids), never credentials.

use serde::Serialize;
use serde_json::{Map, Value};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    Info,
    Warn,
    Error,
}

/// Longest string field kept (an error's text can hold a whole response).
const MAX_FIELD: usize = 512;

/// A log line being built: `Line::error("audit write failed").field("rows", n)`.
#[derive(Debug, Clone, PartialEq)]
pub struct Line {
    pub level: Level,
    msg: &'static str,
    fields: Map<String, Value>,
}

impl Line {
    pub fn info(msg: &'static str) -> Line {
        Line::new(Level::Info, msg)
    }

    pub fn warn(msg: &'static str) -> Line {
        Line::new(Level::Warn, msg)
    }

    pub fn error(msg: &'static str) -> Line {
        Line::new(Level::Error, msg)
    }

    fn new(level: Level, msg: &'static str) -> Line {
        Line {
            level,
            msg,
            fields: Map::new(),
        }
    }

    /// Adds a field; a string longer than 512 bytes is cut (on a character
    /// boundary) and marked with `…`.
    pub fn field(mut self, name: &'static str, value: impl Into<Value>) -> Line {
        let value = match value.into() {
            Value::String(s) => Value::String(bounded(s)),
            other => other,
        };
        self.fields.insert(name.to_string(), value);
        self
    }

    /// Adds a field when there is a value.
    pub fn maybe(self, name: &'static str, value: Option<impl Into<Value>>) -> Line {
        match value {
            Some(v) => self.field(name, v),
            None => self,
        }
    }

    /// An error's text, under `error`.
    pub fn err(self, e: impl std::fmt::Display) -> Line {
        self.field("error", e.to_string())
    }

    /// The line as one JSON object (no newline inside: JSON escapes them).
    pub fn to_json(&self) -> String {
        let mut out = Map::new();
        out.insert("level".into(), serde_json::json!(self.level));
        out.insert("msg".into(), Value::String(self.msg.to_string()));
        for (k, v) in &self.fields {
            // `level` and `msg` are the line's own; a field cannot shadow them.
            if k != "level" && k != "msg" {
                out.insert(k.clone(), v.clone());
            }
        }
        Value::Object(out).to_string()
    }
}

fn bounded(mut s: String) -> String {
    if s.len() <= MAX_FIELD {
        return s;
    }
    let mut end = MAX_FIELD;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s.truncate(end);
    s.push('…');
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_is_one_json_object_with_level_msg_and_fields() {
        let line = Line::error("audit write failed")
            .field("request_id", "req_1")
            .field("rows", 3)
            .maybe("project", None::<&str>)
            .err("D1: busy\nretry");
        let json = line.to_json();
        assert!(!json.contains('\n'), "one line: {json}");
        let v: Value = serde_json::from_str(&json).unwrap_or_default();
        assert_eq!(v["level"], "error");
        assert_eq!(v["msg"], "audit write failed");
        assert_eq!(v["request_id"], "req_1");
        assert_eq!(v["rows"], 3);
        assert_eq!(v["error"], "D1: busy\nretry");
        assert!(v.get("project").is_none());
    }

    #[test]
    fn fields_cannot_shadow_the_level_or_the_message() {
        let v: Value = serde_json::from_str(
            &Line::info("x")
                .field("level", "error")
                .field("msg", "y")
                .to_json(),
        )
        .unwrap_or_default();
        assert_eq!(
            (v["level"].as_str(), v["msg"].as_str()),
            (Some("info"), Some("x"))
        );
    }

    #[test]
    fn long_fields_are_cut_on_a_character_boundary() {
        let v: Value = serde_json::from_str(&Line::warn("x").err("é".repeat(400)).to_json())
            .unwrap_or_default();
        let e = v["error"].as_str().unwrap_or_default();
        assert!(e.len() <= MAX_FIELD + '…'.len_utf8() && e.ends_with('…'));
    }
}
