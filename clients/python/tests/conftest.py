"""Fixtures for the integration tests, which need the real gateway, origin, fault
proxy and webhook receiver started by tests/sdk-python.test.mjs. It hands them over
in environment variables:

PG_GATEWAY_URL, PG_ORIGIN_URL            the gateway under Miniflare, the demo origin
PG_PROXY_URL, PG_PROXY_CONTROL_URL       the TCP fault proxy in front of the gateway
PG_ADMIN_TOKEN, PG_ORIGIN_TOKEN          operator and origin credentials
PG_PLAN_BIG, PG_PLAN_SMALL, PG_PLAN_TINY plan names: generous, 10 requests per 5 s, 5 per 5 s
PG_PLAN_TIERED, PG_PLAN_SINGLE           several named policies with concurrency 2; concurrency 1
PG_REQUIRED_FROM                         idempotency.required_from (in the future: a POST
                                         without an Idempotency-Key is forwarded and counted)
PG_RECEIVER_URL, PG_CAPTURES_URL         a webhook receiver (paths under /reject/ answer 400);
                                         GET the captures URL for what it received
PG_REPORT                                a file to write the measured figures into (JSON lines)

Without PG_GATEWAY_URL the integration tests are skipped (the unit tests still run);
the driver passes PG_REQUIRE_INTEGRATION=1, which turns that skip into a failure.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

import postguard


@dataclass(frozen=True)
class Env:
    gateway: str
    origin: str
    proxy: str
    proxy_control: str
    admin_token: str
    origin_token: str
    plan_big: str
    plan_small: str
    plan_tiny: str
    plan_tiered: str
    plan_single: str
    required_from: str
    receiver: str
    captures: str
    report_file: str | None


@pytest.fixture(scope="session")
def env() -> Env:
    if "PG_GATEWAY_URL" not in os.environ:
        if os.environ.get("PG_REQUIRE_INTEGRATION") == "1":
            pytest.fail("PG_GATEWAY_URL is not set")
        pytest.skip("integration: run through tests/sdk-python.test.mjs")
    e = os.environ
    return Env(
        gateway=e["PG_GATEWAY_URL"],
        origin=e["PG_ORIGIN_URL"],
        proxy=e["PG_PROXY_URL"],
        proxy_control=e["PG_PROXY_CONTROL_URL"],
        admin_token=e["PG_ADMIN_TOKEN"],
        origin_token=e["PG_ORIGIN_TOKEN"],
        plan_big=e["PG_PLAN_BIG"],
        plan_small=e["PG_PLAN_SMALL"],
        plan_tiny=e["PG_PLAN_TINY"],
        plan_tiered=e["PG_PLAN_TIERED"],
        plan_single=e["PG_PLAN_SINGLE"],
        required_from=e["PG_REQUIRED_FROM"],
        receiver=e["PG_RECEIVER_URL"],
        captures=e["PG_CAPTURES_URL"],
        report_file=e.get("PG_REPORT"),
    )


@pytest.fixture(scope="session")
def admin(env: Env) -> Iterator[postguard.Client]:
    with postguard.Client(env.gateway, admin_token=env.admin_token, origin_token=env.origin_token) as c:
        yield c


@dataclass(frozen=True)
class Key:
    project: str
    key: str


@pytest.fixture
def new_key(admin: postguard.Client, env: Env) -> Any:
    """A fresh project and API key (created with the SDK's operator method)."""

    def make(plan: str | None = None) -> Key:
        project = f"py-{uuid.uuid4().hex[:8]}"
        created = admin.create_key(project, plan or env.plan_big, name="python sdk test")
        return Key(project, created["key"])

    return make


@pytest.fixture(scope="session")
def report(env: Env) -> Any:
    """Record a figure for the driver to print (and for the closing note)."""

    def write(name: str, **figures: Any) -> None:
        line = json.dumps({"test": name, **figures})
        print(f"FIGURES {line}")
        if env.report_file:
            with open(env.report_file, "a", encoding="utf-8") as f:
                f.write(line + "\n")

    return write


@pytest.fixture(scope="session")
def origin_stats(env: Env) -> Any:
    def get() -> dict[str, Any]:
        return dict(httpx.get(f"{env.origin}/__demo/stats", timeout=10).json())

    return get


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
