#!/usr/bin/env bash
# Every benchmark, one after another (never in parallel: they share the machine),
# each writing its section of bench/RESULTS.md. Installs what is missing and builds
# first. About 20 minutes. One benchmark: `bash scripts/bench.sh proxy` (or profile,
# counters, coldstart, audit, audit-shards, webhooks, webhook-shards, scaling, policies, live-api,
# edge, quota-notices; and
# peer, the Hono peer of ADR 0036, which needs HONO_IDEMPOTENCY_SRC: bench/README.md).
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$ROOT"
bash scripts/setup.sh
bash scripts/build.sh

declare -A ARGS=(
  [proxy]="3 4"        # rounds, seconds per run
  [profile]="all 4 3"  # scenarios, seconds, rounds
  [counters]="50"      # requests per kind
  [coldstart]="5"      # trials
  [audit]="3 5"        # rounds, seconds
  [audit-shards]="1000000 40" # rows of the big project, timed samples
  [webhooks]="1000 3"  # events per round, rounds
  [webhook-shards]="800 3" # events per measurement, rounds (STORED=1000000 seeded first)
  [scaling]="3 4 100000" # rounds, seconds, largest record count
  [policies]="7 4"     # rounds, seconds per run
  [live-api]="5 4"     # rounds, seconds per run
  [edge]="7 4"         # rounds, seconds per run (edges on ÷ off)
  [quota-notices]="7 4" # rounds, seconds per run (notify_at ÷ none)
  [peer]="5 10"        # rounds, seconds per run (not in the default order)
)
ORDER=(proxy profile counters coldstart audit audit-shards webhooks webhook-shards scaling policies live-api edge quota-notices)
[ $# -gt 0 ] && ORDER=("$@")
for b in "${ORDER[@]}"; do
  [ -n "${ARGS[$b]+x}" ] || { echo "unknown benchmark: $b (one of ${!ARGS[*]})" >&2; exit 2; }
  printf '\033[1m==> node bench/%s.mjs %s\033[0m\n' "$b" "${ARGS[$b]}"
  # shellcheck disable=SC2086
  node "bench/$b.mjs" ${ARGS[$b]}
done
echo "results: bench/RESULTS.md"
