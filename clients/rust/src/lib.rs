#![doc = include_str!("../README.md")]
//!
//! The README's examples above are compiled as doc tests.

pub mod api;
pub mod client;
pub mod clock;
pub mod error;
pub mod operation;
pub mod retry;
pub mod throttle;
pub mod webhook;

pub use api::{
    Granularity, IdempotencyState, IdempotencyStatus, ImportKey, ImportStatus, ImportedKey,
    KeyUpdate, NewEvent, NewKey, NewSubscription, Page, PlanOverrides, Query, RerolledKey, Usage,
    UsageQuery,
};
pub use client::{
    AttemptEvent, Body, Client, ClientBuilder, Metrics, RequestOptions, Response, USER_AGENT,
};
pub use error::{Error, Problem};
pub use operation::{Operation, OperationInfo, OperationState, WaitOptions};
pub use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
pub use reqwest::Method;
pub use retry::RetryPolicy;
pub use throttle::ThrottleConfig;
pub use webhook::{Dedupe, Event, MemoryDedupe, Verifier, VerifyError};
