#!/usr/bin/env bash
# Builds the Hono peer (worker.mjs beside this file) into target/hono-peer/build/index.js when
# missing or older than its sources. Hono comes from the npm registry (pinned below);
# hono-idempotency 0.9.1 is not on the registry, so its TypeScript sources are taken from a
# checkout of the library's public repository at its v0.9.1 tag (MIT): set
# HONO_IDEMPOTENCY_SRC to that checkout (any clone that has the tag). Everything lands in
# target/ (git-ignored): the library's code is not vendored. Called by bench/peer.mjs; CI
# never runs it.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
source "$HERE/../../scripts/env.sh"
OUT="$ROOT/target/hono-peer"
HONO_VERSION=4.13.19
TAG=v0.9.1
mkdir -p "$OUT"
if [ ! -f "$OUT/node_modules/hono/package.json" ] || ! grep -q "\"version\": \"$HONO_VERSION\"" "$OUT/node_modules/hono/package.json"; then
  npm install --prefix "$OUT" --no-save --no-package-lock --silent "hono@$HONO_VERSION"
fi
LIB="$OUT/hono-idempotency-$TAG"
if [ ! -f "$LIB/src/index.ts" ]; then
  SRC="${HONO_IDEMPOTENCY_SRC:-}"
  if [ -z "$SRC" ] || ! git -C "$SRC" rev-parse -q --verify "refs/tags/$TAG" >/dev/null; then
    echo "hono-peer: set HONO_IDEMPOTENCY_SRC to a clone of the hono-idempotency repository with tag $TAG" >&2
    exit 3
  fi
  rm -rf "$LIB.tmp" && mkdir -p "$LIB.tmp"
  git -C "$SRC" archive "$TAG" src LICENSE package.json | tar -x -C "$LIB.tmp"
  mv "$LIB.tmp" "$LIB"
fi
if [ ! -f "$OUT/build/index.js" ] || [ -n "$(find "$HERE" -newer "$OUT/build/index.js" -print -quit)" ]; then
  # hono-problem-details is the library's optional peer, not installed: its dynamic import
  # fails and the library writes its own problem+json (src/compat.ts).
  NODE_PATH="$OUT/node_modules" "${ESBUILD_BIN:-$ROOT/node_modules/.bin/esbuild}" "$HERE/worker.mjs" \
    --bundle --format=esm --platform=neutral --target=es2022 --minify-syntax \
    --external:cloudflare:workers --external:hono-problem-details \
    --alias:hono-idempotency/stores/durable-objects="$LIB/src/stores/durable-objects.ts" \
    --alias:hono-idempotency="$LIB/src/index.ts" \
    --outfile="$OUT/build/index.js" --log-level=warning
fi
