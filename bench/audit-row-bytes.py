"""Bytes per audit row: the AuditShard schema (read from src/durable/audit_shard.rs, its
only indexes) against the old D1 schema (migrations/0001), with the same realistic rows,
SQLite VACUUMed. Also the hourly roll-ups a day of one busy key adds.
Usage: python3 bench/audit-row-bytes.py [rows]"""
import os
import random
import re
import sqlite3
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
N = int(sys.argv[1]) if len(sys.argv) > 1 else 200_000
CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
rnd = random.Random(16)


def shard_schema():
    src = open(os.path.join(ROOT, "src/durable/audit_shard.rs")).read()
    return re.search(r'const SCHEMA: &str = "(.*?)";', src, re.S).group(1)


def rows(n, day_start):
    paths = [f"/v1/orders/{i}" for i in range(2000)] + ["/v1/orders", "/v1/customers", "/v1/payments/intents"]
    agents = [
        "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36",
        "python-requests/2.32.3", "acme-billing/4.2.1 (+https://acme.example/bot)", "okhttp/4.12.0",
    ]
    for i in range(n):
        t = day_start + i * 86_400_000 // n
        rid = "req_" + "".join(rnd.choice(CROCKFORD) for _ in range(26))
        post = rnd.random() < 0.4
        status = rnd.choices([200, 201, 400, 404, 409, 429, 500, 503], [60, 20, 4, 6, 2, 5, 2, 1])[0]
        ip = (f"203.0.{rnd.randrange(256)}.{rnd.randrange(256)}" if rnd.random() < 0.7
              else f"2001:db8:{rnd.randrange(65536):x}:{rnd.randrange(65536):x}::{rnd.randrange(65536):x}")
        yield dict(request_id=rid, time=t, method="POST" if post else "GET", path=rnd.choice(paths), status=status,
                   response_bytes=rnd.randrange(80, 4000), response_time_ms=int(rnd.lognormvariate(3.5, 0.8)),
                   client_ip=ip, user_agent=rnd.choice(agents), key_prefix="pgk_Ab3dE6gH",
                   project="acme-payments", idempotency_key=(f"{rnd.getrandbits(128):032x}" if post else None),
                   replayed=int(post and rnd.random() < 0.03), rate_limit_remaining=rnd.randrange(2000))


def measure(schema, table, cols, data):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "a.db")
        db = sqlite3.connect(path)
        db.executescript(schema)
        db.executemany(f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                       [tuple(r[c] for c in cols) for r in data])
        db.commit()
        db.execute("VACUUM")
        db.close()
        return os.path.getsize(path)


data = list(rows(N, 1_764_547_200_000))
shard_cols = ["request_id", "time", "method", "path", "status", "response_bytes", "response_time_ms", "client_ip",
              "user_agent", "key_prefix", "idempotency_key", "replayed", "rate_limit_remaining"]
old_cols = shard_cols[:10] + ["project"] + shard_cols[10:]
empty = measure(shard_schema(), "rows", shard_cols, [])
shard = measure(shard_schema(), "rows", shard_cols, data)
old = measure(open(os.path.join(ROOT, "migrations/0001_audit_log.sql")).read(), "audit_log", old_cols, data)
# Roll-ups of the same day (one key): one row per (hour, key, path) and per (hour, key, ms).
paths, lat = {}, {}
for r in data:
    h = r["time"] // 3_600_000 * 3_600_000
    c = paths.setdefault((h, r["key_prefix"], r["path"]), [0, 0, 0])
    c[0] += 1
    c[1] += r["status"] >= 400
    c[2] += r["status"] >= 500
    k = (h, r["key_prefix"], min(r["response_time_ms"], 600_000))
    lat[k] = lat.get(k, 0) + 1
with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, "r.db")
    db = sqlite3.connect(path)
    db.executescript(shard_schema())
    db.executemany("INSERT INTO paths VALUES (?, ?, ?, ?, ?, ?)", [(*k, *v) for k, v in paths.items()])
    db.executemany("INSERT INTO latency VALUES (?, ?, ?, ?)", [(*k, v) for k, v in lat.items()])
    db.commit()
    db.execute("VACUUM")
    db.close()
    rollups = os.path.getsize(path) - empty
print(f"rows {N}: shard schema {(shard - empty) / N:.1f} B/row (file {shard} B), old D1 schema {old / N:.1f} B/row")
print(f"roll-ups of those rows: {len(paths)} path counters, {len(lat)} latency counters, {rollups} B "
      f"({rollups / N:.1f} B/row)")
