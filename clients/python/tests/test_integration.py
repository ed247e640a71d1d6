"""Integration tests against the real gateway (Miniflare), the real demo origin, the
TCP fault proxy and a real webhook receiver — all started by tests/sdk-python.test.mjs.
No mocks: every answer here comes from the built worker."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

import postguard
import postguard.types
from postguard import AsyncClient, AttemptInfo, Client, RetryPolicy

pytestmark = pytest.mark.integration

FAST = RetryPolicy(max_attempts=5, base_delay_s=0.05)


def poll(fn: Any, *, timeout: float = 15.0, interval: float = 0.1, what: str = "condition") -> Any:
    """Poll with a deadline (no fixed sleeps)."""
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


class Counter:
    """An ``on_attempt`` hook counting what the SDK saw (thread-safe): statuses, and the
    ``X-RateLimit-Remaining`` of every answer that had one."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.statuses: list[int | None] = []
        self.remaining: list[int] = []

    def __call__(self, a: AttemptInfo) -> None:
        with self.lock:
            self.statuses.append(a.status)
            left = a.headers.get("x-ratelimit-remaining") if a.headers is not None else None
            if a.status != 429 and left is not None and left.isdigit():
                self.remaining.append(int(left))

    def count(self, status: int) -> int:
        with self.lock:
            return self.statuses.count(status)


# --- 1. responses lost after the gateway executed the request ---------------------------


def test_fault_proxy_cuts_are_retried_with_the_same_key_and_replayed(
    env: Any, new_key: Any, origin_stats: Any, report: Any
) -> None:
    k = new_key()
    httpx.post(f"{env.proxy_control}/reset").raise_for_status()
    httpx.post(f"{env.proxy_control}/cut-rate", params={"value": "0.3"}).raise_for_status()
    # 10 attempts: with 30 % of responses cut, 5 would fail some operation of 50 about
    # one run in eight (0.3^5 × 50); 10 makes that one in thousands.
    policy = RetryPolicy(max_attempts=10, base_delay_s=0.05)
    try:
        with Client(env.proxy, api_key=k.key, retry=policy) as c:
            results = [c.request("POST", "/py/fault/orders", {"n": i}) for i in range(50)]
    finally:
        cuts = httpx.get(f"{env.proxy_control}/stats").json()
        httpx.post(f"{env.proxy_control}/cut-rate", params={"value": "0"})
    by_key = origin_stats()["byKey"]
    executions = [by_key.get(r.idempotency_key or "", 0) for r in results]
    retried = [r for r in results if r.attempts > 1]
    report(
        "fault_proxy",
        operations=len(results),
        cuts=cuts["cuts"],
        connections=cuts["connections"],
        attempts=sum(r.attempts for r in results),
        retried_operations=len(retried),
        replayed=sum(r.replayed for r in results),
        origin_executions=sum(executions),
    )
    assert all(r.status == 201 for r in results)
    assert len({r.idempotency_key for r in results}) == 50, "one key per operation"
    assert executions == [1] * 50, "the origin executed every operation exactly once"
    assert cuts["cuts"] > 0 and retried, "the proxy did cut responses"
    assert sum(r.attempts - 1 for r in results) >= cuts["cuts"], "every cut was retried"
    # A cut happens after the gateway answered: the retry always finds the stored response.
    assert all(r.replayed for r in retried)
    assert not any(r.replayed for r in results if r.attempts == 1)
    assert all(r.json()["execution"] == 1 for r in results), "the caller sees the first execution's answer"


# --- 2. origin failures are not stored; an in-progress key waits ------------------------


def test_origin_503_twice_then_201(env: Any, new_key: Any, origin_stats: Any) -> None:
    k = new_key()
    key = f"py-503-{uuid.uuid4()}"
    httpx.post(f"{env.origin}/__demo/script", json={"key": key, "statuses": [503, 503]}).raise_for_status()
    seen = Counter()
    with Client(env.gateway, api_key=k.key, retry=FAST, on_attempt=seen) as c:
        r = c.request("POST", "/py/orders", {"sku": "a"}, idempotency_key=key)
        assert (r.status, r.attempts, r.replayed) == (201, 3, False)
        assert seen.statuses == [503, 503, 201]
        assert origin_stats()["byKey"][key] == 3
        assert r.json()["execution"] == 3, "the failed executions were not stored"
        again = c.request("POST", "/py/orders", {"sku": "a"}, idempotency_key=key)
    assert again.replayed and again.json()["execution"] == 3
    assert origin_stats()["byKey"][key] == 3, "the replay did not reach the origin"


def test_in_progress_key_waits_and_returns_the_first_result(
    env: Any, new_key: Any, origin_stats: Any
) -> None:
    k = new_key()
    key = f"py-slow-{uuid.uuid4()}"
    second_seen = Counter()
    body = {"sku": "slow"}
    with (
        Client(env.gateway, api_key=k.key, retry=FAST) as first,
        Client(env.gateway, api_key=k.key, on_attempt=second_seen) as second,
        ThreadPoolExecutor(2) as pool,
    ):
        f1 = pool.submit(
            first.request, "POST", "/py/slow", body, idempotency_key=key, headers={"x-demo-delay-ms": "1000"}
        )
        poll(lambda: origin_stats()["byKey"].get(key) == 1, what="the first request at the origin")
        f2 = pool.submit(
            second.request, "POST", "/py/slow", body, idempotency_key=key, headers={"x-demo-delay-ms": "1000"}
        )
        r1, r2 = f1.result(timeout=30), f2.result(timeout=30)
    assert second_seen.statuses[0] == 409, (
        f"the second call met the first in progress: {second_seen.statuses}"
    )
    assert second_seen.statuses[-1] == 201
    assert not r1.replayed and r2.replayed
    assert r2.json() == r1.json()
    assert origin_stats()["byKey"][key] == 1


def test_reuse_conflict_is_a_typed_error_and_never_reaches_the_origin(
    env: Any, new_key: Any, origin_stats: Any
) -> None:
    k = new_key()
    key = f"py-conflict-{uuid.uuid4()}"
    with Client(env.gateway, api_key=k.key) as c:
        c.request("POST", "/py/pay", {"amount": 1}, idempotency_key=key)
        with pytest.raises(postguard.IdempotencyKeyReuseConflict) as e:
            c.request("POST", "/py/pay", {"amount": 2}, idempotency_key=key)
    err = e.value
    assert (err.code, err.status, err.attempts) == ("IDEMPOTENCY_KEY_REUSE_CONFLICT", 422, 1)
    assert err.request_id and err.request_id.startswith("req_") and err.detail
    assert origin_stats()["byKey"][key] == 1


# --- 3. proactive throttling: 8 concurrent tasks, 40 calls, 10 requests per 5 s -----------

CALLS, TASKS, IDEAL_S = 40, 8, 15.0


def _run_sync_threads(env: Any, key: str) -> tuple[int, float, int]:
    """The default reserve: one sync client shared by 8 threads."""
    seen = Counter()
    todo = iter(range(CALLS))
    lock = threading.Lock()
    with Client(env.gateway, api_key=key, on_attempt=seen) as c:

        def worker() -> int:
            done = 0
            while True:
                with lock:
                    i = next(todo, None)
                if i is None:
                    return done
                assert c.request("POST", "/py/proactive", {"i": i}).status == 201
                done += 1

        t0 = time.monotonic()
        with ThreadPoolExecutor(TASKS) as pool:
            done = sum(pool.map(lambda _: worker(), range(TASKS)))
        return done, time.monotonic() - t0, seen.count(429)


async def _run_async(client: AsyncClient) -> tuple[int, float]:
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(CALLS):
        queue.put_nowait(i)
    done = 0

    async def worker() -> None:
        nonlocal done
        while not queue.empty():
            i = queue.get_nowait()
            r = await client.request("POST", "/py/proactive", {"i": i})
            assert r.status == 201
            done += 1

    t0 = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(TASKS)))
    return done, time.monotonic() - t0


@pytest.mark.anyio
async def test_proactive_threshold_zero_uses_the_whole_budget(env: Any, new_key: Any, report: Any) -> None:
    """Async client shared by 8 tasks; the limiter counts calls in flight."""
    k = new_key(env.plan_small)
    seen = Counter()
    async with AsyncClient(env.gateway, api_key=k.key, threshold=0, on_attempt=seen) as c:
        done, elapsed = await _run_async(c)
    report(
        "proactive_threshold_0",
        calls=done,
        tasks=TASKS,
        responses_429=seen.count(429),
        elapsed_s=round(elapsed, 2),
        ideal_s=IDEAL_S,
        deviation=round(elapsed / IDEAL_S - 1, 3),
    )
    assert done == CALLS
    assert seen.count(429) == 0
    # What the SDK promises is the whole budget without a 429; the time against the ideal
    # 15 s (4 windows of 10) is reported, not bounded: on a loaded machine it measures the
    # machine (issue 28).
    assert min(seen.remaining) == 0, "the whole budget was used: some answer left 0"
    assert elapsed >= IDEAL_S - 1, f"four windows are needed ({elapsed:.2f} s)"


@pytest.mark.anyio
async def test_proactive_default_threshold_and_proactive_off(env: Any, new_key: Any, report: Any) -> None:
    """Two workloads side by side, on two keys (independent windows), to keep CI short:
    the default threshold (sync client, 8 threads) must see no 429; with proactive
    mode off (async client, 8 tasks) 429s happen and are absorbed by Retry-After."""
    default_key, off_key = new_key(env.plan_small), new_key(env.plan_small)
    seen_off = Counter()
    async with AsyncClient(env.gateway, api_key=off_key.key, proactive=False, on_attempt=seen_off) as c:
        (done_default, elapsed_default, default_429), (done_off, elapsed_off) = await asyncio.gather(
            asyncio.to_thread(_run_sync_threads, env, default_key.key), _run_async(c)
        )
    report(
        "proactive_default_threshold",
        calls=done_default,
        tasks=TASKS,
        responses_429=default_429,
        elapsed_s=round(elapsed_default, 2),
    )
    report(
        "proactive_off",
        calls=done_off,
        tasks=TASKS,
        responses_429=seen_off.count(429),
        elapsed_s=round(elapsed_off, 2),
    )
    assert done_default == CALLS
    assert default_429 == 0, f"429s seen at the default reserve: {default_429}"
    assert done_off == CALLS, "every call succeeded despite the 429s"
    assert seen_off.count(429) > 0, "without the limiter, 8 tasks do run into the limit"


def test_six_calls_on_a_five_per_window_plan_before_and_after(env: Any, new_key: Any, report: Any) -> None:
    """Issue 25 item 7: a fixed reserve of 5 (capped at limit − 1 = 4) let a 5-per-5 s key
    send one call per window; the default is now a tenth of the limit, at least 1. The old
    setting (threshold=5) and the new default side by side, on two keys."""

    def six(threshold: int | None) -> dict[str, Any]:
        seen = Counter()
        key = new_key(env.plan_tiny).key
        with Client(env.gateway, api_key=key, threshold=threshold, on_attempt=seen) as c:
            t0 = time.monotonic()
            for i in range(6):
                c.request("POST", "/py/six", {"i": i})
            return {
                "elapsed_s": round(time.monotonic() - t0, 2),
                "remaining": seen.remaining,
                "429s": seen.count(429),
            }

    with ThreadPoolExecutor(2) as pool:
        after_f, before_f = pool.submit(six, None), pool.submit(six, 5)
        after, before = after_f.result(timeout=120), before_f.result(timeout=120)
    report("six_calls_5_per_5s", before_threshold_5=before, after_default=after)
    assert after["429s"] == before["429s"] == 0
    assert before["remaining"] == [4] * 6, "the old reserve: every call alone in its window"
    assert min(after["remaining"]) <= 3, f"several calls in one window: {after['remaining']}"
    assert min(after["remaining"]) >= 1, f"one unit always kept: {after['remaining']}"


# --- 3b. the gateway's own mutating calls through the cutting proxy (issue 23 item 1) ----


class Answers:
    """An ``on_attempt`` hook keeping every attempt by Idempotency-Key."""

    def __init__(self) -> None:
        self.by_key: dict[str | None, list[AttemptInfo]] = {}

    def __call__(self, a: AttemptInfo) -> None:
        self.by_key.setdefault(a.idempotency_key, []).append(a)


def test_gateway_calls_whose_first_answer_is_cut_take_effect_once(
    env: Any, admin: Client, report: Any
) -> None:
    """create_key, create_webhook, rotate_webhook_secret, retry_delivery, redirect_delivery
    and create_portal_link each lose their first answer after the gateway ran them (the
    proxy's cut-next); the SDK retries with the same key and must get the stored answer:
    one key, one subscription, one rotation, one more attempt, one redirect, one link."""
    control = env.proxy_control
    httpx.post(f"{control}/reset").raise_for_status()
    httpx.post(f"{control}/cut-rate", params={"value": "0"}).raise_for_status()
    answers = Answers()
    policy = RetryPolicy(max_attempts=8, base_delay_s=0.05)
    figures: dict[str, Any] = {}

    def cut_once(name: str, call: Any) -> Any:
        key = f"py-{name}-{uuid.uuid4()}"
        cuts = httpx.get(f"{control}/stats").json()["cuts"]
        httpx.post(f"{control}/cut-next", params={"count": "1"}).raise_for_status()
        out = call(key)
        assert httpx.get(f"{control}/stats").json()["cuts"] == cuts + 1, f"{name}: its first answer was cut"
        seen = answers.by_key.get(key, [])
        assert seen and seen[0].status is None, f"{name}: the first attempt lost its answer"
        last = seen[-1]
        assert last.attempt >= 2 and last.headers is not None
        assert last.headers.get("idempotent-replayed") == "true", (
            f"{name}: the retry got the stored answer, not a second execution ({[a.status for a in seen]})"
        )
        figures[name] = {"attempts": last.attempt, "statuses": [a.status for a in seen]}
        return out

    project = f"py-cut-{uuid.uuid4().hex[:8]}"
    with Client(env.proxy, admin_token=env.admin_token, retry=policy, on_attempt=answers) as operator:
        created = cut_once(
            "create_key", lambda k: operator.create_key(project, env.plan_big, idempotency_key=k)
        )
        listed = admin.list_keys(project=project).data
        assert [x["id"] for x in listed] == [created["id"]], "one live key per call"

        with Client(env.proxy, api_key=created["key"], retry=policy, on_attempt=answers) as c:
            assert c.me()["project"] == project, "the key that came back works"
            url = f"{env.receiver}/reject/{project}"
            sub = cut_once("create_webhook", lambda k: c.create_webhook(url, ["*"], idempotency_key=k))
            assert [x["id"] for x in c.list_webhooks().data] == [sub["id"]], "one subscription per call"

            first = admin.publish_event(project, "py.cut", {"n": 1})["id"]
            dead = poll(
                lambda: next(
                    (d for d in c.list_deliveries(status="dead_letter").data if d["event_id"] == first), None
                ),
                timeout=20,
                what="the delivery dead-lettered (the receiver answers 400)",
            )
            assert dead["attempts_made"] == 1

            fresh = cut_once("rotate_secret", lambda k: c.rotate_webhook_secret(sub["id"], idempotency_key=k))
            second = admin.publish_event(project, "py.cut", {"n": 2})["id"]
            d2 = captured(env, second)
            assert len(d2["headers"]["webhook-signature"].split(" ")) == 2, "the original and one new secret"
            assert postguard.verify(d2["body"], d2["headers"], sub["secret"]).id == second, (
                "the predecessor still verifies during the overlap"
            )
            assert postguard.verify(d2["body"], d2["headers"], fresh["secret"]).id == second

            cut_once("retry", lambda k: c.retry_delivery(dead["id"], idempotency_key=k))
            target = f"{env.receiver}/redirected/{project}"
            cut_once("redirect", lambda k: c.redirect_delivery(dead["id"], target, idempotency_key=k))
            # A last, uncut retry through the same queue: the log is complete once it shows.
            with Client(env.gateway, api_key=created["key"]) as direct:
                direct.retry_delivery(dead["id"])

            def paths() -> list[str]:
                return [httpx.URL(a["url"]).path for a in c.get_delivery(dead["id"])["attempts"]]

            def complete() -> list[str] | None:
                p = paths()
                sent = sum(x.startswith("/reject/") for x in p)
                return p if sent >= 3 and any(x.startswith("/redirected/") for x in p) else None

            log = poll(complete, timeout=20, what="the retry, the redirect and the last retry in the log")
            assert sum(x.startswith("/reject/") for x in log) == 3, f"one attempt per retry call: {log}"
            assert sum(x.startswith("/redirected/") for x in log) == 1, f"one redirect per call: {log}"

        link = cut_once("portal_link", lambda k: operator.create_portal_link(project, idempotency_key=k))
    token = link["url"].split("#portal=", 1)[1]
    session = httpx.post(f"{env.gateway}/_postguard/v1/portal-sessions", json={"token": token})
    assert session.status_code == 201 and session.json()["project"] == project, session.text
    report("gateway_calls_cut_once", **figures)


# --- 4. webhooks: a real delivery verified, a tampered one refused, rotated secrets -------


def captured(env: Any, event_id: str) -> dict[str, Any]:
    def find() -> dict[str, Any] | None:
        for r in httpx.get(env.captures).json():
            if r["headers"].get("webhook-id") == event_id:
                return dict(r)
        return None

    return dict(poll(find, what=f"the delivery of {event_id}"))


def test_webhook_delivery_verifies_tampered_is_refused_rotation(
    env: Any, new_key: Any, admin: Client
) -> None:
    k = new_key()
    with Client(env.gateway, api_key=k.key) as c:
        sub = c.create_webhook(f"{env.receiver}/py/{k.project}", ["py.*"], description="python sdk")
        old = sub["secret"]
        first = admin.publish_event(k.project, "py.created", {"n": 1})["id"]
        d1 = captured(env, first)
        ev = postguard.verify(d1["body"], d1["headers"], old)
        assert (ev.id, ev.type, ev.data, ev.duplicate) == (first, "py.created", {"n": 1}, False)

        tampered = d1["body"].replace('"n":1', '"n":2')
        assert tampered != d1["body"]
        with pytest.raises(postguard.WebhookVerificationError):
            postguard.verify(tampered, d1["headers"], old)
        with pytest.raises(postguard.WebhookVerificationError):
            postguard.verify(d1["body"], {**d1["headers"], "webhook-id": "evt_other"}, old)
        with pytest.raises(postguard.WebhookVerificationError):
            postguard.verify(
                d1["body"], d1["headers"], old, tolerance_s=1, now=int(d1["headers"]["webhook-timestamp"]) + 5
            )

        new = c.rotate_webhook_secret(sub["id"])["secret"]
        assert new != old
        second = admin.publish_event(k.project, "py.updated", {"n": 2})["id"]
        d2 = captured(env, second)
        assert len(d2["headers"]["webhook-signature"].split(" ")) == 2, (
            "old and new secret both sign for 24 h"
        )
        for secrets in ([new], [old], [old, new]):
            assert postguard.verify(d2["body"], d2["headers"], secrets).id == second
        with pytest.raises(postguard.WebhookVerificationError):
            postguard.verify(d1["body"], d1["headers"], [new])  # signed before the rotation

        dedupe = postguard.MemoryDedupe()
        assert not postguard.verify(d2["body"], d2["headers"], new, dedupe=dedupe).duplicate
        assert postguard.verify(d2["body"], d2["headers"], new, dedupe=dedupe).duplicate

        deliveries = poll(
            lambda: [d for d in c.iter_deliveries(event_type="py.updated") if d["event_id"] == second],
            what="the delivery log",
        )
        detail = c.get_delivery(deliveries[0]["id"])
        assert detail["subscription_id"] == sub["id"] and detail["attempts"]


# Needs the server side of ordering keys: the delivery log must show ordering_key.
def test_ordering_key_publishes_and_the_deliveries_show_it(env: Any, new_key: Any, admin: Client) -> None:
    k = new_key()
    key = f"order-{uuid.uuid4().hex[:8]}"
    with Client(env.gateway, api_key=k.key) as c:
        c.create_webhook(f"{env.receiver}/py-ordering/{k.project}", ["py.order.*"])
        first = admin.publish_event(k.project, "py.order.created", {"n": 1}, ordering_key=key)["id"]
        second = admin.publish_event(k.project, "py.order.paid", {"n": 2}, ordering_key=key)["id"]
        assert first.startswith("evt_") and second.startswith("evt_") and first != second
        # The deliveries are stored before the 202: listed at once, one per event.
        for event_id in (first, second):
            deliveries = c.list_deliveries(event_id=event_id).data
            assert len(deliveries) == 1, deliveries
            d = deliveries[0]
            assert d.get("ordering_key") == key, d
            blocked_by = d.get("blocked_by")
            assert blocked_by is None or (isinstance(blocked_by, str) and blocked_by.startswith("dlv_")), d


# --- typed endpoints, errors, audit pages --------------------------------------------------


def test_typed_endpoints_and_audit_pages(env: Any, new_key: Any, admin: Client) -> None:
    k = new_key()
    keys = [f"py-audit-{uuid.uuid4()}" for _ in range(3)]
    with Client(env.gateway, api_key=k.key) as c:
        me = c.me()
        assert me["project"] == k.project and me["plan"] == env.plan_big and k.key.startswith(me["prefix"])
        for key in keys:
            c.request("POST", "/py/audited", {"k": key}, idempotency_key=key)

        def three_rows() -> list[Any] | None:
            rows = [r for r in c.iter_audit(path="/py/audited", limit=2) if r["idempotency_key"] in keys]
            return rows if len(rows) == 3 else None

        rows = poll(three_rows, what="three audit rows (written after the response)")
        assert len({r["request_id"] for r in rows}) == 3
        page = c.audit(path="/py/audited", limit=2)
        assert len(page.data) == 2 and page.next_cursor, "two pages: the iterator followed the cursor"
        assert isinstance(c.stats(days=1)["days"], list)
    listed = admin.list_keys(project=k.project).data
    assert [x["prefix"] for x in listed] == [me["prefix"]]
    admin.revoke_key(listed[0]["id"])

    def refused() -> postguard.InvalidApiKey | None:
        with Client(env.gateway, api_key=k.key) as c:
            try:
                c.me()
            except postguard.InvalidApiKey as err:
                return err
        return None

    err = poll(refused, what="the revoked key refused")
    assert err.status == 401 and err.code == "INVALID_API_KEY" and err.request_id and err.attempts == 1


# --- keys & limits (issue 25): the lookup, the key lifecycle, expiry, concurrency -----------


def test_status_unknown_in_progress_then_completed_like_the_answer(
    env: Any, new_key: Any, origin_stats: Any
) -> None:
    """The "did my request run?" recipe against the real gateway: unknown before it is
    sent, in progress while the origin runs, completed with the status and request_id of
    the answer the caller got; a resend with the same key is a replay."""
    k = new_key()
    key = f"py-status/{uuid.uuid4()}"  # a "/" in the key: percent-encoded into the path
    body = {"n": 1}
    with Client(env.gateway, api_key=k.key) as c, ThreadPoolExecutor(1) as pool:
        assert c.status(key) == {"state": "unknown"}
        sent = pool.submit(
            c.request, "POST", "/py/status", body, idempotency_key=key, headers={"x-demo-delay-ms": "3000"}
        )
        running = poll(
            lambda: (s := c.status(key))["state"] == "in_progress" and s, timeout=15, what="in_progress"
        )
        assert running["expires_at"] > running["created_at"], "in progress until its lease ends"
        r = sent.result(timeout=30)
        assert r.status == 201
        done = poll(lambda: (s := c.status(key))["state"] != "in_progress" and s, what="the record written")
        assert done["state"] == "completed"
        assert (done["status"], done["request_id"]) == (201, r.request_id)
        again = c.request("POST", "/py/status", body, idempotency_key=key)
        assert again.replayed and again.json() == r.json()
        assert c.status("..")["state"] == "unknown", "a '..' key is looked up, not resolved away"
    assert origin_stats()["byKey"][key] == 1


@pytest.mark.anyio
async def test_async_status_after_a_call(env: Any, new_key: Any) -> None:
    k = new_key()
    key = f"py-astatus-{uuid.uuid4()}"
    async with AsyncClient(env.gateway, api_key=k.key) as c:
        assert (await c.status(key))["state"] == "unknown"
        r = await c.request("POST", "/py/astatus", {"n": 2}, idempotency_key=key)
        deadline = time.monotonic() + 10
        while (s := await c.status(key))["state"] == "in_progress" and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
    assert (s["state"], s.get("status"), s.get("request_id")) == ("completed", 201, r.request_id)


def test_an_operation_runs_once_and_wait_polls_with_retry_after(
    env: Any, new_key: Any, origin_stats: Any
) -> None:
    """``request(..., async_=True)`` on an async route (``/reports/*``): a 202 handle, the
    same operation for a resend with the same key, ``wait()`` polling no faster than the
    gateway's ``Retry-After`` and returning the result; a route the gateway runs
    synchronously gives a done handle; a failed operation raises ``OperationFailed``."""
    k = new_key()
    key = f"py-op-{uuid.uuid4()}"
    polls: list[tuple[float, str | None]] = []

    def seen(a: AttemptInfo) -> None:
        if a.path.startswith("/_postguard/v1/operations/") and not a.path.endswith("/result"):
            polls.append((time.monotonic(), a.headers.get("retry-after") if a.headers is not None else None))

    with Client(env.gateway, api_key=k.key, on_attempt=seen) as c:
        op = c.request(
            "POST",
            "/reports/q1",
            {"q": 1},
            idempotency_key=key,
            headers={"x-demo-delay-ms": "2500"},
            async_=True,
        )
        assert op.id is not None and op.id.startswith("op_")
        assert op.info is not None and op.info.get("state") == "queued" and not op.done
        again = c.request("POST", "/reports/q1", {"q": 1}, idempotency_key=key, async_=True)
        assert again.id == op.id, "the same operation"
        r = op.wait(timeout=60)
        waited = list(polls)  # the reads after this one are not wait()'s polls
        assert r.status == 201 and r.json()["execution"] == 1
        assert op.done and op.info is not None and op.info.get("status") == 201
        assert c.get_operation(op.id)["state"] == "succeeded"
        assert any(o["id"] == op.id for o in c.list_operations(limit=50).data)
        assert c.operation(op.id).result().content == r.content, "a handle from the id"
        # Each poll came no sooner than the Retry-After the one before it asked for.
        assert len(waited) >= 2, waited
        for (t0, ra), (t1, _) in zip(waited, waited[1:], strict=False):
            assert t1 - t0 >= float(ra or 1) - 0.05, waited
        sync = c.request("POST", "/py/not-async", {"n": 1}, async_=True)
        assert sync.id is None and sync.done and sync.wait().status == 201
        failing = f"py-op-fail-{uuid.uuid4()}"
        httpx.post(
            f"{env.origin}/__demo/script", json={"key": failing, "statuses": [503, 503, 503, 503, 503]}
        )
        bad = c.request("POST", "/reports/bad", {"q": 2}, idempotency_key=failing, async_=True)
        with pytest.raises(postguard.OperationFailed) as err:
            bad.wait(timeout=60)
        assert err.value.status == 503
    assert origin_stats()["byKey"][key] == 1


@pytest.mark.anyio
async def test_an_async_client_operation(env: Any, new_key: Any) -> None:
    k = new_key()
    async with AsyncClient(env.gateway, api_key=k.key) as c:
        op = await c.request("POST", "/reports/aq", {"q": 3}, async_=True)
        assert op.id is not None and op.idempotency_key is not None
        r = await op.wait(timeout=60)
        assert r.status == 201
        assert (await c.get_operation(op.id))["state"] == "succeeded"


def test_update_key_changes_the_plan_from_the_next_request(env: Any, admin: Client) -> None:
    project = f"py-update-{uuid.uuid4().hex[:8]}"
    created = admin.create_key(project, env.plan_big, meta={"tier": "gold"})
    with Client(env.gateway, api_key=created["key"]) as c:
        before = c.request("GET", "/py/plan-before")
        assert before.headers["ratelimit-policy"] == '"default";q=100000;w=60'
        updated = admin.update_key(created["id"], {"plan": env.plan_tiered})
        assert (updated["id"], updated["plan"]) == (created["id"], env.plan_tiered)
        after = c.request("GET", "/py/plan-after")
        assert after.headers["ratelimit-policy"] == (
            '"burst";q=20;w=1, "minute";q=200;w=60, "inflight";q=2;qu="concurrent-requests"'
        )
        me = c.me()
    assert me["plan"] == env.plan_tiered
    assert [(p["name"], p["limit"], p["window_s"]) for p in me["policies"]] == [
        ("burst", 20, 1),
        ("minute", 200, 60),
    ]
    assert (me["inflight"]["limit"], me["inflight"]["in_use"]) == (2, 0), "the quota, nothing in flight"
    assert admin.get_key(created["id"])["meta"] == {"tier": "gold"}, "kept by a PATCH that did not name it"


def test_reroll_key_both_secrets_work_for_the_same_id(env: Any, admin: Client) -> None:
    project = f"py-reroll-{uuid.uuid4().hex[:8]}"
    created = admin.create_key(project, env.plan_big)
    t0 = time.time() * 1000
    rolled = admin.reroll_key(created["id"], grace_s=600)
    assert (rolled["id"], rolled["prefix"]) == (created["id"], created["prefix"])
    assert rolled["key"] != created["key"]
    assert abs(rolled["previous_expires_at"] - (t0 + 600_000)) < 5000
    for secret in (created["key"], rolled["key"]):
        with Client(env.gateway, api_key=secret) as c:
            assert c.request("POST", "/py/rerolled", {}).status == 201
            assert c.me()["prefix"] == created["prefix"], "the same key, whichever secret"
    assert [k["id"] for k in admin.list_keys(project=project).data] == [created["id"]], "still one key"


def test_an_expiring_key_raises_api_key_expired(env: Any, admin: Client) -> None:
    # Ten seconds ahead: on a loaded machine creating the key and the first call can take
    # several seconds, and the first call must land before the expiry.
    expires_at = int(time.time() * 1000) + 10_000
    created = admin.create_key(f"py-expiry-{uuid.uuid4().hex[:8]}", env.plan_big, expires_at=expires_at)
    assert created["expires_at"] == expires_at
    with Client(env.gateway, api_key=created["key"]) as c:
        assert c.request("GET", "/py/still-alive").status == 200

        def refused() -> postguard.PostguardError | None:
            try:
                c.request("GET", "/py/still-alive")
            except postguard.PostguardError as err:
                return err
            return None

        err = poll(refused, timeout=40, interval=0.2, what="the key refused after expires_at")
        assert isinstance(err, postguard.ApiKeyExpired), repr(err)
        assert (err.status, err.code, err.attempts) == (401, "API_KEY_EXPIRED", 1)
        assert time.time() * 1000 >= expires_at, "not before expires_at"
        with pytest.raises(postguard.ApiKeyExpired):
            c.me()


def test_a_concurrency_refusal_is_retried_after_retry_after(env: Any, new_key: Any, report: Any) -> None:
    k = new_key(env.plan_single)
    seen: list[AttemptInfo] = []
    lock = threading.Lock()

    def hook(a: AttemptInfo) -> None:
        with lock:
            seen.append(a)

    with Client(env.gateway, api_key=k.key, on_attempt=hook) as c, ThreadPoolExecutor(2) as pool:
        c.request("GET", "/py/warm-up")  # the limiter learns the budget: both calls go at once
        slow = {"x-demo-delay-ms": "3000"}
        futures = [
            pool.submit(c.request, "POST", "/py/one-at-a-time", {"n": n}, headers=slow) for n in range(2)
        ]
        results = [f.result(timeout=60) for f in futures]
    assert [r.status for r in results] == [201, 201]
    refusals = [a for a in seen if a.status == 429]
    assert refusals, f"one call met the other in flight: {[a.status for a in seen]}"
    for a in refusals:
        assert a.headers is not None and a.headers["retry-after"] == "1"
        assert a.retry_in_s is not None and a.retry_in_s >= 1.0, "not before Retry-After"
        assert a.headers["ratelimit"].startswith('"inflight";r=0')
    assert sum(r.attempts for r in results) == 2 + len(refusals)
    report("concurrency_1", attempts=[r.attempts for r in results], refusals=len(refusals))


# --- moving an existing API (issue 34): imported keys, usage, a moved subscription secret -----


def test_imported_keys_work_a_rerun_says_exists_and_usage_counts_each_operation_once(
    env: Any, admin: Client
) -> None:
    project = f"py-import-{uuid.uuid4().hex[:8]}"
    legacy = f"sk_live_{uuid.uuid4().hex[:24]}"
    hashed = f"sk_live_{uuid.uuid4().hex[:24]}"
    entries: list[postguard.types.ImportKey] = [
        {
            "key": legacy,
            "project": project,
            "plan": env.plan_big,
            "name": "legacy",
            "meta": {"customer": "c1"},
        },
        {
            "sha256": hashlib.sha256(hashed.encode()).hexdigest(),
            "prefix": hashed[:10],
            "project": project,
            "plan": env.plan_big,
        },
    ]
    first = admin.import_keys(entries)
    assert [(k["prefix"], k["status"]) for k in first] == [(legacy[:12], "created"), (hashed[:10], "created")]

    # The integrator keeps its key: it works through the gateway from the answer on.
    with Client(env.gateway, api_key=legacy) as c:
        me = c.me()
        assert (me["project"], me["prefix"], me["plan"]) == (project, legacy[:12], env.plan_big)
        ik = f"py-order-{uuid.uuid4()}"
        made = c.request("POST", "/py/orders", {"n": 1}, idempotency_key=ik)
        again = c.request("POST", "/py/orders", {"n": 1}, idempotency_key=ik)
        assert (made.status, made.replayed, again.status, again.replayed) == (201, False, 201, True)
        assert c.request("GET", "/py/items/1").status == 200
        # An old client sending no key: forwarded until idempotency.required_from, and told so.
        keyless = c.request("POST", "/py/orders", {"n": 2}, idempotency_key=False)
        assert keyless.status == 201
        assert keyless.headers["postguard-idempotency-key-required-from"] == env.required_from
    with Client(env.gateway, api_key=hashed) as c:
        assert c.request("GET", "/py/items/2").status == 200, "the key imported by its hash works too"

    # The export re-run (after a timeout, say): nothing changes, the same ids.
    rerun = admin.import_keys(entries)
    assert [k["status"] for k in rerun] == ["exists", "exists"]
    assert [k["id"] for k in rerun] == [k["id"] for k in first]

    # POST 201, its replay, GET 200, keyless POST 201: 4 requests, 3 forwarded, 3 billable,
    # 1 replay. The audit rows are written after each answer: poll.
    def sums(rows: list[postguard.types.Usage]) -> tuple[int, int, int, int, int]:
        """requests, admitted, billable, replays, refused: summed over the periods."""
        return (
            sum(u["requests"] for u in rows),
            sum(u["admitted"] for u in rows),
            sum(u["billable"] for u in rows),
            sum(u["replays"] for u in rows),
            sum(u["refused"] for u in rows),
        )

    with Client(env.gateway, api_key=legacy) as c:
        mine = poll(
            lambda: (
                (r := [u for u in c.usage(granularity="hour") if u["key_prefix"] == me["prefix"]])
                and sums(r)[0] == 4
                and r
            ),
            timeout=20,
            what="the usage of four requests",
        )
        assert sums(mine) == (4, 3, 3, 1, 0)
        assert all(u["project"] == project and u["period_start"] % 3_600_000 == 0 for u in mine)
        stats = poll(
            lambda: (s := c.stats(days=1))["keys_missing_idempotency"] and s, timeout=20, what="/stats"
        )
        assert stats["keys_missing_idempotency"] == [{"key_prefix": me["prefix"], "requests": 1}]
        assert sum(d["missing_idempotency_key"] for d in stats["days"]) == 1
        row = poll(
            lambda: next((r for r in c.iter_audit(idempotency_key=ik) if not r["replayed"]), None),
            what="the order's audit row",
        )
        assert (row.get("origin"), row.get("would_refuse")) == ("default", None)
    # The operator: the project's keys by day, both imported keys.
    by_day = poll(
        lambda: (r := admin.usage(project=project, granularity="day")) and sums(r)[0] == 5 and r,
        timeout=20,
        what="both keys in the operator's usage",
    )
    assert {u["key_prefix"] for u in by_day} == {me["prefix"], hashed[:10]}
    assert all(u["period_start"] % 86_400_000 == 0 for u in by_day)


@pytest.mark.anyio
async def test_async_import_and_usage(env: Any) -> None:
    project = f"py-aimport-{uuid.uuid4().hex[:8]}"
    legacy = f"sk_live_{uuid.uuid4().hex[:24]}"
    entry: postguard.types.ImportKey = {"key": legacy, "project": project, "plan": env.plan_big}
    async with AsyncClient(env.gateway, admin_token=env.admin_token) as op:
        assert [k["status"] for k in await op.import_keys([entry])] == ["created"]
        async with AsyncClient(env.gateway, api_key=legacy) as c:
            assert (await c.request("GET", "/py/aitems")).status == 200
        deadline = time.monotonic() + 20
        while not (rows := await op.usage(project=project)) and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        assert [(u["key_prefix"], u["requests"]) for u in rows] == [(legacy[:12], 1)]
        assert [k["status"] for k in await op.import_keys([entry])] == ["exists"]


def test_a_subscription_created_with_a_moved_secret_delivers_signed_with_it(
    env: Any, new_key: Any, admin: Client
) -> None:
    k = new_key()
    moved = "whsec_" + base64.b64encode(os.urandom(32)).decode()
    with Client(env.gateway, api_key=k.key) as c:
        sub = c.create_webhook(f"{env.receiver}/py-moved/{k.project}", ["py.moved"], secret=moved)
        assert sub["secret"] == moved, "the answer shows the secret it was given"
        event = admin.publish_event(k.project, "py.moved", {"n": 1})["id"]
        d = captured(env, event)
        assert postguard.verify(d["body"], d["headers"], moved).id == event
        with pytest.raises(postguard.WebhookVerificationError):
            postguard.verify(d["body"], d["headers"], "whsec_" + base64.b64encode(os.urandom(32)).decode())


# --- the examples run as documented ------------------------------------------------------


@pytest.mark.parametrize(
    ("script", "expect"),
    [
        ("quickstart.py", "refused as expected: IDEMPOTENCY_KEY_REUSE_CONFLICT"),
        ("concurrent_async.py", "40 calls in"),
    ],
)
def test_examples_run(env: Any, new_key: Any, script: str, expect: str) -> None:
    k = new_key()
    path = Path(__file__).resolve().parent.parent / "examples" / script
    out = subprocess.run(
        [sys.executable, str(path)],
        env={**os.environ, "POSTGUARD_URL": env.gateway, "POSTGUARD_API_KEY": k.key},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert expect in out.stdout, out.stdout
