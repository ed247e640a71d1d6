"""A successful answer of the gateway, apart from the transport that fetched it
(``_http``) so that the error classes, which carry the last answer, need not import
the transport."""

from __future__ import annotations

import json as jsonlib
from typing import Any

import httpx


class Response:
    """A successful answer (status < 400). ``replayed`` tells whether the gateway
    answered from its idempotency store instead of running the request again."""

    def __init__(self, raw: httpx.Response, *, attempts: int, idempotency_key: str | None) -> None:
        self.status = raw.status_code
        self.headers = raw.headers
        self.content = raw.content
        #: How many attempts this call took (1 = no retry).
        self.attempts = attempts
        #: The Idempotency-Key every attempt carried (``None`` for GET/HEAD).
        self.idempotency_key = idempotency_key

    @property
    def request_id(self) -> str | None:
        value: str | None = self.headers.get("x-request-id")
        return value

    @property
    def replayed(self) -> bool:
        return str(self.headers.get("idempotent-replayed", "")).lower() == "true"

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")

    def json(self) -> Any:
        return jsonlib.loads(self.content) if self.content else None

    def __repr__(self) -> str:
        return f"<postguard.Response {self.status} attempts={self.attempts} replayed={self.replayed}>"
