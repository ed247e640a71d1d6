#!/usr/bin/env python3
"""Bytes per webhook record in D1 (issue 16, ADR 0017).

Builds a SQLite database from migrations/*.sql (every table and index the
delivery path grows), fills it with realistic rows, VACUUMs it, and reads the
bytes of each table and of its indexes from SQLite's `dbstat` (whole pages, as
D1 stores them). Prints bytes per row of each table and per event as
published: 1 event row + 1 event_requests row + fan-out x (delivery + outbox
+ attempts).

    python3 bench/webhook-records.py            # 1 KB payloads and the 64 KiB maximum

No dependencies beyond python3's sqlite3 (with dbstat, as Debian builds it).
"""
import glob
import json
import os
import random
import sqlite3
import string
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
N_EVENTS = 2000


def ulid(prefix, t):
    rnd = "".join(random.choice(CROCKFORD) for _ in range(16))
    ts = ""
    for _ in range(10):
        ts = CROCKFORD[t % 32] + ts
        t //= 32
    return prefix + ts + rnd


def payload(event_id, size):
    """The exact delivered body, {id, type, timestamp, data}, about `size` bytes."""
    filler = "".join(random.choice(string.ascii_letters) for _ in range(max(0, size - 160)))
    data = {"payment_id": "pay_" + filler[:20], "amount": 4200, "currency": "eur", "note": filler}
    body = {"id": event_id, "type": "payment.succeeded", "timestamp": "2026-12-01T11:00:00.123Z", "data": data}
    return json.dumps(body, separators=(",", ":"))


def schema(db):
    for f in sorted(glob.glob(os.path.join(ROOT, "migrations", "*.sql"))):
        db.executescript(open(f).read())


def fill(db, payload_bytes, fanout, attempts, excerpt):
    t0 = 1_796_000_000_000
    url = "https://hooks.example-customer.com/webhooks/postguard"
    for i in range(N_EVENTS):
        t = t0 + i * 37
        project = "acme-prod-%02d" % (i % 10)
        ev = ulid("evt_", t)
        db.execute("INSERT INTO events VALUES (?, ?, ?, ?, ?)", (project, ev, "payment.succeeded", payload(ev, payload_bytes), t))
        db.execute("INSERT INTO event_requests VALUES (?, ?, ?)", (project, ev, ulid("req_", t)))
        for s in range(fanout):
            dlv = ulid("dlv_", t)
            sub = "sub_%026d" % s
            db.execute(
                "INSERT INTO deliveries VALUES (?, ?, ?, ?, ?, ?, 'delivered', ?, NULL, ?, ?)",
                (dlv, project, ev, "payment.succeeded", sub, url, attempts, t, t + 400),
            )
            db.execute("INSERT INTO outbox VALUES (?, ?, ?, ?, ?)", (dlv, project, ev, t, t + 5))
            for a in range(1, attempts + 1):
                error = None if a == attempts else "HTTP 503 from the receiver"
                db.execute(
                    "INSERT INTO attempts VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (dlv, ulid("req_", t + a), a, url, 200 if a == attempts else 503, error, excerpt, 180, t + a * 60_000,
                     None if a == attempts else t + (a + 1) * 60_000),
                )
    db.execute(
        "INSERT INTO webhook_usage VALUES (?, ?, ?, ?, ?)", ("acme-prod-00", 20788, N_EVENTS, N_EVENTS * fanout, 0)
    ) if has_table(db, "webhook_usage") else None
    db.commit()


def has_table(db, name):
    return db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)).fetchone() is not None


def bytes_by_table(db):
    """Bytes of each table plus its indexes (whole pages, overflow included)."""
    owner = dict(db.execute("SELECT name, tbl_name FROM sqlite_master WHERE type IN ('table', 'index')").fetchall())
    out = {}
    for name, size in db.execute("SELECT name, SUM(pgsize) FROM dbstat GROUP BY name"):
        table = owner.get(name, name)
        if name.startswith("sqlite_autoindex_"):
            table = name[len("sqlite_autoindex_"):].rsplit("_", 1)[0]
        out[table] = out.get(table, 0) + size
    return out


def measure(payload_bytes, fanout, attempts, excerpt):
    db = sqlite3.connect(":memory:")
    schema(db)
    fill(db, payload_bytes, fanout, attempts, excerpt)
    db.execute("VACUUM")
    sizes = bytes_by_table(db)
    rows = {
        "events": N_EVENTS,
        "event_requests": N_EVENTS,
        "deliveries": N_EVENTS * fanout,
        "outbox": N_EVENTS * fanout,
        "attempts": N_EVENTS * fanout * attempts,
    }
    per_row = {t: sizes.get(t, 0) / n for t, n in rows.items()}
    per_event = sum(sizes.get(t, 0) for t in rows) / N_EVENTS
    return per_row, per_event


def measure_inspectors():
    """An inspector, and one capture with a delivery's headers and no body."""
    db = sqlite3.connect(":memory:")
    schema(db)
    headers = json.dumps({
        "content-type": "application/json", "webhook-id": "evt_01JDZ8Q3V4N5P6R7S8T9V0W1X2",
        "webhook-timestamp": "1796000000", "webhook-signature": "v1," + "A" * 44,
        "x-request-id": "req_01JDZ8Q3V4N5P6R7S8T9V0W1X2", "user-agent": "postguard/0.1",
    })
    for i in range(N_EVENTS):
        t = 1_796_000_000_000 + i
        db.execute("INSERT INTO inspectors VALUES (?, ?, ?, ?, ?)",
                   (ulid("insp_", t), "acme-prod-01", "%048x" % random.getrandbits(192), t + 86_400_000, t))
        db.execute("INSERT INTO inspector_requests (inspector_id, at, method, headers, body, signature_valid) VALUES (?, ?, ?, ?, ?, 1)",
                   ("insp_%026d" % (i % 20), t, "POST", headers, ""))
    db.commit()
    db.execute("VACUUM")
    sizes = bytes_by_table(db)
    print(f"inspectors: {sizes['inspectors'] / N_EVENTS:.0f} B/row; inspector_requests with "
          f"{len(headers)} B of headers, no body: {sizes['inspector_requests'] / N_EVENTS:.0f} B/row")


def main():
    random.seed(16)
    cases = [
        ("1 KB payload, 1 subscription, 1 attempt ({\"ok\":true})", 1024, 1, 1, '{"ok":true}'),
        ("1 KB payload, 1 subscription, 5 attempts, 512-char excerpts", 1024, 1, 5, "x" * 512),
        ("64 KiB payload (the maximum), 1 subscription, 1 attempt", 65536, 1, 1, '{"ok":true}'),
        ("1 KB payload, 10 subscriptions, 1 attempt each", 1024, 10, 1, '{"ok":true}'),
    ]
    report = []
    for label, size, fanout, attempts, excerpt in cases:
        per_row, per_event = measure(size, fanout, attempts, excerpt)
        report.append({"case": label, "bytes_per_row": {k: round(v) for k, v in per_row.items()}, "bytes_per_event": round(per_event)})
        print(f"{label}:")
        for t, b in per_row.items():
            print(f"  {t:15} {b:9.0f} B/row")
        print(f"  {'per event':15} {per_event:9.0f} B")
    measure_inspectors()
    if "--json" in sys.argv:
        print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
