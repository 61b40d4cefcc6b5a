#!/usr/bin/env bash
# Deploys with wrangler (builds through wrangler.toml's [build] command first). Arguments go
# to `wrangler deploy`; `npm run deploy -- --dry-run` checks the bundle and bindings without
# contacting Cloudflare.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export WRANGLER_SEND_METRICS=false
exec node_modules/.bin/wrangler deploy "$@"
