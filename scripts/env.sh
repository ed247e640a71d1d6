# Sourced by the other scripts: puts the project's own tools first on PATH.
# shellcheck shell=bash
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export ROOT
export PATH="$ROOT/.tools/node22/node_modules/.bin:$ROOT/node_modules/.bin:$HOME/.cargo/bin:$PATH"
export WRANGLER_SEND_METRICS=false
export WASM_BINDGEN_BIN="${WASM_BINDGEN_BIN:-$(command -v wasm-bindgen || echo wasm-bindgen)}"
# worker-build would download esbuild; use the one wrangler brings when present.
if [ -x "$ROOT/node_modules/.bin/esbuild" ]; then export ESBUILD_BIN="$ROOT/node_modules/.bin/esbuild"; fi
