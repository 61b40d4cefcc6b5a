#!/usr/bin/env bash
# Installs Debian's prometheus package (prometheus and promtool) for tests/metrics.test.mjs, if
# missing: the test checks /metrics with promtool and has a real Prometheus scrape the worker.
# The package's own service is not started; the test runs its own server on a free port.
set -euo pipefail
if command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "setup-prometheus: no prometheus/promtool on PATH; install Debian's prometheus package" >&2
  exit 1
fi
echo "setup-prometheus: installing Debian's prometheus package (a minute, once)" >&2
export DEBIAN_FRONTEND=noninteractive
if ! apt-get install -y -qq --no-install-recommends prometheus >/dev/null 2>&1; then
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi
