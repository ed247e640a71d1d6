"""Many tasks, one budget: 8 tasks share one AsyncClient and so one limiter, which
waits for the window's reset instead of running into 429s.

    POSTGUARD_URL=... POSTGUARD_API_KEY=... python examples/concurrent_async.py
"""

from __future__ import annotations

import asyncio
import os
import time

import postguard


async def main() -> None:
    throttled = 0

    def on_attempt(a: postguard.AttemptInfo) -> None:
        nonlocal throttled
        throttled += a.status == 429

    async with postguard.AsyncClient(
        os.environ["POSTGUARD_URL"],
        api_key=os.environ["POSTGUARD_API_KEY"],
        threshold=0,
        on_attempt=on_attempt,
    ) as pg:
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(40):
            queue.put_nowait(i)

        async def worker() -> None:
            while not queue.empty():
                await pg.request("POST", "/orders", {"n": queue.get_nowait()})

        t0 = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(8)))
        print(f"40 calls in {time.monotonic() - t0:.1f} s, 429s seen: {throttled}")


if __name__ == "__main__":
    asyncio.run(main())
