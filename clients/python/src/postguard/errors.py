"""Typed errors. Every one carries the problem's ``code``, ``detail``, ``request_id``
and the HTTP ``status`` (``None`` when no answer arrived), so that "what happened to
my request?" is one audit-log lookup away.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._response import Response


class PostguardError(Exception):
    """Base class of every error the SDK raises."""

    #: The default ``code`` of the class (an instance may carry a more precise one).
    default_code = "POSTGUARD_ERROR"

    def __init__(
        self,
        detail: str,
        *,
        code: str | None = None,
        status: int | None = None,
        request_id: str | None = None,
        title: str | None = None,
        type: str | None = None,
        attempts: int = 0,
        idempotency_key: str | None = None,
        response: Response | None = None,
        problem: dict[str, Any] | None = None,
    ) -> None:
        self.code = code or self.default_code
        self.detail = detail
        self.status = status
        self.request_id = request_id
        self.title = title
        self.type = type
        #: How many attempts were made before giving up (0 when none was sent).
        self.attempts = attempts
        #: The Idempotency-Key every attempt of the call carried (mutating calls).
        self.idempotency_key = idempotency_key
        #: The last answer (``None`` for network errors).
        self.response = response
        #: The parsed problem+json body, when the answer was one.
        self.problem = problem
        super().__init__(self._message())

    def _message(self) -> str:
        parts = [self.code]
        if self.status is not None:
            parts.append(f"HTTP {self.status}")
        msg = f"{' '.join(parts)}: {self.detail}"
        if self.request_id:
            msg += f" (request_id {self.request_id})"
        return msg


class ConfigurationError(PostguardError, ValueError):
    """The client was used without what a call needs (e.g. no admin token)."""

    default_code = "CLIENT_CONFIGURATION"


class NetworkError(PostguardError):
    """No answer: connection refused or reset, timeout — after every retry."""

    default_code = "NETWORK_ERROR"


class ApiError(PostguardError):
    """An error answer (status ≥ 400) from the gateway or, through it, the origin.
    Answers that are not problem+json get the code ``HTTP_ERROR``."""

    default_code = "HTTP_ERROR"


class InvalidApiKey(ApiError):
    default_code = "INVALID_API_KEY"


class ApiKeyExpired(ApiError):
    """401: the API key passed its ``expires_at`` (or a rerolled key's old secret its
    grace). Never retried: ask the operator for a new key."""

    default_code = "API_KEY_EXPIRED"


class Unauthorized(ApiError):
    default_code = "UNAUTHORIZED"


class Forbidden(ApiError):
    default_code = "FORBIDDEN"


class NotFound(ApiError):
    default_code = "NOT_FOUND"


class ValidationError(ApiError):
    default_code = "VALIDATION_ERROR"


class PayloadTooLarge(ApiError):
    default_code = "PAYLOAD_TOO_LARGE"


class IdempotencyKeyRequired(ApiError):
    default_code = "IDEMPOTENCY_KEY_REQUIRED"


class IdempotencyKeyInvalid(ApiError):
    default_code = "IDEMPOTENCY_KEY_INVALID"


class IdempotencyKeyInProgress(ApiError):
    """The first request with this key was still running after every retry."""

    default_code = "IDEMPOTENCY_KEY_IN_PROGRESS"


class IdempotencyKeyReuseConflict(ApiError):
    """The key was used before for a different request (method, path or body):
    a bug in the caller, never retried."""

    default_code = "IDEMPOTENCY_KEY_REUSE_CONFLICT"


class RateLimitExceeded(ApiError):
    """Still 429 after every retry (each waited at least ``Retry-After``): a quota of
    the key refused the request."""

    default_code = "RATE_LIMIT_EXCEEDED"

    @property
    def retry_after_s(self) -> float | None:
        if self.response is None:
            return None
        value = self.response.headers.get("retry-after")
        return float(value) if value is not None and value.isdigit() else None

    @property
    def violated_policies(self) -> list[str]:
        """The problem's ``violated-policies``: every policy that refused the request
        (``inflight`` for the concurrency quota); empty when the answer named none."""
        names = (self.problem or {}).get("violated-policies")
        return [n for n in names if isinstance(n, str)] if isinstance(names, list) else []

    @property
    def policy(self) -> str | None:
        """The policy that binds: the first member of the ``RateLimit`` field (the
        gateway lists the one that refused first), else the first violated policy."""
        field = self.response.headers.get("ratelimit") if self.response is not None else None
        first = field.split(",", 1)[0].split(";", 1)[0].strip().strip('"') if field else ""
        if first:
            return first
        violated = self.violated_policies
        return violated[0] if violated else None


class ConcurrencyLimitExceeded(RateLimitExceeded):
    """429: the key had as many requests in flight at the origin as its plan allows
    (its ``concurrency``). Retried after ``Retry-After`` (1 s) like any 429."""

    default_code = "CONCURRENCY_LIMIT_EXCEEDED"


class ServerError(ApiError):
    """A 5xx answer (after every retry for 502/503/504)."""

    default_code = "SERVER_ERROR"


class OriginUnreachable(ServerError):
    default_code = "ORIGIN_UNREACHABLE"


class OriginTimeout(ServerError):
    default_code = "ORIGIN_TIMEOUT"


class ConfigInvalid(ServerError):
    default_code = "CONFIG_INVALID"


class WebhookVerificationError(PostguardError):
    """A webhook delivery that does not verify; answer 400. Catch a subclass to tell
    why (the same codes as the TypeScript SDK and variants as the Rust SDK)."""

    default_code = "WEBHOOK_VERIFICATION_FAILED"


class WebhookSignatureInvalid(WebhookVerificationError):
    """No given secret signed this body with these headers: tampered, or signed with
    another secret."""

    default_code = "WEBHOOK_SIGNATURE_INVALID"


class WebhookTimestampOutOfTolerance(WebhookVerificationError):
    """``webhook-timestamp`` is further from now than the tolerance, in the past (a
    replayed or long-delayed delivery) or in the future (a skewed clock)."""

    default_code = "WEBHOOK_TIMESTAMP_OUT_OF_TOLERANCE"


class WebhookHeadersMissing(WebhookVerificationError):
    """``webhook-id``, ``webhook-timestamp`` or ``webhook-signature`` is missing or
    malformed (a timestamp that is not Unix seconds)."""

    default_code = "WEBHOOK_HEADERS_MISSING"


class WebhookBodyInvalid(WebhookVerificationError):
    """The signature holds, but the body is not the gateway's event JSON."""

    default_code = "WEBHOOK_BODY_INVALID"


_BY_CODE: dict[str, type[ApiError]] = {
    cls.default_code: cls
    for cls in (
        InvalidApiKey,
        ApiKeyExpired,
        Unauthorized,
        Forbidden,
        NotFound,
        ValidationError,
        PayloadTooLarge,
        IdempotencyKeyRequired,
        IdempotencyKeyInvalid,
        IdempotencyKeyInProgress,
        IdempotencyKeyReuseConflict,
        RateLimitExceeded,
        ConcurrencyLimitExceeded,
        OriginUnreachable,
        OriginTimeout,
        ConfigInvalid,
    )
}


def error_class(status: int, code: str | None) -> type[ApiError]:
    """The error type for an answer: by the problem's code, else by the status."""
    if code is not None and code in _BY_CODE:
        return _BY_CODE[code]
    if status == 429:
        return RateLimitExceeded
    if status >= 500:
        return ServerError
    return ApiError
