#!/usr/bin/env bash
# Runs every test: the pure core on the host (cargo test), rustfmt, clippy and rustdoc on both
# targets (warnings are errors, so a broken intra-doc link fails), then the built worker in
# workerd (Miniflare) against real local HTTP servers (node's test runner). Exits non-zero on
# any failure.
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
echo "== docs (rustdoc on the host, and for wasm32 with private items: the edge is wasm32 only)"
RUSTDOCFLAGS="-D warnings" cargo doc --quiet --no-deps
RUSTDOCFLAGS="-D warnings" cargo doc --quiet --no-deps --document-private-items --target wasm32-unknown-unknown
echo "== build"
bash scripts/build.sh
bash scripts/setup-browser.sh
bash scripts/setup-prometheus.sh
bash scripts/setup-receivers.sh
echo "== integration tests (built worker in workerd)"
node --test --test-concurrency=1 tests/
