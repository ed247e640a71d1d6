//! The compliance archive and exports (ADR 0038): the shell
//! around `postguard_core::archive` — R2 objects written as they are
//! compressed ([`object`]), rows read a page at a time from where they live
//! ([`sources`]), the daily job's half ([`Archiver`]: retention asks it
//! before it deletes anything) and the export endpoints ([`exports`]).
//!
//! Memory: one page of rows ([`archive::PAGE_ROWS`]) and at most one R2 part
//! ([`archive::PART_BYTES`], 8 MiB) of compressed bytes at a time, whatever
//! the size of a day.

pub mod exports;
mod gzip;
mod object;
mod sources;

use postguard_core::archive::{self, Kind, Manifest, Source, Target};
use postguard_core::audit_shard::ALL_PROJECTS;
use postguard_core::log::Line;
use worker::{Bucket, Env, Result};

use crate::bindings;
use crate::d1::{num, text};
use crate::log;

fn err(e: impl std::fmt::Display) -> worker::Error {
    worker::Error::RustError(e.to_string())
}

/// The `ARCHIVE` bucket.
pub fn bucket(env: &Env) -> Result<Bucket> {
    env.bucket(bindings::ARCHIVE)
}

/// What retention asks before it deletes: "is this archived and verified?"
/// — archiving it first when it is not.
pub struct Archiver {
    bucket: Bucket,
    now: u64,
}

/// (project, UTC day) pairs of legacy rows looked at per run.
const LEGACY_DAYS: u32 = 200;

impl Archiver {
    pub fn new(env: &Env, now: u64) -> Result<Archiver> {
        Ok(Archiver {
            bucket: bucket(env)?,
            now,
        })
    }

    /// Archives `source`'s rows of `project` and `kind` in `[lo, hi)` (a
    /// shard's bucket, or a legacy day), one object per UTC day it touches,
    /// unless each day's manifest already lists it; then reads every such
    /// object back and checks it against its manifest. `true`: the source may
    /// be deleted.
    pub async fn secure(
        &self,
        env: &Env,
        project: &str,
        kind: Kind,
        source: Source,
        (lo, hi): (u64, u64),
    ) -> Result<bool> {
        if project == ALL_PROJECTS {
            // Roll-ups of every project, no rows: nothing to archive.
            return Ok(true);
        }
        for day in archive::days(lo, hi) {
            let Some(window) = source.window(day, lo, hi) else {
                continue;
            };
            let at = Target { project, kind, day };
            let mkey = archive::manifest_key(project, kind, day);
            let m = match object::manifest(&self.bucket, &mkey).await? {
                Some(m) if m.includes(&source) => m,
                prev => {
                    let m = self.write_day(env, at, &source, prev, window).await?;
                    object::put_manifest(&self.bucket, &mkey, &m).await?;
                    log::emit(
                        Line::info("archived")
                            .field("object", m.object.as_str())
                            .field("source", source.id())
                            .field("rows", m.rows)
                            .field("bytes", m.bytes),
                    );
                    m
                }
            };
            let stored = object::digest(&self.bucket, &m.object).await?;
            let ok = stored.is_some_and(|(bytes, sha)| archive::verified(&m, bytes, &sha));
            if !ok {
                log::emit(
                    Line::error("archive object does not match its manifest: its sources are kept")
                        .field("object", m.object.as_str()),
                );
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// The day's object rewritten as the lines its manifest counts and then
    /// `source`'s rows in `window`; the manifest that lists it.
    async fn write_day(
        &self,
        env: &Env,
        at: Target<'_>,
        source: &Source,
        prev: Option<Manifest>,
        window: (u64, u64),
    ) -> Result<Manifest> {
        let key = archive::object_key(at.project, at.kind, at.day);
        let mut out = object::Out::new(&self.bucket, key)?;
        match self
            .fill(env, &mut out, at, source, prev.as_ref(), window)
            .await
        {
            Ok(added) => {
                let sealed = out.finish().await?;
                Ok(Manifest::with(prev, at, source, added, &sealed, self.now))
            }
            Err(e) => {
                out.abort().await;
                Err(e)
            }
        }
    }

    async fn fill(
        &self,
        env: &Env,
        out: &mut object::Out<'_>,
        at: Target<'_>,
        source: &Source,
        prev: Option<&Manifest>,
        window: (u64, u64),
    ) -> Result<u64> {
        if let Some(m) = prev {
            let mut r = object::LineReader::open(&self.bucket, &m.object, Some(m.rows))
                .await?
                .ok_or_else(|| err(format!("{} is missing: its manifest is kept", m.object)))?;
            while let Some(lines) = r.next().await? {
                out.lines(&lines.concat(), lines.len() as u64).await?;
            }
            let read = r.taken();
            if read != m.rows {
                return Err(err(format!(
                    "{} holds {read} of the {} lines its manifest counts",
                    m.object, m.rows
                )));
            }
        }
        let mut after = (0u64, String::new());
        let mut added = 0u64;
        loop {
            let p = sources::page(env, at.project, at.kind, source, window, &after).await?;
            out.lines(&p.text, p.rows).await?;
            added += p.rows;
            match p.next {
                Some(next) => after = next,
                None => return Ok(added),
            }
        }
    }

    /// The cutoff under which the legacy D1 rows of `kind` may be deleted:
    /// every (project, day) before it archived and verified. `cutoff` is a
    /// day's start ([`archive::archive_cutoff`]).
    pub async fn legacy_cutoff(&self, env: &Env, kind: Kind, cutoff: u64) -> Result<u64> {
        let pairs = legacy_days(env, kind, cutoff).await?;
        let mut safe = cutoff;
        if pairs.len() >= LEGACY_DAYS as usize {
            // The rest next run: only days wholly listed count.
            if let Some((_, last)) = pairs.last() {
                safe = safe.min(archive::day_span(*last).0);
            }
        }
        for (project, day) in pairs {
            let span = archive::day_span(day);
            if span.0 >= safe {
                break;
            }
            if !self
                .secure(env, &project, kind, Source::Legacy, span)
                .await?
            {
                safe = safe.min(span.0);
            }
        }
        Ok(safe)
    }

    /// Deletes archive objects (and manifests) older than `keep_days`, and
    /// exports past their keeping time with their rows.
    pub async fn expire(&self, env: &Env, keep_days: u32) -> Result<u64> {
        let oldest = archive::day_of(self.now).saturating_sub(u64::from(keep_days));
        let mut gone = 0u64;
        let mut cursor: Option<String> = None;
        for _ in 0..20 {
            let mut list = self.bucket.list().prefix("archive/").limit(1_000);
            if let Some(c) = cursor.take() {
                list = list.cursor(c);
            }
            let page = list.execute().await?;
            let old: Vec<String> = page
                .objects()
                .iter()
                .map(|o| o.key())
                .filter(|k| archive::day_of_key(k).is_some_and(|d| d < oldest))
                .collect();
            for key in old {
                self.bucket.delete(&key).await?;
                gone += 1;
            }
            match (page.truncated(), page.cursor()) {
                (true, Some(c)) => cursor = Some(c),
                _ => break,
            }
        }
        gone += exports::expire(env, &self.bucket, self.now).await?;
        Ok(gone)
    }
}

/// `(project, UTC day)` of legacy rows of `kind` before `before`, oldest day
/// first.
async fn legacy_days(env: &Env, kind: Kind, before: u64) -> Result<Vec<(String, u64)>> {
    match kind {
        Kind::Deliveries => {
            crate::webhooks::directory::legacy::days_before(env, before, LEGACY_DAYS).await
        }
        Kind::Audit => {
            #[derive(serde::Deserialize)]
            struct Day {
                project: String,
                day: u64,
            }
            let db = env.d1(bindings::DB)?;
            let rows: Vec<Day> = crate::d1::all(
                &db,
                "SELECT COALESCE(project, ?) AS project, time / 86400000 AS day FROM audit_log \
                 WHERE time < ? GROUP BY 1, 2 ORDER BY day LIMIT ?",
                &[
                    text(postguard_core::audit_shard::UNSCOPED),
                    num(before),
                    num(u64::from(LEGACY_DAYS)),
                ],
            )
            .await?;
            Ok(rows.into_iter().map(|d| (d.project, d.day)).collect())
        }
    }
}
