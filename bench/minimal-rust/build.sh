#!/usr/bin/env bash
# Builds the bench's Rust contenders (ADR 0023) when missing or older than their sources:
#   build/gateway/  the minimal Rust gateway (bench/passthrough.mjs's REFERENCE in Rust)
#   build/gateway-rpc/  the same calling its objects by JS RPC (--features rpc; entry rpc-entry.mjs)
#   build/pass/     the Rust pure pass-through (--features passthrough)
# Called by bench/proxy.mjs and bench/profile.mjs; CI never runs it. Same toolchain as
# scripts/build.sh (worker-build 0.8.7, the installed wasm-bindgen, no wasm-opt); the name
# section is kept, so the profile names the Rust functions.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
source "$HERE/../../scripts/env.sh"
cd "$HERE"
stale() {
  local out="$1/index_bg.wasm"
  [ ! -f "$out" ] || [ -n "$(find src Cargo.toml Cargo.lock build.sh rpc-entry.mjs -newer "$out" -print -quit)" ]
}
if stale build/gateway; then
  worker-build --release --out-dir build/gateway
fi
if stale build/gateway-rpc; then
  worker-build --release --out-dir build/gateway-rpc -- --features rpc
  # As scripts/build.sh does for postguard: the generated module moves aside, the glue is the entry.
  mv build/gateway-rpc/index.js build/gateway-rpc/gateway.js
  cp rpc-entry.mjs build/gateway-rpc/index.js
fi
if stale build/pass; then
  worker-build --release --out-dir build/pass -- --features passthrough
fi
