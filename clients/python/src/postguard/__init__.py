"""postguard — a Python client for the postguard gateway.

* :class:`Client` (sync, thread-safe) and :class:`AsyncClient` (asyncio): one
  Idempotency-Key per logical operation, polite retries (``Retry-After`` as a floor),
  proactive throttling from the rate-limit headers with one limiter per instance.
* ``request(..., async_=True)``: an asynchronous operation (``Prefer: respond-async``)
  whose ``wait()`` polls it with ``Retry-After`` and returns its result.
* :func:`verify` for webhook deliveries (Standard Webhooks), with a dedupe hook.
* Typed errors under :class:`PostguardError`.
"""

from ._core import (
    RateLimitInfo,
    RetryPolicy,
    Throttle,
    backoff_delay,
    decide,
    is_retryable,
    parse_rate_limit,
    replay_safe,
    reserve_for,
)
from ._http import AttemptInfo, Response
from ._version import __version__
from .async_client import AsyncClient
from .client import Client
from .errors import (
    ApiError,
    ApiKeyExpired,
    ConcurrencyLimitExceeded,
    ConfigInvalid,
    ConfigurationError,
    Forbidden,
    IdempotencyKeyInProgress,
    IdempotencyKeyInvalid,
    IdempotencyKeyRequired,
    IdempotencyKeyReuseConflict,
    InvalidApiKey,
    NetworkError,
    NotFound,
    OriginTimeout,
    OriginUnreachable,
    PayloadTooLarge,
    PostguardError,
    RateLimitExceeded,
    ServerError,
    Unauthorized,
    ValidationError,
    WebhookBodyInvalid,
    WebhookHeadersMissing,
    WebhookSignatureInvalid,
    WebhookTimestampOutOfTolerance,
    WebhookVerificationError,
)
from .operations import (
    AsyncOperation,
    Operation,
    OperationFailed,
    OperationInfo,
    OperationState,
    OperationWaitTimeout,
)
from .types import Page
from .webhooks import DedupeHook, MemoryDedupe, WebhookEvent, verify

__all__ = [
    "ApiError",
    "ApiKeyExpired",
    "AsyncClient",
    "AsyncOperation",
    "AttemptInfo",
    "Client",
    "ConcurrencyLimitExceeded",
    "ConfigInvalid",
    "ConfigurationError",
    "DedupeHook",
    "Forbidden",
    "IdempotencyKeyInProgress",
    "IdempotencyKeyInvalid",
    "IdempotencyKeyRequired",
    "IdempotencyKeyReuseConflict",
    "InvalidApiKey",
    "MemoryDedupe",
    "NetworkError",
    "NotFound",
    "Operation",
    "OperationFailed",
    "OperationInfo",
    "OperationState",
    "OperationWaitTimeout",
    "OriginTimeout",
    "OriginUnreachable",
    "Page",
    "PayloadTooLarge",
    "PostguardError",
    "RateLimitExceeded",
    "RateLimitInfo",
    "Response",
    "RetryPolicy",
    "ServerError",
    "Throttle",
    "Unauthorized",
    "ValidationError",
    "WebhookBodyInvalid",
    "WebhookEvent",
    "WebhookHeadersMissing",
    "WebhookSignatureInvalid",
    "WebhookTimestampOutOfTolerance",
    "WebhookVerificationError",
    "__version__",
    "backoff_delay",
    "decide",
    "is_retryable",
    "parse_rate_limit",
    "replay_safe",
    "reserve_for",
    "verify",
]
