#!/usr/bin/env bash
# The Rust SDK (clients/rust): builds its tests, examples and dependencies once, so that
# tests/sdk-rust.test.mjs only runs them. The crate has its own workspace and Cargo.lock
# (kept out of the gateway's workspace and wasm32 build); cargo's own freshness check
# makes a repeated run take about a second.
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$ROOT"
printf '\033[1m==> %s\033[0m\n' "cargo test --no-run (clients/rust)"
cargo test --locked --no-run --quiet --manifest-path clients/rust/Cargo.toml
