#!/usr/bin/env bash
# Post-processes the worker's wasm after worker-build (which has run wasm-bindgen):
# binaryen's wasm-opt (npm package `binaryen`, pinned in package.json) drops the
# `name` section (function names, ~40 % of the file) and the `producers` section.
# They cannot go earlier: rustc's `strip` removes every custom section, including
# the one wasm-bindgen reads, and worker-build's own wasm-opt step always keeps
# names (`--debuginfo`). Before stripping, it runs ten passes and orders the
# functions for gzip (ADR 0022, ADR 0030; ADR 0019 measured -Oz: smaller raw, larger gzip).
set -euo pipefail
source "$(dirname "$0")/env.sh"
wasm="${1:-$ROOT/build/index_bg.wasm}"
# The feature set worker-build passes to wasm-opt: what rustc's wasm32 target emits
# plus wasm-bindgen's exception handling, and nothing newer than workerd reads.
features=(mutable-globals sign-ext nontrapping-float-to-int bulk-memory multivalue reference-types exception-handling)
# opt reads $in (default: the file being processed).
opt() { "$ROOT/node_modules/.bin/wasm-opt" "${in:-$wasm}" "${features[@]/#/--enable-}" "$@"; }
# Passes measured one by one for their gzip (ADR 0022): these shrink it; `-Oz`/`-Os`/`-O2`
# grow it (their reorder-functions, local-cse, simplify-locals and inlining passes undo the
# layout gzip likes). The first five were measured together on top of them (ADR 0030,
# -2.8 KB gzip); --merge-similar-functions grows it (+2.2 KB) and is left out.
# --reorder-functions-by-name comes last: see scripts/wasm-order.mjs.
passes=(--rse --coalesce-locals --merge-blocks --vacuum --remove-unused-brs
  --duplicate-function-elimination --optimize-instructions --code-folding --reorder-locals --dae-optimizing)
# bench/profile.mjs names Rust functions: it loads this copy (the same binaryen output,
# names kept) when the stripped file's digest matches the one recorded beside it.
names="$ROOT/target/wasm-names"
mkdir -p "$names"
node "$ROOT/scripts/wasm-order.mjs" key "$wasm" "$names/keyed.wasm"
in="$names/keyed.wasm" opt --debuginfo "${passes[@]}" --reorder-functions-by-name --quiet -o "$names/ordered.wasm"
node "$ROOT/scripts/wasm-order.mjs" unkey "$names/ordered.wasm" "$names/index_bg.wasm"
rm "$names/keyed.wasm" "$names/ordered.wasm"
in="$names/index_bg.wasm" opt --strip-debug --strip-producers -o "$wasm.tmp"
mv "$wasm.tmp" "$wasm"
sha256sum "$wasm" | cut -d' ' -f1 > "$names/stripped.sha256"
