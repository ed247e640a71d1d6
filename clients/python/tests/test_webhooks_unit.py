"""Unit tests of verify() on deliveries signed locally with the standardwebhooks
library; test_integration.py verifies real deliveries of the gateway."""

from __future__ import annotations

import base64
import json
import time
from datetime import datetime, timezone

import pytest
import standardwebhooks

import postguard
from postguard import MemoryDedupe, verify

SECRET = "whsec_" + base64.b64encode(b"k" * 32).decode()
OTHER = "whsec_" + base64.b64encode(b"o" * 32).decode()


def delivery(
    secrets: list[str], ts: int | None = None, event_id: str = "evt_1"
) -> tuple[str, dict[str, str]]:
    ts = int(time.time()) if ts is None else ts
    body = json.dumps(
        {
            "id": event_id,
            "type": "payment.succeeded",
            "timestamp": "2026-12-01T08:00:00Z",
            "data": {"amount": 5},
        }
    )
    when = datetime.fromtimestamp(ts, tz=timezone.utc)
    sigs = " ".join(standardwebhooks.Webhook(s).sign(event_id, when, body) for s in secrets)
    return body, {"Webhook-Id": event_id, "Webhook-Timestamp": str(ts), "Webhook-Signature": sigs}


def test_verifies_and_returns_the_event() -> None:
    body, headers = delivery([SECRET])
    ev = verify(body.encode(), headers, SECRET)
    assert (ev.id, ev.type, ev.data, ev.duplicate) == ("evt_1", "payment.succeeded", {"amount": 5}, False)


def test_tampered_body_or_signature_is_refused() -> None:
    body, headers = delivery([SECRET])
    with pytest.raises(postguard.WebhookSignatureInvalid) as e:
        verify(body.replace("5", "6"), headers, SECRET)
    assert e.value.code == "WEBHOOK_SIGNATURE_INVALID"
    assert isinstance(e.value, postguard.WebhookVerificationError), "one base class to catch"
    bad = dict(headers, **{"Webhook-Signature": "v1," + base64.b64encode(b"x" * 32).decode()})
    with pytest.raises(postguard.WebhookSignatureInvalid):
        verify(body, bad, SECRET)
    with pytest.raises(postguard.WebhookSignatureInvalid):
        verify(body, dict(headers, **{"Webhook-Signature": "garbage"}), SECRET)
    with pytest.raises(postguard.WebhookHeadersMissing) as missing:
        verify(body, {k: v for k, v in headers.items() if k != "Webhook-Id"}, SECRET)
    assert missing.value.code == "WEBHOOK_HEADERS_MISSING"
    with pytest.raises(postguard.WebhookHeadersMissing):
        verify(body, dict(headers, **{"Webhook-Timestamp": "yesterday"}), SECRET)


def test_a_bad_signature_and_a_stale_or_future_timestamp_are_told_apart() -> None:
    """Issue 25 item 7: one code for both hid a receiver's clock skew behind "bad
    signature"; the codes are those of the TypeScript SDK (Rust: VerifyError variants)."""
    now = int(time.time())
    for sent in (now - 301, now + 301):
        body, headers = delivery([SECRET], ts=sent)
        with pytest.raises(postguard.WebhookTimestampOutOfTolerance) as e:
            verify(body, headers, SECRET)
        assert e.value.code == "WEBHOOK_TIMESTAMP_OUT_OF_TOLERANCE"
        assert not isinstance(e.value, postguard.WebhookSignatureInvalid)
    # A stale delivery that is also forged is refused for its timestamp, before any HMAC.
    body, headers = delivery([OTHER], ts=now - 301)
    with pytest.raises(postguard.WebhookTimestampOutOfTolerance):
        verify(body, headers, SECRET)
    # The library's own 5-minute window (real clock) when a test clock says "now" is fine.
    body, headers = delivery([SECRET], ts=now - 400)
    with pytest.raises(postguard.WebhookTimestampOutOfTolerance):
        verify(body, headers, SECRET, now=now - 400)
    # A fresh delivery signed with another secret: a signature error, not a timestamp one.
    body, headers = delivery([OTHER], ts=now)
    with pytest.raises(postguard.WebhookSignatureInvalid):
        verify(body, headers, SECRET)


def test_a_signed_body_that_is_not_an_event() -> None:
    ts = int(time.time())
    when = datetime.fromtimestamp(ts, tz=timezone.utc)
    for body in ("not json", json.dumps([1, 2])):
        sig = standardwebhooks.Webhook(SECRET).sign("evt_1", when, body)
        headers = {"webhook-id": "evt_1", "webhook-timestamp": str(ts), "webhook-signature": sig}
        with pytest.raises(postguard.WebhookBodyInvalid) as e:
            verify(body, headers, SECRET)
        assert e.value.code == "WEBHOOK_BODY_INVALID"


def test_rotated_secrets() -> None:
    body, both = delivery([OTHER, SECRET])  # during a rotation: old and new sign
    assert verify(body, both, SECRET).id == "evt_1"
    assert verify(body, both, [OTHER]).id == "evt_1"
    body1, only_new = delivery([SECRET])
    assert verify(body1, only_new, [OTHER, SECRET]).id == "evt_1"  # receiver holds both
    with pytest.raises(postguard.WebhookVerificationError):
        verify(body1, only_new, [OTHER])


def test_tolerance() -> None:
    now = int(time.time())
    body, headers = delivery([SECRET], ts=now - 30)
    assert verify(body, headers, SECRET, tolerance_s=60).id == "evt_1"
    with pytest.raises(postguard.WebhookTimestampOutOfTolerance):
        verify(body, headers, SECRET, tolerance_s=10)
    with pytest.raises(postguard.WebhookTimestampOutOfTolerance):
        verify(body, headers, SECRET, now=now + 300)
    with pytest.raises(postguard.ConfigurationError):
        verify(body, headers, SECRET, tolerance_s=3600)  # wider than the library allows


def test_dedupe_hook_after_verification_only() -> None:
    seen = MemoryDedupe()
    body, headers = delivery([SECRET], event_id="evt_dup")
    assert not verify(body, headers, SECRET, dedupe=seen).duplicate
    assert verify(body, headers, SECRET, dedupe=seen).duplicate
    forged_body, forged = delivery([OTHER], event_id="evt_forged")
    with pytest.raises(postguard.WebhookVerificationError):
        verify(forged_body, forged, SECRET, dedupe=seen)
    assert seen("evt_forged"), "a refused delivery never reaches the dedupe store"


def test_memory_dedupe_is_bounded_and_expires() -> None:
    clock = [0.0]
    d = MemoryDedupe(max_entries=2, ttl_s=10, clock=lambda: clock[0])
    assert d("a") and d("b") and not d("a")
    assert d("c")  # evicts "a", the oldest
    assert d("a")
    clock[0] = 100.0
    assert d("c"), "expired after ttl"


def test_bad_secret_is_a_configuration_error() -> None:
    body, headers = delivery([SECRET])
    with pytest.raises(postguard.ConfigurationError):
        verify(body, headers, [])
    with pytest.raises(postguard.ConfigurationError):
        verify(body, headers, "whsec_")
