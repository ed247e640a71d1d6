//! The compliance archive (ADR 0038): what is written to R2
//! before retention deletes audit rows and delivery records, and how.
//!
//! One object per (project, kind, UTC date):
//! `archive/<project>/<kind>/<YYYY-MM-DD>.ndjson.gz`, one JSON object per
//! line ([`audit_line`], [`delivery_line`]), gzip. Beside it a manifest
//! (`….manifest.json`, [`Manifest`]): the object's row count, byte count and
//! SHA-256, and the *sources* whose rows it holds (a shard by its start, or
//! the legacy D1 rows). The manifest is the truth: the object's first
//! `rows` lines are the archive; the sources it lists are archived.
//!
//! A source is archived one date at a time: the date's object is rewritten
//! as the lines the manifest counts plus the source's rows of that date,
//! then the manifest is written listing the source ([`Manifest::with`]).
//! A crash between the two leaves extra lines the manifest does not count,
//! and the re-run rewrites from the counted ones: nothing is written twice.
//! With the default one-day buckets a date has one source, and its object
//! is written once. Retention drops a source only when every date it spans
//! lists it and the stored object matches its manifest ([`verified`]).
//!
//! Everything here is pure: the shell reads R2 and the shards, compresses
//! (`CompressionStream`) and hands the compressed bytes to an
//! [`ObjectWriter`], which hashes them and cuts them into R2 parts.

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::audit::AuditRow;
pub use crate::webhooks::records::Archived;
use crate::Invalid;

pub const DAY_MS: u64 = 86_400_000;
/// The manifest layout's version.
pub const FORMAT: u32 = 1;
/// Rows read from a source per call (a shard call answers one page).
pub const PAGE_ROWS: u32 = 500;
/// The size of every R2 part but the last (R2: at least 5 MiB, all equal).
/// An object smaller than this is written with one `put`. This and a page
/// of rows are what the archiver holds at once, whatever the day's size.
pub const PART_BYTES: usize = 8 << 20;
/// How long a signed download URL is valid (15 minutes).
pub const URL_TTL_MS: u64 = 15 * 60_000;
/// How long an export's object and record are kept (then `GET` is 404).
pub const EXPORT_KEEP_MS: u64 = 7 * DAY_MS;
/// The widest export range (days): one task writes it in one queue step.
pub const MAX_EXPORT_DAYS: u64 = 400;

/// What an archive object holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Audit,
    Deliveries,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Audit => "audit",
            Kind::Deliveries => "deliveries",
        }
    }

    pub fn parse(s: &str) -> Option<Kind> {
        match s {
            "audit" => Some(Kind::Audit),
            "deliveries" => Some(Kind::Deliveries),
            _ => None,
        }
    }
}

/// The UTC day (days since the epoch) of an epoch-ms time.
pub fn day_of(ms: u64) -> u64 {
    ms / DAY_MS
}

/// `YYYY-MM-DD` of a UTC day.
pub fn date(day: u64) -> String {
    let t = i64::try_from(day.saturating_mul(DAY_MS) / 1000)
        .ok()
        .and_then(|s| time::OffsetDateTime::from_unix_timestamp(s).ok());
    match t {
        Some(t) => format!("{:04}-{:02}-{:02}", t.year(), u8::from(t.month()), t.day()),
        None => "9999-12-31".to_string(),
    }
}

/// The UTC days that `[start_ms, end_ms)` touches, oldest first.
pub fn days(start_ms: u64, end_ms: u64) -> std::ops::Range<u64> {
    if end_ms <= start_ms {
        return 0..0;
    }
    day_of(start_ms)..day_of(end_ms - 1) + 1
}

/// `[start, end)` of a UTC day.
pub fn day_span(day: u64) -> (u64, u64) {
    (day * DAY_MS, (day + 1) * DAY_MS)
}

fn prefix(project: &str, kind: Kind, day: u64) -> String {
    format!("archive/{project}/{}/{}", kind.as_str(), date(day))
}

/// `archive/<project>/<kind>/<YYYY-MM-DD>.ndjson.gz`.
pub fn object_key(project: &str, kind: Kind, day: u64) -> String {
    format!("{}.ndjson.gz", prefix(project, kind, day))
}

/// The object's manifest, beside it.
pub fn manifest_key(project: &str, kind: Kind, day: u64) -> String {
    format!("{}.manifest.json", prefix(project, kind, day))
}

/// Where the object of export `id` is written.
pub fn export_key(id: &str) -> String {
    format!("exports/{id}.ndjson.gz")
}

/// The date of an archive object's key (`…/<YYYY-MM-DD>.ndjson.gz` or
/// `.manifest.json`): what `archive.keep_days` compares.
pub fn day_of_key(key: &str) -> Option<u64> {
    let name = key.rsplit('/').next()?;
    let d = name.get(..10)?;
    let mut it = d.split('-');
    let (y, m, dd) = (it.next()?, it.next()?, it.next()?);
    let month = time::Month::try_from(m.parse::<u8>().ok()?).ok()?;
    let date = time::Date::from_calendar_date(y.parse().ok()?, month, dd.parse().ok()?).ok()?;
    // Julian day 2440588 is 1970-01-01.
    u64::try_from(i64::from(date.to_julian_day()) - 2_440_588).ok()
}

/// Where rows come from: one shard (its bucket's start and end), or the
/// legacy D1 rows of the deployments before the shards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Shard { start_ms: u64, end_ms: u64 },
    Legacy,
}

impl Source {
    /// Its name in a manifest.
    pub fn id(&self) -> String {
        match self {
            Source::Shard { start_ms, .. } => format!("shard/{start_ms}"),
            Source::Legacy => "legacy".to_string(),
        }
    }

    /// The part of `[since, until)` within `day` this source can hold rows
    /// of, if any.
    pub fn window(&self, day: u64, since: u64, until: u64) -> Option<(u64, u64)> {
        let (d0, d1) = day_span(day);
        let (mut lo, mut hi) = (since.max(d0), until.min(d1));
        if let Source::Shard { start_ms, end_ms } = self {
            lo = lo.max(*start_ms);
            hi = hi.min(*end_ms);
        }
        (lo < hi).then_some((lo, hi))
    }
}

/// One source's rows in an object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Part {
    pub source: String,
    pub rows: u64,
}

/// What an archive object holds, written beside it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: u32,
    pub project: String,
    pub kind: Kind,
    pub date: String,
    /// The object's key.
    pub object: String,
    /// Lines (rows) of the object, and its bytes as stored (gzip).
    pub rows: u64,
    pub bytes: u64,
    /// SHA-256 of the stored bytes, lower-case hex.
    pub sha256: String,
    /// The sources archived in it, in the order they were added.
    pub sources: Vec<Part>,
    /// When the manifest was last written (epoch ms).
    pub updated_at: u64,
}

impl Manifest {
    pub fn includes(&self, source: &Source) -> bool {
        let id = source.id();
        self.sources.iter().any(|p| p.source == id)
    }

    /// The manifest after `source`'s `added` rows were appended to `prev`'s
    /// object (or written as a new one), stored as `sealed`.
    pub fn with(
        prev: Option<Manifest>,
        at: Target<'_>,
        source: &Source,
        added: u64,
        sealed: &Sealed,
        now: u64,
    ) -> Manifest {
        let mut sources = prev.map(|m| m.sources).unwrap_or_default();
        sources.push(Part {
            source: source.id(),
            rows: added,
        });
        Manifest {
            format: FORMAT,
            project: at.project.to_string(),
            kind: at.kind,
            date: date(at.day),
            object: object_key(at.project, at.kind, at.day),
            rows: sealed.rows,
            bytes: sealed.bytes,
            sha256: sealed.sha256.clone(),
            sources,
            updated_at: now,
        }
    }
}

/// One archive object: a project's rows of one kind and UTC day.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Target<'a> {
    pub project: &'a str,
    pub kind: Kind,
    pub day: u64,
}

/// Whether the stored object (its length and SHA-256 as read back) is the
/// one the manifest describes: only then may retention delete its sources.
pub fn verified(m: &Manifest, stored_bytes: u64, stored_sha256: &str) -> bool {
    m.bytes == stored_bytes && m.sha256 == stored_sha256
}

/// What an object came to once written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sealed {
    pub rows: u64,
    pub bytes: u64,
    pub sha256: String,
}

/// Bytes cut into R2 multipart parts of exactly `part_bytes` (R2 wants
/// every part but the last of one size). Holds at most one part.
#[derive(Clone, Debug)]
pub struct Parts {
    part_bytes: usize,
    buf: Vec<u8>,
    bytes: u64,
    parts: u32,
}

impl Parts {
    pub fn new(part_bytes: usize) -> Parts {
        Parts {
            part_bytes: part_bytes.max(1),
            buf: Vec::new(),
            bytes: 0,
            parts: 0,
        }
    }

    /// Takes bytes; the whole parts they complete, in order.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<Vec<u8>> {
        self.bytes += chunk.len() as u64;
        self.buf.extend_from_slice(chunk);
        let mut out = Vec::new();
        while self.buf.len() >= self.part_bytes {
            let rest = self.buf.split_off(self.part_bytes);
            out.push(std::mem::replace(&mut self.buf, rest));
            self.parts += 1;
        }
        out
    }

    /// Bytes taken so far.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Whether a part has been handed out (a multipart upload is needed;
    /// otherwise [`Parts::finish`]'s bytes are the whole object).
    pub fn multipart(&self) -> bool {
        self.parts > 0
    }

    /// The bytes not yet handed out: the last part, or the whole object.
    pub fn finish(self) -> Vec<u8> {
        self.buf
    }
}

/// The compressed bytes of one object as they are produced: counted,
/// hashed, and cut into R2 parts of exactly [`PART_BYTES`] (the last
/// shorter). Holds at most one part.
#[derive(Clone)]
pub struct ObjectWriter {
    parts: Parts,
    sha: Sha256,
    rows: u64,
}

impl Default for ObjectWriter {
    fn default() -> Self {
        ObjectWriter::with_part_bytes(PART_BYTES)
    }
}

impl ObjectWriter {
    /// A writer cutting parts of `part_bytes` (tests use small ones).
    pub fn with_part_bytes(part_bytes: usize) -> ObjectWriter {
        ObjectWriter {
            parts: Parts::new(part_bytes),
            sha: Sha256::new(),
            rows: 0,
        }
    }

    /// Counts lines handed to the compressor.
    pub fn count_rows(&mut self, n: u64) {
        self.rows += n;
    }

    /// Takes compressed bytes; the whole parts they complete, in order.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<Vec<u8>> {
        self.sha.update(chunk);
        self.parts.push(chunk)
    }

    /// Whether a part has been handed out (the object needs a multipart
    /// upload; otherwise [`ObjectWriter::finish`]'s bytes are the object).
    pub fn multipart(&self) -> bool {
        self.parts.multipart()
    }

    /// The bytes not yet handed out (the last part, or the whole object)
    /// and what the object came to.
    pub fn finish(self) -> (Vec<u8>, Sealed) {
        let sealed = Sealed {
            rows: self.rows,
            bytes: self.parts.bytes(),
            sha256: hex(&self.sha.finalize()),
        };
        (self.parts.finish(), sealed)
    }
}

/// SHA-256 of bytes read back, chunk by chunk.
#[derive(Clone, Default)]
pub struct Hasher {
    sha: Sha256,
    bytes: u64,
}

impl Hasher {
    pub fn update(&mut self, chunk: &[u8]) {
        self.sha.update(chunk);
        self.bytes += chunk.len() as u64;
    }

    /// (bytes, lower-case hex SHA-256).
    pub fn finish(self) -> (u64, String) {
        (self.bytes, hex(&self.sha.finalize()))
    }
}

pub fn hex(bytes: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(char::from(HEX[usize::from(b >> 4)]));
        s.push(char::from(HEX[usize::from(b & 15)]));
    }
    s
}

/// Splits decompressed bytes into lines across chunk boundaries, and stops
/// after `limit` lines (the rows a manifest counts; what follows them is a
/// crashed rewrite's and is dropped).
#[derive(Debug, Default)]
pub struct Lines {
    pending: Vec<u8>,
    taken: u64,
    limit: Option<u64>,
}

impl Lines {
    pub fn up_to(limit: Option<u64>) -> Lines {
        Lines {
            limit,
            ..Lines::default()
        }
    }

    /// Whether the limit is reached (stop reading).
    pub fn full(&self) -> bool {
        self.limit.is_some_and(|l| self.taken >= l)
    }

    /// The complete lines (each with its `\n`) this chunk finishes.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut rest = chunk;
        while !self.full() {
            let Some(i) = rest.iter().position(|b| *b == b'\n') else {
                self.pending.extend_from_slice(rest);
                break;
            };
            self.pending.extend_from_slice(&rest[..=i]);
            out.push(std::mem::take(&mut self.pending));
            self.taken += 1;
            rest = &rest[i + 1..];
        }
        out
    }

    /// A last line without its newline (a stream that ended mid-line is
    /// not the archive's: it is dropped), and how many lines were taken.
    pub fn finish(self) -> u64 {
        self.taken
    }
}

/// An audit row as one NDJSON line (the audit API's row; `project` is
/// the shard's). Audit rows hold no secret.
pub fn audit_line(row: &AuditRow) -> String {
    let mut s = serde_json::to_string(row).unwrap_or_default();
    s.push('\n');
    s
}

#[derive(Serialize, Deserialize)]
struct DeliveryLine<'a> {
    id: &'a str,
    project: &'a str,
    event_id: &'a str,
    event_type: &'a str,
    subscription_id: &'a str,
    url: String,
    status: &'a str,
    attempts_made: u32,
    next_attempt_at: Option<u64>,
    created_at: u64,
    updated_at: u64,
    request_id: Option<&'a str>,
    attempts: Vec<AttemptLine<'a>>,
}

#[derive(Serialize, Deserialize)]
struct AttemptLine<'a> {
    attempt: u32,
    url: String,
    status_code: Option<u16>,
    error: Option<&'a str>,
    response_excerpt: Option<&'a str>,
    duration_ms: u64,
    request_id: &'a str,
    at: u64,
    next_retry_at: Option<u64>,
}

/// A delivery record (one delivery with its attempts) as one
/// NDJSON line: the delivery log's fields (§10) and `updated_at`, each
/// attempt as `GET /deliveries/{id}` shows it. No subscription secret is
/// part of a record; an inspector's capture URL (its token is a
/// credential) is written as its template.
pub fn delivery_line(project: &str, a: &Archived) -> String {
    let d = &a.delivery;
    let line = DeliveryLine {
        id: &d.id,
        project,
        event_id: &d.event_id,
        event_type: &d.event_type,
        subscription_id: &d.subscription_id,
        url: without_capture_token(&d.url),
        status: d.status.as_str(),
        attempts_made: d.attempts_made,
        next_attempt_at: d.next_attempt_at,
        created_at: d.created_at,
        updated_at: d.updated_at,
        request_id: d.request_id.as_deref(),
        attempts: a
            .attempts
            .iter()
            .map(|t| AttemptLine {
                attempt: t.attempt,
                url: without_capture_token(&t.url),
                status_code: t.status_code,
                error: t.error.as_deref(),
                response_excerpt: t.response_excerpt.as_deref(),
                duration_ms: t.duration_ms,
                request_id: &t.request_id,
                at: t.at,
                next_retry_at: t.next_retry_at,
            })
            .collect(),
    };
    let mut s = serde_json::to_string(&line).unwrap_or_default();
    s.push('\n');
    s
}

/// `…/_postguard/inspect/<token>…` → `…/_postguard/inspect/{token}`.
fn without_capture_token(url: &str) -> String {
    const AT: &str = "/_postguard/inspect/";
    match url.find(AT) {
        Some(i) => format!("{}{AT}{{token}}", &url[..i]),
        None => url.to_string(),
    }
}

/// The time a line is filed under: an audit row's `time`, a delivery's
/// `created_at` (what exports filter by `since`/`until`).
pub fn line_time(kind: Kind, line: &[u8]) -> Option<u64> {
    #[derive(Deserialize)]
    struct AuditTime {
        time: u64,
    }
    #[derive(Deserialize)]
    struct DeliveryTime {
        created_at: u64,
    }
    match kind {
        Kind::Audit => serde_json::from_slice::<AuditTime>(line)
            .ok()
            .map(|t| t.time),
        Kind::Deliveries => serde_json::from_slice::<DeliveryTime>(line)
            .ok()
            .map(|t| t.created_at),
    }
}

/// Which of a source's days still have to be archived: those whose
/// manifest does not list it (`manifests[i]` is day `days[i]`'s).
pub fn pending_days(source: &Source, days: &[u64], manifests: &[Option<Manifest>]) -> Vec<u64> {
    days.iter()
        .zip(manifests)
        .filter(|(_, m)| !m.as_ref().is_some_and(|m| m.includes(source)))
        .map(|(d, _)| *d)
        .collect()
}

/// The cutoff retention applies with the archive on: whole UTC days only
/// (a day's object is complete once all its sources are archived), so the
/// retention cutoff is moved back to the start of its day.
pub fn archive_cutoff(cutoff_ms: u64) -> u64 {
    day_of(cutoff_ms) * DAY_MS
}

// ---------------------------------------------------------------- exports

/// `POST /_postguard/v1/exports` body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportRequest {
    pub project: String,
    pub kind: Kind,
    /// `[since, until)` (epoch ms).
    pub since: u64,
    pub until: u64,
}

/// Parses `{project, kind, since, until}`: `since` inclusive, `until`
/// exclusive, each RFC 3339 or epoch ms; at most [`MAX_EXPORT_DAYS`] days.
/// `project` may be `~none` (audit rows of requests without a valid key).
pub fn parse_export(body: &[u8]) -> Result<ExportRequest, Invalid> {
    use serde_json::Value;
    let obj: serde_json::Map<String, Value> = serde_json::from_slice(body)
        .map_err(|_| Invalid::from("body must be a JSON object {project, kind, since, until}"))?;
    if let Some(k) = obj
        .keys()
        .find(|k| !matches!(k.as_str(), "project" | "kind" | "since" | "until"))
    {
        let name: String = k.chars().take(64).collect();
        return Err(format!("{name}: unknown field").into());
    }
    let text = |k: &str| match obj.get(k) {
        Some(Value::String(s)) => Ok(s.as_str()),
        None => Err(Invalid::field(k, "is required")),
        Some(_) => Err(Invalid::field(k, "must be a string")),
    };
    let time = |k: &str| match obj.get(k) {
        Some(v) => crate::audit::time_value(k, v),
        None => Err(Invalid::field(k, "is required")),
    };
    let project = text("project")?;
    let kind = Kind::parse(text("kind")?)
        .ok_or_else(|| Invalid::field("kind", "must be \"audit\" or \"deliveries\""))?;
    let unscoped = project == crate::audit_shard::UNSCOPED && kind == Kind::Audit;
    if !crate::ids::is_valid_name(project) && !unscoped {
        return Err(Invalid::field(
            "project",
            "must be 1-64 characters of [A-Za-z0-9._-] (or ~none for audit rows without a project)",
        ));
    }
    let (since, until) = (time("since")?, time("until")?);
    if until <= since {
        return Err(Invalid::field("until", "must be after since"));
    }
    if until > crate::webhooks::ops::MAX_TIME_MS {
        return Err(Invalid::field("until", "must not be after 9999-12-31"));
    }
    if until - since > MAX_EXPORT_DAYS * DAY_MS {
        return Err(Invalid::field(
            "until",
            &format!("the range may span at most {MAX_EXPORT_DAYS} days: export it in parts"),
        ));
    }
    Ok(ExportRequest {
        project: project.to_string(),
        kind,
        since,
        until,
    })
}

/// An export's state (`GET /exports/{id}`).
pub use crate::webhooks::ops::TaskState as ExportState;

/// Signs download URLs of exports with a key derived from `ADMIN_TOKEN`
/// (HMAC-SHA256 keyed by a key of its own, as `gateway::seal_key` and the
/// portal signer do): rotating the operator token ends every URL.
pub struct UrlSigner {
    key: [u8; 64],
}

impl UrlSigner {
    pub fn from_admin_token(admin_token: &str) -> UrlSigner {
        use hmac::Mac;
        let mut m = crate::portal::hmac_with(&crate::portal::padded(b"postguard export url v1"));
        m.update(admin_token.as_bytes());
        UrlSigner {
            key: crate::portal::padded(&m.finalize().into_bytes()),
        }
    }

    fn mac(&self, id: &str, expires_ms: u64) -> hmac::Hmac<Sha256> {
        use hmac::Mac;
        let mut m = crate::portal::hmac_with(&self.key);
        m.update(id.as_bytes());
        m.update(&[0]);
        m.update(expires_ms.to_string().as_bytes());
        m
    }

    /// The signature of export `id`'s download until `expires_ms`
    /// (base64url, no padding).
    pub fn sign(&self, id: &str, expires_ms: u64) -> String {
        use base64::Engine;
        use hmac::Mac;
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(self.mac(id, expires_ms).finalize().into_bytes())
    }

    /// Checks a download's `expires` and `sig` (constant time), then expiry.
    pub fn verify(
        &self,
        id: &str,
        expires: Option<&str>,
        sig: Option<&str>,
        now_ms: u64,
    ) -> Result<(), Refused> {
        use base64::Engine;
        use hmac::Mac;
        let (Some(expires), Some(sig)) = (expires, sig) else {
            return Err(Refused::Missing);
        };
        let expires_ms: u64 = expires.parse().map_err(|_| Refused::Invalid)?;
        let tag = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(sig)
            .map_err(|_| Refused::Invalid)?;
        self.mac(id, expires_ms)
            .verify_slice(&tag)
            .map_err(|_| Refused::Invalid)?;
        match now_ms < expires_ms {
            true => Ok(()),
            false => Err(Refused::Expired),
        }
    }
}

/// Why a download was refused (the detail never repeats the signature).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("the download URL lacks its expires and sig parameters")]
    Missing,
    #[error("the download URL's signature is not valid")]
    Invalid,
    #[error("the download URL has expired: GET the export again for a new one")]
    Expired,
}

/// The download path of export `id` with its signature, valid until
/// `expires_ms` (on `public_url` when configured: `public_origin` is its
/// origin, or empty for a relative URL).
pub fn download_url(public_origin: &str, id: &str, expires_ms: u64, sig: &str) -> String {
    format!("{public_origin}/_postguard/v1/exports/{id}/download?expires={expires_ms}&sig={sig}")
}

/// Whether `id` has the shape of an export id (checked before any lookup).
pub fn is_export_id(id: &str) -> bool {
    id.strip_prefix("exp_")
        .is_some_and(|u| u.len() == 26 && u.bytes().all(|b| b.is_ascii_alphanumeric()))
}

#[cfg(test)]
mod tests;
