//! Several workers of one process sharing one client: one limiter, one budget. With the
//! default reserve (a tenth of the limit) the client waits for the window's reset before the
//! key runs dry, so in normal operation no 429 is ever received.
//!
//! `POSTGUARD_URL=… POSTGUARD_API_KEY=pgk_… cargo run --example concurrent_workers`

use postguard_client::{Body, Client, Error, Method, RequestOptions, ThrottleConfig};
use serde_json::json;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error> {
    let url = std::env::var("POSTGUARD_URL").unwrap_or_else(|_| "http://127.0.0.1:8787".into());
    let key = std::env::var("POSTGUARD_API_KEY")
        .map_err(|_| Error::Invalid("set POSTGUARD_API_KEY".into()))?;
    let client = Client::builder(url)
        .token(key)
        // pacing: spread the calls evenly over the window instead of bursting.
        .throttle(ThrottleConfig {
            pacing: true,
            ..ThrottleConfig::default()
        })
        .on_response(|e| {
            if e.status == Some(429) {
                eprintln!("429 on {} (attempt {})", e.path, e.attempt);
            }
        })
        .build()?;
    let workers: Vec<_> = (0..4)
        .map(|w| {
            let client = client.clone(); // clones share the limiter
            tokio::spawn(async move {
                for i in 0..5 {
                    let body = Body::from(json!({ "worker": w, "item": i }));
                    client
                        .request(Method::POST, "/items", body, RequestOptions::default())
                        .await?;
                }
                Ok::<_, Error>(())
            })
        })
        .collect();
    for w in workers {
        w.await.map_err(|e| Error::Invalid(e.to_string()))??;
    }
    println!("{:?}", client.metrics());
    Ok(())
}
