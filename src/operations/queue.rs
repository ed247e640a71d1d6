//! The `OPERATIONS` queue's messages: "start operation `id`". A message is
//! never the only copy of anything: the operation is in its key's object,
//! whose alarm sends the message again while the operation is due.

use serde::{Deserialize, Serialize};
use worker::Env;

use crate::bindings;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    pub operation_id: String,
}

/// Sends one message per id (`sendBatch` takes at most 100).
pub async fn send(env: &Env, ids: &[&str]) -> worker::Result<()> {
    let queue = env.queue(bindings::OPERATIONS)?;
    for chunk in ids.chunks(100) {
        let messages: Vec<Message> = chunk
            .iter()
            .map(|id| Message {
                operation_id: (*id).to_string(),
            })
            .collect();
        queue.send_batch(messages).await?;
    }
    Ok(())
}
