// The shared limiter with a fake clock: one probe before the budget is known, in-flight calls
// counted against the budget, the reserve (threshold), waiting for the reset, pacing.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { RateLimiter, readRateLimit, reserveFor } from '../dist/index.js';
import { fakeClock } from './fake-clock.mjs';

const info = (remaining, t, limit = 10, w = 5) => ({ remaining, limit, resetInS: t, windowS: w });

test('reads postguard headers, IETF fields first', () => {
  const h = new Headers({
    'x-ratelimit-limit': '10', 'x-ratelimit-remaining': '7', 'x-ratelimit-reset': '1700000005',
    'ratelimit-policy': '"default";q=10;w=5', ratelimit: '"default";r=7;t=5',
  });
  assert.deepEqual(readRateLimit(h), { remaining: 7, limit: 10, resetInS: 5, resetEpochS: 1700000005, windowS: 5 });
  assert.deepEqual(readRateLimit(new Headers({ 'x-ratelimit-remaining': '3', 'x-ratelimit-limit': '9' })), {
    remaining: 3, limit: 9, resetInS: undefined, resetEpochS: undefined, windowS: undefined,
  });
  assert.equal(readRateLimit(new Headers()), undefined);
});

test('several policies: the binding one (fewest remaining, a time window) with its own limit and window', () => {
  const h = new Headers({
    'ratelimit-policy': '"burst";q=10;w=1, "minute";q=30;w=60, "inflight";q=5;qu="concurrent-requests"',
    ratelimit: '"minute";r=2;t=42, "burst";r=7;t=1, "inflight";r=1',
    'x-ratelimit-limit': '30', 'x-ratelimit-remaining': '2',
  });
  assert.deepEqual(readRateLimit(h), { remaining: 2, limit: 30, resetInS: 42, resetEpochS: undefined, windowS: 60 });
});

test('one probe until the first answer tells the budget', async () => {
  const clock = fakeClock();
  const l = new RateLimiter({ threshold: 0 }, clock);
  await l.acquire();
  assert.ok(l.delayBeforeSend(clock.now()) > 0, 'the second call waits for the first answer');
  l.release(info(9, 5), clock.now(), clock.now(), true);
  assert.equal(l.delayBeforeSend(clock.now()), 0, 'and goes once it came');
});

test('a slow probe holds the others back for one second at most', async () => {
  const clock = fakeClock();
  const l = new RateLimiter({}, clock);
  await l.acquire();
  const start = clock.now();
  await l.acquire(); // no answer yet: waits on the fake clock
  assert.equal(clock.now() - start, 1000);
  await l.acquire(); // the others go too, not one per second
  assert.equal(clock.now() - start, 1000);
  assert.equal(l.pending, 3);
});

test('calls in flight count against the budget; threshold 0 uses all of it, then waits for the reset', async () => {
  const clock = fakeClock();
  const l = new RateLimiter({ threshold: 0 }, clock);
  await l.acquire();
  const t0 = clock.now();
  l.release(info(9, 5), t0, t0, true);
  for (let i = 0; i < 9; i++) await l.acquire(); // 9 more in flight: the whole window
  assert.equal(l.pending, 9);
  assert.ok(l.delayBeforeSend(clock.now()) > 0, 'the 11th call must wait');
  // Answers come back (remaining 8..0); the window is spent.
  for (let r = 8; r >= 0; r--) l.release(info(r, 5), t0, t0, true);
  const wait = l.delayBeforeSend(clock.now());
  assert.ok(wait >= 5000 && wait <= 5100, `waits until the reset (≈5 s), got ${wait}`);
  await l.acquire(); // sleeps on the fake clock
  assert.ok(clock.now() - t0 >= 5000, 'sent only after the reset');
});

test('the default reserve is a tenth of the limit, at least 1, never the whole budget', () => {
  assert.deepEqual([1, 2, 5, 10, 19, 20, 60, 2000].map((limit) => reserveFor(limit)), [0, 1, 1, 1, 1, 2, 6, 200]);
  assert.deepEqual([0, 5, 50].map((t) => reserveFor(10, t)), [0, 5, 9], 'an explicit threshold is absolute, capped at limit − 1');
  assert.equal(reserveFor(0), 0, 'a plan of 0 keeps nothing back');
});

test('default reserve on a 5-per-5 s plan: four calls per window, not one (issue 25 item 7)', async () => {
  const clock = fakeClock();
  const l = new RateLimiter({}, clock);
  await l.acquire();
  l.release(info(4, 5, 5), clock.now(), clock.now(), true); // the probe: 4 of 5 left
  let sent = 1;
  while (l.delayBeforeSend(clock.now()) === 0) {
    await l.acquire();
    sent += 1;
  }
  assert.equal(sent, 4, '5 − 1 in reserve: four calls in this window');
  // With the old fixed reserve of 5 (capped at limit − 1 = 4) only the probe went.
  const old = new RateLimiter({ threshold: 5 }, clock);
  await old.acquire();
  old.release(info(4, 5, 5), clock.now(), clock.now(), true);
  assert.ok(old.delayBeforeSend(clock.now()) > 0);
});

test('a larger plan keeps a tenth back: 60 per minute sends 54 of 60', async () => {
  const clock = fakeClock();
  const l = new RateLimiter({}, clock);
  await l.acquire();
  l.release(info(59, 60, 60, 60), clock.now(), clock.now(), true);
  let sent = 1;
  while (l.delayBeforeSend(clock.now()) === 0) {
    await l.acquire();
    sent += 1;
  }
  assert.equal(sent, 54, '6 of 60 in reserve');
});

test('a threshold above the plan is capped at limit − 1 so calls still move', async () => {
  const clock = fakeClock();
  const l = new RateLimiter({ threshold: 50 }, clock);
  await l.acquire();
  l.release(info(2, 5, 3), clock.now(), clock.now(), true);
  assert.ok(l.delayBeforeSend(clock.now()) > 0, '2 remaining, reserve 2: wait for the reset');
  await l.acquire();
  assert.equal(l.pending, 1, 'after the reset, one call (3 − 1 ≥ reserve 2) goes');
  assert.ok(l.delayBeforeSend(clock.now()) > 0, 'and the next waits');
});

test('a lost answer is assumed to have used a unit', async () => {
  const clock = fakeClock();
  const l = new RateLimiter({ threshold: 0 }, clock);
  await l.acquire();
  l.release(info(1, 5), clock.now(), clock.now(), true);
  await l.acquire();
  l.release(undefined, clock.now(), clock.now(), false);
  assert.ok(l.delayBeforeSend(clock.now()) > 0);
});

test('pacing while the probe is slow: calls go one per second, not all at once when the wait ends', async () => {
  const clock = fakeClock();
  const l = new RateLimiter({ threshold: 0, pacing: true }, clock);
  await l.acquire(); // the probe, unanswered
  const start = clock.now();
  const sentAt = [];
  for (let i = 0; i < 3; i++) {
    await l.acquire();
    sentAt.push(clock.now() - start);
  }
  assert.deepEqual(sentAt, [1000, 2000, 3000]);
  // Without pacing the documented fallback stands: after one second the others all go.
  const burst = new RateLimiter({ threshold: 0 }, clock);
  await burst.acquire();
  const t0 = clock.now();
  await burst.acquire();
  await burst.acquire();
  assert.equal(clock.now() - t0, 1000);
});

test('pacing spreads calls window / limit apart', async () => {
  const clock = fakeClock();
  const l = new RateLimiter({ threshold: 0, pacing: true }, clock);
  await l.acquire();
  l.release(info(9, 5), clock.now(), clock.now(), true);
  const start = clock.now();
  for (let i = 0; i < 4; i++) {
    await l.acquire();
    l.release(info(8 - i, 5), clock.now(), clock.now(), true);
  }
  assert.deepEqual(clock.sleeps, [500, 500, 500, 500].slice(0, clock.sleeps.length));
  assert.ok(clock.now() - start >= 1500, `4 paced calls take ≥ 3 intervals, took ${clock.now() - start}`);
});

test('a late answer from the previous window does not shrink the new one', async () => {
  const clock = fakeClock();
  const l = new RateLimiter({ threshold: 0 }, clock);
  await l.acquire();
  const t0 = clock.now();
  l.release(info(0, 5), t0, t0, true);
  await l.acquire(); // waits for the reset
  clock.advance(10);
  l.release(info(0, 5), t0 + 100, t0 + 200, true); // an answer sent in the old window
  assert.equal(l.delayBeforeSend(clock.now()), 0, 'the new window still has budget');
});

test('disabled: never waits', async () => {
  const l = new RateLimiter({ enabled: false }, fakeClock());
  for (let i = 0; i < 100; i++) await l.acquire();
  assert.equal(l.pending, 100);
});

test('a plan of 0 does not stall: after the reset, with nothing in flight, one call tries again', async () => {
  const clock = fakeClock();
  const l = new RateLimiter({}, clock);
  await l.acquire();
  l.release(info(0, 5, 0), clock.now(), clock.now(), true);
  const wait = l.delayBeforeSend(clock.now());
  assert.ok(wait > 4000 && Number.isFinite(wait), `waits for the reset (${wait})`);
  clock.advance(wait);
  assert.equal(l.delayBeforeSend(clock.now()), 0);
});
