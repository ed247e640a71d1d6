#!/usr/bin/env bash
# The TypeScript SDK (clients/typescript): `npm ci` when its lockfile changed, `tsc` when a
# source changed (src/, examples/, configs), then `npm pack` into target/sdk-typescript/ so CI
# proves the package builds as published (tests/sdk-typescript.test.mjs installs that tarball).
set -euo pipefail
source "$(dirname "$0")/env.sh"
DIR="$ROOT/clients/typescript"
OUT="$ROOT/target/sdk-typescript"
cd "$DIR"
step() { printf '\033[1m==> %s\033[0m\n' "$*"; }

stamp="$DIR/node_modules/.postguard-lock"
want=$(sha256sum package-lock.json | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  step "npm ci (clients/typescript)"
  npm ci --no-audit --no-fund --loglevel=error
  echo "$want" > "$stamp"
fi

built="$DIR/node_modules/.postguard-build"
if [ ! -f "$built" ] || [ ! -f dist/index.js ] || [ -n "$(find src examples package.json tsconfig.json -newer "$built" -print -quit)" ]; then
  step "tsc (clients/typescript)"
  rm -rf dist
  npm run build --silent
  touch "$built"
fi

tarball="$OUT/postguard-client-$(node -p 'require("./package.json").version').tgz"
if [ ! -f "$tarball" ] || [ "$built" -nt "$tarball" ]; then
  step "npm pack (clients/typescript) → ${tarball#"$ROOT"/}"
  mkdir -p "$OUT"
  rm -f "$OUT"/*.tgz
  npm pack --ignore-scripts --silent --pack-destination "$OUT" >/dev/null
fi
