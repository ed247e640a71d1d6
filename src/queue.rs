//! Where a queue's messages go. The operations queue has one kind; the
//! deliveries queue (and its dead-letter queue) carries three, told apart by
//! the core (`postguard_core::queue::kind`) and each handed to its own
//! handler: delivery jobs to the consumer, task steps to `webhooks::tasks`,
//! export steps to `archive::exports`.

use postguard_core::config::Config;
use postguard_core::queue::{kind, Kind};
use worker::{Env, MessageBatch, Result};

use crate::bindings;
use crate::webhooks::Msg;

pub async fn handle(batch: MessageBatch<serde_json::Value>, env: &Env, cfg: &Config) -> Result<()> {
    if batch.queue() == bindings::OPERATIONS_QUEUE {
        crate::operations::consumer::handle(batch, env, cfg).await;
        return Ok(());
    }
    let from_dlq = batch.queue() == bindings::DELIVERIES_DLQ;
    let mut deliveries: Vec<Msg> = Vec::new();
    for m in batch.messages()? {
        match kind(m.body()) {
            Kind::ExportStep => crate::archive::exports::run_message(env, &m, from_dlq).await,
            Kind::TaskStep => {
                crate::webhooks::tasks::run_task_message(env, cfg, &m, from_dlq).await
            }
            Kind::Delivery => deliveries.push(m),
        }
    }
    crate::webhooks::consumer::handle(deliveries, from_dlq, env, cfg).await
}
