#!/usr/bin/env bash
# Builds the Worker (skipped when build/ is the build of the current sources) and runs it
# locally with wrangler dev (local KV and Durable Object state under .wrangler/state unless
# --persist-to says otherwise), beside the demo destination when EFFECT_URL is on this machine
# and the Gemini stub when GEMINI_API_BASE is its address (scripts/start.mjs), on 8787 unless
# --port says otherwise (a taken port stops it; it says so). Arguments go to
# `wrangler dev`, e.g. `npm start -- --port 8790 --ip 127.0.0.1 --persist-to DIR`, except
# `--fresh`, which first removes the local state (scripts/start.mjs).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -f .dev.vars ]; then
  echo "start: no .dev.vars; copying .dev.vars.example (edit it to point EFFECT_URL at your destination)" >&2
  # Owner-only (0600) from the start: .dev.vars holds secrets (ADMIN_TOKEN, the signing
  # secrets, and the webhook secret npm run connect -- --local writes there).
  (umask 077 && cp .dev.vars.example .dev.vars)
fi
bash scripts/build.sh
export WRANGLER_SEND_METRICS=false
# wrangler runs the [build] command itself too; it finds build/ fresh and skips.
exec node scripts/start.mjs "$@"
