"""Create an order through the gateway, safely: run it twice and see the replay.

POSTGUARD_URL=http://127.0.0.1:8787 POSTGUARD_API_KEY=pgk_... python examples/quickstart.py
"""

from __future__ import annotations

import os

import postguard


def main() -> None:
    with postguard.Client(os.environ["POSTGUARD_URL"], api_key=os.environ["POSTGUARD_API_KEY"]) as pg:
        me = pg.me()
        print(f"key {me['prefix']}… project {me['project']}, {me['remaining']}/{me['limit']} left")

        # Our own key: the order id, so even a restart of this script cannot pay twice.
        first = pg.request("POST", "/payments", {"amount": 100}, idempotency_key="order-4711")
        again = pg.request("POST", "/payments", {"amount": 100}, idempotency_key="order-4711")
        print(
            first.status, "replayed:", first.replayed, "| again:", again.status, "replayed:", again.replayed
        )

        try:
            pg.request("POST", "/payments", {"amount": 999}, idempotency_key="order-4711")
        except postguard.IdempotencyKeyReuseConflict as err:
            print(f"refused as expected: {err.code} ({err.request_id})")

        for row in pg.iter_audit(idempotency_key="order-4711", limit=50):
            print(row["request_id"], row["status"], "replayed" if row["replayed"] else "executed")


if __name__ == "__main__":
    main()
