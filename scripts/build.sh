#!/usr/bin/env bash
# Builds the Worker into build/ with worker-build, using locally installed tools only:
# the wasm-bindgen CLI from scripts/setup.sh and wasm-opt from the npm package binaryen
# (worker-build's own downloads of both fail on machines that reach registries only).
# Skips the build when build/ is already the build of the current sources and tools
# (scripts/build_stamp.mjs); `--force` builds anyway.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$HOME/.cargo/bin:$PATH"
if [ "${1:-}" != "--force" ] && node scripts/build_stamp.mjs check; then
  exit 0
fi
node scripts/build_stamp.mjs clear
# The commit /metrics names (gemini_once_build_info): its short hash, "+modified" when the
# sources differ from it. A later commit that changes no source reuses this build, and its name.
GEMINI_ONCE_COMMIT="$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)"
if [ "$GEMINI_ONCE_COMMIT" != unknown ] && [ -n "$(git status --porcelain -- src Cargo.toml Cargo.lock 2>/dev/null)" ]; then
  GEMINI_ONCE_COMMIT="$GEMINI_ONCE_COMMIT+modified"
fi
export GEMINI_ONCE_COMMIT
export WASM_BINDGEN_BIN="$HOME/.cargo/bin/wasm-bindgen"
export WASM_OPT_BIN="$PWD/node_modules/.bin/wasm-opt"
worker-build --release
# worker-build keeps the wasm name section (about 220 KB); drop it for a smaller upload. Panic
# stack traces then show function indices instead of names.
"$WASM_OPT_BIN" build/index_bg.wasm -o build/index_bg.wasm --strip-debug --strip-producers \
  --enable-mutable-globals --enable-sign-ext --enable-nontrapping-float-to-int \
  --enable-bulk-memory --enable-multivalue --enable-reference-types --enable-exception-handling
node scripts/build_stamp.mjs write
