// A clock the tests move by hand: sleep(ms) records the delay and advances time at once.
export function fakeClock(start = 1_700_000_000_000) {
  let t = start;
  const sleeps = [];
  return {
    sleeps,
    now: () => t,
    advance(ms) {
      t += ms;
    },
    async sleep(ms, signal) {
      signal?.throwIfAborted();
      sleeps.push(ms);
      t += ms;
    },
  };
}

/** A random source replaying `values` in a loop. */
export const fixedRandom = (...values) => {
  let i = 0;
  return () => values[i++ % values.length];
};
