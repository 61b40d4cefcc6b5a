#!/usr/bin/env bash
# Installs the Rust-side build tools a fresh machine lacks, each only if missing:
# the wasm32 target, worker-build, and the wasm-bindgen CLI at exactly the version in
# Cargo.lock (a mismatch fails the build). npm dependencies come from `npm install`.
set -euo pipefail
cd "$(dirname "$0")/.."

WORKER_BUILD_VERSION=0.8.7
export PATH="$HOME/.cargo/bin:$PATH"

if ! rustup target list --installed | grep -qx wasm32-unknown-unknown; then
  echo "setup: adding the wasm32-unknown-unknown target" >&2
  rustup target add wasm32-unknown-unknown
fi

if ! cargo clippy --version >/dev/null 2>&1 || ! cargo fmt --version >/dev/null 2>&1; then
  echo "setup: adding clippy and rustfmt" >&2
  rustup component add clippy rustfmt
fi

if ! worker-build --version 2>/dev/null | grep -q "$WORKER_BUILD_VERSION"; then
  echo "setup: installing worker-build $WORKER_BUILD_VERSION (5 to 12 minutes on 2 cores, once)" >&2
  cargo install worker-build --version "$WORKER_BUILD_VERSION"
fi

bindgen_version=$(awk '/^name = "wasm-bindgen"$/ { getline; gsub(/version = |"/, ""); print; exit }' Cargo.lock)
if [ -z "$bindgen_version" ]; then
  echo "setup: no wasm-bindgen version in Cargo.lock" >&2
  exit 1
fi
if ! wasm-bindgen --version 2>/dev/null | grep -q " $bindgen_version\$"; then
  echo "setup: installing wasm-bindgen-cli $bindgen_version (a few minutes, once)" >&2
  cargo install wasm-bindgen-cli --version "$bindgen_version"
fi

if [ ! -x node_modules/.bin/wrangler ]; then
  echo "setup: node_modules is missing; run npm install first" >&2
  exit 1
fi
