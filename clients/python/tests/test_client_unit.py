"""Unit tests of the clients' retry loop: httpx's MockTransport plays the network,
a fake sleep records the delays (no real waiting), a fixed random fixes the jitter.
The real gateway is exercised by test_integration.py."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

import postguard
from postguard import AsyncClient, Client, RetryPolicy

Handler = Callable[[httpx.Request], httpx.Response]


def problem(status: int, code: str, headers: dict[str, str] | None = None) -> httpx.Response:
    body = {
        "type": f"urn:postguard:problem:{code.lower()}",
        "title": code,
        "status": status,
        "detail": f"detail of {code}",
        "code": code,
        "request_id": "req_test",
    }
    return httpx.Response(
        status, json=body, headers={"content-type": "application/problem+json", **(headers or {})}
    )


def scripted(answers: list[httpx.Response | Exception]) -> tuple[list[httpx.Request], Handler]:
    seen: list[httpx.Request] = []
    it: Iterator[httpx.Response | Exception] = iter(answers)

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        a = next(it)
        if isinstance(a, Exception):
            raise a
        return a

    return seen, handler


def client(handler: Handler, sleeps: list[float], **kw: object) -> Client:
    return Client(
        "http://gw.test",
        api_key="pgk_test",
        admin_token="adm",
        transport=httpx.MockTransport(handler),
        retry=kw.pop("retry", RetryPolicy(max_attempts=4)),
        _sleep=sleeps.append,
        _random=lambda: 0.0,
        **kw,  # type: ignore[arg-type]
    )


def test_one_key_for_every_attempt_of_a_call() -> None:
    seen, handler = scripted(
        [
            httpx.ReadError("reset"),
            httpx.Response(503),
            problem(409, "IDEMPOTENCY_KEY_IN_PROGRESS", {"retry-after": "2"}),
            httpx.Response(201, json={"ok": True}, headers={"idempotent-replayed": "true"}),
        ]
    )
    sleeps: list[float] = []
    r = client(handler, sleeps).request("POST", "/orders", {"amount": 1})
    assert r.status == 201 and r.replayed and r.attempts == 4
    keys = {req.headers["idempotency-key"] for req in seen}
    assert len(keys) == 1 and r.idempotency_key in keys
    uuid.UUID(r.idempotency_key or "", version=4)
    assert {req.content for req in seen} == {b'{"amount":1}'}  # identical bytes: one fingerprint
    assert sleeps == [0.5, 1.0, 2.0 * 2**2]  # Retry-After 2 s is the base at attempt 3


def test_two_calls_get_two_keys_and_the_callers_key_is_kept() -> None:
    seen, handler = scripted([httpx.Response(201), httpx.Response(201), httpx.Response(201)])
    c = client(handler, [])
    c.request("POST", "/a")
    c.request("POST", "/a")
    c.request("PUT", "/a", idempotency_key="mine-1")
    keys = [req.headers["idempotency-key"] for req in seen]
    assert keys[0] != keys[1] and keys[2] == "mine-1"


def test_get_has_no_key_and_is_retried() -> None:
    seen, handler = scripted([httpx.ConnectError("refused"), httpx.Response(200, json={})])
    r = client(handler, []).request("GET", "/things", params={"q": "x"})
    assert r.attempts == 2 and r.idempotency_key is None
    assert all("idempotency-key" not in req.headers for req in seen)
    assert seen[0].url.params["q"] == "x"


def test_reuse_conflict_is_typed_and_not_retried() -> None:
    seen, handler = scripted([problem(422, "IDEMPOTENCY_KEY_REUSE_CONFLICT")])
    with pytest.raises(postguard.IdempotencyKeyReuseConflict) as e:
        client(handler, []).request("POST", "/a", {"x": 1}, idempotency_key="k1")
    assert len(seen) == 1
    err = e.value
    assert (err.code, err.status, err.request_id, err.idempotency_key) == (
        "IDEMPOTENCY_KEY_REUSE_CONFLICT",
        422,
        "req_test",
        "k1",
    )
    assert err.detail == "detail of IDEMPOTENCY_KEY_REUSE_CONFLICT"
    assert isinstance(err, postguard.PostguardError)


@pytest.mark.parametrize(
    ("status", "code", "cls"),
    [
        (400, "IDEMPOTENCY_KEY_REQUIRED", postguard.IdempotencyKeyRequired),
        (401, "INVALID_API_KEY", postguard.InvalidApiKey),
        (403, "FORBIDDEN", postguard.Forbidden),
        (404, "NOT_FOUND", postguard.NotFound),
        (422, "VALIDATION_ERROR", postguard.ValidationError),
        (413, "PAYLOAD_TOO_LARGE", postguard.PayloadTooLarge),
        (500, "CONFIG_INVALID", postguard.ConfigInvalid),
    ],
)
def test_client_errors_are_never_retried(status: int, code: str, cls: type[Exception]) -> None:
    seen, handler = scripted([problem(status, code)])
    with pytest.raises(cls):
        client(handler, []).request("POST", "/a")
    assert len(seen) == 1


def test_origin_error_without_problem_body() -> None:
    _, handler = scripted([httpx.Response(404, text="no such thing")])
    with pytest.raises(postguard.ApiError) as e:
        client(handler, []).request("GET", "/nothing")
    assert e.value.code == "HTTP_ERROR" and e.value.status == 404
    assert e.value.response is not None and e.value.response.text == "no such thing"


def test_429_is_retried_after_retry_after_then_typed() -> None:
    answers: list[httpx.Response | Exception] = [
        problem(429, "RATE_LIMIT_EXCEEDED", {"retry-after": "3"}) for _ in range(4)
    ]
    seen, handler = scripted(answers)
    sleeps: list[float] = []
    with pytest.raises(postguard.RateLimitExceeded) as e:
        client(handler, sleeps, proactive=False).request("POST", "/a")
    assert len(seen) == 4 and e.value.attempts == 4
    assert sleeps == [3.0, 6.0, 12.0]
    assert e.value.retry_after_s == 3.0


def test_network_errors_exhausted() -> None:
    seen, handler = scripted([httpx.ReadTimeout("slow")] * 4)
    with pytest.raises(postguard.NetworkError) as e:
        client(handler, []).request("POST", "/a")
    assert len(seen) == 4 and e.value.status is None and e.value.idempotency_key
    assert isinstance(e.value.__cause__, httpx.ReadTimeout)


def test_unrecoverable_transport_error_is_typed_and_not_retried() -> None:
    seen, handler = scripted([httpx.UnsupportedProtocol("ftp://")])
    with pytest.raises(postguard.NetworkError) as e:
        client(handler, []).request("POST", "/a")
    assert len(seen) == 1 and e.value.attempts == 1


def test_headers_auth_and_user_agent() -> None:
    seen, handler = scripted(
        [httpx.Response(200, json={"prefix": "pgk_x"}), httpx.Response(201, json={"key": "k"})]
    )
    c = client(handler, [])
    c.me()
    c.create_key("p", "trial")
    assert seen[0].headers["authorization"] == "Bearer pgk_test"
    assert seen[0].headers["user-agent"].startswith(f"postguard-python/{postguard.__version__} ")
    assert seen[1].headers["authorization"] == "Bearer adm"
    assert json.loads(seen[1].content) == {"project": "p", "plan": "trial"}


def test_client_headers_override_defaults_case_insensitively() -> None:
    seen, handler = scripted([httpx.Response(200, json={})])
    client(handler, [], headers={"User-Agent": "acme-billing/2"}).request("GET", "/x")
    assert seen[0].headers.get_list("user-agent") == ["acme-billing/2"]


def test_missing_credential_is_a_configuration_error() -> None:
    _, handler = scripted([])
    with pytest.raises(postguard.ConfigurationError):
        client(handler, []).publish_event("p", "t", {})


def test_audit_iterator_follows_the_cursor() -> None:
    pages = [
        httpx.Response(200, json={"data": [{"request_id": "a"}, {"request_id": "b"}], "next_cursor": "c1"}),
        httpx.Response(200, json={"data": [{"request_id": "c"}], "next_cursor": None}),
    ]
    seen, handler = scripted(list(pages))
    rows = list(client(handler, []).iter_audit(status="2xx", limit=2))
    assert [r["request_id"] for r in rows] == ["a", "b", "c"]
    assert "cursor" not in seen[0].url.params and seen[1].url.params["cursor"] == "c1"
    assert seen[1].url.params["status"] == "2xx"


def test_on_attempt_hook_sees_every_attempt() -> None:
    _, handler = scripted(
        [httpx.ReadError("x"), problem(429, "RATE_LIMIT_EXCEEDED", {"retry-after": "1"}), httpx.Response(201)]
    )
    seen: list[postguard.AttemptInfo] = []
    client(handler, [], on_attempt=seen.append, proactive=False).request("POST", "/a")
    assert [(a.attempt, a.status) for a in seen] == [(1, None), (2, 429), (3, 201)]
    assert isinstance(seen[0].error, httpx.ReadError)


@pytest.mark.anyio
async def test_async_client_same_semantics() -> None:
    seen, handler = scripted([httpx.Response(502), problem(422, "IDEMPOTENCY_KEY_REUSE_CONFLICT")])
    sleeps: list[float] = []

    async def fake_sleep(s: float) -> None:
        sleeps.append(s)

    async def ahandler(request: httpx.Request) -> httpx.Response:
        return handler(request)

    c = AsyncClient(
        "http://gw.test",
        api_key="k",
        transport=httpx.MockTransport(ahandler),
        _sleep=fake_sleep,
        _random=lambda: 0.0,
    )
    with pytest.raises(postguard.IdempotencyKeyReuseConflict):
        await c.request("POST", "/a", {"x": 1})
    assert sleeps == [0.5] and len({r.headers["idempotency-key"] for r in seen}) == 1
    await c.aclose()


@pytest.mark.anyio
async def test_async_audit_iterator_follows_the_cursor() -> None:
    pages = [
        httpx.Response(200, json={"data": [{"request_id": "a"}], "next_cursor": "c1"}),
        httpx.Response(200, json={"data": [{"request_id": "b"}], "next_cursor": None}),
    ]
    seen, handler = scripted(list(pages))

    async def ahandler(request: httpx.Request) -> httpx.Response:
        return handler(request)

    async with AsyncClient("http://gw.test", api_key="k", transport=httpx.MockTransport(ahandler)) as c:
        rows = [row["request_id"] async for row in c.iter_audit(method="POST")]
    assert rows == ["a", "b"]
    assert seen[1].url.params["cursor"] == "c1" and seen[1].url.params["method"] == "POST"


# --- the retry rule (issue 23 item 1) ------------------------------------------------------


def test_a_mutating_call_without_a_key_is_not_retried_after_a_lost_answer() -> None:
    seen, handler = scripted([httpx.ReadError("reset"), httpx.Response(200)])
    with pytest.raises(postguard.NetworkError) as e:
        client(handler, []).request("PATCH", "/orders/1", {"a": 1}, idempotency_key=False)
    assert len(seen) == 1 and "idempotency-key" not in seen[0].headers
    assert e.value.idempotency_key is None
    seen, handler = scripted([httpx.Response(503), httpx.Response(200)])
    with pytest.raises(postguard.ServerError):
        client(handler, []).request("DELETE", "/orders/1", idempotency_key=False)
    assert len(seen) == 1
    # Not executed (429): retried even without a key.
    seen, handler = scripted([problem(429, "RATE_LIMIT_EXCEEDED", {"retry-after": "1"}), httpx.Response(204)])
    assert client(handler, [], proactive=False).request("DELETE", "/o", idempotency_key=False).attempts == 2
    # The same call with a key (the default) is retried, with that key.
    seen, handler = scripted([httpx.ReadError("reset"), httpx.Response(503), httpx.Response(200)])
    assert client(handler, []).request("PATCH", "/orders/1", {"a": 1}).attempts == 3
    assert len({r.headers["idempotency-key"] for r in seen}) == 1


GATEWAY_CALLS: list[tuple[str, Callable[[Client], object]]] = [
    ("create_key", lambda c: c.create_key("p", "trial")),
    (
        "import_keys",
        lambda c: c.import_keys(
            [{"key": "sk_live_4eC39HqLyjWDarjtT1zdp7dc", "project": "p", "plan": "trial"}]
        ),
    ),
    ("update_key", lambda c: c.update_key("key_1", {"plan": "pro"})),
    ("reroll_key", lambda c: c.reroll_key("key_1", grace_s=60)),
    ("revoke_key", lambda c: c.revoke_key("key_1")),
    ("create_portal_link", lambda c: c.create_portal_link("p")),
    ("create_webhook", lambda c: c.create_webhook("https://r.example/h", ["*"])),
    ("update_webhook", lambda c: c.update_webhook("sub_1", description="d")),
    ("delete_webhook", lambda c: c.delete_webhook("sub_1")),
    ("rotate_webhook_secret", lambda c: c.rotate_webhook_secret("sub_1")),
    ("pause_webhook", lambda c: c.pause_webhook("sub_1")),
    ("resume_webhook", lambda c: c.resume_webhook("sub_1")),
    ("test_webhook", lambda c: c.test_webhook("sub_1")),
    ("recover_webhook", lambda c: c.recover_webhook("sub_1", since=0)),
    ("retry_delivery", lambda c: c.retry_delivery("dlv_1")),
    ("redirect_delivery", lambda c: c.redirect_delivery("dlv_1", "https://r.example/x")),
]


@pytest.mark.parametrize(("name", "call"), GATEWAY_CALLS, ids=[n for n, _ in GATEWAY_CALLS])
def test_every_mutating_gateway_call_carries_one_key_and_is_retried(
    name: str, call: Callable[[Client], object]
) -> None:
    seen, handler = scripted([httpx.ReadError("reset"), httpx.Response(502), httpx.Response(201, json={})])
    call(client(handler, []))
    assert len(seen) == 3, f"{name}: retried after a lost answer and a 502"
    keys = {r.headers.get("idempotency-key") for r in seen}
    assert len(keys) == 1 and None not in keys, f"{name}: one key on every attempt: {keys}"
    assert len({r.content for r in seen}) == 1, "the same bytes every time"


def test_the_callers_key_is_sent_by_typed_methods() -> None:
    seen, handler = scripted([httpx.Response(201, json={})] * 3)
    c = client(handler, [])
    c.create_key("p", "trial", idempotency_key="onboard-p")
    c.rotate_webhook_secret("sub_1", idempotency_key="rotate-2026-12")
    c.redirect_delivery("dlv_1", "https://r.example/x", idempotency_key="inspect-dlv_1")
    assert [r.headers["idempotency-key"] for r in seen] == ["onboard-p", "rotate-2026-12", "inspect-dlv_1"]


def test_publish_fixes_the_event_id_once_for_every_attempt() -> None:
    seen, handler = scripted([httpx.ReadError("reset"), httpx.Response(202, json={"id": "x"})])
    c = Client(
        "http://gw.test", origin_token="org", transport=httpx.MockTransport(handler), _sleep=lambda s: None
    )
    c.publish_event("p", "order.paid", {"n": 1})
    ids = [json.loads(r.content)["id"] for r in seen]
    assert len(ids) == 2 and ids[0] == ids[1] and ids[0].startswith("evt_") and len(ids[0]) == 36
    seen, handler = scripted([httpx.Response(202, json={"id": "evt_mine"})])
    c = Client("http://gw.test", origin_token="org", transport=httpx.MockTransport(handler))
    c.publish_event("p", "t", event_id="evt_mine")
    assert json.loads(seen[0].content)["id"] == "evt_mine"
    assert "deliver_at" not in json.loads(seen[0].content)


def test_publish_passes_deliver_at_through() -> None:
    seen, handler = scripted([httpx.Response(202, json={"id": "a"}), httpx.Response(202, json={"id": "b"})])
    c = Client("http://gw.test", origin_token="org", transport=httpx.MockTransport(handler))
    c.publish_event("p", "t", deliver_at=1800000000000)
    c.publish_event("p", "t", deliver_at="2027-01-15T08:00:00Z")
    assert [json.loads(r.content)["deliver_at"] for r in seen] == [1800000000000, "2027-01-15T08:00:00Z"]


def test_publish_sends_ordering_key_only_when_given() -> None:
    seen, handler = scripted([httpx.Response(202, json={"id": "a"}), httpx.Response(202, json={"id": "b"})])
    c = Client("http://gw.test", origin_token="org", transport=httpx.MockTransport(handler))
    c.publish_event("p", "t", {"n": 1}, ordering_key="order-42")
    c.publish_event("p", "t", {"n": 2})
    bodies = [json.loads(r.content) for r in seen]
    assert bodies[0]["ordering_key"] == "order-42" and bodies[0]["data"] == {"n": 1}
    assert "ordering_key" not in bodies[1]


@pytest.mark.anyio
async def test_async_publish_sends_ordering_key() -> None:
    seen, handler = scripted([httpx.Response(202, json={"id": "a"})])

    async def ahandler(request: httpx.Request) -> httpx.Response:
        return handler(request)

    async with AsyncClient(
        "http://gw.test", origin_token="org", transport=httpx.MockTransport(ahandler)
    ) as c:
        await c.publish_event("p", "t", ordering_key="order-42", deliver_at=1800000000000)
    body = json.loads(seen[0].content)
    assert (body["ordering_key"], body["deliver_at"]) == ("order-42", 1800000000000)


# --- on_attempt exposes the planned delay (issue 25 item 7) --------------------------------


def test_on_attempt_reports_the_planned_retry_delay() -> None:
    _, handler = scripted(
        [
            httpx.ReadError("x"),
            problem(429, "RATE_LIMIT_EXCEEDED", {"retry-after": "3"}),
            problem(400, "VALIDATION_ERROR"),
        ]
    )
    seen: list[postguard.AttemptInfo] = []
    sleeps: list[float] = []
    with pytest.raises(postguard.ValidationError):
        client(handler, sleeps, on_attempt=seen.append, proactive=False).request("POST", "/a")
    assert [a.retry_in_s for a in seen] == [0.5, 6.0, None]  # 0.5 · 2^0; Retry-After 3 s · 2^1; final
    assert sleeps == [0.5, 6.0], "the hook saw exactly the waits that followed"


# --- secrets never print (issue 23 item 9) ------------------------------------------------

SECRETS: dict[str, Any] = {
    "api_key": "pgk_Zx81mQv0Lr5Tn2Wc7Ye4Ua9Ib3Od6Pf1Gh8Jk0Sl5M",
    "admin_token": "adm_live_4f9c2e7a1b8d3f6e0a5c9b2d7e1f4a8c",
    "origin_token": "org_live_9b1e5d3c7f2a8e4b6d0c1f9a3e7b5d2c",
}


@pytest.mark.anyio
async def test_repr_str_and_vars_of_the_clients_show_no_secret() -> None:
    import logging
    import pprint

    with Client("https://api.example.com", **SECRETS) as sync_client:
        async with AsyncClient("https://api.example.com", **SECRETS) as async_client:
            for c in (sync_client, async_client):
                shown = [repr(c), str(c), f"{c}", f"{c!r}", pprint.pformat(vars(c)), repr(c._tokens)]
                record = logging.LogRecord("t", logging.INFO, __file__, 1, "client %r", (c,), None)
                shown.append(record.getMessage())
                for text in shown:
                    for name, secret in SECRETS.items():
                        assert secret not in text and secret[4:20] not in text, f"{name} in {text}"
                assert "api.example.com" in repr(c) and "api_key" in repr(c), repr(c)


def test_the_redacted_token_is_still_sent() -> None:
    seen, handler = scripted([httpx.Response(200, json={})])
    Client("http://gw.test", transport=httpx.MockTransport(handler), **SECRETS).me()
    assert seen[0].headers["authorization"] == f"Bearer {SECRETS['api_key']}"


# --- keys & limits (issue 25): the lookup, the key lifecycle, the new error classes ----------

QUOTA = "https://iana.org/assignments/http-problem-types#quota-exceeded"


def quota(code: str, violated: list[str], headers: dict[str, str]) -> httpx.Response:
    body = {"type": QUOTA, "status": 429, "code": code, "violated-policies": violated, "request_id": "req_q"}
    return httpx.Response(429, json=body, headers={"content-type": "application/problem+json", **headers})


@pytest.mark.parametrize(
    ("key", "segment"),
    [("order-42", "order-42"), ("a/b?c#d%e", "a%2Fb%3Fc%23d%25e"), (".", "%22.%22"), ("..", "%22..%22")],
)
def test_status_looks_the_key_up_percent_encoded(key: str, segment: str) -> None:
    answer = {"state": "completed", "status": 201, "request_id": "req_1", "created_at": 1, "expires_at": 2}
    seen, handler = scripted([httpx.Response(200, json=answer)])
    assert client(handler, []).status(key) == answer
    req = seen[0]
    assert req.method == "GET"
    assert req.url.raw_path.decode() == f"/_postguard/v1/idempotency/{segment}", "no dot segment dropped"
    assert req.headers["authorization"] == "Bearer pgk_test"
    assert "idempotency-key" not in req.headers, "a lookup carries no key of its own"


def test_status_of_an_empty_key_is_refused_before_sending() -> None:
    seen, handler = scripted([])
    with pytest.raises(postguard.ConfigurationError):
        client(handler, []).status("")
    assert seen == []


def test_key_lifecycle_bodies() -> None:
    from datetime import datetime, timezone

    answers: list[httpx.Response | Exception] = [httpx.Response(201, json={}), httpx.Response(200, json={})]
    seen, handler = scripted(answers + [httpx.Response(201, json={})] * 2)
    c = client(handler, [])
    at = datetime(2030, 1, 1, tzinfo=timezone.utc)
    c.create_key("p", "trial", expires_at=at, meta={"tier": "gold"}, overrides={"concurrency": 2})
    c.update_key("key_1", {"plan": "pro", "expires_at": None})
    c.reroll_key("key_1", grace_s=60)
    c.reroll_key("key_1")
    create, update, reroll, reroll_default = seen
    assert json.loads(create.content) == {
        "project": "p",
        "plan": "trial",
        "expires_at": 1893456000000,
        "meta": {"tier": "gold"},
        "overrides": {"concurrency": 2},
    }
    assert (update.method, update.url.path) == ("PATCH", "/_postguard/v1/keys/key_1")
    assert update.content == b'{"plan":"pro","expires_at":null}', "None is sent as null: it clears"
    assert (reroll.method, reroll.url.path) == ("POST", "/_postguard/v1/keys/key_1/reroll")
    assert json.loads(reroll.content) == {"grace_s": 60}
    assert json.loads(reroll_default.content) == {}, "the gateway's default grace"
    assert all(r.headers["authorization"] == "Bearer adm" for r in seen)
    with pytest.raises(postguard.ConfigurationError):
        c.update_key("key_1", {"colour": "red"})  # type: ignore[typeddict-unknown-key]
    with pytest.raises(postguard.ConfigurationError):
        c.create_key("p", "trial", expires_at=datetime(2030, 1, 1))  # naive: which zone?


def test_an_expired_key_is_its_own_class_and_not_retried() -> None:
    seen, handler = scripted([problem(401, "API_KEY_EXPIRED")])
    with pytest.raises(postguard.ApiKeyExpired) as e:
        client(handler, []).request("POST", "/a", {"x": 1})
    assert len(seen) == 1
    assert (e.value.status, e.value.code) == (401, "API_KEY_EXPIRED")
    assert not isinstance(e.value, postguard.InvalidApiKey)


def test_a_concurrency_refusal_is_a_rate_limit_error_retried_after_its_retry_after() -> None:
    headers = {
        "retry-after": "1",
        "ratelimit": '"inflight";r=0, "minute";r=30;t=60',
        "ratelimit-policy": '"minute";q=30;w=60, "inflight";q=2;qu="concurrent-requests"',
    }
    answers: list[httpx.Response | Exception] = [
        quota("CONCURRENCY_LIMIT_EXCEEDED", ["inflight"], headers),
        httpx.Response(201, json={}),
    ]
    seen, handler = scripted(answers)
    sleeps: list[float] = []
    r = client(handler, sleeps).request("POST", "/slow", {"n": 1})
    assert (r.status, r.attempts) == (201, 2)
    assert sleeps == [1.0], "not before Retry-After"
    assert seen[0].headers["idempotency-key"] == seen[1].headers["idempotency-key"]
    # Spent attempts: the typed error, a RateLimitExceeded, naming the policy.
    seen, handler = scripted([quota("CONCURRENCY_LIMIT_EXCEEDED", ["inflight"], headers)] * 2)
    with pytest.raises(postguard.ConcurrencyLimitExceeded) as e:
        client(handler, [], retry=RetryPolicy(max_attempts=2)).request("POST", "/slow", {"n": 1})
    err = e.value
    assert isinstance(err, postguard.RateLimitExceeded)
    assert (err.code, err.violated_policies, err.policy, err.retry_after_s) == (
        "CONCURRENCY_LIMIT_EXCEEDED",
        ["inflight"],
        "inflight",
        1.0,
    )


def test_a_quota_refusal_names_its_violated_and_binding_policies() -> None:
    headers = {"retry-after": "42", "ratelimit": '"minute";r=0;t=42, "burst";r=3;t=1'}
    seen, handler = scripted([quota("RATE_LIMIT_EXCEEDED", ["minute"], headers)])
    with pytest.raises(postguard.RateLimitExceeded) as e:
        client(handler, [], retry=RetryPolicy(max_attempts=1), proactive=False).request("GET", "/x")
    assert (e.value.violated_policies, e.value.policy) == (["minute"], "minute")
    assert not isinstance(e.value, postguard.ConcurrencyLimitExceeded)
    # No RateLimit field: the first violated policy.
    seen, handler = scripted([quota("RATE_LIMIT_EXCEEDED", ["day", "minute"], {})])
    with pytest.raises(postguard.RateLimitExceeded) as e:
        client(handler, [], retry=RetryPolicy(max_attempts=1), proactive=False).request("GET", "/x")
    assert (e.value.violated_policies, e.value.policy) == (["day", "minute"], "day")


def test_gateway_endpoints_are_not_throttled_by_the_api_budget() -> None:
    """The API budget is spent (0 left for 60 s, threshold 0); a lookup, /me and the audit
    log are still sent at once, and the gateway policy's answer does not refill the API's."""
    spent = {"ratelimit": '"default";r=0;t=60', "ratelimit-policy": '"default";q=10;w=60'}
    gateway = {"ratelimit": '"gateway";r=119;t=60', "ratelimit-policy": '"gateway";q=120;w=60'}
    answers: list[httpx.Response | Exception] = [
        httpx.Response(201, json={}, headers=spent),
        httpx.Response(200, json={"state": "unknown"}, headers=spent),
        httpx.Response(200, json={"data": [], "next_cursor": None}, headers=gateway),
    ]
    _, handler = scripted(answers)
    clock = [0.0]
    c = client(handler, [], threshold=0, _monotonic=lambda: clock[0])
    c.request("POST", "/orders", {})
    assert c.status("k")["state"] == "unknown"
    assert c.audit().data == []
    assert c.throttle.remaining == 0 and c.throttle.in_flight == 0
    assert c.throttle.next_wait(clock[0]) == pytest.approx(60.0), "a proxied call would wait for the reset"


@pytest.mark.anyio
async def test_async_status_and_key_lifecycle() -> None:
    seen, handler = scripted(
        [
            httpx.Response(200, json={"state": "in_progress", "request_id": "req_1"}),
            httpx.Response(200, json={"id": "key_1", "plan": "pro"}),
            httpx.Response(201, json={"id": "key_1", "key": "pgk_new", "previous_expires_at": 9}),
            problem(401, "API_KEY_EXPIRED"),
        ]
    )

    async def ahandler(request: httpx.Request) -> httpx.Response:
        return handler(request)

    transport = httpx.MockTransport(ahandler)
    async with AsyncClient("http://gw.test", api_key="k", admin_token="adm", transport=transport) as c:
        assert (await c.status("a/b"))["state"] == "in_progress"
        assert (await c.update_key("key_1", {"plan": "pro"}))["plan"] == "pro"
        assert (await c.reroll_key("key_1", grace_s=5))["previous_expires_at"] == 9
        with pytest.raises(postguard.ApiKeyExpired):
            await c.me()
    assert seen[0].url.raw_path == b"/_postguard/v1/idempotency/a%2Fb"
    assert [r.method for r in seen] == ["GET", "PATCH", "POST", "GET"]
    assert seen[1].headers["idempotency-key"] and seen[2].headers["idempotency-key"]


# --- moving an existing API (issue 34): import, usage, a subscription's given secret ---------


IMPORTED = {
    "data": [
        {"id": "key_1", "prefix": "sk_live_4eC3", "status": "created"},
        {"id": "key_2", "prefix": "sk_live_9f", "status": "exists"},
    ]
}


def test_import_keys_sends_the_entries_as_the_operator_and_returns_the_data_in_order() -> None:
    from datetime import datetime, timezone

    seen, handler = scripted([httpx.Response(200, json=IMPORTED)])
    c = client(handler, [])
    got = c.import_keys(
        [
            {
                "key": "sk_live_4eC39HqLyjWDarjtT1zdp7dc",
                "project": "acme",
                "plan": "business",
                "name": "prod",
            },
            {
                "sha256": "a" * 64,
                "prefix": "sk_live_9f",
                "project": "acme",
                "plan": "trial",
                "expires_at": datetime(2030, 1, 1, tzinfo=timezone.utc),
                "meta": {"customer": "cus_1"},
                "overrides": {"enforce": False},
            },
        ],
        idempotency_key="import-batch-7",
    )
    assert got == IMPORTED["data"]
    (req,) = seen
    assert (req.method, req.url.path) == ("POST", "/_postguard/v1/keys/import")
    assert req.headers["authorization"] == "Bearer adm"
    assert req.headers["idempotency-key"] == "import-batch-7"
    assert json.loads(req.content) == {
        "keys": [
            {
                "key": "sk_live_4eC39HqLyjWDarjtT1zdp7dc",
                "project": "acme",
                "plan": "business",
                "name": "prod",
            },
            {
                "sha256": "a" * 64,
                "prefix": "sk_live_9f",
                "project": "acme",
                "plan": "trial",
                "expires_at": 1893456000000,
                "meta": {"customer": "cus_1"},
                "overrides": {"enforce": False},
            },
        ]
    }


def test_import_keys_refuses_an_unknown_member_or_a_naive_expiry_before_sending() -> None:
    from datetime import datetime

    seen, handler = scripted([])
    c = client(handler, [])
    bad: Any = [{"key": "sk_live_4eC39HqLyjWDarjtT1zdp7dc", "project": "p", "plan": "trial"}, {"plann": "x"}]
    with pytest.raises(postguard.ConfigurationError, match=r"keys\[1\]\.plann"):
        c.import_keys(bad)
    naive: Any = [
        {"sha256": "a" * 64, "prefix": "p", "project": "p", "plan": "t", "expires_at": datetime(2030, 1, 1)}
    ]
    with pytest.raises(postguard.ConfigurationError, match=r"keys\[0\]\.expires_at"):
        c.import_keys(naive)
    assert seen == []


def test_usage_reads_the_keys_project_by_default_and_as_the_operator_when_a_project_is_named() -> None:
    from datetime import datetime, timezone

    row = {
        "key_prefix": "pgk_a",
        "project": "acme",
        "period_start": 1796083200000,
        "requests": 7,
        "admitted": 5,
        "billable": 3,
        "replays": 1,
        "refused": 0,
    }
    seen, handler = scripted([httpx.Response(200, json={"data": [row]})] * 3)
    c = client(handler, [])
    assert c.usage() == [row]
    since = datetime(2026, 11, 1, tzinfo=timezone.utc)
    assert c.usage(since=since, until="2026-11-08T00:00:00Z", granularity="hour", project="acme") == [row]
    c.usage(granularity="day", auth="admin")
    own, named, every = seen
    assert all((r.method, r.url.path) == ("GET", "/_postguard/v1/usage") for r in seen)
    assert all("idempotency-key" not in r.headers for r in seen), "a read carries no key"
    assert own.url.query == b"" and own.headers["authorization"] == "Bearer pgk_test"
    assert dict(named.url.params) == {
        "since": "1793491200000",
        "until": "2026-11-08T00:00:00Z",
        "granularity": "hour",
        "project": "acme",
    }
    assert named.headers["authorization"] == "Bearer adm", "only the operator may name a project"
    assert dict(every.url.params) == {"granularity": "day"} and every.headers["authorization"] == "Bearer adm"


def test_create_webhook_sends_a_given_secret_and_none_otherwise() -> None:
    secret = "whsec_" + "B" * 44
    seen, handler = scripted([httpx.Response(201, json={"id": "sub_1", "secret": secret})] * 2)
    c = client(handler, [])
    assert c.create_webhook("https://r.example/h", ["*"], secret=secret)["secret"] == secret
    c.create_webhook("https://r.example/h", ["*"])
    assert json.loads(seen[0].content) == {"url": "https://r.example/h", "events": ["*"], "secret": secret}
    assert "secret" not in json.loads(seen[1].content)


@pytest.mark.anyio
async def test_async_import_keys_and_usage() -> None:
    seen, handler = scripted([httpx.Response(200, json=IMPORTED), httpx.Response(200, json={"data": []})])

    async def ahandler(request: httpx.Request) -> httpx.Response:
        return handler(request)

    transport = httpx.MockTransport(ahandler)
    async with AsyncClient("http://gw.test", api_key="k", admin_token="adm", transport=transport) as c:
        entry: Any = {"key": "sk_live_4eC39HqLyjWDarjtT1zdp7dc", "project": "p", "plan": "trial"}
        assert [k["status"] for k in await c.import_keys([entry])] == ["created", "exists"]
        assert await c.usage(project="p") == []
    assert [(r.method, r.url.path) for r in seen] == [
        ("POST", "/_postguard/v1/keys/import"),
        ("GET", "/_postguard/v1/usage"),
    ]
    assert seen[0].headers["idempotency-key"] and all(
        r.headers["authorization"] == "Bearer adm" for r in seen
    )
