//! What a message on the deliveries queue is: the queue carries three kinds
//! (ADR 0009, ADR 0038) and the shell routes each to its own handler
//! (`src/queue.rs`). Decided once, from the message's fields.

use serde_json::Value;

/// A message's kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A step of an export (`export_id`).
    ExportStep,
    /// A step of a background task (`task_id`).
    TaskStep,
    /// A delivery job (anything else; a malformed one is dropped by its
    /// handler, which says so).
    Delivery,
}

pub fn kind(body: &Value) -> Kind {
    if body.get("export_id").is_some() {
        Kind::ExportStep
    } else if body.get("task_id").is_some() {
        Kind::TaskStep
    } else {
        Kind::Delivery
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_message_has_one_kind() {
        let k = |s: &str| kind(&serde_json::from_str(s).unwrap_or(Value::Null));
        assert_eq!(k(r#"{"export_id":"exp_1","part":2}"#), Kind::ExportStep);
        assert_eq!(k(r#"{"task_id":"tsk_1"}"#), Kind::TaskStep);
        assert_eq!(k(r#"{"delivery_id":"dlv_1"}"#), Kind::Delivery);
        assert_eq!(k("null"), Kind::Delivery);
    }
}
