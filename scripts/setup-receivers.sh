#!/usr/bin/env bash
# Installs the Python example receiver's pinned dependencies (examples/receivers/python/
# requirements.txt) into examples/receivers/python/.venv, with the commands its README gives
# (`python3 -m venv .venv`, `.venv/bin/pip install -r requirements.txt`), if they are not there
# yet: tests/receivers.test.mjs then runs the README's commands as written, and they find them
# installed. A venv of its own, so the machine's Python stays as it is. Idempotent; fast when done.
set -euo pipefail
cd "$(dirname "$0")/.."
cd examples/receivers/python
venv=.venv
requirements=requirements.txt
stamp="$venv/.requirements"
if [ -x "$venv/bin/python" ] && cmp -s "$requirements" "$stamp"; then
  exit 0
fi
if ! python3 -c "import venv, ensurepip" >/dev/null 2>&1; then
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "setup-receivers: python3 cannot make a venv; install Debian's python3-venv package" >&2
    exit 1
  fi
  echo "setup-receivers: installing Debian's python3-venv package" >&2
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-get install -y -qq --no-install-recommends python3-venv >/dev/null 2>&1; then
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
  fi
fi
echo "setup-receivers: installing the Python receiver's dependencies into examples/receivers/python/$venv (once)" >&2
rm -rf "$venv"
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check -r "$requirements"
cp "$requirements" "$stamp"
