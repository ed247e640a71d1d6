//! Asynchronous operations (`Prefer: respond-async`): [`Client::request_async`] sends a
//! call the gateway runs from a queue on the routes its operator named, and returns an
//! [`Operation`] at once; [`Operation::wait`] polls it — each poll after the `Retry-After`
//! the gateway sent — and returns its result. Sending the same request again with the same
//! Idempotency-Key gives back the same operation.
//!
//! On a route the gateway runs synchronously the answer comes at once: the handle is then
//! done already ([`Operation::id`] is `None`) and `wait` returns that answer.

use std::time::Duration;

use reqwest::Method;
use serde::Deserialize;

use crate::client::{Body, Client, RequestOptions, Response};
use crate::error::Error;
use crate::throttle::parse_retry_after;

/// Where a project's operations are read.
pub const OPERATIONS: &str = "/_postguard/v1/operations/";

/// An operation's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OperationState {
    Queued,
    Running,
    Succeeded,
    Failed,
}

impl OperationState {
    /// `succeeded` or `failed`.
    pub fn is_done(self) -> bool {
        matches!(self, OperationState::Succeeded | OperationState::Failed)
    }
}

/// `GET /_postguard/v1/operations/{id}`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct OperationInfo {
    pub id: String,
    pub state: OperationState,
    /// The kept answer's status, once done (absent when no attempt got an answer).
    #[serde(default)]
    pub status: Option<u16>,
    /// The request that created it: the 202's `X-Request-Id`.
    pub request_id: String,
    pub created_at: u64,
    #[serde(default)]
    pub completed_at: Option<u64>,
    pub method: String,
    pub path: String,
    pub attempts: u32,
    /// Why a `failed` operation has no answer it keeps (`key_revoked`, `not_kept`…);
    /// `None` otherwise.
    #[serde(default)]
    pub reason: Option<String>,
}

/// How [`Operation::wait`] polls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaitOptions {
    /// Give up ([`Error::OperationWaitTimeout`]) after this long; `None`: as long as it takes.
    pub timeout: Option<Duration>,
    /// Polls at least this far apart, and at most `max_interval`, within `Retry-After`.
    pub min_interval: Duration,
    pub max_interval: Duration,
}

impl Default for WaitOptions {
    fn default() -> Self {
        WaitOptions {
            timeout: None,
            min_interval: Duration::from_secs(1),
            max_interval: Duration::from_secs(30),
        }
    }
}

/// An asynchronous operation (see the module's documentation).
#[derive(Debug, Clone)]
pub struct Operation {
    client: Client,
    /// What the gateway last said about it (`None` for a synchronous answer).
    info: Option<OperationInfo>,
    idempotency_key: Option<String>,
    answered: Option<Response>,
}

fn segment(id: &str) -> Result<&str, Error> {
    // Operation ids are `op_` + base32: never path syntax.
    match !id.is_empty() && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        true => Ok(id),
        false => Err(Error::Invalid(format!("operation id {id:?}"))),
    }
}

impl Operation {
    /// The operation's id (`op_…`); `None` when the gateway answered synchronously.
    pub fn id(&self) -> Option<&str> {
        self.info.as_ref().map(|i| i.id.as_str())
    }

    /// Its `Location`: `/_postguard/v1/operations/{id}`.
    pub fn location(&self) -> Option<String> {
        self.id().map(|id| format!("{OPERATIONS}{id}"))
    }

    pub fn idempotency_key(&self) -> Option<&str> {
        self.idempotency_key.as_deref()
    }

    /// What the gateway last said about it.
    pub fn info(&self) -> Option<&OperationInfo> {
        self.info.as_ref()
    }

    pub fn state(&self) -> OperationState {
        self.info
            .as_ref()
            .map_or(OperationState::Succeeded, |i| i.state)
    }

    pub fn is_done(&self) -> bool {
        self.state().is_done()
    }

    /// Reads the operation again; the answer's `Retry-After` says when to look next.
    pub async fn refresh(&mut self) -> Result<Option<Duration>, Error> {
        let Some(id) = self.id().map(str::to_owned) else {
            return Ok(None);
        };
        let path = format!("{OPERATIONS}{}", segment(&id)?);
        let res = self
            .client
            .request(Method::GET, &path, Body::Empty, RequestOptions::default())
            .await?;
        self.info = Some(res.json()?);
        let now = self.client.unix_now();
        Ok(res
            .header("retry-after")
            .and_then(|v| parse_retry_after(v, now)))
    }

    /// The kept answer of a done operation: `Ok` when it `succeeded`;
    /// [`Error::OperationFailed`] with the last answer when it `failed`; an
    /// [`Error::Api`] `OPERATION_NOT_DONE` before.
    pub async fn result(&self) -> Result<Response, Error> {
        let (Some(info), None) = (&self.info, &self.answered) else {
            return self
                .answered
                .clone()
                .ok_or_else(|| Error::Invalid("an operation handle without an operation".into()));
        };
        let failed = info.state == OperationState::Failed;
        let path = format!("{OPERATIONS}{}/result", segment(&info.id)?);
        let mut opts = RequestOptions::default();
        if failed {
            // Its answer is a 5xx that must not be retried as if it were a lost one.
            opts = opts.retry(crate::retry::RetryPolicy {
                max_attempts: 1,
                ..crate::retry::RetryPolicy::default()
            });
        }
        match self
            .client
            .request(Method::GET, &path, Body::Empty, opts)
            .await
        {
            Err(e) if failed => match e.problem() {
                Some(p) => Err(Error::OperationFailed(Box::new(p.clone()))),
                None => Err(e),
            },
            other => other,
        }
    }

    /// Polls until the operation is done, each poll after its `Retry-After` (within
    /// `options`' bounds), then returns [`Operation::result`].
    pub async fn wait(&mut self, options: WaitOptions) -> Result<Response, Error> {
        let clock = self.client.clock();
        let deadline = options.timeout.map(|t| clock.now() + t);
        let max = options.max_interval.max(options.min_interval);
        while !self.is_done() {
            let retry_after = self.refresh().await?;
            if self.is_done() {
                break;
            }
            let left = deadline.map(|d| d.saturating_sub(clock.now()));
            if left.is_some_and(|l| l.is_zero()) {
                return Err(Error::OperationWaitTimeout {
                    id: self.id().unwrap_or_default().to_owned(),
                });
            }
            let pause = retry_after
                .unwrap_or(options.min_interval)
                .clamp(options.min_interval, max);
            clock.sleep(left.map_or(pause, |l| pause.min(l))).await;
        }
        self.result().await
    }
}

impl Client {
    /// [`Client::request`] with `Prefer: respond-async`: on a route the gateway runs
    /// asynchronously, a 202 and an [`Operation`] at once (its `wait` returns the result);
    /// elsewhere the answer itself, as a done handle. The call always carries an
    /// Idempotency-Key (it names the operation); one sent without is refused.
    pub async fn request_async(
        &self,
        method: Method,
        path: &str,
        body: Body,
        opts: RequestOptions,
    ) -> Result<Operation, Error> {
        if opts.without_idempotency_key {
            return Err(Error::Invalid(
                "an asynchronous call needs an Idempotency-Key".into(),
            ));
        }
        let mut opts = opts;
        let given = opts
            .headers
            .iter()
            .position(|(n, _)| n.eq_ignore_ascii_case("prefer"));
        match given {
            Some(i) => {
                let v = format!("respond-async, {}", opts.headers[i].1);
                opts.headers[i].1 = v;
            }
            None => opts.headers.push(("prefer".into(), "respond-async".into())),
        }
        if opts.idempotency_key.is_none() {
            opts.idempotency_key = Some(uuid::Uuid::new_v4().to_string());
        }
        let res = self.request(method, path, body, opts).await?;
        let accepted = res.status == 202
            && res
                .header("location")
                .is_some_and(|l| l.starts_with(OPERATIONS));
        let idempotency_key = res.idempotency_key.clone();
        Ok(match accepted {
            true => Operation {
                client: self.clone(),
                info: Some(res.json()?),
                idempotency_key,
                answered: None,
            },
            false => Operation {
                client: self.clone(),
                info: None,
                idempotency_key,
                answered: Some(res),
            },
        })
    }

    /// The handle of an existing operation by its id (e.g. one stored before a restart).
    pub async fn operation(&self, id: &str) -> Result<Operation, Error> {
        Ok(Operation {
            client: self.clone(),
            info: Some(self.get_operation(id).await?),
            idempotency_key: None,
            answered: None,
        })
    }

    /// `GET /operations/{id}`: an operation of the project (any key of it may read it).
    pub async fn get_operation(&self, id: &str) -> Result<OperationInfo, Error> {
        let path = format!("{OPERATIONS}{}", segment(id)?);
        self.request(Method::GET, &path, Body::Empty, RequestOptions::default())
            .await?
            .json()
    }
}
