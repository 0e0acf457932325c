#!/usr/bin/env bash
# Set up everything the demo and the tests need, idempotently: a .venv with the package and all
# extras (torch pinned to the local CPU wheel through constraints/torch-cpu.txt), and Debian's
# chromium-headless-shell for the offline Perfetto engine. Re-running is cheap: a stamp file keyed
# on pyproject.toml + constraints skips pip when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
"$PYTHON" -c 'import sys; assert sys.version_info >= (3, 11), "Python >= 3.11 is required"'

if ! command -v chromium-headless-shell >/dev/null 2>&1 && ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    echo "bootstrap: installing chromium-headless-shell (Debian) for the offline Perfetto engine"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium-headless-shell >/dev/null
  else
    echo "bootstrap: please run: sudo apt-get install -y chromium-headless-shell" >&2
  fi
fi

[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
stamp=.venv/.rl-trace-bootstrap
want=$(cat pyproject.toml constraints/*.txt | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "bootstrap: installing rl-trace-observer[all] into .venv (first run takes a few minutes)"
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -c constraints/torch-cpu.txt torch==2.13.0
  .venv/bin/python -m pip install -q -c constraints/torch-cpu.txt -e '.[all]'
  echo "$want" > "$stamp"
fi
