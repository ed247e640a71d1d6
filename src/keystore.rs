//! The API keys' KV layout (namespace `API_KEYS`) and its reads and writes:
//! what the operator's key endpoints, an import and a key verified against
//! the origin store.
//!
//! - `h:<sha256(key)>` → the record of that secret (authentication lookups);
//!   after a reroll the old secret's record carries its own `expires_at`;
//! - `k:<id>` → `{record, hash, previous}` (the current secret's hash, and the
//!   secrets of rerolls still in their grace);
//! - `i:<project>:<reverse time>:<id>` and `a:<reverse time>:<id>` → empty
//!   values whose metadata is the record without its meta and overrides
//!   (listing, newest first; KV metadata holds at most 1 KiB).

use postguard_core::key_import::{Imported, ImportedKey, Status};
use postguard_core::keys::{self, KeyRecord, Retired, SecretRecord};
use postguard_core::Problem;
use serde::{Deserialize, Serialize};
use worker::{Env, KvStore};

use crate::bindings;
use crate::reject::Handled;
use crate::runtime::now_ms;

#[derive(Serialize, Deserialize)]
pub struct ById {
    pub record: KeyRecord,
    pub hash: String,
    /// The secrets rerolls replaced (`keys::Retired`), ended ones too.
    #[serde(default)]
    pub previous: Vec<Retired>,
}

fn index_entries(rec: &KeyRecord) -> [String; 2] {
    let rev = keys::reverse_time(rec.created_at);
    [
        format!("i:{}:{rev}:{}", rec.project, rec.id),
        format!("a:{rev}:{}", rec.id),
    ]
}

/// Every KV entry of the key: each secret's record, the entry by id, the
/// index entries (written last, so a listed key is always resolvable). A
/// secret's record expires in KV after the secret ends
/// (`keys::secret_record`); one past that is deleted, never written again.
pub async fn write_all(kv: &KvStore, by_id: &ById) -> Handled<()> {
    let rec = &by_id.record;
    let now = now_ms();
    put_secret(kv, &by_id.hash, rec, now).await?;
    for old in &by_id.previous {
        put_secret(kv, &old.hash, &keys::retired_record(rec, old), now).await?;
    }
    kv.put(&format!("k:{}", rec.id), serde_json::to_string(by_id)?)?
        .execute()
        .await?;
    for name in index_entries(rec) {
        kv.put(&name, "")?.metadata(rec.listed())?.execute().await?;
    }
    Ok(())
}

/// KV name of a key's record, by the SHA-256 of the key.
pub fn hash_entry(hash_hex: &str) -> String {
    format!("h:{hash_hex}")
}

/// The record `h:<hash>` of one secret, as `keys::secret_record` says.
async fn put_secret(kv: &KvStore, hash: &str, rec: &KeyRecord, now: u64) -> Handled<()> {
    let name = hash_entry(hash);
    let put = || kv.put(&name, serde_json::to_string(rec)?);
    match keys::secret_record(keys::secret_end(rec), now) {
        SecretRecord::Keep => put()?.execute().await?,
        SecretRecord::KeepUntil { epoch_s } => put()?.expiration(epoch_s).execute().await?,
        SecretRecord::Delete => kv.delete(&name).await?,
    }
    Ok(())
}

/// The key `id` (`k:<id>`), or 404.
pub async fn by_id(kv: &KvStore, id: &str) -> Handled<ById> {
    let well_formed = id.starts_with("key_")
        && id.len() <= 64
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    let found = match well_formed {
        true => kv.get(&format!("k:{id}")).json().await?,
        false => None,
    };
    found.ok_or_else(|| Problem::not_found("API key", id).into())
}

/// Stores a chunk of imported keys (at most `key_import::CHUNK`): a key
/// whose hash is known already is left as it was (`exists`, with its own
/// id). Run by a `KeyGuard` call of its own, so the chunk's KV operations
/// are that invocation's (ADR 0041).
pub async fn import_chunk(env: &Env, chunk: Vec<ImportedKey>) -> Handled<Vec<Imported>> {
    let kv = env.kv(bindings::API_KEYS)?;
    let mut out = Vec::with_capacity(chunk.len());
    for key in chunk {
        let (record, status) = store(&kv, key).await?;
        out.push(Imported {
            id: record.id,
            prefix: record.prefix,
            status,
        });
    }
    Ok(out)
}

/// Stores one imported key unless its hash is known: the record that is
/// stored now (a key verified against the origin).
pub async fn store_new(env: &Env, key: ImportedKey) -> Handled<KeyRecord> {
    let kv = env.kv(bindings::API_KEYS)?;
    Ok(store(&kv, key).await?.0)
}

async fn store(kv: &KvStore, key: ImportedKey) -> Handled<(KeyRecord, Status)> {
    let known: Option<KeyRecord> = kv.get(&hash_entry(&key.hash)).json().await?;
    if let Some(r) = known {
        return Ok((r, Status::Exists));
    }
    let by_id = ById {
        record: key.record,
        hash: key.hash,
        previous: Vec::new(),
    };
    write_all(kv, &by_id).await?;
    Ok((by_id.record, Status::Created))
}
