#!/usr/bin/env bash
# Installs everything a fresh machine lacks, and skips what is already there:
# the wasm32 target, worker-build, the wasm-bindgen-cli matching Cargo.lock,
# Node 22 (from the npm registry, into .tools/), the npm packages (binaryen's
# wasm-opt, esbuild, wrangler), and — for the tests — the SDKs' tools, Debian's
# Chromium for the dashboard's browser tests (playwright-core drives it; no
# browser download) and schemathesis.
# `setup.sh --build` stops after the npm packages: what scripts/build.sh (wrangler's
# [build] command) and wrangler itself need, nothing the tests alone use.
set -euo pipefail
case "${1:-}" in
  --build) BUILD_ONLY=1 ;;
  "") BUILD_ONLY= ;;
  *) echo "usage: setup.sh [--build]" >&2; exit 2 ;;
esac
source "$(dirname "$0")/env.sh"
cd "$ROOT"

WORKER_BUILD_VERSION=0.8.7
NODE_VERSION=22.23.3
step() { printf '\033[1m==> %s\033[0m\n' "$*"; }

if ! rustup target list --installed | grep -qx wasm32-unknown-unknown; then
  step "rustup target add wasm32-unknown-unknown"
  rustup target add wasm32-unknown-unknown
fi

if [ "$(worker-build --version 2>/dev/null || true)" != "$WORKER_BUILD_VERSION" ]; then
  step "cargo install worker-build $WORKER_BUILD_VERSION (~3 min once)"
  cargo install worker-build --version "$WORKER_BUILD_VERSION" --force
fi

# worker-build would download wasm-bindgen from GitHub; install the exact
# version the lockfile uses from crates.io instead (without --locked: the
# CLI's own lockfile names crate versions the registry no longer serves).
WB_VERSION=$(awk '/^name = "wasm-bindgen"$/{getline; gsub(/version = |"/,""); print; exit}' Cargo.lock)
if [ "$(wasm-bindgen --version 2>/dev/null | awk '{print $2}')" != "$WB_VERSION" ]; then
  step "cargo install wasm-bindgen-cli $WB_VERSION (~2 min once)"
  cargo install wasm-bindgen-cli --version "$WB_VERSION" --force
fi

node_major() { node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0; }
if [ "$(node_major)" -lt 22 ]; then
  step "node@$NODE_VERSION into .tools/node22 (wrangler needs Node >= 22)"
  npm install --prefix "$ROOT/.tools/node22" --no-audit --no-fund --loglevel=error "node@$NODE_VERSION"
  hash -r
fi
[ "$(node_major)" -ge 22 ] || { echo "Node >= 22 is required, found $(node --version)" >&2; exit 1; }

stamp="$ROOT/node_modules/.postguard-lock"
want=$(sha256sum package-lock.json | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  step "npm ci"
  npm ci --no-audit --no-fund --loglevel=error
  echo "$want" > "$stamp"
fi
[ -z "$BUILD_ONLY" ] || exit 0

bash "$ROOT/scripts/setup-clients-rs.sh"
bash "$ROOT/scripts/setup-clients-py.sh"
bash "$ROOT/scripts/setup-clients-ts.sh"

if ! command -v chromium >/dev/null 2>&1; then
  step "apt-get install chromium (the dashboard's browser tests; ~20 s once)"
  if [ "$(id -u)" -eq 0 ]; then
    apt-get update && apt-get install -y chromium
  else
    sudo apt-get update && sudo apt-get install -y chromium
  fi
fi

# schemathesis (PyPI) in its own virtualenv, for tests/schemathesis.test.mjs. CPython before
# 3.11.8 fails inside hypothesis ("AST constructor recursion depth mismatch", CPython gh-106905),
# so the newest Python 3.12+ on the machine is preferred (pyenv's included), python3 otherwise.
ST_VERSION=4.32.5
st_python() {
  local c
  for c in python3.13 python3.12 "$HOME"/.pyenv/versions/3.13*/bin/python3 "$HOME"/.pyenv/versions/3.12*/bin/python3 python3; do
    if command -v "$c" >/dev/null 2>&1 && "$c" -c 'import sys; sys.exit(sys.version_info < (3, 11, 8))' 2>/dev/null; then
      command -v "$c"; return
    fi
  done
  command -v python3
}
py=$(st_python)
if [ "$("$ROOT/.tools/st/bin/st" --version 2>/dev/null || true)" != "st, version $ST_VERSION" ] ||
   [ "$("$ROOT/.tools/st/bin/python" --version 2>/dev/null || true)" != "$("$py" --version)" ]; then
  step "schemathesis $ST_VERSION into .tools/st with $("$py" --version) (~40 s once)"
  rm -rf "$ROOT/.tools/st"
  "$py" -m venv "$ROOT/.tools/st"
  "$ROOT/.tools/st/bin/pip" install --quiet --disable-pip-version-check "schemathesis==$ST_VERSION"
fi
