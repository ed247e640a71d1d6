# Sourced by the other scripts: puts the project's own tools first on PATH.
# shellcheck shell=bash
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export ROOT
# Where `cargo install` puts worker-build and wasm-bindgen (CARGO_INSTALL_ROOT, else CARGO_HOME),
# so that setup.sh finds what it installed; ~/.cargo/bin for rustup's cargo and rustc.
CARGO_BIN="${CARGO_INSTALL_ROOT:-${CARGO_HOME:-$HOME/.cargo}}/bin"
export PATH="$ROOT/.tools/node22/node_modules/.bin:$ROOT/node_modules/.bin:$CARGO_BIN:$HOME/.cargo/bin:$PATH"
export WRANGLER_SEND_METRICS=false
export WASM_BINDGEN_BIN="${WASM_BINDGEN_BIN:-$(command -v wasm-bindgen || echo wasm-bindgen)}"
# worker-build would download esbuild; use the one wrangler brings when present.
if [ -x "$ROOT/node_modules/.bin/esbuild" ]; then export ESBUILD_BIN="$ROOT/node_modules/.bin/esbuild"; fi
