"""A webhook receiver (standard library only besides postguard): verifies each
delivery, acknowledges duplicates without processing them again.

    WEBHOOK_SECRETS=whsec_new,whsec_old python examples/webhook_receiver.py 8789
"""

from __future__ import annotations

import os
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer

import postguard

SECRETS = [s for s in os.environ.get("WEBHOOK_SECRETS", "").split(",") if s]
SEEN = postguard.MemoryDedupe()
MAX_BODY = 1 << 20


class Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        if length > MAX_BODY:
            self.send_response(413)
            self.end_headers()
            return
        body = self.rfile.read(length)
        try:
            event = postguard.verify(body, dict(self.headers.items()), SECRETS, dedupe=SEEN)
        except postguard.WebhookVerificationError as err:
            print(f"refused: {err.detail}")
            self.send_response(400)
            self.end_headers()
            return
        if event.duplicate:
            print(f"{event.id} again: already handled")
        else:
            print(f"{event.id} {event.type} {event.data}")
        self.send_response(204)
        self.end_headers()


if __name__ == "__main__":
    if not SECRETS:
        sys.exit("set WEBHOOK_SECRETS to the subscription's secret(s), comma-separated")
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 8789
    HTTPServer(("127.0.0.1", port), Handler).serve_forever()
