#!/usr/bin/env bash
# Builds the dashboard (static assets, dashboard/dist/) and the worker (release,
# wasm32) into build/ with worker-build, using the locally installed
# wasm-bindgen (no downloads).
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$ROOT"
node scripts/build-dashboard.mjs
worker-build --release
bash scripts/wasm-post.sh
