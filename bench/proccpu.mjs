// The workerd process's own CPU time, from /proc, for an independent CPU figure per request
// beside the V8 profile's "busy" time (which counts every sample the embedder does not mark
// idle). Each gateway is its own workerd process; it is found by the TCP port it listens on.
// Used by bench/profile.mjs (CPU_PROC column) and bench/proxy.mjs; Linux only.
import fs from 'node:fs';

const CLK_TCK = 100; // USER_HZ on Linux: utime/stime in /proc/*/stat are in 1/100 s

/** The pid of the process listening on TCP `port` on this machine (null if none found). */
export function pidOfPort(port) {
  const hex = port.toString(16).toUpperCase().padStart(4, '0');
  const inodes = new Set();
  for (const f of ['/proc/net/tcp', '/proc/net/tcp6']) {
    if (!fs.existsSync(f)) continue;
    for (const line of fs.readFileSync(f, 'utf8').split('\n').slice(1)) {
      const cols = line.trim().split(/\s+/);
      if (cols.length > 9 && cols[1].endsWith(`:${hex}`) && cols[3] === '0A') inodes.add(cols[9]); // 0A = LISTEN
    }
  }
  if (!inodes.size) return null;
  for (const pid of fs.readdirSync('/proc').filter((d) => /^\d+$/.test(d))) {
    let fds;
    try { fds = fs.readdirSync(`/proc/${pid}/fd`); } catch { continue; }
    for (const fd of fds) {
      let link;
      try { link = fs.readlinkSync(`/proc/${pid}/fd/${fd}`); } catch { continue; }
      const m = /^socket:\[(\d+)\]$/.exec(link);
      if (m && inodes.has(m[1])) return Number(pid);
    }
  }
  return null;
}

/** utime + stime of one /proc stat file, in µs. */
function statUs(file) {
  const s = fs.readFileSync(file, 'utf8');
  const f = s.slice(s.lastIndexOf(')') + 2).split(' '); // fields from 3 (state) on
  return ((Number(f[11]) + Number(f[12])) * 1e6) / CLK_TCK;
}

/**
 * A snapshot of the process's CPU time: the whole process, and the busiest thread (the
 * thread running the isolate, under load) by thread id.
 */
export function cpuOf(pid) {
  const threads = {};
  for (const tid of fs.readdirSync(`/proc/${pid}/task`)) {
    try { threads[tid] = statUs(`/proc/${pid}/task/${tid}/stat`); } catch { /* thread ended */ }
  }
  return { process: statUs(`/proc/${pid}/stat`), threads, at: performance.now() };
}

/** CPU µs between two snapshots: the process's, and its busiest thread's. */
export function cpuDelta(a, b) {
  let thread = 0;
  for (const [tid, us] of Object.entries(b.threads)) thread = Math.max(thread, us - (a.threads[tid] ?? 0));
  return { process: b.process - a.process, thread, wall: (b.at - a.at) * 1000 };
}
