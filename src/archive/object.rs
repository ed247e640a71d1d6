//! Archive and export objects in R2: one object written as it is
//! compressed (one `put` when it stays under a part, a multipart upload of
//! equal parts otherwise: never more than one part held), read back line by
//! line, hashed, and the manifests beside them.

use postguard_core::archive::{Hasher, Lines, Manifest, ObjectWriter, Sealed};
use worker::{Bucket, Data, MultipartUpload, Result, UploadedPart};

use super::gzip::{self, Gzip};
use crate::streams::Reader;

fn err(e: impl std::fmt::Display) -> worker::Error {
    worker::Error::RustError(e.to_string())
}

/// An object being written: NDJSON lines in, gzip out to R2.
pub struct Out<'a> {
    bucket: &'a Bucket,
    key: String,
    gzip: Option<Gzip>,
    w: ObjectWriter,
    upload: Option<MultipartUpload>,
    parts: Vec<UploadedPart>,
}

impl<'a> Out<'a> {
    pub fn new(bucket: &'a Bucket, key: String) -> Result<Out<'a>> {
        Ok(Out {
            bucket,
            key,
            gzip: Some(Gzip::new()?),
            w: ObjectWriter::default(),
            upload: None,
            parts: Vec::new(),
        })
    }

    /// Compresses `n` lines (`text`, each ending in `\n`).
    pub async fn lines(&mut self, text: &[u8], n: u64) -> Result<()> {
        if text.is_empty() {
            return Ok(());
        }
        let gzip = self
            .gzip
            .as_ref()
            .ok_or_else(|| err("the object is finished"))?;
        let out = gzip.write(text).await?;
        self.w.count_rows(n);
        self.absorb(&out).await
    }

    async fn absorb(&mut self, compressed: &[u8]) -> Result<()> {
        for part in self.w.push(compressed) {
            if self.upload.is_none() {
                let up = self
                    .bucket
                    .create_multipart_upload(self.key.clone())
                    .execute()
                    .await?;
                self.upload = Some(up);
            }
            let number = u16::try_from(self.parts.len() + 1)
                .map_err(|_| err("an object of more than 65,535 parts"))?;
            if let Some(up) = &self.upload {
                self.parts
                    .push(up.upload_part(number, Data::Bytes(part)).await?);
            }
        }
        Ok(())
    }

    /// Ends the object and stores its last part (or the whole of it); what
    /// it came to. On error the upload is aborted.
    pub async fn finish(mut self) -> Result<Sealed> {
        match self.finish_inner().await {
            Ok(s) => Ok(s),
            Err(e) => {
                if let Some(up) = &self.upload {
                    let _ = up.abort().await;
                }
                Err(e)
            }
        }
    }

    async fn finish_inner(&mut self) -> Result<Sealed> {
        let gzip = self.gzip.take().ok_or_else(|| err("finished twice"))?;
        let tail = gzip.finish().await?;
        self.absorb(&tail).await?;
        let w = std::mem::take(&mut self.w);
        let (last, sealed) = w.finish();
        match self.upload.take() {
            None => {
                self.bucket
                    .put(self.key.clone(), Data::Bytes(last))
                    .execute()
                    .await?;
            }
            Some(up) => {
                if !last.is_empty() {
                    let number = u16::try_from(self.parts.len() + 1)
                        .map_err(|_| err("an object of more than 65,535 parts"))?;
                    self.parts
                        .push(up.upload_part(number, Data::Bytes(last)).await?);
                }
                // A failed completion leaves the parts to R2, which removes an
                // incomplete upload after seven days.
                up.complete(std::mem::take(&mut self.parts)).await?;
            }
        }
        Ok(sealed)
    }

    /// Gives up: the compressor stops and a multipart upload is aborted.
    pub async fn abort(mut self) {
        if let Some(g) = self.gzip.take() {
            g.abort();
        }
        if let Some(up) = self.upload.take() {
            let _ = up.abort().await;
        }
    }
}

/// The stored object `key` read as lines (decompressed), a chunk's worth at
/// a time, at most `limit` of them; `None` when there is no such object.
pub struct LineReader {
    reader: Option<Reader>,
    lines: Lines,
}

impl LineReader {
    pub async fn open(
        bucket: &Bucket,
        key: &str,
        limit: Option<u64>,
    ) -> Result<Option<LineReader>> {
        let Some(stream) = body(bucket, key).await? else {
            return Ok(None);
        };
        Ok(Some(LineReader {
            reader: Some(gzip::gunzip(&stream)?),
            lines: Lines::up_to(limit),
        }))
    }

    /// The next lines, `None` at the end (or past the limit).
    pub async fn next(&mut self) -> Result<Option<Vec<Vec<u8>>>> {
        loop {
            if self.lines.full() {
                if let Some(r) = self.reader.take() {
                    r.cancel();
                }
                return Ok(None);
            }
            let Some(r) = &self.reader else {
                return Ok(None);
            };
            match r.next().await? {
                Some(chunk) => {
                    let got = self.lines.push(&chunk);
                    if !got.is_empty() {
                        return Ok(Some(got));
                    }
                }
                None => {
                    self.reader = None;
                    return Ok(None);
                }
            }
        }
    }

    /// Lines read so far.
    pub fn taken(self) -> u64 {
        self.lines.finish()
    }
}

/// The object's body as a stream, `None` when it does not exist.
pub async fn body(bucket: &Bucket, key: &str) -> Result<Option<worker::web_sys::ReadableStream>> {
    let Some(object) = bucket.get(key).execute().await? else {
        return Ok(None);
    };
    match object.body().map(|b| b.response_body()).transpose()? {
        Some(worker::ResponseBody::Stream(s)) => Ok(Some(s)),
        _ => Ok(None),
    }
}

/// The stored bytes of `key` hashed: `(bytes, SHA-256 hex)`, `None` when
/// there is no such object.
pub async fn digest(bucket: &Bucket, key: &str) -> Result<Option<(u64, String)>> {
    let Some(stream) = body(bucket, key).await? else {
        return Ok(None);
    };
    let reader = Reader::plain(&stream)?;
    let mut h = Hasher::default();
    while let Some(chunk) = reader.next().await? {
        h.update(&chunk);
    }
    Ok(Some(h.finish()))
}

/// The manifest at `key`, `None` when there is none.
pub async fn manifest(bucket: &Bucket, key: &str) -> Result<Option<Manifest>> {
    let Some(object) = bucket.get(key).execute().await? else {
        return Ok(None);
    };
    let Some(body) = object.body() else {
        return Ok(None);
    };
    let bytes = body.bytes().await?;
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| err(format!("manifest {key} unreadable: {e}")))
}

pub async fn put_manifest(bucket: &Bucket, key: &str, m: &Manifest) -> Result<()> {
    let json = serde_json::to_vec(m).map_err(err)?;
    bucket.put(key, Data::Bytes(json)).execute().await?;
    Ok(())
}
