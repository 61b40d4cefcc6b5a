#!/usr/bin/env bash
# Runs every test: the pure core on the host (cargo test), rustfmt and clippy on both
# targets (warnings are errors), then the built worker in workerd (Miniflare) against real
# local HTTP servers (node's test runner). Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
echo "== host unit tests (cargo test)"
cargo test --quiet
echo "== lints (rustfmt; clippy on the host and for wasm32, warnings are errors)"
bash scripts/setup.sh
cargo fmt --check
cargo clippy --quiet --all-targets -- -D warnings
cargo clippy --quiet --target wasm32-unknown-unknown -- -D warnings
echo "== build"
bash scripts/build.sh
bash scripts/setup-browser.sh
echo "== integration tests (built worker in workerd)"
node --test --test-concurrency=1 tests/
