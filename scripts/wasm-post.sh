#!/usr/bin/env bash
# Post-processes the worker's wasm after worker-build (which has run wasm-bindgen):
# binaryen's wasm-opt (npm package `binaryen`, pinned in package.json) drops the
# `name` section (function names, ~40 % of the file) and the `producers` section.
# They cannot go earlier: rustc's `strip` removes every custom section, including
# the one wasm-bindgen reads, and worker-build's own wasm-opt step always keeps
# names (`--debuginfo`). No optimisation passes: measured, they cost minutes and
# do not make the gzip smaller (ADR 0019).
set -euo pipefail
source "$(dirname "$0")/env.sh"
wasm="${1:-$ROOT/build/index_bg.wasm}"
# The feature set worker-build passes to wasm-opt: what rustc's wasm32 target emits
# plus wasm-bindgen's exception handling, and nothing newer than workerd reads.
features=(mutable-globals sign-ext nontrapping-float-to-int bulk-memory multivalue reference-types exception-handling)
opt() { "$ROOT/node_modules/.bin/wasm-opt" "$wasm" "${features[@]/#/--enable-}" "$@"; }
# bench/profile.mjs names Rust functions: it loads this copy (the same binaryen output,
# names kept) when the stripped file's digest matches the one recorded beside it.
names="$ROOT/target/wasm-names"
mkdir -p "$names"
opt --debuginfo --quiet -o "$names/index_bg.wasm"
opt --strip-debug --strip-producers -o "$wasm.tmp"
mv "$wasm.tmp" "$wasm"
sha256sum "$wasm" | cut -d' ' -f1 > "$names/stripped.sha256"
