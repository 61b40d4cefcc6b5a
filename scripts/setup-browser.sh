#!/usr/bin/env bash
# Installs Debian's Chromium for the dashboard's browser test, if missing. Test tools never
# download browsers of their own; playwright-core drives this binary (CHROMIUM_PATH).
set -euo pipefail
path="${CHROMIUM_PATH:-/usr/bin/chromium}"
if [ -x "$path" ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "setup-browser: no Chromium at $path; install Debian's chromium package (or set CHROMIUM_PATH)" >&2
  exit 1
fi
echo "setup-browser: installing Debian's chromium package (a minute or two, once)" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq chromium >/dev/null
