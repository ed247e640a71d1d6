#!/usr/bin/env python3
"""Bytes per webhook record in a WebhookShard (issue 24, ADR 0035), against D1's tables.

Builds a SQLite database from the shard's own schema (the SCHEMA constant of
src/durable/webhook_shard.rs, every table and index), fills it with the rows
the publish path and the consumer write (one project's shard: no project
column; the outbox is a column with a partial index; the trace a column of the
event), VACUUMs it and reads each table's bytes with its indexes from
`dbstat`. Prints bytes per row and per event as published, beside the same
cases in D1's schema (bench/webhook-records.py).

    python3 bench/webhook-shard-records.py
"""
import importlib.util
import os
import random
import re
import sqlite3

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
spec = importlib.util.spec_from_file_location("records", os.path.join(ROOT, "bench", "webhook-records.py"))
d1 = importlib.util.module_from_spec(spec)
spec.loader.exec_module(d1)
N_EVENTS = d1.N_EVENTS


def shard_schema(db):
    src = open(os.path.join(ROOT, "src", "durable", "webhook_shard.rs")).read()
    m = re.search(r'const SCHEMA: &str = "(.*?)";', src, re.S)
    db.executescript(m.group(1))


def fill(db, payload_bytes, fanout, attempts, excerpt):
    t0 = 1_796_000_000_000
    url = "https://hooks.example-customer.com/webhooks/postguard"
    for i in range(N_EVENTS):
        t = t0 + i * 37
        ev = d1.ulid("evt_", t)
        db.execute("INSERT INTO events VALUES (?, ?, ?, ?, ?)", (ev, "payment.succeeded", d1.payload(ev, payload_bytes), t, d1.ulid("req_", t)))
        for s in range(fanout):
            dlv = d1.ulid("dlv_", t0)
            sub = "sub_%026d" % s
            db.execute(
                "INSERT INTO deliveries VALUES (?, ?, ?, ?, ?, 'delivered', ?, NULL, ?, ?, ?, 0)",
                (dlv, ev, "payment.succeeded", sub, url, attempts, t, t + 400, t + 5),
            )
            for a in range(1, attempts + 1):
                error = None if a == attempts else "HTTP 503 from the receiver"
                db.execute(
                    "INSERT INTO attempts VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (dlv, d1.ulid("req_", t + a), a, url, 200 if a == attempts else 503, error, excerpt, 180, t + a * 60_000,
                     None if a == attempts else t + (a + 1) * 60_000),
                )
    db.execute("INSERT INTO usage VALUES (?, ?, ?, ?)", (20788, N_EVENTS, N_EVENTS * fanout, 0))
    db.commit()


def measure(payload_bytes, fanout, attempts, excerpt):
    db = sqlite3.connect(":memory:")
    shard_schema(db)
    fill(db, payload_bytes, fanout, attempts, excerpt)
    db.execute("VACUUM")
    sizes = d1.bytes_by_table(db)
    rows = {"events": N_EVENTS, "deliveries": N_EVENTS * fanout, "attempts": N_EVENTS * fanout * attempts}
    per_row = {t: sizes.get(t, 0) / n for t, n in rows.items()}
    per_event = sum(sizes.get(t, 0) for t in rows) / N_EVENTS
    return per_row, per_event


def main():
    cases = [
        ("1 KB payload, 1 subscription, 1 attempt ({\"ok\":true})", 1024, 1, 1, '{"ok":true}'),
        ("1 KB payload, 1 subscription, 5 attempts, 512-char excerpts", 1024, 1, 5, "x" * 512),
        ("64 KiB payload (the maximum), 1 subscription, 1 attempt", 65536, 1, 1, '{"ok":true}'),
        ("1 KB payload, 10 subscriptions, 1 attempt each", 1024, 10, 1, '{"ok":true}'),
    ]
    for label, size, fanout, attempts, excerpt in cases:
        random.seed(24)
        per_row, per_event = measure(size, fanout, attempts, excerpt)
        random.seed(24)
        _, d1_event = d1.measure(size, fanout, attempts, excerpt)
        print(f"{label}:")
        for t, b in per_row.items():
            print(f"  {t:15} {b:9.0f} B/row")
        print(f"  {'per event':15} {per_event:9.0f} B (D1's tables: {d1_event:.0f} B, shard ÷ D1 {per_event / d1_event:.2f})")


if __name__ == "__main__":
    main()
