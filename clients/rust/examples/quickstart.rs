//! A payment through the gateway, safe to retry, then the audit rows of that operation.
//!
//! `POSTGUARD_URL=http://127.0.0.1:8787 POSTGUARD_API_KEY=pgk_… cargo run --example quickstart`

use futures_util::TryStreamExt;
use postguard_client::{Body, Client, Error, Method, RequestOptions};
use serde_json::json;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error> {
    let url = std::env::var("POSTGUARD_URL").unwrap_or_else(|_| "http://127.0.0.1:8787".into());
    let key = std::env::var("POSTGUARD_API_KEY")
        .map_err(|_| Error::Invalid("set POSTGUARD_API_KEY".into()))?;
    let client = Client::builder(url).token(key).build()?;

    let me = client.me().await?;
    println!(
        "key {} of project {}: {}/{} left",
        me.prefix, me.project, me.remaining, me.limit
    );

    // One logical operation: the SDK generates the Idempotency-Key once and resends it on
    // every retry, so a lost answer never becomes a second payment.
    let body = Body::from(json!({ "amount": 100, "currency": "EUR" }));
    match client
        .request(Method::POST, "/payments", body, RequestOptions::default())
        .await
    {
        Ok(res) => {
            println!(
                "{} after {} attempt(s), replayed: {}",
                res.status,
                res.attempts,
                res.replayed()
            );
            let key = res.idempotency_key.unwrap_or_default();
            let mut rows = Box::pin(client.audit(&[("idempotency_key", key.as_str())]));
            while let Some(row) = rows.try_next().await? {
                println!(
                    "  audit {} {} {} replayed={}",
                    row.request_id, row.method, row.status, row.replayed
                );
            }
        }
        Err(Error::IdempotencyKeyReuseConflict(p)) => {
            println!("key reused for another request: {p}")
        }
        Err(e) => println!(
            "failed: {e} (code {}, request_id {:?})",
            e.code(),
            e.request_id()
        ),
    }
    Ok(())
}
