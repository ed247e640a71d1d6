//! Exports (ADR 0038): `POST /exports` records the request and queues
//! one step on the delivery queue; the step writes `exports/<id>.ndjson.gz`
//! from the archive objects and the live sources of the range; `GET
//! /exports/{id}` answers its state and, once done, a download URL signed
//! for 15 minutes, which `GET /exports/{id}/download` checks before it
//! streams the object from R2. The bucket is never public.

use postguard_core::archive::{
    self, ExportRequest, ExportState, Kind, Source, UrlSigner, EXPORT_KEEP_MS, URL_TTL_MS,
};
use postguard_core::log::Line;
use postguard_core::problem::ErrorCode;
use postguard_core::Problem;
use serde::{Deserialize, Serialize};
use worker::{Bucket, Env, MessageExt, Result};

use super::{object, sources};
use crate::d1::{num, text};
use crate::handler::Ctx;
use crate::reject::Handled;
use crate::runtime::now_ms;
use crate::webhooks::{new_id, Msg};
use crate::{bindings, handler, http, log};

/// The queue message that runs an export.
#[derive(Serialize, Deserialize)]
pub struct ExportStep {
    pub export_id: String,
}

/// An export's row in D1 (`exports`, migrations/0011).
#[derive(Deserialize)]
struct Row {
    project: String,
    kind: String,
    since: u64,
    until: u64,
    state: ExportState,
    rows: Option<u64>,
    bytes: Option<u64>,
    created_at: u64,
}

/// `GET /exports/{id}`.
#[derive(Serialize)]
struct Shown<'a> {
    id: &'a str,
    state: ExportState,
    #[serde(skip_serializing_if = "Option::is_none")]
    rows: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    url: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    url_expires_at: Option<u64>,
}

#[derive(Serialize)]
struct Created<'a> {
    id: &'a str,
}

fn db(env: &Env) -> Result<worker::D1Database> {
    env.d1(bindings::DB)
}

/// `POST /_postguard/v1/exports {project, kind, since, until}` (operator) →
/// 202 `{id}`.
pub async fn create(cx: &Ctx<'_>) -> Handled {
    let req = archive::parse_export(&cx.body)?;
    let id = new_id("exp_");
    let now = now_ms();
    insert(cx.env, &id, &req, now).await?;
    let step = ExportStep {
        export_id: id.clone(),
    };
    if let Err(e) = cx.env.queue(bindings::DELIVERIES)?.send(step).await {
        // Not left `queued` with nothing to run it.
        set_state(cx.env, &id, ExportState::Failed, now_ms()).await?;
        return Err(e.into());
    }
    handler::json(cx.rc, 202, &Created { id: &id }, &[])
}

async fn insert(env: &Env, id: &str, r: &ExportRequest, now: u64) -> Result<()> {
    db(env)?
        .prepare(
            "INSERT INTO exports (id, project, kind, since, until, state, created_at, updated_at) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(&[
            text(id),
            text(&r.project),
            text(r.kind.as_str()),
            num(r.since),
            num(r.until),
            text(ExportState::Queued.as_str()),
            num(now),
            num(now),
        ])?
        .run()
        .await?;
    Ok(())
}

async fn load(env: &Env, id: &str, now: u64) -> Result<Option<Row>> {
    let rows: Vec<Row> = crate::d1::all(
        &db(env)?,
        "SELECT project, kind, since, until, state, rows, bytes, created_at FROM exports WHERE id = ?",
        &[text(id)],
    )
    .await?;
    // Past its keeping time an export is gone, whether or not the daily
    // job deleted it yet.
    Ok(rows
        .into_iter()
        .next()
        .filter(|r| r.created_at + EXPORT_KEEP_MS > now))
}

fn not_found(id: &str) -> Problem {
    Problem::not_found("export", id)
}

/// `GET /_postguard/v1/exports/{id}` (operator).
pub async fn get(cx: &Ctx<'_>, id: &str) -> Handled {
    let now = now_ms();
    if !archive::is_export_id(id) {
        return Err(not_found(id).into());
    }
    let row = load(cx.env, id, now).await?.ok_or_else(|| not_found(id))?;
    let done = row.state == ExportState::Done;
    let expires = now + URL_TTL_MS;
    let url = done.then(|| {
        let sig = UrlSigner::from_admin_token(&cx.cfg.admin_token).sign(id, expires);
        archive::download_url(cx.cfg.settings.public_origin(), id, expires, &sig)
    });
    let shown = Shown {
        id,
        state: row.state,
        rows: row.rows.filter(|_| done),
        bytes: row.bytes.filter(|_| done),
        url_expires_at: url.as_ref().map(|_| expires),
        url,
    };
    handler::json(cx.rc, 200, &shown, &[])
}

/// `GET /_postguard/v1/exports/{id}/download?expires=&sig=` (the signature
/// is the credential): the export's gzip object, streamed from R2.
pub async fn download(cx: &Ctx<'_>, id: &str) -> Handled {
    let now = now_ms();
    let url = cx.req.url()?;
    let param = |name: &str| {
        url.query_pairs()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.into_owned())
    };
    let (expires, sig) = (param("expires"), param("sig"));
    UrlSigner::from_admin_token(&cx.cfg.admin_token)
        .verify(id, expires.as_deref(), sig.as_deref(), now)
        .map_err(|r| Problem::new(ErrorCode::Forbidden, r.to_string()))?;
    let row = load(cx.env, id, now)
        .await?
        .filter(|r| r.state == ExportState::Done)
        .ok_or_else(|| not_found(id))?;
    let stream = object::body(&super::bucket(cx.env)?, &archive::export_key(id))
        .await?
        .ok_or_else(|| not_found(id))?;
    let name = format!(
        "{}-{}-{}-{}.ndjson.gz",
        row.project,
        row.kind,
        archive::date(archive::day_of(row.since)),
        id
    );
    let headers = [
        ("Content-Type", "application/gzip".to_string()),
        (
            "Content-Disposition",
            format!("attachment; filename=\"{name}\""),
        ),
        ("Cache-Control", "no-store".to_string()),
    ];
    if let Some(bytes) = row.bytes {
        cx.rc.note(|f| f.response_bytes = Some(bytes));
    }
    Ok(http::respond_stream(
        cx.rc,
        200,
        &[],
        &headers,
        worker::ResponseBody::Stream(stream),
    )?)
}

async fn set_state(env: &Env, id: &str, state: ExportState, now: u64) -> Result<()> {
    db(env)?
        .prepare("UPDATE exports SET state = ?, updated_at = ? WHERE id = ?")
        .bind(&[text(state.as_str()), num(now), text(id)])?
        .run()
        .await?;
    Ok(())
}

/// Runs one export message: acknowledged once written; retried by the
/// queue when it fails; from the dead-letter queue the export is `failed`.
pub async fn run_message(env: &Env, m: &Msg, from_dlq: bool) {
    let Ok(step) = ExportStep::deserialize(m.body()) else {
        log::emit(Line::error("dropping a malformed export message"));
        m.ack();
        return;
    };
    let id = step.export_id.as_str();
    let outcome = match from_dlq {
        true => set_state(env, id, ExportState::Failed, now_ms()).await,
        false => run(env, id).await,
    };
    match outcome {
        Ok(()) => m.ack(),
        Err(e) => {
            log::emit(
                Line::error("export failed, will retry")
                    .field("export_id", id)
                    .err(e),
            );
            m.retry();
        }
    }
}

/// Writes export `id`: for each UTC day of its range, the archived lines
/// of the range (those the day's manifest counts), then the rows of every
/// live source the manifest does not list — each row once, whether it is
/// still live, only archived, or both.
async fn run(env: &Env, id: &str) -> Result<()> {
    let now = now_ms();
    let Some(row) = load(env, id, now).await? else {
        return Ok(());
    };
    if matches!(row.state, ExportState::Done | ExportState::Failed) {
        return Ok(());
    }
    let kind =
        Kind::parse(&row.kind).ok_or_else(|| worker::Error::RustError("export kind".into()))?;
    set_state(env, id, ExportState::Running, now).await?;
    let bucket = super::bucket(env)?;
    let mut out = object::Out::new(&bucket, archive::export_key(id))?;
    if let Err(e) = fill(env, &bucket, &mut out, &row, kind).await {
        out.abort().await;
        return Err(e);
    }
    let sealed = out.finish().await?;
    db(env)?
        .prepare(
            "UPDATE exports SET state = ?, rows = ?, bytes = ?, sha256 = ?, updated_at = ? WHERE id = ?",
        )
        .bind(&[
            text(ExportState::Done.as_str()),
            num(sealed.rows),
            num(sealed.bytes),
            text(&sealed.sha256),
            num(now_ms()),
            text(id),
        ])?
        .run()
        .await?;
    log::emit(
        Line::info("export written")
            .field("export_id", id)
            .field("rows", sealed.rows)
            .field("bytes", sealed.bytes),
    );
    Ok(())
}

async fn fill(
    env: &Env,
    bucket: &Bucket,
    out: &mut object::Out<'_>,
    row: &Row,
    kind: Kind,
) -> Result<()> {
    let (since, until) = (row.since, row.until);
    let project = row.project.as_str();
    let live = sources::live_shards(env, project, kind, since, until).await?;
    for day in archive::days(since, until) {
        let manifest = object::manifest(bucket, &archive::manifest_key(project, kind, day)).await?;
        if let Some(m) = &manifest {
            let mut r = object::LineReader::open(bucket, &m.object, Some(m.rows))
                .await?
                .ok_or_else(|| worker::Error::RustError(format!("{} is missing", m.object)))?;
            while let Some(lines) = r.next().await? {
                let mine: Vec<Vec<u8>> = lines
                    .into_iter()
                    .filter(|l| {
                        archive::line_time(kind, l).is_some_and(|t| t >= since && t < until)
                    })
                    .collect();
                out.lines(&mine.concat(), mine.len() as u64).await?;
            }
        }
        let listed = |s: &Source| manifest.as_ref().is_some_and(|m| m.includes(s));
        for source in live.iter().chain(std::iter::once(&Source::Legacy)) {
            if listed(source) {
                continue;
            }
            let Some(window) = source.window(day, since, until) else {
                continue;
            };
            let mut after = (0u64, String::new());
            loop {
                let p = sources::page(env, project, kind, source, window, &after).await?;
                out.lines(&p.text, p.rows).await?;
                match p.next {
                    Some(next) => after = next,
                    None => break,
                }
            }
        }
    }
    Ok(())
}

/// Deletes exports past their keeping time: objects, then rows.
pub async fn expire(env: &Env, bucket: &Bucket, now: u64) -> Result<u64> {
    #[derive(Deserialize)]
    struct Old {
        id: String,
    }
    let before = now.saturating_sub(EXPORT_KEEP_MS);
    let old: Vec<Old> = crate::d1::all(
        &db(env)?,
        "SELECT id FROM exports WHERE created_at < ? LIMIT 500",
        &[num(before)],
    )
    .await?;
    for o in &old {
        bucket.delete(archive::export_key(&o.id)).await?;
        db(env)?
            .prepare("DELETE FROM exports WHERE id = ?")
            .bind(&[text(&o.id)])?
            .run()
            .await?;
    }
    Ok(old.len() as u64)
}
